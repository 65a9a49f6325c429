#pragma once

#include <cstdint>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace frnccl {

// Whether the server behind `store` still accepts connections, asked with a
// bare TCP connect (closed at once, which the server takes silently) bounded
// by `timeout_ms`. For the last store calls of a leaving rank: a call to a
// TCPStore whose host already left fails only after torch prints a warning
// with a C++ backtrace, and one to a host that is gone from the network waits
// out the store's timeout. True for stores that are not TCPStores (nothing
// to ask) and when the address cannot be resolved (the store call decides).
bool storeServerReachable(const c10d::Store& store, int64_t timeout_ms);

} // namespace frnccl
