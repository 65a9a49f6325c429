#include "DumpWriter.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <thread>

#include <c10/core/ScalarType.h>

#include "CallerStack.hpp"
#include "Clock.hpp"
#include "CompactEncoding.hpp"
#include "DumpFiles.hpp"
#include "DumpSchema.hpp"
#include "ExitNote.hpp"
#include "Gzip.hpp"
#include "IncidentId.hpp"

namespace frnccl {

namespace {

using namespace keys;

std::string profilingName(const Entry& e, const PgInfo& pg) {
  std::string name = e.backend == InnerKind::kNccl ? "nccl:" : "gloo:";
  name += opName(e.op);
  if (e.op == OpKind::kSend) {
    name += " " + std::to_string(pg.rank_in_group) + "->" + std::to_string(e.peer_local);
  } else if (e.op == OpKind::kRecv) {
    name += " " + std::to_string(pg.rank_in_group) + "<-" + std::to_string(e.peer_local);
  }
  return name;
}

DumpValue shapeList(
    const c10::SmallVector<int64_t, 8>& shapes,
    size_t& cursor,
    const c10::SmallVector<uint8_t, 4>& ranks) {
  DumpValue out = DumpValue::list(ranks.size());
  for (uint8_t ndim : ranks) {
    DumpValue dims = DumpValue::list(ndim);
    for (uint8_t d = 0; d < ndim && cursor < shapes.size(); ++d) {
      dims.push(shapes[cursor++]);
    }
    out.push(std::move(dims));
  }
  return out;
}

DumpValue dtypeList(const c10::SmallVector<c10::ScalarType, 4>& dtypes) {
  DumpValue out = DumpValue::list(dtypes.size());
  for (auto t : dtypes) {
    out.push(std::string(c10::toString(t)));
  }
  return out;
}

const char* stateOf(const Entry& e) {
  if (e.completed_ns != 0) {
    return "completed";
  }
  return e.started_ns != 0 ? "started" : "scheduled";
}

// Upper bound of the keys entryValue sets, so its dict is allocated once.
constexpr size_t kEntryKeyCount = 28;

// The only place that turns an entry into dump keys.
DumpValue entryValue(
    const Entry& e,
    const PgInfo& pg,
    const std::vector<SymbolizedFrame>* frames) {
  DumpValue v = DumpValue::dict(kEntryKeyCount);
  v.set(kRecordId, e.record_id);
  v.set(kEntryPgId, int64_t(pg.pg_id));
  v.set(kProcessGroup, DumpValue::Tuple{{pg.name, pg.desc}});
  v.set(kCollectiveSeqId, e.collective_seq);
  v.set(kP2PSeqId, e.p2p_seq);
  v.set(kOpId, e.op_id);
  v.set(kProfilingName, profilingName(e, pg));
  size_t cursor = 0;
  v.set(kInputSizes, shapeList(e.shapes, cursor, e.input_ranks));
  v.set(kInputDtypes, dtypeList(e.input_dtypes));
  v.set(kOutputSizes, shapeList(e.shapes, cursor, e.output_ranks));
  v.set(kOutputDtypes, dtypeList(e.output_dtypes));
  v.set(kIsP2P, isP2P(e.op));
  v.set(kPeer, int64_t(e.peer_global));
  v.set(kTimeoutMs, e.timeout_ms);
  v.set(kState, stateOf(e));
  v.set(kRetired, e.retired);
  v.set(kThreadId, std::to_string(e.thread_id));
  v.set(kThreadName, std::string(e.thread_name, strnlen(e.thread_name, sizeof(e.thread_name))));
  v.set(kTimeCreatedNs, e.created_ns);
  v.set(kTimeStartedNs, e.started_ns);
  v.set(kTimeCompletedNs, e.completed_ns);
  v.set(kTimeGpuStartedNs, e.gpu_started_ns);
  v.set(kTimeGpuCompletedNs, e.gpu_completed_ns);
  if (e.duration_ms >= 0) {
    v.set(kDurationMs, double(e.duration_ms));
  }
  DumpValue frame_list = DumpValue::list(frames != nullptr ? frames->size() : 0);
  if (frames != nullptr) {
    for (const auto& f : *frames) {
      DumpValue fv = DumpValue::dict(3);
      fv.set(kFrameName, f.name);
      fv.set(kFrameFilename, f.filename);
      fv.set(kFrameLine, f.line);
      frame_list.push(std::move(fv));
    }
  }
  v.set(kFrames, std::move(frame_list));
  return v;
}

// torch's fr_trace reads the pickle folder as it is and needs each group's
// ranks string: the pickle alone carries it, made from the members text.
DumpValue torchPgConfig(const DumpValue& pg_config) {
  DumpValue out = DumpValue::dict();
  for (const auto& kv : pg_config.asDict()) {
    DumpValue c = DumpValue::dict();
    for (const auto& item : kv.second.asDict()) {
      c.set(item.first, item.second);
    }
    const DumpValue* members = kv.second.find(kPgMembers);
    c.set(kPgRanksString, CompactEncoding::torchRanks(members != nullptr ? members->asString() : std::string()));
    out.set(kv.first, std::move(c));
  }
  return out;
}

int64_t monoNow() {
  return monoNs();
}

// zlib's fastest level: a 20,000-entry dump's columns compress to ~10-40 B per
// entry at level 1 already, in a few ms; higher levels gain little for their time.
constexpr int kCompactLevel = 1;

// The compact file: gzip'ed columns-2 JSON, or, on a host without libz or when
// compressing fails (zlib or the output buffer out of memory: compact is the
// only default format, so a failure here would leave no dump at all), the same
// JSON uncompressed under a .json name (load_dump reads both), said once.
void writeCompact(const Config& config, const std::string& incident_id, const std::string& base, const DumpValue& dump) {
  const Gzip& gzip = Gzip::system();
  std::string text = CompactEncoding::toJson(dump);
  std::string why = gzip.unavailableReason();
  if (gzip.available()) {
    std::string gz;
    try {
      gz = gzip.compress(text, kCompactLevel);
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (!gz.empty()) {
      writeDumpFile(config.dump_dir, incident_id, "compact", base + ".json.gz", gz);
      return;
    }
  }
  static std::once_flag said;
  std::call_once(said, [&] {
    std::fprintf(stderr, "[frnccl rank %lld] %s: compact dumps are written uncompressed (compact/%s.json)\n",
                 static_cast<long long>(config.rank), why.c_str(), base.c_str());
  });
  writeDumpFile(config.dump_dir, incident_id, "compact", base + ".json", text);
}

} // namespace

DumpValue DumpWriter::build(
    const Config& config,
    const DumpRequest& request,
    const Snapshot& snapshot,
    const SymbolizedStacks* stacks,
    const std::string& thread_stacks,
    const std::string& nccl_version,
    const WatchdogHealth& health) {
  DumpValue dump = DumpValue::dict();
  dump.set(kVersion, kFormatVersion);
  dump.set(kFormat, kFormatName);
  dump.set(kRank, config.rank);
  dump.set(kLocalRank, config.local_rank);
  dump.set(kWorldSize, config.world_size);
  dump.set(kHostname, config.hostname);
  dump.set(kPid, int64_t(getpid()));
  dump.set(kJobId, config.job_id);
  dump.set(kJobTag, config.job_tag);
  dump.set(kAttempt, config.attempt);
  dump.set(kLife, snapshot.life);
  dump.set(kTorchVersion, config.torch_version);
  dump.set(kNcclVersion, nccl_version);
  dump.set(kFrncclVersion, config.frnccl_version);
  dump.set(kIncidentId, request.incident_id);
  dump.set(kDumpReason, request.reason);
  dump.set(kDumpDetail, request.detail);
  dump.set(kTriggerRank, request.trigger_rank);
  const int64_t now_wall = wallNs();
  dump.set(kDumpTimeNs, now_wall);
  DumpValue clock = DumpValue::dict();
  clock.set(kClockSource, "CLOCK_REALTIME");
  clock.set(kClockRealtimeNs, now_wall);
  clock.set(kClockMonotonicNs, monoNow());
  dump.set(kClock, std::move(clock));
  dump.set(kBufferSize, int64_t(snapshot.capacity));
  dump.set(kStackCapture,
           config.stacks == StackMode::kPython ? std::string(pythonStackCapture())
               : config.stacks == StackMode::kCpp ? std::string("FRNCCL_STACKS=cpp: C++ frames")
                                                  : std::string("FRNCCL_STACKS=none: not captured"));
  dump.set(kSymbolized, stacks != nullptr);
  DumpValue wd = DumpValue::dict();
  wd.set(kWatchdogLastBeatNs, health.last_heartbeat_ns);
  wd.set(kWatchdogMaxLagMs, health.max_discovery_lag_ms);
  wd.set(kWatchdogMeanLagMs, health.mean_discovery_lag_ms);
  dump.set(kWatchdog, std::move(wd));
  // The library the recorded ops ran on, so empty for a CPU-only job, even from a CUDA build.
  // Groups of the process's earlier lives (torch named them "0", "1", ... too) are left out.
  const auto this_life = [&](const PgInfo& pg) { return pg.life == snapshot.life; };
  const bool any_nccl_group = std::any_of(snapshot.pgs.begin(), snapshot.pgs.end(), [&](const PgInfo& pg) {
    return this_life(pg) && pg.backends.find("nccl") != std::string::npos;
  });
  dump.set(kCommLibVersion, any_nccl_group ? nccl_version : std::string());

  DumpValue pg_config = DumpValue::dict();
  DumpValue pg_status = DumpValue::dict();
  for (const PgInfo& pg : snapshot.pgs) {
    if (!this_life(pg)) {
      continue;
    }
    DumpValue c = DumpValue::dict();
    c.set(kPgName, pg.name);
    c.set(kPgDesc, pg.desc);
    // Once, as runs: a list per group made every dump grow with the world size
    // (torch's ranks string: the pickle's alone, see write(), and `frnccl export --torch`).
    c.set(kPgMembers, CompactEncoding::members(pg.global_ranks));
    c.set(kPgBackend, pg.backends);
    c.set(kPgTimeoutMs, pg.timeout_ms);
    c.set(kPgSize, pg.size);
    pg_config.set(DumpValue::intern(pg.name), std::move(c));

    DumpValue s = DumpValue::dict();
    s.set(kStatusPgName, pg.name);
    s.set(kLastEnqueuedCollective, pg.last_enqueued_collective);
    s.set(kLastStartedCollective, pg.last_started_collective);
    s.set(kLastCompletedCollective, pg.last_completed_collective);
    s.set(kLastEnqueuedP2P, pg.last_enqueued_p2p);
    s.set(kLastStartedP2P, pg.last_started_p2p);
    s.set(kLastCompletedP2P, pg.last_completed_p2p);
    s.set(kLastDroppedCollective, pg.last_dropped_collective);
    s.set(kLastDroppedP2P, pg.last_dropped_p2p);
    pg_status.set(DumpValue::intern(std::to_string(pg.pg_id)), std::move(s));
  }
  dump.set(kPgConfig, std::move(pg_config));
  dump.set(kPgStatus, std::move(pg_status));

  DumpValue entries = DumpValue::list(snapshot.entries.size());
  for (size_t i = 0; i < snapshot.entries.size(); ++i) {
    const Entry& e = snapshot.entries[i];
    const std::vector<SymbolizedFrame>* frames =
        (stacks != nullptr && i < stacks->size()) ? &(*stacks)[i] : nullptr;
    entries.push(entryValue(e, snapshot.pgs.at(e.pg_index), frames));
  }
  dump.set(kEntries, std::move(entries));
  dump.set(kThreadStacks, thread_stacks);
  DumpValue exit = DumpValue::dict();
  if (const std::optional<ExitNote> note = exitNote()) {
    exit.set(kExitType, note->type);
    exit.set(kExitMessage, note->message);
    exit.set(kExitFrame, note->frame);
    exit.set(kExitTraceback, note->traceback);
    exit.set(kExitTimeNs, note->time_ns);
  }
  dump.set(kExit, std::move(exit));
  return dump;
}

DumpValue DumpWriter::chromeTrace(const DumpValue& dump) {
  DumpValue events = DumpValue::list(dump.find(kEntries)->asList().size() + dump.find(kPgStatus)->asDict().size() + 1);
  const int64_t rank = dump.find(kRank)->asInt();
  auto meta = [&](const char* what, int64_t tid, const std::string& name) {
    DumpValue m = DumpValue::dict();
    m.set("ph", "M");
    m.set("name", what);
    m.set("pid", rank);
    m.set("tid", tid);
    DumpValue args = DumpValue::dict();
    args.set("name", name);
    m.set("args", std::move(args));
    events.push(std::move(m));
  };
  meta("process_name", 0, "rank " + std::to_string(rank) + " (" + dump.find(kHostname)->asString() + ")");
  for (const auto& kv : dump.find(kPgStatus)->asDict()) {
    const std::string& pg_name = kv.second.find(kStatusPgName)->asString();
    const DumpValue* config = dump.find(kPgConfig)->find(pg_name);
    std::string desc = config != nullptr ? config->find(kPgDesc)->asString() : "";
    meta("thread_name", std::stoll(kv.first), "pg " + pg_name + (desc.empty() ? "" : " (" + desc + ")"));
  }
  for (const DumpValue& e : dump.find(kEntries)->asList()) {
    auto t = [&](const char* key) { return e.find(key)->asInt(); };
    const int64_t gpu_start = t(kTimeGpuStartedNs);
    const int64_t gpu_end = t(kTimeGpuCompletedNs);
    const int64_t start = gpu_start != 0 ? gpu_start : (t(kTimeStartedNs) != 0 ? t(kTimeStartedNs) : t(kTimeCreatedNs));
    const int64_t end = gpu_end != 0 ? gpu_end : t(kTimeCompletedNs);
    DumpValue ev = DumpValue::dict();
    ev.set("name", e.find(kProfilingName)->asString());
    ev.set("cat", e.find(kIsP2P)->asInt() ? "p2p" : "collective");
    ev.set("pid", rank);
    ev.set("tid", t(kEntryPgId));
    ev.set("ts", double(start) / 1000.0);
    if (end != 0) {
      ev.set("ph", "X");
      ev.set("dur", double(std::max<int64_t>(end - start, 0)) / 1000.0);
    } else {
      ev.set("ph", "i");
      ev.set("s", "t");
    }
    DumpValue args = DumpValue::dict();
    args.set(kState, e.find(kState)->asString());
    args.set(kCollectiveSeqId, t(kCollectiveSeqId));
    args.set(kP2PSeqId, t(kP2PSeqId));
    args.set(kOpId, t(kOpId));
    args.set(kRecordId, t(kRecordId));
    ev.set("args", std::move(args));
    events.push(std::move(ev));
  }
  DumpValue trace = DumpValue::dict();
  trace.set("traceEvents", std::move(events));
  trace.set("displayTimeUnit", "ms");
  return trace;
}

std::string DumpWriter::write(const Config& config, const std::string& incident_id, const DumpValue& dump) {
  if (!validIncidentId(incident_id)) {
    throw std::runtime_error("incident id \"" + printable(incident_id) + "\" is not a plain folder name");
  }
  const std::string incident_dir = config.dump_dir + "/" + incident_id;
  const std::string base = std::string(kRankFilePrefix) + std::to_string(config.rank);
  auto file = [&](const char* format, const std::string& name, const std::string& data) {
    writeDumpFile(config.dump_dir, incident_id, format, name, data);
  };
  std::vector<std::function<void()>> files;
  if (config.write_compact) {
    files.emplace_back([&] { writeCompact(config, incident_id, base, dump); });
  }
  if (config.write_pickle) {
    files.emplace_back([&] {
      const DumpValue torch_groups = torchPgConfig(*dump.find(kPgConfig));
      file("pickle", base, dump.toPickle(kPgConfig, &torch_groups));
    });
  }
  if (config.write_json) {
    files.emplace_back([&] { file("json", base + ".json", dump.toJson()); });
  }
  if (config.write_chrome) {
    files.emplace_back([&] { file("chrome", base + ".trace.json", chromeTrace(dump).toJson()); });
  }
  // The formats are independent encodings of one finished tree, so they are
  // encoded and written side by side; this call owns the helper threads and
  // joins them before returning (each is bounded by its own encode + write).
  std::vector<std::exception_ptr> errors(files.size());
  std::vector<std::thread> helpers;
  for (size_t i = 1; i < files.size(); ++i) {
    auto run = [&, i] {
      try {
        files[i]();
      } catch (...) {
        errors[i] = std::current_exception();
      }
    };
    try {
      helpers.emplace_back(run);
    } catch (const std::system_error&) {
      run(); // no thread to be had: write this format here instead
    }
  }
  try {
    if (!files.empty()) {
      files[0]();
    }
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (auto& helper : helpers) {
    helper.join();
  }
  for (const auto& error : errors) {
    if (error) {
      // Folders left empty by the failure go too (rmdir leaves non-empty
      // ones alone), so `frnccl analyze DIR` still finds the last good incident.
      removeEmptyIncidentFolders(config.dump_dir, incident_id);
      std::rethrow_exception(error);
    }
  }
  return incident_dir;
}

} // namespace frnccl
