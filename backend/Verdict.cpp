// The trigger's verdict from the ranks' store summaries (see Verdict.hpp).
#include "Verdict.hpp"

#include <algorithm>
#include <cstdint>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <set>

#include "Clock.hpp"
#include "IncidentId.hpp"
#include "RankSummary.hpp"
#include "SummaryJson.hpp"
#include "VerdictEarlyExit.hpp"

namespace frnccl {

namespace {

using summary_json::Json;
using summary_json::Reader;

// ---- what the verdict reads of a summary ----

struct OpInFlight {
  std::string op;
  int64_t seq = 0;
  bool p2p = false;
  int64_t peer = -1;
  std::string in, out, dtypes, frame;
  int64_t created_ns = 0;
};

struct GroupReport {
  std::string name, desc;
  int64_t size = 0;
  std::vector<int64_t> ranks; // empty: not listed
  int64_t enqueued = 0;
  int64_t completed = 0;
  std::optional<OpInFlight> in_flight;
};

struct RankReport {
  int64_t rank = -1;
  std::string host, state, frame;
  std::string exit; // the uncaught exception it leaves the job with, "" if none
  int64_t exit_time_ns = 0; // when it was noted
  int64_t pid = 0;
  int64_t life = -1;
  bool truncated = false; // groups were left out: a group not listed may still be one of its

  std::vector<GroupReport> groups;
  bool blocked() const {
    return std::any_of(groups.begin(), groups.end(), [](const GroupReport& g) { return g.in_flight.has_value(); });
  }
};

// Created times beyond this are hostile: clamped, so that differences of two never overflow.
constexpr int64_t kMaxCreatedNs = int64_t(1) << 62;

// Rank `rank`'s summary of `incident_id` in a job of `world` ranks, else nullopt (unreadable): another
// rank's, another job size's, another incident's (a rank that left posts its summary with none), one cut
// to "too_large", or anything that is not a summary.
std::optional<RankReport> readSummary(const std::string& text, int64_t rank, int64_t world, const std::string& incident_id) {
  if (text.size() > 2 * kMaxSummaryBytes) {
    return std::nullopt;
  }
  Json j;
  if (!Reader(text).parse(j) || j.type != Json::kObj || j.num("rank", -1) != rank || j.num("world_size", -1) != world) {
    return std::nullopt;
  }
  RankReport r;
  r.rank = rank;
  r.host = j.str("host");
  r.pid = j.num("pid", 0);
  r.life = j.num("life", -1);
  r.state = j.str("state");
  if (r.state == "too_large" || (r.state != "left" && j.str("incident") != incident_id)) {
    return std::nullopt;
  }
  r.truncated = j.num("groups_left_out", 0) != 0;
  r.frame = j.str("frame");
  r.exit = j.str("exit");
  r.exit_time_ns = j.num("exit_time_ns", 0);
  const Json* groups = j.get("groups");
  if (groups == nullptr || groups->type != Json::kArr) {
    return std::nullopt;
  }
  for (const Json& g : groups->a) {
    if (g.type != Json::kObj) {
      return std::nullopt;
    }
    GroupReport gr;
    gr.name = g.str("pg");
    gr.desc = g.str("desc");
    gr.size = g.num("size", 0);
    if (const Json* ranks = g.get("ranks"); ranks != nullptr && ranks->type == Json::kArr) {
      for (const Json& x : ranks->a) {
        gr.ranks.push_back(x.type == Json::kNum ? x.n : -1);
      }
    }
    if (const Json* e = g.get("enqueued"); e != nullptr && e->type == Json::kObj) {
      gr.enqueued = e->num("seq", 0);
    }
    if (const Json* c = g.get("completed"); c != nullptr && c->type == Json::kObj) {
      gr.completed = c->num("seq", 0);
    }
    if (const Json* f = g.get("in_flight"); f != nullptr && f->type == Json::kObj) {
      OpInFlight op;
      op.op = f->str("op");
      op.seq = f->num("seq", 0);
      op.p2p = f->flag("p2p");
      op.peer = f->num("peer", -1);
      op.in = f->str("in");
      op.out = f->str("out");
      op.dtypes = f->str("dtypes");
      op.frame = f->str("frame");
      op.created_ns = std::clamp<int64_t>(f->num("created_ns", 0), 0, kMaxCreatedNs);
      gr.in_flight = op;
    }
    r.groups.push_back(std::move(gr));
  }
  return r;
}

// ---- the rules ----

// Ranks wait in one op of one group for others.
struct Wait {
  std::string group, desc, op;
  int64_t seq = 0;
  bool p2p = false;
  int64_t created_ns = 0;
  std::vector<int64_t> waiters;
  std::vector<int64_t> targets; // members that never issued it (or never posted the partner)
  std::vector<int64_t> missing; // members with no summary
  std::vector<int64_t> unreadable; // members whose summary could not be read
};

struct Mismatch {
  std::string kind, group, desc, op;
  int64_t seq = 0;
  int64_t created_ns = 0;
  std::vector<int64_t> culprits; // empty: a tie
  std::string minority_value, majority_value;
};

std::string rankList(const std::vector<int64_t>& ranks, size_t limit = 12) {
  std::string out;
  for (size_t i = 0; i < ranks.size() && i < limit; ++i) {
    out += (i ? "," : "") + std::to_string(ranks[i]);
  }
  if (ranks.size() > limit) {
    out += ",... (" + std::to_string(ranks.size()) + " in all)";
  }
  return out;
}

std::string ranksWord(const std::vector<int64_t>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + rankList(ranks);
}

struct Job {
  int64_t world = 0;
  std::vector<std::optional<RankReport>> reports;
  std::vector<bool> unreadable;
  std::vector<bool> absent;
  // Groups whose reporters list different members or sizes (a group name reused after a re-init): "" if none.
  std::string conflicting_group;

  // A member whose summary does not list `name` though it may be in it (its groups were cut).
  bool mayHide(int64_t rank) const {
    return reports[size_t(rank)] && reports[size_t(rank)]->truncated;
  }

  const GroupReport* groupOf(int64_t rank, const std::string& name) const {
    if (!reports[size_t(rank)]) {
      return nullptr;
    }
    for (const auto& g : reports[size_t(rank)]->groups) {
      if (g.name == name) {
        return &g;
      }
    }
    return nullptr;
  }
  bool blocked(int64_t rank) const {
    return reports[size_t(rank)] && reports[size_t(rank)]->blocked();
  }
  bool isLeft(int64_t rank) const {
    return reports[size_t(rank)] && reports[size_t(rank)]->state == "left";
  }
  std::string who(const std::vector<int64_t>& ranks) const {
    std::string out = ranksWord(ranks) + " (";
    for (size_t i = 0; i < ranks.size() && i < 4; ++i) {
      const auto& r = reports[size_t(ranks[i])];
      if (i) {
        out += "; ";
      }
      if (ranks.size() > 1) {
        out += std::to_string(ranks[i]) + ": ";
      }
      out += r ? "host " + printable(r->host, 64) + ", pid " + std::to_string(r->pid) : std::string("no summary");
    }
    return out + (ranks.size() > 4 ? "; ...)" : ")");
  }
};

// The members of a group, as far as the summaries say: its listed ranks, every rank for a group as large as
// the job, else the ranks that reported it (then `complete` is false: members without a summary are unknown).
std::vector<int64_t> membersOf(const Job& job, const std::string& name, const GroupReport& any, bool& complete) {
  complete = true;
  if (!any.ranks.empty() && int64_t(any.ranks.size()) == any.size) {
    std::vector<int64_t> out;
    for (int64_t r : any.ranks) {
      if (r < 0 || r >= job.world) {
        complete = false;
        continue;
      }
      out.push_back(r);
    }
    return out;
  }
  std::vector<int64_t> out;
  if (any.size == job.world) {
    for (int64_t r = 0; r < job.world; ++r) {
      out.push_back(r);
    }
    return out;
  }
  for (int64_t r = 0; r < job.world; ++r) {
    if (job.groupOf(r, name) != nullptr) {
      out.push_back(r);
    }
  }
  complete = int64_t(out.size()) == any.size;
  return out;
}

// Which of an op's sizes and dtypes must agree across ranks, as the analyzer's ops.py family() says: the root's
// input of scatter and the list all_gather's inputs differ per rank (outputs compared), gather's outputs
// exist on the root only and the list reduce_scatter's outputs differ (inputs compared), all_to_all's sizes
// differ (dtypes only), and a barrier has nothing to compare.
enum class Family { kBoth, kIn, kOut, kDtype, kNone };

Family familyOf(const std::string& op) {
  static const std::set<std::string> dtype_only = {"all_to_all", "all_to_all_single", "all_to_all_v_single", "alltoall",
                                                   "alltoall_base", "all_gather_v", "reduce_scatter_v"};
  static const std::set<std::string> none = {"barrier", "all_reduce_barrier", "split", "new_window"};
  static const std::set<std::string> out_only = {"scatter", "all_gather", "allgather"};
  static const std::set<std::string> in_only = {"gather", "reduce_scatter"};
  if (dtype_only.count(op)) {
    return Family::kDtype;
  }
  if (none.count(op)) {
    return Family::kNone;
  }
  if (out_only.count(op)) {
    return Family::kOut;
  }
  return in_only.count(op) ? Family::kIn : Family::kBoth;
}

// The analyzer's dtype_key: one dtype as it is, several as their sorted set.
std::string dtypeKey(const std::vector<std::string>& dts) {
  if (dts.size() == 1) {
    return dts.front();
  }
  std::set<std::string> set;
  for (const auto& d : dts) {
    if (!d.empty()) {
      set.insert(d);
    }
  }
  std::string out;
  for (const auto& d : set) {
    out += (out.empty() ? "" : ",") + d;
  }
  return out;
}

std::vector<std::string> splitList(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (!text.empty()) {
    const size_t comma = text.find(',', at);
    out.push_back(text.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) {
      break;
    }
    at = comma + 1;
  }
  return out;
}

// (sizes, dtypes) of an op in flight, as far as they must agree across ranks (the analyzer's compare_keys).
// The summary's dtypes read "in,...;out,...".
std::pair<std::string, std::string> compareKeys(const OpInFlight& op) {
  const size_t semi = op.dtypes.find(';');
  const std::vector<std::string> ins = splitList(op.dtypes.substr(0, semi));
  const std::vector<std::string> outs = semi == std::string::npos ? std::vector<std::string>{} : splitList(op.dtypes.substr(semi + 1));
  switch (familyOf(op.op)) {
    case Family::kBoth:
      return {op.in + ">" + op.out, dtypeKey(ins)};
    case Family::kOut:
      return {">" + op.out, dtypeKey(outs)};
    case Family::kIn:
      return {op.in + ">", dtypeKey(ins)};
    case Family::kDtype: {
      std::vector<std::string> all = ins;
      all.insert(all.end(), outs.begin(), outs.end());
      return {"", dtypeKey(all)};
    }
    case Family::kNone:
      break;
  }
  return {"", ""};
}

void collectiveWaits(Job& job, std::vector<Wait>& waits, std::vector<Mismatch>& mismatches) {
  std::set<std::string> done;
  for (int64_t r = 0; r < job.world; ++r) {
    if (!job.reports[size_t(r)]) {
      continue;
    }
    for (const auto& g : job.reports[size_t(r)]->groups) {
      if (!done.insert(g.name).second) {
        continue;
      }
      bool complete = true;
      const std::vector<int64_t> members = membersOf(job, g.name, g, complete);
      // Every reporter of the group must agree on who is in it (a name reused after a re-init may not).
      for (int64_t r2 = r + 1; r2 < job.world && job.conflicting_group.empty(); ++r2) {
        const GroupReport* other = job.groupOf(r2, g.name);
        if (other != nullptr && (other->size != g.size || (!other->ranks.empty() && !g.ranks.empty() && other->ranks != g.ranks))) {
          job.conflicting_group = g.name;
        }
      }
      // The oldest collective a member still in the job is in: where the group stopped.
      int64_t seq = -1;
      for (int64_t m : members) {
        const GroupReport* mg = job.groupOf(m, g.name);
        if (mg != nullptr && !job.isLeft(m) && mg->in_flight && !mg->in_flight->p2p && (seq < 0 || mg->in_flight->seq < seq)) {
          seq = mg->in_flight->seq;
        }
      }
      if (seq < 0) {
        continue;
      }
      Wait w;
      w.group = g.name;
      w.desc = g.desc;
      w.seq = seq;
      std::map<std::string, std::vector<int64_t>> by_op, by_sizes, by_dtypes;
      for (int64_t m : members) {
        if (job.unreadable[size_t(m)]) {
          w.unreadable.push_back(m);
          continue;
        }
        const GroupReport* mg = job.groupOf(m, g.name);
        if (mg == nullptr && !job.isLeft(m) && job.mayHide(m)) {
          w.unreadable.push_back(m); // its summary was cut: whether it is in the op is unknown
          continue;
        }
        if (mg == nullptr || job.isLeft(m)) {
          w.missing.push_back(m);
          continue;
        }
        if (mg->in_flight && !mg->in_flight->p2p && mg->in_flight->seq == seq) {
          const OpInFlight& op = *mg->in_flight;
          w.waiters.push_back(m);
          by_op[op.op].push_back(m);
          const auto [sizes, dtypes] = compareKeys(op);
          by_sizes[sizes].push_back(m);
          by_dtypes[dtypes].push_back(m);
          if (w.created_ns == 0 || op.created_ns < w.created_ns) {
            w.created_ns = op.created_ns;
          }
        } else if (mg->enqueued < seq) {
          w.targets.push_back(m);
        }
      }
      // The op most waiters are in names the wait.
      size_t most = 0;
      for (const auto& [op, rs] : by_op) {
        if (rs.size() > most) {
          most = rs.size();
          w.op = op;
        }
      }
      auto mismatch = [&](const char* kind, const std::map<std::string, std::vector<int64_t>>& by) {
        if (by.size() < 2) {
          return false;
        }
        Mismatch mm;
        mm.kind = kind;
        mm.group = g.name;
        mm.desc = g.desc;
        mm.seq = seq;
        mm.op = w.op;
        mm.created_ns = w.created_ns;
        // The minority is to blame; with no single largest side (a tie), or members without a summary who
        // could tip it, no rank is named.
        std::vector<std::pair<size_t, std::string>> sizes;
        for (const auto& [v, rs] : by) {
          sizes.emplace_back(rs.size(), v);
        }
        std::sort(sizes.rbegin(), sizes.rend());
        const bool tie = sizes[0].first == sizes[1].first;
        if (!tie && complete && sizes[0].first > sizes[1].first + w.missing.size() + w.unreadable.size()) {
          mm.majority_value = sizes[0].second;
          for (const auto& [v, rs] : by) {
            if (v != sizes[0].second) {
              mm.culprits.insert(mm.culprits.end(), rs.begin(), rs.end());
              mm.minority_value = v;
            }
          }
          std::sort(mm.culprits.begin(), mm.culprits.end());
        }
        mismatches.push_back(std::move(mm));
        return true;
      };
      if (!mismatch("op_mismatch", by_op) && !mismatch("size_mismatch", by_sizes)) {
        mismatch("dtype_mismatch", by_dtypes);
      }
      if (!complete && w.targets.empty() && w.missing.empty()) {
        // Members without a summary and not listed: who they are is unknown.
        w.unreadable.push_back(-1);
      }
      if (!w.waiters.empty()) {
        waits.push_back(std::move(w));
      }
    }
  }
}

void p2pWaits(const Job& job, std::vector<Wait>& waits) {
  for (int64_t r = 0; r < job.world; ++r) {
    if (!job.reports[size_t(r)]) {
      continue;
    }
    for (const auto& g : job.reports[size_t(r)]->groups) {
      if (!g.in_flight || !g.in_flight->p2p) {
        continue;
      }
      const OpInFlight& op = *g.in_flight;
      Wait w;
      w.group = g.name;
      w.desc = g.desc;
      w.op = op.op;
      w.seq = op.seq;
      w.p2p = true;
      w.created_ns = op.created_ns;
      w.waiters.push_back(r);
      const int64_t peer = op.peer;
      if (peer < 0 || peer >= job.world) {
        w.unreadable.push_back(-1);
      } else if (job.unreadable[size_t(peer)]) {
        w.unreadable.push_back(peer);
      } else if (!job.reports[size_t(peer)] || job.isLeft(peer)) {
        w.missing.push_back(peer);
      } else if (job.groupOf(peer, g.name) == nullptr && job.mayHide(peer)) {
        w.unreadable.push_back(peer); // its summary was cut: whether it posted the partner is unknown
      } else {
        const GroupReport* pg = job.groupOf(peer, g.name);
        const bool partner_posted = pg != nullptr && pg->in_flight && pg->in_flight->p2p && pg->in_flight->peer == r;
        if (!partner_posted) {
          w.targets.push_back(peer); // blocked elsewhere or not at all: the chain decides
        }
      }
      waits.push_back(std::move(w));
    }
  }
}

// Ops created this close together are in no order the summaries can tell (clock offsets between hosts, the
// watchdog's discovery): the analyzer orders them on clocks it corrects from the dumps.
constexpr int64_t kSameTimeNs = 100 * 1000 * 1000;

std::string opText(const std::string& op, bool p2p, int64_t seq, const std::string& group, const std::string& desc) {
  return "op " + printable(op, 48) + (p2p ? " p2p seq " : " seq ") + std::to_string(seq) + ", group " +
      printable(group, 48) + " (" + printable(desc, 48) + ")";
}

// The early-exit rule's view of the waits (one ExitWait per Wait, same order), where every rank's summary was read.
std::optional<EarlyExit> earlyExit(const Job& job, const std::vector<Wait>& waits) {
  bool one_op_each = true;
  for (int64_t r = 0; r < job.world && one_op_each; ++r) {
    const auto& rep = job.reports[size_t(r)];
    one_op_each = rep && !job.isLeft(r) && !rep->truncated &&
        std::count_if(rep->groups.begin(), rep->groups.end(), [](const GroupReport& g) { return g.in_flight.has_value(); }) == 1;
  }
  std::vector<ExitWait> view;
  for (const Wait& w : waits) {
    ExitWait x{w.group, w.desc, w.op, w.seq, {}, w.waiters, w.targets, !w.p2p && w.missing.empty() && w.unreadable.empty()};
    bool complete = false;
    if (const GroupReport* g = w.waiters.empty() ? nullptr : job.groupOf(w.waiters.front(), w.group)) {
      x.members = membersOf(job, w.group, *g, complete);
    }
    x.decidable = x.decidable && complete;
    view.push_back(std::move(x));
  }
  return findEarlyExit(job.world, one_op_each, view);
}

} // namespace

// Nobody waits in a collective or p2p op: what failed did so outside them (a quorum's timeout, a lighthouse
// that cannot be reached, a data loader's error). Said as it is, naming no rank: the ranks that raised, with
// their exception, and where the others were (their main thread's frame), a few of each.
std::string outsideCollectives(const Job& job) {
  constexpr size_t kMaxSaid = 4;
  std::vector<int64_t> raisers;
  for (int64_t r = 0; r < job.world; ++r) {
    const auto& rep = job.reports[size_t(r)];
    if (rep && !rep->exit.empty()) {
      raisers.push_back(r);
    }
  }
  std::stable_sort(raisers.begin(), raisers.end(), [&](int64_t a, int64_t b) {
    return job.reports[size_t(a)]->exit_time_ns < job.reports[size_t(b)]->exit_time_ns;
  });
  std::string out;
  for (size_t i = 0; i < raisers.size() && i < kMaxSaid; ++i) {
    out += std::string(i == 0 ? "" : "; then ") + job.who({raisers[i]}) + " raised outside collectives: " +
        printable(job.reports[size_t(raisers[i])]->exit, 300);
  }
  if (raisers.size() > kMaxSaid) {
    out += "; and " + std::to_string(raisers.size() - kMaxSaid) + " more";
  }
  out += std::string(out.empty() ? "" : "; ") + "no rank is inside a collective or p2p op in its summary, so none is named";
  std::string where;
  size_t said = 0, more = 0;
  for (int64_t r = 0; r < job.world; ++r) {
    const auto& rep = job.reports[size_t(r)];
    if (!rep || !rep->exit.empty() || rep->frame.empty()) {
      continue;
    }
    if (said++ < kMaxSaid) {
      where += std::string(where.empty() ? "" : ", ") + "rank " + std::to_string(r) + " at " + printable(rep->frame, 160);
    } else {
      ++more;
    }
  }
  if (!where.empty()) {
    out += "; " + where + (more ? " and " + std::to_string(more) + " more" : "");
  }
  return out;
}

// The other members that never issued `w` and are outside collectives too, with no exception of their own: where
// each was (a few). Not named: nobody can tell from the summaries whether they would have come.
std::string alsoNotIn(const Job& job, const Wait& w) {
  constexpr size_t kMaxSaid = 4;
  std::string out;
  size_t said = 0, more = 0;
  for (int64_t r : w.targets) {
    const auto& rep = job.reports[size_t(r)];
    if (!rep || !rep->exit.empty() || rep->blocked() || rep->frame.empty()) {
      continue;
    }
    if (said++ < kMaxSaid) {
      out += std::string(out.empty() ? "; also not in it, outside collectives: " : ", ") + "rank " + std::to_string(r) +
          " at " + printable(rep->frame, 160);
    } else {
      ++more;
    }
  }
  return out + (more ? " and " + std::to_string(more) + " more" : "");
}

Verdict computeVerdict(const VerdictInput& in) {
  Verdict v;
  Job job;
  job.world = std::max<int64_t>(0, in.world_size);
  job.reports.resize(size_t(job.world));
  job.unreadable.assign(size_t(job.world), false);
  job.absent.assign(size_t(job.world), false);
  std::vector<int64_t> unreadable;
  for (int64_t r = 0; r < job.world; ++r) {
    const auto& text = size_t(r) < in.summaries.size() ? in.summaries[size_t(r)] : std::nullopt;
    if (!text) {
      job.absent[size_t(r)] = true;
      continue;
    }
    job.reports[size_t(r)] = readSummary(*text, r, in.world_size, in.incident_id);
    if (!job.reports[size_t(r)]) {
      job.unreadable[size_t(r)] = true;
      unreadable.push_back(r);
    }
  }
  const std::string tail = "frnccl: " + std::to_string(in.wrote) + "/" + std::to_string(in.world_size) +
      " ranks wrote incident " + in.incident_id + " in " + std::to_string(int64_t(in.seconds * 10) / 10) + "." +
      std::to_string(int64_t(in.seconds * 10) % 10) + " s; full analysis: frnccl analyze " + printable(in.incident_dir, 300);
  auto undecided = [&](const std::string& why) {
    v.decided = false;
    v.undecided_reason = why;
    std::string line = "frnccl: verdict: undecided: " + why;
    if (!unreadable.empty()) {
      line += "; summary of " + ranksWord(unreadable) + " unreadable";
    }
    v.lines = {line.substr(0, kMaxVerdictLineBytes), tail};
    return v;
  };

  // Summaries of different lives (process groups re-initialized in between) number their ops apart.
  std::set<int64_t> lives;
  for (const auto& r : job.reports) {
    if (r && r->state != "left") {
      lives.insert(r->life);
    }
  }
  if (lives.size() > 1) {
    return undecided("the ranks' summaries are of different lives of the job (process groups re-initialized); no rank named");
  }

  std::vector<Wait> waits;
  std::vector<Mismatch> mismatches;
  collectiveWaits(job, waits, mismatches);
  p2pWaits(job, waits);
  if (!job.conflicting_group.empty()) {
    return undecided("the ranks' summaries disagree on the members of group " + printable(job.conflicting_group, 48) +
                     " (a group re-created in another life); no rank named");
  }

  // 0. Ranks that left the job with an uncaught exception, waiting in no op, that a peer waits for in an
  // op they never issued (analyzer: left_with_exception, its first tier): the exception is why the others
  // wait. A note on a rank nobody waits for explains nothing here: the other rules decide. Earliest first.
  {
    struct Left {
      int64_t rank;
      int64_t time_ns;
      const Wait* first_wait; // the oldest op it was waited for in: the op the analyzer names
      std::set<int64_t> waiters;
    };
    std::vector<Left> left;
    for (int64_t r = 0; r < job.world; ++r) {
      const auto& rep = job.reports[size_t(r)];
      if (!rep || rep->exit.empty() || rep->blocked()) {
        continue;
      }
      Left l{r, rep->exit_time_ns, nullptr, {}};
      for (const Wait& w : waits) {
        if (std::find(w.targets.begin(), w.targets.end(), r) != w.targets.end()) {
          l.waiters.insert(w.waiters.begin(), w.waiters.end());
          if (l.first_wait == nullptr || w.created_ns < l.first_wait->created_ns) {
            l.first_wait = &w;
          }
        }
      }
      if (l.first_wait != nullptr) {
        left.push_back(std::move(l));
      }
    }
    std::stable_sort(left.begin(), left.end(), [](const Left& a, const Left& b) { return a.time_ns < b.time_ns; });
    if (!left.empty()) {
      v.decided = true;
      v.kind = "left_with_exception";
      std::string line = "frnccl: verdict: left_with_exception: ";
      for (size_t i = 0; i < left.size(); ++i) {
        const Left& l = left[i];
        const Wait& w = *l.first_wait;
        v.culprits.push_back(l.rank);
        const std::vector<int64_t> waiters(l.waiters.begin(), l.waiters.end());
        line += (i == 0 ? "" : "; then ") + job.who({l.rank}) + "; " + opText(w.op, w.p2p, w.seq, w.group, w.desc) +
            "; left the job with " + printable(job.reports[size_t(l.rank)]->exit, 400) + "; " + ranksWord(waiters) + " waited for it" +
            alsoNotIn(job, w);
      }
      v.lines.push_back(line);
      const Wait& w = *left.front().first_wait;
      v.about(w.op, w.group, w.desc, w.seq, w.p2p, std::vector<int64_t>(left.front().waiters.begin(), left.front().waiters.end()));
    }
  }

  // 1. A mismatched collective: the minority issued something else (analyzer tier 0).
  if (!v.decided && !mismatches.empty()) {
    std::stable_sort(mismatches.begin(), mismatches.end(),
                     [](const Mismatch& a, const Mismatch& b) { return a.created_ns < b.created_ns; });
    const Mismatch& mm = mismatches.front();
    if (mm.culprits.empty()) {
      return undecided(mm.kind + " at " + opText(mm.op, false, mm.seq, mm.group, mm.desc) +
                       " with no majority, or with members whose summary is missing who could tip it");
    }
    v.decided = true;
    v.kind = mm.kind;
    v.culprits = mm.culprits;
    const std::string what = mm.kind == "op_mismatch" ? "issued " + printable(mm.minority_value, 48) + " where the others issued " + printable(mm.majority_value, 48)
                                                     : "passed " + printable(mm.minority_value, 120) + " where the others passed " + printable(mm.majority_value, 120);
    v.lines.push_back("frnccl: verdict: " + mm.kind + ": " + job.who(mm.culprits) + "; " +
                      opText(mm.op, false, mm.seq, mm.group, mm.desc) + "; " + what);
    bool complete = true;
    const GroupReport* any = job.groupOf(mm.culprits.front(), mm.group);
    std::vector<int64_t> others;
    if (any != nullptr) {
      for (int64_t r : membersOf(job, mm.group, *any, complete)) {
        if (std::find(mm.culprits.begin(), mm.culprits.end(), r) == mm.culprits.end()) {
          others.push_back(r);
        }
      }
    }
    v.about(mm.op, mm.group, mm.desc, mm.seq, false, others);
  }

  // 2. Ranks waited on that are inside no op: they never issued it (analyzer: not_joined, p2p_unmatched).
  if (!v.decided) {
    const Wait* primary = nullptr;
    for (const Wait& w : waits) {
      const bool has_culprit = std::any_of(w.targets.begin(), w.targets.end(), [&](int64_t t) { return !job.blocked(t); });
      if (has_culprit && (primary == nullptr || w.created_ns < primary->created_ns)) {
        primary = &w;
      }
    }
    // Waits for the same culprit whose ops were created within the clocks' uncertainty of the oldest: which
    // came first is the analyzer's call on its corrected clocks. Among them the one most ranks wait in is
    // named (the analyzer's tie-break), and the others are said too.
    std::vector<const Wait*> near;
    if (primary != nullptr) {
      for (const Wait& w : waits) {
        const bool same_culprit = std::any_of(w.targets.begin(), w.targets.end(), [&](int64_t t) {
          return !job.blocked(t) && std::find(primary->targets.begin(), primary->targets.end(), t) != primary->targets.end();
        });
        if (same_culprit && w.created_ns - primary->created_ns <= kSameTimeNs) { // created_ns are clamped: no overflow
          near.push_back(&w);
        }
      }
      std::stable_sort(near.begin(), near.end(), [](const Wait* a, const Wait* b) {
        if (a->waiters.size() != b->waiters.size()) {
          return a->waiters.size() > b->waiters.size();
        }
        return a->group != b->group ? a->group < b->group : a->seq < b->seq;
      });
      primary = near.front();
    }
    if (primary != nullptr) {
      std::vector<int64_t> culprits;
      for (int64_t t : primary->targets) {
        if (!job.blocked(t)) {
          culprits.push_back(t);
        }
      }
      std::string also;
      for (size_t i = 1; i < near.size() && i < 4; ++i) {
        also += std::string(also.empty() ? "; also never " : ", nor ") + (near[i]->p2p ? "posted the partner of " : "issued ") +
            opText(near[i]->op, near[i]->p2p, near[i]->seq, near[i]->group, near[i]->desc);
      }
      // These ranks provably never issued the op and are inside none; members without a readable summary
      // may have skipped it too: they are said, not named (the analyzer names them in a finding of their own).
      std::vector<int64_t> unknown = primary->missing;
      unknown.insert(unknown.end(), primary->unreadable.begin(), primary->unreadable.end());
      unknown.erase(std::remove(unknown.begin(), unknown.end(), -1), unknown.end());
      v.decided = true;
      v.kind = primary->p2p ? "p2p_unmatched" : "not_joined";
      v.culprits = culprits;
      v.about(primary->op, primary->group, primary->desc, primary->seq, primary->p2p, primary->waiters);
      v.lines.push_back("frnccl: verdict: " + v.kind + ": " + job.who(culprits) + "; " +
                        opText(primary->op, primary->p2p, primary->seq, primary->group, primary->desc) + "; " +
                        (primary->p2p ? "never posted the partner; " : "never issued it; ") + ranksWord(primary->waiters) +
                        (primary->waiters.size() == 1 ? " waits in it" : " wait in it") +
                        also + (unknown.empty() ? "" : "; " + ranksWord(unknown) + " left no readable summary"));
    }
  }

  // 3. Every present member waits, for members that left no summary (analyzer: missing_dump).
  if (!v.decided) {
    const Wait* primary = nullptr;
    for (const Wait& w : waits) {
      if (!w.missing.empty() && w.targets.empty() && (primary == nullptr || w.created_ns < primary->created_ns)) {
        primary = &w;
      }
    }
    if (primary != nullptr) {
      if (!primary->unreadable.empty()) {
        return undecided("ranks wait in " + opText(primary->op, primary->p2p, primary->seq, primary->group, primary->desc) +
                         " for " + ranksWord(primary->missing) + " (no summary) and for members whose summary is unreadable");
      }
      v.decided = true;
      v.kind = "missing_dump";
      v.culprits = primary->missing;
      v.about(primary->op, primary->group, primary->desc, primary->seq, primary->p2p, primary->waiters);
      std::vector<int64_t> left;
      for (int64_t m : primary->missing) {
        if (job.isLeft(m)) {
          left.push_back(m);
        }
      }
      v.lines.push_back("frnccl: verdict: missing_dump: " + job.who(primary->missing) + "; " +
                        opText(primary->op, primary->p2p, primary->seq, primary->group, primary->desc) + "; " +
                        ranksWord(primary->waiters) + (primary->waiters.size() == 1 ? " waits" : " wait") +
                        " in it for " + (primary->missing.size() == 1 ? "a rank" : "ranks") + " that posted no summary by the dump deadline" +
                        (left.empty() ? " (dead, killed, stuck, or its store connection failed)" : " (" + ranksWord(left) + " left the job)"));
    }
  }

  // 4. One rank left the loop for a closing op no other member reached, and every other rank's wait leads to it
  // (analyzer: left_early): the op named is the one of its peers' waits that holds up the most ranks.
  if (!v.decided) {
    if (const auto e = earlyExit(job, waits)) {
      const Wait& w = waits[e->peer_waits.front()];
      v.decided = true;
      v.kind = "left_early";
      v.culprits = {e->rank};
      v.about(w.op, w.group, w.desc, w.seq, false, e->victims);
      v.lines.push_back("frnccl: verdict: left_early: " + job.who({e->rank}) + "; " + opText(w.op, false, w.seq, w.group, w.desc) +
                        "; " + e->text);
    }
  }

  if (!v.decided) {
    if (waits.empty()) {
      return undecided(outsideCollectives(job));
    }
    const Wait& w = *std::min_element(waits.begin(), waits.end(),
                                      [](const Wait& a, const Wait& b) { return a.created_ns < b.created_ns; });
    if (!w.unreadable.empty()) {
      return undecided("ranks wait in " + opText(w.op, w.p2p, w.seq, w.group, w.desc) + " and the summaries of some members are missing or unreadable");
    }
    const bool all_in = w.targets.empty() && w.missing.empty();
    return undecided(all_in ? "every member is inside " + opText(w.op, w.p2p, w.seq, w.group, w.desc) +
                                  " (stuck: a network, device or library fault, or a wait the summaries cannot follow); no rank named"
                            : "the ranks waited on are inside other ops (a chain or a cycle the summaries cannot follow); no rank named");
  }

  // The culprits' own code: where the first culprit's thread is (or the op it is in was called from).
  const auto& first = job.reports[size_t(v.culprits.front())];
  if (v.kind == "left_with_exception") {
    // its line says where it raised; its thread is in the exit hook by now
  } else if (first && !first->frame.empty()) {
    v.lines.push_back("frnccl: rank " + std::to_string(v.culprits.front()) + " is at " + printable(first->frame, 300));
  } else if (first) {
    for (const auto& g : first->groups) {
      if (g.in_flight && !g.in_flight->frame.empty()) {
        v.lines.push_back("frnccl: rank " + std::to_string(v.culprits.front()) + "'s " + printable(g.in_flight->op, 48) +
                          " was called from " + printable(g.in_flight->frame, 300));
        break;
      }
    }
  }
  for (int64_t c : v.culprits) {
    const auto& rep = job.reports[size_t(c)];
    v.where.push_back(rep ? VerdictCulprit{c, printable(rep->host, 64), rep->pid} : VerdictCulprit{c, std::nullopt, std::nullopt});
  }
  v.lines.front() = v.lines.front().substr(0, kMaxVerdictLineBytes);
  v.lines.push_back(tail);
  return v;
}

} // namespace frnccl
