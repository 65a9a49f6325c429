#include "SignalChain.hpp"

#include <pthread.h>

#include <atomic>
#include <mutex>

namespace frnccl {

namespace {

struct Chained {
  std::atomic<SignalChain::Handler> ours{nullptr}; // set once, by install()
  struct sigaction slots[2] {};
  std::atomic<uint64_t> generation{0}; // slots[generation & 1] is the previous action
};

Chained g_chain[NSIG];
std::mutex g_chain_mutex;

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<SignalChain::Handler>::is_always_lock_free,
              "the signal handlers need lock-free atomics");

bool validSignal(int sig) {
  return sig > 0 && sig < NSIG;
}

bool isOurs(const struct sigaction& action, SignalChain::Handler ours) {
  return ours != nullptr && (action.sa_flags & SA_SIGINFO) && action.sa_sigaction == ours;
}

bool isIgnored(const struct sigaction& action) {
  return !(action.sa_flags & SA_SIGINFO) && action.sa_handler == SIG_IGN;
}

bool isDefault(const struct sigaction& action) {
  return !(action.sa_flags & SA_SIGINFO) && (action.sa_handler == SIG_DFL || action.sa_handler == nullptr);
}

uintptr_t idOf(const struct sigaction& action) {
  return (action.sa_flags & SA_SIGINFO) ? reinterpret_cast<uintptr_t>(action.sa_sigaction)
                                        : reinterpret_cast<uintptr_t>(action.sa_handler);
}

// frnccl's action in front of `previous`: interrupting system calls as `previous` would (Python installs its
// handlers without SA_RESTART, so that a blocked main thread gets EINTR and runs them: PEP 475), on its
// alternate stack if it has one.
struct sigaction ourAction(SignalChain::Handler handler, const struct sigaction& previous) {
  struct sigaction action {};
  action.sa_sigaction = handler;
  const bool handled = !isDefault(previous) && !isIgnored(previous);
  action.sa_flags = SA_SIGINFO | (handled ? (previous.sa_flags & (SA_RESTART | SA_ONSTACK)) : SA_RESTART);
  sigemptyset(&action.sa_mask);
  return action;
}

// Publishes `previous` as the action `sig` is handed on to. Under g_chain_mutex.
void setPrevious(Chained& chained, const struct sigaction& previous) {
  const uint64_t next = chained.generation.load() + 1;
  chained.slots[next & 1] = previous;
  chained.generation.store(next);
}

// A whole copy of the previous action. A copy torn by two publications during it is taken again.
struct sigaction copyPrevious(const Chained& chained) {
  struct sigaction copy {};
  for (int attempt = 0; attempt < 4; ++attempt) {
    const uint64_t before = chained.generation.load();
    copy = chained.slots[before & 1];
    if (chained.generation.load() == before) {
      break;
    }
  }
  return copy;
}

// Installs ours in front of `current`, publishing it first, so the handler never hands on to a stale one; a
// sigaction() of someone else's between the read and ours is what is handed on to instead. Under the mutex.
bool putInFront(int sig, Chained& chained, SignalChain::Handler ours, const struct sigaction& current) {
  setPrevious(chained, current);
  const struct sigaction action = ourAction(ours, current);
  struct sigaction replaced {};
  if (sigaction(sig, &action, &replaced) != 0) {
    return false;
  }
  if (!isOurs(replaced, ours) && idOf(replaced) != idOf(current)) {
    setPrevious(chained, replaced);
  }
  return true;
}

} // namespace

bool SignalChain::install(int sig, Handler handler) {
  if (!validSignal(sig)) {
    return false;
  }
  std::lock_guard<std::mutex> lock(g_chain_mutex);
  Chained& chained = g_chain[sig];
  struct sigaction current {};
  if (sigaction(sig, nullptr, &current) != 0) {
    return false;
  }
  chained.ours.store(handler);
  if (isOurs(current, handler) || isIgnored(current)) {
    return true;
  }
  return putInFront(sig, chained, handler, current);
}

bool SignalChain::handles(int sig) {
  return validSignal(sig) && g_chain[sig].ours.load() != nullptr;
}

uintptr_t SignalChain::actionId(int sig) {
  struct sigaction current {};
  if (!validSignal(sig) || sigaction(sig, nullptr, &current) != 0) {
    return 0;
  }
  return idOf(current);
}

bool SignalChain::reclaimIfChanged(int sig, uintptr_t before) {
  if (!validSignal(sig)) {
    return false;
  }
  std::lock_guard<std::mutex> lock(g_chain_mutex);
  Chained& chained = g_chain[sig];
  const Handler ours = chained.ours.load();
  struct sigaction current {};
  if (ours == nullptr || sigaction(sig, nullptr, &current) != 0) {
    return false;
  }
  if (isOurs(current, ours) || isIgnored(current) || idOf(current) == before) {
    return false;
  }
  return putInFront(sig, chained, ours, current);
}

bool SignalChain::previousIsDefault(int sig) {
  return validSignal(sig) && isDefault(copyPrevious(g_chain[sig]));
}

void SignalChain::passOn(int sig, siginfo_t* info, void* context, bool dfl_raises) {
  if (!validSignal(sig)) {
    return;
  }
  Chained& chained = g_chain[sig];
  struct sigaction prev = copyPrevious(chained);
  if (isIgnored(prev)) {
    return;
  }
  if (isDefault(prev)) {
    if (!dfl_raises) {
      return;
    }
    // The default action, as if frnccl's handler had never been there: the signal is blocked while its
    // handler runs, so the re-raised one is delivered, and takes effect, as soon as this handler returns.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    raise(sig);
    return;
  }
  // As the kernel would run it: with its own mask added.
  sigset_t saved;
  pthread_sigmask(SIG_BLOCK, &prev.sa_mask, &saved);
  if (prev.sa_flags & SA_SIGINFO) {
    prev.sa_sigaction(sig, info, context);
  } else {
    prev.sa_handler(sig);
  }
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
}

} // namespace frnccl
