#include "VerdictFile.hpp"

#include <algorithm>

#include "Clock.hpp"
#include "DumpSchema.hpp"
#include "DumpValue.hpp"
#include "IncidentId.hpp"
#include "WholeFile.hpp"

namespace frnccl {

namespace {

DumpValue rankList(const std::vector<int64_t>& ranks, size_t limit) {
  DumpValue out = DumpValue::list(std::min(ranks.size(), limit));
  for (size_t i = 0; i < ranks.size() && i < limit; ++i) {
    out.push(ranks[i]);
  }
  return out;
}

std::string build(const Verdict& v, const VerdictInput& in, int64_t judged_by, double seconds, size_t culprits_shown) {
  namespace k = keys;
  const bool decided = v.decided;
  DumpValue d = DumpValue::dict(24);
  d.set(k::kVerSchema, k::kVerdictSchema);
  d.set(k::kVerVersion, k::kVerdictVersion);
  d.set(k::kVerIncident, in.incident_id);
  d.set(k::kVerIncidentDir, in.incident_dir);
  d.set(k::kVerDecided, decided);
  d.set(k::kVerKind, decided ? v.kind : std::string("undecided"));
  d.set(k::kVerCulpritRanks, rankList(decided ? v.culprits : std::vector<int64_t>{}, kMaxVerdictCulprits));
  DumpValue where = DumpValue::list();
  for (size_t i = 0; decided && i < v.where.size() && i < culprits_shown; ++i) {
    DumpValue c = DumpValue::dict(3);
    c.set(k::kVerCulpritRank, v.where[i].rank);
    c.set(k::kVerCulpritHost, v.where[i].host ? DumpValue(*v.where[i].host) : DumpValue());
    c.set(k::kVerCulpritPid, v.where[i].pid ? DumpValue(*v.where[i].pid) : DumpValue());
    where.push(std::move(c));
  }
  d.set(k::kVerCulprits, std::move(where));
  d.set(k::kVerVictimRanks, rankList(decided ? v.victims : std::vector<int64_t>{}, culprits_shown * 4));
  d.set(k::kVerOp, decided ? printable(v.op, 48) : std::string());
  d.set(k::kVerPg, decided ? printable(v.pg, 48) : std::string());
  d.set(k::kVerPgDesc, decided ? printable(v.pg_desc, 48) : std::string());
  d.set(k::kVerSeq, decided && !v.p2p && v.seq >= 0 ? DumpValue(v.seq) : DumpValue());
  d.set(k::kVerP2PSeq, decided && v.p2p && v.seq >= 0 ? DumpValue(v.seq) : DumpValue());
  d.set(k::kVerUndecided, decided ? std::string() : v.undecided_reason);
  d.set(k::kVerLine, v.lines.empty() ? std::string() : v.lines.front());
  d.set(k::kVerWorldSize, in.world_size);
  d.set(k::kVerRanksWrote, in.wrote);
  d.set(k::kVerJudgedBy, judged_by);
  d.set(k::kVerSeconds, seconds);
  d.set(k::kVerTimeNs, wallNs());
  return d.toJson();
}

} // namespace

std::string verdictJson(const Verdict& verdict, const VerdictInput& in, int64_t judged_by, double seconds_to_verdict) {
  // A long culprit list (missing_dump of many ranks) is cut until it fits; the line and lists are bounded.
  for (size_t shown = kMaxVerdictCulprits;; shown /= 2) {
    std::string text = build(verdict, in, judged_by, seconds_to_verdict, shown);
    if (text.size() <= kMaxVerdictJsonBytes || shown == 0) {
      return text;
    }
  }
}

std::vector<std::string> writeVerdictFiles(const Config& config, const std::string& incident_id, const std::string& json) {
  std::vector<std::string> problems;
  auto write = [&](const std::string& path, bool replace) {
    std::string why;
    if (!writeFileWhole(path, json, replace, why)) {
      problems.push_back("cannot write the verdict of " + incident_id + " to " + printable(path, 300) + ": " +
                         (why.empty() ? "a file is there already" : why));
    }
  };
  write(config.dump_dir + "/" + incident_id + "/" + keys::kVerdictFileName, false);
  if (!config.verdict_file.empty()) {
    write(config.verdict_file, true);
  }
  return problems;
}

} // namespace frnccl
