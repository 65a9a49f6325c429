#pragma once

// Dump keys as constants, generated from the one schema file that Python
// reads too (python/fr_backend/dump_keys.def).
namespace frnccl::keys {
#define FR_KEY(ident, key, scope, meaning) constexpr const char* ident = key;
#include "dump_keys.def"
#undef FR_KEY
constexpr const char* kFormatName = "frnccl";
constexpr const char* kFormatVersion = "3.0";
constexpr const char* kRankFilePrefix = "frnccl_rank_";
// The value of kEncoding in a compact dump (python/fr_backend/compact.py: ENCODING).
constexpr const char* kCompactEncoding = "columns-2";
} // namespace frnccl::keys
