#include "WholeFile.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace frnccl {

bool writeFileWhole(const std::string& path, const std::string& text, bool replace, std::string& why) {
  const size_t slash = path.rfind('/');
  const std::string folder = slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
  // Two threads of this process may write into one folder at once (the monitor's verdict, the SIGTERM
  // handler's error file): each call has a name of its own.
  static std::atomic<uint64_t> calls{0};
  const std::string tmp = folder + ".frnccl-" + std::to_string(static_cast<long long>(::getpid())) + "-" +
                          std::to_string(static_cast<unsigned long long>(calls.fetch_add(1))) + ".tmp";
  // A leftover of a process that had this pid before, which died between its open and its unlink: ours to
  // remove (a link there is removed, never followed).
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    why = std::strerror(errno);
    return false;
  }
  auto fail = [&](const std::string& reason) {
    why = reason;
    ::unlink(tmp.c_str());
    return false;
  };
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      const std::string reason = n < 0 ? std::strerror(errno) : "short write";
      ::close(fd);
      return fail(reason);
    }
    done += size_t(n);
  }
  if (::close(fd) != 0) {
    return fail(std::strerror(errno));
  }
  if (replace) {
    // rename() replaces a link at `path` itself, never what it points at.
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      return fail(std::strerror(errno));
    }
    return true;
  }
  if (::link(tmp.c_str(), path.c_str()) != 0) {
    return fail(errno == EEXIST ? "" : std::strerror(errno));
  }
  ::unlink(tmp.c_str());
  return true;
}

} // namespace frnccl
