#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "BoundedThread.hpp"

namespace frnccl {

// How a job-wide dump request reaches an idle rank without the rank asking the
// store again and again: on a store connection of its own (frnccl's client on a
// TCPStore, StoreWire.hpp; else a Store::clone), the
// frnccl-storewait thread blocks in wait() on this rank's wake key, which every
// trigger sets once its request is published. An idle rank costs the store
// server one open socket and one pending wait; the monitor reads the store
// only when wakes() moves.
//
// Each round: delete the key, count a wake (the monitor then reads the
// requests: whatever was published before the delete is seen), wait for the
// key. The wait is bounded (kWaitBoundMs); when the bound passes, the
// connection is replaced by a fresh clone, since a timed-out wait can leave
// the client socket out of step with the server. A connection that fails is
// replaced after a backoff, up to a bound; meanwhile listening() is false and
// the monitor polls instead.
//
// Ownership: the thread shares State with this object (shared_ptr) and owns its
// store connections, so a thread left blocked in wait() after this object is
// gone touches no freed memory. stop() never blocks on the store: it sets the
// flag; whoever holds a working connection sets the wake key (release()) to end
// a pending wait at once; the join is bounded.
class StoreWaiter {
 public:
  // One round's bound: past it, the rank reads the store once anyway (so a
  // request whose wake was lost is still served) and reconnects. Only a
  // fallback: the monitor sets its own rank's key well before it (selfWakeMs),
  // because torch logs two warning lines for every wait() that times out.
  static constexpr int64_t kWaitBoundMs = 15 * 60 * 1000;

  // `source` is cloned (under `clone_mutex`, which the monitor's reconnect also
  // takes) for each connection this waiter opens; `key` is this rank's wake key.
  StoreWaiter(
      c10::intrusive_ptr<c10d::Store> source,
      std::string key,
      std::shared_ptr<std::mutex> clone_mutex,
      int64_t wait_bound_ms = kWaitBoundMs);
  // When the monitor of `rank` wakes its own waiter, a wait being at most this
  // old: 75-87.5% of the bound, spread over the ranks, so that the ranks of a
  // job that started together do not all come back to the store at once.
  static int64_t selfWakeMs(int64_t wait_bound_ms, int64_t rank) {
    return wait_bound_ms * 3 / 4 + (wait_bound_ms / 8) * ((rank * 7919) % 1000) / 1000;
  }
  int64_t waitBoundMs() const {
    return wait_bound_ms_;
  }
  // Whether a wait() on `store` costs nothing until the key is set: a TCPStore's
  // server answers it when the key is set, a HashStore's is a condition variable.
  // A FileStore's wait() opens, locks and reads the shared file every 10 ms, and
  // a store of the user's (one written in Python) may poll too, or need the GIL
  // on this thread: on those the monitor polls every FRNCCL_COORD_CHECK_MS instead.
  static bool pushes(const c10d::Store& store);
  ~StoreWaiter(); // stops without joining
  StoreWaiter(const StoreWaiter&) = delete;
  StoreWaiter& operator=(const StoreWaiter&) = delete;

  // How many times the rank should read the store because of this waiter: at
  // start, each time the key was set, each time a wait's bound passed.
  int64_t wakes() const {
    return state_->wakes.load();
  }
  // A wait is pending (or about to be) on a working connection: a published
  // request reaches this rank without polling.
  bool listening() const {
    return state_->listening.load();
  }
  // How many times a connection of this waiter failed (a wait that reached its
  // bound is not a failure). Raised before listening() turns false.
  int64_t failures() const {
    return state_->failures.load();
  }
  // Reconnecting failed kMaxFailures times in a row: the monitor polls from now on.
  bool gaveUp() const {
    return state_->gave_up.load();
  }
  // Asks the thread to end; the caller then sets the wake key (release) if it
  // can reach the store, which ends a pending wait at once.
  void stop();
  const std::string& key() const {
    return key_;
  }
  // The store host closed this waiter's connection and the thread has not
  // noticed yet: a failed op whose peer (the host's process) died closes both at
  // the same moment, and its incident must not call the store in between.
  // Asked without blocking, from any thread.
  bool hostHungUp() const;
  // Waits up to `timeout_ms` for the thread; false if it is still blocked (it is left detached).
  bool join(int64_t timeout_ms);

 private:
  struct State {
    std::mutex m;
    std::condition_variable cv; // stop, for a backoff pause
    bool stop = false;
    std::atomic<int64_t> wakes{0};
    std::atomic<int64_t> failures{0};
    std::atomic<bool> listening{false};
    std::atomic<bool> gave_up{false};
    mutable std::mutex wire_mutex; // guards wire_fd: the thread closes the descriptor only after clearing it
    int wire_fd = -1; // the connection frnccl's own client waits on, -1 when none
  };
  static void loop(
      std::shared_ptr<State> state,
      c10::intrusive_ptr<c10d::Store> source,
      std::string key,
      std::shared_ptr<std::mutex> clone_mutex,
      int64_t wait_bound_ms);

  const std::string key_;
  const int64_t wait_bound_ms_;
  std::shared_ptr<State> state_;
  BoundedThread thread_; // last: starts once state_ exists
};

} // namespace frnccl
