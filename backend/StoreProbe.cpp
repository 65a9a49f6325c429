#include "StoreProbe.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <string>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace frnccl {

namespace {

// Owns one socket descriptor.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) {
      ::close(fd);
    }
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

struct AddrInfoFree {
  void operator()(addrinfo* info) const {
    freeaddrinfo(info);
  }
};

// 1: connected; 0: refused or timed out; -1: could not even try.
int tryConnect(const addrinfo& address, int64_t timeout_ms) {
  Fd sock(::socket(address.ai_family, address.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, address.ai_protocol));
  if (sock.fd < 0) {
    return -1;
  }
  if (::connect(sock.fd, address.ai_addr, address.ai_addrlen) == 0) {
    return 1;
  }
  if (errno != EINPROGRESS) {
    return 0;
  }
  pollfd waiting{sock.fd, POLLOUT, 0};
  int ready = 0;
  do {
    ready = ::poll(&waiting, 1, static_cast<int>(timeout_ms));
  } while (ready < 0 && errno == EINTR);
  if (ready <= 0) {
    return 0;
  }
  int error = 0;
  socklen_t length = sizeof(error);
  if (::getsockopt(sock.fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) {
    return -1;
  }
  return error == 0 ? 1 : 0;
}

} // namespace

bool storeServerReachable(const c10d::Store& store, int64_t timeout_ms) {
  const auto* tcp = dynamic_cast<const c10d::TCPStore*>(&store);
  if (tcp == nullptr) {
    return true;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(tcp->getPort());
  if (::getaddrinfo(tcp->getHost().c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
    return true;
  }
  std::unique_ptr<addrinfo, AddrInfoFree> addresses(found);
  bool tried = false;
  for (const addrinfo* address = found; address != nullptr; address = address->ai_next) {
    const int result = tryConnect(*address, timeout_ms);
    if (result == 1) {
      return true;
    }
    tried = tried || result == 0;
  }
  return !tried;
}

} // namespace frnccl
