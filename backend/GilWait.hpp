#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

namespace frnccl {

// A dump waits for the GIL on a helper thread (frnccl-gil), bounded by
// FRNCCL_SYMBOLIZE_TIMEOUT_MS, to symbolize stacks. A signal that ends the
// process (SIGTERM, SIGABRT: TermDump) leaves the dump in flight less time than
// that: its rank's part would be lost with the process. While such a signal is
// served (a GilWaitCut is alive), every wait for the GIL ends at most
// kGilWaitCutMs after the cut began (one in flight) or after the wait began (a
// later one, such as the signal's own dump's); the dump is then written without
// symbolized stacks, as the signal's own dump is.

// What a cut still leaves a wait: enough to take a GIL that is free (thread
// stacks are then read with every Python thread parked), nothing like the
// symbolizing bound.
constexpr int64_t kGilWaitCutMs = 200;

namespace gil_wait_detail {

// Process-wide; every waiter, helper thread and cut holds a reference, so a
// helper thread left behind never outlives it. `mutex` guards all of it.
struct State {
  std::mutex mutex;
  std::condition_variable cv;
  int cuts = 0;
  std::chrono::steady_clock::time_point cut_since{};
};

inline std::shared_ptr<State> state() {
  static const std::shared_ptr<State> instance = std::make_shared<State>();
  return instance;
}

} // namespace gil_wait_detail

// One wait for work done under the GIL: the helper thread calls finish() once
// that work is done or given up; the waiting thread calls wait().
class GilWaitJob {
 public:
  GilWaitJob() : state_(gil_wait_detail::state()) {}

  void finish() {
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      finished_ = true;
    }
    state_->cv.notify_all();
  }

  // True once finished within `timeout_ms`, or within a cut's bound if one is in force.
  bool wait(int64_t timeout_ms) {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point started = Clock::now();
    const Clock::time_point deadline = started + std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0));
    std::unique_lock<std::mutex> lock(state_->mutex);
    while (!finished_) {
      Clock::time_point until = deadline;
      if (state_->cuts > 0) {
        until = std::min(until, std::max(state_->cut_since, started) + std::chrono::milliseconds(kGilWaitCutMs));
      }
      if (Clock::now() >= until) {
        return false;
      }
      state_->cv.wait_until(lock, until);
    }
    return true;
  }

 private:
  std::shared_ptr<gil_wait_detail::State> state_;
  bool finished_ = false; // guarded by state_->mutex
};

// Held by the frnccl-term thread while it serves a signal. The process ends
// right after, unless a handler of the program keeps it going: then waits are
// as long as before once the cut is gone.
class GilWaitCut {
 public:
  GilWaitCut() : state_(gil_wait_detail::state()) {
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      if (state_->cuts++ == 0) {
        state_->cut_since = std::chrono::steady_clock::now();
      }
    }
    state_->cv.notify_all();
  }
  ~GilWaitCut() {
    std::lock_guard<std::mutex> lock(state_->mutex);
    --state_->cuts;
  }
  GilWaitCut(const GilWaitCut&) = delete;
  GilWaitCut& operator=(const GilWaitCut&) = delete;

 private:
  std::shared_ptr<gil_wait_detail::State> state_;
};

} // namespace frnccl
