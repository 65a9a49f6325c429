#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <pthread.h>

namespace frnccl {

// A named worker thread that is joined with a bound: join() waits at most
// `timeout_ms` and leaves a thread that does not finish in time detached.
// The destructor never blocks. How the body is told to stop is the owner's
// business (each owner has its own flag and condition variable).
class BoundedThread {
 public:
  BoundedThread(const char* name, std::function<void()> body) : done_(std::make_shared<Done>()) {
    thread_ = std::thread([body = std::move(body), done = done_] {
      body();
      std::lock_guard<std::mutex> lock(done->m);
      done->finished = true;
      done->cv.notify_all();
    });
    // Named from here, so the name shows (in /proc, in stack dumps) from the
    // moment the constructor returns, even before the thread is first scheduled.
    pthread_setname_np(thread_.native_handle(), name);
  }
  ~BoundedThread() {
    if (thread_.joinable()) {
      thread_.detach();
    }
  }
  BoundedThread(const BoundedThread&) = delete;
  BoundedThread& operator=(const BoundedThread&) = delete;

  // True when the thread finished and was joined within `timeout_ms`.
  bool join(int64_t timeout_ms) {
    if (!thread_.joinable()) {
      return true;
    }
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach(); // asked to stop from its own body
      return false;
    }
    std::unique_lock<std::mutex> lock(done_->m);
    const bool finished =
        done_->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return done_->finished; });
    lock.unlock();
    if (finished) {
      thread_.join();
    } else {
      thread_.detach();
    }
    return finished;
  }

 private:
  // Shared with the thread, so a detached thread never touches freed memory.
  struct Done {
    std::mutex m;
    std::condition_variable cv;
    bool finished = false;
  };
  std::shared_ptr<Done> done_;
  std::thread thread_;
};

} // namespace frnccl
