// frnccl's own client for the wake wait: see StoreWire.hpp for why.
#include "StoreWire.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#if __has_include(<torch/csrc/distributed/c10d/store/TCPStoreBackend.hpp>)
#include <torch/csrc/distributed/c10d/store/TCPStoreBackend.hpp> // torch 2.15 and later
#else
#include <torch/csrc/distributed/c10d/TCPStoreBackend.hpp>
#endif

#include "Clock.hpp"

namespace frnccl {

namespace {

// TCPStore puts this in front of every key it sends (TCPStore::keyPrefix_, private in torch).
constexpr const char* kTcpStoreKeyPrefix = "/";
// How often a pending wait looks at its stop flag: the thread ends within this of stop().
constexpr int64_t kStopPollMs = 200;

template <typename T>
void append(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

void appendKey(std::string& out, const std::string& key) {
  const std::string wire = kTcpStoreKeyPrefix + key;
  append<uint64_t>(out, wire.size());
  out += wire;
}

std::string request(c10d::detail::QueryType type) {
  std::string out;
  append<uint8_t>(out, static_cast<uint8_t>(type));
  return out;
}

} // namespace

StoreWireConnection::StoreWireConnection(const c10d::Store& store, int64_t timeout_ms) {
  if (connectStoreServer(store, timeout_ms, fd_) != StoreConnect::kConnected) {
    throw Lost("the store host does not accept connections");
  }
  std::string validate = request(c10d::detail::QueryType::VALIDATE);
  append<uint32_t>(validate, c10d::detail::validationMagicNumber);
  send(validate, timeout_ms);
}

void StoreWireConnection::send(const std::string& bytes, int64_t timeout_ms) {
  const int64_t deadline_ns = monoNs() + timeout_ms * 1000000LL;
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd_.get(), bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const int64_t left_ms = (deadline_ns - monoNs()) / 1000000LL;
      pollfd writable{fd_.get(), POLLOUT, 0};
      if (left_ms > 0 && (::poll(&writable, 1, static_cast<int>(left_ms)) >= 0 || errno == EINTR)) {
        continue;
      }
      throw Lost("the store host took no request within " + std::to_string(timeout_ms) + " ms");
    }
    throw Lost(std::string("the store connection broke: ") + std::strerror(errno));
  }
}

bool StoreWireConnection::receive(void* out, size_t n, int64_t deadline_ns, const std::function<bool()>& stopped) {
  auto* bytes = static_cast<char*>(out);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd_.get(), bytes + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) {
      throw Closed("the store host closed the connection");
    }
    if (errno == EINTR) {
      continue;
    }
    if (errno == ECONNRESET) {
      throw Closed("the store host reset the connection");
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      throw Lost(std::string("the store connection broke: ") + std::strerror(errno));
    }
    if (stopped && stopped()) {
      return false;
    }
    const int64_t left_ms = (deadline_ns - monoNs()) / 1000000LL;
    if (left_ms <= 0) {
      return false;
    }
    pollfd readable{fd_.get(), POLLIN, 0};
    ::poll(&readable, 1, static_cast<int>(std::min(left_ms, kStopPollMs)));
  }
  return true;
}

void StoreWireConnection::deleteKey(const std::string& key, int64_t timeout_ms) {
  std::string query = request(c10d::detail::QueryType::DELETE_KEY);
  appendKey(query, key);
  send(query, timeout_ms);
  int64_t deleted = -1;
  if (!receive(&deleted, sizeof(deleted), monoNs() + timeout_ms * 1000000LL, nullptr)) {
    throw Lost("the store host did not answer within " + std::to_string(timeout_ms) + " ms");
  }
  if (deleted != 0 && deleted != 1) {
    throw NotUnderstood("the store host's answer to a delete is " + std::to_string(deleted));
  }
}

StoreWireConnection::WaitEnd StoreWireConnection::wait(
    const std::string& key,
    int64_t bound_ms,
    const std::function<bool()>& stopped) {
  std::string query = request(c10d::detail::QueryType::WAIT);
  append<uint64_t>(query, 1); // one key
  appendKey(query, key);
  send(query, std::min<int64_t>(bound_ms, 10000));
  uint8_t answer = 0xff;
  if (!receive(&answer, sizeof(answer), monoNs() + bound_ms * 1000000LL, stopped)) {
    return stopped && stopped() ? WaitEnd::kStopped : WaitEnd::kBound;
  }
  if (answer != static_cast<uint8_t>(c10d::detail::WaitResponseType::STOP_WAITING)) {
    throw NotUnderstood("the store host's answer to a wait is " + std::to_string(answer));
  }
  return WaitEnd::kSet;
}

} // namespace frnccl
