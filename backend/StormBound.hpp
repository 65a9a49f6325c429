#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace frnccl {

// Bounds the job-wide dumps a process writes without having asked for them (a
// request read from the store, the dump signal): anyone who can reach the
// store can publish requests, and each makes every rank write a dump. At most
// one failure (timeout, error) and one other dump per `min_interval_ms`, each
// kind on its own so that a manual dump never holds back a failure; at most
// `max_count` in all (0: no cap). Not thread-safe: the monitor thread owns it.
class StormBound {
 public:
  StormBound(int64_t min_interval_ms, int64_t max_count) : min_interval_ns_(min_interval_ms * 1000000LL), max_count_(max_count) {}

  // True if a dump of this kind may be written at `now_ns` (and counts it);
  // otherwise false, with `why` set.
  bool admit(bool failure, int64_t now_ns, std::string& why) {
    int64_t& last = failure ? last_failure_ns_ : last_other_ns_;
    char text[160];
    if (max_count_ > 0 && admitted_ >= max_count_) {
      std::snprintf(text, sizeof(text), "this process already wrote %lld job-wide dumps (FRNCCL_DUMP_MAX_COUNT)",
                    static_cast<long long>(admitted_));
    } else if (last != 0 && now_ns - last < min_interval_ns_) {
      std::snprintf(text, sizeof(text), "this process wrote a job-wide %s dump %.1f s ago (FRNCCL_DUMP_MIN_INTERVAL_SEC=%lld)",
                    failure ? "failure" : "non-failure", double(now_ns - last) / 1e9,
                    static_cast<long long>(min_interval_ns_ / 1000000000LL));
    } else {
      ++admitted_;
      last = now_ns;
      return true;
    }
    why = text;
    return false;
  }

  // Whether a drop at `now_ns` gets a log line (one a second at most); if so,
  // `dropped` is how many drops that line stands for.
  bool logDrop(int64_t now_ns, int64_t& dropped) {
    ++unlogged_;
    if (last_log_ns_ != 0 && now_ns - last_log_ns_ < 1000000000LL) {
      return false;
    }
    dropped = unlogged_;
    unlogged_ = 0;
    last_log_ns_ = now_ns;
    return true;
  }

 private:
  const int64_t min_interval_ns_;
  const int64_t max_count_;
  int64_t admitted_ = 0;
  int64_t last_failure_ns_ = 0;
  int64_t last_other_ns_ = 0;
  int64_t last_log_ns_ = 0;
  int64_t unlogged_ = 0;
};

} // namespace frnccl
