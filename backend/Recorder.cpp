#include "Recorder.hpp"

#include <pthread.h>
#include <algorithm>
#include <cstring>

#include <ATen/core/Tensor.h>

#include "Clock.hpp"

namespace frnccl {

static_assert(sizeof(Entry) <= 512, "an entry must stay within 512 bytes");

const char* opName(OpKind op) {
  switch (op) {
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kAllreduce:
      return "all_reduce";
    case OpKind::kAllreduceCoalesced:
      return "allreduce_coalesced";
    case OpKind::kReduce:
      return "reduce";
    case OpKind::kAllgather:
      return "all_gather";
    case OpKind::kAllgatherBase:
      return "_all_gather_base";
    case OpKind::kAllgatherCoalesced:
      return "ALLGATHER_coalesced";
    case OpKind::kAllgatherIntoTensorCoalesced:
      return "all_gather_into_tensor_coalesced";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kReduceScatterBase:
      return "_reduce_scatter_base";
    case OpKind::kReduceScatterTensorCoalesced:
      return "reduce_scatter_tensor_coalesced";
    case OpKind::kAlltoall:
      return "all_to_all";
    case OpKind::kAlltoallBase:
      return "all_to_all_single";
    case OpKind::kGather:
      return "gather";
    case OpKind::kScatter:
      return "scatter";
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
    case OpKind::kRecvAnysource:
      return "recv";
    case OpKind::kBarrier:
      return "barrier";
    case OpKind::kMonitoredBarrier:
      return "barrier";
    case OpKind::kCoalesced:
      return "coalesced";
  }
  return "unknown";
}

Recorder& Recorder::get() {
  // Deliberately leaked (see the class comment), like torch's own singletons.
  static Recorder* instance = new Recorder();
  return *instance;
}

void Recorder::configure(size_t capacity, CaptureMode stacks) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!entries_.empty()) {
    return; // sized once, by the first group
  }
  capacity_ = capacity;
  stack_mode_ = stacks;
  entries_.resize(capacity);
}

void Recorder::startLife(int64_t life) {
  std::vector<std::shared_ptr<CallerStack>> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    life_ = life;
    dropped.reserve(entries_.size());
    for (Entry& slot : entries_) {
      if (slot.stack) {
        dropped.push_back(std::move(slot.stack));
      }
      slot = Entry{}; // record_id -1: neither dumped nor counted as dropped when overwritten
    }
    for (PgInfo& pg : pgs_) {
      // Kept for its index only: an earlier life's group is never dumped, so its rank list (one int per
      // rank of the job) need not stay.
      std::vector<int64_t>().swap(pg.global_ranks);
    }
    // Every earlier life's entries are gone: the slots of its groups that are gone too can be given out.
    reusable_.clear();
    for (size_t index = pgs_.size(); index-- > 0;) {
      if (released_[index] && pgs_[index].life < life_) {
        reusable_.push_back(static_cast<int32_t>(index));
      }
    }
  }
  // Outside the lock; frames are pinned code objects, so no GIL is needed.
  dropped.clear();
}

int32_t Recorder::registerPg(PgInfo info) {
  std::lock_guard<std::mutex> lock(mutex_);
  info.life = life_;
  if (!reusable_.empty()) {
    const int32_t index = reusable_.back();
    reusable_.pop_back();
    info.pg_id = index;
    pgs_[index] = std::move(info);
    released_[index] = false;
    return index;
  }
  info.pg_id = static_cast<int32_t>(pgs_.size());
  pgs_.push_back(std::move(info));
  released_.push_back(false);
  return static_cast<int32_t>(pgs_.size() - 1);
}

void Recorder::releasePg(int32_t pg_index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (pg_index < 0 || size_t(pg_index) >= pgs_.size() || released_[pg_index]) {
    return;
  }
  // Given out only from the next life on, even for a group of an earlier life: one kept past its life's end
  // may have recorded entries in this one, which are dropped only when the next life begins.
  released_[pg_index] = true;
}

size_t Recorder::pgSlots() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pgs_.size();
}

void Recorder::updatePgDesc(int32_t pg_index, const std::string& desc) {
  std::lock_guard<std::mutex> lock(mutex_);
  pgs_.at(pg_index).desc = desc;
}

void Recorder::updatePgName(int32_t pg_index, const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  pgs_.at(pg_index).name = name;
}

namespace {

void appendShapes(
    c10::ArrayRef<at::Tensor> tensors,
    c10::SmallVector<int64_t, 8>& shapes,
    c10::SmallVector<uint8_t, 4>& ranks,
    c10::SmallVector<c10::ScalarType, 4>& dtypes) {
  for (const auto& t : tensors) {
    if (!t.defined()) {
      ranks.push_back(0);
      dtypes.push_back(c10::ScalarType::Undefined);
      continue;
    }
    auto sizes = t.sizes();
    ranks.push_back(static_cast<uint8_t>(sizes.size()));
    shapes.append(sizes.begin(), sizes.end());
    dtypes.push_back(t.scalar_type());
  }
}

thread_local uint64_t tls_thread_id = 0;
thread_local char tls_thread_name[16] = {};
thread_local int64_t tls_name_read_ns = 0;

void loadThreadIdentity(int64_t now_ns) {
  if (tls_thread_id == 0) {
    tls_thread_id = static_cast<uint64_t>(pthread_self());
  }
  // Names change (torch renames its threads), but reading one is a syscall:
  // re-read at most once a second per thread.
  constexpr int64_t kNameTtlNs = 1000000000LL;
  if (tls_name_read_ns == 0 || now_ns - tls_name_read_ns >= kNameTtlNs) {
    pthread_getname_np(pthread_self(), tls_thread_name, sizeof(tls_thread_name));
    tls_name_read_ns = now_ns;
  }
}

} // namespace

int64_t Recorder::record(
    const OpRecord& op,
    c10::ArrayRef<at::Tensor> inputs,
    c10::ArrayRef<at::Tensor> outputs) {
  if (capacity_ == 0) {
    return -1;
  }
  Entry fresh;
  fresh.pg_index = op.pg_index;
  fresh.op = op.op;
  fresh.backend = op.backend;
  fresh.collective_seq = op.collective_seq;
  fresh.p2p_seq = op.p2p_seq;
  fresh.op_id = op.op_id;
  fresh.timeout_ms = op.timeout_ms;
  fresh.peer_local = op.peer_local;
  fresh.peer_global = op.peer_global;
  fresh.created_ns = wallNs();
  loadThreadIdentity(fresh.created_ns);
  fresh.thread_id = tls_thread_id;
  std::memcpy(fresh.thread_name, tls_thread_name, sizeof(fresh.thread_name));
  appendShapes(inputs, fresh.shapes, fresh.input_ranks, fresh.input_dtypes);
  appendShapes(outputs, fresh.shapes, fresh.output_ranks, fresh.output_dtypes);
  if (stack_mode_ != CaptureMode::kNone) {
    // Without the GIL once the code objects are pinned, or with it where the frame walk is off (CallerStack.cpp).
    fresh.stack = captureCallerStack(stack_mode_);
  }

  // The evicted entry's stack leaves the lock with us, to be reused by this
  // thread's next capture.
  std::shared_ptr<CallerStack> evicted_stack;
  int64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    id = next_id_++;
    fresh.record_id = id;
    Entry& slot = entries_[static_cast<size_t>(id) % capacity_];
    if (slot.record_id >= 0 && !slot.discarded) {
      PgInfo& old_pg = pgs_[slot.pg_index];
      if (isP2P(slot.op)) {
        old_pg.last_dropped_p2p = std::max(old_pg.last_dropped_p2p, slot.p2p_seq);
      } else {
        old_pg.last_dropped_collective =
            std::max(old_pg.last_dropped_collective, slot.collective_seq);
      }
    }
    PgInfo& pg = pgs_[op.pg_index];
    ++pg.ops_by_kind[static_cast<size_t>(op.op)];
    if (pg.last_completed_collective >= pg.last_enqueued_collective && pg.last_completed_p2p >= pg.last_enqueued_p2p) {
      pg.progress_wall_ns = std::max(pg.progress_wall_ns, fresh.created_ns);
    }
    if (isP2P(op.op)) {
      pg.last_enqueued_p2p = std::max(pg.last_enqueued_p2p, op.p2p_seq);
    } else {
      pg.last_enqueued_collective =
          std::max(pg.last_enqueued_collective, op.collective_seq);
    }
    evicted_stack = std::move(slot.stack);
    slot = std::move(fresh);
  }
  recycleCallerStack(std::move(evicted_stack));
  prefetchSlot(static_cast<size_t>(id + 1) % capacity_);
  return id;
}

void Recorder::prefetchSlot(size_t index) const {
  // The ring is larger than a core's cache, so the slot the next op writes
  // was last touched a full ring ago. Asking for it now, ops ahead of its
  // use, takes those misses off the next op's path. Only a hint: a racing
  // writer or a resize changes nothing but the hint's usefulness.
  const char* begin = reinterpret_cast<const char*>(entries_.data() + index);
  for (size_t offset = 0; offset < sizeof(Entry); offset += 64) {
    __builtin_prefetch(begin + offset, /*write=*/1, /*locality=*/3);
  }
}

namespace {

// Advances the group's last started (and completed) seq for this entry's kind.
void noteProgress(PgInfo& pg, const Entry& e, bool completed) {
  const bool p2p = isP2P(e.op);
  int64_t& started = p2p ? pg.last_started_p2p : pg.last_started_collective;
  int64_t& done = p2p ? pg.last_completed_p2p : pg.last_completed_collective;
  const int64_t seq = p2p ? e.p2p_seq : e.collective_seq;
  started = std::max(started, seq);
  if (completed) {
    done = std::max(done, seq);
  }
}

} // namespace

Entry* Recorder::find(int64_t id) {
  if (id < 0 || capacity_ == 0) {
    return nullptr;
  }
  Entry& slot = entries_[static_cast<size_t>(id) % capacity_];
  return slot.record_id == id ? &slot : nullptr;
}

void Recorder::markStarted(int64_t id, int64_t when_ns) {
  apply({Progress{id, when_ns, false}});
}

void Recorder::markCompleted(
    int64_t id,
    int64_t when_ns,
    float duration_ms,
    int64_t gpu_started_ns,
    int64_t gpu_completed_ns) {
  apply({Progress{id, when_ns, true, duration_ms, gpu_started_ns, gpu_completed_ns}});
}

void Recorder::apply(const std::vector<Progress>& updates) {
  // A poll hands over a few hundred updates, each touching an entry the op
  // path wrote last, from another core: taken whole, the lock would stall an
  // enqueuing thread's record() for tens of microseconds. A bounded batch
  // per hold keeps that stall to a few. Updates come oldest op first, so a
  // snapshot taken between batches sees a prefix of the poll, as if taken
  // a moment earlier.
  constexpr size_t kUpdatesPerHold = 32;
  for (size_t begin = 0; begin < updates.size(); begin += kUpdatesPerHold) {
    const size_t end = std::min(updates.size(), begin + kUpdatesPerHold);
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = begin; i < end; ++i) {
      applyLocked(updates[i]);
    }
  }
}

void Recorder::applyLocked(const Progress& p) {
  Entry* e = find(p.id);
  if (e == nullptr) {
    return;
  }
  if (!p.completed) {
    if (e->started_ns == 0) {
      e->started_ns = p.when_ns;
      noteProgress(pgs_[e->pg_index], *e, /*completed=*/false);
    }
    return;
  }
  if (e->started_ns == 0) {
    e->started_ns = p.when_ns;
  }
  e->completed_ns = p.when_ns;
  e->duration_ms = p.duration_ms;
  e->gpu_started_ns = p.gpu_started_ns;
  e->gpu_completed_ns = p.gpu_completed_ns;
  e->retired = true;
  PgInfo& pg = pgs_[e->pg_index];
  noteProgress(pg, *e, /*completed=*/true);
  pg.progress_wall_ns = std::max(pg.progress_wall_ns, p.when_ns);
}

void Recorder::retire(int64_t id, bool failed) {
  std::lock_guard<std::mutex> lock(mutex_);
  Entry* e = find(id);
  if (e != nullptr) {
    e->retired = true;
    e->failed = failed;
  }
}

void Recorder::discard(int64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  Entry* e = find(id);
  if (e == nullptr) {
    return;
  }
  e->discarded = true;
  PgInfo& pg = pgs_[e->pg_index];
  int64_t& last = isP2P(e->op) ? pg.last_enqueued_p2p : pg.last_enqueued_collective;
  const int64_t seq = isP2P(e->op) ? e->p2p_seq : e->collective_seq;
  if (last == seq) {
    last = seq - 1;
  }
}

Snapshot Recorder::snapshot(bool with_stacks, size_t max_entries) const {
  Snapshot snap;
  std::lock_guard<std::mutex> lock(mutex_);
  snap.capacity = capacity_;
  snap.life = life_;
  snap.pgs = pgs_;
  if (capacity_ == 0 || next_id_ == 0) {
    return snap;
  }
  const int64_t count = std::min<int64_t>({next_id_, int64_t(capacity_), int64_t(std::min<size_t>(max_entries, INT64_MAX))});
  snap.entries.reserve(count);
  if (with_stacks) {
    snap.stacks.reserve(count);
  }
  for (int64_t id = next_id_ - count; id < next_id_; ++id) {
    const Entry& slot = entries_[static_cast<size_t>(id) % capacity_];
    // Emptied by startLife, or an op of an earlier life's group recorded since.
    if (slot.discarded || slot.record_id != id || pgs_[slot.pg_index].life != life_) {
      continue;
    }
    Entry copy = slot;
    // The ring still holds every stack, so dropping the copy's reference
    // here never frees Python frames (which would need the GIL).
    if (with_stacks) {
      snap.stacks.push_back(std::move(copy.stack));
    }
    copy.stack.reset();
    snap.entries.push_back(std::move(copy));
  }
  return snap;
}

MetricsView Recorder::metricsView(size_t max_entries, size_t waits_per_group, int64_t completed_after_ns) const {
  MetricsView view;
  std::lock_guard<std::mutex> lock(mutex_);
  view.life = life_;
  std::vector<int32_t> slot_of(pgs_.size(), -1); // pg index -> view.pgs index
  for (size_t index = 0; index < pgs_.size(); ++index) {
    const PgInfo& pg = pgs_[index];
    if (pg.life != life_) {
      continue;
    }
    slot_of[index] = static_cast<int32_t>(view.pgs.size());
    PgCounters c;
    static_cast<PgState&>(c) = pg;
    c.pg_index = static_cast<int32_t>(index);
    view.pgs.push_back(std::move(c));
  }
  if (capacity_ == 0) {
    return view;
  }
  const int64_t scan = std::min<int64_t>({next_id_, int64_t(capacity_), int64_t(std::min<size_t>(max_entries, INT64_MAX))});
  for (int64_t id = next_id_ - 1; id >= next_id_ - scan; --id) {
    const Entry& e = entries_[static_cast<size_t>(id) % capacity_];
    // A coalesced block of sends and recvs is p2p too (its p2p seq is set): its members do not complete at once.
    if (e.record_id != id || e.discarded || isP2P(e.op) || e.p2p_seq > 0 || e.completed_ns <= completed_after_ns ||
        e.completed_ns <= 0 || e.completed_ns < e.created_ns ||
        e.pg_index < 0 || size_t(e.pg_index) >= slot_of.size() || slot_of[e.pg_index] < 0) {
      continue;
    }
    PgCounters& pg = view.pgs[slot_of[e.pg_index]];
    if (pg.waits_ns.size() < waits_per_group) {
      pg.waits_ns.push_back(e.completed_ns - e.created_ns);
      pg.enqueued_ns.push_back(e.created_ns);
    }
  }
  return view;
}

std::vector<PgInfo> Recorder::pgs() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pgs_;
}

} // namespace frnccl
