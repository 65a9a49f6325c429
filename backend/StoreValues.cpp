#include "StoreValues.hpp"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <exception>
#include <vector>

namespace frnccl {

std::optional<int64_t> readCounter(c10d::Store& store, const std::string& key, std::string& raw) {
  if (!store.check({key})) {
    return 0;
  }
  const std::vector<uint8_t> value = store.get(key);
  raw.assign(value.begin(), value.end());
  size_t used = 0;
  try {
    const long long n = std::stoll(raw, &used);
    if (used == raw.size() && !raw.empty() && raw[0] != ' ') {
      return n;
    }
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

bool hostAccepts(const std::string& host, uint16_t port, int64_t timeout_ms) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) {
    return false;
  }
  bool accepted = false;
  for (addrinfo* a = found; a != nullptr && !accepted; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      continue;
    }
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      accepted = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof(err);
      accepted = poll(&p, 1, static_cast<int>(timeout_ms)) == 1 &&
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
    close(fd);
  }
  freeaddrinfo(found);
  return accepted;
}

} // namespace frnccl
