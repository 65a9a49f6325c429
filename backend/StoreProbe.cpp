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

struct AddrInfoFree {
  void operator()(addrinfo* info) const {
    freeaddrinfo(info);
  }
};

// 1: connected (into `out`); 0: refused or timed out; -1: could not even try.
int tryConnect(const addrinfo& address, int64_t timeout_ms, UniqueFd& out) {
  UniqueFd sock(::socket(address.ai_family, address.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, address.ai_protocol));
  if (!sock.ok()) {
    return -1;
  }
  if (::connect(sock.get(), address.ai_addr, address.ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      return 0;
    }
    pollfd waiting{sock.get(), POLLOUT, 0};
    int ready = 0;
    do {
      ready = ::poll(&waiting, 1, static_cast<int>(timeout_ms));
    } while (ready < 0 && errno == EINTR);
    if (ready <= 0) {
      return 0;
    }
    int error = 0;
    socklen_t length = sizeof(error);
    if (::getsockopt(sock.get(), SOL_SOCKET, SO_ERROR, &error, &length) != 0) {
      return -1;
    }
    if (error != 0) {
      return 0;
    }
  }
  out = std::move(sock);
  return 1;
}

} // namespace

StoreConnect connectStoreServer(const c10d::Store& store, int64_t timeout_ms, UniqueFd& fd) {
  const auto* tcp = dynamic_cast<const c10d::TCPStore*>(&store);
  if (tcp == nullptr) {
    return StoreConnect::kUnknown;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(tcp->getPort());
  if (::getaddrinfo(tcp->getHost().c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
    return StoreConnect::kUnknown;
  }
  std::unique_ptr<addrinfo, AddrInfoFree> addresses(found);
  bool tried = false;
  for (const addrinfo* address = found; address != nullptr; address = address->ai_next) {
    const int result = tryConnect(*address, timeout_ms, fd);
    if (result == 1) {
      return StoreConnect::kConnected;
    }
    tried = tried || result == 0;
  }
  return tried ? StoreConnect::kRefused : StoreConnect::kUnknown;
}

bool storeServerReachable(const c10d::Store& store, int64_t timeout_ms) {
  UniqueFd probe;
  return connectStoreServer(store, timeout_ms, probe) != StoreConnect::kRefused;
}

} // namespace frnccl
