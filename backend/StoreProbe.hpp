#pragma once

#include <cstdint>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "UniqueFd.hpp"

namespace frnccl {


// What connectStoreServer found.
enum class StoreConnect {
  kConnected,
  kRefused, // refused or timed out: the server is not there
  kUnknown, // not a TCPStore, or its address cannot be resolved or tried
};

// A non-blocking TCP connection to the server behind `store` (a TCPStore),
// the connect bounded by `timeout_ms`; `fd` holds it when kConnected.
StoreConnect connectStoreServer(const c10d::Store& store, int64_t timeout_ms, UniqueFd& fd);

// Whether the server behind `store` still accepts connections, asked with a
// bare TCP connect (closed at once, which the server takes silently) bounded
// by `timeout_ms`. For the last store calls of a leaving rank: a call to a
// TCPStore whose host already left fails only after torch prints a warning
// with a C++ backtrace, and one to a host that is gone from the network waits
// out the store's timeout. True for stores that are not TCPStores (nothing
// to ask) and when the address cannot be resolved (the store call decides).
bool storeServerReachable(const c10d::Store& store, int64_t timeout_ms);

} // namespace frnccl
