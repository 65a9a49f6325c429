"""frnccl's signal handlers stay in front of handlers that Python code installs after them.

frnccl handles SIGTERM and SIGABRT (a quick dump before the signal takes effect) and the dump signal
(FRNCCL_DUMP_SIGNAL, SIGUSR1 by default) in C++, for the whole process. `signal.signal` replaces the process's
action for a signal: Lightning installs its SIGTERM handler when `fit` starts, after the process group
exists, and a SIGTERM then wrote no dump. So once frnccl's handlers are in, `signal.signal` is wrapped: the
call runs unchanged (same handler installed, same return value, same errors, and `signal.getsignal` says what
it said), and then, for a signal frnccl handles whose action that very call changed, frnccl's handler goes
back in front of the one just installed and hands the signal on to it (backend/SignalChain.hpp). A handler
that ignores the signal (SIG_IGN) is left alone, and so is any action that C code installed with
sigaction(): such a handler often hands the signal back to the one it replaced, frnccl's.
"""

from __future__ import annotations

import functools
import signal
import threading
from typing import Any, Protocol

_MARK = "_frnccl_keeps_its_handlers"
_lock = threading.Lock()


class SignalChain(Protocol):
    def handles_signal(self, signalnum: int) -> bool: ...
    def signal_action_id(self, signalnum: int) -> int: ...
    def reclaim_signal_if_changed(self, signalnum: int, before: int) -> bool: ...


def follow_python_handlers(chain: SignalChain) -> None:
    """Wraps `signal.signal` once per process, so that frnccl's handlers stay in front (see above)."""
    with _lock:
        original = signal.signal
        if getattr(original, _MARK, False):
            return

        @functools.wraps(original)
        def signal_(signalnum: Any, handler: Any) -> Any:
            before = None
            try:
                number = int(signalnum)
                if chain.handles_signal(number):
                    before = chain.signal_action_id(number)
            except Exception:  # noqa: BLE001 - not a signal frnccl could follow; the call says what it says
                pass
            previous = original(signalnum, handler)
            if before is not None:
                try:
                    chain.reclaim_signal_if_changed(number, before)
                except Exception:  # noqa: BLE001 - the program's own call has done what it asked
                    pass
            return previous

        setattr(signal_, _MARK, True)
        signal.signal = signal_  # type: ignore[assignment]
