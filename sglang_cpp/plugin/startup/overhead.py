"""The per-chunk overhead, measured where it is paid: a short pipelined run at startup.

Calibration times each stage's forward alone. A chunk in the running pipeline also pays, on every stage,
what a step costs beyond its forward: the receive of the previous stage's hidden states, the send to the
next, and the batch set-up around them. Without it the planner thinks small chunks are free and cuts too
many (the old C/4 floor was all that stopped it).

Every stage runs the same synthetic request, `SGLANG_CPP_OVERHEAD_PROBE` chunks of one alignment unit
times two, through the real P2P path (`GroupCoordinator.send_tensor_dict` / `recv_tensor_dict`, as the
scheduler's proxy messages, asynchronous sends committed at the next step before its forward, as the
scheduler's PP loop does, scheduler_pp_mixin.py:175-177). Per step a
stage records its wall time, its forward time (the calibration's timer) and the time it spent blocked on a
peer (the receive, the commit of the previous send). A stage's overhead is the median over the steps of
step - forward - blocked: the time a chunk costs this stage beyond its forward when nothing waits, so it
is >= 0 by construction. Not in it: the scheduler loop's own batch formation and the output relay (see
docs/compatibility.md, 'Per-chunk overhead'; the serving logs measure those, `benchmarks/overhead.py`).

The hidden states a stage receives grow with the chunk (about 470 MB per hop for 16K tokens at hidden
7168), and SGLang's receive finishes before the stage's forward starts (scheduler_pp_mixin.py
_pp_recv_proxy_tensors; on NCCL a rendezvous, so the transfer cannot start before the receiver asks): the
wait is the receiving stage's, per chunk, but it is "blocked" time above. So after the pipelined run every
hop is timed alone, at two chunk sizes (`transfer_sizes`): the sender sends the proxy tensors of x tokens
(the shapes its forward produced, split over attention TP as the scheduler's `send_tensor_dict` does)
right after a gather of every rank's status (a barrier that also says who failed) and a wait of SEND_DELAY_S (the receive is posted first, so no small send
lands in NCCL's eager buffer early), the receiver times its receive less that wait. A line through the medians
at the two sizes gives the receiving stage a term in x.

World rank 0 gathers every stage's figures and each stage gets its own overhead, a `ChunkOverhead` (ms per
chunk, ms per token) carried beside its cost model (PipelineCost.overheads), the same on every rank. A negative or
non-finite value is a startup error naming the stage.
"""
from __future__ import annotations

import logging
import math
import time

import numpy as np

from ...core.costmodel import ChunkOverhead, with_overheads
from ... import envs
from .deadline import note_error, tick

logger = logging.getLogger("sglang_cpp")


def stage_overhead(steps: list[tuple[float, float, float]]) -> float:
    """Median of step - forward - blocked (ms) over (step, forward, blocked) triples."""
    return float(np.median([s - f - b for s, f, b in steps])) if steps else math.nan


def transfer_line(timed: dict) -> tuple[float, float]:
    """(ms at x = 0, ms per token) of a line through the medians of the receive times at two sizes ({x: [ms, ...]}),
    both floored at 0 (a flat or noisy pair: no term in x); (0, 0) with none. The barrier's exit skew (a TCP hop
    on gloo across nodes) shifts both sizes alike: the slope keeps clear of it."""
    pts = sorted((int(x), float(np.median(v))) for x, v in timed.items() if v)
    if not pts:
        return 0.0, 0.0
    if len(pts) == 1:
        return max(pts[0][1], 0.0), 0.0
    (x1, t1), (x2, t2) = pts[0], pts[-1]
    per_token = max((t2 - t1) / (x2 - x1), 0.0)
    return max(t1 - per_token * x1, 0.0), per_token


def decide_overheads(gathered: list[dict]) -> list[ChunkOverhead]:
    """Per stage (ascending), the slowest of its TP ranks' overheads: the step median beyond forward and waits
    (ms), the line of its receive times (`transfer`, {x: [ms]}; none on PP0) at x = 0 (received_ms) and the
    line's slope (per_token_ms), each the largest over the stage's TP ranks. A negative or non-finite step median fails naming the stage (it cannot
    happen with a working timer: the forward is inside the step)."""
    per_stage: dict[int, list] = {}
    for g in gathered:
        o = stage_overhead(g["steps"])
        if not (math.isfinite(o) and o >= 0):
            raise RuntimeError(f"sglang-cpp: the per-chunk overhead measured on PP{g['stage']} is {o!r} ms (median "
                               "of step - forward - blocked over the pipelined probe): the stage's timer is broken. "
                               "Set SGLANG_CPP_OVERHEAD_PROBE=0 and give SGLANG_CPP_CHUNK_OVERHEAD_MS instead")
        lat, per_token = transfer_line({int(x): v for x, v in (g.get("transfer") or {}).items()})
        per_stage.setdefault(g["stage"], []).append(ChunkOverhead(o, per_token, lat))
    return [ChunkOverhead.largest(per_stage[s]) for s in sorted(per_stage)]


def transfer_medians(gathered: list[dict]) -> list[list]:
    """Per stage (ascending), [[x, median receive ms], ...] of its slowest TP rank at each size (the log's)."""
    per_stage: dict[int, dict] = {}
    for g in gathered:
        at = per_stage.setdefault(g["stage"], {})
        for x, v in (g.get("transfer") or {}).items():
            if v:
                at[int(x)] = max(at.get(int(x), 0.0), float(np.median(v)))
    return [[[x, round(ms, 4)] for x, ms in sorted(per_stage[s].items())] for s in sorted(per_stage)]


def transfer_sizes(align: int, largest: int) -> tuple[int, ...]:
    """The two chunk sizes a hop is timed at: the probe's own (two alignment units) and one 16 times that, at
    most 4096 tokens (a transient of x * hidden on both GPUs at startup) and never above `largest`, the
    plans' largest chunk; one size when the two would be closer than a factor of 4."""
    small = 2 * align
    big = min(16 * small, 4096, int(largest)) // align * align
    return (small, big) if big >= 4 * small else (small,)


SEND_DELAY_S = 0.002  # the sender's wait after the status gather, taken off each timed receive


def bounded_from(pp_rank: int, pp_size: int) -> tuple[int, int]:
    """(first step whose receive wait is bounded, first step whose send-commit wait is bounded) in the pipelined
    probe. A first forward may JIT-compile or autotune for minutes (the startup deadline bounds those waits). Step
    k's receive waits on the previous stage's forward of chunk k (a first forward only at k = 0). Step k's commit
    waits on the next stage posting its receive of chunk k - 1, which waits on that stage's commit of step k - 2,
    and so on down the pipe: rank r + d must have finished step k - 2d, so the last stage's first forward is behind
    every commit before step 2 (P - 1 - r) + 1. (SGLang's metadata rendezvous over gloo blocks the CPU through a
    peer's forward anyway, parallel_state.py:1612-1698; these bounds hold without relying on it.)"""
    return 1, 2 * (pp_size - 1 - pp_rank) + 1


def time_transfers(pp, pp_rank: int, pp_size: int, template, sizes, timer, ag=None, repeats: int = 3,
                   agree=None) -> dict:
    """{x: [ms]} of this stage's receives from the previous stage at each size (empty on PP0): hop by hop,
    one warm-up and `repeats` timed sends of `template`'s tensors at x rows, each after a gather of every rank's
    status over the world group's CPU group (`agree`; a barrier that also says who failed) and the sender's
    SEND_DELAY_S, so the receive waits for the transfer alone, not for a forward. A rank that fails a step
    says so at the next gather and every rank raises there: no rank is left in a gather its peers skipped. A
    failure that strands its hop peer (a receive never posted, a send that never comes) is ended only by the
    startup deadline or NCCL's watchdog, as before.
    `ag`: the attention-TP group the scheduler splits its sends over (send_tensor_dict's all_gather_group)."""
    import torch

    got: dict = {}
    if not sizes or pp_size < 2:
        return got
    error = ""
    limit = envs.TRANSFER_TIMEOUT_S.get()

    def step(what: str) -> None:
        _agree(agree, error, f"before {what}", "the hidden-state transfer timing failed")
        tick(f"in {what}")

    payloads: dict = {}
    try:  # every size's tensors up front: an allocation that fails is said at the first gather
        payloads = {x: ({k: (v.new_zeros((x,) + tuple(v.shape[1:])) if torch.is_tensor(v) else v)
                         for k, v in template.items()} if template is not None else None) for x in sizes}
    except Exception as exc:
        error = _failed_here("allocating the transfer timing's tensors", exc)
    for x in sizes:
        for hop in range(pp_size - 1):
            for r in range(repeats + 1):
                step(f"the transfer PP{hop} -> PP{hop + 1} of {x} tokens")
                try:
                    what = f"the transfer PP{hop} -> PP{hop + 1} of {x} tokens"
                    if pp_rank == hop:
                        time.sleep(SEND_DELAY_S)  # the receive is posted first: no small send lands early (NCCL eager)
                        pp.send_tensor_dict(payloads[x], all_gather_group=ag)
                        timer.sync(limit, f"the send of {what}")  # bounded: a failed peer never strands this rank
                    elif pp_rank == hop + 1:
                        t0 = time.perf_counter()
                        pp.recv_tensor_dict(all_gather_group=ag)
                        timer.sync(limit, f"the receive of {what}")  # NCCL: the receive is queued on the stream
                        if r:
                            got.setdefault(x, []).append(max((time.perf_counter() - t0 - SEND_DELAY_S) * 1e3, 0.0))
                except Exception as exc:
                    error = _failed_here(f"the transfer PP{hop} -> PP{hop + 1} of {x} tokens", exc)
    step("the end of the transfer timing")
    payloads.clear()
    return got


def _failed_here(what: str, exc: Exception) -> str:
    """This rank's error, logged and kept for the startup deadline's message, as the next gather sends it."""
    msg = f"world rank {_rank()}: {type(exc).__name__}: {exc} (in {what})"
    logger.exception("[sglang-cpp] %s", msg)
    note_error(msg)
    return msg


def probe_stage(sched, pp_rank: int, pp_size: int, n_chunks: int, chunk: int, seed: int = 0,
                sizes: tuple = (), agree=None) -> dict:
    """This stage's {"steps": (step, forward, blocked) ms for each of `n_chunks` pipelined chunks (after one
    warm one), "transfer": {x: [ms]} of its receives timed alone at `sizes` (time_transfers)}. Before the
    transfer timing every rank says whether its pipelined steps ran (`agree`, a gather over the world group): a
    rank that failed there would otherwise meet its peers' transfer gathers with the caller's."""
    steps, pending, cache, template, req, release = [], [], {}, None, None, None
    must_agree = bool(sizes) and pp_size > 1  # the transfer timing follows: every rank says first it got there
    try:  # the set-up too: a rank failing anywhere before the agreement still reaches it
        from sglang.srt.distributed.parallel_state import get_pp_group
        from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache as release

        from ..timing import DeviceTimer
        from .harness import forward, synthetic_req

        pp = get_pp_group()
        timer = DeviceTimer(str(getattr(sched, "device", "cpu")))  # its sync only: the stream's queued work
        limit = envs.TRANSFER_TIMEOUT_S.get()
        recv_from, commit_from = bounded_from(pp_rank, pp_size)
        rng = np.random.default_rng(seed + 7919)  # same ids on every stage
        req = synthetic_req(sched, rng, (n_chunks + 1) * chunk, "sglang-cpp-overhead-probe")
        for k in range(n_chunks + 1):
            tick(f"in step {k} of the pipelined overhead probe (a receive from the previous stage, a forward)")
            t0 = time.perf_counter()
            blocked = 0.0
            received = None
            if pp_rank > 0:
                tb = time.perf_counter()
                received = pp.recv_tensor_dict()
                # NCCL: the receive is queued on the stream; its wait on the peer lands here, bounded once no first
                # forward lies behind it (bounded_from)
                timer.sync(limit if k >= recv_from else 0.0, f"step {k}'s receive PP{pp_rank - 1} -> PP{pp_rank} "
                           "in the pipelined overhead probe")
                blocked += time.perf_counter() - tb
            if pp_rank < pp_size - 1:  # the previous chunk's send, committed before this forward as
                tb = time.perf_counter()  # SGLang's PP loop does (_pp_commit_proxy_send_work): a wait on a peer
                _commit(pending)
                # NCCL: wait() makes the stream wait for the next stage; that wait lands here, bounded as above
                timer.sync(limit if k >= commit_from else 0.0, f"step {k}'s send PP{pp_rank} -> PP{pp_rank + 1} in "
                           "the pipelined overhead probe")
                blocked += time.perf_counter() - tb
            req.extend_end = req.prefix_len + chunk
            fwd_ms, out = forward(sched, req, cache, received)
            if pp_rank < pp_size - 1:
                template = out.logits_output.tensors
                pending = pp.send_tensor_dict(template, async_send=True) or []
            checkpoint_kv_cache(req, sched.tree_cache)
            req.init_next_round_input()
            if k:  # the first chunk warms the path up
                steps.append(((time.perf_counter() - t0) * 1e3, fwd_ms, blocked * 1e3))
        _commit(pending)
        if must_agree:
            must_agree = False
            _agree(agree, "", "to finish the pipelined overhead probe", "another rank failed in the pipelined overhead probe")
        transfer = time_transfers(pp, pp_rank, pp_size, template, sizes, timer, getattr(sched, "attn_tp_group", None),
                                  agree=agree)
    except Exception as exc:
        if must_agree:  # failed before the agreement: the peers learn it there and skip the transfer timing
            msg = _failed_here("the pipelined overhead probe", exc)
            tick("telling every rank this one failed in the pipelined overhead probe (a gather over the world group)")
            (agree or _all_gather)(msg)
        raise
    finally:
        if req is not None and release is not None:
            release(req, sched.tree_cache, checkpoint=False)
    return {"steps": steps, "transfer": transfer}


def _agree(agree, error: str, waiting: str, failed: str) -> None:
    """One status gather over the world group (`agree`, else consensus.all_gather): this rank's `error` ('' when
    none) to every rank; any rank's error raises on every rank, `failed` naming the step."""
    tick(f"waiting for every rank {waiting} (a gather over the world group)")
    errors = [str(e) for e in (agree or _all_gather)(error) if e]
    if errors:
        raise RuntimeError(f"{failed}: {'; '.join(errors)}")


def _all_gather(payload):
    from .consensus import all_gather

    return all_gather(payload)


def _rank() -> int:
    from .consensus import world_rank

    return world_rank()


def _commit(works) -> None:
    for w in works:
        if getattr(w, "work", None) is not None:
            w.work.wait()


def measure_overhead(sched, cfg, cost, n_chunks: int, log=None):
    """`cost` carrying each stage's measured per-chunk overhead (world rank 0's figures, on every rank), and
    those overheads."""
    from .consensus import from_rank0, on_every_rank

    pc = cfg.plan_config()
    chunk, sizes = 2 * pc.align, transfer_sizes(pc.align, pc.max_chunk)
    got = on_every_rank(lambda: {"stage": cfg.pp_rank,
                                 **probe_stage(sched, cfg.pp_rank, cfg.pp_size, n_chunks, chunk, sizes=sizes)})

    over, received = from_rank0(lambda: (decide_overheads(got), transfer_medians(got)))
    from .harness import _empty_cache

    _empty_cache(str(getattr(sched, "device", "cpu")))  # the probe's buffers back before serving
    logger.info("[sglang-cpp] per-chunk overhead measured in the pipeline (%d chunks of %d tokens; hidden-state "
                "receives timed at %s tokens): %s; charged per stage on top of the calibrated forwards", n_chunks,
                chunk, "/".join(map(str, sizes)), ", ".join(f"PP{s} {o.per_chunk_ms:.2f} ms + {o.per_token_ms * 1e3:.3f} us "
                                                            "per token" for s, o in enumerate(over)))
    if len(sizes) == 1 and cfg.pp_size > 1:
        logger.info("[sglang-cpp] the hidden-state receives were timed at one size (%d tokens: the alignment leaves "
                    "no second within 4096): no per-token term, the whole receive charged per chunk", sizes[0])
    if log is not None:
        log.write("overhead", stages_ms=[round(o.ms, 4) for o in over],
                  received_ms=[round(o.received_ms, 4) for o in over],
                  per_token_ms=[float(f"{o.per_token_ms:.6g}") for o in over], chunks=n_chunks, chunk=chunk,
                  transfer_sizes=list(sizes), transfer_ms=received)
    return with_overheads(cost, over, cfg.pp_size), over
