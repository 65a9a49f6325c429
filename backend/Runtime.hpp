#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <set>
#include <unordered_set>
#include <vector>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "Config.hpp"
#include "ExitNote.hpp"
#include "HeartbeatMonitor.hpp"
#include "Watchdog.hpp"

namespace frnccl {

class FrBackend;

// What one process shares across its frnccl groups: the configuration, the
// watchdog and the heartbeat monitor. Leaked on purpose (see Recorder).
//
// Lives: a life of the process runs from the group created when no frnccl
// group was alive to the teardown of its last group (destroy_process_group or
// _abort_process_group; torchft, in-process restarts and elastic re-init then
// call init_process_group again, often with another rank or world size). Each
// life has its own configuration (rank, world size, attempt, everything read
// from the environment), threads, monitor and store connections, and starts the
// recorder empty. What outlives a life: this object and the recorder (whose size
// and stack mode the first life fixed), the dump signal's handler, the SIGTERM/
// SIGABRT handler and its pipes, and each life's Watchdog object, whose thread
// is stopped but which ops of a group kept past its teardown may still reach.
//
// Threads: the watchdog, monitor and frnccl-term threads start with a life's
// first group and stop with its last (joined within a bound; one that does not
// stop in time is left behind, and so is the object it uses).
// Lock: mutex_ guards everything here; never held while calling into an
// inner backend except in abortAll, which runs on the monitor thread.
class Runtime {
 public:
  static Runtime& get();

  // Called before each group is created. When no frnccl group is alive, a new
  // life begins: threads still idle from the last one (its groups were dropped
  // without a teardown) are stopped, `config` becomes the configuration, and the
  // recorder starts empty. Otherwise the group joins the life in progress, whose
  // configuration stays. Returns true when a new life began.
  bool configure(const Config& config);
  bool configured() const;
  Config config() const;
  // The current life's configuration, which never changes: a group keeps the one it was created in.
  std::shared_ptr<const Config> lifeConfig() const;
  // The current life (0 in the first), and its watchdog for a group of `life` (nullptr for a group of an
  // ended life, kept past its teardown: its ops are forwarded and recorded, but no watchdog of a later
  // life times them out or lets them open an incident of that life). Lock-free, for the op path.
  int64_t currentLife() const {
    return life_fast_.load(std::memory_order_acquire);
  }
  Watchdog* watchdogOf(int64_t life) {
    return life == currentLife() ? watchdog() : nullptr;
  }
  // Whether an incident's verdict can reach this process for an op of `life`: that life's monitor runs and
  // reaches the store (a process without one, e.g. a forked child, never waits for a verdict).
  bool mayGetVerdict(int64_t life) const {
    const std::shared_ptr<HeartbeatMonitor> monitor = monitorOf(life);
    return monitor != nullptr && monitor->mayGetVerdict();
  }

  void attach(const c10::intrusive_ptr<FrBackend>& backend, const c10::intrusive_ptr<c10d::Store>& root_store);
  // The group (a Recorder pg index, never reused) belongs to a library that handles its failures itself
  // (torchft rebuilds its replica group after a replica dies): its ops are recorded as any group's, but a
  // failed or timed-out op opens no incident (no job-wide dump, no verdict, no abort, no FRNCCL_ON_TIMEOUT
  // exit). The library raises, drops the step and carries on, as it would without frnccl.
  void leaveFailuresToLibrary(int64_t life, int32_t pg_index);
  // How a group leaves. When it was the last one:
  //  - kShutdown (destroy_process_group) lets a dump in progress finish (bounded) and stops the threads;
  //  - kAbort (_abort_process_group) stops the threads without waiting for a dump;
  //  - kDropped (the group's last reference went without either) leaves the threads running, idle, for
  //    the next group or the exit hook: a destructor must not block, and it may run on the monitor thread.
  enum class Leaving { kShutdown, kAbort, kDropped };
  // Returns true when this was the last live group and the threads were stopped.
  bool detach(const FrBackend* backend, Leaving how);
  // Asks the interpreter, on the thread tearing down the last group (destroy_process_group from a
  // `finally:` or `except:`, as torchtitan's main does), for the exception it is propagating, and notes it
  // as an uncaught one would be (noteExit): by the time it reaches sys.excepthook no group is left to
  // say why this rank left. True when it noted one just now (a note left by an earlier, handled exception
  // is no reason to leave). Set once by the Python binding; it takes the GIL, so it is never called from
  // frnccl's own threads or on the dump path.
  using ExceptionInFlightProbe = bool (*)();
  void setExceptionInFlightProbe(ExceptionInFlightProbe probe);

  Watchdog* watchdog();
  // Installs the dump signal's handler (once per process; later calls do nothing). The first life calls it,
  // and FRNCCL_ENABLE's registration before any group exists: a dump signal sent to a rank then, which
  // would otherwise end it, prints one line and the process goes on. `rank` only names the process in a
  // failure's line.
  void installDumpSignal(int signal_number, int64_t rank);

  std::string dumpLocal(const std::string& reason);
  // At interpreter exit: report failures Python already saw, let a running
  // dump finish (bounded) and wait for a due verdict (bounded). The threads stay,
  // and SIGTERM still dumps, until stopAtExit: the rank's error file is written
  // in between, so a launcher's SIGTERM then cannot end the process before it.
  void atExit();
  // Then: stop using Python and stop frnccl's threads.
  void stopAtExit();
  // The folder of the incident this process's part went to as it left with an
  // uncaught exception (atExit), or of the last it took part in; "" if none.
  std::string exitIncident() const;

  // True in a child forked while this process's frnccl threads ran: threads
  // do not survive fork(), so frnccl is inert there (no tracking, no dumps,
  // nothing to wait for at exit or teardown).
  static bool inForkedChild();

 private:
  Runtime() = default;
  static void afterForkInChild(); // pthread_atfork's child handler
  // The one-line explanation for a forked child, printed or raised.
  static std::string forkedChildText();
  // What a rank does before its threads stop, on teardown and at exit:
  // report failures the caller already saw, let the dumps they cause (and
  // any in progress) finish, serve the job-wide requests already published,
  // and tell the store it left. Bounded by `wait_ms` per step.
  void finishBeforeLeaving(Watchdog* watchdog, HeartbeatMonitor* monitor, int64_t wait_ms, int64_t dump_timeout_ms);
  // A rank leaving with the exception in its exit note: opens (or joins) the job-wide incident that says so,
  // lets it finish until `deadline_ns` (at least kExitLeaveMinMs for the store to learn that it left), and
  // records its folder for torchrun's summary. `how`: the log's words after "rank N ". Returns the incident's
  // id, "" where none was opened (then the note is dropped if this rank's own op failed in `life`: the
  // exception follows from that failure, whose dump must not blame it).
  std::string leaveWithNote(Watchdog* watchdog, HeartbeatMonitor* monitor, const Config& config, int64_t life,
                            const ExitNote& note, const std::string& how, int64_t deadline_ns);
  // `life`: the life whose watchdog reported it; an incident of a life that has
  // ended (a thread left behind) dumps nothing and aborts no group of the next.
  void onIncident(const Incident& incident, int64_t life);
  void afterIncident(const Incident& incident, const std::string& incident_id, int64_t life);
  // After a timeout: aborts `backends` (the live groups of the life that timed out); their later ops raise `why`.
  static void abortAll(const std::vector<c10::intrusive_ptr<FrBackend>>& backends, const std::string& why);
  // The groups of the current life still alive; mutex_ held.
  std::vector<c10::intrusive_ptr<FrBackend>> liveBackendsLocked() const;
  void stopThreads();
  void installTermDump(const Config& config);
  // The current life's monitor, if its threads run and it is `life`'s (-1: any life).
  std::shared_ptr<HeartbeatMonitor> monitorOf(int64_t life) const;

  mutable std::mutex mutex_;
  bool configured_ = false;
  std::string exit_incident_; // set by atExit, or by the teardown of the last group with an exception in flight
  // The incident such a teardown opened, whose job-wide lock is kept (its peers' failures join it) unless
  // the process goes on: the next life's first monitor lets go of it. Cleared by that life.
  std::string lock_kept_by_teardown_;
  std::atomic<ExceptionInFlightProbe> exception_probe_{nullptr};
  // Replaced only by configure, at the start of a life; never modified.
  std::shared_ptr<const Config> config_ = std::make_shared<const Config>();
  // How many lives ended before the current one (0 in the first).
  int64_t life_ = 0;
  std::atomic<int64_t> life_fast_{0}; // life_, for the op path
  // The last life whose watchdog saw one of this rank's own ops fail or time out (-1: none): an exception
  // at exit then follows from that failure, and its note is dropped. Written by the watchdog's thread.
  std::atomic<int64_t> own_failure_life_{-1};
  // leaveFailuresToLibrary's groups by (life, pg index): a later life's group may get the same index
  // (Recorder::registerPg). Guarded by mutex_; an ended life's are dropped as the next begins.
  std::set<std::pair<int64_t, int32_t>> library_failure_pgs_;
  std::unique_ptr<Watchdog> watchdog_;
  // Read on every op without the lock; the object it points to is never freed.
  std::atomic<Watchdog*> watchdog_fast_{nullptr};
  // Shared with callers that use it outside mutex_ (dumpLocal, onIncident): freed by the last of them once
  // stopThreads let go of it, which closes its store connections.
  std::shared_ptr<HeartbeatMonitor> monitor_;
  // For the frnccl-term thread, which must not take mutex_: the SIGTERM it
  // serves may have interrupted a thread that holds it.
  std::atomic<HeartbeatMonitor*> monitor_fast_{nullptr};
  // Earlier lives' watchdogs (ops of a group kept past its teardown read them without a lock), and the
  // monitors whose threads did not stop in time: kept, never freed.
  std::vector<std::unique_ptr<Watchdog>> retired_watchdogs_;
  std::vector<std::shared_ptr<HeartbeatMonitor>> left_behind_monitors_;
  std::vector<c10::weak_intrusive_ptr<FrBackend>> live_;
  std::string test_abort_hold_; // FRNCCL_TEST_HOLD_ABORT, read by configure (afterIncident runs on the monitor thread)
  std::mutex signal_mutex_; // guards signal_installed_: installDumpSignal runs with or without mutex_
  bool signal_installed_ = false;
};

} // namespace frnccl
