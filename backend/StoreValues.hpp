#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace frnccl {

// Reading what any client of the job's TCPStore may have written.

// A counter, read with get(): the store server fails an add() on a value that
// is not a number and drops the connection. 0 if the key is not there;
// nullopt if its value is not a number (`raw` then holds it).
std::optional<int64_t> readCounter(c10d::Store& store, const std::string& key, std::string& raw);

} // namespace frnccl
