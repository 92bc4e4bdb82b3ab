"""A deadline on the plugin's startup work (calibration, the overhead probe): a rank that stops making
progress ends the server with the reason, instead of hanging.

Why: errors are exchanged between calibration levels, but a TP/EP rank that fails *inside* a forward (an
OOM in a kernel, a host assert) leaves its peers in a collective (a custom all-reduce, pynccl, gloo) that
has no timeout, and the failed rank itself waits for them in the next gather. SGLang's watchdog starts after
`maybe_init_dynamic_chunk_sizer` (srt/managers/scheduler.py:657 against :674), so nothing else ends that
wait.

Every rank runs its own watchdog thread. Progress is a forward that ends or a gather that every rank
reached (`tick`). When a rank goes `SGLANG_CPP_CALIB_DEADLINE_S` without progress, it logs what it was doing
and the error it had seen, then ends the server as SGLang does when a scheduler raises: SIGQUIT to its
parent (`run_scheduler_process`), whose handler kills the process tree, then exits itself.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable

logger = logging.getLogger("sglang_cpp")

_ACTIVE: "Deadline | None" = None


def _end_server(message: str) -> None:
    """SGLang's own way out of a failed scheduler: SIGQUIT to the launcher, then this process exits."""
    try:
        import psutil

        psutil.Process().parent().send_signal(signal.SIGQUIT)
    except Exception:  # no parent to tell: this process still ends
        pass
    os._exit(1)


class Deadline:
    """A watchdog: `expire(message)` runs once when no `tick` came for `seconds`."""

    def __init__(self, seconds: float, who: str, expire: Callable[[str], None] = _end_server, poll_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic):
        self.seconds, self.who, self._expire, self._clock = float(seconds), who, expire, clock
        self.doing, self.error = "starting", ""
        self._last = clock()
        self._done = threading.Event()
        self._poll = poll_s or min(5.0, max(0.05, self.seconds / 20))
        self._thread = threading.Thread(target=self._watch, name="sglang-cpp-deadline", daemon=True)
        self._thread.start()

    def tick(self, doing: str) -> None:
        self.doing, self._last = doing, self._clock()

    def expired(self) -> bool:
        """No tick for longer than `seconds`."""
        return self._clock() - self._last > self.seconds

    def note_error(self, error: str) -> None:
        self.error = self.error or error  # the first, closest to the cause (later ones re-raise it, less precise)

    def close(self) -> None:
        self._done.set()
        self._thread.join(timeout=1.0)

    def message(self) -> str:
        return (f"sglang-cpp: {self.who} made no progress for {self.seconds:.0f}s (SGLANG_CPP_CALIB_DEADLINE_S) "
                f"in the startup calibration, while {self.doing}"
                + (f"; this rank had failed: {self.error}" if self.error else "") +
                ". A rank that fails inside a forward leaves its TP/EP peers in a collective with no timeout, so "
                "the server ends here; see every rank's log for the first error. If the work is only slow, raise "
                "SGLANG_CPP_CALIB_DEADLINE_S (0: no deadline), or pass a profile with SGLANG_CPP_PROFILE")

    def _watch(self) -> None:
        while not self._done.wait(self._poll):
            if self.expired():
                msg = self.message()
                logger.error(msg)
                print(msg, file=sys.stderr, flush=True)
                for h in logging.getLogger().handlers + logger.handlers:
                    h.flush()
                self._done.set()
                self._expire(msg)
                return


@contextmanager
def startup_deadline(seconds: float, who: str, expire: Callable[[str], None] = _end_server):
    """The startup work inside runs under a Deadline (none when seconds <= 0); `tick` reaches it."""
    global _ACTIVE
    if seconds <= 0:
        yield None
        return
    d = Deadline(seconds, who, expire)
    _ACTIVE = d
    try:
        yield d
    finally:
        _ACTIVE = None
        d.close()


def tick(doing: str) -> None:
    """Progress on this rank (no-op outside startup_deadline)."""
    d = _ACTIVE
    if d is not None:
        d.tick(doing)


def note_error(error: str) -> None:
    """The error this rank saw, named again if the deadline expires (no-op outside startup_deadline)."""
    d = _ACTIVE
    if d is not None:
        d.note_error(error)
