#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>

namespace frnccl {

// SIGTERM or SIGABRT while frnccl groups are alive: this rank writes a quick
// dump before the signal takes effect.
//  - SIGTERM: a launcher stops the survivors of a failure (torchrun 50-100 ms
//    after a worker died, and SIGKILL only 30 s later), usually before the
//    job-wide dump request reached them: without this, the innocent ranks it
//    stopped looked like ranks that never dumped.
//  - SIGABRT: the process aborts (an uncaught C++ exception, such as gloo's
//    "Received data size doesn't match expected size" on the rank a mismatched
//    collective reached): without this, the rank whose state explains the
//    failure was the one without a dump.
//
// The handler is async-signal-safe: it writes one byte to a pipe that wakes the
// frnccl-term thread, waits for that thread's answer with poll() (bounded),
// then hands the signal on (SignalChain): to the handler that was installed
// before, or by Python's signal.signal after (a program's own SIGTERM handling
// keeps working), or to the default action (re-raised, so the process still
// ends by that signal). While a dump is being written, further signals wait
// for it (bounded) and pass on; a SIGTERM the process survives (its own
// handler took it) lets the next one dump again.
//
// Process-wide state: the handler and the pipes are installed once and stay;
// the frnccl-term thread comes with the first group and goes with the last
// (start/stop; Runtime owns that), and is the only one that calls `dump`. It
// blocks SIGTERM itself.
class TermDump {
 public:
  // Writes this rank's dump on the frnccl-term thread: `sig` is SIGTERM or
  // SIGABRT, `sender` the pid that sent a SIGTERM (0 if unknown).
  using Dump = std::function<void(int sig, pid_t sender)>;
  // Installs the handler once per process; the handler waits up to `wait_ms`
  // for `dump`. Returns false if a pipe or the handler cannot be made.
  static bool install(int64_t wait_ms, Dump dump);
  // Starts the thread (if installed and not running) and arms the handler:
  // a signal now dumps.
  static void start();
  // Disarms the handler (a signal passes on at once) and stops the thread,
  // joined within `timeout_ms` (else left behind, detached: then false).
  static bool stop(int64_t timeout_ms);
  // Whether a SIGTERM reached the handler in this process's life (installed or not armed alike).
  static bool sigtermSeen();
};

} // namespace frnccl
