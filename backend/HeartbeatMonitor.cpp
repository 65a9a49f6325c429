// The monitor thread and what reaches it from this process: the local request
// queue (the watchdog's incidents, the dump signal, fr_backend.dump()), waiting
// for idle, leaving the job, and the watchdog's heartbeat check. The store
// protocol is in MonitorCoordination.cpp, dump writing in MonitorDumps.cpp.
#include "HeartbeatMonitor.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "Clock.hpp"
#include "MonitorDetail.hpp"

namespace frnccl {

using namespace monitor_detail;

namespace {

// FRNCCL_TEST_WAIT_BOUND_MS: the tests' way to see a bound pass in seconds.
// Below a second (or not a number) it is ignored: a tiny bound would make
// every idle rank wake itself, and ask the store, on every monitor tick.
int64_t waitBoundMs() {
  const char* v = std::getenv("FRNCCL_TEST_WAIT_BOUND_MS");
  const int64_t ms = v != nullptr ? std::atoll(v) : 0;
  return ms >= 1000 ? ms : StoreWaiter::kWaitBoundMs;
}

constexpr const char* kJobTagKey = "frnccl/job_tag";

} // namespace

Config HeartbeatMonitor::withJobTag(Config config, const c10::intrusive_ptr<c10d::Store>& store) {
  config.job_tag = config.job_id.empty() ? std::string() : jobTagOf(config.job_id);
  if (!store) {
    return config;
  }
  try {
    // The store is the job's: its ranks, its lives and the restarts that keep it share it, and two jobs never
    // do. The first rank's guess (unique to its process and moment) stays; the rest read it in the same call.
    const std::string guess = jobTagOf(config.job_id + "\n" + config.hostname + "\n" + std::to_string(getpid()) +
                                       "\n" + std::to_string(wallNs()) + "\n" + std::to_string(monoNs()));
    const std::string held = text(store->compareSet(kJobTagKey, {}, bytes(guess)));
    // Any client of the store may have written it: a value that is no tag is hashed into one.
    config.job_tag = validJobTag(held) ? held : jobTagOf(held);
  } catch (const std::exception&) {
    // registerWithStore, next, says that the store cannot be reached.
  }
  return config;
}

bool HeartbeatMonitor::noteSignal() {
  if (g_running_monitors.load() <= 0) {
    return false;
  }
  g_signal_pending.store(true);
  return true;
}

void HeartbeatMonitor::forgetMonitorsAfterFork() {
  g_running_monitors.store(0);
}

void HeartbeatMonitor::notePythonFinalizing() {
  g_python_finalizing.store(true);
}

bool HeartbeatMonitor::pythonFinalizing() {
  return g_python_finalizing.load();
}

HeartbeatMonitor::HeartbeatMonitor(
    Config config,
    c10::intrusive_ptr<c10d::Store> store,
    std::function<WatchdogHealth()> watchdog_health,
    std::function<int64_t()> watchdog_heartbeat,
    std::function<bool(int64_t)> await_fresh_poll)
    : config_(withJobTag(std::move(config), store)),
      have_store_(store != nullptr),
      store_(std::move(store)),
      watchdog_health_(std::move(watchdog_health)),
      watchdog_heartbeat_(std::move(watchdog_heartbeat)),
      await_fresh_poll_(std::move(await_fresh_poll)),
      clone_mutex_(std::make_shared<std::mutex>()),
      // Without a waiter (no store, or one whose wait() polls), needsPoll polls every coord_check_ms.
      waiter_(store_ && StoreWaiter::pushes(*store_)
                  ? std::make_unique<StoreWaiter>(store_, wakeKey(config_.rank), clone_mutex_, waitBoundMs())
                  : nullptr),
      seen_request_seq_(registerWithStore()),
      heartbeat_changed_mono_ns_(monoNs()),
      storm_(config_.dump_min_interval_ms, config_.dump_max_count),
      thread_("frnccl-monitor", [this] { run(); }) {} // never touches CUDA

HeartbeatMonitor::~HeartbeatMonitor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all(); // BoundedThread's destructor detaches; stop() is the joining path
}

bool HeartbeatMonitor::stop(int64_t timeout_ms) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  written_cv_.notify_all();
  if (!thread_.join(timeout_ms)) {
    logLine(config_, "monitor did not stop within %lld ms (a dump is in progress); leaving it behind", static_cast<long long>(timeout_ms));
    return false;
  }
  return true;
}

bool HeartbeatMonitor::stopping() {
  std::lock_guard<std::mutex> lock(mutex_);
  return stopping_;
}

bool HeartbeatMonitor::sleepFor(int64_t ms) {
  std::unique_lock<std::mutex> lock(mutex_);
  // Only stop() cuts the pause short. A queued request does not: it is served
  // once the incident in progress is done, and waking for it would return at
  // once on every call while it waits, polling the store in a tight loop.
  cv_.wait_for(lock, std::chrono::milliseconds(ms), [&] { return stopping_; });
  return !stopping_;
}

void HeartbeatMonitor::requestJobDump(std::string reason, std::string detail, After after, std::vector<int64_t> group_ranks) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({std::move(reason), std::move(detail), true, std::move(after), nullptr, std::move(group_ranks)});
  }
  cv_.notify_all();
}

std::string HeartbeatMonitor::dumpLocal(const std::string& reason, int64_t timeout_ms) {
  auto result = std::make_shared<std::promise<std::string>>();
  std::future<std::string> future = result->get_future();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      throw std::runtime_error("frnccl: the dump thread has stopped (process group destroyed)");
    }
    queue_.push_back({reason, "requested through fr_backend.dump()", false, nullptr, result});
  }
  cv_.notify_all();
  if (future.wait_for(std::chrono::milliseconds(timeout_ms)) != std::future_status::ready) {
    throw std::runtime_error("frnccl: dump not written within " + std::to_string(timeout_ms) +
                             " ms: the dump thread is stuck, or still busy with earlier incidents");
  }
  return future.get();
}

void HeartbeatMonitor::waitIdle(int64_t timeout_ms) {
  const int64_t deadline = monoNs() + timeout_ms * 1000000LL;
  DoneCount seen;
  while (monoNs() < deadline) {
    bool idle = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      idle = queue_.empty() && !busy_ && joined_.empty();
    }
    // A rank that leaves while others still dump can get the job torn down
    // (torchrun stops every worker when one exits) before the slowest rank,
    // often the culprit, has written.
    if (idle && incidentComplete(seen)) {
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    // While something waits on us, look at the store on every pass.
    pollSoon();
  }
}

void HeartbeatMonitor::run() {
  struct Running {
    Running() {
      g_running_monitors.fetch_add(1);
    }
    ~Running() {
      g_running_monitors.fetch_sub(1);
    }
  } running;
  while (true) {
    std::deque<LocalRequest> batch;
    std::shared_ptr<std::promise<void>> leaving;
    bool stop_now = false;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait_for(lock, std::chrono::milliseconds(kLoopTickMs), [&] { return stopping_ || !queue_.empty() || leaving_; });
      stop_now = stopping_;
      if (stopping_) {
        for (auto& r : queue_) {
          if (r.result) {
            r.result->set_exception(std::make_exception_ptr(std::runtime_error("frnccl: process group destroyed before the dump")));
          }
        }
        queue_.clear();
        if (leaving_) {
          leaving_->set_value();
          leaving_.reset();
        }
      } else {
        batch.swap(queue_);
        leaving.swap(leaving_);
        busy_ = !batch.empty() || leaving;
      }
    }
    if (stop_now) {
      releaseWaiter(); // outside mutex_: it may call the store
      return;
    }
    if (g_signal_pending.exchange(false)) {
      batch.push_back({"signal", "dump signal received by rank " + std::to_string(config_.rank), true, nullptr, nullptr});
      std::lock_guard<std::mutex> lock(mutex_);
      busy_ = true;
    }
    for (auto& request : batch) {
      serveLocal(std::move(request));
    }
    const int64_t now = monoNs();
    // A failed waiting connection is looked into before any poll: a poll of a
    // store whose host left would print torch's warning once more.
    // While it settles (checkWaiterConnection), no store call at all: each would print torch's warning
    // and backtrace if the host is ending.
    const bool settling = have_store_ && checkWaiterConnection();
    if (have_store_ && !settling && needsPoll(now)) {
      last_store_poll_mono_ns_ = now;
      status_due_ = status_due_ || !waiter_ || !waiter_->listening(); // polled: no wake tells of a request
      pollStore(); // once the store is lost, serves joined requests locally without calling it
    }
    if (have_store_ && !settling) {
      answerStatusIfDue(now);
    }
    if (have_store_ && !settling) {
      takeOverJoined();
    }
    if (!settling && compact_left_at_mono_ns_ != 0 && now >= compact_left_at_mono_ns_) {
      compact_left_at_mono_ns_ = 0;
      compactLeftRanks();
    }
    checkWatchdog();
    if (leaving) {
      serveBeforeLeaving();
      leaving->set_value();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    busy_ = false;
  }
}

bool HeartbeatMonitor::leave(int64_t timeout_ms) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> left = done->get_future();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ || !storeUsable()) {
      return true; // no thread to ask, or no store to tell
    }
    leaving_ = done;
  }
  cv_.notify_all();
  return left.wait_for(std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0))) == std::future_status::ready;
}

void HeartbeatMonitor::serveLocal(LocalRequest request) {
  if (!request.job_wide || !have_store_) {
    DumpRequest dump;
    dump.incident_id = newIncidentId(request.reason, config_.rank, config_.job_tag);
    dump.reason = request.reason;
    dump.detail = request.detail;
    dump.trigger_rank = config_.rank;
    dump.symbolize = request.reason != "teardown";
    bool answered = false;
    writeOwnDump(dump, [&](const std::string& dir) {
      if (request.result) {
        request.result->set_value(dir);
        answered = true;
      }
    });
    if (request.result && !answered) {
      request.result->set_exception(std::make_exception_ptr(std::runtime_error("frnccl: dump failed; see the log line above")));
    }
    if (request.after) {
      request.after(dump.incident_id);
    }
    return;
  }

  // A signal is anyone's to send (a storm of them would make every rank
  // write one dump each); a failure this process saw is always dumped.
  if (request.reason == "signal") {
    if (!admitJobDump(request.reason, "dump signal")) {
      return;
    }
  }
  const std::string cascade_of = cascadeOf(request.reason);
  if (!cascade_of.empty()) {
    logLine(config_, "%s; not dumping again: this rank wrote its part of incident %s %.1f s ago, which this failure follows", request.detail.c_str(), cascade_of.c_str(), double(monoNs() - last_failure_written_mono_ns_) / 1e9);
    if (request.after) {
      request.after(cascade_of);
    }
    return;
  }
  const auto [left_incident, leaver] = leaverOf(request);
  if (!left_incident.empty()) {
    logLine(config_, "%s; not dumping again: rank %lld of this op's group left the job with an uncaught exception in incident %s, which this failure follows", request.detail.c_str(), static_cast<long long>(leaver), left_incident.c_str());
    if (request.after) {
      request.after(left_incident);
    }
    return;
  }

  startIncident(std::move(request), "");
}

bool HeartbeatMonitor::admitJobDump(const std::string& reason, const std::string& what) {
  const int64_t now = monoNs();
  std::string why;
  if (storm_.admit(isFailure(reason) || reason == "watchdog_stuck", now, why)) {
    return true;
  }
  int64_t dropped = 0;
  if (storm_.logDrop(now, dropped)) {
    logLine(config_, "%s dropped: %s; %lld dropped since the last such line", what.c_str(), why.c_str(), static_cast<long long>(dropped));
  }
  return false;
}

void HeartbeatMonitor::checkWatchdog() {
  if (!watchdog_heartbeat_ || config_.heartbeat_timeout_ms <= 0) {
    return;
  }
  const int64_t beat = watchdog_heartbeat_();
  const int64_t now = monoNs();
  if (beat != last_heartbeat_) {
    last_heartbeat_ = beat;
    heartbeat_changed_mono_ns_ = now;
    return;
  }
  if (now - heartbeat_changed_mono_ns_ < config_.heartbeat_timeout_ms * 1000000LL) {
    return;
  }
  const std::string detail = "watchdog thread stuck for more than " + std::to_string(config_.heartbeat_timeout_ms / 1000) + " s";
  watchdog_stuck_ = true;
  // Set on this thread by whichever incident serves the request.
  auto served = std::make_shared<std::string>();
  serveLocal({"watchdog_stuck", detail, true, [served](const std::string& id) { *served = id; }, nullptr});
  // A request that joined another rank's incident is served when that
  // incident's request arrives, or when it takes the incident over: after
  // the exit nothing would, so this thread goes on doing the monitor's store
  // work here, bounded by the grace and one dump deadline.
  const int64_t deadline = monoNs() + (kJoinedRequestGraceMs + kMissingRequestGraceMs + config_.dump_timeout_ms) * 1000000LL;
  while (served->empty() && storeUsable() && monoNs() < deadline && sleepFor(kLoopTickMs)) {
    if (monoNs() - last_store_poll_mono_ns_ >= config_.coord_check_ms * 1000000LL) {
      last_store_poll_mono_ns_ = monoNs();
      pollStore();
    }
    takeOverJoined();
  }
  if (served->empty()) {
    // No incident came in time: this rank's state at least.
    DumpRequest dump;
    dump.incident_id = newIncidentId("watchdog_stuck", config_.rank, config_.job_tag) + "-local";
    dump.reason = "watchdog_stuck";
    dump.detail = detail;
    dump.trigger_rank = config_.rank;
    writeOwnDump(dump);
  } else {
    // Under torchrun this exit stops every rank: let them finish writing.
    awaitIncident(*served);
  }
  logLine(config_, "%s: dumps written; ending the process (FRNCCL_HEARTBEAT_TIMEOUT_SEC)", detail.c_str());
  std::_Exit(6);
}

std::string HeartbeatMonitor::cascadeOf(const std::string& reason) const {
  // When one rank dies or hangs, the others' ops fail one after another over
  // seconds. Each would open its own job-wide incident (or, with the store
  // host gone, a local one); the first incident already holds their state.
  // That incident ends at most one dump deadline after this rank wrote; the
  // peers' failures can surface only once it ends (its trigger exits), so the
  // window is two deadlines.
  if (!isFailure(reason) || last_failure_incident_.empty() ||
      monoNs() - last_failure_written_mono_ns_ > 2 * config_.dump_timeout_ms * 1000000LL) {
    return "";
  }
  return last_failure_incident_;
}

std::pair<std::string, int64_t> HeartbeatMonitor::leaverOf(const LocalRequest& request) {
  // That member's process is gone (its exit hook opened the incident), so no op of the group can complete
  // in this life: whatever fails there now is its leaving's doing, not a new fault. A new life makes a
  // new monitor, and forgets it.
  if (!isFailure(request.reason)) {
    return {"", -1};
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (const int64_t r : request.group_ranks) {
    const auto it = left_with_exception_.find(r);
    if (r != config_.rank && it != left_with_exception_.end()) {
      return {it->second, r};
    }
  }
  return {"", -1};
}

} // namespace frnccl
