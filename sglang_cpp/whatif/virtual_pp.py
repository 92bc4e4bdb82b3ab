"""Virtual pipeline stages (interleaved PP) in the simulator: V model slices per rank, every chunk visiting
every rank V times.

Why: the competing answer to the pipeline bubble (vllm-ascend PRs #11976, #14945, #16618; SGLang #39279)
gives each of the P ranks V non-adjacent slices of the layers, so the fill and drain shrink to (P-1)/V
stage times, at the price of V times the per-visit overheads and P2P transfers. This prices it beside
chunk planning, on the same per-rank cost models.

Schedule: virtual stage v (0 <= v < P*V) is rank v mod P with 1/V of that rank's layers (the rank's
t(L, x) / V). Visit (k, v) of chunk k starts once (k, v-1) has arrived over the link and (k-1, v) is done
(the previous chunk's KV in those layers). A rank runs the ready visit that can start earliest, the
oldest chunk first on a tie: non-delay list scheduling, what a FIFO engine does. Transfers are deferred
sends with pre-posted receives (SimConfig's "deferred" / "batched"): a visit's activations arrive
`transfer_ms(x)` after the previous visit ends, and occupy neither rank. V = 1 is the plain pipeline.
"""
from __future__ import annotations

import math

import numpy as np

from .simulator import Event, SimConfig, SimResult, _as_plan, _overhead_times, _stage_costs, _times


def simulate_virtual(plan, cost, pp_size: int, virtual_stages: int, config: SimConfig | None = None, *,
                     visit_overhead_ms: float | None = None, prefix_len: int | None = None) -> SimResult:
    """One request's chunk plan through P ranks of V virtual stages each, arriving at t = 0.

    `visit_overhead_ms`: fixed cost of every visit (scheduling, launch, P2P setup); None takes each rank's
    per-chunk overhead from the cost (PipelineCost.overheads), which a plain pipeline pays once per chunk and
    stage."""
    cfg = config if config is not None else SimConfig()
    P, V = pp_size, virtual_stages
    for name, v in (("pp_size", P), ("virtual_stages", V)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name}={v!r} must be an integer >= 1")
    if visit_overhead_ms is not None and not (math.isfinite(visit_overhead_ms) and visit_overhead_ms >= 0):
        raise ValueError(f"visit_overhead_ms={visit_overhead_ms!r} must be a finite number >= 0")
    chunks, L0 = _as_plan(plan, prefix_len)
    models, over = _stage_costs(cost, P)
    K, N = len(chunks), P * V
    x = np.array(chunks)
    L = L0 + np.concatenate([[0], np.cumsum(x)[:-1]])
    O = _overhead_times(over, x, visit_overhead_ms)  # [rank][chunk]
    t = (np.stack([_times(m, L, x, s) for s, m in enumerate(models)]) / V).tolist()  # [rank][chunk]
    tr = np.broadcast_to(cfg.transfer_ms(x), x.shape).tolist() if P > 1 else [0.0] * K
    done = [[None] * N for _ in range(K)]
    free, busy = [0.0] * P, [0.0] * P
    events: list[Event] = []
    ready = {(0, 0): 0.0}  # visits whose dependencies are done -> the time they could start on an idle rank

    def release(k: int, v: int) -> None:
        if k < K and v < N and (v == 0 or done[k][v - 1] is not None) and (k == 0 or done[k - 1][v] is not None):
            ready[(k, v)] = max(done[k][v - 1] + tr[k] if v else 0.0, done[k - 1][v] if k else 0.0)

    while ready:
        k, v = min(ready, key=lambda kv: (max(free[kv[1] % P], ready[kv]), kv))
        r = v % P
        start = max(free[r], ready.pop((k, v)))
        o = O[r][k]
        end = start + o + t[r][k]
        meta = {"chunk": k, "request": 0, "L": int(L[k]), "x": int(x[k])}
        if o > 0:
            events.append(Event(r, start=start, end=start + o, kind="overhead", **meta))
        events.append(Event(r, start=start + o, end=end, kind="compute", **meta))
        busy[r] += end - start
        free[r] = done[k][v] = end
        release(k, v + 1)
        release(k + 1, v)
    end = done[K - 1][N - 1]
    return SimResult(pp_size=P, makespan_ms=max(max(free), end), ttfts_ms=(end,), arrivals_ms=(0.0,),
                     busy_ms=tuple(busy), comm_ms=(0.0,) * P, events=tuple(events), config=cfg)


__all__ = ["simulate_virtual"]
