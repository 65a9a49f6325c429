#pragma once

// The verdict's early-exit rule (the analyzer's leaver.py, on the little a store summary holds): one rank left
// the loop for a closing collective (a world barrier, a final world all_reduce) that no other member reached,
// while every other rank waits in one collective whose waits lead to it alone. Verdict.cpp hands it the waits it
// found; it names the rank only where exactly one fits, else nothing.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace frnccl {

// A collective some ranks wait in, as the verdict's rules found it.
struct ExitWait {
  std::string group, desc, op;
  int64_t seq = 0;
  std::vector<int64_t> members; // the group's ranks
  std::vector<int64_t> waiters; // inside it
  std::vector<int64_t> targets; // members that never issued it
  bool decidable = true; // false: a p2p op, or members whose summary is missing or unreadable
};

struct EarlyExit {
  int64_t rank = -1;
  size_t own = 0; // the wait it is in (an index into the waits)
  std::vector<size_t> peer_waits; // the ops it never issued that others wait for it in, the named one first
  std::vector<int64_t> indirect; // ranks that wait on its peers through other groups
  std::vector<int64_t> victims; // every other rank, ascending
  std::string text; // "left the loop early: it is in ..., while its peers wait for it in ..."
};

// `waits` are every wait of the job (world ranks); `one_op_each`: every rank's summary was read and shows it
// inside exactly one op.
std::optional<EarlyExit> findEarlyExit(int64_t world, bool one_op_each, const std::vector<ExitWait>& waits);

} // namespace frnccl
