#include "Runtime.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

#include "Clock.hpp"
#include "ElasticErrorFile.hpp"
#include "ExitNote.hpp"
#include "FrBackend.hpp"
#include "GilWait.hpp"
#include "Gzip.hpp"
#include "IncidentId.hpp"
#include "SignalChain.hpp"
#include "TermDump.hpp"
#include "Verdict.hpp"

namespace frnccl {

namespace {

// At exit and when the last group goes, how long finished Works may wait for
// their inner backend's worker threads to let go of them
// (Watchdog::releaseFinished): usually microseconds.
constexpr int64_t kWorkSettleMs = 100;
// A rank leaving with an exception: the least time its leave (the store learns it left) gets, whatever is
// left of FRNCCL_DUMP_ON_EXCEPTION_MS.
constexpr int64_t kExitLeaveMinMs = 500;
// At exit, how long to wait for the watchdog's last pass (well under a
// millisecond when it is healthy).
constexpr int64_t kExitPollWaitMs = 1000;
// What the steps of leaving take beyond their own waits (writing this rank's dump, a loaded machine): the
// slack in the bound of their helper thread (runLeavingSteps).
constexpr int64_t kLeavingSlackMs = 2000;

// The bound of finishBeforeLeaving(watchdog, monitor, wait_ms, dump_timeout_ms) while the store answers.
int64_t leavingBoundMs(int64_t wait_ms, int64_t dump_timeout_ms) {
  return kExitPollWaitMs + kWorkSettleMs + wait_ms + dump_timeout_ms + kLeavingSlackMs;
}

// The bound of leaveWithNote while the store answers: a fresh pass, the incident until FRNCCL_DUMP_ON_EXCEPTION_MS
// is out, then finishBeforeLeaving with at least kExitLeaveMinMs for each of its waits.
int64_t leavingWithNoteBoundMs(const Config& config) {
  return kExitPollWaitMs + config.exception_exit_ms + leavingBoundMs(kExitLeaveMinMs, kExitLeaveMinMs);
}

// Set by afterForkInChild, in the child only.
std::atomic<bool> g_forked_child{false};
std::atomic<bool> g_forked_child_told{false};
std::atomic<int64_t> g_forked_from_pid{0};
// What the fork handler may touch: set once the instance exists.
std::atomic<Runtime*> g_instance{nullptr};

// The dump signal's line where no frnccl group is alive (nothing to dump): made once, when the handler is
// installed, since the handler may only write() it.
char g_no_group_line[320] = {0};
size_t g_no_group_line_len = 0;

void onDumpSignal(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  if (!HeartbeatMonitor::noteSignal() && SignalChain::previousIsDefault(sig)) {
    // Only where frnccl changed the outcome: without it the signal would have ended the process.
    const ssize_t ignored = write(STDERR_FILENO, g_no_group_line, g_no_group_line_len);
    (void)ignored;
  }
  errno = saved_errno;
  // Keep whatever handler was there before us, or was installed after us, working. Its default action
  // (for SIGUSR1: end the process) is not taken: this signal asks frnccl for a dump.
  SignalChain::passOn(sig, info, context, /*dfl_raises=*/false);
}

// Threads inherit the signal mask of the thread that creates them. frnccl's
// threads are created with SIGTERM blocked, so the kernel hands a SIGTERM sent
// to the process to a thread of the program: a handler that waits for the
// dump must not run on the monitor (which may be writing it) or the watchdog
// (whose next pass the dump waits for).
class SigtermBlockedForNewThreads {
 public:
  SigtermBlockedForNewThreads() {
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &term, &previous_);
  }
  ~SigtermBlockedForNewThreads() {
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  SigtermBlockedForNewThreads(const SigtermBlockedForNewThreads&) = delete;
  SigtermBlockedForNewThreads& operator=(const SigtermBlockedForNewThreads&) = delete;

 private:
  sigset_t previous_{};
};

std::string describeSender(pid_t sender) {
  if (sender <= 0) {
    return "SIGTERM";
  }
  std::string text = "SIGTERM from pid " + std::to_string(sender);
  if (sender == getppid()) {
    text += " (this process's parent: its launcher)";
  } else if (sender == getpid()) {
    text += " (this process)";
  }
  return text;
}

// The incident a teardown's helper left with, read by the thread that waited for it (or gave up on it).
class LeftIncident {
 public:
  // True when `id` names one.
  bool set(std::string id) {
    std::lock_guard<std::mutex> lock(mutex_);
    id_ = std::move(id);
    return !id_.empty();
  }
  std::string get() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return id_;
  }

 private:
  mutable std::mutex mutex_;
  std::string id_;
};


// Runs `steps` (what a rank does with the store and its peers as it leaves) on a thread of its own, and waits
// for it at most `bound_ms`. Every store call in them may block for ever where the store's host is alive but
// does not answer (a frozen process, a host cut off: TCPStore's calls other than wait() have no timeout, and
// a call queues behind another thread's on the same connection), and the caller is the program's thread at
// exit or in destroy_process_group. A helper that outlives the bound is left behind, with what it uses (the
// lambda owns its references): false, and one log line saying so.
bool runLeavingSteps(const char* what, int64_t rank, int64_t bound_ms, std::function<void()> steps) {
  std::unique_ptr<BoundedThread> helper;
  {
    SigtermBlockedForNewThreads sigterm_blocked; // as every frnccl thread: SIGTERM goes to the program's
    try {
      helper = std::make_unique<BoundedThread>("frnccl-leave", std::move(steps));
    } catch (const std::system_error&) {
      return false; // no thread to be had: leave without those steps rather than risk waiting for ever
    }
  }
  if (helper->join(bound_ms)) {
    return true;
  }
  std::fprintf(stderr, "[frnccl rank %lld] %s: the steps of leaving (store, peers) did not finish within %lld ms; leaving without them\n",
               static_cast<long long>(rank), what, static_cast<long long>(bound_ms));
  std::fflush(stderr);
  return false;
}

} // namespace

Runtime& Runtime::get() {
  // Deliberately leaked: its threads may outlive static destruction at exit.
  static Runtime* instance = [] {
    auto* runtime = new Runtime();
    g_instance.store(runtime);
    pthread_atfork(nullptr, nullptr, &Runtime::afterForkInChild);
    return runtime;
  }();
  return *instance;
}

void Runtime::afterForkInChild() {
  // Runs in the child right after fork(), which copied the parent's memory
  // but none of its threads: no lock may be taken here (a thread that held
  // one is gone), only atomics touched.
  HeartbeatMonitor::forgetMonitorsAfterFork(); // none of the parent's monitor threads runs here
  Runtime* runtime = g_instance.load();
  if (runtime == nullptr || runtime->watchdog_fast_.load() == nullptr) {
    return; // no frnccl thread ran in the parent: the child may start its own
  }
  g_forked_from_pid.store(static_cast<int64_t>(getppid()));
  g_forked_child.store(true);
  // Ops of the child are not tracked: no thread would ever poll them.
  runtime->watchdog_fast_.store(nullptr);
}

bool Runtime::inForkedChild() {
  return g_forked_child.load(std::memory_order_relaxed);
}

std::string Runtime::forkedChildText() {
  return "frnccl: this process (pid " + std::to_string(getpid()) + ") was forked from pid " +
      std::to_string(g_forked_from_pid.load()) +
      " after frnccl's threads started there, and threads do not survive fork(): frnccl records no timeouts and "
      "writes no dumps in this process (dump from the parent, or start child processes with spawn)";
}

bool Runtime::configure(const Config& config) {
  if (inForkedChild()) {
    return false; // fork() may have copied mutex_ locked; the child's groups run untracked
  }
  bool idle_threads = false;
  // Released only once mutex_ is: the last weak reference to a group let go without a shutdown runs
  // ~FrBackend, which detaches under mutex_ (a self-deadlock if it ran here under the lock).
  std::vector<c10::weak_intrusive_ptr<FrBackend>> expired;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto gone = std::stable_partition(live_.begin(), live_.end(), [](const auto& weak) { return !weak.expired(); });
    expired.assign(std::make_move_iterator(gone), std::make_move_iterator(live_.end()));
    live_.erase(gone, live_.end());
    if (!live_.empty()) {
      return false; // a group of this life is alive: the new one joins it
    }
    idle_threads = watchdog_ != nullptr;
  }
  if (idle_threads) {
    // The last life's groups went without a teardown: its threads, still idle,
    // would dump and log under its rank.
    stopThreads();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (!live_.empty() || watchdog_) {
    return false; // another thread began this life meanwhile
  }
  if (configured_) {
    ++life_;
    life_fast_.store(life_, std::memory_order_release);
    Recorder::get().startLife(life_);
    for (auto it = library_failure_pgs_.begin(); it != library_failure_pgs_.end();) {
      it = it->first < life_ ? library_failure_pgs_.erase(it) : std::next(it); // C++17 for the native build
    }
    // An exception noted as the last life's groups were torn down was caught after all: the process goes on.
    clearExitNote();
    exit_incident_.clear();
  }
  config_ = std::make_shared<const Config>(config);
  configured_ = true;
  const char* hold = std::getenv("FRNCCL_TEST_HOLD_ABORT");
  test_abort_hold_ = hold != nullptr ? hold : "";
  Recorder::get().configure(
      config.buffer_size,
      config.stacks == StackMode::kPython ? CaptureMode::kPython
          : config.stacks == StackMode::kCpp ? CaptureMode::kCpp
                                            : CaptureMode::kNone);
  if (config.write_compact) {
    // libz is loaded now rather than at the first dump, which may be one written
    // while the process takes SIGTERM or SIGABRT (TermDump.cpp).
    Gzip::system();
  }
  return true;
}

bool Runtime::configured() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return configured_;
}

Config Runtime::config() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return *config_;
}

std::shared_ptr<const Config> Runtime::lifeConfig() const {
  if (inForkedChild()) {
    // fork() may have copied mutex_ locked, and no other thread of ours runs here to change config_.
    return config_;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  return config_;
}

std::shared_ptr<HeartbeatMonitor> Runtime::monitorOf(int64_t life) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return life < 0 || life == life_ ? monitor_ : nullptr;
}

void Runtime::installDumpSignal(int signal_number, int64_t rank) {
  // Once per process: the first life with a dump signal (or FRNCCL_ENABLE, before any group) installs the
  // handler, which stays.
  std::lock_guard<std::mutex> lock(signal_mutex_);
  if (signal_installed_ || signal_number <= 0) {
    return;
  }
  const char* name = strsignal(signal_number); // here, not in the handler: it is not async-signal-safe
  const int n = std::snprintf(g_no_group_line, sizeof(g_no_group_line),
                              "frnccl: signal %d (%s, FRNCCL_DUMP_SIGNAL) reached a process with no frnccl group "
                              "alive: nothing to dump; frnccl kept it from ending the process\n", signal_number, name != nullptr ? name : "?");
  g_no_group_line_len = n > 0 ? std::min(static_cast<size_t>(n), sizeof(g_no_group_line) - 1) : 0;
  if (!SignalChain::install(signal_number, &onDumpSignal)) {
    // The signal keeps its previous action (for most signals: end the process).
    const int error = errno;
    std::fprintf(stderr, "[frnccl rank %lld] cannot handle FRNCCL_DUMP_SIGNAL=%d (sigaction: %s); this rank does not dump on that signal\n",
                 static_cast<long long>(rank), signal_number, std::strerror(error));
    std::fflush(stderr);
    return;
  }
  signal_installed_ = true;
}

namespace {

// FRNCCL_TEST_HOLD_ABORT=PATH (read by configure, not on the monitor thread): the tests' way to hold a
// timeout's abort open between its life check and the abort itself, where a teardown and a new life can come
// in between: PATH.held is made there, and the abort waits (up to 60 s) for PATH.go, then makes PATH.done once
// it has aborted (not under FRNCCL_ON_TIMEOUT=exit, which ends the process first).
class TestAbortHold {
 public:
  explicit TestAbortHold(std::string path) : path_(std::move(path)) {
    if (path_.empty()) {
      return;
    }
    touch(".held");
    const int64_t until = monoNs() + 60'000'000'000LL;
    while (access((path_ + ".go").c_str(), F_OK) != 0 && monoNs() < until) {
      usleep(20'000);
    }
  }
  ~TestAbortHold() {
    if (!path_.empty()) {
      touch(".done");
    }
  }
  TestAbortHold(const TestAbortHold&) = delete;
  TestAbortHold& operator=(const TestAbortHold&) = delete;

 private:
  void touch(const char* suffix) const {
    if (FILE* f = std::fopen((path_ + suffix).c_str(), "w")) {
      std::fclose(f);
    }
  }
  std::string path_;
};

// torchrun's summary shows a worker that died of a signal as "Signal 6 (SIGABRT)
// received by PID p": the error file says which rank that was, why, and where
// its incident's dumps are.
void reportAbortToElastic(const Config& config, const std::string& path, const std::string& incident_id,
                          const std::string& earlier_incident, const std::string& earlier_verdict) {
  const std::string who = "rank " + std::to_string(config.rank) + " (host " + config.hostname + ", pid " + std::to_string(getpid()) + ")";
  std::string lines;
  std::string message = "SIGABRT: " + who + " aborted";
  if (!earlier_incident.empty()) {
    // The abort follows a failure this rank took part in (an inner backend aborting on its error): the
    // failure's verdict is why, the abort only how the process ended.
    if (!earlier_verdict.empty()) {
      lines = earlier_verdict + "\n";
    }
    lines += "frnccl: " + who + " aborted (SIGABRT) after incident " + earlier_incident;
    message += " after incident " + earlier_incident;
  } else {
    lines = "frnccl: " + who + " aborted (SIGABRT: an uncaught C++ exception or a failed check; its message is on the rank's stderr)";
  }
  if (!incident_id.empty()) {
    const std::string folder = config.dump_dir + "/" + incident_id;
    lines += "\nfrnccl: its dump and the other ranks' are in " + folder + ": frnccl analyze " + folder;
  }
  // After a failure this rank took part in, the abort is its consequence: stamped as a victim's (a second past
  // now) unless the verdict names this rank (fr_backend/_elastic_error.py).
  int64_t stamp = wallNs() / 1000000000LL;
  if (!earlier_incident.empty()) {
    const VerdictBoard::Record r = VerdictBoard::get().record(0);
    const bool named = r.recent && std::find(r.culprits.begin(), r.culprits.end(), config.rank) != r.culprits.end();
    stamp = named ? r.named_stamp_s : stamp + 1;
  }
  std::string why;
  if (!writeElasticErrorFile(path, message, lines, stamp, why) && !why.empty()) {
    std::fprintf(stderr, "[frnccl rank %lld] TORCHELASTIC_ERROR_FILE=%s: cannot add why this rank aborted (%s); torchrun's summary will not show it\n",
                 static_cast<long long>(config.rank), printable(path).c_str(), why.c_str());
    std::fflush(stderr);
  }
}

// How long a SIGTERM after a failure waits for that failure's verdict (the monitor fetches it; never past its
// deadline) before the error file is written without one: within the bound the signal's dump already has.
constexpr int64_t kStopVerdictWaitMs = 1000;

// torchrun stops the survivors of a failure with SIGTERM, and its summary's root cause is the failure with the
// earliest whole-second timestamp, which, for a process that wrote no error file, is when torchrun saw it end:
// after the victims that raised. A rank the verdict names writes the second before it took part in the incident
// (before any victim raised: they raise with the verdict), so the root cause is that rank whatever the timing; any other
// rank writes a second past now, as a victim's file does (fr_backend/_exit_note.py). A SIGTERM with no failure
// before it writes nothing: torchrun reports the signal as it would.
void reportStopToElastic(const Config& config, const std::string& path, int64_t wait_ms) {
  const VerdictBoard::Record r = VerdictBoard::get().record(wait_ms);
  if (!r.recent) {
    return;
  }
  const bool named = std::find(r.culprits.begin(), r.culprits.end(), config.rank) != r.culprits.end();
  const std::string who = "rank " + std::to_string(config.rank) + " (host " + config.hostname + ", pid " + std::to_string(getpid()) + ")";
  const std::string lines = r.verdict + "\nfrnccl: " + who + " was stopped by SIGTERM after incident " + r.id +
                            (named ? ", whose verdict names it" : "") + "\nfrnccl: its dump and the other ranks' are in " +
                            r.dir + ": frnccl analyze " + r.dir;
  const int64_t stamp = named ? r.named_stamp_s : wallNs() / 1000000000LL + 1;
  std::string why;
  if (!writeElasticErrorFile(path, "SIGTERM: " + who + " was stopped after incident " + r.id, lines, stamp, why) && !why.empty()) {
    std::fprintf(stderr, "[frnccl rank %lld] TORCHELASTIC_ERROR_FILE=%s: cannot add why this rank was stopped (%s); torchrun's summary will not show it\n",
                 static_cast<long long>(config.rank), printable(path).c_str(), why.c_str());
    std::fflush(stderr);
  }
}

} // namespace

void Runtime::installTermDump(const Config& config) {
  if (config.terminate_dump_ms <= 0) {
    return;
  }
  // Installed by the first life that asks (TermDump::install is once per process). The frnccl-term thread
  // calls this; stopThreads frees a monitor only once that thread was joined, else leaves it behind.
  // Read once, here: the frnccl-term thread does not read the environment.
  const char* error_file_env = std::getenv("TORCHELASTIC_ERROR_FILE");
  const std::string error_file = error_file_env != nullptr ? error_file_env : "";
  const bool installed = TermDump::install(config.terminate_dump_ms, [this, error_file](int sig, pid_t sender) {
    HeartbeatMonitor* monitor = monitor_fast_.load(std::memory_order_acquire);
    if (monitor == nullptr) {
      return;
    }
    // A dump in flight that waits for the GIL (held, maybe, by the very thread
    // the signal stopped) would outlast the signal's bound and be lost with the
    // process: it is written unsymbolized instead.
    GilWaitCut cut;
    if (sig == SIGABRT) {
      // Nobody else may know yet: the aborting rank asks the job to dump.
      const std::string earlier = VerdictBoard::get().incident();
      const std::string id = monitor->dumpBeforeEnd("abort", "SIGABRT: the process is aborting (an uncaught C++ exception or a failed check; its message is on stderr just before this line)", true);
      if (!error_file.empty()) {
        reportAbortToElastic(monitor->config(), error_file, id, earlier, earlier.empty() ? "" : VerdictBoard::get().verdict());
      }
    } else {
      // A verdict already here is written before the dump, which may use up the signal's bound.
      const bool verdict_here = !error_file.empty() && VerdictBoard::get().record(0).recent;
      if (verdict_here) {
        reportStopToElastic(monitor->config(), error_file, 0);
      }
      monitor->dumpBeforeEnd("sigterm", describeSender(sender), false);
      if (!error_file.empty() && !verdict_here) {
        reportStopToElastic(monitor->config(), error_file, kStopVerdictWaitMs);
      }
    }
  });
  if (installed) {
    TermDump::start();
  }
}

void Runtime::attach(const c10::intrusive_ptr<FrBackend>& backend, const c10::intrusive_ptr<c10d::Store>& root_store) {
  if (inForkedChild()) {
    // Checked before mutex_: fork() may have copied it locked. The group
    // forwards its ops as usual; only frnccl's own work is off.
    if (!g_forked_child_told.exchange(true)) {
      std::fprintf(stderr, "%s\n", forkedChildText().c_str());
      std::fflush(stderr);
    }
    return;
  }
  std::shared_ptr<HeartbeatMonitor> first_monitor; // of a new life, when the last one kept a lock to let go of
  std::string kept_lock;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(configured_, "frnccl: internal error: backend created before configuration");
    live_.emplace_back(backend);
    if (watchdog_) {
      return;
    }
    const Config& config = *config_;
    SigtermBlockedForNewThreads sigterm_blocked; // for the watchdog's and the monitor's threads
    watchdog_ = std::make_unique<Watchdog>(
        config.watchdog_poll_ms, [this, life = life_](const Incident& incident) { onIncident(incident, life); });
    c10::intrusive_ptr<c10d::Store> store;
    if (root_store) {
      try {
        // A connection of our own: our polling never queues behind, or
        // breaks, the training job's use of the store.
        store = root_store->clone();
        store->setTimeout(std::chrono::milliseconds(10000));
      } catch (const std::exception&) {
        store = root_store;
      }
    }
    Watchdog* wd = watchdog_.get();
    watchdog_fast_.store(wd);
    monitor_ = std::make_shared<HeartbeatMonitor>(
        config, store, [wd] { return wd->health(); }, [wd] { return wd->heartbeat(); },
        [wd](int64_t timeout_ms) { return wd->awaitFreshPoll(timeout_ms); });
    monitor_fast_.store(monitor_.get());
    installDumpSignal(static_cast<int>(config.dump_signal), config.rank);
    installTermDump(config);
    if (!lock_kept_by_teardown_.empty()) {
      kept_lock.swap(lock_kept_by_teardown_);
      first_monitor = monitor_;
    }
  }
  if (first_monitor) {
    // The process went on after the teardown that left with an exception (an in-process restart): the lock
    // that incident kept, for the peers' failures to join, would make this life's incidents join it too.
    first_monitor->releaseActive(kept_lock);
  }
}

bool Runtime::detach(const FrBackend* backend, Leaving how) {
  if (inForkedChild()) {
    return false; // no thread here to stop or wait for; mutex_ may have been copied locked
  }
  // Dropped only once mutex_ is released: if another thread let go of a group
  // meanwhile, ours may be its last reference, and ~FrBackend comes back here.
  std::vector<c10::intrusive_ptr<FrBackend>> others;
  Watchdog* watchdog = nullptr;
  std::shared_ptr<HeartbeatMonitor> monitor;
  std::shared_ptr<const Config> config;
  bool last = false;
  int64_t life = 0;
  // live_'s old entries, released once mutex_ is (see configure: an expired one may run ~FrBackend).
  std::vector<c10::weak_intrusive_ptr<FrBackend>> left;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    life = life_;
    std::vector<c10::weak_intrusive_ptr<FrBackend>> still;
    for (auto& weak : live_) {
      auto strong = weak.lock();
      if (strong && strong.get() != backend) {
        still.push_back(weak);
        others.push_back(std::move(strong));
      }
    }
    live_.swap(still);
    left = std::move(still);
    watchdog = watchdog_.get();
    last = live_.empty() && watchdog_ && how != Leaving::kDropped;
    monitor = monitor_;
    config = config_;
  }
  if (how == Leaving::kShutdown && watchdog != nullptr) {
    // The caller may have just seen one of this group's ops fail or time out
    // (a training loop that catches the error and tears down at once) before
    // any pass reported it: the pass taken here, while the inner backends
    // still stand, turns it into an incident that the steps below let finish.
    watchdog->awaitFreshPoll(kExitPollWaitMs);
  }
  if (!last) {
    return false;
  }
  if (how == Leaving::kShutdown && monitor) {
    const ExceptionInFlightProbe probe = exception_probe_.load();
    // The exception the caller is propagating, if it is this rank's own (asked here: the probe takes the GIL).
    const std::optional<ExitNote> note = probe != nullptr && probe() ? exitNote() : std::nullopt;
    // Each step below is bounded as long as the store answers; the helper's bound is their sum.
    const int64_t bound_ms = note ? leavingWithNoteBoundMs(*config) + leavingBoundMs(config->dump_timeout_ms, config->dump_timeout_ms)
                                  : leavingBoundMs(config->dump_timeout_ms, config->dump_timeout_ms) + (config->dump_on_teardown ? config->dump_timeout_ms : 0);
    auto kept = std::make_shared<LeftIncident>();
    runLeavingSteps("destroy_process_group", config->rank, bound_ms, [this, monitor, config, life, note, kept] {
      if (note) {
        if (!kept->set(leaveWithNote(nullptr, monitor.get(), *config, life, *note, "tore down its groups while raising ",
                                     monoNs() + config->exception_exit_ms * 1000000LL))) {
          return;
        }
      }
      if (config->dump_on_teardown) {
        try {
          monitor->dumpLocal("teardown", config->dump_timeout_ms);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "[frnccl rank %lld] teardown dump failed: %s\n", static_cast<long long>(config->rank), e.what());
        }
      }
      finishBeforeLeaving(nullptr, monitor.get(), config->dump_timeout_ms, config->dump_timeout_ms);
    });
    const std::string id = kept->get(); // "" also where the helper was left behind
    if (!id.empty()) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        lock_kept_by_teardown_ = id;
      }
      monitor.reset();
      stopThreads();
      return true;
    }
  }
  monitor.reset(); // stopThreads frees it, once its threads are joined
  stopThreads();
  return true;
}

std::string Runtime::leaveWithNote(Watchdog* watchdog, HeartbeatMonitor* monitor, const Config& config, int64_t life,
                                   const ExitNote& note, const std::string& how, int64_t deadline_ns) {
  if (watchdog != nullptr) {
    // An op that failed on this thread (the exception may be its error) becomes
    // this rank's own incident on this pass, which leaveWithException then sees.
    watchdog->awaitFreshPoll(kExitPollWaitMs);
  }
  const std::string id = monitor->leaveWithException("rank " + std::to_string(config.rank) + " " + how + note.oneLine(), deadline_ns);
  if (id.empty()) {
    if (own_failure_life_.load() == life) {
      // It follows from this rank's own failed op, whose dump must not blame it. A dump merely in progress
      // (another rank's request) is no such reason: the note stays for the parts still to be written.
      clearExitNote();
    }
    return id;
  }
  // Its store entry saying it left still goes out (at least kExitLeaveMinMs), so no trigger waits for it.
  const int64_t left_ms = std::max<int64_t>(kExitLeaveMinMs, (deadline_ns - monoNs()) / 1000000);
  finishBeforeLeaving(watchdog, monitor, left_ms, left_ms);
  std::lock_guard<std::mutex> lock(mutex_);
  exit_incident_ = config.dump_dir + "/" + id;
  return id;
}

void Runtime::setExceptionInFlightProbe(ExceptionInFlightProbe probe) {
  exception_probe_.store(probe);
}

void Runtime::finishBeforeLeaving(Watchdog* watchdog, HeartbeatMonitor* monitor, int64_t wait_ms, int64_t dump_timeout_ms) {
  if (watchdog != nullptr) {
    // On the watchdog's thread, not this one: a pass here would bind this
    // thread to each op's CUDA device, and wait forever behind a watchdog
    // stuck in a driver call.
    watchdog->awaitFreshPoll(kExitPollWaitMs);
    watchdog->releaseFinished(kWorkSettleMs);
  }
  if (monitor == nullptr) {
    return;
  }
  // An incident this rank triggered or joined is let finish (each bounded by
  // its deadline); otherwise this returns at once.
  monitor->waitIdle(wait_ms);
  // Then the job-wide requests other ranks published before this rank left
  // get its part, and the store learns that it left, so that no trigger
  // waits a whole dump deadline for it.
  monitor->leave(dump_timeout_ms);
}

Watchdog* Runtime::watchdog() {
  return watchdog_fast_.load(std::memory_order_acquire);
}

std::string Runtime::exitIncident() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exit_incident_;
}

std::string Runtime::dumpLocal(const std::string& reason) {
  TORCH_CHECK(!inForkedChild(), forkedChildText()); // before mutex_, which fork() may have copied locked
  std::shared_ptr<HeartbeatMonitor> monitor;
  int64_t timeout_ms = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    monitor = monitor_;
    timeout_ms = config_->dump_timeout_ms;
  }
  TORCH_CHECK(monitor != nullptr, "frnccl: no frnccl process group is alive in this process, so there is nothing to dump");
  // The request may queue behind an incident whose trigger waits up to its
  // deadline for the other ranks; its own write then gets a deadline too.
  return monitor->dumpLocal(reason, 2 * timeout_ms);
}

void Runtime::atExit() {
  if (inForkedChild()) {
    return; // the threads to wait for stayed in the parent
  }
  Watchdog* watchdog = nullptr;
  std::shared_ptr<HeartbeatMonitor> monitor;
  int64_t timeout_ms = 0;
  int64_t life = 0;
  std::shared_ptr<const Config> config;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    life = life_;
    watchdog = watchdog_.get();
    monitor = monitor_;
    timeout_ms = config_->dump_timeout_ms;
    config = config_;
  }
  const std::optional<ExitNote> note = exitNote();
  auto left = std::make_shared<LeftIncident>();
  bool answered = true;
  if (note && monitor) {
    // The whole exit of a rank that raised is bounded by its own short wait, not the dump deadline.
    answered = runLeavingSteps("exit", config->rank, leavingWithNoteBoundMs(*config), [this, watchdog, monitor, config, life, note, left] {
      left->set(leaveWithNote(watchdog, monitor.get(), *config, life, *note, "is leaving the job with an uncaught ",
                              monoNs() + config->exception_exit_ms * 1000000LL));
    });
  }
  if (answered && left->get().empty()) {
    // A request that joined another rank's incident may wait out the grace
    // before it takes that incident over, then its own dump deadline.
    const int64_t wait_ms = timeout_ms + HeartbeatMonitor::kJoinedRequestGraceMs + 5000;
    answered = runLeavingSteps("exit", config->rank, leavingBoundMs(wait_ms, timeout_ms), [this, watchdog, monitor, wait_ms, timeout_ms, config] {
      finishBeforeLeaving(watchdog, monitor.get(), wait_ms, timeout_ms);
      // Where its part went (an exception of torch.distributed's own leaves no
      // note): what torchrun's summary points to, if the process fails.
      const std::string id = monitor ? monitor->lastIncident() : std::string();
      if (!id.empty()) {
        std::lock_guard<std::mutex> lock(mutex_);
        exit_incident_ = config->dump_dir + "/" + id;
      }
    });
  }
  if (answered && monitor && config) {
    // The verdict of a failure this rank took part in comes moments after the ranks' parts (the judge posts
    // it; this rank's monitor fetches it), and is what this rank's error file says first (_exit_note's
    // after_exit): without it torchrun's summary shows a victim's error alone. Waited for only while it is
    // due, and no longer than a raising rank's exit. Not where the store stopped answering: no verdict comes.
    VerdictBoard::get().record(config->exception_exit_ms);
  }
}

void Runtime::stopAtExit() {
  if (inForkedChild()) {
    return;
  }
  HeartbeatMonitor::notePythonFinalizing();
  // A thread still talking to the store when the process ends leaves a
  // half-sent request behind, which has brought down torchrun's store server.
  stopThreads();
}

void Runtime::stopThreads() {
  std::unique_ptr<Watchdog> watchdog;
  std::shared_ptr<HeartbeatMonitor> monitor;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    watchdog = std::move(watchdog_);
    monitor = std::move(monitor_);
    watchdog_fast_.store(nullptr);
    monitor_fast_.store(nullptr);
  }
  // No group is left whose state a signal would dump.
  const bool term_stopped = TermDump::stop(1000);
  // Stopped outside the lock.
  const bool monitor_stopped = !monitor || monitor->stop(1000);
  const bool watchdog_stopped = !watchdog || watchdog->stop(1000);
  if (watchdog && watchdog_stopped) {
    // Dropped here, on a thread of the caller's (see Watchdog::releaseFinished),
    // rather than kept with the watchdog: after destroy_process_group the
    // process may go on, and these Works hold the last ops' tensors.
    watchdog->releaseFinished(kWorkSettleMs);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (watchdog) {
    retired_watchdogs_.push_back(std::move(watchdog));
  }
  if (monitor && !(term_stopped && monitor_stopped && watchdog_stopped)) {
    // A thread that did not stop in time may still use it (the monitor's own,
    // the frnccl-term thread, the watchdog's incident callback).
    left_behind_monitors_.push_back(std::move(monitor));
  }
  // Otherwise freed here, or by the last caller still holding it (dumpLocal):
  // its store connections close, so a process that starts life after life keeps
  // the same number open.
}

void Runtime::leaveFailuresToLibrary(int64_t life, int32_t pg_index) {
  std::lock_guard<std::mutex> lock(mutex_);
  library_failure_pgs_.emplace(life, pg_index);
}

void Runtime::onIncident(const Incident& incident, int64_t life) {
  const std::shared_ptr<HeartbeatMonitor> monitor = monitorOf(life);
  if (!monitor) {
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (library_failure_pgs_.count({life, incident.pg_index}) != 0) {
      // The library handles it (torchft): an exception the caller leaves with later is its own, and is noted.
      return;
    }
  }
  // This rank's own op failed: an exception the caller leaves with follows from it (leaveWithNote).
  own_failure_life_.store(life);
  monitor->requestJobDump(incident.reason, incident.detail, [this, incident, life](const std::string& id) {
    afterIncident(incident, id, life);
  }, incident.group_ranks);
}

void Runtime::afterIncident(const Incident& incident, const std::string& incident_id, int64_t life) {
  if (incident.reason != "timeout") {
    // A failed op already raises in the caller; the dump is all we add.
    return;
  }
  std::shared_ptr<const Config> config;
  // Taken under the same lock as the life check: a teardown and a new life may come before the abort, which
  // then reaches only the groups of the life that timed out (a group shut down since is left as it is).
  std::vector<c10::intrusive_ptr<FrBackend>> backends;
  std::string hold_path;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (life != life_) {
      return; // the groups to abort were that life's, and it has ended
    }
    config = config_;
    backends = liveBackendsLocked();
    hold_path = test_abort_hold_;
  }
  TestAbortHold hold(std::move(hold_path));
  std::fprintf(stderr, "[frnccl rank %lld] %s; dump %s is written; aborting the communicators\n",
               static_cast<long long>(config->rank), incident.detail.c_str(), incident_id.c_str());
  std::fflush(stderr);
  const bool exiting = config->on_timeout == OnTimeout::kExit;
  abortAll(backends, "frnccl: " + incident.detail + "; dump " + incident_id +
           " is written and every frnccl group of this process was aborted" +
           (exiting ? "; the process ends once every rank wrote its part (FRNCCL_ON_TIMEOUT=exit)"
                    : " (FRNCCL_ON_TIMEOUT=raise): create new groups or restart the job"));
  if (exiting) {
    // torchrun stops every worker as soon as one exits, and a rank that joined
    // another rank's incident gets here once its own part is written: leaving
    // now would cut the slower ranks' dumps short (often the culprit's). This
    // runs on the monitor thread, so it waits on the store's count of writers
    // (bounded by the incident's deadline), never for the monitor to be idle.
    if (const std::shared_ptr<HeartbeatMonitor> monitor = monitorOf(life)) {
      monitor->awaitIncident(incident_id);
    }
    std::fprintf(stderr, "[frnccl rank %lld] ending the process (FRNCCL_ON_TIMEOUT=exit)\n",
                 static_cast<long long>(config->rank));
    std::fflush(stderr);
    std::_Exit(1);
  }
}

std::vector<c10::intrusive_ptr<FrBackend>> Runtime::liveBackendsLocked() const {
  std::vector<c10::intrusive_ptr<FrBackend>> backends;
  for (const auto& weak : live_) {
    if (auto strong = weak.lock()) {
      backends.push_back(std::move(strong));
    }
  }
  return backends;
}

void Runtime::abortAll(const std::vector<c10::intrusive_ptr<FrBackend>>& backends, const std::string& why) {
  for (const auto& backend : backends) {
    try {
      backend->abortAfterTimeout(why);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[frnccl] abort failed: %s\n", e.what());
    }
  }
}

} // namespace frnccl
