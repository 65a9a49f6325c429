#include "MetricsSnapshot.hpp"

#include <algorithm>

#include "Clock.hpp"
#include "Runtime.hpp"
#include "Watchdog.hpp"

namespace frnccl {

namespace {

// How far back in the ring the waits are looked for: the copy is made under the recorder's lock, which the op
// path takes, so the scan is bounded (a few busy groups fill their samples well within it).
constexpr size_t kScannedEntries = 4096;

double medianOf(std::vector<int64_t>& values) {
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  if (values.size() % 2 == 1) {
    return double(values[mid]);
  }
  const int64_t upper = values[mid];
  const int64_t lower = *std::max_element(values.begin(), values.begin() + mid);
  return (double(lower) + double(upper)) / 2.0;
}

} // namespace

MetricsSnapshot takeMetricsSnapshot() {
  MetricsSnapshot out;
  const Recorder& recorder = Recorder::get();
  out.recording = recorder.enabled();
  MetricsView view = recorder.metricsView(kScannedEntries, kWaitSampleOps);
  out.life = view.life;
  const int64_t now_wall = wallNs();
  for (PgCounters& pg : view.pgs) {
    GroupMetrics g;
    const bool pending = pg.last_completed_collective < pg.last_enqueued_collective ||
        pg.last_completed_p2p < pg.last_enqueued_p2p;
    if (pending && pg.progress_wall_ns > 0) {
      g.stalled_s = std::max<double>(0.0, double(now_wall - pg.progress_wall_ns) / 1e9);
    }
    if (!pg.waits_ns.empty()) {
      g.wait_samples = static_cast<int64_t>(pg.waits_ns.size());
      g.wait_median_s = medianOf(pg.waits_ns) / 1e9;
      pg.waits_ns.clear();
    }
    g.pg = std::move(pg);
    out.groups.push_back(std::move(g));
  }
  if (Watchdog* watchdog = Runtime::get().watchdog()) {
    const WatchdogHealth health = watchdog->health();
    out.watchdog = true;
    out.watchdog_max_lag_s = health.max_discovery_lag_ms / 1e3;
    out.watchdog_mean_lag_s = health.mean_discovery_lag_ms / 1e3;
    if (health.last_heartbeat_ns > 0) {
      out.watchdog_beat_age_s = std::max<double>(0.0, double(now_wall - health.last_heartbeat_ns) / 1e9);
    }
  }
  out.tally = VerdictBoard::get().tally();
  return out;
}

} // namespace frnccl
