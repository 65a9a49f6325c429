// The frnccl-storewait thread: a blocking wait on this rank's wake key, so that
// a job-wide dump request reaches an idle rank without it polling the store.
#include "StoreWaiter.hpp"

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <stdexcept>
#include <typeinfo>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "Clock.hpp"
#include "StoreProbe.hpp"
#include "StoreWire.hpp"

namespace frnccl {

namespace {

// Each connection's own calls (the key's delete) give up after this long, as the monitor's do.
constexpr int64_t kCallTimeoutMs = 10000;
// How long a probe of the store host's port may take before a new connection is opened: a host
// that is gone costs no torch warning, and no connect that waits out the store timeout.
constexpr int64_t kProbeMs = 1000;
// Connections that fail in a row (2 s, 4 s, ... 32 s apart) before the rank polls for good.
constexpr int kMaxFailures = 6;

// A torch client's wait that ended by its bound, not by a failed connection.
struct TimedOutWait : std::runtime_error {
  TimedOutWait() : std::runtime_error("the wait's bound passed") {}
};

void waitWithTorchClient(c10d::Store& conn, const std::string& key, int64_t wait_bound_ms) {
  const int64_t started = monoNs();
  try {
    conn.wait({key}, std::chrono::milliseconds(wait_bound_ms));
  } catch (const std::exception&) {
    if (monoNs() - started < (wait_bound_ms - std::min<int64_t>(1000, wait_bound_ms / 2)) * 1000000LL) {
      throw; // the connection failed, not the bound
    }
    throw TimedOutWait();
  }
}

} // namespace

StoreWaiter::StoreWaiter(
    c10::intrusive_ptr<c10d::Store> source,
    std::string key,
    std::shared_ptr<std::mutex> clone_mutex,
    int64_t wait_bound_ms)
    : key_(std::move(key)),
      wait_bound_ms_(wait_bound_ms),
      state_(std::make_shared<State>()),
      thread_("frnccl-storewait", [state = state_, source = std::move(source), key = key_, clone_mutex, wait_bound_ms] {
        loop(state, source, key, clone_mutex, wait_bound_ms);
      }) {}

bool StoreWaiter::pushes(const c10d::Store& store) {
  // Exact types: a subclass may override wait() with a loop of its own.
  return typeid(store) == typeid(c10d::TCPStore) || typeid(store) == typeid(c10d::HashStore);
}

StoreWaiter::~StoreWaiter() {
  stop(); // BoundedThread's destructor detaches: the thread holds its own state
}

void StoreWaiter::stop() {
  {
    std::lock_guard<std::mutex> lock(state_->m);
    state_->stop = true;
  }
  state_->cv.notify_all();
}

bool StoreWaiter::hostHungUp() const {
  {
    std::lock_guard<std::mutex> lock(state_->m);
    if (state_->stop) {
      return false; // released: its connection ends by design
    }
  }
  std::lock_guard<std::mutex> lock(state_->wire_mutex);
  if (state_->wire_fd < 0) {
    return false;
  }
  pollfd closed{state_->wire_fd, POLLRDHUP, 0};
  return ::poll(&closed, 1, 0) == 1 && (closed.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

bool StoreWaiter::join(int64_t timeout_ms) {
  return thread_.join(timeout_ms);
}

void StoreWaiter::loop(
    std::shared_ptr<State> state,
    c10::intrusive_ptr<c10d::Store> source,
    std::string key,
    std::shared_ptr<std::mutex> clone_mutex,
    int64_t wait_bound_ms) {
  auto stopped = [&] {
    std::lock_guard<std::mutex> lock(state->m);
    return state->stop;
  };
  // On a TCPStore, frnccl's own client (StoreWire.hpp: no torch backtrace when the host dies); on
  // another store that pushes (a HashStore), or a TCPStore whose server does not understand that
  // client, a clone of torch's.
  bool own_client = typeid(*source) == typeid(c10d::TCPStore);
  std::unique_ptr<StoreWireConnection> wire;
  // Closes the connection; hostHungUp() stops looking at its descriptor first.
  auto drop_wire = [&] {
    {
      std::lock_guard<std::mutex> lock(state->wire_mutex);
      state->wire_fd = -1;
    }
    wire.reset();
  };
  c10::intrusive_ptr<c10d::Store> conn;
  int failures = 0;
  int closed_at_first_request = 0; // fresh connections in a row that the server closed at their first request
  while (!stopped()) {
    bool ok = false;
    try {
      if (own_client) {
        const bool fresh = !wire;
        if (fresh) {
          wire = std::make_unique<StoreWireConnection>(*source, kProbeMs);
          std::lock_guard<std::mutex> lock(state->wire_mutex);
          state->wire_fd = wire->fd();
        }
        try {
          wire->deleteKey(key, kCallTimeoutMs);
          closed_at_first_request = 0;
        } catch (const StoreWireConnection::Closed&) {
          // A server that is there but closes fresh connections at their first request, twice in a row,
          // did not take their validation: this torch's protocol is not the one this client speaks. Once
          // is also what a host does that is ending (its listening socket goes last).
          if (fresh && ++closed_at_first_request >= 2 && storeServerReachable(*source, kProbeMs)) {
            throw StoreWireConnection::NotUnderstood("the store host closed two new connections at their first request");
          }
          throw;
        }
      } else {
        if (!conn) {
          if (!storeServerReachable(*source, kProbeMs)) {
            throw std::runtime_error("the store host does not accept connections");
          }
          std::lock_guard<std::mutex> lock(*clone_mutex);
          conn = source->clone();
          conn->setTimeout(std::chrono::milliseconds(kCallTimeoutMs));
        }
        // Deleted before the monitor reads the store: a wake set after this
        // ends the next wait, and a request published before it is read now.
        conn->deleteKey(key);
      }
      failures = 0;
      state->listening.store(true);
      state->wakes.fetch_add(1);
      // stop() sets the flag before its caller sets the key: either the flag
      // is seen here, or the key is set after the delete above and the wait
      // returns at once.
      if (stopped()) {
        break;
      }
      if (own_client) {
        // A wait that ended by its bound or by stop() is still pending at the
        // server: the next round opens a fresh connection.
        if (wire->wait(key, wait_bound_ms, stopped) != StoreWireConnection::WaitEnd::kSet) {
          drop_wire();
        }
      } else {
        waitWithTorchClient(*conn, key, wait_bound_ms);
      }
      ok = true;
    } catch (const StoreWireConnection::NotUnderstood&) {
      drop_wire();
      own_client = false;
      continue; // at once, with torch's client: nothing failed yet
    } catch (const TimedOutWait&) {
      // The bound passed. The next round reads the store once, on a fresh
      // connection: after a timed-out wait the server's answer to it may
      // still be in flight, and would be taken for the next call's.
      conn.reset();
      ok = true;
    } catch (const std::exception&) {
      drop_wire();
      conn.reset();
    }
    if (!ok) {
      state->failures.fetch_add(1);
      state->listening.store(false);
      if (++failures >= kMaxFailures) {
        state->gave_up.store(true);
        break;
      }
      std::unique_lock<std::mutex> lock(state->m);
      state->cv.wait_for(lock, std::chrono::milliseconds(std::min<int64_t>(1000LL << failures, 60000)), [&] {
        return state->stop;
      });
    }
  }
  drop_wire(); // before the descriptor's number can be reused: hostHungUp() must not look at another socket
  state->listening.store(false);
}

} // namespace frnccl
