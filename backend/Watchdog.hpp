#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/Work.hpp>

#include "BoundedThread.hpp"
#include "DeviceMarker.hpp"
#include "DumpWriter.hpp"
#include "Recorder.hpp"

namespace frnccl {

// An op the watchdog follows until it completes, fails or times out.
struct TrackedOp {
  int64_t record_id = -1;
  int32_t pg_index = -1;
  OpKind op = OpKind::kBarrier;
  int64_t seq = 0;
  int64_t created_mono_ns = 0;
  int64_t timeout_ms = 0;
  c10::intrusive_ptr<c10d::Work> work; // may be null (sync NCCL ops)
  MarkerPtr marker; // may be null (CPU ops)
  // Run by the inner NCCL backend, not Gloo. A group's CPU and CUDA ops run
  // apart, so what one kind's progress proves says nothing of the other's.
  bool on_gpu = false;
  bool started = false;
  int64_t started_wall_ns = 0;
  // Whether the Work can say the op completed (workReportsCompletion). One
  // that cannot (Gloo's reduce_scatter family before torch 2.14) is done once
  // the caller's wait() returned or a later collective of its lane completed;
  // it is never timed out on the clock alone, nor holds its lane busy: a real
  // hang in it fails the caller's wait() at Gloo's own timeout (noteFailure).
  bool completion_reported = true;
  // Entries of the ops inside a coalesced group, finished with it.
  std::vector<int64_t> member_ids;
  // Whether a thread of the inner backend may still hold the Work for a
  // moment after it completes, as Gloo's workers do (see releaseFinished).
  // NCCL's watchdog keeps copies of its Works, not the Works themselves.
  bool worker_may_hold_work = true;
};

// Whether `work` can ever say that its op completed: it has a future. Gloo's
// Works that compose other Works (LambdaWork) have none, and isCompleted()
// stays false for them even after wait(). Answered once per Work type.
bool workReportsCompletion(const c10::intrusive_ptr<c10d::Work>& work);

// The ops of one group that run in issue order: its CPU ops or its CUDA ops.
inline int64_t laneOf(const TrackedOp& op) {
  return (int64_t(op.pg_index) << 1) | int64_t(op.on_gpu);
}

// A Work the watchdog is done with, waiting to be dropped on a caller's thread.
struct FinishedWork {
  c10::intrusive_ptr<c10d::Work> work;
  bool worker_may_hold_work = true;
};

// Gloo fails an op with its own timeout error at the group's timeout, often a
// poll before the watchdog's own check would fire: an error this close to the
// deadline is a timeout. Shared by the watchdog and FrWork's raised errors.
inline bool failedAtTimeout(int64_t elapsed_ns, int64_t timeout_ms) {
  return timeout_ms > 0 && elapsed_ns >= timeout_ms * 900000LL;
}

// What FrWork knows of an op whose failure the caller saw (noteFailure).
struct NotedFailure {
  int64_t record_id = -1;
  int32_t pg_index = -1;
  OpKind op = OpKind::kBarrier;
  int64_t seq = 0;
  bool p2p = false;
  int64_t timeout_ms = 0;
  int64_t created_mono_ns = 0;
  std::exception_ptr error;
};

struct Incident {
  std::string reason; // timeout | error
  std::string detail;
  int32_t pg_index = -1;
  std::vector<int64_t> group_ranks; // the op's group, global ranks: a failure there may follow a member's leaving
};

// One thread per process, serving every frnccl group. Owns the list of
// in-flight ops. Lock: mutex_ guards incoming_, failures_ and finished_works_; the in-flight list is
// touched by the watchdog thread alone, so polling never blocks enqueuers.
class Watchdog {
 public:
  using IncidentHandler = std::function<void(const Incident&)>;

  Watchdog(int64_t poll_ms, IncidentHandler on_incident);
  ~Watchdog(); // asks the thread to stop; never joins (see stop())
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void track(TrackedOp op);
  // Joins within `timeout_ms`; detaches a thread that does not stop in time.
  // The thread's last pass hands every Work it holds to releaseFinished(), so
  // after a true return (joined) a call to it on the caller's thread leaves
  // the watchdog holding no Work.
  bool stop(int64_t timeout_ms);
  // One pass over the in-flight ops on the caller's thread, which it binds to
  // each CUDA op's device: for tests, which drive passes one by one.
  void pollNow();
  // Wakes the thread for a pass and waits, up to `timeout_ms`, until a pass
  // that began after this call has ended, so that a dump shows the ops that
  // completed just before it rather than the last periodic poll's view (10 ms
  // old while ops are in flight, up to the idle pause otherwise). The pass
  // runs on the watchdog thread, not here: a driver call that hangs there
  // never holds up the caller (the monitor). False if none ended in time.
  bool awaitFreshPoll(int64_t timeout_ms);
  // A failure the caller saw before the op's Work reported it: Gloo fails the
  // Work's future before it marks the Work completed, so a process that exits
  // on that error could otherwise leave before any poll saw the failure. Also
  // the only news of a failure of an op already settled by a later op of its
  // lane, which the watchdog no longer follows.
  void noteFailure(NotedFailure failure);
  // The caller's wait() on the op returned without error at `wall_ns`. Some
  // inner Works never report isCompleted(), even after wait() (Gloo's
  // reduce_scatter family, torch 2.11-2.13), and which ones changes with the
  // torch version: a wait that returned is proof of completion for any of them.
  // For the others it dates the completion closer than a poll can (a poll may
  // come up to FRNCCL_WATCHDOG_POLL_MS later): the slow-rank detector compares
  // the ranks' waits to a millisecond. Appends to a vector, which the poll swaps
  // with its own: no allocation per op once both have grown.
  void noteCompletion(int64_t record_id, int64_t wall_ns);
  // Drops the Works of finished ops. Call it from an op-issuing or Python
  // thread, never from ours: the last reference to a Work can free tensors
  // whose Python objects need the GIL, and a culprit that holds the GIL in a
  // C call would then stop the watchdog (and with it timeout detection).
  // A Work still referenced elsewhere that an inner backend's worker thread
  // may hold (Gloo's) is kept for a later call, so that the reference dropped
  // last is this caller's, not the worker's: torch's Gloo worker dropping the
  // last one while the interpreter finalizes aborts the process
  // ("terminate called without an active exception"). `settle_ms` > 0 (at
  // exit and teardown): wait up to that long for such Works, then drop every one.
  void releaseFinished(int64_t settle_ms = 0);

  int64_t heartbeat() const {
    return heartbeat_.load(std::memory_order_relaxed);
  }
  int64_t lastBeatWallNs() const {
    return last_beat_wall_ns_.load(std::memory_order_relaxed);
  }
  WatchdogHealth health() const;

 private:
  void run();
  void pollOnce();
  void finalPass(); // on the watchdog thread, as it stops
  void handOver(std::vector<FinishedWork> finished);
  // Tickets of ops without a Work known complete, and not yet known complete;
  // places catch-up end events (StreamOrder.hpp).
  std::pair<std::unordered_set<uint64_t>, std::unordered_set<uint64_t>> settleInOrder(int64_t now_mono);

  const int64_t poll_ms_;
  IncidentHandler on_incident_;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<TrackedOp> incoming_;
  std::unordered_map<int64_t, NotedFailure> failures_; // by record id
  std::vector<std::pair<int64_t, int64_t>> completions_; // (record id, wall ns), noteCompletion
  std::vector<std::pair<int64_t, int64_t>> completions_polled_; // the poll's (watchdog thread)
  std::vector<FinishedWork> finished_works_; // see releaseFinished()
  std::atomic<bool> have_finished_works_{false}; // set by handOver()
  // Coarse-clock time after which Works kept by releaseFinished() (still
  // shared) are looked at again; 0 when none are kept.
  std::atomic<int64_t> recheck_kept_after_ns_{0};
  bool stopping_ = false;
  // Passes asked for by awaitFreshPoll(), and the latest asked-for pass that
  // has ended (mutex_); served_cv_ wakes its waiters.
  int64_t passes_wanted_ = 0;
  int64_t passes_served_ = 0;
  std::condition_variable served_cv_;

  std::mutex poll_mutex_; // serialises pollOnce between the thread and pollNow
  // incoming_'s other buffer (poll_mutex_): a poll swaps the two under mutex_
  // and moves the ops out after releasing it, so enqueuers never wait behind
  // that move, and both buffers keep their capacity.
  std::vector<TrackedOp> draining_;
  std::deque<TrackedOp> in_flight_;
  bool incident_reported_ = false;
  // The newest completed collective per Gloo lane (laneOf()), and when: it settles the lane's older
  // collectives whose Works cannot report completion.
  struct LaneMark {
    int64_t record_id = -1;
    int64_t wall_ns = 0;
  };
  std::unordered_map<int64_t, LaneMark> last_completed_collective_;

  std::atomic<int64_t> heartbeat_{0};
  std::atomic<int64_t> last_beat_wall_ns_{0};
  std::atomic<double> max_lag_ms_{0};
  std::atomic<double> lag_sum_ms_{0};
  std::atomic<int64_t> lag_count_{0};

  BoundedThread thread_; // last: starts once every member above exists
};

} // namespace frnccl
