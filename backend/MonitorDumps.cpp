// Writing this rank's dump: the recorder's snapshot, Python stacks (with the
// GIL, bounded, or through faulthandler without it), the files; and the dump a
// SIGTERM or SIGABRT asks for before the process ends.
#include "HeartbeatMonitor.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "Clock.hpp"
#include "DeviceMarker.hpp"
#include "ErrorText.hpp"
#include "GilWait.hpp"
#include "MonitorDetail.hpp"
#include "RankSummary.hpp"
#include "Recorder.hpp"
#include "Verdict.hpp"

namespace frnccl {

using namespace monitor_detail;

namespace {

// Python stacks of every thread, written by faulthandler from its own signal
// handler: no GIL needed, so a main thread stuck holding it still shows up.
std::string captureThreadStacks(const Config& config) {
  if (config.stacks_signal <= 0 || config.stacks_fd < 0 || g_python_finalizing.load()) {
    return "";
  }
  struct sigaction current {};
  if (sigaction(config.stacks_signal, nullptr, &current) != 0 ||
      current.sa_handler == SIG_DFL || current.sa_handler == SIG_IGN) {
    return ""; // faulthandler is gone; the default action would kill us
  }
  // One capture at a time: a GIL helper left behind (viewWithGil) may still
  // capture while the monitor falls back to capturing without the GIL, and
  // both go through the one file.
  static std::mutex capture_mutex;
  std::lock_guard<std::mutex> capture_lock(capture_mutex);
  if (ftruncate(config.stacks_fd, 0) != 0 || lseek(config.stacks_fd, 0, SEEK_SET) != 0) {
    return "";
  }
  // The handler runs on this thread before pthread_kill returns.
  pthread_kill(pthread_self(), config.stacks_signal);
  std::string out;
  char buf[65536];
  off_t offset = 0;
  while (true) {
    ssize_t n = pread(config.stacks_fd, buf, sizeof(buf), offset);
    if (n <= 0) {
      break;
    }
    out.append(buf, size_t(n));
    offset += n;
  }
  return out;
}

// What a dump needs from the interpreter: names for the captured frames and
// every thread's stack.
struct PythonView {
  SymbolizedStacks frames;
  bool have_frames = false;
  std::string thread_stacks;
};

struct GilJob {
  std::vector<std::shared_ptr<CallerStack>> stacks;
  PythonView view;
  std::atomic<bool> abandoned{false};
  GilWaitJob wait;
};

// Takes the GIL on a helper thread, bounded by `timeout_ms` (less while a
// signal that ends the process is served: GilWait.hpp): with the GIL held
// every other Python thread is parked, so faulthandler reads frames that do
// not change under it, and frames can be symbolized. If the GIL does not come
// in time (a thread holds it inside a C call), the caller falls back to
// faulthandler without the GIL; the helper, left behind, releases the stacks
// whenever it gets the GIL and does nothing else.
bool viewWithGil(
    const Config& config,
    std::vector<std::shared_ptr<CallerStack>> stacks,
    bool symbolize,
    int64_t timeout_ms,
    PythonView& out) {
  auto job = std::make_shared<GilJob>();
  job->stacks = std::move(stacks);
  std::thread([job, symbolize, config] {
    pthread_setname_np(pthread_self(), "frnccl-gil");
    try {
      runWithGil([&] {
        if (job->abandoned.load()) {
          return;
        }
        if (symbolize && !job->stacks.empty()) {
          job->view.frames = symbolizeStacks(job->stacks);
          job->view.have_frames = job->view.frames.size() == job->stacks.size();
        }
        if (job->abandoned.load()) {
          return; // symbolizing outlasted the wait: the monitor captured the stacks itself
        }
        job->view.thread_stacks = captureThreadStacks(config);
      });
    } catch (const std::exception&) {
      job->view = PythonView{}; // only std exceptions: a forced unwind must pass
    }
    job->wait.finish();
    releaseStacks(job->stacks);
  }).detach();
  if (!job->wait.wait(timeout_ms)) {
    job->abandoned.store(true);
    return false;
  }
  out = std::move(job->view);
  return true;
}


} // namespace

std::string HeartbeatMonitor::dumpBeforeEnd(const std::string& reason, const std::string& what, bool open_incident, bool* opened_out) {
  // This rank's part of the incident in progress, or of a recent failure, written or being written: "" if none.
  auto writtenPart = [this]() -> std::string {
    const int64_t now = monoNs();
    std::lock_guard<std::mutex> lock(mutex_);
    if (!current_incident_.empty() && now < current_incident_deadline_mono_ns_ &&
        dumped_incidents_.count(current_incident_) != 0) {
      return current_incident_;
    }
    if (!last_failure_incident_.empty() &&
        now - last_failure_written_mono_ns_ <=
            std::max<int64_t>(2 * config_.dump_timeout_ms, kFailureAftermathMs) * 1000000LL) {
      // The failure is what the job is being stopped for, and its dump holds
      // this rank's state; a second, later incident would hide it from the
      // analyzer, which reads the latest.
      return last_failure_incident_;
    }
    return "";
  };
  auto leaveIt = [&](const std::string& written) {
    logLine(config_, "%s; not dumping again: this rank's part of incident %s is written or being written", what.c_str(), written.c_str());
    awaitOwnPart(written);
    return written;
  };
  if (stopping()) {
    return "";
  }
  std::string written = writtenPart();
  if (!written.empty()) {
    return leaveIt(written);
  }
  DumpRequest active;
  bool join = incidentInProgress(active);
  if (!join && !open_incident && storeUsable()) {
    // A launcher's SIGTERM follows a peer's death by its monitor interval (torchrun: up to 100 ms), and may
    // come before the survivors' failure has opened its incident (tens of ms after the death): one more look.
    std::this_thread::sleep_for(std::chrono::milliseconds(kIncidentAfterSigtermMs));
    written = writtenPart();
    if (!written.empty()) {
      return leaveIt(written);
    }
    join = incidentInProgress(active);
  }
  DumpRequest dump;
  dump.reason = reason;
  dump.symbolize = false; // the GIL may be held by the very thread the signal stopped
  dump.trigger_rank = config_.rank;
  dump.detail = what;
  bool opened = false;
  if (!join && open_incident && storeUsable()) {
    // Nobody else knows yet: ask every rank to dump, as the incident's trigger. This rank will not wait for
    // them, but each writes its part when it reads the request, or when its own op fails on this rank's end.
    dump.incident_id = newIncidentId(reason, config_.rank, config_.job_tag);
    try {
      const std::string mine = dump.incident_id + "|" + std::to_string(wallNs());
      if (acquireActive(mine, "") == mine) {
        store_->set(requestKey(store_->add(kSeqKey, 1)), bytes(encodeRequest(dump)));
        wakeAllRanks(dump.incident_id);
        opened = true;
        logLine(config_, "%s; asking all %lld ranks to dump (incident %s)", what.c_str(), static_cast<long long>(config_.world_size), dump.incident_id.c_str());
      } else {
        join = incidentInProgress(active); // another rank opened one just now
      }
    } catch (const std::exception& e) {
      noteStoreFailure(e);
    }
  }
  if (join) {
    // Usually a peer's failure, whose request this rank had not read yet: its
    // part goes with the others', and the trigger counts it.
    dump.incident_id = active.incident_id;
    dump.trigger_rank = active.trigger_rank;
    dump.detail = what + ", before the request of incident " + active.incident_id + " (" + active.reason + ": " +
        active.detail + ") reached this rank";
  } else if (!opened) {
    dump.incident_id = newIncidentId(reason, config_.rank, config_.job_tag);
  }
  if (join || opened) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!dumped_incidents_.insert(dump.incident_id).second) {
      lock.unlock();
      awaitOwnPart(dump.incident_id); // the monitor has just begun to write it
      return dump.incident_id;
    }
  }
  logLine(config_, "%s; writing this rank's dump (incident %s) before %s", what.c_str(), dump.incident_id.c_str(),
          reason == "exception" ? "the process ends" : "the signal takes effect");
  if (!writeOwnDump(dump).empty() && (join || opened)) {
    announceWritten(dump.incident_id);
  }
  if (opened_out != nullptr) {
    *opened_out = opened;
  }
  return dump.incident_id;
}

std::string HeartbeatMonitor::leaveWithException(const std::string& what, int64_t deadline_mono_ns) {
  if (config_.world_size <= 1) {
    return ""; // no peer waits for it
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!queue_.empty() || !joined_.empty() || busy_) {
      // A failure of this rank's own (an op timed out or failed) is being
      // dumped: the exception follows from it, and the leave path lets that
      // dump finish under its own reason.
      return "";
    }
  }
  const int64_t start = monoNs();
  bool opened = false;
  // Its peers will wait for it in their next collective: the incident it opens
  // holds their state and its exception at once, instead of a hang later with
  // this rank's dump missing. A rank whose part of a failure is written (its
  // own op failed: the exception is that failure's) adds nothing.
  const std::string id = dumpBeforeEnd("exception", what, true, &opened);
  if (opened) {
    // As any trigger: the others write within the dump deadline, and under
    // torchrun this exit stops them all.
    noteIncident(id, isFailure("exception"));
    awaitAllRanks(id, start, true, std::max<int64_t>(0, (deadline_mono_ns - start) / 1000000));
  }
  return id;
}

std::string HeartbeatMonitor::lastIncident() {
  std::lock_guard<std::mutex> lock(mutex_);
  return current_incident_.empty() ? last_failure_incident_ : current_incident_;
}

void HeartbeatMonitor::awaitOwnPart(const std::string& incident_id) {
  // The signal handler passes the signal on once this returns (or its own bound passes): a part the monitor
  // is writing is let finish rather than cut short.
  std::unique_lock<std::mutex> lock(mutex_);
  written_cv_.wait_for(lock, std::chrono::milliseconds(config_.terminate_dump_ms), [&] {
    return stopping_ || written_parts_.count(incident_id) != 0;
  });
}

std::string HeartbeatMonitor::writeOwnDump(const DumpRequest& request, const WrittenFn& written) {
  std::string dir = writeDumpFiles(request, written);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    written_parts_.insert(request.incident_id);
  }
  written_cv_.notify_all();
  return dir;
}

std::string HeartbeatMonitor::writeDumpFiles(const DumpRequest& request, const WrittenFn& written) {
  const int64_t t0 = monoNs();
  // A stopped watchdog (teardown) answers at once: only a wait that ran out says anything.
  if (await_fresh_poll_ && !watchdog_stuck_ && !await_fresh_poll_(kFreshPollWaitMs) &&
      monoNs() - t0 >= kFreshPollWaitMs * 1000000LL) {
    logLine(config_, "watchdog did not poll within %lld ms: the dump shows its last poll's view", static_cast<long long>(kFreshPollWaitMs));
  }
  Recorder& recorder = Recorder::get();
  const bool want_frames = request.symbolize && config_.stacks != StackMode::kNone &&
      config_.symbolize_timeout_ms > 0 && !g_python_finalizing.load();
  Snapshot snapshot = recorder.snapshot(want_frames);
  PythonView view;
  const int64_t gil_wait_ms = want_frames ? config_.symbolize_timeout_ms : kThreadStacksGilWaitMs;
  const bool got_gil = !g_python_finalizing.load() &&
      viewWithGil(config_, std::move(snapshot.stacks), want_frames, gil_wait_ms, view);
  snapshot.stacks.clear();
  if (!got_gil) {
    if (want_frames) {
      logLine(config_, "GIL not available within %lld ms, or a signal that ends the process came first: writing the dump without symbolized stacks", static_cast<long long>(gil_wait_ms));
    }
    // The thread holding the GIL is stuck in a C call, so its frames hold still.
    view.thread_stacks = captureThreadStacks(config_);
  }
  const bool symbolized = view.have_frames;
  const SymbolizedStacks& frames = view.frames;
  const std::string& thread_stacks = view.thread_stacks;
  const int64_t t_stacks = monoNs();
  try {
    // A verdict only for a failure incident (one this rank joined may have been asked for with another reason).
    if (isFailure(request.reason) || VerdictBoard::get().awaitedIncident() == request.incident_id) {
      postSummary(request.incident_id, SummaryInput{&config_, &snapshot, symbolized ? &frames : nullptr, &thread_stacks,
                                                    request.incident_id, "wrote"});
    }
    DumpValue dump = DumpWriter::build(
        config_, request, snapshot, symbolized ? &frames : nullptr, thread_stacks,
        ncclVersionString(), watchdog_health_ ? watchdog_health_() : WatchdogHealth{});
    const int64_t t_built = monoNs();
    std::string dir = DumpWriter::write(config_, request.incident_id, dump);
    const int64_t t_written = monoNs();
    auto ms = [](int64_t from, int64_t to) { return double(to - from) / 1e6; };
    if (isFailure(request.reason)) {
      std::lock_guard<std::mutex> lock(mutex_);
      last_failure_incident_ = request.incident_id;
      last_failure_written_mono_ns_ = t_written;
      if (request.reason == "exception" && request.trigger_rank >= 0 && request.trigger_rank != config_.rank &&
          request.trigger_rank < config_.world_size) {
        left_with_exception_.emplace(request.trigger_rank, request.incident_id);
      }
    }
    // The breakdown says where a slow dump spent its time: the snapshot and
    // stacks (GIL waits), building the tree, or encoding and writing files.
    logLine(config_, "wrote dump %s (%zu entries, reason %s) to %s in %.0f ms (snapshot+stacks %.0f, build %.0f, encode+write %.0f)", request.incident_id.c_str(), snapshot.entries.size(), printable(request.reason).c_str(), dir.c_str(), ms(t0, t_written), ms(t0, t_stacks), ms(t_stacks, t_built), ms(t_built, t_written));
    if (written) {
      written(dir); // a caller waiting on the files goes on while the tree is freed
    }
    return dir;
  } catch (const std::exception& e) {
    logLine(config_, "dump %s NOT written: %s", request.incident_id.c_str(), oneLineErrorText(e).c_str());
    return "";
  }
}

} // namespace frnccl
