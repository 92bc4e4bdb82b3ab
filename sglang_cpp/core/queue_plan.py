"""Plans for a pipeline that is already busy: a prompt planned with the chunks in flight ahead of it and the
prompts waiting behind it.

Why: the single-prompt plan minimises one prompt's makespan, sum(t) + (P-1) max(t), and so ends in small
tail chunks that shorten the pipeline's drain. In a stream every chunk of every prompt goes through the same
flow shop, and chunk j leaves the last stage at C_j = sum_{i<=j} t_i + (P-1) max_{i<=j} t_i (equal stages):
once a big chunk is in the pipe, smaller chunks behind it shorten nobody's drain, they only add per-chunk
work. A prompt that starts while the pipe is busy, or with prompts queued behind it, should cut the chunks
that minimise the mean completion of the prompts in view; only the last of a burst shrinks its tail. ROCm
ATOM's dynamic chunking, which plans every prompt alone, loses 10-15% throughput at concurrency 4-16.

The objective is the flow-shop recurrence (`objective.flow_shop`) with the per-chunk overhead over: the
chunks in flight (priced, their work already committed) and this prompt's candidate chunks, every stage
priced apart, then the prompts behind it, each cut into equal-time chunks at the pacing time of this
prompt's candidate (its running max: chunks up to it add no drain). Those are plans not yet made, so they
are modelled, not cut: as a fluid (`behind.Behind`: chunk count, paced total and largest chunk from integrals
over the prefix, one grid for all of them) on stages that all take the slowest stage's time, whose state
advances in closed form (`advance_paced`, O(P) per candidate and prompt: exact for equal stages, an upper
bound otherwise). That keeps a decision with 16 prompts behind within issue 56's 20 ms. Candidates: the
single-prompt plan, fixed chunks and equal-time cuts into fewer chunks (`equal_time_search.EqualCounts`).
With nothing in view, or a one-chunk plan, the single-prompt plan is returned as it is. Pure numpy,
element-wise in a fixed order; every stage derives the same plan from the same view.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import detmath
from .equal_time import plan_equal_time
from .load import Load, expected_behind
from .behind import Behind, advance_paced, paced_totals
from .equal_time_search import EqualCounts
from .plan import ChunkPlan
from .objective import (PlanConfig, _check, _times, advance, chunk_rows, fixed_candidates, fixed_split, make_plan,
                        stage_times)

MAX_WAITING = 16  # prompts behind the current one that a plan looks at (planning time is linear in them)
N_GRID = 64  # target times on which the equal-time cuts are read
N_COUNTS = 20  # chunk counts tried for this prompt, from the fewest possible to the single-prompt plan's
N_BEHIND = 32  # target times on which the prompts behind are tabled (read between them in log-log)


@dataclass(frozen=True)
class QueueView:
    """What every stage shares when it plans a prompt: the chunks issued ahead of it that are still in the
    pipe, `inflight` ((prefix, chunk) per chunk, oldest first), and the prompts waiting behind it, `waiting`
    ((prompt_len, prefix_len) per prompt, in the scheduler's order), with their request ids `ids` when known
    (what a change of the queue is judged by: a waiting prompt's cached prefix may grow while it waits)."""

    inflight: tuple = ()
    waiting: tuple = ()
    ids: tuple = ()
    load: Load | None = None  # the offered load (core/load.py): prompts expected behind the visible queue

    def __post_init__(self):
        inflight = tuple((int(L), int(x)) for L, x in self.inflight)
        waiting = tuple((int(n), int(p)) for n, p in self.waiting)
        for L, x in inflight:
            if L < 0 or x < 1:
                raise ValueError(f"chunk in flight (prefix {L}, chunk {x}): need prefix >= 0 and chunk >= 1")
        for n, p in waiting:
            if n < 1 or not 0 <= p < n:
                raise ValueError(f"waiting prompt (prompt_len {n}, prefix_len {p}): need 0 <= prefix < length")
        if self.ids and len(self.ids) != len(waiting):
            raise ValueError(f"{len(self.ids)} request ids for {len(waiting)} waiting prompts")
        object.__setattr__(self, "inflight", inflight)
        object.__setattr__(self, "waiting", waiting)
        object.__setattr__(self, "ids", tuple(str(i) for i in self.ids))
        if isinstance(self.load, dict):
            object.__setattr__(self, "load", Load.from_dict(self.load))

    @property
    def queue_key(self) -> tuple:
        """What identifies the waiting queue: its request ids, else its prompts."""
        return self.ids or self.waiting

    @property
    def empty(self) -> bool:
        return not self.inflight and not self.waiting and not (self.load and self.load.known)

    def to_dict(self) -> dict:
        d = {"inflight": [list(c) for c in self.inflight], "waiting": [list(w) for w in self.waiting]}
        return {**d, "load": self.load.to_dict()} if self.load is not None else d

    @classmethod
    def from_dict(cls, d: dict) -> "QueueView":
        return cls(tuple(map(tuple, d.get("inflight", ()))), tuple(map(tuple, d.get("waiting", ()))),
                   load=Load.from_dict(d["load"]) if d.get("load") is not None else None)


def _times_of(chunks: list[list], starts: list[int], cost, P: int) -> np.ndarray:
    """Stage times (n, P, K) of n chunk lists, each after its own prefix, zero-padded to the longest (a
    zero-time job is transparent in the flow shop). Prefixes in integers (exact), one numpy pass for all."""
    lens, flat, row, col, L = chunk_rows(chunks, starts)
    t = np.zeros((len(chunks), P, int(lens.max())))
    t[row, :, col] = stage_times(cost, L.astype(float), flat.astype(float), P).T  # priced once per real chunk
    return t


def _by_length(lengths: list[int]) -> list[list[int]]:
    """Indices grouped by chunk count in powers of two: a 2048-chunk fixed candidate padded beside 8-chunk
    ones would cost 2048 steps for every candidate (the result is the same, the padding is transparent)."""
    groups: dict[int, list[int]] = {}
    for i, k in enumerate(lengths):
        groups.setdefault(max(int(k), 1).bit_length(), []).append(i)
    return list(groups.values())


def _states(mine: list[list], L0: int, view: QueueView, cost, P: int) -> np.ndarray:
    """Each candidate's flow-shop state (candidates, P) after the chunks in flight and then its own chunks
    (from the start of the first chunk in flight), every stage priced apart: the exact recurrence."""
    if view.inflight:
        L, x = np.array(view.inflight, float).T
        state = advance(stage_times(cost, L, x, P))
    else:
        state = np.zeros(P)
    G = np.empty((len(mine), P))
    for group in _by_length([len(c) for c in mine]):  # padded to their own longest, not the longest of all
        G[group] = advance(_times_of([mine[i] for i in group], [L0] * len(group), cost, P), state)
    return G


def _through(G: np.ndarray, behind: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """The last-stage completion of each candidate's own chunks and of every prompt behind, (S, M) per
    prompt (each candidate's paced total and largest chunk), shaped (candidates, 1 + len(behind))."""
    out = [G[:, -1]]
    for S, M in behind:
        G = advance_paced(G, S, M)
        out.append(G[:, -1])
    return np.stack(out, axis=1)


def completions(cands: list[tuple[list, list[list]]], L0: int, view: QueueView, cost, P: int) -> np.ndarray:
    """For each candidate (this prompt's chunks, the chunks of each prompt behind), the completion times on
    the last stage of this prompt and of every prompt behind it, shaped (candidates, 1 + waiting), measured
    from the start of the first chunk in flight: the flow-shop recurrence over the chunks in flight and this
    prompt's, every stage apart, then each prompt behind at the pipeline's pace (`advance_paced`)."""
    behind, memo = [], {}
    for i, (n, p) in enumerate(view.waiting):
        lists = [tuple(b[i]) for _, b in cands]
        key = (p, tuple(lists))  # a burst's prompts share their chunk lists
        if key not in memo:
            uniq = list(dict.fromkeys(lists))
            S, M = paced_totals([list(u) for u in uniq], [p] * len(uniq), cost)  # priced once per distinct list
            at = {u: j for j, u in enumerate(uniq)}
            which = np.array([at[ch] for ch in lists])
            memo[key] = (S[which], M[which])
        behind.append(memo[key])
    return _through(_states([list(c) for c, _ in cands], L0, view, cost, P), behind)


def _with_expected(view: QueueView, alone: list, L0: int, cost, cfg: PlanConfig) -> tuple[QueueView, list, float]:
    """The view with the prompts its load expects (core/load.py) appended to the waiting queue, each prompt's
    weight in the objective (1 for this one and every visible one, then the expected ones' weights), and the
    horizon they were counted over: when the prompts in view would complete, this one cut as if alone and
    those behind in chunks of the largest size (from the first chunk in flight)."""
    n_seen = len(view.waiting)
    weights = [1.0] * (1 + n_seen)
    if view.load is None or not view.load.known or n_seen >= MAX_WAITING:
        return view, weights, 0.0
    behind = [fixed_split(n - p, min(cfg.hi, n - p)) for n, p in view.waiting]
    horizon = float(completions([(alone, behind)], L0, view, cost, cfg.pp_size)[0, -1])
    n = max(view.load.mean_len, 1)
    big = np.asarray(fixed_split(n, min(cfg.hi, n)), float)  # a mean prompt at full throughput: its pacing time
    service = math.fsum(np.max(stage_times(cost, np.concatenate([[0.0], np.cumsum(big)[:-1]]), big, cfg.pp_size),
                               axis=0).tolist())  # fsum: exactly rounded, the same on every stage
    extra = expected_behind(view.load, horizon, MAX_WAITING - n_seen, service)
    if not extra:
        return view, weights, horizon
    waiting = view.waiting + ((n, 0),) * len(extra)
    ids = view.ids + tuple(f"expected-{k}" for k in range(len(extra))) if view.ids else ()
    return QueueView(view.inflight, waiting, ids, view.load), weights + extra, horizon


def plan_in_queue(prompt_len: int, cost, cfg: PlanConfig, prefix_len: int = 0, view: QueueView | None = None,
                  alone: ChunkPlan | None = None) -> ChunkPlan:
    """The chunks for this prompt that minimise the mean completion of the prompts in `view` (this one, those
    behind it and, with a load estimate, the prompts expected to arrive: `_with_expected`), given the chunks
    in flight. `alone` is the single-prompt plan (the caller's planner;
    equal-time when None); with nothing in view it is returned unchanged."""
    R = _check(prompt_len, prefix_len, cfg)
    if alone is None:
        alone = plan_equal_time(prompt_len, cost, cfg, prefix_len)
    if view is None or view.empty or len(alone.chunks) == 1:  # nothing in view, or nothing to choose
        return alone
    view = QueueView(view.inflight, view.waiting[:MAX_WAITING], view.ids[:MAX_WAITING], view.load)
    P, hi = cfg.pp_size, min(cfg.hi, R)
    n_seen = len(view.waiting)
    view, weights, horizon = _with_expected(view, list(alone.chunks), prefix_len, cost, cfg)
    if not view.inflight and not view.waiting:  # a load that expects nobody within the horizon
        return alone
    pace = lambda L, x: np.asarray(_times(cost, L, x), float)  # noqa: E731  the slowest stage
    t_lo = float(min(alone.pred_ms)) if alone.pred_ms else float(pace(prefix_len, cfg.lo))
    t_hi = float(pace(prefix_len + R - hi, hi))
    targets = detmath.geomspace(max(t_lo, 1e-9), max(t_hi, t_lo * 1.0001, 1e-9), N_GRID)
    own = EqualCounts(cost, prefix_len, R, cfg, targets)
    # this prompt: the single-prompt plan, fixed chunks, and equal-time cuts into fewer chunks than it (a busy
    # pipe wants bigger chunks), counts from the fewest possible up, geometrically spaced
    counts = np.unique(detmath.geomspace(own.k_min, max(own.k_min, len(alone.chunks)), N_COUNTS).round().astype(int))
    mine = [list(alone.chunks)] + [fixed_split(R, c) for c in fixed_candidates(cfg, R)
                                   if -(-R // c) <= len(alone.chunks)]  # never more chunks than alone
    mine += [ch for ch in (own.at_count(int(K)) for K in counts) if ch is not None]
    mine = list({tuple(ch): list(ch) for ch in mine}.values())  # unique, the single-prompt plan first
    # each prompt behind is cut into equal-time chunks at this candidate's pacing time (its running max)
    pacing = [float(np.max(pace(prefix_len + np.concatenate([[0], np.cumsum(ch)[:-1]]), np.asarray(ch))))
              for ch in mine]
    uniq = list(dict.fromkeys(view.waiting))
    grid = detmath.geomspace(targets[0], max(targets[-1], max(pacing)), N_BEHIND)
    tables = dict(zip(uniq, Behind(cost, cfg, uniq, grid).at(np.array(pacing)))) if uniq else {}
    done = _through(_states(mine, prefix_len, view, cost, P), [tables[w] for w in view.waiting])
    total = np.zeros(done.shape[0])
    for j, w in enumerate(weights):  # column by column: a fixed order of additions
        total = total + done[:, j] * w
    best = int(np.argmin(total))  # ties: the earliest, the single-prompt plan first
    plan = make_plan(mine[best], prompt_len, prefix_len, cost, cfg, "plan:queue")
    n_view = sum(weights)
    n_expected = len(weights) - 1 - n_seen
    meta = {"inflight": len(view.inflight), "waiting": n_seen,
            "mean_completion_ms": round(float(total[best]) / n_view, 3),
            "alone_mean_completion_ms": round(float(total[0]) / n_view, 3)}
    if view.load is not None:
        meta["load"] = {**view.load.to_dict(), "horizon_ms": round(horizon, 3),
                        "expected": round(sum(weights[1 + n_seen:]), 3), "expected_prompts": n_expected}
    return ChunkPlan(**{**plan.__dict__, "meta": {**plan.meta, "queue": meta}})


def counted_behind(plan: ChunkPlan) -> int:
    """How many prompts behind a queue-aware plan counted: those it saw waiting and those its load expected
    (0 for a plan made alone)."""
    q = (plan.meta or {}).get("queue") or {}
    return int(q.get("waiting", 0)) + int((q.get("load") or {}).get("expected_prompts", 0))


def needs_replan(planned: tuple, now: tuple, counted: int) -> bool:
    """Whether a change of the waiting queue calls for a new plan of the running prompt. `planned`: the queue's
    key when the plan was made; `now`: its key at this chunk boundary; `counted`: how many prompts behind the
    plan counted (`counted_behind`). An arrival does, unless the plan's load estimate already expected it:
    every prompt seen behind since the plan was made is within the count. A departure or a re-sort changes
    no prompt the plan did not count, so it does not (with no load, `counted` is the visible queue and every
    arrival replans). A key listed twice when planned counts once (its duplicate is no room for an arrival)."""
    seen = set(planned)
    if all(k in seen for k in now):
        return False
    return len(seen | set(now)) > counted - (len(planned) - len(seen))


def mean_completion(chunks, prompt_len: int, prefix_len: int, view: QueueView, behind: list[list], cost,
                    cfg: PlanConfig) -> float:
    """The mean completion (ms from the first chunk in flight) of this prompt and the prompts behind it, each
    cut as given: the objective `plan_in_queue` minimises, for one candidate."""
    _check(prompt_len, prefix_len, cfg)
    if len(behind) != len(view.waiting):
        raise ValueError(f"{len(behind)} chunk lists for {len(view.waiting)} waiting prompts")
    done = completions([(list(chunks), [list(b) for b in behind])], prefix_len, view, cost, cfg.pp_size)
    return float(done.mean()) if math.isfinite(float(done.sum())) else math.inf


__all__ = ["QueueView", "plan_in_queue", "completions", "mean_completion", "counted_behind", "needs_replan",
           "MAX_WAITING"]
