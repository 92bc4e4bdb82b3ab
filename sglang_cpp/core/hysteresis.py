"""Plan hysteresis: a new cost model moves the plan only for a gain that model can resolve.

Why: online refinement refits after prompts finish. On a flat optimum (8K on SmolLM2) each refit
moved the next plan of the same prompt between 8 and 16 chunks while every predicted TTFT stayed within
28.9-32.3 s, and the measured TTFT did not follow the moves. A plan that changes from one identical request
to the next buys nothing the model can show, and makes runs harder to read, trace and compare. So the
planner remembers the chunks it last planned per (prompt length, cached prefix); when the model in force
has changed since, it prices those chunks on the new model and keeps them unless the new plan is predicted
faster by more than the model's own error on forwards it did not fit (the refit's held-back error).

That error only speaks for the chunk sizes the served forwards measured. A piecewise model (core/regimes.py)
fits one coefficient per chunk-size regime, and a refit on forwards of one regime (a host that slowed down,
measured at 1024-token chunks) leaves the others at the calibration's level, so they look cheap. At 32K on
long-llama such a refit moved a plan of 32 x 1024 to 64 x 512, priced 7.0% faster; it ran 1.40x its
prediction. So a plan moves only to chunks whose regimes served forwards measured on every stage.

Every stage holds its own copy and feeds it the same plans in the same order, on the same models (the
updates ride in the request stream), so every stage keeps or moves alike. Pure Python and numpy.
"""
from __future__ import annotations

import math
from collections import OrderedDict

from .costmodel import PipelineCost
from .plan import ChunkPlan
from .objective import PlanConfig, make_plan, makespan
from .regimes import regime_index, x_bounds_of


def unmeasured_chunks(chunks, cost, measured) -> list[int]:
    """The chunk sizes that lie, on some stage, in a chunk-size regime (x_bounds_of that stage's model) where
    no served forward measured it: `measured[s]` lists stage s's measured regime indices (Refiner.measured).
    None: no restriction (no refit has spoken yet)."""
    if measured is None:
        return []
    stages = cost.stages if isinstance(cost, PipelineCost) else (cost,)
    sizes = sorted({int(c) for c in chunks})
    out = set()
    for s, m in enumerate(stages):
        seen = set(measured[s]) if s < len(measured) else set()
        out.update(c for c, i in zip(sizes, regime_index(x_bounds_of(m), sizes)) if int(i) not in seen)
    return sorted(out)


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

    def choose(self, plan: ChunkPlan, cost, cfg: PlanConfig, margin: float,
               measured: list | None = None) -> tuple[ChunkPlan, dict | None]:
        """`plan` (just made on `cost`), or the incumbent for its prompt priced on `cost` if the new plan is
        not predicted faster by more than `margin` (a fraction, e.g. 0.03) or runs chunks in a regime no served
        forward measured (`measured`, see unmeasured_chunks). Returns the plan to run and, when the two differ,
        what was weighed (for the decision log); either way the result becomes the incumbent."""
        if not (margin >= 0 and math.isfinite(margin)):
            raise ValueError(f"plan hysteresis margin {margin!r} must be a finite fraction >= 0")
        key = (plan.prompt_len, plan.prefix_len)
        old = self._chunks.get(key)
        info = None
        if old is not None and old != plan.chunks:
            t_old = makespan(old, plan.prefix_len, cost, cfg.pp_size)
            t_new = makespan(plan.chunks, plan.prefix_len, cost, cfg.pp_size)
            unmeasured = unmeasured_chunks(plan.chunks, cost, measured)
            keep = t_new >= t_old * (1.0 - margin) or bool(unmeasured)
            info = {"kept": keep, "kept_ms": round(t_old, 3), "new_ms": round(t_new, 3),
                    "kept_chunks": len(old), "new_chunks": len(plan.chunks), "margin": round(margin, 5),
                    **({"unmeasured": unmeasured} if unmeasured else {})}
            if keep:
                plan = make_plan(old, plan.prompt_len, plan.prefix_len, cost, cfg, plan.policy)
        self._chunks[key] = plan.chunks
        self._chunks.move_to_end(key)
        while len(self._chunks) > self.max_items:
            self._chunks.popitem(last=False)
        return plan, info


__all__ = ["Incumbents", "unmeasured_chunks"]
