"""The exact planner (the reference): the optimum over aligned chunk boundaries, TeraPipe-style, by
enumerating the threshold M = max(t_k) and minimising S(M) + (P-1) * M with pruning. Exact but slow past
DP_MAX_UNITS aligned units; the plugin's default is the equal-time planner (equal_time.py)."""
from __future__ import annotations

import math

import numpy as np

from .plan import ChunkPlan
from .objective import PlanConfig, _check, _times, make_plan, ttft


DP_MAX_UNITS = 4096  # the exact DP's table is units x band: past this many aligned units it is too big to plan in time
# its time grows about as units^3 (one min-sum pass per threshold): 64 units take 0.3 s, 128 about 2 s and 256 about
# 20 s on a 2-core AMD EPYC; the command line refuses more than this, naming the fix (a server plans at start-up)
DP_CLI_UNITS = 192


def check_dp_size(prompt_len: int, prefix_len: int, align: int) -> None:
    """A command-line plan with the exact DP finishes in seconds or is refused with one line (issue 58)."""
    n = -(-(prompt_len - prefix_len) // max(1, align))
    if n > DP_CLI_UNITS:
        need = -(-(prompt_len - prefix_len) // DP_CLI_UNITS)
        raise ValueError(f"--method dp: {prompt_len - prefix_len} tokens at --align {align} are {n} aligned units, and "
                         f"the exact DP's time grows as units^3 (about 20 s at 256 units): it takes at most "
                         f"{DP_CLI_UNITS} here. Give --align >= {need}, or --method equal-time (within 1% of the DP)")


def plan_dp(prompt_len: int, cost, cfg: PlanConfig, prefix_len: int = 0, max_units: int = DP_MAX_UNITS) -> ChunkPlan:
    """Exact optimum over aligned boundaries: min over thresholds M of S(M) + (P-1)*M."""
    R = _check(prompt_len, prefix_len, cfg)
    al, lo, hi, P = cfg.align, cfg.lo, cfg.hi, cfg.pp_size
    n = -(-R // al)
    if n > max_units:
        raise ValueError(f"dp planner: {n} aligned units exceed {max_units}; raise --align or use equal-time")
    pos = np.minimum(np.arange(n + 1) * al, R)
    band = hi // al
    # W[i, d]: time of the chunk from unit i to unit i+d+1 (inf when infeasible)
    W = np.full((n + 1, band), np.inf)
    for d in range(band):
        i = np.arange(0, n - d)
        j = i + d + 1
        size = pos[j] - pos[i]
        ok = (size <= hi) & ((j == n) | (size >= lo))
        W[i[ok], d] = _times(cost, prefix_len + pos[i[ok]], size[ok])

    def min_sum(M: float):
        dp = np.full(n + 1, np.inf)
        arg = np.zeros(n + 1, dtype=int)
        dp[0] = 0.0
        for j in range(1, n + 1):
            d = np.arange(min(band, j))
            i = j - 1 - d
            w = W[i, d]
            cand = np.where(w <= M, dp[i] + w, np.inf)
            k = int(np.argmin(cand))
            dp[j], arg[j] = cand[k], i[k]
        if not math.isfinite(dp[n]):
            return math.inf, None
        cuts, j = [], n
        while j > 0:
            cuts.append(j)
            j = arg[j]
        b = [0] + [int(pos[c]) for c in reversed(cuts)]
        return float(dp[n]), [b[k + 1] - b[k] for k in range(len(b) - 1)]

    s_inf, path = min_sum(math.inf)
    if path is None:
        raise ValueError(f"dp planner: no way to cut {R} tokens into aligned chunks within the bounds "
                         f"[--min-chunk {lo}, --max-chunk {hi}] (--align {al}); lower --min-chunk "
                         "(SGLANG_CPP_MIN_CHUNK) or raise --max-chunk, or use --method equal-time")
    best = (ttft(path, prefix_len, cost, P), path)
    for M in np.unique(W[np.isfinite(W)]):
        if s_inf + (P - 1) * M >= best[0]:
            break  # every larger threshold is worse even at the unconstrained minimum sum
        s, ch = min_sum(float(M))
        if ch is not None:
            j = ttft(ch, prefix_len, cost, P)
            if j < best[0]:
                best = (j, ch)
    return make_plan(best[1], prompt_len, prefix_len, cost, cfg, "plan:dp")



__all__ = ["DP_MAX_UNITS", "DP_CLI_UNITS", "check_dp_size", "plan_dp"]
