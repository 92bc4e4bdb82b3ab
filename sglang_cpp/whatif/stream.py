"""Many prompts through one pipeline, each planned as the server would plan it at the moment it starts.

Why: `bench ttft --simulate --num-prompts N --max-concurrency N` used to give every prompt of a burst the
same chunks, the single-prompt plan's. On a server each prompt is planned when it starts, from what every
stage shares then (core/queue_plan.py): the chunks still in the pipe and the prompts waiting behind it, and
its remaining chunks are planned again at the first chunk boundary after the waiting queue changed. This
module replays that decision loop on the planner's own flow shop (stage times plus the per-chunk overhead,
free P2P: what the plugin sees), so the simulated burst runs the chunks the plugin would pick; the times are
then taken from the pipeline simulator with its P2P settings (`simulator.simulate_requests`).

In flight, as the plugin sees it: the chunks among the last P-1 issued whose last stage is still busy when
the next chunk starts on stage 0 (SGLang's other micro-batch slots). Pure numpy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..core.objective import stage_times
from ..core.queue_plan import MAX_WAITING, QueueView
from .simulator import SimConfig, SimResult, simulate_requests

Planner = Callable[[int, int, QueueView], list]  # (prompt_len, prefix_len, view) -> chunks of the rest


@dataclass(frozen=True)
class StreamPolicy:
    """A chunk policy for a stream: `plan(prompt_len, prefix_len, view)` gives the chunks from prefix_len on;
    `queue_aware` policies are asked again at a boundary where the waiting prompts changed."""

    name: str
    plan: Planner
    queue_aware: bool = False


@dataclass(frozen=True)
class StreamResult:
    chunks: tuple  # per prompt, the chunks it ran
    arrivals_ms: tuple
    replans: tuple  # per prompt, the prefixes where it was planned again
    sim: SimResult


def plan_stream(prompt_lens, policy: StreamPolicy, cost, pp_size: int, *, max_concurrency: int | None = None,
                config: SimConfig | None = None) -> StreamResult:
    """Run `prompt_lens` (FIFO) through P stages: the first `max_concurrency` arrive at t = 0 (default: all,
    a burst), each later one when the prompt `max_concurrency` places earlier finished (a closed loop, as
    `bench ttft` sends them). Returns every prompt's chunks and the simulated run."""
    lens = [int(n) for n in prompt_lens]
    if not lens or min(lens) < 1:
        raise ValueError(f"prompt lengths {lens}: give at least one, each >= 1 token")
    P, N = int(pp_size), len(lens)
    C = N if max_concurrency is None else int(max_concurrency)
    if C < 1:
        raise ValueError(f"--max-concurrency={C} must be >= 1")
    arrivals: list[float | None] = [0.0 if i < C else None for i in range(N)]
    F = np.zeros(P)  # per stage, when it is free again
    recent: list[tuple[int, int, float]] = []  # (prefix, chunk, last-stage end) of the last P-1 chunks issued
    out, replans = [], []
    for i, n in enumerate(lens):
        L, todo, key, again = 0, [], None, []
        while L < n:
            s0 = max(F[0], arrivals[i])
            behind = [j for j in range(i + 1, N) if arrivals[j] is not None and arrivals[j] <= s0][:MAX_WAITING]
            if not todo or (policy.queue_aware and tuple(behind) != key):
                if todo:
                    again.append(L)
                view = QueueView(tuple((p, x) for p, x, end in recent if end > s0),
                                 tuple((lens[j], 0) for j in behind), tuple(str(j) for j in behind))
                todo, key = [int(c) for c in policy.plan(n, L, view)], tuple(behind)
                if sum(todo) != n - L or min(todo) < 1:
                    raise ValueError(f"policy {policy.name}: chunks {todo} do not cover tokens {L}..{n}")
            x = todo.pop(0)
            t = np.asarray(stage_times(cost, float(L), float(x), P), float)  # per-chunk overheads included
            end = s0
            for s in range(P):
                end = max(F[s], end) + t[s]
                F[s] = end
            recent = (recent + [(L, x, float(end))])[-(P - 1):] if P > 1 else []
            L += x
            out.append((i, x))
        replans.append(tuple(again))
        if i + C < N:  # the closed loop: the next request goes out when this one finished
            arrivals[i + C] = float(F[-1])
    chunks = [[x for r, x in out if r == i] for i in range(N)]
    sim = simulate_requests([(a, ch) for a, ch in zip(arrivals, chunks)], cost, P, config or SimConfig())
    return StreamResult(tuple(map(tuple, chunks)), tuple(arrivals), tuple(replans), sim)


__all__ = ["StreamPolicy", "StreamResult", "plan_stream"]
