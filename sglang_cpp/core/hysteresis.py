"""Plan hysteresis: a new cost model moves the plan only for a gain that model can resolve.

Why: online refinement refits after prompts finish. On a flat optimum (8K on SmolLM2, issue 25) each refit
moved the next plan of the same prompt between 8 and 16 chunks while every predicted TTFT stayed within
28.9-32.3 s, and the measured TTFT did not follow the moves. A plan that changes from one identical request
to the next buys nothing the model can show, and makes runs harder to read, trace and compare. So the
planner remembers the chunks it last planned per (prompt length, cached prefix); when the model in force
has changed since, it prices those chunks on the new model and keeps them unless the new plan is predicted
faster by more than the model's own error on forwards it did not fit (the refit's held-back error).

Every stage holds its own copy and feeds it the same plans in the same order, on the same models (the
updates ride in the request stream), so every stage keeps or moves alike. Pure Python and numpy.
"""
from __future__ import annotations

import math
from collections import OrderedDict

from .plan import ChunkPlan
from .planner_base import PlanConfig, make_plan, makespan


class Incumbents:
    """The chunks last planned per (prompt_len, prefix_len), at most `max_items` (least recent out)."""

    def __init__(self, max_items: int = 4096):
        if max_items < 1:
            raise ValueError(f"Incumbents(max_items={max_items}): need at least 1")
        self.max_items = max_items
        self._chunks: OrderedDict[tuple, tuple] = OrderedDict()

    def __len__(self) -> int:
        return len(self._chunks)

    def clear(self) -> None:
        """Forget every plan (the planner's bounds changed: old chunks may not fit them)."""
        self._chunks.clear()

    def choose(self, plan: ChunkPlan, cost, cfg: PlanConfig, margin: float) -> tuple[ChunkPlan, dict | None]:
        """`plan` (just made on `cost`), or the incumbent for its prompt priced on `cost` if the new plan is
        not predicted faster by more than `margin` (a fraction, e.g. 0.03). Returns the plan to run and, when
        the two differ, what was weighed (for the decision log); either way the result becomes the incumbent."""
        if not (margin >= 0 and math.isfinite(margin)):
            raise ValueError(f"plan hysteresis margin {margin!r} must be a finite fraction >= 0")
        key = (plan.prompt_len, plan.prefix_len)
        old = self._chunks.get(key)
        info = None
        if old is not None and old != plan.chunks:
            t_old = makespan(old, plan.prefix_len, cost, cfg.pp_size, cfg.overhead_ms)
            t_new = makespan(plan.chunks, plan.prefix_len, cost, cfg.pp_size, cfg.overhead_ms)
            keep = t_new >= t_old * (1.0 - margin)
            info = {"kept": keep, "kept_ms": round(t_old, 3), "new_ms": round(t_new, 3),
                    "kept_chunks": len(old), "new_chunks": len(plan.chunks), "margin": round(margin, 5)}
            if keep:
                plan = make_plan(old, plan.prompt_len, plan.prefix_len, cost, cfg, plan.policy)
        self._chunks[key] = plan.chunks
        self._chunks.move_to_end(key)
        while len(self._chunks) > self.max_items:
            self._chunks.popitem(last=False)
        return plan, info


__all__ = ["Incumbents"]
