// The verdict's early-exit rule (see VerdictEarlyExit.hpp and the analyzer's leaver.py, which it mirrors).
#include "VerdictEarlyExit.hpp"

#include <algorithm>
#include <set>

#include "IncidentId.hpp"

namespace frnccl {

namespace {

constexpr size_t kMinOthers = 2; // other members that never issued the leaver's op: one would be one against one
constexpr size_t kSaidWaits = 4; // peers' waits said in the line

bool contains(const std::vector<int64_t>& v, int64_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// The analyzer's _name_key: numeric group names in numeric order, before the others in text order.
bool nameBefore(const std::string& a, const std::string& b) {
  auto numeric = [](const std::string& s) {
    return !s.empty() && s.size() < 18 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  const bool na = numeric(a), nb = numeric(b);
  if (na != nb) {
    return na;
  }
  return na ? std::stoll(a) < std::stoll(b) : a < b;
}

std::string ranksText(const std::vector<int64_t>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size() && i < 12; ++i) {
    out += (i ? "," : "") + std::to_string(ranks[i]);
  }
  return out + (ranks.size() > 12 ? ",... (" + std::to_string(ranks.size()) + " in all)" : "");
}

std::string opOf(const ExitWait& w) {
  return printable(w.op, 48) + " seq " + std::to_string(w.seq) + " of group " + printable(w.group, 48) + " (" +
      printable(w.desc, 48) + ")";
}

// The ranks held up in wait `w`: its waiters and those that wait on them, directly or through others.
size_t held(const ExitWait& w, const std::vector<const ExitWait*>& mine, int64_t leaver) {
  std::set<int64_t> out(w.waiters.begin(), w.waiters.end());
  for (bool grew = true; grew;) {
    grew = false;
    for (int64_t u = 0; u < int64_t(mine.size()); ++u) {
      if (u != leaver && !out.count(u) &&
          std::any_of(mine[size_t(u)]->targets.begin(), mine[size_t(u)]->targets.end(), [&](int64_t t) { return out.count(t) > 0; })) {
        out.insert(u);
        grew = true;
      }
    }
  }
  return out.size();
}

std::optional<EarlyExit> asLeaver(int64_t r, const std::vector<ExitWait>& waits, const std::vector<const ExitWait*>& mine) {
  const ExitWait& w = *mine[size_t(r)];
  std::vector<int64_t> others, targets = w.targets;
  for (int64_t m : w.members) {
    if (m != r) {
      others.push_back(m);
    }
  }
  std::sort(others.begin(), others.end());
  std::sort(targets.begin(), targets.end());
  if (w.waiters != std::vector<int64_t>{r} || others.size() < kMinOthers || targets != others) {
    return std::nullopt;
  }
  // A rank is explained once everyone it waits for is: chains that end at r, r's own wait set aside.
  std::vector<bool> explained(mine.size(), false);
  explained[size_t(r)] = true;
  for (bool grew = true; grew;) {
    grew = false;
    for (size_t u = 0; u < mine.size(); ++u) {
      if (!explained[u] && mine[u] != &w &&
          std::all_of(mine[u]->targets.begin(), mine[u]->targets.end(), [&](int64_t t) { return explained[size_t(t)]; })) {
        explained[u] = true;
        grew = true;
      }
    }
  }
  if (std::find(explained.begin(), explained.end(), false) != explained.end()) {
    return std::nullopt;
  }
  EarlyExit e;
  e.rank = r;
  e.own = size_t(&w - waits.data());
  std::vector<std::pair<size_t, size_t>> direct; // (held, index)
  for (size_t i = 0; i < waits.size(); ++i) {
    if (&waits[i] != &w && contains(waits[i].targets, r)) {
      direct.emplace_back(held(waits[i], mine, r), i);
    }
  }
  std::stable_sort(direct.begin(), direct.end(), [&](const auto& a, const auto& b) {
    if (a.first != b.first) {
      return a.first > b.first;
    }
    const ExitWait &x = waits[a.second], &y = waits[b.second];
    return x.seq != y.seq ? x.seq < y.seq : nameBefore(x.group, y.group);
  });
  std::set<int64_t> said;
  for (const auto& [n, i] : direct) {
    e.peer_waits.push_back(i);
    said.insert(waits[i].waiters.begin(), waits[i].waiters.end());
  }
  for (int64_t u = 0; u < int64_t(mine.size()); ++u) {
    if (u != r) {
      e.victims.push_back(u);
      if (!said.count(u)) {
        e.indirect.push_back(u);
      }
    }
  }
  e.text = "left the loop early: it is in " + opOf(w) + ", which no other member reached, while its peers wait for it in ops it never issued: ";
  for (size_t k = 0; k < e.peer_waits.size() && k < kSaidWaits; ++k) {
    const ExitWait& p = waits[e.peer_waits[k]];
    e.text += (k ? ", " : "") + ranksText(p.waiters) + " in " + opOf(p);
  }
  if (e.peer_waits.size() > kSaidWaits) {
    e.text += " and " + std::to_string(e.peer_waits.size() - kSaidWaits) + " more ops";
  }
  if (!e.indirect.empty()) {
    e.text += "; " + ranksText(e.indirect) + (e.indirect.size() == 1 ? " waits" : " wait") + " on them through other groups";
  }
  return e;
}

} // namespace

std::optional<EarlyExit> findEarlyExit(int64_t world, bool one_op_each, const std::vector<ExitWait>& waits) {
  if (!one_op_each || world <= 0 || waits.empty()) {
    return std::nullopt;
  }
  std::vector<const ExitWait*> mine(size_t(world), nullptr); // the one wait each rank is in
  for (const ExitWait& w : waits) {
    if (!w.decidable || w.targets.empty()) {
      return std::nullopt; // p2p, members unknown, or an op every member is stuck in: other rules' evidence
    }
    for (int64_t r : w.waiters) {
      if (r < 0 || r >= world || mine[size_t(r)] != nullptr) {
        return std::nullopt; // inside two ops: more than one point of the program
      }
      mine[size_t(r)] = &w;
    }
    for (int64_t t : w.targets) {
      if (t < 0 || t >= world) {
        return std::nullopt;
      }
    }
  }
  if (std::find(mine.begin(), mine.end(), nullptr) != mine.end()) {
    return std::nullopt; // a rank outside communication: not_joined's, not this rule's
  }
  std::optional<EarlyExit> found;
  for (int64_t r = 0; r < world; ++r) {
    if (auto e = asLeaver(r, waits, mine)) {
      if (found) {
        return std::nullopt; // two candidates: opposite orders, no single odd rank
      }
      found = std::move(e);
    }
  }
  return found;
}

} // namespace frnccl
