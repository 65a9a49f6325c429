#pragma once

#include <cstdint>

// Dump keys as constants, generated from the one schema file that Python
// reads too (python/fr_backend/dump_keys.def).
namespace frnccl::keys {
#define FR_KEY(ident, key, scope, meaning) constexpr const char* ident = key;
#include "dump_keys.def"
#undef FR_KEY
constexpr const char* kFormatName = "frnccl";
constexpr const char* kFormatVersion = "3.0";
constexpr const char* kRankFilePrefix = "frnccl_rank_";
// The verdict file (python/fr_backend/schema.py: VERDICT_FILE_NAME, VERDICT_SCHEMA, VERDICT_VERSION).
constexpr const char* kVerdictFileName = "verdict.json";
constexpr const char* kVerdictSchema = "frnccl-verdict";
constexpr int64_t kVerdictVersion = 1;
// The value of kEncoding in a compact dump (python/fr_backend/compact.py: ENCODING).
constexpr const char* kCompactEncoding = "columns-2";
} // namespace frnccl::keys
