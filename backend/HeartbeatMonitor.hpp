#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "BoundedThread.hpp"
#include "Config.hpp"
#include "DumpWriter.hpp"
#include "RankSummary.hpp"
#include "StormBound.hpp"
#include "StoreWaiter.hpp"

namespace frnccl {

// One thread per process: the only place that writes dumps.
//  - job-wide requests travel through the root TCPStore (keys under "frnccl/"),
//    so every rank dumps each incident exactly once; a trigger sets every
//    rank's wake key, which its StoreWaiter waits on, so an idle rank makes no
//    store requests (it polls every FRNCCL_COORD_CHECK_MS only where the push
//    cannot work: see needsPoll);
//  - local requests arrive from the watchdog, the dump signal and fr_backend.dump();
//  - it watches the watchdog's heartbeat.
// Lock: mutex_ guards the request queue and the incident bookkeeping; no store
// call or file I/O is made while holding it. store_mutex_ guards only the
// store_ pointer, which a reconnect replaces.
class HeartbeatMonitor {
 public:
  using After = std::function<void(const std::string& incident_id)>;
  // Whether a verdict can reach this rank at all: it has a store that is not lost.
  bool mayGetVerdict() const {
    return storeUsable();
  }

  // A request that joined another incident whose request has not reached this
  // rank this long after the lock was taken takes the incident over (serves
  // itself as its trigger). A live trigger publishes its request right after
  // it takes the lock, in two store calls that give up after the store
  // timeout (10 s).
  static constexpr int64_t kJoinedRequestGraceMs = 10000;

  HeartbeatMonitor(
      Config config,
      c10::intrusive_ptr<c10d::Store> store,
      std::function<WatchdogHealth()> watchdog_health,
      std::function<int64_t()> watchdog_heartbeat,
      std::function<bool(int64_t timeout_ms)> await_fresh_poll);
  // Asks the thread to stop; never joins. Destroying the monitor closes its store connection, so its owner
  // does it only once stop() returned true.
  ~HeartbeatMonitor();
  HeartbeatMonitor(const HeartbeatMonitor&) = delete;
  HeartbeatMonitor& operator=(const HeartbeatMonitor&) = delete;

  // Asks every rank of the job to dump; `after` runs on the monitor thread
  // once this rank's dump is written and, as the trigger, all ranks wrote or
  // the dump deadline passed. `group_ranks`: the global ranks of the failed op's group, if any.
  void requestJobDump(std::string reason, std::string detail, After after, std::vector<int64_t> group_ranks = {});
  // Dumps this rank only. Blocks the caller until written (bounded); returns the folder.
  std::string dumpLocal(const std::string& reason, int64_t timeout_ms);
  // Waits (bounded) until no requested dump is pending or being written.
  void waitIdle(int64_t timeout_ms);
  // Waits until every rank wrote its part of `incident_id`, bounded by that
  // incident's dump deadline, if it is the job-wide incident this rank last
  // took part in; returns at once otherwise (a local dump: no one to wait for).
  // Reads only the store, so an `after` callback (the monitor thread) may call it.
  void awaitIncident(const std::string& incident_id);
  // This rank is leaving (teardown or exit): the monitor thread serves the
  // job-wide requests already published, so that an incident opened just
  // before gets this rank's part, then marks the rank as left in the store,
  // so that a trigger's count of writers stops waiting for it. The caller
  // waits up to `timeout_ms`; false if the thread did not finish in time.
  bool leave(int64_t timeout_ms);
  // Stops the thread, joined within `timeout_ms`; false if it is left behind
  // (then this object must outlive it).
  bool stop(int64_t timeout_ms);
  // On SIGTERM or SIGABRT (the frnccl-term thread, see TermDump): writes
  // this rank's dump, never symbolized, with `reason` and `what` (the signal,
  // and who sent it), unless its part of the incident in progress, or of a
  // failure within a minute, is written or being written (then it waits for
  // that, bounded). The dump joins the job-wide incident in progress if there
  // is one (its request had not reached this rank yet; the part counts as
  // written); else, with `open_incident`, it opens one as its trigger (without
  // waiting for the others); else it is a local incident.
  // Returns the incident whose part is written ("" when the monitor is
  // stopping); `opened_out`, if given, says whether this call opened it.
  std::string dumpBeforeEnd(const std::string& reason, const std::string& what, bool open_incident, bool* opened_out = nullptr);
  // The process is leaving through an uncaught Python exception (ExitNote.hpp)
  // while its group is alive, in a job of more than one rank: dumpBeforeEnd
  // with reason "exception", opening a job-wide incident (without a store, a
  // local one), whose other parts it then waits for until `deadline_mono_ns`
  // (FRNCCL_DUMP_ON_EXCEPTION_MS from the exit: it does not need them to leave).
  // The job-wide lock it took is kept until it goes stale: the peers' failures that follow this rank's end
  // then join this incident. Any thread but the monitor's. Returns the incident its part went to ("" if none).
  std::string leaveWithException(const std::string& what, int64_t deadline_mono_ns);
  // Lets go of the job-wide lock if `incident_id` still holds it (a later holder keeps it): a process that
  // goes on into a new life after leaving with an exception (Runtime) frees the lock its last life kept, so
  // that the new life's incidents are its own. Any thread but the monitor's.
  void releaseActive(const std::string& incident_id);
  // The incident this rank last took part in or wrote a failure's part of; "" if none.
  std::string lastIncident();

  // This life's configuration; never changes.
  const Config& config() const {
    return config_;
  }

  // Async-signal-safe: what the dump signal handler calls. False where no monitor runs in this process
  // (no frnccl group alive): the signal is not kept for a later life's monitor.
  static bool noteSignal();
  // In a child right after fork(): no monitor thread of the parent's runs there.
  static void forgetMonitorsAfterFork();
  // Python is finalizing: no more GIL, so no symbolizing and no faulthandler.
  static void notePythonFinalizing();
  static bool pythonFinalizing();

 private:
  struct LocalRequest {
    std::string reason;
    std::string detail;
    bool job_wide = false;
    After after;
    std::shared_ptr<std::promise<std::string>> result;
    std::vector<int64_t> group_ranks; // the failed op's group (global ranks); empty: none told
  };

  int64_t registerWithStore();
  // `config` with its job_tag: the one the job's store holds, left there by the first rank to ask (one
  // compareSet), else a hash of job_id, else "".
  static Config withJobTag(Config config, const c10::intrusive_ptr<c10d::Store>& store);
  // Rank 0, once, a few seconds after it registered again (an earlier attempt
  // or group of its process left; the other ranks are done appending by then): rewrites frnccl/left_ranks as one "+<rank>," per
  // rank that is still out, if longer than that. Each leaving and each return
  // appends, so across restarts and groups made again it grew without bound.
  void compactLeftRanks();
  void run();
  void serveLocal(LocalRequest request);
  // Opens a job-wide incident for `request` as its trigger, or joins the one in
  // progress. `given_up` is a lock value whose request never reached this rank:
  // it is taken over like a stale one.
  void startIncident(LocalRequest request, const std::string& given_up);
  // Takes frnccl/active for `mine` if it is free, stale or `given_up`; returns
  // the value that holds it now (`mine` if taken).
  std::string acquireActive(const std::string& mine, const std::string& given_up);
  void joinIncident(LocalRequest request, const std::string& held);
  // Serves the joined requests as a new incident's trigger once their
  // incident's request is kJoinedRequestGraceMs late.
  void takeOverJoined();
  // Serves the job-wide requests published since the last poll; false if it
  // could not read up to the latest (store failure, a request not there yet).
  bool pollStore();
  // Whether the monitor reads the store on this pass: when the waiter woke,
  // when asked to (pollSoon), and every FRNCCL_COORD_CHECK_MS while a request
  // may be missed without it (no waiter listening, the connection lost, a
  // request number whose request is missing, a request that joined another
  // incident).
  bool needsPoll(int64_t now);
  // Answers a `frnccl status` request newer than the last one answered with this rank's live summary: one
  // store read, only after a wake, at most once per kStatusMinIntervalMs.
  void answerStatusIfDue(int64_t now);
  // Sets this rank's own wake key once its wait has lasted StoreWaiter::selfWakeMs: the wait then ends as
  // woken, never at the bound, where torch logs two warning lines of a timeout for every idle rank.
  void selfWakeIfDue(int64_t now);
  // When the waiter's connection failed: if the store host no longer accepts
  // connections (it left), the store is lost without another call to it, each
  // of which would print torch's warning with a C++ backtrace. Asked
  // kWaiterFailureSettleMs after the failure; true (no poll) until then.
  bool checkWaiterConnection();
  // Before an incident's first store call: whether the waiter's connection was
  // closed (or failed, not yet looked into) because the store host left, which
  // the incident's own failed op may be the first sign of. Blocks for
  // kWaiterFailureSettleMs only when the connection did close.
  bool waiterSawHostLeave();
  void pollSoon() {
    poll_soon_.store(true);
  }
  // Sets every rank's wake key (kWakeBatch keys per multiSet) once a request is
  // published. A failure is logged: the ranks then see the request at their
  // waiter's bound, or by polling.
  void wakeAllRanks(const std::string& incident_id);
  // Ends this rank's wait at once (sets its own wake key), where the store can
  // be reached; once.
  void releaseWaiter();
  // The job-wide incident in progress (its lock held, not stale) and its request, read without waiting on the
  // store; false if there is none or the store cannot say.
  bool incidentInProgress(DumpRequest& request);
  // The ranks that wrote `incident_id` and those that left (each rank at most
  // in one: a rank that wrote and then left counts as written), read in two
  // round trips whatever the job's size. Store errors propagate.
  void readDoneRanks(const std::string& incident_id, std::vector<bool>& wrote, std::vector<bool>& left);
  bool storeUsable() const {
    return have_store_ && !store_lost_.load(std::memory_order_relaxed);
  }
  // The store connection now: reconnectStore may replace it.
  c10::intrusive_ptr<c10d::Store> store() const;
  // Sets store_lost_ on a network error.
  void noteStoreFailure(const std::exception& e);
  // While store_lost_ is set, at most once per backoff: a fresh connection
  // (Store::clone) if the store host still accepts one; bounded in attempts.
  void reconnectStore();
  // The storm bound for a job-wide dump this rank did not ask for itself
  // (FRNCCL_DUMP_MIN_INTERVAL_SEC, FRNCCL_DUMP_MAX_COUNT); false, logged, if
  // it is dropped. `what` names the request in that log line.
  bool admitJobDump(const std::string& reason, const std::string& what);
  void checkWatchdog();
  // Writes this rank's dump; returns the folder or "" on failure (logged). Either way, then notes the
  // incident's part as done (for awaitOwnPart). `written`, if set, is called with the folder as soon as
  // the files are on disk, before the dump's tree (tens of ms to free at 20,000 entries) is released.
  using WrittenFn = std::function<void(const std::string&)>;
  std::string writeOwnDump(const DumpRequest& request, const WrittenFn& written = nullptr);
  std::string writeDumpFiles(const DumpRequest& request, const WrittenFn& written);
  // Waits (bounded by FRNCCL_DUMP_ON_TERMINATE_MS) until this rank's part of `incident_id` is written.
  void awaitOwnPart(const std::string& incident_id);
  // A failure this rank detects shortly after it wrote its part of a failure
  // incident is that incident's cascade; returns the incident's id, or "".
  std::string cascadeOf(const std::string& reason) const;
  // A failure in a group one of whose members left the job with an uncaught exception, opening an incident
  // this rank wrote its part of in this life: that incident's consequence, however late; its id and the
  // member that left, or "" and -1.
  std::pair<std::string, int64_t> leaverOf(const LocalRequest& request);
  // Counts this rank's part of `incident_id` as written (its summary was posted before the files: postSummary).
  void announceWritten(const std::string& incident_id);
  // Posts this rank's summary of a failure incident before it writes its files (a slow or failing disk does
  // not keep it from the verdict), and deletes the one it posted for its previous incident. Never throws.
  void postSummary(const std::string& incident_id, const SummaryInput& in);
  // The trigger, once the wait for the writers ended: reads every summary (kSummaryBatch keys per multiGet),
  // prints the verdict, posts its first line and wakes the ranks so that they read it.
  void announceVerdict(const std::string& incident_id, int64_t written, const std::vector<bool>& wrote,
                       const std::vector<bool>& gone, double seconds);
  // The trigger: a verdict that names no rank, where the summaries could not be read.
  void postUndecidedVerdict(const std::string& incident_id, const std::string& why, double seconds);
  // The trigger: keeps `line` for this rank's errors, posts it as `incident_id`'s verdict, wakes the ranks.
  void postVerdict(const std::string& incident_id, const std::string& line, const std::vector<int64_t>& culprits,
                   const std::string& json);
  // Any rank: the verdict of the incident it took part in, once the trigger posted it: read after a wake (the
  // trigger wakes every rank once it posted it), or once per coord_check_ms where no wake is pushed.
  void fetchVerdict();
  // On the monitor thread, for leave().
  void serveBeforeLeaving();
  void noteIncident(const std::string& incident_id, bool failure);
  // The ranks done with an incident: those that wrote their part, and those
  // that left the job without it. `seen` remembers the store's counts between
  // calls of one wait, so that the lists of ranks (a rank that wrote and then
  // left counts once) are read only when those counts change.
  struct DoneCount {
    int64_t written = 0;
    int64_t left = -1;
    int64_t done = 0;
  };
  // Store errors propagate. False, with `why`, when a count in the store is not a number.
  // The counts are read every call; the lists of ranks only when the counts say all may be done.
  bool countDone(const std::string& incident_id, DoneCount& seen, std::string& why);
  bool incidentComplete(DoneCount& seen);
  // With `verdict` (a failure incident), then announces the verdict.
  // `wait_ms` < 0: the dump deadline (FRNCCL_DUMP_TIMEOUT_SEC) bounds the wait.
  void awaitAllRanks(const std::string& incident_id, int64_t start_mono_ns, bool verdict, int64_t wait_ms = -1);
  // How many ranks wrote `incident_id`, polled (20 ms, backing off to 200 ms) until all did or the
  // deadline passed; a store failure ends it early, with `store_error` set. Shared by the trigger's
  // wait and an exiting rank's.
  int64_t countWriters(const std::string& incident_id, int64_t deadline_mono_ns, std::string& store_error);
  bool sleepFor(int64_t ms); // false when stopping; queued requests do not wake it
  bool stopping();

  const Config config_;
  const bool have_store_;
  // A private clone of the root store; replaced only by reconnectStore (monitor
  // thread), read through store() from any thread.
  mutable std::mutex store_mutex_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::function<WatchdogHealth()> watchdog_health_;
  std::function<int64_t()> watchdog_heartbeat_;
  std::function<bool(int64_t)> await_fresh_poll_; // Watchdog::awaitFreshPoll
  // Set by the monitor thread: no fresh poll to wait for. Atomic: a dump on SIGTERM reads it too.
  std::atomic<bool> watchdog_stuck_{false};

  std::mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable written_cv_; // written_parts_ grew
  std::set<std::string> written_parts_; // incidents whose part this rank wrote (or failed to)
  std::deque<LocalRequest> queue_;
  // Set by leave(), served by the monitor thread.
  std::shared_ptr<std::promise<void>> leaving_;
  bool stopping_ = false;
  bool busy_ = false;
  std::set<std::string> dumped_incidents_;
  // The job-wide incident this rank last took part in, and when waiting for
  // it stops making sense; lets an exiting rank stay until all ranks wrote.
  std::string current_incident_;
  int64_t current_incident_deadline_mono_ns_ = 0;
  // Job-wide requests that joined another rank's incident, kept whole: if that
  // incident's request never reaches this rank (its trigger ended before it
  // asked, or asked before this process joined the store, as after a torchrun
  // restart), this rank takes the incident over and serves them itself.
  std::deque<LocalRequest> joined_;
  std::string joined_lock_; // the frnccl/active value they joined
  int64_t joined_since_mono_ns_ = 0; // when they joined that value

  // Shared with the waiter: a clone of a store and reconnectStore's change of
  // that store's timeout must not overlap.
  std::shared_ptr<std::mutex> clone_mutex_;
  // Null without a store. Stopped by releaseWaiter (monitor thread), at leave() or stop().
  std::unique_ptr<StoreWaiter> waiter_;
  bool waiter_released_ = false; // monitor thread only
  int64_t seen_wakes_ = 0; // monitor thread only
  // The wakes seen when this rank last read its incident's verdict, and when (monitor thread only).
  int64_t verdict_fetch_wakes_ = -1;
  int64_t last_verdict_fetch_mono_ns_ = 0;
  // `frnccl status` (answerStatusIfDue), monitor thread only, per life: a wake came (or, without a waiter,
  // a poll) since the status seq was last read; the last request answered; when it was last read.
  bool status_due_ = false;
  int64_t status_answered_ = 0;
  int64_t status_read_mono_ns_ = 0;
  int64_t last_wake_mono_ns_ = 0; // monitor thread only: when seen_wakes_ last moved, or this rank set its own key
  int64_t seen_waiter_failures_ = 0; // monitor thread only
  int64_t waiter_failed_mono_ns_ = 0; // monitor thread only: when a failure of the waiter's was seen, 0 once looked into
  bool push_off_logged_ = false; // monitor thread only
  int64_t compact_left_at_mono_ns_ = 0; // set by registerWithStore, then monitor thread only; 0: none due
  // Set by any thread that wants the store read on the monitor's next pass.
  std::atomic<bool> poll_soon_{false};

  int64_t seen_request_seq_ = 0;
  int64_t missing_since_mono_ns_ = 0;
  std::atomic<int64_t> last_store_poll_mono_ns_{0};
  int64_t last_heartbeat_ = -1;
  int64_t heartbeat_changed_mono_ns_ = 0;
  bool store_broken_logged_ = false;
  // Set once a store call failed with a network error: TCPStore's client
  // socket is then closed, or out of step (a reply that comes after a timeout
  // answers the next request), so no later call on it can succeed, and each
  // would print torch's warning with a C++ backtrace. From then on this rank
  // dumps alone.
  std::atomic<bool> store_lost_{false};
  // Reconnecting (monitor thread only, but for when to try next, which the
  // thread that saw the failure sets): how many tries in a row failed, how
  // many times a connection was replaced in all.
  std::atomic<int64_t> next_reconnect_mono_ns_{0};
  int reconnect_failures_ = 0;
  int reconnects_ = 0;
  bool reconnect_given_up_ = false;
  bool bad_seq_logged_ = false; // frnccl/incident_seq is not a number (said once)
  StormBound storm_; // monitor thread only
  // The last timeout/error incident this rank wrote its part of, and when.
  // Only the monitor thread writes them (under mutex_, for dumpBeforeEnd's read).
  std::string last_failure_incident_;
  // Ranks whose uncaught exception opened a failure incident (reason exception) this rank wrote its part of:
  // rank -> that incident (at most one entry per rank of the job; mutex_).
  std::map<int64_t, std::string> left_with_exception_;
  // The incident whose summary this rank posted last, and (as a trigger) whose verdict it posted last: their
  // keys are deleted when the next is posted, so the store holds one incident's of each (mutex_).
  std::string posted_summary_incident_;
  std::string posted_verdict_incident_;
  int64_t last_failure_written_mono_ns_ = 0;

  BoundedThread thread_; // last: starts once every member above exists
};

} // namespace frnccl
