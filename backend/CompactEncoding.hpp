#pragma once

#include <string>

#include "DumpValue.hpp"

namespace frnccl {

// The compact dump encoding, "columns-1" (specified in python/fr_backend/compact.py,
// whose decoder reads it): the dump tree as one JSON object whose entries are
// stored as one column per entry key. Counters and creation times become deltas,
// the other timestamps offsets from the creation time, and repeated values
// (op names, shapes, dtypes, groups, caller stacks) a table of distinct values
// plus an index per entry. Pure: no I/O, no GIL, no shared state.
class CompactEncoding {
 public:
  // The columns-1 JSON text of a finished dump (the row-form tree DumpWriter::build makes).
  static std::string toJson(const DumpValue& dump);
};

} // namespace frnccl
