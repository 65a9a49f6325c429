#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "StoreProbe.hpp"

namespace frnccl {

// A connection of frnccl's own to a TCPStore's server, for the one store call
// frnccl leaves pending for long: the wake wait (StoreWaiter). torch's client
// logs a warning with a C++ backtrace whenever one of its receives fails, and
// a wait pending when the store host dies is such a receive: every surviving
// rank printed 15 lines of torch's stack for a fault frnccl only reports in
// one line of its own. This connection speaks the server's protocol for the
// two requests the waiter needs (DELETE_KEY and WAIT, after the validation
// message every client sends first), with torch's own constants from
// TCPStoreBackend.hpp, on a socket it owns; a closed connection is a Lost
// exception, printed by nobody. Single-threaded: one owner.
class StoreWireConnection {
 public:
  // The connection is gone: never made, closed by the server, broken, or an
  // answer that did not come in time.
  struct Lost : std::runtime_error {
    using std::runtime_error::runtime_error;
  };
  // The server closed the connection (end of stream, or reset).
  struct Closed : Lost {
    using Lost::Lost;
  };
  // The server answered something this client does not understand: the
  // protocol moved in this torch; the caller goes back to torch's client.
  struct NotUnderstood : std::runtime_error {
    using std::runtime_error::runtime_error;
  };

  // Connects to the server behind `store` (a TCPStore) and validates; throws
  // Lost when the server cannot be reached within `timeout_ms`.
  StoreWireConnection(const c10d::Store& store, int64_t timeout_ms);

  // Deletes `key` (a key of the TCPStore itself, not of a PrefixStore over it);
  // waits at most `timeout_ms` for the server's answer.
  void deleteKey(const std::string& key, int64_t timeout_ms);

  // How a wait ended.
  enum class WaitEnd { kSet, kBound, kStopped };
  // Waits until `key` is set, `bound_ms` passes or `stopped()` (asked every
  // fraction of a second) is true. After kBound or kStopped the server still
  // holds the wait: the connection must not be used again.
  WaitEnd wait(const std::string& key, int64_t bound_ms, const std::function<bool()>& stopped);

  int fd() const {
    return fd_.get();
  }

 private:
  void send(const std::string& bytes, int64_t timeout_ms);
  // Fills `out` with `n` bytes; false if `deadline_ns` passed or stopped() turned true first.
  bool receive(void* out, size_t n, int64_t deadline_ns, const std::function<bool()>& stopped);

  UniqueFd fd_;
};

} // namespace frnccl
