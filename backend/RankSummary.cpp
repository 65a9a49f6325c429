// A rank's summary for the store (see RankSummary.hpp). Runs on the monitor thread or a Python thread that
// released nothing it needs: no GIL, no store call, no file.
#include "RankSummary.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cctype>
#include <vector>

#include <c10/core/ScalarType.h>

#include "DumpValue.hpp"
#include "ExitNote.hpp"

namespace frnccl {

namespace {

constexpr size_t kMaxHostBytes = 64;
constexpr size_t kMaxNameBytes = 48;
constexpr size_t kMaxFrameBytes = 200;
constexpr size_t kMaxShapesBytes = 96;
constexpr size_t kMaxExitBytes = 400;
// A group's global ranks are listed up to this size: enough for a verdict to know who is in a TP or PP group
// whose members left no summary; the default group's members are all ranks.
constexpr int64_t kMaxListedRanks = 16;

// Cut at a byte count; appendJsonString then makes the text valid UTF-8 (a cut character is replaced).
std::string cut(const std::string& s, size_t max) {
  return s.size() <= max ? s : s.substr(0, max) + "...";
}

void addString(std::string& out, const char* key, const std::string& value, size_t max) {
  out += '"';
  out += key;
  out += "\":";
  const std::string v = cut(value, max);
  DumpValue::appendJsonString(out, v.data(), v.size());
}

void addInt(std::string& out, const char* key, int64_t value) {
  out += '"';
  out += key;
  out += "\":" + std::to_string(value);
}

// torch's own code that issues collectives (the analyzer's header.py: _TORCH_FILE).
bool torchWrapperFile(const std::string& file) {
  for (const char* part : {"torch/distributed/", "torch/nn/parallel/", "torch\\distributed\\", "torch\\nn\\parallel\\"}) {
    const size_t at = file.find(part);
    if (at != std::string::npos && (at == 0 || file[at - 1] == '/' || file[at - 1] == '\\')) {
      return true;
    }
  }
  return false;
}

std::string frameText(const std::vector<SymbolizedFrame>& frames) {
  if (frames.empty()) {
    return "";
  }
  const SymbolizedFrame* pick = &frames.front();
  for (const auto& f : frames) {
    if (!torchWrapperFile(f.filename)) {
      pick = &f;
      break;
    }
  }
  return pick->filename + ":" + std::to_string(pick->line) + " in " + pick->name;
}

std::string shapesText(const Entry& e, size_t& cursor, const c10::SmallVector<uint8_t, 4>& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    out += i ? ",[" : "[";
    for (uint8_t d = 0; d < ranks[i] && cursor < e.shapes.size(); ++d) {
      out += (d ? "," : "") + std::to_string(e.shapes[cursor++]);
    }
    out += "]";
  }
  return out + "]";
}

std::string dtypesText(const c10::SmallVector<c10::ScalarType, 4>& in, const c10::SmallVector<c10::ScalarType, 4>& out) {
  std::string text;
  for (auto t : in) {
    text += (text.empty() ? "" : ",") + std::string(c10::toString(t));
  }
  text += ";";
  for (size_t i = 0; i < out.size(); ++i) {
    text += (i ? "," : "") + std::string(c10::toString(out[i]));
  }
  return text;
}

// What the recorder says of one group of this life.
struct GroupView {
  const PgInfo* pg = nullptr;
  const Entry* enqueued = nullptr; // newest collective entry
  const Entry* started = nullptr; // newest collective seen started
  const Entry* completed = nullptr; // newest collective seen completed
  const Entry* in_flight = nullptr; // oldest op past the group's last completed one, not completed
  size_t in_flight_index = 0;
};

void addStep(std::string& out, const char* key, int64_t seq, const Entry* e) {
  out += '"';
  out += key;
  out += "\":{";
  addInt(out, "seq", seq);
  out += ',';
  addString(out, "op", e != nullptr && e->collective_seq == seq ? opName(e->op) : "", kMaxNameBytes);
  out += '}';
}

std::string groupJson(const GroupView& g, const SummaryInput& in) {
  const PgInfo& pg = *g.pg;
  std::string out = "{";
  addString(out, "pg", pg.name, kMaxNameBytes);
  out += ',';
  addString(out, "desc", pg.desc, kMaxNameBytes);
  out += ',';
  addInt(out, "size", pg.size);
  if (pg.size <= kMaxListedRanks && !pg.global_ranks.empty()) {
    out += ",\"ranks\":[";
    for (size_t i = 0; i < pg.global_ranks.size() && i < size_t(kMaxListedRanks); ++i) {
      out += (i ? "," : "") + std::to_string(pg.global_ranks[i]);
    }
    out += ']';
  }
  out += ',';
  addStep(out, "enqueued", pg.last_enqueued_collective, g.enqueued);
  out += ',';
  addStep(out, "started", pg.last_started_collective, g.started);
  out += ',';
  addStep(out, "completed", pg.last_completed_collective, g.completed);
  out += ",\"p2p\":[" + std::to_string(pg.last_enqueued_p2p) + "," + std::to_string(pg.last_started_p2p) + "," +
      std::to_string(pg.last_completed_p2p) + "]";
  if (g.in_flight != nullptr) {
    const Entry& e = *g.in_flight;
    const bool p2p = isP2P(e.op);
    out += ",\"in_flight\":{";
    addString(out, "op", opName(e.op), kMaxNameBytes);
    out += ',';
    addInt(out, "seq", p2p ? e.p2p_seq : e.collective_seq);
    out += p2p ? ",\"p2p\":true," : ",\"p2p\":false,";
    addInt(out, "peer", e.peer_global);
    out += ',';
    addString(out, "state", e.started_ns != 0 ? "started" : "scheduled", 16);
    out += e.failed ? ",\"failed\":true," : ",\"failed\":false,";
    size_t cursor = 0;
    const std::string in_shapes = shapesText(e, cursor, e.input_ranks);
    const std::string out_shapes = shapesText(e, cursor, e.output_ranks);
    addString(out, "in", in_shapes, kMaxShapesBytes);
    out += ',';
    addString(out, "out", out_shapes, kMaxShapesBytes);
    out += ',';
    addString(out, "dtypes", dtypesText(e.input_dtypes, e.output_dtypes), kMaxShapesBytes);
    out += ',';
    addInt(out, "created_ns", e.created_ns);
    if (in.frames != nullptr && g.in_flight_index < in.frames->size()) {
      const std::string frame = frameText((*in.frames)[g.in_flight_index]);
      if (!frame.empty()) {
        out += ',';
        addString(out, "frame", frame, kMaxFrameBytes);
      }
    }
    out += '}';
  }
  return out + "}";
}

// One faulthandler frame line, `  File "<file>", line <n> in <function>`, parsed by hand. Not std::regex:
// building one goes through the locale's facets, and on the GPU image (gcc 13, torch 2.11's wheel) that
// crashed the dump's writer, and the process with it, before any file was written (SIGSEGV in
// regex_traits::transform_primary, on a facet that was not a collate). The file is the longest prefix that
// leaves `", line <digits> in ` after it, as the greedy pattern this replaces had it.
bool parseFrameLine(const std::string& line, std::string& file, std::string& lineno, std::string& function) {
  size_t start = 0;
  while (start < line.size() && std::isspace(static_cast<unsigned char>(line[start]))) {
    ++start;
  }
  static const std::string kFile = "File \"";
  static const std::string kLine = "\", line ";
  static const std::string kIn = " in ";
  if (line.compare(start, kFile.size(), kFile) != 0) {
    return false;
  }
  const size_t name = start + kFile.size();
  for (size_t at = line.rfind(kLine); at != std::string::npos && at >= name;
       at = at == 0 ? std::string::npos : line.rfind(kLine, at - 1)) {
    const size_t digits = at + kLine.size();
    size_t end = digits;
    while (end < line.size() && std::isdigit(static_cast<unsigned char>(line[end]))) {
      ++end;
    }
    if (end > digits && line.compare(end, kIn.size(), kIn) == 0) {
      file = line.substr(name, at - name);
      lineno = line.substr(digits, end - digits);
      function = line.substr(end + kIn.size());
      return true;
    }
  }
  return false;
}

} // namespace

std::string userFrameOfThread(const std::string& thread_stacks, uint64_t thread_id) {
  // faulthandler: "Thread 0x00007f... (most recent call first):" or "Current thread 0x...", then
  // "  File \"<file>\", line <n> in <function>" per frame, innermost first.
  bool in_thread = false;
  bool seen_thread = false;
  std::string first;
  size_t pos = 0;
  while (pos < thread_stacks.size()) {
    size_t end = thread_stacks.find('\n', pos);
    if (end == std::string::npos) {
      end = thread_stacks.size();
    }
    const std::string line = thread_stacks.substr(pos, std::min<size_t>(end - pos, 4096));
    pos = end + 1;
    const size_t hex = line.find("hread 0x");
    if (hex != std::string::npos && line.find("(most recent call first)") != std::string::npos) {
      if (in_thread) {
        break; // the thread's frames ended without one outside torch
      }
      const uint64_t id = std::strtoull(line.c_str() + hex + 6, nullptr, 16);
      in_thread = thread_id == 0 ? !seen_thread : id == thread_id;
      seen_thread = true;
      continue;
    }
    std::string file, lineno, function;
    if (!in_thread || !parseFrameLine(line, file, lineno, function)) {
      continue;
    }
    const std::string text = file + ":" + lineno + " in " + function;
    if (first.empty()) {
      first = text;
    }
    if (!torchWrapperFile(file)) {
      return text;
    }
  }
  return first;
}

std::string buildRankSummary(const SummaryInput& in) {
  const Config& config = *in.config;
  const Snapshot& snap = *in.snapshot;
  std::vector<GroupView> groups(snap.pgs.size());
  for (size_t i = 0; i < snap.pgs.size(); ++i) {
    groups[i].pg = &snap.pgs[i];
  }
  const Entry* newest = nullptr;
  for (size_t i = 0; i < snap.entries.size(); ++i) {
    const Entry& e = snap.entries[i];
    if (e.pg_index < 0 || size_t(e.pg_index) >= groups.size()) {
      continue;
    }
    GroupView& g = groups[size_t(e.pg_index)];
    newest = &e;
    const bool p2p = isP2P(e.op);
    if (!p2p) {
      g.enqueued = &e;
      if (e.started_ns != 0) {
        g.started = &e;
      }
      if (e.completed_ns != 0) {
        g.completed = &e;
      }
    }
    const bool past_done = p2p ? e.p2p_seq > g.pg->last_completed_p2p : e.collective_seq > g.pg->last_completed_collective;
    if (g.in_flight == nullptr && e.completed_ns == 0 && past_done) {
      g.in_flight = &e;
      g.in_flight_index = i;
    }
  }
  // This life's groups, those with an op in flight first (oldest op first), then by pg id.
  std::vector<const GroupView*> order;
  for (const auto& g : groups) {
    if (g.pg->life == snap.life) {
      order.push_back(&g);
    }
  }
  std::stable_sort(order.begin(), order.end(), [](const GroupView* a, const GroupView* b) {
    if ((a->in_flight != nullptr) != (b->in_flight != nullptr)) {
      return a->in_flight != nullptr;
    }
    if (a->in_flight != nullptr && a->in_flight->created_ns != b->in_flight->created_ns) {
      return a->in_flight->created_ns < b->in_flight->created_ns;
    }
    return a->pg->pg_id < b->pg->pg_id;
  });

  std::string head = "{";
  addInt(head, "v", kSummaryVersion);
  head += ',';
  addInt(head, "rank", config.rank);
  head += ',';
  addInt(head, "world_size", config.world_size);
  head += ',';
  addString(head, "host", config.hostname, kMaxHostBytes);
  head += ',';
  addInt(head, "pid", int64_t(getpid()));
  head += ',';
  addInt(head, "life", snap.life);
  head += ',';
  addString(head, "incident", in.incident_id, 128);
  head += ',';
  addString(head, "state", in.state, 16);
  if (newest != nullptr && in.thread_stacks != nullptr) {
    // Where the thread that issued this rank's last op is now: for a rank that never joined, its own code.
    const std::string where = userFrameOfThread(*in.thread_stacks, newest->thread_id);
    if (!where.empty()) {
      head += ',';
      addString(head, "frame", where, kMaxFrameBytes);
    }
  }
  if (const std::optional<ExitNote> note = exitNote()) {
    // The uncaught exception this rank leaves the job with (ExitNote.hpp): the verdict names it.
    head += ',';
    addString(head, "exit", note->oneLine(), kMaxExitBytes);
    head += ',';
    addInt(head, "exit_time_ns", note->time_ns);
  }
  if (newest != nullptr) {
    head += ",\"last_op\":{";
    addString(head, "pg", snap.pgs[size_t(newest->pg_index)].name, kMaxNameBytes);
    head += ',';
    addString(head, "op", opName(newest->op), kMaxNameBytes);
    head += ',';
    addInt(head, "seq", isP2P(newest->op) ? newest->p2p_seq : newest->collective_seq);
    head += '}';
  }
  head += ",\"groups\":[";
  std::string body;
  size_t listed = 0;
  // Room for the closing text: "],\"groups_left_out\":<n>}".
  constexpr size_t kTail = 40;
  for (const GroupView* g : order) {
    if (listed == kMaxSummaryGroups) {
      break;
    }
    const std::string one = groupJson(*g, in);
    if (head.size() + body.size() + one.size() + 1 + kTail > kMaxSummaryBytes) {
      break;
    }
    body += (listed ? "," : "") + one;
    ++listed;
  }
  std::string out = head + body + "],";
  addInt(out, "groups_left_out", int64_t(order.size() - listed));
  out += '}';
  if (out.size() > kMaxSummaryBytes) {
    // The head alone is bounded well below this; kept as a last guard for the store's readers.
    out = "{\"v\":1,\"rank\":" + std::to_string(config.rank) + ",\"state\":\"too_large\",\"groups\":[]}";
  }
  return out;
}

} // namespace frnccl
