"""The equal-time planner: chunks of (nearly) equal predicted time over the whole prompt, then an exact
boundary refinement; bounded planning time (it runs inside every stage's scheduler loop).

Short plans (<= 48 chunks) search K and solve each K's equal-time target exactly; long plans split the
continuous chunk count evenly in one pass. Every stage derives the same plan from the same inputs.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from scipy.optimize import brentq  # imported with the module: never a first-plan stall in the scheduler

from .costmodel import CostModel, PipelineCost, split_uniform_overhead
from .equal_time_search import (_REGIMES, EqualCounts, _as_coefs, _boundary, _equal_count_chunks, _estimate,
                                _n_cont, _pacing_rows, _targets, _threshold_walks, _x_of, search_rows, walks)
from .objective import PlanConfig, _check, _times, _ttft, _ttfts, fixed_candidates, fixed_split, make_plan, makespan
from .plan import ChunkPlan
from .regimes import XRegimeRows, is_piecewise, regime_rows


def _equal_time_chunks(cost, coefs, L0: int, R: int, K: int, cfg: PlanConfig,
                       target: tuple | None = None, guess: float | None = None) -> list[int] | None:
    """K chunks of (nearly) equal predicted time covering R tokens, boundaries aligned, no runt tail.
    The target T comes from `_targets` (interpolated, then one secant step) or a root search near `guess`."""
    lo, hi, al = cfg.lo, cfg.hi, cfg.align
    if K * hi < R or (K - 1) * lo >= R:
        return None
    if K == 1:
        return [R]
    T = None
    if K * lo >= R:  # even all-minimum chunks give no more than K, so every chunk sits at the floor
        T = 1e-12
    elif target is not None:
        T, slope = target
        miss = math.log(_n_cont(coefs, L0, R, T, lo, hi, 4 * K)) - math.log(K)
        if slope < 0 and abs(miss) > 1e-4:
            T *= math.exp(-miss / slope)
    if T is None:
        t_max = float(np.max(_times(cost, L0 + R, hi, 0.0))) + 1e-9
        fn = lambda T: _n_cont(coefs, L0, R, T, lo, hi, K + 1) - K  # noqa: E731  (decreasing in T)
        if fn(t_max) > 0:
            return None
        # bracket the root near the guess (few evaluations), widening geometrically
        t_hi = min(t_max, guess * 1.25) if guess else t_max
        while fn(t_hi) > 0:
            t_hi = min(t_max, t_hi * 2.0)
        t_lo = t_hi * 0.8 if guess else t_hi
        while fn(t_lo) <= 0 and t_lo > 1e-12:
            t_lo *= 0.5 if guess else 0.25
        T = t_hi if fn(t_lo) <= 0 else brentq(fn, t_lo, t_hi, rtol=1e-5, xtol=1e-12)
    chunks, L = [], 0
    for k in range(K - 1):  # continuous boundary for T, rounded to the aligned grid (relative to L0)
        x = min(max(_x_of(coefs, L0 + L, T), lo), hi)
        b = _boundary(int(round((L + x) / al)) * al, L, K - 1 - k, R, lo, hi, al)
        if b is None:
            return None
        chunks.append(b - L)
        L = b
    return chunks + [R - L] if 1 <= R - L <= hi else None


def plan_equal_time(prompt_len: int, cost, cfg: PlanConfig, prefix_len: int = 0) -> ChunkPlan:
    R = _check(prompt_len, prefix_len, cfg)
    P = cfg.pp_size
    staged = cost  # every stage, each with its per-chunk overhead: the final choice and the predicted times
    # the search: on the forward models, and apart the per-chunk overhead every stage pays alike (the targets,
    # the thresholds and the continuous count are in forward time); an overhead that differs by stage or grows
    # with the chunk stays in the rows
    cost, o = split_uniform_overhead(cost)
    if R <= cfg.lo:  # no room for a second chunk: a non-final chunk needs >= lo tokens
        return make_plan([R], prompt_len, prefix_len, staged, cfg, "plan:equal-time")
    if cfg.hi > R:  # no chunk can exceed the prompt: a higher memory ceiling must not change the search
        cfg = replace(cfg, max_chunk=-(-R // cfg.align) * cfg.align)
    if is_piecewise(cost):  # every stage's rows per regime: the pacing stage may change at a switch
        rows = regime_rows(cost)
    else:
        rows = _pacing_rows(cost, prefix_len, R, R)
        if len(rows) < len(getattr(cost, "rows", ())):  # search on the stages that can pace
            cost = PipelineCost(tuple(CostModel(*r) for r in rows)) if len(rows) > 1 else CostModel(*rows[0])
    k_min = max(1, -(-R // cfg.hi))
    if k_min > MAX_PLAN_CHUNKS:
        raise ValueError(f"{R} tokens need at least {k_min} chunks of at most {cfg.hi} tokens (--max-chunk "
                         f"{cfg.max_chunk}, --align {cfg.align}); more than {MAX_PLAN_CHUNKS} chunks is no plan "
                         "a server can run: raise --max-chunk (SGLANG_CPP_MAX_CHUNK)")
    if k_min > MAX_SEARCH_CHUNKS:  # degenerate bounds (e.g. --align 1 with a few-token max chunk)
        return make_plan(fixed_split(R, cfg.hi), prompt_len, prefix_len, staged, cfg, "plan:fixed-max")
    k_max = min(max(k_min, 1 + (R - 1) // cfg.lo), MAX_SEARCH_CHUNKS)
    seen: dict[int, tuple[float, list[int] | None]] = {}

    def try_k(K: int) -> float:
        if K not in seen:
            if not k_min <= K <= k_max:
                ch = None
            else:
                ch = _equal_time_chunks(cost, coefs, prefix_len, R, K, cfg, targets.get(K), guess=t_est * n_est / K)
            seen[K] = (math.inf if ch is None else _ttft(ch, prefix_len, cost, P, o), ch)
        return seen[K][0]

    n_est, t_est, Lg, xg, binding, t_range, x_for = _estimate(cost, rows, prefix_len, R, cfg, o)
    coefs = rows if isinstance(rows, _REGIMES) else _as_coefs([rows[i] for i in binding])
    k0 = min(k_max, max(k_min, int(round(n_est))))
    targets = {} if k0 > 48 else _targets(coefs, prefix_len, R, cfg.lo, cfg.hi,
                                          range(max(k_min, k0 - MAX_K_TRIED), k0 + MAX_K_TRIED + 1), *t_range)
    if k0 > 48:  # long plans: split the chunk count evenly (one numpy pass per count), and search the
        # count from the continuous optimum in steps that halve, each count at its own equal-time target:
        # alignment and the clamps move the discrete optimum off the continuous one (seeded test: 76
        # chunks against the exact DP's 64)
        def count_ks(ks: tuple) -> None:  # each count's cut and TTFT, the counts not seen priced together
            new = [k for k in dict.fromkeys(ks) if k not in seen and k_min <= k <= k_max]
            others = [k for k in new if k != k0]
            xs = dict(zip(others, x_for(others))) if others else {}
            cut = {k: _equal_count_chunks(Lg, xg if k == k0 else xs[k], prefix_len, R, k, cfg) for k in new}
            ok = [k for k in new if cut[k] is not None]
            js = dict(zip(ok, _ttfts([cut[k] for k in ok], prefix_len, cost, P, o)))
            for k in ks:
                seen.setdefault(k, (js.get(k, math.inf), cut.get(k)))

        best_k, step = k0, max(1, k0 // 4)
        count_ks((k0,))
        while step >= 1:
            count_ks((best_k - step, best_k + step))
            nb = min((best_k - step, best_k + step), key=lambda k: seen[k][0])
            if seen[nb][0] < seen[best_k][0] * (1 - 1e-9):
                best_k = nb
            else:
                step //= 2
    for k in ((k_min, k0 - 1, k0, k0 + 1) if k0 <= 48 or seen[k0][1] is None else ()):
        try_k(k)
    # short plans: hill-climb from the best candidate while a neighbour improves by more than rounding
    # noise (near-flat objectives, e.g. PP=1 or near-zero costs, would otherwise random-walk over K),
    # and within MAX_K_TRIED chunk counts: bounded planning time
    while k0 <= 48 and len(seen) < MAX_K_TRIED:
        k = min(seen, key=lambda q: seen[q][0])
        improved = False
        for nb in (k - 1, k + 1):
            if nb not in seen and try_k(nb) < seen[k][0] * (1 - 1e-9):
                improved = True
        if not improved:
            break
    cands = [(j, ch) for j, ch in seen.values() if ch is not None]
    j0, ch0 = min(cands, key=lambda c: c[0], default=(math.inf, None))
    if j0 < math.inf and len(ch0) <= WALK_MAX_CHUNKS:  # thresholds under the best plan's slowest chunk
        t0 = _times(cost, prefix_len + np.concatenate([[0], np.cumsum(ch0)[:-1]]), ch0, 0.0)
        cands += _threshold_walks(cost, coefs, prefix_len, R, cfg, float(t0.max()), 2 * len(ch0) + 2, o=o)
        if isinstance(coefs, _REGIMES):  # a switch makes TTFT(K) bumpy: the best count may lie far off
            cands += _threshold_walks(cost, coefs, prefix_len, R, cfg, float(t0.max()), 2 * len(ch0) + 2,
                                      n=128, span=(0.5, 2.0), o=o)
        if isinstance(coefs, XRegimeRows):  # a chunk-size switch can put the best plan on the far side of it
            t_hi = float(np.max(_times(cost, prefix_len + R - min(cfg.hi, R), min(cfg.hi, R), 0.0)))
            cands += _threshold_walks(cost, coefs, prefix_len, R, cfg, t_hi, 2 * len(ch0) + 2, n=128, o=o,
                                      span=(float(t0.max()) / t_hi, 1.0))
    sizes = fixed_candidates(cfg, R)
    fixed = [fixed_split(R, c) for c in sizes]
    fixed = sorted(zip(_ttfts(fixed, prefix_len, cost, P, o), fixed))
    cands += fixed  # a grid from the bounds alone: never predicted worse than fixed chunks of the grid
    for c in sizes:  # and the same chunks with the short one first, where its prefix is
        K = -(-R // c)                  # shortest (a prefix-squared cost re-pays every prefix)
        first = -(-(R - (K - 1) * c) // cfg.align) * cfg.align
        if K >= 2 and cfg.lo <= first < c:
            ch = [first] + [c] * (K - 2) + [R - first - (K - 2) * c]
            cands.append((_ttft(ch, prefix_len, cost, P, o), ch))
    # refine the few best starting points with the exact objective (short plans only)
    top = sorted({tuple(ch): j for j, ch in cands}.items(), key=lambda kv: kv[1])[:REFINE_STARTS]
    budget = REFINE_MAX_MOVES  # shared by the starting points, best first: bounded planning time
    for ch, j in top:
        if len(ch) <= REFINE_MAX_CHUNKS and budget > 0:
            jr, chr_, used = _refine(list(ch), j, prefix_len, R, cost, cfg, budget, o)
            cands.append((jr, chr_))
            budget -= used
    # the final choice on the exact makespan when the stages differ: the objective above charges every
    # stage the slowest one's time, which can rank a plan ahead of a fixed chunk it loses to
    top = sorted({tuple(ch): j for j, ch in cands}.items(), key=lambda kv: kv[1])[:FINAL_CANDIDATES]
    fixed = [tuple(fx) for j, fx in fixed[:FINAL_CANDIDATES - 1]]  # the best fixed ones, re-ranked likewise
    best = min(dict(top + [(f, 0.0) for f in fixed]), key=lambda ch: makespan(ch, prefix_len, staged, P))
    return make_plan(list(best), prompt_len, prefix_len, staged, cfg, "plan:equal-time")


REFINE_MAX_CHUNKS = 256
# The threshold walks step chunk by chunk (a numpy pass per chunk), so their cost grows with the plan; past
# this many chunks the (P-1) max term they polish is under 1/40 of the makespan and they gained at most
# 0.06% on the analytic presets and the measured check-llama stage (32K-512K, PP4/PP8, 0-20 ms per chunk)
WALK_MAX_CHUNKS = 128
FINAL_CANDIDATES = 3  # best plans by the objective, re-ranked (with the fixed chunks) by the exact makespan
MAX_K_TRIED = 16  # chunk counts a short plan's hill-climb may evaluate (each is a root search over T)
REFINE_STARTS = 3
REFINE_MAX_MOVES = 64  # boundary moves, all starting points together
# Above this many chunks the planner takes max-size chunks (or searches no further): the pipeline-fill
# term (P-1)*max(t) is then a small share of sum(t), and the search would cost more than it can save.
MAX_SEARCH_CHUNKS = 4096
MAX_PLAN_CHUNKS = 32768  # 2M tokens in 64-token chunks (a server aligns to >= 64): more is a clear error, not 60 ms
REFINE_MIN_STEP = 64  # tokens: finer boundary moves (align < 64) gain nothing measurable


def _refine(chunks: list[int], j: float, L0: int, R: int, cost, cfg: PlanConfig,
            max_moves: int, o: float = 0.0) -> tuple[float, list[int], int]:
    """Coordinate descent on the aligned boundaries, on the exact sum + (P-1)*max, step halving.

    Equal time is near optimal when a chunk's cost does not depend on how its prefix was cut (the FA
    form). With a prefix-squared term (torch_native recomputes attention over the whole prefix) every
    extra boundary re-pays the prefix, so the optimum is uneven (measured on SmolLM2: equal-time 7%
    above the exact DP at 6K tokens). Takes the best move or drop of one boundary while TTFT falls.
    A move changes only the two chunks beside the boundary, so every candidate is scored at once from
    the current chunk times (prefix/suffix maxima): O(K) numpy per step, not O(K^2) Python."""
    al, lo, hi, P = cfg.align, cfg.lo, cfg.hi, cfg.pp_size
    edges = np.concatenate([[0], np.cumsum(chunks)]).astype(np.int64)
    best_j = j
    step = al * max(1, 2 ** int(math.log2(max(max(chunks) // (2 * al), 1))))
    min_step, moves = min(max(al, REFINE_MIN_STEP), step), 0
    t = _times(cost, L0 + edges[:-1], np.diff(edges), o)  # chunk times, updated move by move
    while step >= min_step and len(edges) > 2:
        while len(edges) > 2 and moves < max_moves:
            moves += 1
            K, S = len(t), float(t.sum())
            pre, suf = np.maximum.accumulate(t), np.maximum.accumulate(t[::-1])[::-1]
            # max time over the chunks other than k and k+1, for every boundary k
            rest = np.maximum(np.concatenate([[-np.inf], pre[:K - 2]]), np.concatenate([suf[2:], [-np.inf]]))
            a, mid, c = edges[:-2], edges[1:-1], edges[2:]
            # one cost call for every candidate; rows: the left chunk after a move right, a move left and a
            # drop of the boundary, then the right chunk after a move right and a move left
            xs = np.concatenate([mid + step - a, mid - step - a, c - a, c - mid - step, c - mid + step]).reshape(5, -1)
            tt = _times(cost, L0 + np.concatenate([a, a, a, mid + step, mid - step]).reshape(5, -1), xs, o)
            right_min = np.full(K - 1, lo)
            right_min[-1] = 1  # the right-hand chunk of the last boundary is the final chunk
            ok = (xs[:3] >= lo) & (xs[:3] <= hi)
            ok[:2] &= (xs[3:] <= hi) & (xs[3:] >= right_min)
            ok[2] = xs[2] <= hi
            tl, tr = tt[:3], np.concatenate([tt[3:], np.zeros((1, K - 1))])
            J = np.where(ok, (S - t[:-1] - t[1:]) + tl + tr + (P - 1) * np.maximum(rest, np.maximum(tl, tr)), np.inf)
            m, k = divmod(int(np.argmin(J)), K - 1)
            best_move, best_val = None, best_j * (1 - 1e-9)
            if J[m, k] < best_val:
                best_move, best_val = (k, (step, -step, None)[m]), float(J[m, k])
            if best_move is None:
                break
            k, s = best_move
            if s is None:
                edges, t = np.delete(edges, k + 1), np.delete(t, k + 1)
                t[k] = tl[2, k]
            else:  # line search: keep moving this boundary the same way while TTFT falls (one numpy call)
                a0, c0_, nb = int(edges[k]), int(edges[k + 2]), int(edges[k + 1]) + s
                right_min = 1 if k == K - 2 else lo
                steps = max(0, min(hi, c0_ - a0) // abs(s) + 1)
                q = nb + s * np.arange(1, steps + 1)
                nl, nr = q - a0, c0_ - q
                q = q[(nl >= lo) & (nl <= hi) & (nr >= right_min) & (nr <= hi)]
                t_nb = (tl[m, k], tr[m, k])
                if q.size:
                    tq = _times(cost, L0 + np.stack([np.full_like(q, a0), q]), np.stack([q - a0, c0_ - q]), o)
                    jq = S - t[k] - t[k + 1] + tq[0] + tq[1] + (P - 1) * np.maximum(rest[k], tq.max(axis=0))
                    prev = np.concatenate([[best_val], jq[:-1]])
                    stop = np.flatnonzero(~(jq < prev * (1 - 1e-12)))
                    n_ok = int(stop[0]) if stop.size else q.size  # positions improving one after another
                    if n_ok:
                        nb, best_val = int(q[n_ok - 1]), float(jq[n_ok - 1])
                        t_nb = (tq[0, n_ok - 1], tq[1, n_ok - 1])
                edges, t = edges.copy(), t.copy()
                edges[k + 1] = nb
                t[k], t[k + 1] = t_nb
            best_j = best_val
        step //= 2
    out = [int(x) for x in np.diff(edges)]
    return _ttft(out, L0, cost, P, o), out, moves


__all__ = ["plan_equal_time", "walks", "search_rows", "EqualCounts", "MAX_PLAN_CHUNKS", "MAX_SEARCH_CHUNKS"]
