#pragma once

#include <cstdint>
#include <string>

namespace frnccl {

// torch elastic's error file (TORCHELASTIC_ERROR_FILE, which torchrun gives
// each worker): what torchrun's failure summary shows for a worker, the one
// with the earliest timestamp as the root cause. Python writes it for an
// uncaught exception (fr_backend/_elastic_error.py); this is for a process
// that ends without Python's help, on SIGABRT or SIGTERM.
//
// Writes {"message": {"message": ..., "extraInfo": {"py_callstack": ...,
// "timestamp": timestamp_s}}} at `path`, never replacing a file there
// (@record's, or an earlier one's) and never through a link, and never partly:
// written to a private name in the same folder, then linked to `path`. False
// on failure, with `why` (empty when a file was there already).
bool writeElasticErrorFile(const std::string& path, const std::string& message, const std::string& callstack,
                           int64_t timestamp_s, std::string& why);

} // namespace frnccl
