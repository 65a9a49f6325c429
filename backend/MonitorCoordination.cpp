// Job-wide incidents through the root TCPStore: registering, the frnccl/active
// lock and the request numbers (open, join, take over), reading requests,
// counting the ranks that wrote or left, and replacing a lost connection (the
// incident's written parts and its verdict: MonitorVerdict.cpp). Runs on the monitor thread, but for the reads that
// awaitIncident and dumpBeforeEnd make from other threads.
#include "HeartbeatMonitor.hpp"

#include <algorithm>

#include <c10/util/Exception.h>

#include "Clock.hpp"
#include "ErrorText.hpp"
#include "MonitorDetail.hpp"
#include "RankSummary.hpp"
#include "VerdictFile.hpp"
#include "Recorder.hpp"
#include "StoreProbe.hpp"
#include "StoreValues.hpp"
#include "Verdict.hpp"

namespace frnccl {

using namespace monitor_detail;

namespace {

// `frnccl status` (fr_backend/status.py): it bumps kStatusSeqKey and wakes every rank; the rank's monitor,
// after a wake, answers under its own key with its live summary, tagged with the request's number. One key
// per rank, overwritten: the store does not grow with the requests.
constexpr const char* kStatusSeqKey = "frnccl/status/seq";
std::string statusKey(int64_t rank) {
  return "frnccl/status/rank/" + std::to_string(rank);
}
// A rank answers at most this often, however often it is asked or woken.
constexpr int64_t kStatusMinIntervalMs = 500;
// The newest entries a status answer reads: enough for each group's latest ops, without copying the ring
// under the recorder's lock.
constexpr size_t kStatusEntries = 1024;

} // namespace

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
      store()->append(kLeftRanksKey, bytes("-" + std::to_string(config_.rank) + ","));
      // The list holds an earlier attempt's entries: rank 0 rewrites it once
      // the others are back (a first attempt costs no read).
      if (config_.rank == 0) {
        compact_left_at_mono_ns_ = monoNs() + kCompactLeftAfterMs * 1000000LL;
      }
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

void HeartbeatMonitor::compactLeftRanks() {
  if (!storeUsable()) {
    return;
  }
  try {
    const c10::intrusive_ptr<c10d::Store> st = store();
    std::optional<std::string> list = readIfPresent(*st, kLeftRanksKey);
    // A compareSet: a rank that appends meanwhile is not lost, the rewrite is
    // tried again on what the store now holds, a few times at most.
    for (int round = 0; round < 3 && list; ++round) {
      const std::string compact = compactRanksList(*list);
      if (compact.size() >= list->size()) {
        return;
      }
      const std::vector<uint8_t> now = st->compareSet(kLeftRanksKey, bytes(*list), bytes(compact));
      if (text(now) == compact) {
        return;
      }
      list = text(now);
    }
  } catch (const std::exception& e) {
    noteStoreFailure(e);
  }
}

c10::intrusive_ptr<c10d::Store> HeartbeatMonitor::store() const {
  std::lock_guard<std::mutex> lock(store_mutex_);
  return store_;
}

void HeartbeatMonitor::noteIncident(const std::string& incident_id, bool failure) {
  std::lock_guard<std::mutex> lock(mutex_);
  current_incident_ = incident_id;
  current_incident_deadline_mono_ns_ = monoNs() + config_.dump_timeout_ms * 1000000LL;
  // The verdict comes after every rank wrote, within the dump deadline; a little more for the trigger to
  // read the summaries and for the wake-up to reach this rank.
  // An id ends in "-r<rank of its opener>" (incidentId): the opener is the rank that judges and prints the verdict.
  const std::string opener_suffix = "-r" + std::to_string(static_cast<long long>(config_.rank));
  const bool opened_here = incident_id.size() > opener_suffix.size() &&
                           incident_id.compare(incident_id.size() - opener_suffix.size(), opener_suffix.size(), opener_suffix) == 0;
  VerdictBoard::get().noteIncident(incident_id, config_.dump_dir + "/" + incident_id,
                                   current_incident_deadline_mono_ns_ + kVerdictGraceMs * 1000000LL, failure, opened_here,
                                   config_.coord_check_ms);
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
  // A rank that wrote and then left is in both counts: count each rank once.
  std::vector<bool> wrote;
  std::vector<bool> gone;
  readDoneRanks(incident_id, wrote, gone);
  seen.done = std::count(wrote.begin(), wrote.end(), true) + std::count(gone.begin(), gone.end(), true);
  return true;
}

void HeartbeatMonitor::readDoneRanks(const std::string& incident_id, std::vector<bool>& wrote, std::vector<bool>& left) {
  const c10::intrusive_ptr<c10d::Store> st = store();
  wrote = ranksInList(readIfPresent(*st, writersKey(incident_id)).value_or(""), config_.world_size);
  left = ranksInList(readIfPresent(*st, kLeftRanksKey).value_or(""), config_.world_size);
  for (size_t r = 0; r < left.size(); ++r) {
    left[r] = left[r] && !wrote[r];
  }
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

void HeartbeatMonitor::serveBeforeLeaving() {
  // In a job whose store lives in one rank's process (env:// and tcp://
  // init), that rank may have left first: there is no one to tell then.
  if (!storeUsable() || !storeServerReachable(*store(), kLeavingProbeMs)) {
    if (waiter_ && !waiter_released_) {
      waiter_released_ = true;
      waiter_->stop(); // no store to set its key in: its wait fails, or ends at its bound
    }
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
    // What this rank was doing as it left, for the verdict of an incident it will not write a part of.
    const Snapshot snapshot = Recorder::get().snapshot(false);
    SummaryInput summary{&config_, &snapshot, nullptr, nullptr, "", "left"};
    store()->set(leftSummaryKey(config_.rank), bytes(buildRankSummary(summary)));
    store()->set(leftKey(config_.rank), bytes("1"));
    store()->add(kLeftCountKey, 1);
    store()->append(kLeftRanksKey, bytes("+" + std::to_string(config_.rank) + ","));
  } catch (const std::exception& e) {
    noteStoreFailure(e); // leaving all the same: a trigger then waits out its deadline
  }
  releaseWaiter();
}

void HeartbeatMonitor::releaseWaiter() {
  if (!waiter_ || waiter_released_) {
    return;
  }
  waiter_released_ = true;
  waiter_->stop();
  if (!storeUsable() || !storeServerReachable(*store(), kLeavingProbeMs)) {
    return; // its wait fails with the connection, or ends at its bound; the thread owns what it uses
  }
  try {
    store()->set(waiter_->key(), bytes("stop"));
  } catch (const std::exception& e) {
    noteStoreFailure(e);
    return;
  }
  // Its last store call has returned (a thread still talking to the store
  // when the process ends leaves a half-sent request behind); if not, it is
  // left behind.
  waiter_->join(500);
}

bool HeartbeatMonitor::checkWaiterConnection() {
  if (!waiter_) {
    return false;
  }
  const int64_t now = monoNs();
  if (waiter_->failures() != seen_waiter_failures_) {
    seen_waiter_failures_ = waiter_->failures();
    waiter_failed_mono_ns_ = now;
    return true;
  }
  if (waiter_failed_mono_ns_ == 0 && waiter_->hostHungUp()) {
    waiter_failed_mono_ns_ = now; // its thread has yet to notice: the failure is coming
    return true;
  }
  if (waiter_failed_mono_ns_ == 0) {
    return false;
  }
  if (now - waiter_failed_mono_ns_ < kWaiterFailureSettleMs * 1000000LL) {
    return true;
  }
  waiter_failed_mono_ns_ = 0;
  if (!store_lost_.load() && !storeServerReachable(*store(), kLeavingProbeMs)) {
    // As a network error of the monitor's own would: reconnecting (probe
    // first) is tried as usual, and the poll below says what this rank does now.
    next_reconnect_mono_ns_ = monoNs() + 1000 * 1000000LL;
    store_lost_.store(true);
    last_store_poll_mono_ns_ = monoNs();
    pollStore();
  }
  return true;
}

bool HeartbeatMonitor::waiterSawHostLeave() {
  if (!waiter_ || (!waiter_->hostHungUp() && waiter_->failures() == seen_waiter_failures_ && waiter_failed_mono_ns_ == 0)) {
    return false;
  }
  // As checkWaiterConnection would, without waiting for its next pass: the host's
  // listening socket may outlive its connections for a moment.
  sleepFor(kWaiterFailureSettleMs);
  return !storeServerReachable(*store(), kLeavingProbeMs);
}

void HeartbeatMonitor::selfWakeIfDue(int64_t now) {
  if (!waiter_ || waiter_released_ || !waiter_->listening() || store_lost_.load()) {
    return;
  }
  if (now - last_wake_mono_ns_ < StoreWaiter::selfWakeMs(waiter_->waitBoundMs(), config_.rank) * 1000000LL) {
    return;
  }
  last_wake_mono_ns_ = now; // once per round, whatever the set gives
  try {
    store()->set(wakeKey(config_.rank), bytes("1"));
  } catch (const std::exception& e) {
    noteStoreFailure(e);
  }
}

void HeartbeatMonitor::answerStatusIfDue(int64_t now) {
  if (!status_due_ || now - status_read_mono_ns_ < kStatusMinIntervalMs * 1000000LL || !storeUsable() || store_lost_.load()) {
    return; // a wake within the interval stays due: the next tick past it answers
  }
  status_due_ = false;
  status_read_mono_ns_ = now;
  try {
    // One round trip (readIfPresent), 0 where no one ever asked; a value that is no number is no request.
    std::string raw;
    const std::optional<int64_t> n = readCounter(*store(), kStatusSeqKey, raw);
    if (!n || *n <= status_answered_) {
      return;
    }
    status_answered_ = *n;
    const Snapshot snapshot = Recorder::get().snapshot(false, kStatusEntries);
    const std::string summary = buildRankSummary(SummaryInput{&config_, &snapshot, nullptr, nullptr, "", "live"});
    // {"n":N,"summary":{...}}: the summary is JSON already, bounded by kMaxSummaryBytes.
    store()->set(statusKey(config_.rank), bytes("{\"n\":" + std::to_string(*n) + ",\"summary\":" + summary + "}"));
  } catch (const std::exception& e) {
    noteStoreFailure(e);
  }
}

bool HeartbeatMonitor::needsPoll(int64_t now) {
  const int64_t wakes = waiter_ ? waiter_->wakes() : 0;
  if (wakes != seen_wakes_) {
    seen_wakes_ = wakes;
    status_due_ = true;
    last_wake_mono_ns_ = now;
    poll_soon_.store(false);
    return true;
  }
  selfWakeIfDue(now);
  if (poll_soon_.exchange(false)) {
    return true;
  }
  if (now - last_store_poll_mono_ns_ < config_.coord_check_ms * 1000000LL) {
    return false;
  }
  const bool pushed = waiter_ && waiter_->listening();
  if (waiter_ && waiter_->gaveUp() && !push_off_logged_ && !store_lost_.load()) {
    push_off_logged_ = true;
    logLine(config_, "cannot keep a waiting connection to the store; looking for job-wide dump requests every %lld ms instead", static_cast<long long>(config_.coord_check_ms));
  }
  bool joined = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    joined = !joined_.empty();
  }
  return !pushed || store_lost_.load() || missing_since_mono_ns_ != 0 || joined;
}

void HeartbeatMonitor::wakeAllRanks(const std::string& incident_id) {
  try {
    const c10::intrusive_ptr<c10d::Store> st = store();
    std::vector<std::string> keys;
    std::vector<std::vector<uint8_t>> values;
    for (int64_t r = 0; r < config_.world_size; ++r) {
      keys.push_back(wakeKey(r));
      values.push_back(bytes("1"));
      if (keys.size() == kWakeBatch || r + 1 == config_.world_size) {
        st->multiSet(keys, values);
        keys.clear();
        values.clear();
      }
    }
  } catch (const std::exception& e) {
    noteStoreFailure(e);
    logLine(config_, "cannot wake the ranks for incident %s (%s): they see its request within %lld s", incident_id.c_str(), oneLineErrorText(e).c_str(), static_cast<long long>((waiter_ ? waiter_->waitBoundMs() : StoreWaiter::kWaitBoundMs) / 1000));
  }
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

void HeartbeatMonitor::releaseActive(const std::string& incident_id) {
  if (!storeUsable()) {
    return;
  }
  try {
    const std::string absent = "frnccl: no incident"; // read without waiting, as incidentInProgress does
    const std::string held = text(store()->compareSet(kActiveKey, bytes(absent), bytes(absent)));
    if (held.rfind(incident_id + "|", 0) == 0) {
      // Empty is free (acquireActive takes the lock from an empty value as from a missing key).
      store()->compareSet(kActiveKey, bytes(held), {});
    }
  } catch (const std::exception& e) {
    noteStoreFailure(e);
  }
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
  pollSoon();
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
  dump.incident_id = newIncidentId(request.reason, config_.rank, config_.job_tag);
  dump.reason = request.reason;
  dump.detail = request.detail;
  dump.trigger_rank = config_.rank;
  const int64_t start = monoNs();
  try {
    if (!store_lost_.load() && waiterSawHostLeave()) {
      next_reconnect_mono_ns_ = monoNs() + 1000 * 1000000LL;
      store_lost_.store(true);
    }
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
    noteIncident(dump.incident_id, isFailure(dump.reason));
    wakeAllRanks(dump.incident_id);
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
  // A verdict only for a failure: in a dump asked for on a healthy job, a rank that has not reached an op
  // the others are in is only behind, not at fault.
  awaitAllRanks(dump.incident_id, start, isFailure(dump.reason));
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
      std::lock_guard<std::mutex> lock(*clone_mutex_); // the waiter clones from the first store
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
      dump.incident_id = newIncidentId(waiting.front().reason, config_.rank, config_.job_tag) + "-local";
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
      const std::optional<std::string> value = readIfPresent(*store(), key);
      if (!value) {
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
      request = decodeRequest(*value);
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
      noteIncident(request.incident_id, isFailure(request.reason));
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
  fetchVerdict();
  return true;
}

} // namespace frnccl
