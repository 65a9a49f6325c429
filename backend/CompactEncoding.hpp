#pragma once

#include <string>

#include "DumpValue.hpp"

namespace frnccl {

// The compact dump encoding, "columns-2" (specified in python/fr_backend/compact.py,
// whose decoder reads it): the dump tree as one JSON object whose entries are
// stored as one column per entry key. Counters and creation times become deltas,
// the other timestamps offsets from the creation time, both packed as hex digits,
// and repeated values (op names, shapes, dtypes, groups, caller stacks) a table of
// distinct values plus an index per entry, one character each. Pure: no I/O, no
// GIL, no shared state.
class CompactEncoding {
 public:
  // The columns-2 JSON text of a finished dump (the row-form tree DumpWriter::build makes).
  static std::string toJson(const DumpValue& dump);
};

} // namespace frnccl
