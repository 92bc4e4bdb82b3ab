"""Whole-prompt chunk planning: minimise TTFT = sum(t_k) + (P-1) * max(t_k) over the chunk sizes.

Under chunked pipeline parallelism with equal stages, P stages run K chunks as a proportionate flow
shop, whose makespan is exactly sum + (P-1)*max. Upstream sizes each chunk greedily from the current
prefix; here the whole prompt is planned at once, from data every PP stage shares (prompt length,
cached prefix, the broadcast cost model), so every stage derives the same plan.

The one entry is `plan`; the files hold one piece each: `objective` (the makespan, PlanConfig, fixed
chunks), `equal_time` (fast: target-time search plus boundary rebalancing, no runt tail; its root search
in `equal_time_search`) and `dp` (exact over aligned units, threshold enumeration with pruning; the
reference).
"""
from __future__ import annotations

from .dp import DP_MAX_UNITS, plan_dp
from .equal_time import MAX_PLAN_CHUNKS, MAX_SEARCH_CHUNKS, plan_equal_time
from .objective import (METHODS, PlanConfig, fixed_candidates, fixed_split, make_plan, plan_fixed,
                        prefill_buffer_tokens, ttft)
from .plan import ChunkPlan


def plan(prompt_len: int, cost, cfg: PlanConfig, prefix_len: int = 0) -> ChunkPlan:
    """The single-prompt plan on the planner `cfg.method` names: the one dispatch every caller uses (the
    plugin's sizer, its calibration and coverage, `policy.plan_for`)."""
    return (plan_dp if cfg.method == "dp" else plan_equal_time)(prompt_len, cost, cfg, prefix_len)


def plan_chunks(prompt_len: int, cost, pp_size: int, *, prefix_len: int = 0, method: str = "equal-time",
                **kw) -> ChunkPlan:
    return plan(prompt_len, cost, PlanConfig(pp_size=pp_size, method=method, **kw), prefix_len)


__all__ = ["DP_MAX_UNITS", "PlanConfig", "ChunkPlan", "METHODS", "plan", "plan_chunks", "plan_equal_time", "plan_dp", "plan_fixed", "ttft",
           "make_plan", "fixed_split", "fixed_candidates", "MAX_PLAN_CHUNKS", "MAX_SEARCH_CHUNKS",
           "prefill_buffer_tokens"]
