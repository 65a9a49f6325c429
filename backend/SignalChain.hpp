#pragma once

#include <signal.h>

namespace frnccl {

// frnccl's signal handlers (TermDump's SIGTERM and SIGABRT, the dump signal) and the actions they hand each
// signal on to: whatever was installed before them, or after them.
//
// Python code installs handlers with signal.signal, which replaces the process's action for that signal
// (Lightning's SIGTERM and SIGUSR1 handlers, torchrun-style scripts' SIGTERM handlers). Without reclaim() a
// SIGTERM then wrote no dump. reclaim() puts frnccl's handler back in front, and the action it found
// becomes the one frnccl hands the signal on to, so both run: frnccl's first, then theirs.
//
// Process-wide, static, never freed: the handlers read it. Lock: a mutex (SignalChain.cpp) serialises
// install() and reclaim(); the handlers never take it. Each signal's previous action is kept in two slots
// and an atomic index: a new one is written to the slot not in use, then published, so a handler always
// reads a whole action.
class SignalChain {
 public:
  using Handler = void (*)(int, siginfo_t*, void*);
  // Installs `handler` for `sig` (SA_SIGINFO | SA_RESTART), remembering the action it replaces. False if
  // sigaction fails (errno says why); the signal keeps its action then.
  static bool install(int sig, Handler handler);
  // If `sig`'s action is no longer frnccl's, installs frnccl's again in front of the one there now. An
  // action that ignores the signal (SIG_IGN) is left as it is: the program asked for the signal to have no
  // effect. Returns whether frnccl's handler was put back.
  static bool reclaim(int sig);
  // reclaim() for every signal frnccl handles.
  static void reclaimAll();
  // The action frnccl's handler hands `sig` on to. Async-signal-safe.
  static const struct sigaction& previous(int sig);
  // Runs `sig`'s previous action as the kernel would have: its handler, or nothing for SIG_IGN; for
  // SIG_DFL, `dfl_raises` says whether to re-raise with the default action (the signal's own effect, such
  // as ending the process) or do nothing. Async-signal-safe.
  static void passOn(int sig, siginfo_t* info, void* context, bool dfl_raises);
};

} // namespace frnccl
