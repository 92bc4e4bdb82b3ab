"""The calibration's grid design (pure): which (L, x) shapes the startup calibration samples, level by level.

Why a grid: the prefix L and the chunk x vary independently (log-spaced L up to the level's length, three chunk
sizes per L from the planner's smallest chunk to a per-prefix top the plan so far wants), every side of each
kernel switch sampled, so the 2-D model is fitted where the served plans run. plugin/startup/calibrate.py runs these
shapes on the server; this module only designs them (numpy, no torch, no SGLang).
"""
from __future__ import annotations

import logging
import math

import numpy as np

logger = logging.getLogger("sglang_cpp")


def calibration_grid(max_len: int, align: int = 64, max_chunk: int = 0, min_chunk: int = 0,
                     switches: tuple = (), chunk_switches: tuple = ()) -> list[tuple]:
    """(L, x) samples for a target of max_len tokens: L in {0, M/8, M/4, M/2, 3M/4, 7M/8}, and at
    every L three chunk sizes from the planner's smallest (min_chunk, at least one alignment unit) to its
    largest (max_chunk; 0: no cap; or the per-prefix steps of `top_chunk`, see `cap_at`) that still fit
    under max_len, the middle one their geometric mean.

    Why independent: along one request's chunk walk (the old design) every long-prefix sample had the same
    chunk size, so the prefix terms g L, d L^2 and e L x could not be told apart exactly where a plan for a
    long prompt needs them, and small chunks late in a prompt were extrapolated.

    `switches`: prefixes where the attention kernel changes method (plugin/startup/switches.py). Every regime
    between two of them gets at least three prefixes of its own, its first and last aligned prefix
    included, so each regime's fit (core/regimes.py) is sampled on both sides of every switch.

    `chunk_switches`: chunk sizes where the kernel changes blocking. At every prefix, each chunk-size
    regime between the smallest and the largest chunk gets a sample (the geometric middle of its part),
    and the regime of the largest two, so each regime's L*x coefficient is measured, not extrapolated."""
    a = max(1, int(align))
    M = int(max_len) // a * a
    lo = max(a, -(-int(min_chunk) // a) * a)
    Ls = {0, 3 * M // 4 // a * a, 7 * M // 8 // a * a} | {(M >> k) // a * a for k in range(1, 4)}
    Ls |= regime_prefixes(switches, M - lo, a)
    points = []
    for L in sorted(Ls):
        top = cap_at(max_chunk, L)
        cap = int(top) // a * a if top and top >= a else M
        hi = min(cap, M - L) // a * a
        if hi < lo:
            continue
        mid = int(round(math.sqrt(lo * hi) / a)) * a
        xs = {lo, min(max(mid, lo), hi), hi}
        xs |= chunk_regime_sizes(chunk_switches, lo, hi, a, xs)
        if L == 0 and 1 in switches:  # a regime of fresh prefills alone: its 1-D fit needs 5 samples
            xs |= {int(round(v / a)) * a for v in np.geomspace(lo, hi, 5)}
        points += [(L, x) for x in sorted(xs)]
    return points


def cap_at(top, L: int) -> int:
    """The largest chunk sampled at prefix L: `top` is one cap for every prefix (an int; 0: none) or the
    steps of `top_chunk`, ((end, top), ...) with tops falling as the ends grow: the first step that ends
    past L."""
    if not isinstance(top, (tuple, list)):
        return int(top or 0)
    return next((int(t) for e, t in top if e > L), int(top[-1][1]))


def chunk_regime_sizes(chunk_switches: tuple, lo: int, hi: int, a: int, have: set) -> set:
    """An aligned chunk size in every chunk-size regime that [lo, hi] reaches and `have` misses, and a
    second one in the regime of the largest chunk. Why two: with one size per regime, each regime's L
    slope g + e_j x_j is all the data says, and the shared g and every e_j cannot be told apart. The second
    one is the regime's first aligned size: the cheapest forward, and the widest spread of x in the regime
    (the geometric middle cost 1792-token forwards at every long prefix)."""
    out: set = set()
    edges = [0, *sorted(int(s) for s in chunk_switches), None]
    for start, end in zip(edges, edges[1:]):
        first = max(lo, -(-start // a) * a)
        last = min(hi, (end - 1) // a * a if end else hi)
        if first > last:
            continue
        mid = min(max(int(round(math.sqrt(first * last) / a)) * a, first), last)
        inside = {v for v in have | out if first <= v <= last}
        if not inside:
            out.add(mid)
        elif last == hi and len(inside) < 2:
            out.add(first if first not in inside else mid)
    return out


def regime_prefixes(switches: tuple, top: int, a: int) -> set:
    """Aligned prefixes below `top`: for each regime [s_i, s_i+1) that starts below it, its first aligned
    prefix, its last and their midpoint (a regime that is only L = 0 has just 0)."""
    out: set = set()
    if not switches:
        return out
    edges = [0, *sorted(int(s) for s in switches), None]
    for start, end in zip(edges, edges[1:]):
        if start == 0 and end == 1:
            out.add(0)
            continue
        first = -(-start // a) * a
        last = min(top, (end - 1) if end else top) // a * a
        if first > last:
            continue
        out |= {first, last, (first + last) // 2 // a * a}
    return out


def calibrated_switches(bounds: tuple, names: tuple, max_len: int, align: int, min_chunk: int = 0,
                        quiet: bool = False) -> tuple:
    """The switches a calibration up to max_len samples on both sides: those whose regime above gets three
    prefixes of its own from `regime_prefixes`. A switch closer to the target is dropped (the regime past it
    is priced by the one below, and the log says so)."""
    a = max(1, int(align))
    M = int(max_len) // a * a
    top = M - max(a, -(-int(min_chunk) // a) * a)  # calibration_grid's: no prefix without room for a chunk
    keep = [i for i, b in enumerate(bounds)
            if b == 1 or len({p for p in regime_prefixes((b,), top, a) if p >= b}) >= 3]
    if len(keep) < len(bounds) and not quiet:
        dropped = [bounds[i] for i in range(len(bounds)) if i not in keep]
        logger.warning("[sglang-cpp] kernel switches at prefixes %s lie past the calibration target %d: "
                       "prompts past them are priced by the regime below; raise SGLANG_CPP_CALIB_MAX_LEN to "
                       "calibrate them", dropped, max_len)
    kept_names = tuple(names[i] for i in [0] + [i + 1 for i in keep]) if names else ()
    return tuple(bounds[i] for i in keep), kept_names


def level_grids(max_len: int, align: int = 64, max_chunk: int = 0, min_chunk: int = 0,
                switches: tuple = (), chunk_switches: tuple = ()) -> list[tuple]:
    """[(level, its new samples)] for targets 4x apart up to max_len, shortest first: each level's own
    grid minus the samples an earlier level took, so a budget that stops early still has a complete grid
    for the length it reached, and nothing is measured twice. Every level's top chunk is max_chunk; the
    calibration itself narrows it level by level (`top_chunk`)."""
    seen: set = set()
    out = []
    for level in calibration_levels(max_len):
        out.append((level, new_points(level, seen, align, max_chunk, min_chunk, switches, chunk_switches)))
    return out


def new_points(level: int, seen: set, align: int, top: int, min_chunk: int, switches: tuple = (),
               chunk_switches: tuple = ()) -> list[tuple]:
    """The level's grid under top chunk `top`, less what `seen` holds (which it then holds too)."""
    pts = [p for p in calibration_grid(level, align, top, min_chunk, switches, chunk_switches) if p not in seen]
    seen.update(pts)
    return pts


def top_chunk(cost, length: int, plan_cfg, max_chunk: int) -> tuple:
    """The largest chunk the next level samples, per prefix: steps ((end, top), ...) from the plan the
    planner cuts for a prompt of `length` on the model fitted so far. A prefix L gets the largest chunk
    that still runs at or past L (ends after it), rounded up to the alignment unit times a power of two
    (a margin of 1-2x; sizes shared across levels), at most max_chunk (0: no cap) and at least 4 alignment
    units (three distinct sizes per prefix).

    Why per prefix: a long level's biggest samples cost most of its time (4096-token samples at
    prefixes up to 28K were 63% of the 32K level), yet a plan's big chunks run early, over short prefixes,
    and its late chunks are small. Tried on the real 32K calibration (benchmarks/calibration_grid.py, and
    replayed offline on its samples): one top for every prefix sampled the first chunk's size at every
    prefix (111-137 s); twice the largest chunk, rounded, per prefix, made the 32K level sample 16384 and
    8192 tokens over prefixes up to 10K for a first chunk of 4608 (110 s of 135 on CPU, where attention
    grows with x^2). Where the model wants big chunks (a GPU), the tops stay at the cap. A chunk the served
    plan wants above a top (it is cut with the per-chunk overhead, measured after the calibration) is
    measured before serving (plugin/startup/coverage.py)."""
    from ..core.planner import plan

    a = max(1, int(plan_cfg.align))
    chunks = [int(c) for c in plan(int(length), cost, plan_cfg).chunks]
    cap = int(max_chunk) // a * a if max_chunk and max_chunk >= 4 * a else 0

    def rounded(want: int) -> int:
        top = max(4 * a, a << max(0, math.ceil(math.log2(max(want, a) / a))))
        return min(top, cap) if cap else top

    steps, end, biggest = [], int(sum(chunks)), 0
    for c in reversed(chunks):  # suffix maxima, from the last chunk back
        biggest = max(biggest, c)
        top = rounded(biggest)
        if not steps or top > steps[-1][1]:  # the same top: the later step already covers this chunk
            steps.append((end, top))
        end -= c
    return tuple(reversed(steps))


def calibration_levels(max_len: int, start: int = 1024, factor: int = 4) -> list[int]:
    """Target lengths max_len, max_len/4, ... down to `start`, shortest first, so a time budget stops
    cleanly. Each level walks its prefixes from 0, so every level costs its whole length again: a
    factor of 4 keeps the short levels at a third of the total (doubling made them as costly as the top)."""
    levels, m = [max_len], max_len
    while m // factor >= start:
        m = max(64, m // factor // 64 * 64)
        levels.append(m)
    return levels[::-1]


def _eta_s(levels: list[int], done: int, times: list[float]) -> float:
    """Seconds left: each remaining level scaled from the last one by the growth the last two showed
    per doubling of the length (between 2x, linear work, and 4x, quadratic work; 3x before two are seen)."""
    growth = 3.0
    if len(times) >= 2 and times[-2] > 0 and levels[done - 1] > levels[done - 2]:
        growth = (times[-1] / times[-2]) ** (1.0 / math.log2(levels[done - 1] / levels[done - 2]))
        growth = min(4.0, max(2.0, growth))
    left, t = 0.0, times[-1]
    for prev, nxt in zip(levels[done - 1:], levels[done:]):
        t *= growth ** math.log2(nxt / prev)
        left += t
    return left
