#pragma once

// What fr_backend.metrics exports for Prometheus, read from the recorder, the watchdog and the verdict board
// in one call that needs no GIL. Plain values only: the binding turns them into Python objects afterwards.

#include <cstdint>
#include <string>
#include <vector>

#include "Recorder.hpp"
#include "Verdict.hpp"

namespace frnccl {

// Completed collectives per group whose waits make its median (see GroupMetrics::wait_median_s), found among
// the ring's newest 4096 entries.
constexpr size_t kWaitSampleOps = 64;

struct GroupMetrics {
  PgCounters pg; // its waits_ns left empty: wait_median_s holds what they give
  // Seconds since the group last made progress while an op of it is pending; 0 when none is.
  double stalled_s = 0;
  // Median, over the group's last kWaitSampleOps completed collectives, of enqueue to completion on this
  // rank: the rank the others wait for waits least. < 0 when none completed.
  double wait_median_s = -1;
  int64_t wait_samples = 0;
};

struct MetricsSnapshot {
  bool recording = false;
  int64_t life = 0;
  std::vector<GroupMetrics> groups; // this life's groups only
  bool watchdog = false; // false: no watchdog in this life yet
  double watchdog_max_lag_s = 0;
  double watchdog_mean_lag_s = 0;
  double watchdog_beat_age_s = 0;
  VerdictBoard::Tally tally;
};

MetricsSnapshot takeMetricsSnapshot();

} // namespace frnccl
