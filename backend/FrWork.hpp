#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>

#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>

#include "Recorder.hpp"

namespace frnccl {

// Set by fr_backend.slow while its detector runs: every CPU op's wait() that returns dates the op's
// completion for the watchdog (a lock and an append per op); otherwise only waits on Works that never
// report completion do.
extern std::atomic<bool> g_date_completions;

// What an error raised from a CPU op should say about the op.
struct OpLabel {
  int64_t record_id = 0;
  OpKind op = OpKind::kAllreduce;
  int32_t pg_index = -1;
  bool p2p = false;
  int64_t seq = 0;
  int64_t timeout_ms = 0;
  int64_t created_mono_ns = 0;
  int64_t life = 0; // the life of the op's group: only that life's watchdog hears of it
};

// A forwarding Work for CPU (Gloo) ops. Gloo cannot be aborted and its errors
// say only "timed out" or "connection reset"; this wrapper re-raises them
// naming the op, the process group and the seq, so the waiting call tells the
// user which collective failed. Everything else goes to the inner Work.
// CUDA ops return NCCL's Work unwrapped, keeping their path free of an extra
// allocation per op.
class FrWork : public c10d::Work {
 public:
  FrWork(c10::intrusive_ptr<c10d::Work> inner, int rank, OpLabel label);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override;
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void abort() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFutureResult() override;
  float getDuration() const override;
  uint64_t getSequencenumber() const override;

  const c10::intrusive_ptr<c10d::Work>& inner() const {
    return inner_;
  }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  OpLabel label_;
};

// The Works of ops issued one by one inside a coalescing block because the
// inner backend (Gloo) cannot coalesce. torch keeps only the Work that
// endCoalescing returns (batch_isend_irecv, _coalescing_manager), so it must
// stand for every op of the block: waiting on it waits on all of them.
class WorkList : public c10d::Work {
 public:
  WorkList(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> works);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void abort() override;

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
};

// "gloo:all_reduce on process group '0' (default_pg), collective_seq_id 42,
// timed out after 1.0 s (timeout 1000 ms): <cause>".
std::string describeFailure(const OpLabel& label, const std::string& cause);

} // namespace frnccl
