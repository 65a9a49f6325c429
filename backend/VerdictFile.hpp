#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "Config.hpp"
#include "Verdict.hpp"

namespace frnccl {

// The verdict as JSON for programs (restart scripts, in-process restart managers): the keys of scope
// `verdict` in dump_keys.def. Built by the rank that judged the incident, from what its verdict used.
// At most kMaxVerdictJsonBytes: a culprit list is cut to fit (culprit_ranks is whole up to
// kMaxVerdictCulprits, as in the store).
constexpr size_t kMaxVerdictJsonBytes = 8192;
std::string verdictJson(const Verdict& verdict, const VerdictInput& in, int64_t judged_by, double seconds_to_verdict);

// Writes it as <incident folder>/verdict.json (never replacing a file there) and, when configured, to
// FRNCCL_VERDICT_FILE (replacing the previous incident's: the latest verdict is what a restart script reads).
// Called on the monitor thread; returns what failed, one line each, for its log (nothing else changes).
std::vector<std::string> writeVerdictFiles(const Config& config, const std::string& incident_id, const std::string& json);

} // namespace frnccl
