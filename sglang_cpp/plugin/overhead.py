"""The per-chunk overhead, measured where it is paid: a short pipelined run at startup.

Calibration times each stage's forward alone. A chunk in the running pipeline also pays, on every stage,
what a step costs beyond its forward: the receive of the previous stage's hidden states, the send to the
next, and the batch set-up around them. Without it the planner thinks small chunks are free and cuts too
many (issue 25: the old C/4 floor was all that stopped it).

Every stage runs the same synthetic request, `SGLANG_CPP_OVERHEAD_PROBE` chunks of one alignment unit
times two, through the real P2P path (`GroupCoordinator.send_tensor_dict` / `recv_tensor_dict`, as the
scheduler's proxy messages, asynchronous sends committed at the next step before its forward, as the
scheduler's PP loop does, scheduler_pp_mixin.py:175-177). Per step a
stage records its wall time, its forward time (the calibration's timer) and the time it spent blocked on a
peer (the receive, the commit of the previous send). A stage's overhead is the median over the steps of
step - forward - blocked: the time a chunk costs this stage beyond its forward when nothing waits, so it
is >= 0 by construction. Not in it: the scheduler loop's own batch formation and the output relay (see
docs/compatibility.md, 'Per-chunk overhead'; the serving logs measure those, `benchmarks/overhead.py`).

World rank 0 gathers every stage's value and each stage's cost model gets its own overhead added to c0,
the same on every rank. A negative or non-finite value is a startup error naming the stage.
"""
from __future__ import annotations

import logging
import math
import time

import numpy as np

from .deadline import tick

logger = logging.getLogger("sglang_cpp")


def stage_overhead(steps: list[tuple[float, float, float]]) -> float:
    """Median of step - forward - blocked (ms) over (step, forward, blocked) triples."""
    return float(np.median([s - f - b for s, f, b in steps])) if steps else math.nan


def decide_overheads(gathered: list[dict]) -> list[float]:
    """Per stage (ascending), the slowest of its TP ranks' overheads; a negative or non-finite one fails
    naming the stage (it cannot happen with a working timer: the forward is inside the step)."""
    per_stage: dict[int, list] = {}
    for g in gathered:
        per_stage.setdefault(g["stage"], []).append(stage_overhead(g["steps"]))
    out = [max(per_stage[s]) for s in sorted(per_stage)]
    for s, o in enumerate(out):
        if not (math.isfinite(o) and o >= 0):
            raise RuntimeError(f"sglang-cpp: the per-chunk overhead measured on PP{s} is {o!r} ms (median of step - "
                               "forward - blocked over the pipelined probe): the stage's timer is broken. Set "
                               "SGLANG_CPP_OVERHEAD_PROBE=0 and give SGLANG_CPP_CHUNK_OVERHEAD_MS instead")
    return out


def probe_stage(sched, pp_rank: int, pp_size: int, n_chunks: int, chunk: int, seed: int = 0) -> list[tuple]:
    """This stage's (step, forward, blocked) ms for each of `n_chunks` pipelined chunks (after one warm one)."""
    from sglang.srt.distributed.parallel_state import get_pp_group
    from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache

    from .calibrate import forward, synthetic_req
    from .timing import DeviceTimer

    pp = get_pp_group()
    timer = DeviceTimer(str(getattr(sched, "device", "cpu")))  # its sync only: the stream's queued work
    rng = np.random.default_rng(seed + 7919)  # same ids on every stage
    req = synthetic_req(sched, rng, (n_chunks + 1) * chunk, "sglang-cpp-overhead-probe")
    steps, pending, cache = [], [], {}
    try:
        for k in range(n_chunks + 1):
            tick(f"in step {k} of the pipelined overhead probe (a receive from the previous stage, a forward)")
            t0 = time.perf_counter()
            blocked = 0.0
            received = None
            if pp_rank > 0:
                tb = time.perf_counter()
                received = pp.recv_tensor_dict()
                timer.sync()  # NCCL: the receive is queued on the stream; its wait on the peer lands here
                blocked += time.perf_counter() - tb
            if pp_rank < pp_size - 1:  # the previous chunk's send, committed before this forward as
                tb = time.perf_counter()  # SGLang's PP loop does (_pp_commit_proxy_send_work): a wait on a peer
                _commit(pending)
                timer.sync()  # NCCL: wait() makes the stream wait for the next stage; that wait lands here
                blocked += time.perf_counter() - tb
            req.extend_end = req.prefix_len + chunk
            fwd_ms, out = forward(sched, req, cache, received)
            if pp_rank < pp_size - 1:
                pending = pp.send_tensor_dict(out.logits_output.tensors, async_send=True) or []
            checkpoint_kv_cache(req, sched.tree_cache)
            req.init_next_round_input()
            if k:  # the first chunk warms the path up
                steps.append(((time.perf_counter() - t0) * 1e3, fwd_ms, blocked * 1e3))
        _commit(pending)
    finally:
        release_kv_cache(req, sched.tree_cache, checkpoint=False)
    return steps


def _commit(works) -> None:
    for w in works:
        if getattr(w, "work", None) is not None:
            w.work.wait()


def measure_overhead(sched, cfg, cost, n_chunks: int, log=None):
    """`cost` with each stage's measured overhead added to its c0 (world rank 0's figures, on every rank)."""
    from .consensus import from_rank0, on_every_rank

    chunk = 2 * cfg.plan_config().align
    got = on_every_rank(lambda: {"stage": cfg.pp_rank,
                                 "steps": probe_stage(sched, cfg.pp_rank, cfg.pp_size, n_chunks, chunk)})

    over = from_rank0(lambda: decide_overheads(got))
    logger.info("[sglang-cpp] per-chunk overhead measured in the pipeline (%d chunks of %d tokens): %s; "
                "charged per stage on top of the calibrated forwards", n_chunks, chunk,
                ", ".join(f"PP{s} {o:.2f} ms" for s, o in enumerate(over)))
    if log is not None:
        log.write("overhead", stages_ms=[round(o, 4) for o in over], chunks=n_chunks, chunk=chunk)
    return with_overheads(cost, over), over


def with_overheads(cost, over: list[float]):
    """`cost` with each stage's overhead added to its c0 (one model for every stage: the largest)."""
    from ..core.costmodel import PipelineCost, add_constant

    if isinstance(cost, PipelineCost) and len(cost.stages) == len(over):
        return PipelineCost(tuple(add_constant(m, o) for m, o in zip(cost.stages, over)))
    return add_constant(cost, max(over))
