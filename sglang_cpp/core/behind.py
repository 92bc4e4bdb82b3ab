"""The prompts waiting behind the one being planned, as the queue-aware objective (queue_plan.py) models them.

Why a model and not cuts: those prompts are planned when their turn comes; here they only weigh how this
prompt's chunks delay them. Each is cut into equal-time chunks at a candidate's pacing time, and on every
stage at the pipeline's pace (the slowest stage's time), whose flow-shop state has a closed form: exact for
equal stages, an upper bound for stages that differ. Tabled once per decision for all of them as a fluid
(counts and totals from integrals over the prefix), a candidate costs O(P) per prompt behind whatever its
chunk count (a short prompt's pacing can cut a 1M prompt behind into thousands; cutting and pricing them
took most of a 16-deep decision, issue 56). Pure numpy, element-wise in a fixed order.
"""
from __future__ import annotations

import numpy as np

from . import detmath
from .equal_time_search import _cols, _roots, search_rows
from .objective import PlanConfig, chunk_rows

N_PREFIXES = 257  # prefixes on which the prompts behind are integrated, over all their ranges at once


def paced_totals(chunks: list[list], starts: list[int], cost) -> tuple[np.ndarray, np.ndarray]:
    """Each chunk list's total S and largest chunk M, every chunk priced at the pipeline's pace (the slowest
    stage's time, `cost.time`, its overhead included): what the closed form of `advance_paced` needs. Sums
    by cumsum along each zero-padded row: a fixed order of additions, the same on every stage."""
    lens, flat, row, col, L = chunk_rows(chunks, starts)
    t = np.zeros((len(chunks), int(lens.max())))
    t[row, col] = np.asarray(cost.time(L.astype(float), flat.astype(float)), float)
    return np.cumsum(t, axis=1)[:, -1], t.max(axis=1)


def advance_paced(G: np.ndarray, S: np.ndarray, M: np.ndarray) -> np.ndarray:
    """The flow-shop state after a chunk list on P stages that all take the chunk's paced time, from state
    G (candidates, P): G'[s] = S + max_{s' <= s} (G[s'] + (s - s') M), the longest path through the grid
    (every column once, its largest entry once per stage it descends). Exact for equal stages and an upper
    bound for stages that differ (each priced as the slowest): O(P) per candidate instead of O(P K)."""
    s = np.arange(G.shape[-1], dtype=float) * M[:, None]
    return np.maximum.accumulate(G - s, axis=-1) + s + S[:, None]


class Behind:
    """The prompts waiting behind, each cut into the fewest equal-time chunks near a pacing time T (the
    candidate's running max: chunks up to it add no drain), as a fluid on one grid of prefixes shared by them
    all: the chunk x(L, T) that takes T at prefix L (clamped to the chunk bounds) for a grid of targets, and
    along L the cumulative count integral dL / x and paced time integral t(L, x) / x dL (a token at L lies
    mid-chunk on average: its chunk starts at L - x/2). A prompt's count n(T) and total S(T) are the
    differences over its own range [prefix, length]. Its largest chunk M(T) is its last: a chunk's time at the
    target, min(T, t(L, hi)) or t(L, lo) where even the smallest chunk exceeds T, never falls as L grows.
    For a pacing T the count is K = ceil(n(T)) and (S, M) are read where n = K: K chunks of equal time,
    never cut, so a candidate costs O(1) per prompt behind whatever its count (a short prompt's pacing
    can cut a 1M prompt behind into thousands), and one root and cost evaluation serves every prompt."""

    def __init__(self, cost, cfg: PlanConfig, prompts: list[tuple[int, int]], targets: np.ndarray):
        p = np.array([q for _, q in prompts], float)
        end = np.array([n for n, _ in prompts], float)
        a, b = float(p.min()), float(end.max())
        Lg = np.linspace(a, b, N_PREFIXES)
        self.lt = detmath.log(targets)
        cols = _cols(search_rows(cost, int(a), int(b - a)), 2)
        x = np.clip(_roots(cols, Lg, np.asarray(targets, float)[None, :, None]).min(axis=0), cfg.lo, cfg.hi)
        t = np.asarray(cost.time(np.maximum(Lg - 0.5 * x, a), x), float)  # (targets, prefixes), overheads in
        half = 0.5 * np.diff(Lg)
        zero = np.zeros((len(targets), 1))
        cn = np.concatenate([zero, np.cumsum((1.0 / x[:, 1:] + 1.0 / x[:, :-1]) * half, axis=1)], axis=1)
        cs = np.concatenate([zero, np.cumsum((t[:, 1:] / x[:, 1:] + t[:, :-1] / x[:, :-1]) * half, axis=1)], axis=1)
        j = np.clip(np.searchsorted(Lg, np.concatenate([p, end]), side="right") - 1, 0, len(Lg) - 2)
        w = (np.concatenate([p, end]) - Lg[j]) / (Lg[j + 1] - Lg[j])
        at = lambda C: C[:, j] * (1.0 - w) + C[:, j + 1] * w  # noqa: E731  linear between prefixes
        k = len(prompts)
        cn_at, cs_at, x_at = at(cn), at(cs), at(x)
        self.n = np.maximum(cn_at[:, k:] - cn_at[:, :k], 1.0)  # (targets, prompts)
        self.S = cs_at[:, k:] - cs_at[:, :k]
        last = np.maximum(end - x_at[:, k:], p)  # where each prompt's last chunk starts
        self.M = np.asarray(cost.time(last, end - last), float)
        self.one = np.asarray(cost.time(p, end - p), float)  # the whole rest as one chunk
        self.k_min = np.ceil((end - p) / cfg.hi)
        self.ln = detmath.log(self.n)

    def counts(self, T: np.ndarray) -> np.ndarray:
        """Each prompt's chunk count (pacings, prompts) at each pacing time in T: ceil(n(T)), n linear in
        log-log between the grid targets, and never under the fewest chunks of at most `hi` tokens."""
        lt = detmath.log(T)
        i = np.clip(np.searchsorted(self.lt, lt), 1, len(self.lt) - 1)
        w = np.clip((lt - self.lt[i - 1]) / (self.lt[i] - self.lt[i - 1]), 0.0, 1.0)[:, None]
        n = detmath.exp(self.ln[i - 1] * (1.0 - w) + self.ln[i] * w)
        return np.maximum(self.k_min, np.ceil(n - 1e-9))

    def read(self, K: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """(S, M) of every prompt cut into K (pacings, prompts) chunks: read where its n(T) = K."""
        lk, out = detmath.log(K), []
        for q in range(K.shape[1]):  # n falls as the target grows: reversed, log n increases
            S = np.interp(lk[:, q], self.ln[::-1, q], self.S[::-1, q])
            M = np.interp(lk[:, q], self.ln[::-1, q], self.M[::-1, q])
            one = K[:, q] <= 1
            out.append((np.where(one, self.one[q], S), np.where(one, self.one[q], M)))
        return out

    def at(self, T: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        return self.read(self.counts(T))


__all__ = ["Behind", "advance_paced", "paced_totals"]
