#pragma once

// A rank's state in at most kMaxSummaryBytes of JSON: what it posts to the job's store with its part of a
// job-wide dump (or when it leaves the job), and what the trigger's verdict (Verdict.hpp) and
// `frnccl status` read instead of the dump files, which may sit on another host. Built from a recorder
// snapshot and text the dump already holds, so it needs no GIL. The keys are those of scopes `summary`,
// `summary_group` and `summary_op` in python/fr_backend/dump_keys.def.

#include <cstddef>
#include <cstdint>
#include <string>

#include "Config.hpp"
#include "DumpWriter.hpp"
#include "Recorder.hpp"

namespace frnccl {

constexpr size_t kMaxSummaryBytes = 2048;
// Groups listed, those with an op in flight first; the rest are counted in groups_left_out.
constexpr size_t kMaxSummaryGroups = 8;
constexpr int64_t kSummaryVersion = 1;

struct SummaryInput {
  const Config* config = nullptr;
  const Snapshot* snapshot = nullptr;
  // Frames of the snapshot's entries (a dump that symbolized them), else null: an op's frame is then left out.
  const SymbolizedStacks* frames = nullptr;
  // faulthandler's text of every thread's stack (the dump's thread_stacks), or "".
  const std::string* thread_stacks = nullptr;
  std::string incident_id; // "" when not for an incident
  std::string state; // "wrote" (its part of the incident, posted before the files are), "left" (leaving the job), "live" (asked for it)
};

// The summary as one JSON object, every string escaped and cut, at most kMaxSummaryBytes.
std::string buildRankSummary(const SummaryInput& in);

// The innermost frame outside torch's own wrappers (torch/distributed, torch/nn/parallel: as the analyzer's
// header.py picks it) of thread `thread_id`'s stack in faulthandler's text ("File "f", line N in fn"), as
// "f:N in fn"; "" if that thread is not in the text. thread_id 0: the first thread listed.
std::string userFrameOfThread(const std::string& thread_stacks, uint64_t thread_id);

// Store keys: the summary a rank posts with its part of `incident_id`, and the one it posts on leaving.
inline std::string summaryKey(const std::string& incident_id, int64_t rank) {
  return "frnccl/summary/" + incident_id + "/" + std::to_string(rank);
}
inline std::string leftSummaryKey(int64_t rank) {
  return "frnccl/summary_left/" + std::to_string(rank);
}

} // namespace frnccl
