#include "SignalChain.hpp"

#include <atomic>
#include <mutex>

namespace frnccl {

namespace {

struct Chained {
  std::atomic<SignalChain::Handler> ours{nullptr}; // set once, by install()
  struct sigaction slots[2] {};
  std::atomic<int> current{0};
};

Chained g_chain[NSIG];
std::mutex g_chain_mutex;

bool isOurs(const struct sigaction& action, SignalChain::Handler ours) {
  return (action.sa_flags & SA_SIGINFO) && action.sa_sigaction == ours;
}

struct sigaction ourAction(SignalChain::Handler handler) {
  struct sigaction action {};
  action.sa_sigaction = handler;
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&action.sa_mask);
  return action;
}

// Publishes `previous` as the action `sig` is handed on to. Under g_chain_mutex.
void setPrevious(Chained& chained, const struct sigaction& previous) {
  const int next = 1 - chained.current.load();
  chained.slots[next] = previous;
  chained.current.store(next);
}

bool validSignal(int sig) {
  return sig > 0 && sig < NSIG;
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
  if (isOurs(current, handler)) {
    return true;
  }
  // The previous action is published before ours is installed, so our handler never hands on to a stale one.
  setPrevious(chained, current);
  const struct sigaction action = ourAction(handler);
  if (sigaction(sig, &action, nullptr) != 0) {
    return false;
  }
  chained.ours.store(handler);
  return true;
}

bool SignalChain::reclaim(int sig) {
  if (!validSignal(sig)) {
    return false;
  }
  std::lock_guard<std::mutex> lock(g_chain_mutex);
  Chained& chained = g_chain[sig];
  const Handler ours = chained.ours.load();
  if (ours == nullptr) {
    return false;
  }
  struct sigaction current {};
  if (sigaction(sig, nullptr, &current) != 0 || isOurs(current, ours)) {
    return false;
  }
  if (!(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_IGN) {
    return false;
  }
  setPrevious(chained, current);
  const struct sigaction action = ourAction(ours);
  return sigaction(sig, &action, nullptr) == 0;
}

void SignalChain::reclaimAll() {
  for (int sig = 1; sig < NSIG; ++sig) {
    if (g_chain[sig].ours.load() != nullptr) {
      reclaim(sig);
    }
  }
}

const struct sigaction& SignalChain::previous(int sig) {
  const Chained& chained = g_chain[sig];
  return chained.slots[chained.current.load()];
}

void SignalChain::passOn(int sig, siginfo_t* info, void* context, bool dfl_raises) {
  if (!validSignal(sig)) {
    return;
  }
  const struct sigaction& prev = previous(sig);
  if (prev.sa_flags & SA_SIGINFO) {
    if (prev.sa_sigaction != nullptr) {
      prev.sa_sigaction(sig, info, context);
    }
    return;
  }
  if (prev.sa_handler == SIG_IGN) {
    return;
  }
  if (prev.sa_handler == SIG_DFL || prev.sa_handler == nullptr) {
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
  prev.sa_handler(sig);
}

} // namespace frnccl
