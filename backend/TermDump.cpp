#include "TermDump.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>

#include "BoundedThread.hpp"
#include "SignalChain.hpp"

namespace frnccl {

namespace {

// Set by install() before the handler is, read-only afterwards: the handler reads them.
int g_wake_read = -1; // the frnccl-term thread waits here
int g_wake_write = -1; // the handler writes one byte: dump now
int g_done_read = -1; // readable once the dump is written or given up: the handlers poll it
int g_done_write = -1;
int64_t g_wait_ms = 0;

// Bytes through the wake pipe.
constexpr char kWakeDump = 1;
constexpr char kWakeStop = 0;

std::atomic<bool> g_armed{false};
std::atomic<bool> g_fired{false};
std::atomic<pid_t> g_sender{0};
std::atomic<int> g_signal{0};
// Set by the handler on any SIGTERM, armed or not, and never cleared: an exception raised after the
// launcher began stopping this process is the stop's consequence, not why the rank left.
std::atomic<bool> g_sigterm_seen{false};
static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<pid_t>::is_always_lock_free &&
                  std::atomic<int>::is_always_lock_free,
              "the signal handler needs lock-free atomics");

int64_t monoMs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// Async-signal-safe: poll() and clock_gettime() only.
void waitForDump() {
  const int64_t deadline = monoMs() + g_wait_ms;
  while (true) {
    const int64_t left = deadline - monoMs();
    if (left <= 0) {
      return;
    }
    pollfd done{g_done_read, POLLIN, 0};
    const int n = poll(&done, 1, static_cast<int>(left));
    if (n > 0 || (n < 0 && errno != EINTR)) {
      return;
    }
  }
}

void onSignal(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  if (sig == SIGTERM) {
    g_sigterm_seen.store(true);
  }
  const bool fired_here = g_armed.load() && !g_fired.exchange(true);
  if (fired_here) {
    g_signal.store(sig);
    g_sender.store(info != nullptr && sig == SIGTERM ? info->si_pid : 0);
    const ssize_t ignored = write(g_wake_write, &kWakeDump, 1);
    (void)ignored;
  }
  if (g_fired.load()) {
    waitForDump();
  }
  errno = saved_errno;
  SignalChain::passOn(sig, info, context, /*dfl_raises=*/true); // what would have happened without us
  if (fired_here && sig == SIGTERM) {
    // Still here: the signal went on to the program's own handler (Lightning's takes SIGTERM and trains on,
    // or stops later), or its default action takes effect as this handler returns. A later SIGTERM dumps
    // again; the answer to this one is taken out of the pipe, so that the next wait waits for its own.
    char byte = 0;
    while (read(g_done_read, &byte, 1) > 0) {
    }
    g_fired.store(false);
    errno = saved_errno;
  }
}

void termThread(const TermDump::Dump& dump) {
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, nullptr); // the signal it serves must never stop it
  char byte = 0;
  while (true) {
    const ssize_t n = read(g_wake_read, &byte, 1);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0 || byte == kWakeStop) {
      return;
    }
    if (g_armed.load()) {
      try {
        dump(g_signal.load(), g_sender.load());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[frnccl] dump on signal %d failed: %s\n", g_signal.load(), e.what());
      }
    }
    const ssize_t ignored = write(g_done_write, &byte, 1);
    (void)ignored;
  }
}

bool makePipe(int& read_end, int& write_end) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return false;
  }
  read_end = fds[0];
  write_end = fds[1];
  return true;
}

} // namespace

// Guards the thread's start and stop (Runtime calls them, under its own lock).
std::mutex g_thread_mutex;
TermDump::Dump g_dump;
// The frnccl-term thread: started with the first group, stopped with the last (a thread left running after
// destroy_process_group would be ours, idle, in a process that has no group).
std::unique_ptr<BoundedThread> g_thread;

bool TermDump::install(int64_t wait_ms, Dump dump) {
  static bool tried = false;
  static bool installed = false;
  std::lock_guard<std::mutex> lock(g_thread_mutex);
  if (tried) {
    return installed;
  }
  tried = true;
  if (!makePipe(g_wake_read, g_wake_write) || !makePipe(g_done_read, g_done_write)) {
    return false;
  }
  // One byte at a time goes through each pipe; still, the handler must never block on a write.
  fcntl(g_wake_write, F_SETFL, fcntl(g_wake_write, F_GETFL) | O_NONBLOCK);
  fcntl(g_done_read, F_SETFL, fcntl(g_done_read, F_GETFL) | O_NONBLOCK); // emptied by the handler (onSignal)
  g_wait_ms = wait_ms;
  g_dump = std::move(dump);
  if (!SignalChain::install(SIGTERM, &onSignal) || !SignalChain::install(SIGABRT, &onSignal)) {
    return false;
  }
  installed = true;
  return true;
}

void TermDump::start() {
  std::lock_guard<std::mutex> lock(g_thread_mutex);
  if (g_wake_read < 0 || g_thread) {
    return;
  }
  try {
    g_thread = std::make_unique<BoundedThread>("frnccl-term", [] { termThread(g_dump); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[frnccl] no dump on SIGTERM or SIGABRT: cannot start its thread: %s\n", e.what());
    return;
  }
  g_armed.store(true);
}

bool TermDump::sigtermSeen() {
  return g_sigterm_seen.load();
}

bool TermDump::stop(int64_t timeout_ms) {
  std::lock_guard<std::mutex> lock(g_thread_mutex);
  g_armed.store(false);
  if (!g_thread) {
    return true;
  }
  // Behind a dump request already in the pipe, if any: that one is answered first (without a dump, now).
  const ssize_t ignored = write(g_wake_write, &kWakeStop, 1);
  (void)ignored;
  const bool joined = g_thread->join(timeout_ms); // one still dumping is left behind, detached
  g_thread.reset();
  return joined;
}

} // namespace frnccl
