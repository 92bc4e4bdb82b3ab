"""Forward times that mean compute time on every device. A host clock around a GPU forward measures the
kernel launches, not the work; so on an accelerator both the calibration and the serving hook record events
on the current stream. Calibration synchronises anyway; the serving path resolves its events lazily, on
a later call once they have completed, so it never adds a synchronisation to the scheduler loop.

One window for every timed forward: from right before `ModelRunner.forward` to right after
it. Calibration, the overhead probe and coverage (`harness.forward`, the startup harness) and serving
(`FORWARD`, armed by the run_batch hook and opened by the ModelRunner.forward hook) time the same thing; the
batch set-up around it (prepare_for_extend, the MLP-sync gather, ForwardBatch.init_new, sampling) is
per-chunk overhead, which the probe and the serving steps measure as step - forward - blocked."""
from __future__ import annotations

import time
from collections import deque
from typing import Callable


SPIN_S = 0.005  # a bounded wait polls its event without sleeping this long first


class DeviceTimer:
    """start()/stop() around work; wait_ms() after stop(). The device's events on an accelerator (CUDA, NPU,
    XPU, MUSA: SGLang's `get_device_module()`), perf_counter on CPU, where a forward is synchronous."""

    def __init__(self, device: str, event_factory: Callable | None = None, module=None):
        self.cuda = not device.startswith("cpu")  # device events, resolved lazily (the name is historical)
        self._event = event_factory
        self._module = module  # the device module (SGLang's get_device_module()), resolved on first use
        if self.cuda and event_factory is None:
            mod = self._mod()
            self._event = lambda: mod.Event(enable_timing=True)
        self._t0 = self._t1 = 0.0
        self._e0 = self._e1 = None

    def _mod(self):
        if self._module is None:
            from sglang.srt.utils.common import get_device_module

            self._module = get_device_module()
        return self._module

    def sync(self, timeout_s: float = 0.0, what: str = "") -> None:
        """Wait for the work queued on the current stream, not the whole device. The overhead probe calls it
        right after a receive and after the commit of the previous send (on NCCL both only queue a wait on
        the stream), inside its blocked time, so a wait on a peer is counted as one. With `timeout_s`, an
        event recorded on the stream is polled instead and TimeoutError names `what` past the timeout: a
        peer that failed after this rank queued its receive or send leaves the stream waiting forever, and
        `synchronize()` has no timeout (issue 57 item 4)."""
        if not self.cuda:
            return
        mod = self._mod()
        if timeout_s > 0 and hasattr(mod, "Event"):
            done = mod.Event()
            done.record()
            start = time.monotonic()
            deadline = start + timeout_s
            while not done.query():
                now = time.monotonic()
                if now - start > SPIN_S:  # spin first: a timed receive must not read a sleep's length
                    time.sleep(0.0002)
                if now > deadline:
                    raise TimeoutError(f"{what or 'the queued device work'} did not complete within {timeout_s:g} s "
                                       "(SGLANG_CPP_TRANSFER_TIMEOUT_S): the peer stage failed or never posted its "
                                       "side of the transfer")
            return
        stream = getattr(mod, "current_stream", None)
        (stream().synchronize if stream is not None else mod.synchronize)()

    def start(self) -> None:
        if self._event is not None:
            self._e0 = self._event()
            self._e0.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self._event is not None:
            self._e1 = self._event()
            self._e1.record()
        else:
            self._t1 = time.perf_counter()

    def done(self) -> bool:
        return self._event is None or self._e1.query()

    def elapsed_ms(self) -> float:
        """Only after done()."""
        if self._event is not None:
            return float(self._e0.elapsed_time(self._e1))
        return (self._t1 - self._t0) * 1e3

    def wait_ms(self) -> float:
        if self._event is not None:
            self._e1.synchronize()
        return self.elapsed_ms()


class LazyTimes:
    """Pending (timer, record) pairs; drain() hands back, in order, those whose events have completed."""

    def __init__(self, max_pending: int = 1024):
        self._pending: deque = deque()
        self._max = max_pending

    def add(self, timer: DeviceTimer, record: dict) -> None:
        self._pending.append((timer, record))
        while len(self._pending) > self._max:  # a stalled stream must not grow memory without bound
            self._pending.popleft()

    def drain(self) -> list[dict]:
        out = []
        while self._pending and self._pending[0][0].done():
            timer, rec = self._pending.popleft()
            out.append({**rec, "ms": round(timer.elapsed_ms(), 3)})
        return out


class ForwardWindow:
    """The serving side of the one timed window: the run_batch hook arms it with its timer and the scheduler's
    own model runner (and a speculative draft model's runners, `draft_runners`); the ModelRunner.forward hook
    starts that timer before the first forward of those runners while armed and stops it after each (a batch
    whose worker runs the model twice, e.g. an encoder-SWA replay before the extend, tp_worker.py:639-650, or
    the target's extend and then the draft's, eagle_worker_v2.py:1548-1602 and 1062, is timed from the first start to
    the last end). Only the scheduler's own runner opens the window: a draft forward before it (an idle draft under
    DP spec prefill coordination, eagle_worker_v2.py:1604-1640) is untimed. Any other runner, or a forward outside
    run_batch: untimed."""

    def __init__(self):
        self._runners: tuple = ()
        self._target = self._timer = None
        self._started = False
        self.marks: set = set()  # what else ran inside the armed window (e.g. an EPLB rebalance step)

    def arm(self, runner, timer: DeviceTimer, also: tuple = ()) -> None:
        self._target = runner
        self._runners = tuple(r for r in (runner, *also) if r is not None)
        self._timer, self._started = timer, False
        self.marks = set()

    def mark(self, what: str) -> None:
        """Something that is not the chunk's cost ran inside the armed window: the forward is logged with it and
        kept out of online refinement."""
        if self._timer is not None:
            self.marks.add(what)

    def disarm(self) -> bool:
        """Whether the armed forward ran (its timer started and stopped)."""
        started, self._runners, self._timer, self._started = self._started, (), None, False
        self._target = None
        return started

    def run(self, runner, call: Callable, *args, **kwargs):
        timer = self._timer
        if timer is None or not any(runner is r for r in self._runners):
            return call(*args, **kwargs)
        if not self._started:
            if runner is not self._target:  # a draft's forward extends the target's window, never opens it
                return call(*args, **kwargs)  # (an idle draft before the target: DP spec prefill coordination)
            self._started = True
            timer.start()
        try:
            return call(*args, **kwargs)
        finally:
            timer.stop()


FORWARD = ForwardWindow()
