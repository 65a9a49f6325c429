#include "HeartbeatMonitor.hpp"

#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <ctime>
#include <sstream>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "Clock.hpp"
#include "ErrorText.hpp"
#include "DeviceMarker.hpp"
#include "IncidentId.hpp"
#include "Recorder.hpp"
#include "StoreProbe.hpp"
#include "StoreValues.hpp"

namespace frnccl {

namespace {

std::atomic<bool> g_signal_pending{false};
std::atomic<bool> g_python_finalizing{false};

constexpr const char* kSeqKey = "frnccl/incident_seq";
constexpr const char* kActiveKey = "frnccl/active";
constexpr int64_t kLoopTickMs = 50;
// How long a dump that does not symbolize waits for the GIL before it reads
// thread stacks without it.
constexpr int64_t kThreadStacksGilWaitMs = 200;
// How long a dump waits for the watchdog's next pass (it takes well under a
// millisecond): a watchdog that misses it is stuck, and the monitor says so.
constexpr int64_t kFreshPollWaitMs = 200;
// Why a store call was not made, once store_lost_ is set.
constexpr const char* kStoreLostText = "its connection was lost earlier";
// A request number whose request never appeared (its trigger died between
// the two store calls) is skipped after this long. The grace runs once per
// gap: the numbers still missing when it ends are all skipped at once.
constexpr int64_t kMissingRequestGraceMs = 10000;
// How long a leaving rank waits for a request whose number is taken: a live
// trigger sets the request right after it takes the number.
constexpr int64_t kLeavingRequestWaitMs = 1000;
// How long a leaving rank waits to learn whether the store's server is there.
constexpr int64_t kLeavingProbeMs = 500;
// Ranks that left (teardown or exit) and how many: "frnccl/left/<rank>" is
// set, and the count raised, once per leaving; a process of that rank that
// registers again takes its mark back.
constexpr const char* kLeftCountKey = "frnccl/left_count";
// Only one trigger at a time publishes (it holds frnccl/active), so a rank is
// never more than a few requests behind; a bigger jump of the request number
// is a bad store value, and only its last requests are read.
constexpr int64_t kMaxRequestBacklog = 16;
// What a request read from the store may carry into a dump header.
constexpr size_t kMaxRequestReasonBytes = 64;
constexpr size_t kMaxRequestDetailBytes = 4096;
// Reconnecting after a network error: a probe of the store host's port (so a
// host that is gone costs no torch warning), then a fresh client. Tries back
// off from 1 s to 60 s; this many failures in a row end them for good, and so
// does this many connections replaced in all.
constexpr int64_t kReconnectProbeMs = 1000;
constexpr int64_t kReconnectTimeoutMs = 3000;
constexpr int kMaxReconnectFailures = 6;
constexpr int kMaxReconnects = 32;
// The store client's timeout (Runtime::attach sets the same).
constexpr int64_t kStoreTimeoutMs = 10000;

// A SIGTERM this soon after this rank wrote its part of a failure incident (or
// two dump deadlines, if longer) is that failure's aftermath: the launcher
// stopping the job once a rank exited on it.
constexpr int64_t kFailureAftermathMs = 60000;

// How long a SIGTERM that finds no incident in progress waits before it looks
// again, then writes its own.
constexpr int64_t kIncidentAfterSigtermMs = 200;

// A request that joined another incident waits at least this long after
// joining before it takes that incident over: joining polls the store at once,
// and the takeover polls again, so the request has had its chance to arrive.
constexpr int64_t kJoinedMinWaitMs = 1000;

// When the frnccl/active value "<id>|<wall ns>" was taken, by its holder's
// clock; 0 (long ago) if it cannot be read.
int64_t lockTakenNs(const std::string& held) {
  const auto bar = held.rfind('|');
  if (bar == std::string::npos) {
    return 0;
  }
  try {
    return std::stoll(held.substr(bar + 1));
  } catch (const std::exception&) {
    return 0;
  }
}

std::string requestKey(int64_t seq) {
  return "frnccl/incident/" + std::to_string(seq);
}
std::string writtenKey(const std::string& id) {
  return "frnccl/written/" + id;
}
std::string wroteKey(const std::string& id, int64_t rank) {
  return "frnccl/wrote/" + id + "/" + std::to_string(rank);
}
std::string leftKey(int64_t rank) {
  return "frnccl/left/" + std::to_string(rank);
}

bool isFailure(const std::string& reason) {
  return reason == "timeout" || reason == "error";
}

std::vector<uint8_t> bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}
std::string text(const std::vector<uint8_t>& b) {
  return std::string(b.begin(), b.end());
}

void logLine(const Config& config, const char* fmt, ...) {
  char msg[2048];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(msg, sizeof(msg), fmt, args);
  va_end(args);
  std::fprintf(stderr, "[frnccl rank %lld] %s\n", static_cast<long long>(config.rank), msg);
  std::fflush(stderr);
}

// "<UTC time to the ms>-<reason>-r<rank>[-<n>]": sorts by time, and the
// counter keeps two dumps of one rank within a millisecond apart. The reason
// enters as a plain name (incidentIdReason); the header keeps it whole.
std::string newIncidentId(const std::string& reason, int64_t rank) {
  static std::atomic<int64_t> issued{0};
  const int64_t ns = wallNs();
  const std::time_t seconds = static_cast<std::time_t>(ns / 1000000000LL);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char stamp[48];
  const size_t n = std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &utc);
  std::snprintf(stamp + n, sizeof(stamp) - n, ".%03lld", static_cast<long long>((ns / 1000000LL) % 1000));
  std::string id = std::string(stamp) + "-" + incidentIdReason(reason) + "-r" + std::to_string(rank);
  const int64_t count = issued.fetch_add(1);
  return count == 0 ? id : id + "-" + std::to_string(count);
}

// "<id>\n<reason>\n<trigger>\n<detail>"
std::string encodeRequest(const DumpRequest& r) {
  return r.incident_id + "\n" + r.reason + "\n" + std::to_string(r.trigger_rank) + "\n" + r.detail;
}
DumpRequest decodeRequest(const std::string& s) {
  DumpRequest r;
  std::istringstream in(s);
  std::string trigger;
  std::getline(in, r.incident_id);
  std::getline(in, r.reason);
  std::getline(in, trigger);
  std::getline(in, r.detail, '\0');
  try {
    r.trigger_rank = std::stoll(trigger);
  } catch (...) {
    r.trigger_rank = -1;
  }
  // Any client of the store wrote this: the header gets no more than this much of it.
  auto cut = [](std::string& text, size_t max) {
    if (text.size() > max) {
      text = text.substr(0, max) + "... (cut from " + std::to_string(text.size()) + " bytes)";
    }
  };
  cut(r.reason, kMaxRequestReasonBytes);
  cut(r.detail, kMaxRequestDetailBytes);
  return r;
}

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
};

// Takes the GIL on a helper thread, bounded by `timeout_ms`: with the GIL held
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
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  std::thread([job, done, symbolize, config] {
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
    done->set_value();
    releaseStacks(job->stacks);
  }).detach();
  if (finished.wait_for(std::chrono::milliseconds(timeout_ms)) != std::future_status::ready) {
    job->abandoned.store(true);
    return false;
  }
  out = std::move(job->view);
  return true;
}

} // namespace

void HeartbeatMonitor::noteSignal() {
  g_signal_pending.store(true);
}

void HeartbeatMonitor::notePythonFinalizing() {
  g_python_finalizing.store(true);
}

HeartbeatMonitor::HeartbeatMonitor(
    Config config,
    c10::intrusive_ptr<c10d::Store> store,
    std::function<WatchdogHealth()> watchdog_health,
    std::function<int64_t()> watchdog_heartbeat,
    std::function<bool(int64_t)> await_fresh_poll)
    : config_(std::move(config)),
      have_store_(store != nullptr),
      store_(std::move(store)),
      watchdog_health_(std::move(watchdog_health)),
      watchdog_heartbeat_(std::move(watchdog_heartbeat)),
      await_fresh_poll_(std::move(await_fresh_poll)),
      seen_request_seq_(registerWithStore()),
      heartbeat_changed_mono_ns_(monoNs()),
      storm_(config_.dump_min_interval_ms, config_.dump_max_count),
      thread_("frnccl-monitor", [this] { run(); }) {} // never touches CUDA

int64_t HeartbeatMonitor::registerWithStore() {
  if (!store_) {
    return 0;
  }
  try {
    // Lets `frnccl dump` find the job: how many ranks to wait for, where files go.
    store()->set("frnccl/world_size", bytes(std::to_string(config_.world_size)));
    store()->set("frnccl/dump_dir", bytes(config_.dump_dir));
    // This rank is back (a new group after destroy_process_group, or a
    // restarted attempt): triggers wait for it again.
    if (store()->deleteKey(leftKey(config_.rank))) {
      store()->add(kLeftCountKey, -1);
    }
    // Requests made before this process joined (an earlier attempt of a
    // restarted job) are not ours to answer.
    std::string raw;
    return readCounter(*store_, kSeqKey, raw).value_or(0);
  } catch (const std::exception& e) {
    logLine(config_, "cannot reach the store for coordinated dumps: %s", oneLineErrorText(e).c_str());
    return 0;
  }
}

c10::intrusive_ptr<c10d::Store> HeartbeatMonitor::store() const {
  std::lock_guard<std::mutex> lock(store_mutex_);
  return store_;
}

HeartbeatMonitor::~HeartbeatMonitor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all(); // BoundedThread's destructor detaches; stop() is the joining path
}

void HeartbeatMonitor::stop(int64_t timeout_ms) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  written_cv_.notify_all();
  if (!thread_.join(timeout_ms)) {
    logLine(config_, "monitor did not stop within %lld ms (a dump is in progress); leaving it behind", static_cast<long long>(timeout_ms));
  }
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

void HeartbeatMonitor::requestJobDump(std::string reason, std::string detail, After after) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({std::move(reason), std::move(detail), true, std::move(after), nullptr});
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

void HeartbeatMonitor::noteIncident(const std::string& incident_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  current_incident_ = incident_id;
  current_incident_deadline_mono_ns_ = monoNs() + config_.dump_timeout_ms * 1000000LL;
}

bool HeartbeatMonitor::incidentComplete(DoneCount& seen) {
  std::string id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (current_incident_.empty() || monoNs() >= current_incident_deadline_mono_ns_ || !storeUsable()) {
      return true; // no store, nothing more to wait for
    }
    id = current_incident_;
  }
  try {
    std::string why;
    // A count that is not a number (a bad store value) leaves nothing to wait for.
    return !countDone(id, seen, why) || seen.done >= config_.world_size;
  } catch (const std::exception& e) {
    noteStoreFailure(e);
    return true;
  }
}

bool HeartbeatMonitor::countDone(const std::string& incident_id, DoneCount& seen, std::string& why) {
  const c10::intrusive_ptr<c10d::Store> st = store();
  std::string raw;
  const std::optional<int64_t> written = readCounter(*st, writtenKey(incident_id), raw);
  if (!written) {
    why = "its count of writers holds \"" + printable(raw, 40) + "\", not a number";
    return false;
  }
  // A count of ranks that left that is not a number counts none: every rank is waited for.
  const int64_t left = *written >= config_.world_size ? 0 : readCounter(*st, kLeftCountKey, raw).value_or(0);
  if (*written == seen.written && left == seen.left) {
    return true;
  }
  seen.written = *written;
  seen.left = left;
  seen.done = *written;
  if (left <= 0 || *written + left < config_.world_size) {
    return true; // short even if no rank that left had written
  }
  // A rank that wrote and then left is in both counts: look at each rank once.
  int64_t done = 0;
  for (int64_t r = 0; r < config_.world_size; ++r) {
    if (st->check({wroteKey(incident_id, r)}) || st->check({leftKey(r)})) {
      ++done;
    }
  }
  seen.done = done;
  return true;
}

void HeartbeatMonitor::awaitIncident(const std::string& incident_id) {
  int64_t deadline = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!storeUsable() || incident_id != current_incident_) {
      return;
    }
    deadline = current_incident_deadline_mono_ns_;
  }
  std::string store_error; // the store is gone, and with it the count: nothing to wait for
  countWriters(incident_id, deadline, store_error);
}

void HeartbeatMonitor::dumpBeforeEnd(const std::string& reason, const std::string& what, bool open_incident) {
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
  };
  if (stopping()) {
    return;
  }
  std::string written = writtenPart();
  if (!written.empty()) {
    leaveIt(written);
    return;
  }
  DumpRequest active;
  bool join = incidentInProgress(active);
  if (!join && !open_incident && storeUsable()) {
    // A launcher's SIGTERM follows a peer's death by its monitor interval (torchrun: up to 100 ms), and may
    // come before the survivors' failure has opened its incident (tens of ms after the death): one more look.
    std::this_thread::sleep_for(std::chrono::milliseconds(kIncidentAfterSigtermMs));
    written = writtenPart();
    if (!written.empty()) {
      leaveIt(written);
      return;
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
    dump.incident_id = newIncidentId(reason, config_.rank);
    try {
      const std::string mine = dump.incident_id + "|" + std::to_string(wallNs());
      if (acquireActive(mine, "") == mine) {
        store_->set(requestKey(store_->add(kSeqKey, 1)), bytes(encodeRequest(dump)));
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
    dump.incident_id = newIncidentId(reason, config_.rank);
  }
  if (join || opened) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!dumped_incidents_.insert(dump.incident_id).second) {
      lock.unlock();
      awaitOwnPart(dump.incident_id); // the monitor has just begun to write it
      return;
    }
  }
  logLine(config_, "%s; writing this rank's dump (incident %s) before the signal takes effect", what.c_str(), dump.incident_id.c_str());
  if (!writeOwnDump(dump).empty() && (join || opened)) {
    announceWritten(dump.incident_id);
  }
}

void HeartbeatMonitor::awaitOwnPart(const std::string& incident_id) {
  // The signal handler passes the signal on once this returns (or its own bound passes): a part the monitor
  // is writing is let finish rather than cut short.
  std::unique_lock<std::mutex> lock(mutex_);
  written_cv_.wait_for(lock, std::chrono::milliseconds(config_.terminate_dump_ms), [&] {
    return stopping_ || written_parts_.count(incident_id) != 0;
  });
}

bool HeartbeatMonitor::incidentInProgress(DumpRequest& request) {
  if (!storeUsable()) {
    return false;
  }
  try {
    // TCPStore's get() waits for a missing key (up to the store timeout); a
    // compareSet that expects a value nobody writes reads the key without
    // waiting, and without setting it: a missing key answers the expected value.
    const std::string absent = "frnccl: no incident";
    const std::string held = text(store_->compareSet(kActiveKey, bytes(absent), bytes(absent)));
    if (held == absent || held.empty() ||
        wallNs() - lockTakenNs(held) > 2 * config_.dump_timeout_ms * 1000000LL) {
      return false;
    }
    const std::string id = held.substr(0, held.rfind('|'));
    // The holder publishes its request right after it takes the lock; request keys are never deleted.
    const int64_t latest = store_->add(kSeqKey, 0);
    if (latest <= 0 || !store_->check({requestKey(latest)})) {
      return false;
    }
    DumpRequest found = decodeRequest(text(store_->get(requestKey(latest))));
    if (found.incident_id != id) {
      return false;
    }
    request = std::move(found);
    return true;
  } catch (const std::exception& e) {
    noteStoreFailure(e);
    return false;
  }
}

int64_t HeartbeatMonitor::countWriters(const std::string& incident_id, int64_t deadline_mono_ns, std::string& store_error) {
  DoneCount seen;
  int64_t pause_ms = 20;
  while (true) {
    if (store_lost_.load()) {
      store_error = kStoreLostText;
      return seen.written;
    }
    try {
      std::string why;
      if (!countDone(incident_id, seen, why)) {
        store_error = why;
        return seen.written;
      }
    } catch (const std::exception& e) {
      noteStoreFailure(e);
      store_error = oneLineErrorText(e);
      return seen.written;
    }
    // A rank that left the job will not write: no use waiting for it.
    if (seen.done >= config_.world_size || monoNs() >= deadline_mono_ns) {
      return seen.written;
    }
    const int64_t left_ms = (deadline_mono_ns - monoNs()) / 1000000LL;
    if (!sleepFor(std::max<int64_t>(1, std::min(pause_ms, left_ms)))) {
      return seen.written;
    }
    pause_ms = std::min<int64_t>(pause_ms * 2, 200);
  }
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
    // While something waits on us, look at the store more often.
    last_store_poll_mono_ns_ = 0;
  }
}

void HeartbeatMonitor::run() {
  while (true) {
    std::deque<LocalRequest> batch;
    std::shared_ptr<std::promise<void>> leaving;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait_for(lock, std::chrono::milliseconds(kLoopTickMs), [&] { return stopping_ || !queue_.empty() || leaving_; });
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
        return;
      }
      batch.swap(queue_);
      leaving.swap(leaving_);
      busy_ = !batch.empty() || leaving;
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
    if (have_store_ && now - last_store_poll_mono_ns_ >= config_.coord_check_ms * 1000000LL) {
      last_store_poll_mono_ns_ = now;
      pollStore(); // once the store is lost, serves joined requests locally without calling it
    }
    if (have_store_) {
      takeOverJoined();
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

void HeartbeatMonitor::serveBeforeLeaving() {
  // In a job whose store lives in one rank's process (env:// and tcp://
  // init), that rank may have left first: there is no one to tell then.
  if (!storeUsable() || !storeServerReachable(*store(), kLeavingProbeMs)) {
    return;
  }
  // pollStore() reads up to the latest request and serves each one this rank
  // has not; it says false while a request's number is taken but its text not
  // yet set (a trigger between its two store calls).
  const int64_t until = monoNs() + kLeavingRequestWaitMs * 1000000LL;
  while (storeUsable() && !pollStore() && monoNs() < until && sleepFor(20)) {
  }
  if (!storeUsable()) {
    return;
  }
  // A request published after the poll above never gets this rank's part:
  // its trigger's count finds this mark instead, and stops waiting for it.
  try {
    store()->set(leftKey(config_.rank), bytes("1"));
    store()->add(kLeftCountKey, 1);
  } catch (const std::exception& e) {
    noteStoreFailure(e); // leaving all the same: a trigger then waits out its deadline
  }
}

void HeartbeatMonitor::serveLocal(LocalRequest request) {
  if (!request.job_wide || !have_store_) {
    DumpRequest dump;
    dump.incident_id = newIncidentId(request.reason, config_.rank);
    dump.reason = request.reason;
    dump.detail = request.detail;
    dump.trigger_rank = config_.rank;
    dump.symbolize = request.reason != "teardown";
    std::string path = writeOwnDump(dump);
    if (request.result) {
      if (path.empty()) {
        request.result->set_exception(std::make_exception_ptr(std::runtime_error("frnccl: dump failed; see the log line above")));
      } else {
        request.result->set_value(path);
      }
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

  startIncident(std::move(request), "");
}

std::string HeartbeatMonitor::acquireActive(const std::string& mine, const std::string& given_up) {
  // One incident at a time job-wide: the first trigger wins, the others
  // answer its request. A lock older than two dump deadlines is stale.
  std::string held = text(store()->compareSet(kActiveKey, {}, bytes(mine)));
  // Bounded: each round takes the lock, or finds it held by someone to join.
  for (int round = 0; round < 3 && held != mine; ++round) {
    const bool stale = wallNs() - lockTakenNs(held) > 2 * config_.dump_timeout_ms * 1000000LL;
    if (!stale && held != given_up) {
      break;
    }
    const std::string seen = held;
    held = text(store()->compareSet(kActiveKey, bytes(seen), bytes(mine)));
    if (held == seen) {
      // TCPStore answers a compareSet on a missing key with the expected
      // value: the holder let go in between, so the lock is free.
      held = text(store()->compareSet(kActiveKey, {}, bytes(mine)));
    }
  }
  return held;
}

void HeartbeatMonitor::joinIncident(LocalRequest request, const std::string& held) {
  const std::string active = held.substr(0, held.rfind('|'));
  logLine(config_, "%s; joining incident %s already in progress", request.detail.c_str(), printable(active).c_str());
  bool already_dumped = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    already_dumped = dumped_incidents_.count(active) != 0;
    if (!already_dumped) {
      if (joined_.empty() || joined_lock_ != held) {
        // A new holder gets the whole grace: it may have taken the lock just now.
        joined_lock_ = held;
        joined_since_mono_ns_ = monoNs();
      }
      joined_.push_back(std::move(request));
    }
  }
  if (already_dumped && request.after) {
    request.after(active);
  }
  last_store_poll_mono_ns_ = 0;
}

void HeartbeatMonitor::takeOverJoined() {
  int64_t joined_ns = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (joined_.empty()) {
      return;
    }
    // Late is measured from when the lock was taken (a live trigger asks right
    // after), so a lock left by an attempt that ended long ago is taken over
    // about as soon as it is joined; and, in case the holder's clock is behind
    // ours, from when this rank joined.
    joined_ns = monoNs() - joined_since_mono_ns_;
    const int64_t lock_age_ns = wallNs() - lockTakenNs(joined_lock_);
    const int64_t grace_ns = kJoinedRequestGraceMs * 1000000LL;
    if (joined_ns < kJoinedMinWaitMs * 1000000LL || (joined_ns < grace_ns && lock_age_ns < grace_ns)) {
      return;
    }
  }
  // The request may have come since the last poll. One queued behind a
  // request number that never appeared is read once that number is skipped
  // (kMissingRequestGraceMs), one the store failed to give is read on a later
  // poll: wait for those rather than open a second incident, but not forever.
  if (!pollStore() && joined_ns < (kJoinedRequestGraceMs + kMissingRequestGraceMs) * 1000000LL) {
    return;
  }
  std::deque<LocalRequest> joined;
  std::string given_up;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (joined_.empty()) {
      return; // served by the poll above
    }
    joined.swap(joined_);
    given_up = joined_lock_;
    busy_ = true; // until the incident below is done: waitIdle must not see it as served
  }
  LocalRequest first = std::move(joined.front());
  joined.pop_front();
  logLine(config_, "incident %s never asked this rank to dump (its lock was taken %.1f s ago, joined %.1f s ago: its trigger ended before asking, or asked before this process started); taking the incident over", printable(given_up.substr(0, given_up.rfind('|'))).c_str(), double(wallNs() - lockTakenNs(given_up)) / 1e9, double(joined_ns) / 1e9);
  if (!joined.empty()) {
    // One incident answers every request that joined.
    auto others = std::make_shared<std::deque<LocalRequest>>(std::move(joined));
    After own = std::move(first.after);
    first.after = [own, others](const std::string& id) {
      for (auto& other : *others) {
        if (other.after) {
          other.after(id);
        }
      }
      if (own) {
        own(id);
      }
    };
  }
  // If another rank took the same lock over first, this joins its incident,
  // whose request is published right after: one incident results.
  startIncident(std::move(first), given_up);
}

void HeartbeatMonitor::startIncident(LocalRequest request, const std::string& given_up) {
  DumpRequest dump;
  dump.incident_id = newIncidentId(request.reason, config_.rank);
  dump.reason = request.reason;
  dump.detail = request.detail;
  dump.trigger_rank = config_.rank;
  const int64_t start = monoNs();
  try {
    if (store_lost_.load()) {
      throw std::runtime_error(kStoreLostText);
    }
    const std::string mine = dump.incident_id + "|" + std::to_string(wallNs());
    const std::string held = acquireActive(mine, given_up);
    if (held != mine) {
      joinIncident(std::move(request), held);
      return;
    }
    // The server fails an add() on a value that is not a number, and drops the connection.
    std::string raw;
    if (!readCounter(*store(), kSeqKey, raw)) {
      store()->deleteKey(kActiveKey);
      throw std::runtime_error(std::string(kSeqKey) + " holds \"" + printable(raw, 40) + "\", not a request number");
    }
    const int64_t seq = store()->add(kSeqKey, 1);
    store()->set(requestKey(seq), bytes(encodeRequest(dump)));
    noteIncident(dump.incident_id);
    logLine(config_, "%s; asking all %lld ranks to dump (incident %s)", request.detail.c_str(), static_cast<long long>(config_.world_size), dump.incident_id.c_str());
  } catch (const std::exception& e) {
    noteStoreFailure(e);
    logLine(config_, "store unreachable (%s); dumping this rank only", oneLineErrorText(e).c_str());
    dump.incident_id += "-local";
    writeOwnDump(dump);
    if (request.after) {
      request.after(dump.incident_id);
    }
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    dumped_incidents_.insert(dump.incident_id);
  }
  // Only a rank whose files exist counts as written: the trigger's "N/M
  // ranks wrote" (and `frnccl dump`) must name a rank that could not write.
  if (!writeOwnDump(dump).empty()) {
    announceWritten(dump.incident_id);
  }
  awaitAllRanks(dump.incident_id, start);
  if (!store_lost_.load()) {
    try {
      store()->deleteKey(kActiveKey);
    } catch (const std::exception& e) {
      noteStoreFailure(e);
    }
  }
  if (request.after) {
    request.after(dump.incident_id);
  }
}

void HeartbeatMonitor::noteStoreFailure(const std::exception& e) {
  if (dynamic_cast<const c10::DistNetworkError*>(&e) != nullptr && !store_lost_.exchange(true)) {
    next_reconnect_mono_ns_ = monoNs() + 1000 * 1000000LL;
  }
}

void HeartbeatMonitor::reconnectStore() {
  if (!store_lost_.load() || reconnect_given_up_ || monoNs() < next_reconnect_mono_ns_) {
    return;
  }
  const c10::intrusive_ptr<c10d::Store> old = store();
  c10::intrusive_ptr<c10d::Store> fresh;
  std::string why;
  if (!storeServerReachable(*old, kReconnectProbeMs)) {
    why = "the store host does not accept connections";
  } else {
    try {
      old->setTimeout(std::chrono::milliseconds(kReconnectTimeoutMs)); // the clone's, while it connects
      fresh = old->clone();
      fresh->setTimeout(std::chrono::milliseconds(kStoreTimeoutMs));
      fresh->check({kSeqKey});
    } catch (const std::exception& e) {
      fresh.reset();
      why = oneLineErrorText(e);
    }
  }
  if (!fresh) {
    ++reconnect_failures_;
    if (reconnect_failures_ >= kMaxReconnectFailures) {
      reconnect_given_up_ = true;
      logLine(config_, "store still unreachable after %d tries to reconnect (%s); job-wide dumps stay off in this process", reconnect_failures_, why.c_str());
    }
    next_reconnect_mono_ns_ = monoNs() + std::min<int64_t>(1000LL << reconnect_failures_, 60000) * 1000000LL;
    return;
  }
  {
    std::lock_guard<std::mutex> lock(store_mutex_);
    store_ = fresh;
  }
  reconnect_failures_ = 0;
  store_broken_logged_ = false;
  ++reconnects_;
  // Each break is a fresh start for the next one, up to a bound: a store that
  // keeps failing this process's calls is given up.
  reconnect_given_up_ = reconnects_ >= kMaxReconnects;
  store_lost_.store(false);
  logLine(config_, "store connection restored (a new connection, %d of at most %d); job-wide dump requests reach this rank again", reconnects_, kMaxReconnects);
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

bool HeartbeatMonitor::pollStore() {
  reconnectStore();
  int64_t latest = 0;
  try {
    if (store_lost_.load()) {
      throw std::runtime_error(kStoreLostText);
    }
    std::string raw;
    const std::optional<int64_t> value = readCounter(*store(), kSeqKey, raw);
    if (!value) {
      if (!bad_seq_logged_) {
        bad_seq_logged_ = true;
        logLine(config_, "%s holds \"%s\", not a request number: job-wide dump requests are not read until it is one", kSeqKey, printable(raw, 40).c_str());
      }
      return false;
    }
    latest = *value;
  } catch (const std::exception& e) {
    noteStoreFailure(e);
    if (!store_broken_logged_) {
      store_broken_logged_ = true;
      logLine(config_, "store unreachable (%s); job-wide dump requests will not reach this rank", oneLineErrorText(e).c_str());
    }
    // Whoever waits on a joined incident must not wait for a store that is gone.
    std::deque<LocalRequest> waiting;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      waiting.swap(joined_);
      busy_ = busy_ || !waiting.empty();
    }
    if (!waiting.empty()) {
      DumpRequest dump;
      dump.incident_id = newIncidentId(waiting.front().reason, config_.rank) + "-local";
      dump.reason = waiting.front().reason;
      dump.detail = waiting.front().detail + "; store unreachable, local dump";
      dump.trigger_rank = config_.rank;
      writeOwnDump(dump);
      for (auto& request : waiting) {
        if (request.after) {
          request.after(dump.incident_id);
        }
      }
    }
    return false;
  }
  bad_seq_logged_ = false;
  if (latest < seen_request_seq_ || latest - seen_request_seq_ > kMaxRequestBacklog) {
    const int64_t from = latest < seen_request_seq_ ? latest : latest - kMaxRequestBacklog;
    logLine(config_, "%s went from %lld to %lld; reading requests from %lld on", kSeqKey, static_cast<long long>(seen_request_seq_), static_cast<long long>(latest), static_cast<long long>(from + 1));
    seen_request_seq_ = from;
    missing_since_mono_ns_ = 0;
  }
  while (seen_request_seq_ < latest && !store_lost_.load()) {
    const int64_t seq = seen_request_seq_ + 1;
    const std::string key = requestKey(seq);
    DumpRequest request;
    try {
      if (!store()->check({key})) {
        const int64_t now = monoNs();
        if (missing_since_mono_ns_ == 0) {
          missing_since_mono_ns_ = now;
        }
        if (now - missing_since_mono_ns_ < kMissingRequestGraceMs * 1000000LL) {
          return false;
        }
        seen_request_seq_ = seq; // the grace stays over for the rest of this gap
        continue;
      }
      missing_since_mono_ns_ = 0;
      request = decodeRequest(text(store()->get(key)));
    } catch (const std::exception& e) {
      noteStoreFailure(e);
      logLine(config_, "cannot read dump request %lld: %s", static_cast<long long>(seq), oneLineErrorText(e).c_str());
      return false;
    }
    seen_request_seq_ = seq;
    if (!validIncidentId(request.incident_id)) {
      logLine(config_, "dump request %lld ignored: its incident id \"%s\" is not a plain folder name (1-%zu of A-Z a-z 0-9 . _ -, not starting with a dot)", static_cast<long long>(seq), printable(request.incident_id).c_str(), kMaxIncidentIdLength);
      continue;
    }
    bool fresh = false;
    bool own_waiting = false; // this rank's own requests joined it: never dropped
    {
      std::lock_guard<std::mutex> lock(mutex_);
      fresh = dumped_incidents_.count(request.incident_id) == 0;
      own_waiting = !joined_.empty();
    }
    if (fresh && !own_waiting &&
        !admitJobDump(request.reason, "dump request " + std::to_string(seq) + " (incident " + request.incident_id + ", reason " + printable(request.reason) + ")")) {
      continue;
    }
    if (fresh) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        dumped_incidents_.insert(request.incident_id);
      }
      noteIncident(request.incident_id);
      if (!writeOwnDump(request).empty()) {
        announceWritten(request.incident_id);
      }
    }
    std::deque<LocalRequest> waiting;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      waiting.swap(joined_);
      busy_ = busy_ || !waiting.empty();
    }
    for (auto& joined : waiting) {
      if (joined.after) {
        joined.after(request.incident_id);
      }
    }
  }
  return true;
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
    dump.incident_id = newIncidentId("watchdog_stuck", config_.rank) + "-local";
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

std::string HeartbeatMonitor::writeOwnDump(const DumpRequest& request) {
  std::string dir = writeDumpFiles(request);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    written_parts_.insert(request.incident_id);
  }
  written_cv_.notify_all();
  return dir;
}

std::string HeartbeatMonitor::writeDumpFiles(const DumpRequest& request) {
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
      logLine(config_, "GIL not available within %lld ms: writing the dump without symbolized stacks", static_cast<long long>(gil_wait_ms));
    }
    // The thread holding the GIL is stuck in a C call, so its frames hold still.
    view.thread_stacks = captureThreadStacks(config_);
  }
  const bool symbolized = view.have_frames;
  const SymbolizedStacks& frames = view.frames;
  const std::string& thread_stacks = view.thread_stacks;
  const int64_t t_stacks = monoNs();
  try {
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
    }
    // The breakdown says where a slow dump spent its time: the snapshot and
    // stacks (GIL waits), building the tree, or encoding and writing files.
    logLine(config_, "wrote dump %s (%zu entries, reason %s) to %s in %.0f ms (snapshot+stacks %.0f, build %.0f, encode+write %.0f)", request.incident_id.c_str(), snapshot.entries.size(), printable(request.reason).c_str(), dir.c_str(), ms(t0, t_written), ms(t0, t_stacks), ms(t_stacks, t_built), ms(t_built, t_written));
    return dir;
  } catch (const std::exception& e) {
    logLine(config_, "dump %s NOT written: %s", request.incident_id.c_str(), oneLineErrorText(e).c_str());
    return "";
  }
}

void HeartbeatMonitor::announceWritten(const std::string& incident_id) {
  if (store_lost_.load()) {
    return;
  }
  try {
    store()->set(wroteKey(incident_id, config_.rank), bytes("1"));
    store()->add(writtenKey(incident_id), 1);
  } catch (const std::exception& e) {
    noteStoreFailure(e);
    logLine(config_, "cannot report dump %s to the store: %s", incident_id.c_str(), oneLineErrorText(e).c_str());
  }
}

void HeartbeatMonitor::awaitAllRanks(const std::string& incident_id, int64_t start_mono_ns) {
  // One deadline for the whole wait; returns as soon as every rank wrote.
  std::string store_error;
  const int64_t written =
      countWriters(incident_id, start_mono_ns + config_.dump_timeout_ms * 1000000LL, store_error);
  if (!store_error.empty()) {
    logLine(config_, "store unreachable while waiting for dump %s: %s", incident_id.c_str(), store_error.c_str());
  }
  const double seconds = double(monoNs() - start_mono_ns) / 1e9;
  // Ranks that did not write: missing, or gone from the job (they left
  // cleanly before the request reached them), listed apart.
  std::string missing;
  std::string left;
  if (written < config_.world_size) {
    int listed_missing = 0;
    int listed_left = 0;
    auto list = [](std::string& out, int& listed, int64_t rank) {
      if (listed++ < 64) {
        out += (out.empty() ? "" : ",") + std::to_string(rank);
      }
    };
    for (int64_t r = 0; r < config_.world_size && !store_lost_.load(); ++r) {
      try {
        if (store()->check({wroteKey(incident_id, r)})) {
          continue;
        }
        if (store()->check({leftKey(r)})) {
          list(left, listed_left, r);
        } else {
          list(missing, listed_missing, r);
        }
      } catch (const std::exception& e) {
        noteStoreFailure(e);
        break;
      }
    }
    if (listed_missing > 64) {
      missing += ",... (" + std::to_string(listed_missing) + " in all)";
    }
    if (listed_left > 64) {
      left += ",... (" + std::to_string(listed_left) + " in all)";
    }
  }
  const std::string missing_text = missing.empty() ? "" : "; missing ranks: " + missing;
  const std::string left_text = left.empty() ? "" : "; ranks that had left the job: " + left;
  logLine(config_, "dump %s: %lld/%lld ranks wrote in %.1f s%s%s", incident_id.c_str(), static_cast<long long>(written), static_cast<long long>(config_.world_size), seconds, missing_text.c_str(), left_text.c_str());
}

} // namespace frnccl
