#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

#include "CallerStack.hpp"

namespace at {
class Tensor;
}

namespace frnccl {

// Which operation an entry records; names follow torch's flight recorder so
// its tools recognise them.
enum class OpKind : uint8_t {
  kBroadcast,
  kAllreduce,
  kAllreduceCoalesced,
  kReduce,
  kAllgather,
  kAllgatherBase,
  kAllgatherCoalesced,
  kAllgatherIntoTensorCoalesced,
  kReduceScatter,
  kReduceScatterBase,
  kReduceScatterTensorCoalesced,
  kAlltoall,
  kAlltoallBase,
  kGather,
  kScatter,
  kSend,
  kRecv,
  kRecvAnysource,
  kBarrier,
  kMonitoredBarrier,
  kCoalesced,
};
constexpr size_t kOpKindCount = static_cast<size_t>(OpKind::kCoalesced) + 1;
const char* opName(OpKind op);
inline bool isP2P(OpKind op) {
  return op == OpKind::kSend || op == OpKind::kRecv ||
      op == OpKind::kRecvAnysource;
}

enum class InnerKind : uint8_t { kGloo, kNccl };

// One row of the ring buffer. Kept small (see static_assert in Recorder.cpp):
// per-group strings live in PgInfo, shapes are stored flattened.
struct Entry {
  int64_t record_id = -1;
  int32_t pg_index = -1;
  OpKind op = OpKind::kBarrier;
  InnerKind backend = InnerKind::kGloo;
  bool retired = false;
  bool failed = false;
  bool discarded = false; // the op failed before it was issued: not in dumps
  int32_t peer_local = -1; // group-local peer rank for p2p
  int32_t peer_global = -1;
  int64_t collective_seq = 0;
  int64_t p2p_seq = 0;
  int64_t op_id = 0;
  int64_t timeout_ms = 0;
  int64_t created_ns = 0;
  int64_t started_ns = 0; // 0: not seen
  int64_t completed_ns = 0; // 0: not seen
  int64_t gpu_started_ns = 0;
  int64_t gpu_completed_ns = 0;
  float duration_ms = -1.f; // < 0: unknown
  uint64_t thread_id = 0;
  char thread_name[16] = {};
  c10::SmallVector<int64_t, 8> shapes; // input dims then output dims
  c10::SmallVector<uint8_t, 4> input_ranks; // rank (ndim) of each input
  c10::SmallVector<uint8_t, 4> output_ranks;
  c10::SmallVector<c10::ScalarType, 4> input_dtypes;
  c10::SmallVector<c10::ScalarType, 4> output_dtypes;
  std::shared_ptr<CallerStack> stack;
};

// A process group as the recorder knows it, less its member list (100k ranks in a world group): what
// metrics copy under the recorder's lock (PgCounters).
struct PgState {
  int32_t pg_id = 0;
  // The life of the process the group was created in (Recorder::startLife): dumps show only the current one's.
  int64_t life = 0;
  std::string name;
  std::string desc;
  std::string backends;
  int64_t timeout_ms = 0;
  int64_t size = 0;
  int64_t rank_in_group = 0;
  int64_t last_enqueued_collective = 0;
  int64_t last_started_collective = 0;
  int64_t last_completed_collective = 0;
  int64_t last_enqueued_p2p = 0;
  int64_t last_started_p2p = 0;
  int64_t last_completed_p2p = 0;
  int64_t last_dropped_collective = -1;
  int64_t last_dropped_p2p = -1;
  // For metrics (MetricsSnapshot.hpp): ops recorded per kind, and the wall time the group last made
  // progress: its latest completion, or the enqueue of an op issued while none was pending, so that an
  // idle group's first op does not look like a long stall.
  std::array<int64_t, kOpKindCount> ops_by_kind{};
  int64_t progress_wall_ns = 0;
};

struct PgInfo : PgState {
  std::vector<int64_t> global_ranks;
};

struct OpRecord {
  int32_t pg_index;
  OpKind op;
  InnerKind backend;
  int64_t collective_seq;
  int64_t p2p_seq;
  int64_t op_id;
  int64_t timeout_ms;
  int32_t peer_local;
  int32_t peer_global;
};

// What metrics read (MetricsSnapshot.hpp), copied small under the recorder's lock: a group's state, and the
// waits of its newest completed collectives.
struct PgCounters : PgState {
  int32_t pg_index = 0;
  std::vector<int64_t> waits_ns; // enqueue to completion, newest first
  std::vector<int64_t> enqueued_ns; // the same ops' enqueue (wall), for the slow-rank detector's windows
};
struct MetricsView {
  int64_t life = 0;
  std::vector<PgCounters> pgs; // this life's groups
};

// Point-in-time copy taken for a dump; holds no Python references, so it can
// be built and destroyed without the GIL.
struct Snapshot {
  std::vector<PgInfo> pgs;
  std::vector<Entry> entries; // stack left empty
  std::vector<std::shared_ptr<CallerStack>> stacks; // parallel to entries, only when asked for
  size_t capacity = 0;
  // The process's life when taken: `pgs` holds every group ever registered (entries index it), and only
  // those of this life are dumped; `entries` holds only this life's.
  int64_t life = 0;
};

// The process-wide ring buffer. Leaked on purpose: entries may hold Python
// stacks whose release needs the GIL, which is gone at interpreter exit.
// Its size and stack mode are fixed by the process's first group; each life of
// the process (init_process_group after destroy_process_group) starts it empty.
// Lock: mutex_ guards entries_, pgs_ and life_; held only for copies, never for I/O.
class Recorder {
 public:
  static Recorder& get();

  void configure(size_t capacity, CaptureMode stacks);
  // A new life of the process begins (no frnccl group of the last one is alive): the last life's entries
  // are dropped, and its groups, whose names torch hands out again from 0, are never dumped again. A group
  // of an earlier life that records after this (one kept past its teardown) stays out of dumps too.
  void startLife(int64_t life);
  bool enabled() const {
    return capacity_ > 0;
  }
  size_t capacity() const {
    return capacity_;
  }

  // A group's index: a slot of its own, or that of a group of an earlier life whose backend is gone
  // (releasePg), so that a process that makes groups life after life (torchft makes one per quorum) keeps a
  // list as long as the most groups one life held, not as long as all it ever made.
  int32_t registerPg(PgInfo info);
  // The group's backend is gone: nothing records under its index again. The slot is given out once the next
  // life began, when no entry of the group's is left to dump.
  void releasePg(int32_t pg_index);
  // How many slots the group list holds (for tests: it stays flat over lives).
  size_t pgSlots() const;
  void updatePgDesc(int32_t pg_index, const std::string& desc);
  void updatePgName(int32_t pg_index, const std::string& name);

  // Returns the record id, -1 when recording is off.
  int64_t record(
      const OpRecord& op,
      c10::ArrayRef<at::Tensor> inputs,
      c10::ArrayRef<at::Tensor> outputs);

  // Updates from the watchdog. Each is a no-op when the entry was evicted.
  // A discovered start or completion; the watchdog hands over a poll's worth
  // at once, so the op path and the watchdog meet on the lock once per poll.
  struct Progress {
    int64_t id = -1;
    int64_t when_ns = 0;
    bool completed = false;
    float duration_ms = -1.f;
    int64_t gpu_started_ns = 0;
    int64_t gpu_completed_ns = 0;
  };
  void apply(const std::vector<Progress>& updates);
  void markStarted(int64_t id, int64_t when_ns);
  void markCompleted(
      int64_t id,
      int64_t when_ns,
      float duration_ms,
      int64_t gpu_started_ns,
      int64_t gpu_completed_ns);
  void retire(int64_t id, bool failed);
  // The op threw before the inner backend issued it, and gave its seq back:
  // dumps leave it out, so the group's seqs stay in step with its peers'.
  void discard(int64_t id);

  // `max_entries`: only the newest ones (a live summary needs no more than each group's latest ops).
  Snapshot snapshot(bool with_stacks, size_t max_entries = SIZE_MAX) const;
  std::vector<PgInfo> pgs() const;
  // This life's groups' counters, and per group the waits of up to `waits_per_group` of its newest completed
  // collectives among the newest `max_entries` entries, of those completed after `completed_after_ns` (wall).
  MetricsView metricsView(size_t max_entries, size_t waits_per_group, int64_t completed_after_ns = 0) const;

 private:
  Recorder() = default;
  Entry* find(int64_t id);
  void prefetchSlot(size_t index) const;
  void applyLocked(const Progress& update);

  mutable std::mutex mutex_;
  size_t capacity_ = 0;
  CaptureMode stack_mode_ = CaptureMode::kNone;
  int64_t next_id_ = 0;
  int64_t life_ = 0;
  std::vector<Entry> entries_;
  // Indexed by pg_index, never shrunk: a group of an earlier life may still hold its index.
  std::vector<PgInfo> pgs_;
  std::vector<bool> released_; // parallel to pgs_: the group's backend is gone
  std::vector<int32_t> reusable_; // released slots of earlier lives, given out by registerPg
};

} // namespace frnccl
