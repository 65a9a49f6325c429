#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "Config.hpp"
#include "HeartbeatMonitor.hpp"
#include "Watchdog.hpp"

namespace frnccl {

class FrBackend;

// What one process shares across its frnccl groups: the configuration, the
// watchdog and the heartbeat monitor. Threads start with the first group and
// stop when the last group shuts down. Leaked on purpose (see Recorder).
// Lock: mutex_ guards everything here; never held while calling into an
// inner backend except in abortAll, which runs on the monitor thread.
class Runtime {
 public:
  static Runtime& get();

  void configure(const Config& config);
  bool configured() const;
  Config config() const;
  // Lock-free read for the op path: the configuration is fixed before the
  // first group exists.
  const Config& configRef() const {
    return config_;
  }

  void attach(const c10::intrusive_ptr<FrBackend>& backend, const c10::intrusive_ptr<c10d::Store>& root_store);
  // How a group leaves. When it was the last one:
  //  - kShutdown (destroy_process_group) lets a dump in progress finish (bounded) and stops the threads;
  //  - kAbort (_abort_process_group) stops the threads without waiting for a dump;
  //  - kDropped (the group's last reference went without either) leaves the threads running, idle, for
  //    the next group or the exit hook: a destructor must not block, and it may run on the monitor thread.
  enum class Leaving { kShutdown, kAbort, kDropped };
  // Returns true when this was the last live group and the threads were stopped.
  bool detach(const FrBackend* backend, Leaving how);

  Watchdog* watchdog();
  HeartbeatMonitor* monitor();

  std::string dumpLocal(const std::string& reason);
  // At interpreter exit: report failures Python already saw, let a running
  // dump finish (bounded), then stop using Python.
  void atExit();

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
  void finishBeforeLeaving(Watchdog* watchdog, HeartbeatMonitor* monitor, int64_t wait_ms);
  void onIncident(const Incident& incident);
  void afterIncident(const Incident& incident, const std::string& incident_id);
  // After a timeout: aborts every live group; their later ops raise `why`.
  void abortAll(const std::string& why);
  void stopThreads();
  void installDumpSignal();
  void installTermDump();

  mutable std::mutex mutex_;
  bool configured_ = false;
  Config config_;
  std::unique_ptr<Watchdog> watchdog_;
  // Read on every op without the lock; the object it points to is never freed.
  std::atomic<Watchdog*> watchdog_fast_{nullptr};
  std::unique_ptr<HeartbeatMonitor> monitor_;
  // For the frnccl-term thread, which must not take mutex_: the SIGTERM it
  // serves may have interrupted a thread that holds it.
  std::atomic<HeartbeatMonitor*> monitor_fast_{nullptr};
  std::vector<c10::weak_intrusive_ptr<FrBackend>> live_;
  bool signal_installed_ = false;
};

} // namespace frnccl
