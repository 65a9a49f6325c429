// An incident's parts and its verdict through the root TCPStore: each rank
// announces its written part, the trigger waits for every rank's (bounded by
// the incident's deadline), posts the rank summaries, and the rank that judges
// posts the verdict, which the others fetch. Runs on the monitor thread, but
// for awaitIncident's reads from other threads (MonitorCoordination.cpp).
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

void HeartbeatMonitor::announceWritten(const std::string& incident_id) {
  if (store_lost_.load()) {
    return;
  }
  try {
    store()->append(writersKey(incident_id), bytes(std::to_string(config_.rank) + ","));
    store()->add(writtenKey(incident_id), 1);
  } catch (const std::exception& e) {
    noteStoreFailure(e);
    logLine(config_, "cannot report dump %s to the store: %s", incident_id.c_str(), oneLineErrorText(e).c_str());
  }
}

void HeartbeatMonitor::awaitAllRanks(const std::string& incident_id, int64_t start_mono_ns, bool verdict, int64_t wait_ms) {
  // One deadline for the whole wait; returns as soon as every rank wrote.
  std::string store_error;
  const int64_t bound_ms = wait_ms < 0 ? config_.dump_timeout_ms : wait_ms;
  const int64_t written = countWriters(incident_id, start_mono_ns + bound_ms * 1000000LL, store_error);
  if (!store_error.empty()) {
    logLine(config_, "store unreachable while waiting for dump %s: %s", incident_id.c_str(), store_error.c_str());
  }
  const double seconds = double(monoNs() - start_mono_ns) / 1e9;
  // Ranks that did not write: missing, or gone from the job (they left
  // cleanly before the request reached them), listed apart.
  std::string missing;
  std::string left;
  std::vector<bool> wrote;
  std::vector<bool> gone;
  if (written < config_.world_size) {
    int listed_missing = 0;
    int listed_left = 0;
    auto list = [](std::string& out, int& listed, int64_t rank) {
      if (listed++ < 64) {
        out += (out.empty() ? "" : ",") + std::to_string(rank);
      }
    };
    try {
      if (!store_lost_.load()) {
        readDoneRanks(incident_id, wrote, gone);
      }
    } catch (const std::exception& e) {
      noteStoreFailure(e); // no list: the count above says how many
      wrote.clear();
    }
    for (size_t r = 0; r < wrote.size(); ++r) {
      if (gone[r]) {
        list(left, listed_left, int64_t(r));
      } else if (!wrote[r]) {
        list(missing, listed_missing, int64_t(r));
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
  if (!verdict) {
    return;
  }
  if (store_error.empty() && !store_lost_.load()) {
    announceVerdict(incident_id, written, wrote, gone, seconds);
  } else {
    postUndecidedVerdict(incident_id, "the store was unreachable while the ranks wrote", seconds);
  }
}

void HeartbeatMonitor::postSummary(const std::string& incident_id, const SummaryInput& in) {
  if (!storeUsable()) {
    return;
  }
  std::string previous;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (posted_summary_incident_ == incident_id) {
      return; // posted for this incident already (a second writer of this rank's part)
    }
    previous = posted_summary_incident_;
    posted_summary_incident_ = incident_id;
  }
  try {
    const std::string text = buildRankSummary(in);
    store()->set(summaryKey(incident_id, config_.rank), bytes(text));
    if (!previous.empty()) {
      store()->deleteKey(summaryKey(previous, config_.rank));
    }
  } catch (const std::exception& e) {
    noteStoreFailure(e);
    logLine(config_, "cannot post this rank's summary of %s: %s", incident_id.c_str(), oneLineErrorText(e).c_str());
  }
}

void HeartbeatMonitor::announceVerdict(const std::string& incident_id, int64_t written, const std::vector<bool>& wrote_in,
                                       const std::vector<bool>& gone_in, double seconds) {
  const int64_t t0 = monoNs();
  const size_t world = size_t(std::max<int64_t>(config_.world_size, 0));
  std::vector<bool> wrote = wrote_in;
  std::vector<bool> gone = gone_in;
  VerdictInput in;
  in.world_size = config_.world_size;
  in.incident_id = incident_id;
  in.incident_dir = config_.dump_dir + "/" + incident_id;
  in.wrote = written;
  in.seconds = seconds;
  in.summaries.resize(world);
  try {
    const c10::intrusive_ptr<c10d::Store> st = store();
    if (wrote.size() != world) {
      readDoneRanks(incident_id, wrote, gone); // every rank wrote: the lists were not read yet
    }
    // A writer posted its summary before it appended itself to the writers, a rank that left before it
    // marked itself as left; but TCPStore's multiGet waits (up to the store timeout) for a key that is not
    // there, as from a process that counted itself without one: a batch that check() does not find whole is
    // read key by key, without waiting.
    std::vector<std::string> keys;
    std::vector<size_t> owners;
    auto flush = [&] {
      if (keys.empty()) {
        return;
      }
      if (st->check(keys)) {
        const std::vector<std::vector<uint8_t>> values = st->multiGet(keys);
        for (size_t i = 0; i < values.size() && i < owners.size(); ++i) {
          in.summaries[owners[i]] = text(values[i]);
        }
      } else {
        for (size_t i = 0; i < keys.size(); ++i) {
          in.summaries[owners[i]] = readIfPresent(*st, keys[i]);
        }
      }
      keys.clear();
      owners.clear();
    };
    // A rank that posted its summary but did not count itself written (its files slow or failing) is read
    // apart, key by key: few, and a batch with a missing key takes the slow path.
    size_t non_writers_read = 0;
    for (size_t r = 0; r < world; ++r) {
      if (r < wrote.size() && wrote[r]) {
        keys.push_back(summaryKey(incident_id, int64_t(r)));
      } else if (r < gone.size() && gone[r]) {
        keys.push_back(leftSummaryKey(int64_t(r)));
      } else {
        if (non_writers_read++ < kMaxNonWriterSummaries) {
          in.summaries[r] = readIfPresent(*st, summaryKey(incident_id, int64_t(r)));
        }
        continue;
      }
      owners.push_back(r);
      if (keys.size() == kSummaryBatch) {
        flush();
      }
    }
    flush();
  } catch (const std::exception& e) {
    noteStoreFailure(e);
    logLine(config_, "cannot read the ranks' summaries of incident %s: %s", incident_id.c_str(), oneLineErrorText(e).c_str());
    postUndecidedVerdict(incident_id, "the store failed while the ranks' summaries were read", seconds + double(monoNs() - t0) / 1e9);
    return;
  }
  // A writer whose summary was not there counts as one without a summary; every value is checked by the reader.
  const int64_t t_read = monoNs();
  const Verdict verdict = computeVerdict(in);
  const int64_t t_done = monoNs();
  for (const std::string& line : verdict.lines) {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
  logLine(config_, "verdict of %s in %.0f ms (store reads %.0f ms, %zu summaries)", incident_id.c_str(),
          double(t_done - t0) / 1e6, double(t_read - t0) / 1e6,
          size_t(std::count_if(in.summaries.begin(), in.summaries.end(), [](const auto& s) { return s.has_value(); })));
  if (verdict.lines.empty()) {
    return;
  }
  // seconds: since the incident opened, until every rank wrote (or the deadline); then the reads and the rules.
  const std::string json = verdictJson(verdict, in, config_.rank, in.seconds + double(monoNs() - t0) / 1e9);
  // The ranks first (their errors wait for it), then the files, whose folder may be slow (NFS).
  postVerdict(incident_id, verdict.lines.front(), verdict.decided ? verdict.culprits : std::vector<int64_t>{}, json);
  for (const std::string& problem : writeVerdictFiles(config_, incident_id, json)) {
    logLine(config_, "%s", problem.c_str());
  }
}

void HeartbeatMonitor::postUndecidedVerdict(const std::string& incident_id, const std::string& why, double seconds) {
  // Every failure incident ends in a verdict line, so that no error waits for one that never comes.
  const std::string line = "frnccl: verdict: undecided: " + why;
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  Verdict verdict;
  verdict.undecided_reason = why;
  verdict.lines = {line};
  VerdictInput in;
  in.world_size = config_.world_size;
  in.incident_id = incident_id;
  in.incident_dir = config_.dump_dir + "/" + incident_id;
  const std::string json = verdictJson(verdict, in, config_.rank, seconds);
  postVerdict(incident_id, line, {}, json);
  for (const std::string& problem : writeVerdictFiles(config_, incident_id, json)) {
    logLine(config_, "%s", problem.c_str());
  }
}

void HeartbeatMonitor::postVerdict(const std::string& incident_id, const std::string& line, const std::vector<int64_t>& culprits,
                                   const std::string& json) {
  VerdictBoard::get().setVerdict(incident_id, line, culprits, json);
  if (!storeUsable()) {
    return;
  }
  std::string previous;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    previous = posted_verdict_incident_;
    posted_verdict_incident_ = incident_id;
  }
  try {
    store()->set(verdictKey(incident_id), bytes(encodeVerdictValue(line, culprits, json)));
    if (!previous.empty() && previous != incident_id) {
      store()->deleteKey(verdictKey(previous));
    }
  } catch (const std::exception& e) {
    noteStoreFailure(e);
    return;
  }
  wakeAllRanks(incident_id); // each rank's next pass reads the verdict (fetchVerdict)
}

void HeartbeatMonitor::fetchVerdict() {
  const std::string id = VerdictBoard::get().awaitedIncident();
  if (id.empty() || !storeUsable()) {
    return;
  }
  // Not on every pass (serveBeforeLeaving passes every 20 ms): a job of many ranks would read it many times a
  // second while it is due.
  const int64_t now = monoNs();
  const bool pushed = waiter_ && waiter_->listening();
  const bool woken = seen_wakes_ != verdict_fetch_wakes_;
  if (!woken && (pushed || now - last_verdict_fetch_mono_ns_ < config_.coord_check_ms * 1000000LL)) {
    return;
  }
  verdict_fetch_wakes_ = seen_wakes_;
  last_verdict_fetch_mono_ns_ = now;
  try {
    if (const std::optional<std::string> raw = readIfPresent(*store(), verdictKey(id))) {
      // Any client of the store may have written it: one printable line, bounded, and ranks of this job.
      std::string line;
      std::vector<int64_t> culprits;
      std::string json;
      decodeVerdictValue(*raw, config_.world_size, line, culprits, json);
      VerdictBoard::get().setVerdict(id, line, std::move(culprits), json);
    }
  } catch (const std::exception& e) {
    noteStoreFailure(e);
  }
}

} // namespace frnccl
