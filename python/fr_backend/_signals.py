"""frnccl's signal handlers stay in front of handlers that Python code installs after them.

frnccl handles SIGTERM and SIGABRT (a quick dump before the signal takes effect) and the dump signal
(FRNCCL_DUMP_SIGNAL, SIGUSR1 by default) in C++, for the whole process. `signal.signal` replaces the process's
action for a signal: Lightning installs SIGTERM and SIGUSR1 handlers when `fit` starts, after the process group
exists, and a SIGTERM then wrote no dump. So once frnccl's handlers are in, `signal.signal` is wrapped: the
call runs unchanged (same handler installed, same return value, same errors, and `signal.getsignal` says what
it said), and then frnccl's handler is put back in front of the one just installed, which it hands the signal
on to (SignalChain.hpp). A handler that ignores the signal (SIG_IGN) is left alone.

Handlers that C code installs with sigaction() are not seen here.
"""

from __future__ import annotations

import functools
import signal
import threading
from typing import Any, Callable

_MARK = "_frnccl_keeps_its_handlers"
_lock = threading.Lock()


def follow_python_handlers(reclaim: Callable[[], None]) -> None:
    """Wraps `signal.signal` once per process; after each call, `reclaim()` (frnccl's handlers back in front)."""
    with _lock:
        original = signal.signal
        if getattr(original, _MARK, False):
            return

        @functools.wraps(original)
        def signal_(signalnum: Any, handler: Any) -> Any:
            previous = original(signalnum, handler)
            try:
                reclaim()
            except Exception:  # noqa: BLE001 - the program's own call has done what it asked
                pass
            return previous

        setattr(signal_, _MARK, True)
        signal.signal = signal_  # type: ignore[assignment]
