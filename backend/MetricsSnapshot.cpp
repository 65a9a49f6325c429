#include "MetricsSnapshot.hpp"

#include <algorithm>
#include <unordered_map>

#include "Clock.hpp"
#include "Runtime.hpp"
#include "Watchdog.hpp"

namespace frnccl {

namespace {

// The ring's newest entries that can hold kWaitSampleOps completed collectives of a few busy groups; the
// copy is taken under the recorder's lock, so it stays small.
constexpr size_t kSnapshotEntries = 4096;

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
  const Snapshot snap = recorder.snapshot(false, kSnapshotEntries);
  out.life = snap.life;
  const int64_t now_wall = wallNs();

  // Waits of the newest completed collectives, per group index, newest first.
  std::unordered_map<int32_t, std::vector<int64_t>> waits;
  for (auto it = snap.entries.rbegin(); it != snap.entries.rend(); ++it) {
    const Entry& e = *it;
    if (isP2P(e.op) || e.completed_ns <= 0 || e.completed_ns < e.created_ns) {
      continue;
    }
    std::vector<int64_t>& w = waits[e.pg_index];
    if (w.size() < kWaitSampleOps) {
      w.push_back(e.completed_ns - e.created_ns);
    }
  }
  for (size_t index = 0; index < snap.pgs.size(); ++index) {
    const PgInfo& pg = snap.pgs[index];
    if (pg.life != snap.life) {
      continue;
    }
    GroupMetrics g;
    g.pg_id = pg.pg_id;
    g.name = pg.name;
    g.desc = pg.desc;
    g.backends = pg.backends;
    g.size = pg.size;
    g.rank_in_group = pg.rank_in_group;
    g.last_enqueued_collective = pg.last_enqueued_collective;
    g.last_started_collective = pg.last_started_collective;
    g.last_completed_collective = pg.last_completed_collective;
    g.last_enqueued_p2p = pg.last_enqueued_p2p;
    g.last_started_p2p = pg.last_started_p2p;
    g.last_completed_p2p = pg.last_completed_p2p;
    const bool pending = pg.last_completed_collective < pg.last_enqueued_collective ||
        pg.last_completed_p2p < pg.last_enqueued_p2p;
    if (pending && pg.progress_wall_ns > 0) {
      g.stalled_s = std::max<double>(0.0, double(now_wall - pg.progress_wall_ns) / 1e9);
    }
    g.ops_by_kind = pg.ops_by_kind;
    auto found = waits.find(static_cast<int32_t>(index));
    if (found != waits.end() && !found->second.empty()) {
      g.wait_samples = static_cast<int64_t>(found->second.size());
      g.wait_median_s = medianOf(found->second) / 1e9;
    }
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
