#include "Watchdog.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <typeindex>
#include <unordered_set>

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <pthread.h>

#include "Clock.hpp"
#include "ErrorText.hpp"
#include "StreamOrder.hpp"

namespace frnccl {

namespace {

DeviceMarkerFactory g_marker_factory = nullptr;

constexpr int64_t kBusyPollMs = 10;
// An op whose Work never reports completion and that is neither waited for
// nor followed by another op of its lane stays followed: cap what the watchdog
// follows so memory stays bounded.
constexpr size_t kMaxInFlight = 65536;

FinishedWork finishedWorkOf(TrackedOp& op) {
  return {std::move(op.work), op.worker_may_hold_work};
}

std::string describe(OpKind op, int64_t seq, const PgInfo& pg) {
  return "pg " + pg.name + " (" + pg.desc + ") " + (isP2P(op) ? "p2p" : "collective") + " seq " +
      std::to_string(seq) + " " + opName(op);
}

std::string describe(const TrackedOp& op, const PgInfo& pg) {
  return describe(op.op, op.seq, pg);
}

// A failure as an incident: a timeout when it came at the op's deadline.
Incident incidentOf(OpKind op, int64_t seq, int32_t pg_index, int64_t age_ns, int64_t timeout_ms,
                    const std::exception_ptr& error, const std::vector<PgInfo>& pgs) {
  const std::string what = describe(op, seq, pgs.at(pg_index));
  if (failedAtTimeout(age_ns, timeout_ms)) {
    return Incident{"timeout", "timeout on " + what + " after " + std::to_string(timeout_ms) + " ms (" + oneLineErrorText(error) + ")", pg_index};
  }
  return Incident{"error", "error on " + what + ": " + oneLineErrorText(error), pg_index};
}

} // namespace

bool workReportsCompletion(const c10::intrusive_ptr<c10d::Work>& work) {
  if (!work) {
    return true;
  }
  // Per thread: ops are issued from few threads, and the answer never changes for a type. Asking costs a
  // c10::Error (with its backtrace) for a Work without a future, so it is asked once.
  thread_local std::unordered_map<std::type_index, bool> known;
  const std::type_index type(typeid(*work));
  auto it = known.find(type);
  if (it != known.end()) {
    return it->second;
  }
  bool reports = false;
  try {
    reports = work->getFuture() != nullptr;
  } catch (...) {
    reports = false;
  }
  known.emplace(type, reports);
  return reports;
}

DeviceMarkerFactory deviceMarkerFactory() {
  return g_marker_factory;
}
void setDeviceMarkerFactory(DeviceMarkerFactory factory) {
  g_marker_factory = factory;
}

Watchdog::Watchdog(int64_t poll_ms, IncidentHandler on_incident)
    : poll_ms_(std::max<int64_t>(poll_ms, 1)),
      on_incident_(std::move(on_incident)),
      // CUDA device: bound per op by the markers it polls (CudaMarker.cpp).
      thread_("frnccl-watchdog", [this] { run(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all(); // BoundedThread's destructor detaches; stop() is the joining path
  served_cv_.notify_all();
}

bool Watchdog::stop(int64_t timeout_ms) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  served_cv_.notify_all();
  if (!thread_.join(timeout_ms)) {
    LOG(WARNING) << "frnccl: watchdog did not stop within " << timeout_ms << " ms; leaving it behind";
    return false;
  }
  return true;
}

void Watchdog::track(TrackedOp op) {
  std::lock_guard<std::mutex> lock(mutex_);
  incoming_.push_back(std::move(op));
}

void Watchdog::run() {
  int64_t wait_ms = kBusyPollMs;
  int64_t serving = 0; // the latest pass asked for when this pass began
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (serving > passes_served_) {
        passes_served_ = serving;
        served_cv_.notify_all();
      }
      cv_.wait_for(lock, std::chrono::milliseconds(wait_ms), [&] { return stopping_ || passes_wanted_ > passes_served_; });
      if (stopping_) {
        lock.unlock();
        finalPass();
        return;
      }
      serving = passes_wanted_;
    }
    bool busy = false;
    {
      std::lock_guard<std::mutex> poll_lock(poll_mutex_);
      pollOnce();
      busy = !in_flight_.empty();
    }
    // Poll briskly while ops are in flight, back off when idle.
    wait_ms = busy ? kBusyPollMs : std::min(wait_ms * 2, poll_ms_);
  }
}

bool Watchdog::awaitFreshPoll(int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (stopping_) {
    return false;
  }
  const int64_t mine = ++passes_wanted_;
  cv_.notify_all();
  served_cv_.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0)), [&] {
    return stopping_ || passes_served_ >= mine;
  });
  return passes_served_ >= mine;
}

void Watchdog::finalPass() {
  std::lock_guard<std::mutex> poll_lock(poll_mutex_);
  pollOnce();
  // The Works of ops still in flight go to the caller of stop() too, so that
  // a process that goes on after destroy_process_group does not keep their
  // tensors alive through a watchdog that no longer runs. Their entries stay
  // as they are: not completed.
  std::vector<FinishedWork> rest;
  rest.reserve(in_flight_.size());
  for (auto& op : in_flight_) {
    rest.push_back(finishedWorkOf(op));
  }
  in_flight_.clear(); // markers go back to their pool
  handOver(std::move(rest));
}

void Watchdog::pollNow() {
  std::lock_guard<std::mutex> poll_lock(poll_mutex_);
  pollOnce();
}

namespace {

// Ops without a Work (synchronous NCCL ops) are followed through their place
// in stream order; ticket 0 means "ask this one directly".
uint64_t orderedTicket(const TrackedOp& op) {
  return (op.marker && !op.work) ? op.marker->ticket() : 0;
}

// torch's NCCL watchdog sleeps 100 ms between loops and publishes completions
// once per loop: an op it settles, done just before its deadline, is given
// this much longer before it is called timed out.
constexpr int64_t kTorchWatchdogLagNs = 200 * 1000 * 1000;

// With sampled end events (FRNCCL_END_EVENT_INTERVAL_US > 0), the last op of a
// burst that has no end event of its own gets one from the watchdog once it is
// this old: long enough that a stream still in use has placed one itself.
constexpr int64_t kCatchUpAfterNs = 2 * 1000 * 1000;

} // namespace

std::pair<std::unordered_set<uint64_t>, std::unordered_set<uint64_t>> Watchdog::settleInOrder(int64_t now_mono) {
  // Per stream, bisect for the first end event still pending: every op placed
  // before the last completed one is done (StreamOrder.hpp). A poll then costs
  // a handful of driver queries, not one per op in flight, which would
  // contend with the training thread's kernel launches for the driver.
  std::map<std::pair<int, uint64_t>, std::vector<TrackedOp*>> by_stream;
  for (auto& op : in_flight_) {
    if (orderedTicket(op) != 0) {
      by_stream[{op.marker->device(), op.marker->stream()}].push_back(&op);
    }
  }
  std::unordered_set<uint64_t> settled;
  std::unordered_set<uint64_t> pending;
  for (auto& entry : by_stream) {
    auto& ops = entry.second;
    std::sort(ops.begin(), ops.end(), [](const TrackedOp* a, const TrackedOp* b) {
      return a->marker->ticket() < b->marker->ticket();
    });
    const size_t done = countSettled(
        ops.size(),
        [&](size_t i) { return ops[i]->marker->knowsCompletion(); },
        [&](size_t i) {
          ops[i]->marker->bindThread();
          return ops[i]->marker->completed();
        });
    for (size_t i = 0; i < ops.size(); ++i) {
      (i < done ? settled : pending).insert(ops[i]->marker->ticket());
    }
    TrackedOp* last = ops.back();
    if (done < ops.size() && !last->marker->knowsCompletion() && now_mono - last->created_mono_ns >= kCatchUpAfterNs) {
      if (last->marker->placeEndEventNow()) {
        pending.insert(last->marker->ticket()); // its new place; settled on a later poll
      }
    }
  }
  return {std::move(settled), std::move(pending)};
}

void Watchdog::handOver(std::vector<FinishedWork> finished) {
  finished.erase(
      std::remove_if(finished.begin(), finished.end(), [](const FinishedWork& f) { return !f.work; }),
      finished.end());
  if (finished.empty()) {
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& work : finished) {
    finished_works_.push_back(std::move(work));
  }
  have_finished_works_.store(true, std::memory_order_release);
}

void Watchdog::releaseFinished(int64_t settle_ms) {
  if (!have_finished_works_.load(std::memory_order_acquire)) {
    // Kept Works alone are looked at again only now and then: a caller that
    // holds many async Works must not make every op scan them.
    const int64_t recheck_ns = recheck_kept_after_ns_.load(std::memory_order_relaxed);
    if (recheck_ns == 0 || (settle_ms <= 0 && coarseMonoNs() < recheck_ns)) {
      return;
    }
  }
  std::vector<FinishedWork> finished;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished.swap(finished_works_);
    have_finished_works_.store(false, std::memory_order_release);
    recheck_kept_after_ns_.store(0, std::memory_order_relaxed);
  }
  const int64_t deadline_ns = settle_ms > 0 ? monoNs() + settle_ms * 1000000 : 0;
  while (true) {
    // Let go of here: unshared Works are destroyed on the caller's thread,
    // which may take the GIL; shared ones that no inner backend's thread
    // holds are left to their other holder, the caller's Python reference.
    finished.erase(
        std::remove_if(
            finished.begin(),
            finished.end(),
            [](const FinishedWork& f) { return !f.worker_may_hold_work || f.work.use_count() == 1; }),
        finished.end());
    if (finished.empty() || settle_ms <= 0 || monoNs() >= deadline_ns) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (finished.empty() || settle_ms > 0) {
    return; // at exit, what is still shared after the wait is dropped anyway
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& work : finished) {
    finished_works_.push_back(std::move(work));
  }
  recheck_kept_after_ns_.store(coarseMonoNs() + kBusyPollMs * 1000 * 1000, std::memory_order_relaxed);
}

void Watchdog::noteFailure(NotedFailure failure) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t id = failure.record_id;
  failures_.emplace(id, std::move(failure));
}

void Watchdog::noteCompletion(int64_t record_id, int64_t wall_ns) {
  std::lock_guard<std::mutex> lock(mutex_);
  completions_.emplace_back(record_id, wall_ns);
}

void Watchdog::pollOnce() {
  std::unordered_map<int64_t, NotedFailure> failures;
  completions_polled_.clear();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    incoming_.swap(draining_);
    failures.swap(failures_);
    completions_polled_.swap(completions_);
  }
  std::unordered_map<int64_t, int64_t> completions; // record id -> wall ns of the caller's wait
  for (const auto& [id, wall_ns] : completions_polled_) {
    completions.emplace(id, wall_ns);
  }
  for (auto& op : draining_) {
    in_flight_.push_back(std::move(op));
  }
  draining_.clear();
  Recorder& recorder = Recorder::get();
  std::vector<FinishedWork> finished;
  while (in_flight_.size() > kMaxInFlight) {
    recorder.retire(in_flight_.front().record_id, /*failed=*/false);
    finished.push_back(finishedWorkOf(in_flight_.front()));
    in_flight_.pop_front();
  }
  const int64_t now_mono = coarseMonoNs(); // the clock of TrackedOp::created_mono_ns
  const int64_t now_wall = wallNs();
  std::vector<PgInfo> pgs; // loaded lazily: only needed to describe an incident
  std::unordered_set<int64_t> lane_busy; // lanes (laneOf) with an earlier op still running
  // Streams with a timed op whose GPU start has not fired: the ops queued behind it there have not started
  // either, so their start events need no driver call (each one contends with the caller's launches).
  std::set<std::pair<int, uint64_t>> start_pending;
  // A collective whose Work cannot report completion is done once a later
  // collective of its lane completed: the program has moved past it, and the
  // peers that completed the later one issued this one first. Ops whose Works
  // do report are left to them: Gloo may run a group's ops on several
  // threads, so a later op can finish first. A p2p op involves one peer, so
  // no other op proves it done, nor does it prove anything of a collective.
  std::unordered_map<int64_t, int64_t> settled_by_lane; // record id -> wall ns
  for (auto& op : in_flight_) {
    if (op.completion_reported || op.on_gpu || isP2P(op.op)) {
      continue;
    }
    auto done = last_completed_collective_.find(laneOf(op));
    if (done != last_completed_collective_.end() && done->second.record_id > op.record_id) {
      settled_by_lane.emplace(op.record_id, done->second.wall_ns);
    }
  }

  const auto [settled, pending] = settleInOrder(now_mono);
  std::vector<Recorder::Progress> progress;
  // Reported after this pass's progress is in the recorder: the dump it leads
  // to must show the ops that completed alongside the failed one as completed.
  std::optional<Incident> incident;

  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    TrackedOp& op = *it;
    bool completed = false;
    std::exception_ptr error;
    const uint64_t ticket = orderedTicket(op);
    try {
      if (ticket != 0 && (settled.count(ticket) || pending.count(ticket))) {
        completed = settled.count(ticket) != 0;
      } else {
        if (!op.work && !op.marker) {
          completed = true; // a blocking op: done on return
        } else if (op.work) {
          if (op.marker) {
            op.marker->bindThread();
          }
          completed = op.work->isCompleted();
          if (completed) {
            error = op.work->exception();
          }
        }
        if (op.marker && (!op.work || completed)) {
          completed = op.marker->completed();
        }
      }
    } catch (...) {
      completed = true;
      error = std::current_exception();
    }
    if (!completed && !failures.empty()) {
      auto seen = failures.find(op.record_id);
      if (seen != failures.end()) {
        completed = true;
        error = seen->second.error;
        failures.erase(seen);
      }
    }
    int64_t completed_wall = now_wall;
    if (!completions.empty()) {
      // Either proof of completion (a Work that never says), or an earlier date for one this poll found done.
      auto waited = completions.find(op.record_id);
      if (waited != completions.end() && !error) {
        completed = true;
        completed_wall = std::min(waited->second, now_wall);
      }
    }
    if (!completed && !settled_by_lane.empty()) {
      auto by_lane = settled_by_lane.find(op.record_id);
      if (by_lane != settled_by_lane.end()) {
        completed = true;
        completed_wall = std::min(by_lane->second, now_wall);
      }
    }
    if (completed && op.started) {
      // A wait noted just after the pass that saw the op start: its time may be the earlier one.
      completed_wall = std::max(completed_wall, op.started_wall_ns);
    }

    // A group's CPU ops, and its CUDA ops, run in order: an op has started once everything
    // issued before it in its lane has finished (or its GPU start event fired).
    if (!op.started) {
      const bool lane_waits = lane_busy.count(laneOf(op)) != 0;
      // The driver is asked last: a call less per op that completed between two polls, as most do.
      bool gpu_started = false;
      if (!completed && lane_waits && op.marker && op.marker->timed()) {
        const std::pair<int, uint64_t> stream{op.marker->device(), op.marker->stream()};
        if (start_pending.count(stream) == 0) {
          gpu_started = op.marker->started();
          if (!gpu_started) {
            start_pending.insert(stream);
          }
        }
      }
      if (completed || !lane_waits || gpu_started) {
        op.started = true;
        op.started_wall_ns = completed ? completed_wall : now_wall;
        progress.push_back({op.record_id, op.started_wall_ns, false});
      }
    }

    if (completed) {
      for (int64_t member : op.member_ids) {
        if (error) {
          recorder.retire(member, /*failed=*/true);
        } else {
          progress.push_back({member, completed_wall, true});
        }
      }
      if (error) {
        recorder.retire(op.record_id, /*failed=*/true);
        if (!incident_reported_) {
          incident_reported_ = true;
          if (pgs.empty()) {
            pgs = recorder.pgs();
          }
          incident = incidentOf(op.op, op.seq, op.pg_index, now_mono - op.created_mono_ns, op.timeout_ms, error, pgs);
        }
      } else {
        int64_t gpu_start = 0, gpu_end = 0;
        float duration = -1.f;
        if (op.marker && op.marker->timed()) {
          op.marker->gpuTimes(gpu_start, gpu_end, duration);
        } else if (op.work) {
          try {
            duration = op.work->getDuration();
          } catch (...) {
            duration = -1.f; // timing off in the inner backend
          }
        }
        progress.push_back({op.record_id, completed_wall, true, duration, gpu_start, gpu_end});
        if (!op.on_gpu && !isP2P(op.op)) {
          auto& last = last_completed_collective_[laneOf(op)];
          if (op.record_id > last.record_id) {
            last = {op.record_id, completed_wall};
          }
        }
        if (duration >= 0) {
          // How much later than the op itself the watchdog noticed it: large
          // values mean contention on the CUDA API or a starved watchdog.
          const double lag_ms = double(completed_wall - op.started_wall_ns) / 1e6 - duration;
          lag_sum_ms_.store(lag_sum_ms_.load() + lag_ms);
          lag_count_.fetch_add(1);
          if (lag_ms > max_lag_ms_.load()) {
            max_lag_ms_.store(lag_ms);
          }
        }
      }
      finished.push_back(finishedWorkOf(op));
      it = in_flight_.erase(it);
      continue;
    }

    if (op.completion_reported) {
      lane_busy.insert(laneOf(op));
    }
    const int64_t lag_ns = (op.marker && op.marker->settledByTorchWatchdog()) ? kTorchWatchdogLagNs : 0;
    if (!incident_reported_ && op.completion_reported && op.timeout_ms > 0 &&
        now_mono - op.created_mono_ns > op.timeout_ms * 1000000LL + lag_ns) {
      incident_reported_ = true;
      if (pgs.empty()) {
        pgs = recorder.pgs();
      }
      incident = Incident{"timeout", "timeout on " + describe(op, pgs.at(op.pg_index)) + " after " + std::to_string(op.timeout_ms) + " ms", op.pg_index};
    }
    ++it;
  }
  // Failures of ops no longer followed: settled by their lane before their own error came (Gloo may run a
  // group's ops on several threads), or dropped past kMaxInFlight. The caller saw the error; the job-wide
  // dump must not miss it.
  if (!incident_reported_) {
    for (const auto& [id, failure] : failures) {
      if (failure.pg_index < 0) {
        continue;
      }
      if (pgs.empty()) {
        pgs = recorder.pgs();
      }
      if (size_t(failure.pg_index) >= pgs.size()) {
        continue;
      }
      incident_reported_ = true;
      recorder.retire(id, /*failed=*/true);
      incident = incidentOf(failure.op, failure.seq, failure.pg_index, now_mono - failure.created_mono_ns,
                            failure.timeout_ms, failure.error, pgs);
      break;
    }
  }
  recorder.apply(progress);
  handOver(std::move(finished));
  if (incident) {
    if (incident->pg_index >= 0 && size_t(incident->pg_index) < pgs.size()) {
      incident->group_ranks = pgs[size_t(incident->pg_index)].global_ranks;
    }
    on_incident_(*incident);
  }
  heartbeat_.fetch_add(1, std::memory_order_relaxed);
  last_beat_wall_ns_.store(now_wall, std::memory_order_relaxed);
}

WatchdogHealth Watchdog::health() const {
  WatchdogHealth h;
  h.last_heartbeat_ns = last_beat_wall_ns_.load();
  h.max_discovery_lag_ms = max_lag_ms_.load();
  const int64_t n = lag_count_.load();
  h.mean_discovery_lag_ms = n > 0 ? lag_sum_ms_.load() / double(n) : 0.0;
  return h;
}

} // namespace frnccl
