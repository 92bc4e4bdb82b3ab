"""The equal-time planner's search: for a target chunk time T, the chunk that takes T at each prefix (the
cost model's rows solved for x, regime by regime), the continuous chunk count over the prompt, the targets
that give each count K, and the threshold walks; `EqualCounts` cuts a count's chunks for the queue-aware
plan. Pure arithmetic on the cost model's coefficients; equal_time.py turns it into plans."""
from __future__ import annotations

import math

import numpy as np

from . import detmath
from .costmodel import _rows_at
from .objective import PlanConfig, _times, _ttft, _ttfts
from .regimes import RegimeRows, XRegimeRows, largest_x, is_piecewise, regime_rows

_REGIMES = (RegimeRows, XRegimeRows)  # a piecewise model's rows: searched regime by regime


def _pacing_rows(cost, L0: int, R: int, hi: int) -> list[tuple]:
    """The polynomial rows that can pace this prompt: the slowest row at some point of a grid over the
    prefixes [L0, L0 + R] and chunk sizes [1, hi]. A pipeline runs at its slowest stage's pace, and of
    64 stages that all differ a handful are ever the slowest on one prompt's range; searching on those
    instead of all of them is what keeps a PP64 plan in milliseconds. Between grid points another row
    may be slower by a hair, so the final choice and the plan's predicted times use every stage."""
    stages = getattr(cost, "rows", None) or (cost,)  # roofline stages: their compute and memory rows
    rows = list(dict.fromkeys((m.c0, m.g, m.b, m.d, m.e, m.f) for m in stages))
    if len(rows) == 1:
        return rows
    L, x = (a.ravel() for a in np.meshgrid(np.linspace(L0, L0 + R, 33), detmath.geomspace(1.0, max(hi, 1), 33)))
    t = _rows_at(np.array(rows), L, x)  # element-wise in a fixed order: no BLAS (issue 56)
    return [rows[i] for i in sorted(set(t.argmax(axis=0).tolist()))]


def _as_coefs(rows: list[tuple]):
    return np.array(rows) if len(rows) > 32 else rows  # very many stages: one numpy root per call


def _x_of(coefs, L: float, T: float) -> float:
    """Largest x with t(L, x) <= T on every stage (inlined closed-form root: this is the hot loop)."""
    if isinstance(coefs, XRegimeRows):  # piecewise in x: the largest chunk over the chunk-size regimes
        return largest_x([_x_of(p, L, T) for p in coefs.parts], coefs.bounds)
    if isinstance(coefs, RegimeRows):  # piecewise in L: the rows of the regime this chunk starts in
        coefs = coefs.at(L)
    if isinstance(coefs, np.ndarray):
        c0, g, b, d, e, f = coefs.T
        qc = c0 + g * L + d * L * L - T
        if (qc >= 0).any():
            return 0.0
        qb = b + e * L
        return float(np.min((-2.0 * qc) / (qb + np.sqrt(qb * qb - 4.0 * f * qc))))
    best = math.inf
    for c0, g, b, d, e, f in coefs:
        qc = c0 + g * L + d * L * L - T
        if qc >= 0:
            return 0.0
        qb = b + e * L
        x = -qc / qb if f == 0.0 else (-2.0 * qc) / (qb + math.sqrt(qb * qb - 4.0 * f * qc))
        best = min(best, x)
    return best


class _RegimeCols(tuple):
    """`_cols` of a piecewise pipeline: (bounds, columns per interval)."""


class _XCols(tuple):
    """`_cols` of a pipeline piecewise in x: (bounds, `_cols` per chunk-size interval)."""


def _cols(coefs, nd: int):
    """Coefficient columns shaped (rows, 1 x nd) to broadcast against L and T; per prefix interval when
    the model is piecewise in L, per chunk-size interval when it is piecewise in x."""
    if isinstance(coefs, XRegimeRows):
        return _XCols((coefs.bounds, [_cols(p, nd) for p in coefs.parts]))
    if isinstance(coefs, RegimeRows):
        return _RegimeCols((coefs.bounds, [_cols(t, nd) for t in coefs.table]))
    return tuple(col.reshape((-1,) + (1,) * nd) for col in np.array(coefs, float).reshape(-1, 6).T)


def _roots(cols, L, T):
    """Largest x with t(L, x) <= T for each row (coefficient columns `cols`, broadcast against L and T);
    0 where even x = 0 exceeds T. The vectorised form of `_x_of`, for the grid searches; piecewise in x,
    one row: the largest chunk over the chunk-size regimes, every stage within T."""
    if isinstance(cols, _XCols):
        bounds, per = cols
        return largest_x([_roots(c, L, T).min(axis=0) for c in per], bounds)[None]
    if isinstance(cols, _RegimeCols):  # each prefix in its own regime
        bounds, per = cols
        r = [_roots(c, L, T) for c in per]
        out = r[0]
        for b, rb in zip(bounds, r[1:]):
            out = np.where(np.asarray(L) >= b, rb, out)
        return out
    c0, g, b, d, e, f = cols
    qc = c0 + g * L + d * L * L - T
    qb = b + e * L
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(qc >= 0, 0.0, (-2.0 * qc) / (qb + np.sqrt(np.maximum(qb * qb - 4.0 * f * qc, 0.0))))


def _n_cont(coefs, L0: int, R: int, T: float, lo: int, hi: int, cap: int = 1 << 62) -> float:
    """Fractional number of equal-time chunks (each clamped to [lo, hi]) that cover R tokens.

    Stops early past `cap` chunks: callers only need to know the count exceeds it."""
    L, end, k = float(L0), float(L0 + R), 0
    while k <= cap:
        x = min(max(_x_of(coefs, L, T), lo), hi)
        if L + x >= end:
            return k + (end - L) / x
        L += x
        k += 1
    return float(k + 1)


def _estimate(cost, rows: list[tuple], L0: int, R: int, cfg: PlanConfig, o: float = 0.0):
    """Continuous optimum (n, T) of sum(t) + (P-1) max(t) + n o over equal-time targets T, with the
    grid L, the chunk size x(L, T) at that T, and the stages (indices into `rows`) that bind anywhere
    on the grid: the exact per-chunk search needs only those.

    n(T) = integral dL / x(L, T) and sum(t) = integral t(L, x) / x dL (x clamped to [lo, hi], so a
    clamped chunk is charged its real time). Vectorised over a grid of T and L: a few numpy calls
    whatever the prompt length."""
    lo, hi, P = cfg.lo, cfg.hi, cfg.pp_size
    L = np.linspace(L0, L0 + R, 129)
    t_min = float(np.min(_times(cost, L0, lo, 0.0)))
    t_max = float(np.max(_times(cost, L0 + R, R, 0.0)))  # R, not hi: the same grid under every ceiling
    trap = getattr(np, "trapezoid", None) or np.trapz

    cols = _cols(rows, 2)  # (stages, 1, 1) each

    def on(T):  # J, n, x and the binding stage over the (T, L) grid, every stage at once
        r = _roots(cols, L, T[None])
        arg = np.argmin(r, axis=0)  # the first stage with the smallest chunk binds
        x = np.clip(r.min(axis=0), lo, hi)
        tt = _times(cost, L[None, :], x, 0.0)
        n = np.maximum(trap(1.0 / x, L, axis=1), 1.0)
        return trap(tt / x, L, axis=1) + (P - 1) * tt.max(axis=1) + n * o, n, x, arg

    # coarse over the whole range of T, then fine around its best point
    T = detmath.geomspace(max(t_min, 1e-9), max(t_max, t_min * 1.0001, 1e-9), 32)[:, None]
    i = int(np.argmin(on(T)[0]))
    T = detmath.geomspace(T[max(i - 1, 0), 0], T[min(i + 1, len(T) - 1), 0], 32)[:, None]
    J, n, x, arg = on(T)
    i = int(np.argmin(J))

    def x_for(Ks: list[int]) -> np.ndarray:  # x(L, T_K) on the grid per K, T_K where the continuous count is K
        if not hasattr(x_for, "ln"):
            Ts = detmath.geomspace(max(t_min, 1e-9), max(t_max, t_min * 1.0001, 1e-9), 256)
            x_for.ln, x_for.lt = detmath.log(on(Ts[:, None])[1])[::-1], detmath.log(Ts)[::-1]  # n falls as T grows
        TK = [float(detmath.exp(np.interp(math.log(K), x_for.ln, x_for.lt))) for K in Ks]
        return on(np.array(TK)[:, None])[2]  # row by row: the same values as one K at a time

    binding = () if isinstance(rows, _REGIMES) else sorted(set(np.unique(arg).tolist()))
    return float(n[i]), float(T[i, 0]), L, x[i], binding, (t_min, t_max), x_for


def _equal_count_chunks(Lg: np.ndarray, xg: np.ndarray, L0: int, R: int, K: int, cfg: PlanConfig) -> list[int] | None:
    """K chunks whose boundaries split the continuous chunk count  integral dL / x(L)  evenly: for long
    plans x(L) changes little within a chunk, so these are equal-time to the grid's accuracy, found in
    one pass (no root search over T, whose every step walks all K chunks). Aligned, no runt tail."""
    lo, hi, al = cfg.lo, cfg.hi, cfg.align
    if K * hi < R or (K - 1) * lo >= R:
        return None
    inv = 1.0 / xg
    c = np.concatenate([[0.0], np.cumsum((inv[1:] + inv[:-1]) * 0.5 * np.diff(Lg))])
    pos = np.interp(np.arange(1, K) * (c[-1] / K), c, Lg) - L0
    # fast path (one numpy pass): the rounded boundaries, clipped to where the rest still fits in the
    # chunks left (a tight count forces them), already keep every chunk in [lo, hi]
    g_lo, g_hi = _bounds(R, np.arange(K - 1, 0, -1), lo, hi, al)
    bs = np.clip(np.rint(pos / al).astype(np.int64) * al, g_lo, g_hi)
    ch = np.diff(np.concatenate([[0], bs, [R]]))
    if ((ch[:-1] >= lo) & (ch[:-1] <= hi)).all() and 1 <= ch[-1] <= hi:
        return ch.tolist()
    chunks, L = [], 0
    for p, gl, gh in zip(bs.tolist(), g_lo.tolist(), g_hi.tolist()):  # `_boundary`, its bounds computed at once
        b = _clamp(p, L, lo, hi, gl, gh)
        if b is None:
            return None
        chunks.append(b - L)
        L = b
    return chunks + [R - L] if 1 <= R - L <= hi else None


def _boundary(b: int, L: int, left: int, R: int, lo: int, hi: int, al: int) -> int | None:
    """The aligned boundary nearest `b` after a chunk starting at L, clamped to where this chunk stays in
    [lo, hi] and the rest R - b fits in `left` more chunks (non-final ones in [lo, hi], the last in
    [1, hi]). Those bounds always hold an aligned point when the chunk count is feasible, so a long plan
    never falls back to the per-K root search (None only when no boundary can work)."""
    return _clamp(b, L, lo, hi, *_bounds(R, left, lo, hi, al))


def _bounds(R: int, left, lo: int, hi: int, al: int):
    """The aligned (lowest, highest) boundary after which the rest R - b still fits in `left` more chunks;
    `left` may be a numpy array (every boundary of a plan at once)."""
    return -(-(R - left * hi) // al) * al, (R - (left - 1) * lo - 1) // al * al


def _clamp(b: int, L: int, lo: int, hi: int, g_lo: int, g_hi: int) -> int | None:
    """`b` clamped to where the chunk from L stays in [lo, hi] and the rest within (g_lo, g_hi); None when
    nothing is left between them. The one clamp of both boundary paths."""
    low, high = max(L + lo, g_lo), min(L + hi, g_hi)
    return None if low > high else min(max(b, low), high)


def _targets(coefs, L0: int, R: int, lo: int, hi: int, Ks, t_lo: float, t_hi: float) -> dict[int, tuple]:
    """The equal-time target T of every chunk count in Ks at once, with the local slope d log n / d log T:
    the continuous count n(T) walked for 96 targets together (one numpy pass per chunk), then log n(T)
    interpolated at each K. A short plan tries up to MAX_K_TRIED counts; a root search per count walked
    the chunks ~10 times each, this and one secant step (`_equal_time_chunks`) walk them twice."""
    T = detmath.geomspace(max(t_lo, 1e-12), max(t_hi, t_lo * 1.0001, 1e-12), 96)
    cols = _cols(coefs, 1)
    L, end, n, live = np.full(T.shape, float(L0)), float(L0 + R), np.full(T.shape, np.inf), np.ones(T.shape, bool)
    cap = max(Ks) + 1
    with np.errstate(divide="ignore", invalid="ignore"):
        for k in range(cap + 1):
            x = np.clip(_roots(cols, L, T).min(axis=0), lo, hi)
            done = live & (L + x >= end)
            n[done] = k + (end - L[done]) / x[done]
            live &= ~done
            if not live.any():
                break
            L = L + x
    ok = np.isfinite(n)
    if ok.sum() < 2:
        return {}
    ln, lt = detmath.log(n[ok])[::-1], detmath.log(T[ok])[::-1]  # n falls as T grows: reversed, log n increases
    out = {}
    for K in Ks:
        if ln[0] <= math.log(K) <= ln[-1]:
            i = min(int(np.searchsorted(ln, math.log(K))), len(ln) - 1)
            slope = (ln[i] - ln[i - 1]) / (lt[i] - lt[i - 1]) if i else 0.0  # d log n / d log T, <= 0
            out[K] = (float(detmath.exp(np.interp(math.log(K), ln, lt))), float(slope))
    return out


def _threshold_walks(cost, coefs, L0: int, R: int, cfg: PlanConfig, T_hi: float, k_cap: int,
                     n: int = 64, span: tuple = (0.7, 1.0), o: float = 0.0) -> list[tuple[float, list[int]]]:
    """The exact DP's own shape, for thresholds just under T_hi: for each of `n` targets M, the greedy
    walk of the largest aligned chunks whose time stays <= M (`walks`), scored on sum + (P-1) max.
    Equal-time boundaries rounded to the nearest aligned point can put one chunk a unit above the target,
    which the (P-1) max term then multiplies; rounding down under a threshold never does."""
    walked = [ch for ch in walks(coefs, L0, R, cfg, T_hi * np.linspace(*span, n), k_cap) if ch is not None]
    return list(zip(_ttfts(walked, L0, cost, cfg.pp_size, o), walked))


def walks(coefs, L0: int, R: int, cfg: PlanConfig, M, k_cap: int) -> list[list[int] | None]:
    """For each target time in `M`, the greedy walk over R tokens after a prefix L0 of the largest aligned
    chunks (within [lo, hi]) whose time stays <= the target on every row of `coefs`, the last chunk taking
    the rest; None for a walk not done within `k_cap` chunks. One numpy pass per chunk for all targets."""
    lo, hi, al = cfg.lo, cfg.hi, cfg.align
    M = np.asarray(M, float)
    n = M.size
    cols = _cols(coefs, 1)
    L, live = np.full(n, float(L0)), np.ones(n, bool)
    chunks = np.zeros((k_cap, n), np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        for k in range(k_cap):
            x = np.floor(_roots(cols, L, M).min(axis=0) / al) * al
            x = np.where(live, np.minimum(np.clip(x, lo, hi), L0 + R - L), 0)
            chunks[k] = x
            L += x
            live &= L < L0 + R
            if not live.any():
                break
    chunks = chunks.T
    return [None if live[j] else chunks[j][chunks[j] > 0].tolist() for j in range(n)]


class EqualCounts:
    """Equal-time cuts of R tokens after a prefix L0 for a grid of target times, without walking chunk by
    chunk: x(L, T) (the largest chunk within T on every row) on a grid of prefixes for every target in one
    numpy call, the continuous chunk count n(T) = integral dL / x, and for a count K the boundaries that
    split that integral evenly (`_equal_count_chunks`). A few numpy calls whatever the plan's length."""

    def __init__(self, cost, L0: int, R: int, cfg: PlanConfig, targets):
        self.L0, self.R, self.cfg = L0, R, cfg
        self.targets = np.asarray(targets, float)
        self.Lg = np.linspace(L0, L0 + R, 129)
        r = _roots(_cols(search_rows(cost, L0, R), 2), self.Lg, self.targets[None, :, None])
        self.x = np.clip(r.min(axis=0), cfg.lo, cfg.hi)  # (targets, grid)
        trap = getattr(np, "trapezoid", None) or np.trapz
        self.counts = np.maximum(trap(1.0 / self.x, self.Lg, axis=1), 1.0)  # falls as the target grows
        self.k_min = max(1, -(-R // cfg.hi))
        self._cuts: dict[tuple[int, int], list[int] | None] = {}  # (grid target, count) -> its cut: pacings repeat

    def at_count(self, K: int) -> list[int] | None:
        """K chunks of equal time, on the profile of the target whose continuous count is nearest K."""
        i = int(np.argmin(np.abs(self.counts - K)))
        return self.cut(i, K)

    def at_target(self, T: float) -> list[int] | None:
        """The fewest equal-time chunks whose times stay near T (the grid target at or just above it)."""
        i = min(int(np.searchsorted(self.targets, T)), len(self.targets) - 1)
        return self.cut(i, max(self.k_min, int(math.ceil(self.counts[i] - 1e-9))))

    def cut(self, i: int, K: int) -> list[int] | None:
        if K <= 1:
            return [self.R] if self.R <= self.cfg.hi else None
        if (i, K) not in self._cuts:
            self._cuts[i, K] = _equal_count_chunks(self.Lg, self.x[i], self.L0, self.R, K, self.cfg)
        got = self._cuts[i, K]
        return None if got is None else list(got)


def search_rows(cost, L0: int, R: int):
    """The rows a plan over [L0, L0 + R] is searched on: every stage's rows per regime for a piecewise model,
    else the stages that can pace this prompt (`_pacing_rows`), in the form `walks` and `_x_of` take."""
    if is_piecewise(cost):
        return regime_rows(cost)
    return _as_coefs(_pacing_rows(cost, L0, R, R))
