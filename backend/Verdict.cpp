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

namespace frnccl {

namespace {

// ---- a small JSON reader, for summaries only: bounded input, bounded depth, no exceptions ----

struct Json {
  enum Type { kNull, kBool, kNum, kStr, kArr, kObj } type = kNull;
  bool b = false;
  int64_t n = 0;
  std::string s;
  std::vector<Json> a;
  std::vector<std::pair<std::string, Json>> o;

  const Json* get(const char* key) const {
    for (const auto& [k, v] : o) {
      if (k == key) {
        return &v;
      }
    }
    return nullptr;
  }
  int64_t num(const char* key, int64_t fallback) const {
    const Json* v = get(key);
    return v != nullptr && v->type == kNum ? v->n : fallback;
  }
  std::string str(const char* key) const {
    const Json* v = get(key);
    return v != nullptr && v->type == kStr ? v->s : "";
  }
  bool flag(const char* key) const {
    const Json* v = get(key);
    return v != nullptr && v->type == kBool && v->b;
  }
};

class Reader {
 public:
  explicit Reader(const std::string& text) : t_(text) {}
  bool parse(Json& out) {
    if (!value(out, 0)) {
      return false;
    }
    space();
    return i_ == t_.size();
  }

 private:
  static constexpr int kMaxDepth = 8;
  void space() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\n' || t_[i_] == '\r' || t_[i_] == '\t')) {
      ++i_;
    }
  }
  bool literal(const char* word) {
    const std::string w(word);
    if (t_.compare(i_, w.size(), w) != 0) {
      return false;
    }
    i_ += w.size();
    return true;
  }
  bool string(std::string& out) {
    if (i_ >= t_.size() || t_[i_] != '"') {
      return false;
    }
    ++i_;
    while (i_ < t_.size()) {
      const char c = t_[i_++];
      if (c == '"') {
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20) {
        return false;
      }
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (i_ >= t_.size()) {
        return false;
      }
      const char e = t_[i_++];
      switch (e) {
        case '"': case '\\': case '/': out.push_back(e); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          if (i_ + 4 > t_.size()) {
            return false;
          }
          unsigned code = 0;
          for (int k = 0; k < 4; ++k) {
            const char h = t_[i_++];
            code <<= 4;
            if (h >= '0' && h <= '9') code |= unsigned(h - '0');
            else if (h >= 'a' && h <= 'f') code |= unsigned(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F') code |= unsigned(h - 'A' + 10);
            else return false;
          }
          out.push_back(code < 0x80 ? char(code) : '?'); // shown escaped by printable() anyway
          break;
        }
        default:
          return false;
      }
    }
    return false;
  }
  bool value(Json& out, int depth) {
    if (depth > kMaxDepth) {
      return false;
    }
    space();
    if (i_ >= t_.size()) {
      return false;
    }
    const char c = t_[i_];
    if (c == '{') {
      ++i_;
      out.type = Json::kObj;
      space();
      if (i_ < t_.size() && t_[i_] == '}') {
        ++i_;
        return true;
      }
      while (true) {
        space();
        std::string key;
        if (!string(key)) {
          return false;
        }
        space();
        if (i_ >= t_.size() || t_[i_++] != ':') {
          return false;
        }
        Json v;
        if (!value(v, depth + 1)) {
          return false;
        }
        out.o.emplace_back(std::move(key), std::move(v));
        space();
        if (i_ < t_.size() && t_[i_] == ',') {
          ++i_;
          continue;
        }
        return i_ < t_.size() && t_[i_++] == '}';
      }
    }
    if (c == '[') {
      ++i_;
      out.type = Json::kArr;
      space();
      if (i_ < t_.size() && t_[i_] == ']') {
        ++i_;
        return true;
      }
      while (true) {
        Json v;
        if (!value(v, depth + 1)) {
          return false;
        }
        out.a.push_back(std::move(v));
        space();
        if (i_ < t_.size() && t_[i_] == ',') {
          ++i_;
          continue;
        }
        return i_ < t_.size() && t_[i_++] == ']';
      }
    }
    if (c == '"') {
      out.type = Json::kStr;
      return string(out.s);
    }
    if (c == 't' || c == 'f') {
      out.type = Json::kBool;
      out.b = c == 't';
      return literal(c == 't' ? "true" : "false");
    }
    if (c == 'n') {
      return literal("null");
    }
    bool negative = false;
    if (c == '-') {
      negative = true;
      ++i_;
    }
    size_t digits = 0;
    uint64_t n = 0;
    while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9') {
      const uint64_t digit = uint64_t(t_[i_++] - '0');
      if (++digits > 19 || n > (uint64_t(INT64_MAX) - digit) / 10) {
        return false; // beyond int64: no field of a summary is
      }
      n = n * 10 + digit;
    }
    if (digits == 0) {
      return false;
    }
    out.type = Json::kNum;
    out.n = negative ? -int64_t(n) : int64_t(n);
    return true;
  }

  const std::string& t_;
  size_t i_ = 0;
};

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
  std::vector<GroupReport> groups;
  bool blocked() const {
    return std::any_of(groups.begin(), groups.end(), [](const GroupReport& g) { return g.in_flight.has_value(); });
  }
};

std::optional<RankReport> readSummary(const std::string& text, int64_t rank) {
  if (text.size() > 2 * kMaxSummaryBytes) {
    return std::nullopt;
  }
  Json j;
  if (!Reader(text).parse(j) || j.type != Json::kObj || j.num("rank", -1) != rank) {
    return std::nullopt;
  }
  RankReport r;
  r.rank = rank;
  r.host = j.str("host");
  r.pid = j.num("pid", 0);
  r.state = j.str("state");
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
      op.created_ns = f->num("created_ns", 0);
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

void collectiveWaits(const Job& job, std::vector<Wait>& waits, std::vector<Mismatch>& mismatches) {
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
      // The oldest collective a member is in: where the group stopped.
      int64_t seq = -1;
      for (int64_t m : members) {
        const GroupReport* mg = job.groupOf(m, g.name);
        if (mg != nullptr && mg->in_flight && !mg->in_flight->p2p && (seq < 0 || mg->in_flight->seq < seq)) {
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
        if (mg == nullptr || job.isLeft(m)) {
          w.missing.push_back(m);
          continue;
        }
        if (mg->in_flight && !mg->in_flight->p2p && mg->in_flight->seq == seq) {
          const OpInFlight& op = *mg->in_flight;
          w.waiters.push_back(m);
          by_op[op.op].push_back(m);
          by_sizes[op.in + " " + op.out].push_back(m);
          by_dtypes[op.dtypes].push_back(m);
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
      waits.push_back(std::move(w));
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

} // namespace

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
    job.reports[size_t(r)] = readSummary(*text, r);
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
    std::string line = "frnccl: verdict: undecided: " + why;
    if (!unreadable.empty()) {
      line += "; summary of " + ranksWord(unreadable) + " unreadable";
    }
    v.lines = {line.substr(0, kMaxVerdictLineBytes), tail};
    return v;
  };

  std::vector<Wait> waits;
  std::vector<Mismatch> mismatches;
  collectiveWaits(job, waits, mismatches);
  p2pWaits(job, waits);

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
            "; left the job with " + printable(job.reports[size_t(l.rank)]->exit, 400) + "; " + ranksWord(waiters) + " waited for it";
      }
      v.lines.push_back(line);
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
        if (same_culprit && w.created_ns - primary->created_ns <= kSameTimeNs) {
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
      std::vector<int64_t> left;
      for (int64_t m : primary->missing) {
        if (job.isLeft(m)) {
          left.push_back(m);
        }
      }
      v.lines.push_back("frnccl: verdict: missing_dump: " + job.who(primary->missing) + "; " +
                        opText(primary->op, primary->p2p, primary->seq, primary->group, primary->desc) + "; " +
                        ranksWord(primary->waiters) + (primary->waiters.size() == 1 ? " waits" : " wait") +
                        " in it for " + (primary->missing.size() == 1 ? "a rank" : "ranks") + " that wrote no part" +
                        (left.empty() ? " (dead, killed, or its dump failed)" : " (" + ranksWord(left) + " left the job)"));
    }
  }

  if (!v.decided) {
    if (waits.empty()) {
      return undecided("no rank is inside a collective or p2p op in its summary");
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
  v.lines.front() = v.lines.front().substr(0, kMaxVerdictLineBytes);
  v.lines.push_back(tail);
  return v;
}

// ---- VerdictBoard ----

VerdictBoard& VerdictBoard::get() {
  static VerdictBoard* board = new VerdictBoard(); // leaked: raised errors may read it at exit
  return *board;
}

void VerdictBoard::noteIncident(const std::string& incident_id, const std::string& incident_dir, int64_t deadline_mono_ns) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (incident_ == incident_id) {
      return;
    }
    incident_ = incident_id;
    incident_dir_ = incident_dir;
    verdict_.clear();
    deadline_mono_ns_ = deadline_mono_ns;
  }
  cv_.notify_all();
}

void VerdictBoard::setVerdict(const std::string& incident_id, const std::string& line) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (incident_ != incident_id) {
      return;
    }
    verdict_ = line.substr(0, kMaxVerdictLineBytes);
  }
  cv_.notify_all();
}

std::string VerdictBoard::awaitedIncident() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !incident_.empty() && verdict_.empty() && monoNs() < deadline_mono_ns_ ? incident_ : "";
}

std::string VerdictBoard::errorNote(int64_t wait_ms, int64_t incident_wait_ms) const {
  std::unique_lock<std::mutex> lock(mutex_);
  auto relevant = [&] {
    return !incident_.empty() && monoNs() <= deadline_mono_ns_ + kVerdictRelevantMs * 1000000LL;
  };
  if (!relevant() && incident_wait_ms > 0) {
    // The failure that raises may open (or join) its incident a moment after the caller saw it.
    cv_.wait_for(lock, std::chrono::milliseconds(incident_wait_ms), relevant);
  }
  if (!relevant()) {
    return "";
  }
  const int64_t until = std::min<int64_t>(deadline_mono_ns_, monoNs() + wait_ms * 1000000LL);
  const int64_t left_ns = until - monoNs();
  if (verdict_.empty() && left_ns > 0) {
    cv_.wait_for(lock, std::chrono::nanoseconds(left_ns), [&] { return !verdict_.empty(); });
  }
  if (!verdict_.empty()) {
    return verdict_;
  }
  return "frnccl: incident " + incident_ + ": no verdict yet; dumps in " + incident_dir_ +
      " on each rank's host, full analysis: frnccl analyze " + incident_dir_;
}

std::string VerdictBoard::verdict() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return verdict_;
}

std::string VerdictBoard::incident() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return incident_;
}

} // namespace frnccl
