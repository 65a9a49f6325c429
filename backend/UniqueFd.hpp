#pragma once

#include <unistd.h>

#include <cerrno>

namespace frnccl {

// Owns one file descriptor; closes it when it goes.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() {
    reset();
  }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.release();
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const {
    return fd_;
  }
  bool ok() const {
    return fd_ >= 0;
  }
  // Gives the descriptor up, unclosed.
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  // Closes now; the error close() reported, or 0.
  int reset() {
    int err = 0;
    if (fd_ >= 0 && ::close(fd_) != 0) {
      err = errno;
    }
    fd_ = -1;
    return err;
  }

 private:
  int fd_ = -1;
};

} // namespace frnccl
