#pragma once

#include <signal.h>

#include <cstdint>

namespace frnccl {

// frnccl's signal handlers (TermDump's SIGTERM and SIGABRT, the dump signal) and the actions they hand each
// signal on to: whatever was installed before them, or by Python's signal.signal after them.
//
// signal.signal replaces the process's action for a signal: Lightning installs SIGTERM (and, under Slurm's
// auto-requeue, SIGUSR1) handlers when fit starts, after the process group exists, and a SIGTERM then wrote
// no dump. reclaimIfChanged() puts frnccl's handler back in front of the action such a call installed, and
// that action becomes the one frnccl hands the signal on to, so both run: frnccl's first, then theirs. Only
// an action that changed during the program's own call is taken over: a C handler that installed itself in
// front of frnccl's (faulthandler, c10's) often hands the signal back to frnccl, and going in front of it
// would make the two call each other forever.
//
// Process-wide, static, never freed: the handlers read it. Lock: a mutex (SignalChain.cpp) serialises
// install() and reclaimIfChanged(); the handlers never take it. Each signal's previous action is kept in two
// slots under a generation count: a new one is written to the slot not in use, then the count moves on; a
// handler copies the slot and checks that the count did not move meanwhile.
class SignalChain {
 public:
  using Handler = void (*)(int, siginfo_t*, void*);
  // Installs `handler` for `sig`, remembering the action it replaces. An ignored signal (SIG_IGN) is left
  // ignored: the program asked for it to have no effect, and frnccl goes in front of a handler installed
  // for it later. False if sigaction fails (errno says why); the signal keeps its action then.
  static bool install(int sig, Handler handler);
  // Whether frnccl installed a handler for `sig` (or waits to go in front of one, where it was ignored).
  static bool handles(int sig);
  // An identity of `sig`'s current action, read before the program's signal.signal call.
  static uintptr_t actionId(int sig);
  // After the program's signal.signal call: if `sig`'s action is no longer the one `before` names and is not
  // frnccl's, frnccl's goes in front of it. SIG_IGN is left alone. Returns whether frnccl's was put back.
  static bool reclaimIfChanged(int sig, uintptr_t before);
  // Hands `sig` on to the action frnccl's handler stands in front of, as the kernel would have run it: its
  // handler, with its own mask added (SA_RESETHAND is not honoured: a one-shot handler runs each time), or
  // nothing for SIG_IGN; for SIG_DFL, `dfl_raises` says whether to re-raise with the default action (the
  // signal's own effect, such as ending the process) or do nothing. Async-signal-safe.
  static void passOn(int sig, siginfo_t* info, void* context, bool dfl_raises);
  // Whether `sig`'s previous action is the default one (SIG_DFL). Async-signal-safe.
  static bool previousIsDefault(int sig);
};

} // namespace frnccl
