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
                                bool failure) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (incident_ == incident_id) {
      return;
    }
    incident_ = incident_id;
    incident_dir_ = incident_dir;
    verdict_.clear();
    deadline_mono_ns_ = deadline_mono_ns;
    noted_mono_ns_ = monoNs();
    failure_ = failure;
  }
  cv_.notify_all();
}

void VerdictBoard::setVerdict(const std::string& incident_id, const std::string& line) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (incident_ != incident_id) {
      return;
    }
    verdict_ = line.substr(0, kMaxVerdictLineBytes);
  }
  cv_.notify_all();
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
  return "frnccl: incident " + id + ": the verdict follows in the log of the rank that opened it; " + where;
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
