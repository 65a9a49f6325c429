#pragma once

// Settling synchronous NCCL ops by torch's own NCCL watchdog, without an end
// event of frnccl's.
//
// torch's ProcessGroupNCCL follows every op it enqueues with an end event of
// its own (paid by plain nccl too) and publishes, in its ProcessGroupStatus,
// the seq of the last op enqueued and of the last op its watchdog saw
// complete. Ops of one group on one stream complete in the order they were
// enqueued, so a synchronous op whose seq is at most lastCompletedSeq is done:
// frnccl's own end event per op (most of its cost per small op, StreamOrder.hpp)
// is then not needed. The status is trusted only while that order holds:
//  - every CUDA op of the group ran on one stream: synchronous ops run on the
//    caller's current stream, and an op on another stream may complete first;
//  - no point-to-point op ran: torch counts those separately but publishes
//    their seqs in the same fields.
// Once either is broken the status is never trusted again ("mixed"), and
// ops that relied on it fall back to a catch-up end event (Watchdog).
// An op relies on it only if lastEnqueuedSeq moved by exactly one across it:
// an op captured into a CUDA graph, or inside a coalesced group, is not
// enqueued for torch's watchdog. torch's watchdog looks every 100 ms, so such
// an op is seen complete up to that much later than through an end event.
//
// Pure C++ (no CUDA, no NCCL headers) so that the rules are unit-tested on
// CPU builds; NcclProgress.cpp finds the status of a real ProcessGroupNCCL.

#include <atomic>
#include <cstdint>
#include <memory>

namespace c10d {
class Backend;
}

namespace frnccl {

// One per inner NCCL group, never destroyed (see innerProgressOf): markers of
// ops still in flight keep a plain pointer to it.
// Threads: the issuing threads call admit() and lastEnqueued(); the watchdog
// calls covers(). The status fields are written by torch's threads without a
// lock; they are read here with atomic loads.
class InnerProgress {
 public:
  // `owner` keeps the two fields alive.
  InnerProgress(std::shared_ptr<const void> owner, const int64_t* last_enqueued, const int64_t* last_completed)
      : owner_(std::move(owner)), last_enqueued_(last_enqueued), last_completed_(last_completed) {}
  InnerProgress(const InnerProgress&) = delete;
  InnerProgress& operator=(const InnerProgress&) = delete;

  // Called before every CUDA op of the group is issued, so that the watchdog
  // sees the status distrusted before an op that breaks the order can complete.
  void admit(bool p2p, uint64_t stream) {
    if (mixed_.load(std::memory_order_relaxed)) {
      return;
    }
    uint64_t expected = 0;
    if (p2p || stream == 0 ||
        (!stream_.compare_exchange_strong(expected, stream, std::memory_order_relaxed) && expected != stream)) {
      mixed_.store(true, std::memory_order_seq_cst);
    }
  }
  bool trusted() const {
    return !mixed_.load(std::memory_order_acquire);
  }
  int64_t lastEnqueued() const {
    return load(last_enqueued_);
  }
  // The seq the op issued between the two readings can rely on, or -1.
  int64_t anchorFor(int64_t enqueued_before, int64_t enqueued_after) const {
    return trusted() && enqueued_after == enqueued_before + 1 ? enqueued_after : -1;
  }
  // Whether torch's watchdog has seen op `seq` complete. The status is read
  // before the trust flag: a completion seen here that an untrusted op caused
  // was published after that op was admitted, so the flag reads false.
  bool covers(int64_t seq) const {
    const int64_t done = load(last_completed_);
    return trusted() && done >= seq;
  }

 private:
  static int64_t load(const int64_t* field) {
    return __atomic_load_n(field, __ATOMIC_ACQUIRE);
  }
  const std::shared_ptr<const void> owner_;
  const int64_t* const last_enqueued_;
  const int64_t* const last_completed_;
  std::atomic<uint64_t> stream_{0}; // the one stream the group's CUDA ops ran on; 0 until the first
  std::atomic<bool> mixed_{false};
};

// The progress of `backend` if it is torch's ProcessGroupNCCL and this build
// can read it (NcclProgress.cpp, CUDA builds with NCCL headers); else null.
// The object lives as long as the process, as frnccl's record of each group does.
InnerProgress* innerProgressOf(c10d::Backend& backend);
// Whether this build can read it at all (CUDA torch, NCCL headers found).
bool innerProgressBuilt();

} // namespace frnccl
