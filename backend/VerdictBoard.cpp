// The incident this process last took part in and its verdict, for the errors it raises (see Verdict.hpp).
#include "Verdict.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>

#include "Clock.hpp"
#include "IncidentId.hpp"

namespace frnccl {

VerdictBoard& VerdictBoard::get() {
  static VerdictBoard* board = new VerdictBoard(); // leaked: raised errors may read it at exit
  return *board;
}

void VerdictBoard::noteIncident(const std::string& incident_id, const std::string& incident_dir, int64_t deadline_mono_ns,
                                bool failure, bool opened_here, int64_t lag_ms) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (incident_ == incident_id) {
      return;
    }
    incident_ = incident_id;
    incident_dir_ = incident_dir;
    verdict_.clear();
    culprits_.clear();
    verdict_json_.clear();
    deadline_mono_ns_ = deadline_mono_ns;
    noted_mono_ns_ = monoNs();
    noted_wall_ns_ = wallNs();
    failure_ = failure;
    opened_here_ = opened_here;
    lag_ms_ = std::max<int64_t>(lag_ms, 0);
    verdict_mono_ns_ = 0;
    ++tally_.incidents;
    tally_.failure_incidents += failure ? 1 : 0;
  }
  cv_.notify_all();
}

void VerdictBoard::setVerdict(const std::string& incident_id, const std::string& line, std::vector<int64_t> culprits,
                              const std::string& json) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (incident_ != incident_id) {
      return;
    }
    verdict_ = line.substr(0, kMaxVerdictLineBytes);
    culprits_ = std::move(culprits);
    verdict_mono_ns_ = monoNs();
    verdict_json_ = json.size() <= kMaxVerdictJsonText ? json : std::string();
    tally_.verdict_incident = incident_id;
    tally_.verdict = verdict_;
    tally_.culprits = culprits_;
    tally_.json = verdict_json_;
  }
  cv_.notify_all();
}

VerdictBoard::Tally VerdictBoard::tally() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tally_;
}

VerdictBoard::Record VerdictBoard::record(int64_t wait_ms) const {
  std::unique_lock<std::mutex> lock(mutex_);
  // Only while one can still come: past its deadline, none will.
  const int64_t left_ns = std::min<int64_t>(std::max<int64_t>(wait_ms, 0) * 1000000LL, deadline_mono_ns_ - monoNs());
  if (failure_ && verdict_.empty() && left_ns > 0) {
    const std::string id = incident_;
    cv_.wait_for(lock, std::chrono::nanoseconds(left_ns), [&] { return !verdict_.empty() || incident_ != id; });
  }
  return recordLocked();
}

VerdictBoard::Record VerdictBoard::nextVerdict(const std::string& seen_id, int64_t wait_ms) const {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t wakes = waiter_wakes_;
  auto fresh = [&] { return !incident_.empty() && incident_ != seen_id && !verdict_.empty(); };
  cv_.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(wait_ms, 0)),
               [&] { return fresh() || waiter_wakes_ != wakes; });
  return fresh() ? recordLocked() : Record{};
}

void VerdictBoard::wakeVerdictWaiters() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++waiter_wakes_;
  }
  cv_.notify_all();
}

VerdictBoard::Record VerdictBoard::recordLocked() const {
  Record r;
  r.id = incident_;
  r.dir = incident_dir_;
  r.verdict = verdict_;
  r.culprits = culprits_;
  r.failure = failure_;
  r.named_stamp_s = noted_wall_ns_ / 1000000000LL - 1 - (lag_ms_ + 999) / 1000;
  r.recent = !incident_.empty() && failure_ && !verdict_.empty() &&
             monoNs() - verdict_mono_ns_ <= kVerdictRelevantMs * 1000000LL;
  r.raised = !incident_.empty() && raised_incident_ == incident_;
  r.json = verdict_json_;
  return r;
}

std::string encodeVerdictValue(const std::string& line, const std::vector<int64_t>& culprits, const std::string& json) {
  std::string out = "culprits=";
  for (size_t i = 0; i < culprits.size() && i < kMaxVerdictCulprits; ++i) {
    out += (i ? "," : "") + std::to_string(static_cast<long long>(culprits[i]));
  }
  // The line is printable (no newline); JSON text from DumpValue escapes every control character.
  return out + "\n" + line + "\n" + (json.size() <= kMaxVerdictJsonText ? json : std::string());
}

void decodeVerdictValue(const std::string& raw, int64_t world_size, std::string& line, std::vector<int64_t>& culprits,
                        std::string& json) {
  culprits.clear();
  json.clear();
  static const std::string kHead = "culprits=";
  const size_t nl = raw.find('\n');
  if (raw.compare(0, kHead.size(), kHead) != 0 || nl == std::string::npos) {
    line = printable(raw, kMaxVerdictLineBytes); // not ours: a line that names no rank for certain
    return;
  }
  const size_t nl2 = raw.find('\n', nl + 1);
  line = printable(raw.substr(nl + 1, nl2 == std::string::npos ? std::string::npos : nl2 - nl - 1), kMaxVerdictLineBytes);
  if (nl2 != std::string::npos && raw.size() - nl2 - 1 <= kMaxVerdictJsonText) {
    json = raw.substr(nl2 + 1);
  }
  std::vector<int64_t> got;
  int64_t value = -1;
  for (size_t i = kHead.size(); i <= nl; ++i) {
    const char c = raw[i];
    if (c >= '0' && c <= '9' && value < (int64_t(1) << 40)) {
      value = (value < 0 ? 0 : value * 10) + (c - '0');
    } else if ((c == ',' || i == nl) && value >= 0 && value < world_size && got.size() < kMaxVerdictCulprits) {
      got.push_back(value);
      value = -1;
    } else if (i == nl && value < 0 && got.empty()) {
      break; // "culprits=": an undecided verdict
    } else {
      return; // anything else names no rank for certain
    }
  }
  culprits = std::move(got);
}

std::string VerdictBoard::awaitedIncident() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !incident_.empty() && failure_ && verdict_.empty() && monoNs() < deadline_mono_ns_ ? incident_ : "";
}

std::string VerdictBoard::errorNote(int64_t wait_ms, int64_t incident_wait_ms, int64_t op_created_mono_ns) const {
  std::unique_lock<std::mutex> lock(mutex_);
  const int64_t start = monoNs();
  const int64_t until = start + std::max<int64_t>(wait_ms, 0) * 1000000LL;
  auto ours = [&] { return !incident_.empty() && noted_mono_ns_ >= op_created_mono_ns; };
  // An incident is open (one with no verdict, a manual or signal dump, or one opened before this op, as for
  // the calls a caller makes after its first failure): the failure joins it; no newer one is to wait for.
  const bool open_incident = !incident_.empty() && start < deadline_mono_ns_;
  if (!ours() && !open_incident && incident_wait_ms > 0) {
    const int64_t incident_until = std::min<int64_t>(until, start + incident_wait_ms * 1000000LL);
    cv_.wait_for(lock, std::chrono::nanoseconds(std::max<int64_t>(incident_until - start, 0)), ours);
  }
  if (incident_.empty() || monoNs() > deadline_mono_ns_ + kVerdictRelevantMs * 1000000LL) {
    return "";
  }
  const std::string where = "dumps in " + incident_dir_ + " on each rank's host, full analysis: frnccl analyze " + incident_dir_;
  raised_incident_ = incident_; // the error about to be raised carries it
  if (!ours()) {
    // Opened before this op was created: another failure's, whose verdict may name a rank this one did not
    // wait for.
    return "frnccl: incident " + incident_ + " (opened before this op); " + where;
  }
  if (!failure_) {
    return "frnccl: incident " + incident_ + " (a dump with no verdict); " + where;
  }
  const std::string id = incident_;
  const int64_t verdict_until = std::min<int64_t>(until, deadline_mono_ns_);
  const int64_t left_ns = verdict_until - monoNs();
  if (verdict_.empty() && left_ns > 0) {
    cv_.wait_for(lock, std::chrono::nanoseconds(left_ns), [&] { return !verdict_.empty() || incident_ != id; });
  }
  if (incident_ == id && !verdict_.empty()) {
    return verdict_;
  }
  return "frnccl: incident " + id + (opened_here_ ? ": this rank opened it; its verdict follows in this log; "
                                                  : ": the verdict follows in the log of the rank that opened it; ") + where;
}

std::string VerdictBoard::verdict() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return verdict_;
}

std::string VerdictBoard::incident() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return incident_;
}

std::pair<std::string, std::string> VerdictBoard::incidentAndVerdict() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {incident_, verdict_};
}

} // namespace frnccl
