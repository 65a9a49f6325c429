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
// then hands the signal on, to the handler that was installed before (a
// program's own SIGTERM handling keeps working) or to the default action
// (re-raised, so the process still ends by that signal). Only the first such
// signal of a process dumps; later ones wait for that dump (bounded) and pass on.
//
// Process-wide state, leaked on purpose like the Runtime: the thread and the
// pipes outlive every group. The frnccl-term thread (started by install())
// is the only one that calls `dump`; it blocks SIGTERM itself.
class TermDump {
 public:
  // Writes this rank's dump on the frnccl-term thread: `sig` is SIGTERM or
  // SIGABRT, `sender` the pid that sent a SIGTERM (0 if unknown).
  using Dump = std::function<void(int sig, pid_t sender)>;
  // The handler waits up to `wait_ms` for `dump`. Installs the handler and
  // starts the thread once per process; returns false if a pipe, the thread or
  // the handler cannot be made.
  static bool install(int64_t wait_ms, Dump dump);
  // Whether such a signal now dumps: true while frnccl groups are alive.
  static void arm(bool armed);
};

} // namespace frnccl
