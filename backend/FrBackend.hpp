#pragma once

#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/version.h>

#include "Config.hpp"
#include "Recorder.hpp"

namespace frnccl {

class InnerProgress;

// The frnccl backend: forwards every op to a real inner backend chosen by
// tensor device (Gloo for CPU, NCCL for CUDA), records it, hands it to the
// watchdog and returns the inner Work: NCCL's unchanged, Gloo's behind a thin
// FrWork whose errors name the op, group and seq (see FrWork.hpp).
// Owned by torch's ProcessGroup; the inner backends are owned by this object.
// Lock: coalescing_mutex_ guards the sequence counters and coalescing state.
class FrBackend : public c10d::Backend {
 public:
  FrBackend(
      int rank,
      int size,
      c10::intrusive_ptr<c10d::Backend> cpu_backend,
      c10::intrusive_ptr<c10d::Backend> cuda_backend,
      std::string group_name,
      std::vector<int64_t> global_ranks,
      std::chrono::milliseconds timeout);
  ~FrBackend() override; // never blocks, never aborts

  const std::string getBackendName() const override {
    return "frnccl";
  }
  c10::intrusive_ptr<c10d::Backend> cpuBackend() const {
    return cpu_;
  }
  c10::intrusive_ptr<c10d::Backend> cudaBackend() const {
    return cuda_;
  }
  int64_t life() const {
    return life_;
  }
  int32_t pgIndex() const {
    return pg_index_;
  }

  bool supportsSplitting() const override {
    // Reporting NCCL's true would make torch split through this wrapper,
    // which breaks new_group(backend="nccl"); each group builds its own
    // communicator instead.
    return false;
  }
  bool supportsCoalescing() const override;
  void setTimeout(std::chrono::milliseconds timeout) override;
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override;
  void setGroupUid(const std::string& pg_uid) override;
  void eagerConnectSingleDevice(at::Device device) override;
  void registerOnCompletionHook(std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) override;
  void waitForPendingWorks() override;
  void enableCollectivesTiming() override;
  c10d::ErrorType getError() override;
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;
  void shutdown() override;
  void abort() override;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 13)
  void suspend() override;
  void resume() override;
  std::unordered_map<std::string, uint64_t> getMemoryStats() override;
#endif

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs, const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes, std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllToAllOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // Aborts the inner communicators; safe from any thread.
  void abortInner();
  // After a timeout's dump: aborts the inner communicators, and every later op
  // on this group raises DistBackendError with `why` (the timed-out op, its
  // group and seq). A synchronous NCCL op has no waiting call that could fail
  // (the stream just runs on once aborted), so the next call is where the job
  // learns of it, as with NCCL's own async error handling.
  void abortAfterTimeout(const std::string& why);

 private:
  struct Call {
    OpKind op;
    at::Device device;
    c10::ArrayRef<at::Tensor> inputs;
    c10::ArrayRef<at::Tensor> outputs;
    std::chrono::milliseconds timeout;
    int peer = -1; // group-local
  };

  template <typename Fn>
  c10::intrusive_ptr<c10d::Work> run(const Call& call, Fn&& fn);
  c10::intrusive_ptr<c10d::Backend>& innerFor(const at::Device& device);
  at::Device barrierDevice(const c10d::BarrierOptions& opts) const;
  void syncIdentity();
  int64_t timeoutMs(std::chrono::milliseconds op_timeout) const;

  // The configuration of the life the group was created in (Runtime::lifeConfig), read on the op path
  // without a lock: a later life's configuration never changes it.
  const std::shared_ptr<const Config> config_;
  const int64_t life_; // the life the group was created in
  c10::intrusive_ptr<c10d::Backend> cpu_;
  c10::intrusive_ptr<c10d::Backend> cuda_;
  // cuda_'s own progress, when torch's watchdog may settle its synchronous ops (InnerProgress.hpp).
  InnerProgress* cuda_progress_ = nullptr;
  // False where CUDA tensors go to the Gloo group (cuda_ is cpu_): FRNCCL_ENABLE on a group named gloo.
  bool cudaOnNccl() const {
    return cuda_ && cuda_.get() != cpu_.get();
  }
  std::vector<int64_t> global_ranks_;
  std::atomic<int64_t> timeout_ms_;
  int32_t pg_index_ = -1;
  std::atomic<bool> identity_synced_{false};
  std::atomic<bool> shut_down_{false};
  // Set once, by the monitor thread; abort_reason_ is written before the flag.
  std::atomic<bool> aborted_after_timeout_{false};
  std::mutex abort_mutex_;
  std::string abort_reason_;

  std::mutex seq_mutex_;
  int64_t collective_seq_ = 0;
  int64_t p2p_seq_ = 0;
  int64_t op_id_ = 0;
  // Coalescing: torch starts a group before it knows the device, so the inner
  // backend is picked by the first op inside it.
  bool coalescing_ = false;
  c10::intrusive_ptr<c10d::Backend> coalescing_inner_;
  std::optional<at::Device> coalescing_device_;
  int64_t coalesced_seq_ = 0;
  bool coalesced_is_p2p_ = false;
  std::vector<int64_t> coalesced_records_;
  // The Works of ops run one by one inside a coalescing block (inner backend cannot coalesce).
  std::vector<c10::intrusive_ptr<c10d::Work>> uncoalesced_works_;
};

} // namespace frnccl
