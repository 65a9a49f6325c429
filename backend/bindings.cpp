// Python bindings: fr_backend._C
#include <algorithm>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>

#include "CallerStack.hpp"

#include "DeviceMarker.hpp"
#include "DumpWriter.hpp"
#include "ExitNote.hpp"
#include "FrBackend.hpp"
#include "FrWork.hpp"
#include "HeartbeatMonitor.hpp"
#include "InnerProgress.hpp"
#include "MetricsSnapshot.hpp"
#include "RankSummary.hpp"
#include "Recorder.hpp"
#include "Runtime.hpp"
#include "SignalChain.hpp"
#include "TermDump.hpp"
#include "Verdict.hpp"

namespace py = pybind11;
using namespace frnccl;

namespace {

template <typename T>
T item(const py::dict& d, const char* key, T fallback) {
  return d.contains(key) ? d[key].cast<T>() : fallback;
}

Config configFrom(const py::dict& d) {
  Config c;
  c.buffer_size = item<size_t>(d, "buffer_size", c.buffer_size);
  const auto stacks = item<std::string>(d, "stacks", "python");
  c.stacks = stacks == "python" ? StackMode::kPython : stacks == "cpp" ? StackMode::kCpp : StackMode::kNone;
  c.dump_dir = item<std::string>(d, "dump_dir", "");
  c.verdict_file = item<std::string>(d, "verdict_file", "");
  c.write_compact = item<bool>(d, "write_compact", true);
  c.write_pickle = item<bool>(d, "write_pickle", false);
  c.write_json = item<bool>(d, "write_json", false);
  c.write_chrome = item<bool>(d, "write_chrome", false);
  c.coord_check_ms = item<int64_t>(d, "coord_check_ms", c.coord_check_ms);
  c.heartbeat_timeout_ms = item<int64_t>(d, "heartbeat_timeout_ms", c.heartbeat_timeout_ms);
  c.dump_timeout_ms = item<int64_t>(d, "dump_timeout_ms", c.dump_timeout_ms);
  c.dump_min_interval_ms = item<int64_t>(d, "dump_min_interval_ms", c.dump_min_interval_ms);
  c.dump_max_count = item<int64_t>(d, "dump_max_count", c.dump_max_count);
  c.watchdog_poll_ms = item<int64_t>(d, "watchdog_poll_ms", c.watchdog_poll_ms);
  c.symbolize_timeout_ms = item<int64_t>(d, "symbolize_timeout_ms", c.symbolize_timeout_ms);
  c.on_timeout = item<std::string>(d, "on_timeout", "raise") == "exit" ? OnTimeout::kExit : OnTimeout::kRaise;
  c.dump_signal = item<int>(d, "dump_signal", 0);
  c.stacks_signal = item<int>(d, "stacks_signal", 0);
  c.stacks_fd = item<int>(d, "stacks_fd", -1);
  c.dump_on_teardown = item<bool>(d, "dump_on_teardown", false);
  c.terminate_dump_ms = item<int64_t>(d, "terminate_dump_ms", 0);
  c.exception_exit_ms = item<int64_t>(d, "exception_exit_ms", 3000);
  c.gpu_timing_every = item<int64_t>(d, "gpu_timing_every", 0);
  c.end_event_interval_us = item<int64_t>(d, "end_event_interval_us", c.end_event_interval_us);
  c.settle_by_torch_watchdog = item<bool>(d, "settle_by_torch_watchdog", c.settle_by_torch_watchdog);
  c.rank = item<int64_t>(d, "rank", 0);
  c.local_rank = item<int64_t>(d, "local_rank", -1);
  c.world_size = item<int64_t>(d, "world_size", 1);
  c.hostname = item<std::string>(d, "hostname", "");
  c.job_id = item<std::string>(d, "job_id", "");
  c.attempt = item<int64_t>(d, "attempt", 0);
  c.torch_version = item<std::string>(d, "torch_version", "");
  c.frnccl_version = item<std::string>(d, "frnccl_version", "");
  return c;
}

c10::intrusive_ptr<c10d::Backend> optionalBackend(const py::object& o) {
  if (o.is_none()) {
    return c10::intrusive_ptr<c10d::Backend>();
  }
  return o.cast<c10::intrusive_ptr<c10d::Backend>>();
}

c10::intrusive_ptr<c10d::Store> rootStore(const c10::intrusive_ptr<c10d::Store>& store) {
  if (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(store.get())) {
    return prefixed->getUnderlyingNonPrefixStore();
  }
  return store;
}

// The recorder's content as a dump, for in-process inspection. Runs on a
// Python thread without the GIL; symbolizing takes it, and waiting for it is
// fine here.
std::string tracePickle(bool symbolize) {
  Snapshot snapshot = Recorder::get().snapshot(symbolize);
  SymbolizedStacks frames;
  if (symbolize) {
    frames = symbolizeStacks(snapshot.stacks);
    releaseStacks(snapshot.stacks);
  }
  DumpRequest request;
  request.incident_id = "inspect";
  request.reason = "manual";
  request.detail = "fr_backend.trace_entries()";
  const Config config = Runtime::get().config();
  const DumpValue dump = DumpWriter::build(
      config, request, snapshot, symbolize ? &frames : nullptr, "", ncclVersionString(), WatchdogHealth{});
  return dump.toPickle();
}

} // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "frnccl: flight-recording c10d backend (C++ core)";
  py::module_::import("torch.distributed");

  m.def("configure", [](const py::dict& d) {
          setUpStackCapture(); // decided once, with the GIL held
          const Config config = configFrom(d);
          // Without the GIL: a new life may first stop the last one's idle threads, whose dump may want it.
          py::gil_scoped_release no_gil;
          return Runtime::get().configure(config);
        },
        "Called before each group is created: when no frnccl group is alive, a new life of the process begins "
        "with this configuration (returns True); otherwise the life in progress keeps its own.");
  m.def("stack_capture", [] { return std::string(pythonStackCapture()); },
        "How Python caller stacks are captured, in words.");
  m.def("_use_public_frame_api", &usePublicFrameApi);
  m.def("configured", [] { return Runtime::get().configured(); });
  m.def("install_dump_signal", [](int signal_number) { Runtime::get().installDumpSignal(signal_number, -1); },
        "Installs the dump signal's handler before any group exists (FRNCCL_ENABLE); once per process.");
  m.def("handles_signal", &SignalChain::handles, "Whether frnccl handles this signal in this process.");
  m.def("signal_action_id", &SignalChain::actionId, "An identity of the signal's current action.");
  m.def("reclaim_signal_if_changed", &SignalChain::reclaimIfChanged,
        "After signal.signal: frnccl's handler goes back in front of the action it installed, handing the "
        "signal on to it, if the action changed since `before` (signal_action_id).");

  py::class_<FrBackend, c10d::Backend, c10::intrusive_ptr<FrBackend>>(m, "FrBackend")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       const py::object& cpu, const py::object& cuda, const std::string& group_name,
                       const std::vector<int64_t>& global_ranks, int64_t timeout_ms, bool library_handles_failures) {
             auto backend = c10::make_intrusive<FrBackend>(
                 rank, size, optionalBackend(cpu), optionalBackend(cuda), group_name, global_ranks,
                 std::chrono::milliseconds(timeout_ms));
             py::gil_scoped_release no_gil;
             // Before attach: the group's watchdog may see its first op fail as soon as the life runs.
             if (library_handles_failures) {
               Runtime::get().leaveFailuresToLibrary(backend->life(), backend->pgIndex());
             }
             Runtime::get().attach(backend, rootStore(store));
             return backend;
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("cpu_backend"),
           py::arg("cuda_backend"), py::arg("group_name"), py::arg("global_ranks"), py::arg("timeout_ms"),
           py::arg("library_handles_failures") = false)
      .def_property_readonly("cpu_backend", [](const FrBackend& b) -> py::object {
        return b.cpuBackend() ? py::cast(b.cpuBackend()) : py::none();
      })
      .def_property_readonly("cuda_backend", [](const FrBackend& b) -> py::object {
        return b.cudaBackend() ? py::cast(b.cudaBackend()) : py::none();
      })
      // As ProcessGroupNCCL's and ProcessGroupGloo's: torch's own _set_pg_timeout reaches only those
      // before 2.14 (dist.set_timeout reaches every backend from 2.14).
      .def("_set_default_timeout", [](FrBackend& self, std::chrono::milliseconds timeout) { self.setTimeout(timeout); },
           py::arg("timeout"), py::call_guard<py::gil_scoped_release>());

  m.def("dump", [](const std::string& reason) { return Runtime::get().dumpLocal(reason); },
        py::arg("reason"), py::call_guard<py::gil_scoped_release>(),
        "Write this rank's dump now (through the monitor thread); returns its folder.");

  m.def("trace_pickle", [](bool symbolize) {
        std::string pickle;
        {
          py::gil_scoped_release no_gil;
          pickle = tracePickle(symbolize);
        }
        // Python objects are made only with the GIL held.
        return py::bytes(pickle);
      }, py::arg("symbolize") = true);

  m.def("rank_summary", [] {
    // This rank's summary as it would post it now (state "live"; no frames: those need a dump's symbolizing).
    const Config config = Runtime::get().config();
    const Snapshot snapshot = Recorder::get().snapshot(false);
    return buildRankSummary(SummaryInput{&config, &snapshot, nullptr, nullptr, "", "live"});
  }, py::call_guard<py::gil_scoped_release>(),
        "This rank's summary (JSON, at most 2 KB: rank, host, pid, life, per group its last seqs and op in flight).");
  m.def("metrics_snapshot", [] {
    MetricsSnapshot snap;
    {
      py::gil_scoped_release no_gil;
      snap = takeMetricsSnapshot();
    }
    py::list groups;
    for (const GroupMetrics& g : snap.groups) {
      py::dict ops;
      for (size_t kind = 0; kind < kOpKindCount; ++kind) {
        if (g.pg.ops_by_kind[kind] > 0) {
          ops[opName(static_cast<OpKind>(kind))] = g.pg.ops_by_kind[kind];
        }
      }
      py::dict d;
      d["pg_id"] = g.pg.pg_id;
      d["name"] = g.pg.name;
      d["desc"] = g.pg.desc;
      d["backends"] = g.pg.backends;
      d["size"] = g.pg.size;
      d["rank_in_group"] = g.pg.rank_in_group;
      d["last_enqueued_collective"] = g.pg.last_enqueued_collective;
      d["last_started_collective"] = g.pg.last_started_collective;
      d["last_completed_collective"] = g.pg.last_completed_collective;
      d["last_enqueued_p2p"] = g.pg.last_enqueued_p2p;
      d["last_started_p2p"] = g.pg.last_started_p2p;
      d["last_completed_p2p"] = g.pg.last_completed_p2p;
      d["stalled_s"] = g.stalled_s;
      d["ops"] = ops;
      d["wait_median_s"] = g.wait_median_s;
      d["wait_samples"] = g.wait_samples;
      groups.append(d);
    }
    py::dict out;
    out["recording"] = snap.recording;
    out["life"] = snap.life;
    out["groups"] = groups;
    out["watchdog"] = snap.watchdog;
    out["watchdog_max_lag_s"] = snap.watchdog_max_lag_s;
    out["watchdog_mean_lag_s"] = snap.watchdog_mean_lag_s;
    out["watchdog_beat_age_s"] = snap.watchdog_beat_age_s;
    out["incidents"] = snap.tally.incidents;
    out["failure_incidents"] = snap.tally.failure_incidents;
    out["verdict_incident"] = py::bytes(snap.tally.verdict_incident);
    // Bytes: the store's value (any client may have written it) is decoded by the reader, never by the cast.
    out["verdict"] = py::bytes(snap.tally.verdict);
    out["verdict_culprits"] = snap.tally.culprits;
    out["verdict_json"] = py::bytes(snap.tally.json);
    return out;
  }, "What fr_backend.metrics exports: this life's groups (seqs, stall, ops per kind, median wait), the watchdog's "
     "lag, incidents so far and the latest verdict.");
  m.def("_recorder_pg_slots", [] { return Recorder::get().pgSlots(); },
        "How many slots the recorder's group list holds (a test's check that it stays flat over lives).");
  m.def("life_alive", [] { return Runtime::get().watchdog() != nullptr; },
        "Whether a frnccl group of this process is alive (its life's threads run).");
  m.def("date_completions", [](bool on) { g_date_completions.store(on); }, py::arg("on"),
        "Whether every CPU op's returning wait() dates its completion (fr_backend.slow).");
  m.def("collective_waits", [](int64_t completed_after_ns, size_t max_entries, size_t per_group) {
    MetricsView view;
    {
      py::gil_scoped_release no_gil;
      view = Recorder::get().metricsView(max_entries, per_group, completed_after_ns);
    }
    py::list groups;
    for (const PgCounters& g : view.pgs) {
      py::dict ops;
      for (size_t kind = 0; kind < kOpKindCount; ++kind) {
        if (g.ops_by_kind[kind] > 0) {
          ops[opName(static_cast<OpKind>(kind))] = g.ops_by_kind[kind];
        }
      }
      py::dict d;
      d["name"] = g.name;
      d["desc"] = g.desc;
      d["size"] = g.size;
      d["rank_in_group"] = g.rank_in_group;
      d["ops"] = ops;
      d["waits_ns"] = g.waits_ns;
      d["enqueued_ns"] = g.enqueued_ns;
      groups.append(d);
    }
    return py::make_tuple(view.life, groups);
  }, py::arg("completed_after_ns"), py::arg("max_entries"), py::arg("per_group"),
     "(life, groups): this life's groups, each with its ops per kind, and the waits (enqueue to completion, ns, "
     "newest first) and enqueue times (wall ns) of its collectives completed after `completed_after_ns` (wall clock), found among the ring's "
     "newest `max_entries` entries, at most `per_group` of them. For the slow-rank detector (fr_backend.slow).");
  m.def("incident_verdict", [] {
    const auto [incident, verdict] = VerdictBoard::get().incidentAndVerdict();
    return py::make_tuple(incident, verdict);
  }, "(incident id, the verdict's first line) of the latest job-wide incident this process took part in; '' where none.");
  m.def("incident_record", []() -> py::tuple {
    const VerdictBoard::Record r = VerdictBoard::get().record(0);
    if (!r.recent) {
      return py::make_tuple(std::string(), std::string(), std::string(), std::vector<int64_t>{}, int64_t(0), false);
    }
    return py::make_tuple(r.id, r.dir, r.verdict, r.culprits, r.named_stamp_s, r.raised);
  }, "(incident id, its folder, verdict line, ranks it names, the error-file timestamp of a rank it names, whether this "
     "process raised an error of it) of the latest failure incident this process took part in, if its verdict came "
     "within kVerdictRelevantMs; ('', '', '', [], 0, False) otherwise.");
  m.def("_decode_verdict_value", [](const py::bytes& raw, int64_t world_size) {
    // For tests: what a rank takes from a verdict key's value (any store client may have written it).
    std::string line;
    std::vector<int64_t> culprits;
    std::string json;
    decodeVerdictValue(std::string(raw), world_size, line, culprits, json);
    return py::make_tuple(line, culprits, py::bytes(json));
  });
  m.def("_encode_verdict_value", [](const std::string& line, const std::vector<int64_t>& culprits, const std::string& json) {
    return py::bytes(encodeVerdictValue(line, culprits, json));
  });
  m.def("next_verdict", [](const std::string& seen_id, int64_t wait_ms) {
    VerdictBoard::Record r;
    {
      py::gil_scoped_release release; // the monitor that sets it never needs the GIL; the caller's thread waits
      r = VerdictBoard::get().nextVerdict(seen_id, wait_ms);
    }
    return py::make_tuple(r.id, py::bytes(r.json));
  }, "Waits up to wait_ms for the verdict of an incident other than seen_id: (its id, its JSON as bytes); ('', b'') if none.");
  m.def("wake_verdict_waiters", [] { VerdictBoard::get().wakeVerdictWaiters(); },
        "Ends every next_verdict wait in progress at once.");
  m.def("_compute_verdict", [](int64_t world_size, const std::vector<std::optional<std::string>>& summaries,
                               const std::string& incident_id, const std::string& incident_dir) {
    // For tests: the verdict the trigger would print on these summaries (as read from the store).
    VerdictInput in;
    in.world_size = world_size;
    in.incident_id = incident_id;
    in.incident_dir = incident_dir;
    in.summaries = summaries;
    in.wrote = int64_t(std::count_if(summaries.begin(), summaries.end(), [](const auto& s) { return s.has_value(); }));
    Verdict v;
    {
      py::gil_scoped_release no_gil; // as the trigger computes it: without the GIL
      v = computeVerdict(in);
    }
    return py::make_tuple(v.decided, v.kind, v.culprits, v.lines);
  });
  m.def("at_exit", [] { Runtime::get().atExit(); }, py::call_guard<py::gil_scoped_release>());
  m.def("stop_at_exit", [] { Runtime::get().stopAtExit(); }, py::call_guard<py::gil_scoped_release>());
  // On the thread in destroy_process_group, which may have let go of the GIL (torch's binding does).
  Runtime::get().setExceptionInFlightProbe([]() -> bool {
#if PY_VERSION_HEX >= 0x030D0000
    const bool finalizing = Py_IsFinalizing();
#else
    const bool finalizing = _Py_IsFinalizing();
#endif
    if (!Py_IsInitialized() || finalizing || HeartbeatMonitor::pythonFinalizing()) {
      return false; // past at_exit: taking the GIL may end this thread
    }
    py::gil_scoped_acquire gil;
    // Through the C API first, which runs no Python code (so no signal handler either): a teardown with no
    // exception in flight, the usual one, goes no further.
    PyObject* type = nullptr;
    PyObject* value = nullptr;
    PyObject* tb = nullptr;
    PyErr_GetExcInfo(&type, &value, &tb);
    const bool in_flight = value != nullptr && value != Py_None;
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (!in_flight) {
      return false;
    }
    try {
      return py::module_::import("fr_backend._exit_note").attr("note_in_flight")().cast<bool>();
    } catch (const std::exception&) {
      return false; // noting must never keep the teardown from going on
    }
  });
  m.def("note_exit", [](const std::string& type, const std::string& message, const std::string& frame, const std::string& traceback) {
        // After a SIGTERM the exception is the stop's consequence (the launcher ends the survivors of a
        // failure elsewhere): noting it would name this rank for the other's fault.
        if (TermDump::sigtermSeen()) {
          return false;
        }
        noteExit(type, message, frame, traceback);
        return true;
      }, py::arg("type"), py::arg("message"), py::arg("frame"), py::arg("traceback"),
        "Records the uncaught exception this process leaves with; the next dumps carry it (bounded, escaped). "
        "False (nothing noted) once a SIGTERM reached this process.");
  m.def("exit_note", []() -> py::object {
        const std::optional<ExitNote> note = exitNote();
        if (!note) {
          return py::none();
        }
        return py::make_tuple(note->type, note->message, note->frame, note->traceback);
      });
  m.def("clear_exit_note", &clearExitNote, "Forgets the recorded exit note (its exception did not end the program).");
  m.def("exit_incident", [] { return Runtime::get().exitIncident(); },
        "The incident folder this rank's part went to as it left with an uncaught exception; '' if none.");
  m.def("nccl_version", [] { return std::string(ncclVersionString()); });
  m.def("cuda_built", [] { return deviceMarkerFactory() != nullptr; });
  m.def("cuda_parts_skipped", [] { return std::string(cudaPartsSkipped()); });
  m.def("torch_watchdog_settling_built", [] { return innerProgressBuilt(); });
  m.def("_end_event_counts", [] {
    const EndEventCounts c = endEventCounts();
    return py::make_tuple(c.own, c.catch_up, c.by_torch_watchdog);
  });
  m.def("_set_clock_sync_interval_ms", &setClockSyncInterval);
  m.def("_clock_syncs", &clockSyncs);
  m.def("torch_built_version", [] { return std::string(TORCH_VERSION); });
}
