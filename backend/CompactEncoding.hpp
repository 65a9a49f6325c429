#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
  // A group's global ranks, in group-rank order, as the pg_config "members" text:
  // comma-separated runs, each "R" or "START:STOP[:STEP]" (Python's range), e.g.
  // "0:100000" or "3:100000:8". The default group, DeviceMesh dimensions and
  // new_subgroups are one run each, so a dump does not grow with the world size.
  static std::string members(const std::vector<int64_t>& ranks);
  // torch's form of the same ranks, "[0, 1, 2]", from a members() text (what the
  // pickle, which torch's fr_trace reads as it is, carries besides).
  static std::string torchRanks(const std::string& members);
};

} // namespace frnccl
