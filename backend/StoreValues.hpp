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

// Whether host:port accepts a TCP connection within `timeout_ms`: a silent
// probe, where a TCPStore client that cannot connect prints torch's warning
// with a C++ backtrace.
bool hostAccepts(const std::string& host, uint16_t port, int64_t timeout_ms);

} // namespace frnccl
