"""What a serving step costs beyond its forward, and what the plugin itself costs per step.

Between the start of one chunk's forward and the start of the next chunk's forward of the same request,
a stage's scheduler loop does three things: the forward (timed by the run_batch hook), waits on its
peers (the PP receives and send commits, timed here by the hooks named after the SGLang methods that
block), and everything else: batch formation, result processing, the request and output relays, the
plugin's own hooks. That last part is the per-chunk overhead a pipelined chunk pays on this stage:

    loop_ms = gap - forward - blocked        (>= 0 up to the clock's resolution)

The startup probe (overhead.py) sees only the P2P part of it; online refinement (refine.py) replaces the
probe's value with the median of the serving steps. Only where a forward is synchronous to the host
(CPU): on CUDA the host loop runs ahead of the device, a host gap says nothing about the device's, and
the probe's value stays in force.

The plugin's hooks on the scheduler's per-step path are timed apart (`plugin_ms`: a hook's time outside
the SGLang call it wraps), so a plan server beside a fixed one shows what the plugin costs.
"""
from __future__ import annotations

import functools
import math
import time

clock = time.perf_counter  # seconds; tests substitute a fake clock


class StepClock:
    """One per scheduler process. The hooks add blocked and plugin seconds as they happen; the run_batch
    hook calls `forward_start` / `forward_end` around each forward."""

    def __init__(self):
        self.blocked = 0.0  # s, since the last forward started
        self.plugin = 0.0  # s, the same
        self._prev = None  # (start, forward_ms, rid) of the last forward, when it was a one-request chunk
        self._start = 0.0

    def forward_start(self) -> dict | None:
        """At a forward's start: the step since the previous forward started, when that was a chunk (the
        caller checks this one is the same request's next chunk), else None. Resets the accumulators."""
        now = clock()
        prev, blocked, plugin = self._prev, self.blocked, self.plugin
        self.blocked = self.plugin = 0.0
        self._start, self._prev = now, None
        if prev is None:
            return None
        start, fwd, rid = prev
        gap = (now - start) * 1e3
        return {"rid": rid, "gap_ms": gap, "forward_ms": fwd, "blocked_ms": blocked * 1e3,
                "loop_ms": gap - fwd - blocked * 1e3, "plugin_ms": plugin * 1e3}

    def forward_end(self, rid: str | None, forward_ms: float | None) -> None:
        """A one-request chunk's forward ended with a host-synchronous time (else rid or ms is None)."""
        if rid is not None and forward_ms is not None and math.isfinite(forward_ms):
            self._prev = (self._start, float(forward_ms), rid)


CLOCK = StepClock()


def _waited(original, *args, **kwargs):
    t0 = clock()
    try:
        return original(*args, **kwargs)
    finally:
        CLOCK.blocked += clock() - t0


def Scheduler__pp_recv_typed_dict(original, self, *args, **kwargs):
    """AROUND the PP receive of the previous stage's proxy tensors or outputs: a wait on a peer."""
    return _waited(original, self, *args, **kwargs)


def Scheduler__pp_commit_comm_work(original, self, *args, **kwargs):
    """AROUND the wait for earlier asynchronous PP sends: a wait on a peer."""
    return _waited(original, self, *args, **kwargs)


def timed(fn, kind: str):
    """Wrap a hook so that its own time (outside the SGLang call it wraps) adds to CLOCK.plugin."""
    if kind == "AROUND":
        @functools.wraps(fn)
        def around(original, *args, **kwargs):
            t0, inner = clock(), [0.0]

            def call(*a, **k):
                t1 = clock()
                try:
                    return original(*a, **k)
                finally:
                    inner[0] += clock() - t1

            try:
                return fn(call, *args, **kwargs)
            finally:
                CLOCK.plugin += clock() - t0 - inner[0]

        return around

    @functools.wraps(fn)
    def other(*args, **kwargs):  # AFTER / BEFORE: the hook is all plugin time
        t0 = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            CLOCK.plugin += clock() - t0

    return other


__all__ = ["CLOCK", "Scheduler__pp_commit_comm_work", "Scheduler__pp_recv_typed_dict", "StepClock", "clock", "timed"]
