"""Many prompts through one pipeline, each planned as the server would plan it at the moment it starts.

Why: `bench ttft --simulate --num-prompts N --max-concurrency N` used to give every prompt of a burst the
same chunks, the single-prompt plan's. On a server each prompt is planned when it starts, from what every
stage shares then (core/queue_plan.py): the chunks still in the pipe, the prompts waiting behind it and the
offered load (core/load.py, read from the arrivals so far), and its remaining chunks are planned again at
the first chunk boundary after the waiting queue changed. This module replays that decision loop on the
planner's own flow shop (stage times plus the per-chunk overhead, free P2P: what the plugin sees), so the
simulated run cuts the chunks the plugin would pick; the times are then taken from the pipeline simulator
with its P2P settings (`simulator.simulate_requests`).

Arrivals: a burst (all at t = 0), a closed loop (`max_concurrency`: the next prompt goes out when one
finished) or a stream (`arrivals_ms`, e.g. Poisson, bench_serving's --request-rate), the last two together
as bench_serving runs them (a prompt goes out at its arrival or when a slot frees, whichever is later).
Each decision's planning time occupies every stage before the chunk it cuts (`planning_ms`: measured as the
policy runs, or a fixed charge per planner decision): a stage plans once it is free and the prompt is known
(SGLang relays the requests to every stage before the activations), so the time delays a stage's next chunk
where the stage was not waiting for that chunk's activations anyway, and a slow planner shows.

In flight, as the plugin sees it: the chunks among the last P-1 issued whose last stage is still busy when
the next chunk starts on stage 0 (SGLang's other micro-batch slots). Pure numpy.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..core.load import WINDOW, estimate_load
from ..core.objective import stage_times
from ..core.queue_plan import MAX_WAITING, QueueView, counted_behind, needs_replan
from .simulator import SimConfig, SimResult, simulate_requests

Planner = Callable[[int, int, QueueView], object]  # (prompt_len, prefix_len, view) -> chunks, or a ChunkPlan


@dataclass(frozen=True)
class StreamPolicy:
    """A chunk policy for a stream: `plan(prompt_len, prefix_len, view)` gives the chunks from prefix_len on
    (a list, or a ChunkPlan whose meta says what it counted behind); `queue_aware` policies see the load and
    are asked again at a boundary where the waiting prompts changed beyond what their plan counted
    (core/queue_plan.needs_replan);
    `planner`: its decisions run sglang-cpp's planner (what a fixed `planning_ms` charge applies to; fixed
    chunks and upstream's dynamic chunking decide in O(1) arithmetic)."""

    name: str
    plan: Planner
    queue_aware: bool = False
    planner: bool = False


@dataclass(frozen=True)
class StreamResult:
    chunks: tuple  # per prompt, the chunks it ran
    arrivals_ms: tuple  # per prompt, when it was sent (its arrival, or when a concurrency slot freed)
    replans: tuple  # per prompt, the prefixes where it was planned again
    planning_ms: tuple  # per prompt, the planning time charged before each of its chunks
    loads: tuple  # per prompt, the load estimate of its first decision (Load.to_dict(), or None)
    counted: tuple  # per prompt, how many prompts behind its first decision counted (seen and expected)
    sim: SimResult


def _check_arrivals(arrivals_ms, n: int) -> list[float]:
    if arrivals_ms is None:
        return [0.0] * n
    out = [float(a) for a in arrivals_ms]
    if len(out) != n or not all(np.isfinite(out)) or min(out) < 0 or any(b < a for a, b in zip(out, out[1:])):
        raise ValueError(f"arrivals_ms: give {n} finite, non-decreasing times >= 0 (one per prompt)")
    return out


def plan_stream(prompt_lens, policy: StreamPolicy, cost, pp_size: int, *, max_concurrency: int | None = None,
                arrivals_ms=None, planning_ms: float | None = 0.0, config: SimConfig | None = None) -> StreamResult:
    """Run `prompt_lens` (FIFO) through P stages. Prompt i arrives at `arrivals_ms[i]` (default: all at t = 0,
    a burst) and is sent at that time or, with `max_concurrency` C, when the prompt C places earlier
    finished, whichever is later. `planning_ms`: None charges each decision the time it took to compute
    here; a number charges that many ms per decision of a `planner` policy (and none to the others).
    Returns every prompt's chunks and the simulated run."""
    lens = [int(n) for n in prompt_lens]
    if not lens or min(lens) < 1:
        raise ValueError(f"prompt lengths {lens}: give at least one, each >= 1 token")
    P, N = int(pp_size), len(lens)
    C = N if max_concurrency is None else int(max_concurrency)
    if C < 1:
        raise ValueError(f"--max-concurrency={C} must be >= 1")
    if planning_ms is not None and not (np.isfinite(planning_ms) and planning_ms >= 0):
        raise ValueError(f"planning_ms={planning_ms!r} must be a finite number >= 0 (None: measured)")
    release = _check_arrivals(arrivals_ms, N)
    arrivals: list[float | None] = [release[i] if i < C else None for i in range(N)]
    F = np.zeros(P)  # per stage, when it is free again
    recent: list[tuple[int, int, float]] = []  # (prefix, chunk, last-stage end) of the last P-1 chunks issued
    chunks, replans, charged, loads, counts = [], [], [], [], []
    done: list[float] = []  # per prompt planned so far, when its last chunk left the last stage
    k = 0  # prompts 0..k-1 have arrived: sent times are non-decreasing in index and s0 never goes back
    for i, n in enumerate(lens):
        L, todo, key, again, mine, load0, counted, counted0, ran = 0, [], None, [], [], None, 0, None, []
        while L < n:
            s0 = max(F[0], arrivals[i])
            while k < N and arrivals[k] is not None and arrivals[k] <= s0:
                k += 1
            behind = list(range(i + 1, min(k, i + 1 + MAX_WAITING)))
            d = 0.0
            if not todo or (policy.queue_aware and needs_replan(key, tuple(behind), counted)):
                if todo:
                    again.append(L)
                # arrival j found prefill work ahead of it unless prompt j - 1 (FIFO: the last before it) had
                # left the pipe by then; prompt i and those after it are not done
                seen = range(max(0, k - WINDOW), k)
                load = estimate_load([(arrivals[j], lens[j], j >= 1 and (j > len(done) or done[j - 1] > arrivals[j]))
                                      for j in seen], s0) if policy.queue_aware else None
                view = QueueView(tuple((p, x) for p, x, end in recent if end > s0),
                                 tuple((lens[j], 0) for j in behind), tuple(str(j) for j in behind), load)
                t0 = time.perf_counter()
                got = policy.plan(n, L, view)
                todo, key = [int(c) for c in getattr(got, "chunks", got)], tuple(behind)
                counted = counted_behind(got) if hasattr(got, "meta") else len(behind)
                d = (time.perf_counter() - t0) * 1e3 if planning_ms is None else \
                    float(planning_ms) if policy.planner else 0.0
                if sum(todo) != n - L or min(todo) < 1:
                    raise ValueError(f"policy {policy.name}: chunks {todo} do not cover tokens {L}..{n}")
                if counted0 is None:
                    load0, counted0 = (load.to_dict() if load is not None else None), counted
            x = todo.pop(0)
            t = np.asarray(stage_times(cost, float(L), float(x), P), float)  # overheads included
            end = s0
            for s in range(P):  # each stage plans once it is free and the prompt is known, then runs the chunk
                ready = max(F[s], arrivals[i]) + d if d > 0 else F[s]
                end = max(ready, end) + t[s]
                F[s] = end
            recent = (recent + [(L, x, float(end))])[-(P - 1):] if P > 1 else []
            L += x
            ran.append(x)
            mine.append(d)
        chunks.append(ran)
        done.append(float(F[-1]))
        replans.append(tuple(again))
        charged.append(tuple(mine))
        loads.append(load0)
        counts.append(counted0)
        if i + C < N:  # a slot frees: the next request goes out now, or at its arrival if later
            arrivals[i + C] = max(release[i + C], float(F[-1]))
    sim = simulate_requests([(a, ch) for a, ch in zip(arrivals, chunks)], cost, P, config or SimConfig(),
                            planning_ms=charged)
    return StreamResult(tuple(map(tuple, chunks)), tuple(arrivals), tuple(replans), tuple(charged), tuple(loads),
                        tuple(counts), sim)


def poisson_arrivals(n: int, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """bench_serving's arrival process: gaps drawn from a gamma distribution of shape `burstiness` and mean
    1 / request_rate (burstiness 1: Poisson), in ms, the first prompt at 0; `inf`: every prompt at 0."""
    if not request_rate > 0:
        raise ValueError(f"--request-rate {request_rate}: must be > 0 (inf: every prompt at once)")
    if not (np.isfinite(burstiness) and burstiness > 0):
        raise ValueError(f"--burstiness {burstiness}: must be a finite number > 0 (1: Poisson)")
    if np.isinf(request_rate):
        return [0.0] * n
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(burstiness, 1e3 / (request_rate * burstiness), size=n)
    gaps[0] = 0.0
    return [float(a) for a in np.cumsum(gaps)]


__all__ = ["StreamPolicy", "StreamResult", "plan_stream", "poisson_arrivals"]
