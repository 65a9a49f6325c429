#include "FrBackend.hpp"
#include "FrWork.hpp"

#include <c10/util/Exception.h>

#include "Clock.hpp"
#include "DeviceMarker.hpp"
#include "InnerProgress.hpp"
#include "NcclSymbols.hpp"
#include "Runtime.hpp"
#include "Verdict.hpp"
#include "Watchdog.hpp"

namespace frnccl {

using c10d::Work;

FrBackend::FrBackend(
    int rank,
    int size,
    c10::intrusive_ptr<c10d::Backend> cpu_backend,
    c10::intrusive_ptr<c10d::Backend> cuda_backend,
    std::string group_name,
    std::vector<int64_t> global_ranks,
    std::chrono::milliseconds timeout)
    : Backend(rank, size),
      config_(Runtime::get().lifeConfig()),
      life_(Runtime::get().currentLife()),
      cpu_(std::move(cpu_backend)),
      cuda_(std::move(cuda_backend)),
      global_ranks_(std::move(global_ranks)),
      timeout_ms_(timeout.count()) {
  TORCH_CHECK(cpu_ || cuda_, "frnccl: a group needs at least one inner backend");
  if (global_ranks_.empty()) {
    for (int r = 0; r < size; ++r) {
      global_ranks_.push_back(r);
    }
  }
  PgInfo info;
  info.name = std::move(group_name);
  // The inner backends' own names: on torch 2.15 "nccl" may be served by nccl2, and the dump says which.
  // A group that FRNCCL_ENABLE made from one the code put on gloo hands CUDA tensors to its Gloo too.
  info.backends = cpu_ && cuda_ && cuda_.get() != cpu_.get()
      ? cpu_->getBackendName() + "," + cuda_->getBackendName()
      : (cpu_ ? cpu_ : cuda_)->getBackendName();
  info.global_ranks = global_ranks_;
  info.timeout_ms = timeout.count();
  info.size = size;
  info.rank_in_group = rank;
  if (cuda_ && config_->settle_by_torch_watchdog) {
    cuda_progress_ = innerProgressOf(*cuda_);
  }
  pg_index_ = Recorder::get().registerPg(std::move(info));
  pg_uid_ = Recorder::get().pgs().at(pg_index_).name;
}

FrBackend::~FrBackend() {
  // Never aborts or joins: torch runs this from Python teardown and from
  // exception unwinding, where a blocking abort turns an error into a hang.
  if (!shut_down_.exchange(true)) {
    Runtime::get().detach(this, Runtime::Leaving::kDropped);
  }
  Recorder::get().releasePg(pg_index_);
}

void FrBackend::syncIdentity() {
  // torch sets desc and bound device through non-virtual setters after the
  // creator returns, so they are picked up here, on the first op.
  if (identity_synced_.exchange(true)) {
    return;
  }
  for (auto* inner : {&cpu_, &cuda_}) {
    if (*inner) {
      (*inner)->setGroupDesc(pg_desc_);
      if (bound_device_id_ && (*inner).get() == cuda_.get()) {
        (*inner)->setBoundDeviceId(bound_device_id_);
      }
    }
  }
  Recorder::get().updatePgDesc(pg_index_, pg_desc_);
}

void FrBackend::setGroupUid(const std::string& pg_uid) {
  Backend::setGroupUid(pg_uid);
  for (auto* inner : {&cpu_, &cuda_}) {
    if (*inner) {
      (*inner)->setGroupUid(pg_uid);
    }
  }
  Recorder::get().updatePgName(pg_index_, pg_uid);
}

c10::intrusive_ptr<c10d::Backend>& FrBackend::innerFor(const at::Device& device) {
  if (device.is_cuda()) {
    TORCH_CHECK(
        cuda_,
        "frnccl: got a CUDA tensor, but this group has no NCCL backend (CUDA was not available when the group was created)");
    return cuda_;
  }
  TORCH_CHECK(
      cpu_,
      "frnccl: got a ", device.str(), " tensor, but this group has no Gloo backend for CPU tensors");
  return cpu_;
}

int64_t FrBackend::timeoutMs(std::chrono::milliseconds op_timeout) const {
  return op_timeout.count() > 0 ? op_timeout.count() : timeout_ms_.load();
}

namespace {

at::Device deviceOf(c10::ArrayRef<at::Tensor> tensors) {
  for (const auto& t : tensors) {
    if (t.defined()) {
      return t.device();
    }
  }
  return at::Device(at::kCPU);
}

std::atomic<int64_t> g_timed_counter{0};

} // namespace

template <typename Fn>
c10::intrusive_ptr<Work> FrBackend::run(const Call& call, Fn&& fn) {
  if (C10_UNLIKELY(aborted_after_timeout_.load(std::memory_order_acquire))) {
    std::string why;
    {
      std::lock_guard<std::mutex> lock(abort_mutex_);
      why = abort_reason_;
    }
    // The incident's verdict once known (no wait here: a new call is not the one that timed out; the abort
    // came from the incident, whenever it was opened).
    const std::string note = VerdictBoard::get().errorNote(0, 0, /*op_created_mono_ns=*/0);
    if (!note.empty()) {
      why += "\n" + note;
    }
    C10_THROW_ERROR(DistBackendError, why);
  }
  if (!identity_synced_.load(std::memory_order_relaxed)) {
    syncIdentity();
  }
  Watchdog* const watchdog = Runtime::get().watchdogOf(life_); // leaked by Runtime: stays valid
  if (watchdog != nullptr) {
    watchdog->releaseFinished();
  }
  c10::intrusive_ptr<c10d::Backend>& inner = innerFor(call.device);
  const bool p2p = isP2P(call.op);
  OpRecord rec{};
  rec.pg_index = pg_index_;
  rec.op = call.op;
  rec.backend = call.device.is_cuda() && cudaOnNccl() ? InnerKind::kNccl : InnerKind::kGloo;
  rec.timeout_ms = timeoutMs(call.timeout);
  rec.peer_local = call.peer;
  rec.peer_global = call.peer >= 0 && size_t(call.peer) < global_ranks_.size()
      ? int32_t(global_ranks_[call.peer])
      : -1;
  bool in_group = false;
  bool one_of_uncoalesced_block = false;
  {
    std::lock_guard<std::mutex> lock(seq_mutex_);
    one_of_uncoalesced_block = coalescing_ && !inner->supportsCoalescing();
    if (coalescing_ && inner->supportsCoalescing()) {
      if (!coalescing_inner_) {
        coalescing_inner_ = inner;
        coalescing_device_ = call.device;
        coalesced_is_p2p_ = p2p;
        coalesced_seq_ = p2p ? ++p2p_seq_ : ++collective_seq_;
        inner->startCoalescing();
      }
      TORCH_CHECK(
          coalescing_inner_.get() == inner.get(),
          "frnccl: a coalesced group mixes CPU and CUDA tensors");
      in_group = true;
      (coalesced_is_p2p_ ? rec.p2p_seq : rec.collective_seq) = coalesced_seq_;
    } else if (p2p) {
      rec.p2p_seq = ++p2p_seq_;
    } else {
      rec.collective_seq = ++collective_seq_;
    }
    rec.op_id = ++op_id_;
  }
  const int64_t id = Recorder::get().record(rec, call.inputs, call.outputs);
  InnerProgress* const progress = call.device.is_cuda() ? cuda_progress_ : nullptr;
  int64_t enqueued_before = 0;
  if (progress != nullptr && progress->trusted()) { // distrusted for good: no stream lookup per op
    progress->admit(p2p, currentStreamId(call.device.index()));
    enqueued_before = progress->lastEnqueued();
  }
  if (in_group) {
    std::lock_guard<std::mutex> lock(seq_mutex_);
    coalesced_records_.push_back(id);
  }

  MarkerPtr marker;
  const DeviceMarkerFactory factory = (!in_group && call.device.is_cuda()) ? deviceMarkerFactory() : nullptr;
  if (factory) {
    const int64_t every = config_->gpu_timing_every;
    if (every > 0 && (g_timed_counter.fetch_add(1, std::memory_order_relaxed) % every) == 0) {
      marker = factory(call.device.index(), /*timed=*/true, 0);
      marker->recordStart();
    }
  }
  c10::intrusive_ptr<Work> work;
  try {
    work = fn(inner);
  } catch (...) {
    // torch's argument checks throw before the op is issued (an invalid root,
    // a dtype the reduce op does not support). A caller that catches such an
    // error and goes on must not leave this rank one seq ahead of its peers
    // for the rest of the job: the seq is given back unless a later op took one.
    bool given_back = false;
    if (!in_group) {
      std::lock_guard<std::mutex> lock(seq_mutex_);
      int64_t& last_seq = p2p ? p2p_seq_ : collective_seq_;
      if (op_id_ == rec.op_id && last_seq == (p2p ? rec.p2p_seq : rec.collective_seq)) {
        --op_id_;
        --last_seq;
        given_back = true;
      }
    }
    if (given_back) {
      Recorder::get().discard(id);
    } else {
      Recorder::get().retire(id, /*failed=*/true);
    }
    throw;
  }
  if (in_group) {
    return work; // followed through the group's endCoalescing
  }
  if (factory && !marker && !work) {
    // A synchronous NCCL op returns no Work: its place on the stream (and,
    // when due, an end event) is the only way to see it complete. Ops with a
    // Work are polled through it.
    marker = factory(call.device.index(), /*timed=*/false, config_->end_event_interval_us * 1000);
    if (progress != nullptr) {
      const int64_t inner_seq = progress->anchorFor(enqueued_before, progress->lastEnqueued());
      if (inner_seq >= 0) {
        marker->settleBy(progress, inner_seq);
      }
    }
  }
  if (marker) {
    marker->recordEnd();
  } else if (!work) {
    // A blocking op with nothing to poll (monitoredBarrier): done on return.
    Recorder::get().markCompleted(id, wallNs(), -1.f, 0, 0);
    return work;
  }
  if (watchdog != nullptr) {
    TrackedOp op;
    op.record_id = id;
    op.pg_index = pg_index_;
    op.op = call.op;
    op.seq = p2p ? rec.p2p_seq : rec.collective_seq;
    op.created_mono_ns = coarseMonoNs();
    op.timeout_ms = rec.timeout_ms;
    op.work = work;
    op.marker = std::move(marker);
    op.on_gpu = call.device.is_cuda();
    op.completion_reported = op.on_gpu || workReportsCompletion(work);
    op.worker_may_hold_work = !call.device.is_cuda();
    watchdog->track(std::move(op));
  }
  if (!call.device.is_cuda()) {
    const int64_t seq = p2p ? rec.p2p_seq : rec.collective_seq;
    work = c10::make_intrusive<FrWork>(
        std::move(work), getRank(), OpLabel{id, call.op, pg_index_, p2p, seq, rec.timeout_ms, monoNs(), life_});
  }
  if (one_of_uncoalesced_block) {
    std::lock_guard<std::mutex> lock(seq_mutex_);
    uncoalesced_works_.push_back(work);
  }
  return work;
}

bool FrBackend::supportsCoalescing() const {
  return cuda_ ? cuda_->supportsCoalescing() : cpu_->supportsCoalescing();
}

void FrBackend::startCoalescing() {
  std::lock_guard<std::mutex> lock(seq_mutex_);
  coalescing_ = true;
  coalescing_inner_.reset();
  coalescing_device_.reset();
  coalesced_records_.clear();
  uncoalesced_works_.clear();
}

c10::intrusive_ptr<Work> FrBackend::endCoalescing() {
  c10::intrusive_ptr<c10d::Backend> inner;
  std::vector<int64_t> members;
  int64_t seq = 0;
  bool p2p = false;
  std::optional<at::Device> device;
  std::vector<c10::intrusive_ptr<Work>> uncoalesced;
  {
    std::lock_guard<std::mutex> lock(seq_mutex_);
    coalescing_ = false;
    uncoalesced.swap(uncoalesced_works_);
    inner = std::move(coalescing_inner_);
    coalescing_inner_.reset();
    members.swap(coalesced_records_);
    seq = coalesced_seq_;
    p2p = coalesced_is_p2p_;
    device = coalescing_device_;
  }
  if (!inner) {
    // Nothing was issued inside the block, or the inner backend (Gloo) ran its
    // ops one by one: torch keeps only the Work returned here, so it must stand
    // for all of them, or the caller's wait() returns before they finish.
    if (uncoalesced.size() <= 1) {
      return uncoalesced.empty() ? c10::intrusive_ptr<Work>() : uncoalesced.front();
    }
    return c10::make_intrusive<WorkList>(getRank(), std::move(uncoalesced));
  }
  OpRecord rec{};
  rec.pg_index = pg_index_;
  rec.op = OpKind::kCoalesced;
  rec.backend = device->is_cuda() && cudaOnNccl() ? InnerKind::kNccl : InnerKind::kGloo;
  rec.timeout_ms = timeout_ms_.load();
  rec.peer_local = -1;
  rec.peer_global = -1;
  (p2p ? rec.p2p_seq : rec.collective_seq) = seq;
  {
    std::lock_guard<std::mutex> lock(seq_mutex_);
    rec.op_id = ++op_id_;
  }
  const int64_t id = Recorder::get().record(rec, {}, {});
  MarkerPtr marker;
  if (device->is_cuda()) {
    if (auto factory = deviceMarkerFactory()) {
      marker = factory(device->index(), /*timed=*/false, 0); // groups are rare: an event each
    }
  }
  if (device->is_cuda() && cuda_progress_ != nullptr && cuda_progress_->trusted()) {
    cuda_progress_->admit(p2p, currentStreamId(device->index()));
  }
  c10::intrusive_ptr<Work> work;
  try {
    work = inner->endCoalescing();
  } catch (...) {
    Recorder::get().retire(id, true);
    for (int64_t m : members) {
      Recorder::get().retire(m, true);
    }
    throw;
  }
  if (marker) {
    marker->recordEnd();
  }
  if (Watchdog* watchdog = Runtime::get().watchdogOf(life_)) {
    TrackedOp op;
    op.record_id = id;
    op.pg_index = pg_index_;
    op.op = OpKind::kCoalesced;
    op.seq = seq;
    op.created_mono_ns = coarseMonoNs();
    op.timeout_ms = rec.timeout_ms;
    op.work = work;
    op.marker = std::move(marker);
    op.on_gpu = device->is_cuda();
    op.completion_reported = op.on_gpu || workReportsCompletion(work);
    op.member_ids = std::move(members);
    op.worker_may_hold_work = !device->is_cuda();
    watchdog->track(std::move(op));
  }
  if (!device->is_cuda() && work) {
    return c10::make_intrusive<FrWork>(
        std::move(work), getRank(), OpLabel{id, OpKind::kCoalesced, pg_index_, p2p, seq, rec.timeout_ms, monoNs(), life_});
  }
  return work;
}

void FrBackend::setTimeout(std::chrono::milliseconds timeout) {
  timeout_ms_.store(timeout.count());
  if (cpu_) {
    cpu_->setTimeout(timeout);
  }
  if (cudaOnNccl()) {
    // As at creation (_registration._make_nccl): NCCL's own watchdog gets a
    // backstop past frnccl's timeout and dump, so it never ends the process
    // before the job-wide dump is written. Where Gloo serves CUDA tensors too
    // (cuda_ is cpu_), it keeps the group's own timeout: Gloo's is what ends a
    // waiting call, since Gloo cannot be aborted.
    cuda_->setTimeout(timeout + std::chrono::milliseconds(config_->dump_timeout_ms) +
                      std::chrono::seconds(30));
  }
}

c10::intrusive_ptr<c10d::Backend::Options> FrBackend::getBackendOptions() {
  return (cuda_ ? cuda_ : cpu_)->getBackendOptions();
}

void FrBackend::eagerConnectSingleDevice(at::Device device) {
  if (device.is_cuda() && cuda_) {
    cuda_->eagerConnectSingleDevice(device);
  }
}

void FrBackend::registerOnCompletionHook(std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) {
  TORCH_CHECK(cuda_, "frnccl: onCompletion hooks need the inner NCCL backend, and this group has none");
  cuda_->registerOnCompletionHook(std::move(hook));
}

void FrBackend::waitForPendingWorks() {
  for (auto* inner : {&cuda_, &cpu_}) {
    if (*inner && (*inner)->getBackendName() == "nccl") {
      (*inner)->waitForPendingWorks();
    }
  }
}

void FrBackend::enableCollectivesTiming() {
  TORCH_CHECK(cuda_, "frnccl: collective timing needs the inner NCCL backend, and this group has none");
  cuda_->enableCollectivesTiming();
}

c10d::ErrorType FrBackend::getError() {
  return (cuda_ ? cuda_ : cpu_)->getError();
}

void FrBackend::setSequenceNumberForGroup() {
  for (auto* inner : {&cpu_, &cuda_}) {
    if (*inner) {
      (*inner)->setSequenceNumberForGroup();
    }
  }
}

uint64_t FrBackend::getSequenceNumberForGroup() {
  return (cpu_ ? cpu_ : cuda_)->getSequenceNumberForGroup();
}

void FrBackend::shutdown() {
  // destroy_process_group: stop our threads first (so none polls a backend
  // being torn down), then the inner backends, NCCL before Gloo. Once:
  // ProcessGroup::shutdown() reaches this backend under every type it is
  // registered as (FRNCCL_ENABLE registers it under two).
  if (shut_down_.exchange(true)) {
    return;
  }
  Runtime::get().detach(this, Runtime::Leaving::kShutdown);
  if (cudaOnNccl()) {
    cuda_->shutdown();
  }
  if (cpu_) {
    cpu_->shutdown();
  }
}

void FrBackend::abort() {
  if (!shut_down_.exchange(true)) {
    Runtime::get().detach(this, Runtime::Leaving::kAbort);
  }
  abortInner();
}

void FrBackend::abortAfterTimeout(const std::string& why) {
  if (shut_down_.load()) {
    return; // torn down since the timeout (a new life may run): nothing of it is left to abort
  }
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (!aborted_after_timeout_.load()) {
      abort_reason_ = why;
      aborted_after_timeout_.store(true, std::memory_order_release);
    }
  }
  abortInner();
}

void FrBackend::abortInner() {
  if (cudaOnNccl()) {
    cuda_->abort();
  }
  if (cpu_) {
    cpu_->abort();
  }
}

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 13)
// Each of these reaches one NCCL function in torch's backend, which a libnccl older than torch's may lack:
// the call is refused with Python's error rather than forwarded to a lookup that ends the process.
void FrBackend::suspend() {
  TORCH_CHECK(cuda_, "frnccl: suspend needs the inner NCCL backend, and this group has none");
  const std::string lacks = ncclLacks("ncclCommSuspend", "suspend");
  TORCH_CHECK(lacks.empty(), lacks);
  cuda_->suspend();
}
void FrBackend::resume() {
  TORCH_CHECK(cuda_, "frnccl: resume needs the inner NCCL backend, and this group has none");
  const std::string lacks = ncclLacks("ncclCommResume", "resume");
  TORCH_CHECK(lacks.empty(), lacks);
  cuda_->resume();
}
std::unordered_map<std::string, uint64_t> FrBackend::getMemoryStats() {
  TORCH_CHECK(cuda_, "frnccl: memory stats need the inner NCCL backend, and this group has none");
  const std::string lacks = ncclLacks("ncclCommMemStats", "memory_stats");
  TORCH_CHECK(lacks.empty(), lacks);
  return cuda_->getMemoryStats();
}
#endif

// ---- collectives: pick the inner backend, record, forward ----

c10::intrusive_ptr<Work> FrBackend::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  return run({OpKind::kBroadcast, deviceOf(tensors), tensors, tensors, opts.timeout},
             [&](auto& inner) { return inner->broadcast(tensors, opts); });
}

c10::intrusive_ptr<Work> FrBackend::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  return run({OpKind::kAllreduce, deviceOf(tensors), tensors, tensors, opts.timeout},
             [&](auto& inner) { return inner->allreduce(tensors, opts); });
}

c10::intrusive_ptr<Work> FrBackend::allreduce_sparse(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  return run({OpKind::kAllreduce, deviceOf(tensors), tensors, tensors, opts.timeout},
             [&](auto& inner) { return inner->allreduce_sparse(tensors, opts); });
}

c10::intrusive_ptr<Work> FrBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return run({OpKind::kAllreduceCoalesced, deviceOf(tensors), tensors, tensors, opts.timeout},
             [&](auto& inner) { return inner->allreduce_coalesced(tensors, opts); });
}

c10::intrusive_ptr<Work> FrBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  return run({OpKind::kReduce, deviceOf(tensors), tensors, tensors, opts.timeout},
             [&](auto& inner) { return inner->reduce(tensors, opts); });
}

namespace {
// Nested output lists are recorded flattened, as torch does.
std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& nested) {
  std::vector<at::Tensor> flat;
  for (const auto& v : nested) {
    flat.insert(flat.end(), v.begin(), v.end());
  }
  return flat;
}
} // namespace

c10::intrusive_ptr<Work> FrBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  auto flat = flatten(outputs);
  return run({OpKind::kAllgather, deviceOf(inputs), inputs, flat, opts.timeout},
             [&](auto& inner) { return inner->allgather(outputs, inputs, opts); });
}

c10::intrusive_ptr<Work> FrBackend::_allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return run({OpKind::kAllgatherBase, input.device(), input, output, opts.timeout},
             [&](auto& inner) { return inner->_allgather_base(output, input, opts); });
}

c10::intrusive_ptr<Work> FrBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  auto flat = flatten(outputs);
  return run({OpKind::kAllgatherCoalesced, deviceOf(inputs), inputs, flat, opts.timeout},
             [&](auto& inner) { return inner->allgather_coalesced(outputs, inputs, opts); });
}

c10::intrusive_ptr<Work> FrBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  return run({OpKind::kAllgatherIntoTensorCoalesced, deviceOf(inputs), inputs, outputs, opts.timeout},
             [&](auto& inner) { return inner->allgather_into_tensor_coalesced(outputs, inputs, opts); });
}

c10::intrusive_ptr<Work> FrBackend::gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  auto flat = flatten(outputs);
  return run({OpKind::kGather, deviceOf(inputs), inputs, flat, opts.timeout},
             [&](auto& inner) { return inner->gather(outputs, inputs, opts); });
}

c10::intrusive_ptr<Work> FrBackend::scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs, const c10d::ScatterOptions& opts) {
  auto flat = flatten(inputs);
  return run({OpKind::kScatter, deviceOf(outputs), flat, outputs, opts.timeout},
             [&](auto& inner) { return inner->scatter(outputs, inputs, opts); });
}

c10::intrusive_ptr<Work> FrBackend::reduce_scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs, const c10d::ReduceScatterOptions& opts) {
  auto flat = flatten(inputs);
  return run({OpKind::kReduceScatter, deviceOf(outputs), flat, outputs, opts.timeout},
             [&](auto& inner) { return inner->reduce_scatter(outputs, inputs, opts); });
}

c10::intrusive_ptr<Work> FrBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  return run({OpKind::kReduceScatterBase, input.device(), input, output, opts.timeout},
             [&](auto& inner) { return inner->_reduce_scatter_base(output, input, opts); });
}

c10::intrusive_ptr<Work> FrBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  return run({OpKind::kReduceScatterTensorCoalesced, deviceOf(inputs), inputs, outputs, opts.timeout},
             [&](auto& inner) { return inner->reduce_scatter_tensor_coalesced(outputs, inputs, opts); });
}

c10::intrusive_ptr<Work> FrBackend::alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes, std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  return run({OpKind::kAlltoallBase, input.device(), input, output, opts.timeout},
             [&](auto& inner) { return inner->alltoall_base(output, input, output_split_sizes, input_split_sizes, opts); });
}

c10::intrusive_ptr<Work> FrBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllToAllOptions& opts) {
  return run({OpKind::kAlltoall, deviceOf(inputs), inputs, outputs, opts.timeout},
             [&](auto& inner) { return inner->alltoall(outputs, inputs, opts); });
}

at::Device FrBackend::barrierDevice(const c10d::BarrierOptions& opts) const {
  if (opts.device.has_value()) {
    return *opts.device;
  }
  if (cuda_ && !opts.device_ids.empty()) {
    return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(opts.device_ids.front()));
  }
  // dist.barrier() on a group bound to a device (init_process_group(device_id=...))
  // asks torch for a barrier on that device, but torch's dispatcher builds the
  // options it passes here from device_ids and timeout alone, dropping the
  // device. Plain nccl runs such a barrier on the device, where it also waits
  // for the caller's GPU work; a Gloo barrier would not, so the two backends
  // would release their ranks differently.
  if (cuda_ && bound_device_id_) {
    return *bound_device_id_;
  }
  if (!cpu_ && cuda_) {
    return bound_device_id_.value_or(at::Device(at::kCUDA, 0));
  }
  return at::Device(at::kCPU);
}

void FrBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  auto& inner = innerFor(at::Device(at::kCPU));
  run({OpKind::kMonitoredBarrier, at::Device(at::kCPU), {}, {}, opts.timeout}, [&](auto&) {
    inner->monitoredBarrier(opts, wait_all_ranks);
    return c10::intrusive_ptr<Work>();
  });
}

c10::intrusive_ptr<Work> FrBackend::barrier(const c10d::BarrierOptions& opts) {
  return run({OpKind::kBarrier, barrierDevice(opts), {}, {}, opts.timeout},
             [&](auto& inner) { return inner->barrier(opts); });
}

c10::intrusive_ptr<Work> FrBackend::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  return run({OpKind::kSend, deviceOf(tensors), tensors, tensors, std::chrono::milliseconds(-1), dst_rank},
             [&](auto& inner) { return inner->send(tensors, dst_rank, tag); });
}

c10::intrusive_ptr<Work> FrBackend::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  return run({OpKind::kRecv, deviceOf(tensors), tensors, tensors, std::chrono::milliseconds(-1), src_rank},
             [&](auto& inner) { return inner->recv(tensors, src_rank, tag); });
}

c10::intrusive_ptr<Work> FrBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return run({OpKind::kRecvAnysource, deviceOf(tensors), tensors, tensors, std::chrono::milliseconds(-1)},
             [&](auto& inner) { return inner->recvAnysource(tensors, tag); });
}

} // namespace frnccl
