#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace frnccl {

// Reading what any client of the job's TCPStore may have written.

// A counter, read (readIfPresent) rather than add()ed: the store server fails
// an add() on a value that is not a number and drops the connection. 0 if the key is not there;
// nullopt if its value is not a number (`raw` then holds it).
std::optional<int64_t> readCounter(c10d::Store& store, const std::string& key, std::string& raw);

// A key's value in one round trip, nullopt if the key is not there. TCPStore's
// get() waits for a missing key (up to the store timeout), and check() then
// get() takes two round trips (three: get() waits first); a compareSet that
// expects a value nobody writes reads the key without setting it, as the store
// answers a missing key with the expected value.
std::optional<std::string> readIfPresent(c10d::Store& store, const std::string& key);

} // namespace frnccl
