"""Online refinement of the per-stage cost models from the forwards a server logs while serving.

Why: the startup calibration times isolated forwards on synthetic requests; serving runs the stages
side by side, at prefixes and chunk sizes the grid only brackets. vllm-ascend refits its 2-D chunk cost
model online from 5-30 samples, on by default. Here one owner (world rank 0 in the plugin) keeps every
stage's samples, refits a stage when enough new ones came in, and accepts the refit only if it predicts
held-back samples better than the model in force; the plugin then sends the accepted coefficients to
every rank. Pure numpy: no torch, no SGLang.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace

import numpy as np

from .costmodel import ChunkOverhead, CostModel, PiecewiseCost, PipelineCost, fit_piecewise, overheads_of
from .regimes import regime_index, x_bounds_of


@dataclass(frozen=True)
class RefineConfig:
    min_new: int = 5  # new forwards of a stage before it is refitted
    holdback: int = 4  # every holdback-th online sample is kept out of the fit, to judge it
    max_online: int = 512  # online samples kept per stage (the most recent)
    drift_band: float = 0.20  # |measured / predicted - 1| above this ...
    drift_run: int = 20  # ... this many forwards in a row is drift (one WARNING)
    min_steps: int = 8  # serving steps of a stage before their median replaces the probe's overhead
    max_steps: int = 64  # the most recent steps kept per stage
    overhead_band: float = 0.10  # a new overhead replaces the one in force only if it differs by more than
    overhead_floor_ms: float = 0.25  # this fraction of it and this many ms (no new model for noise)

    def __post_init__(self):
        if self.min_new < 1 or self.holdback < 2 or self.max_online < self.min_new or self.drift_run < 1:
            raise ValueError(f"RefineConfig {self}: need min_new >= 1, holdback >= 2, max_online >= min_new, "
                             "drift_run >= 1")
        if self.min_steps < 1 or self.max_steps < self.min_steps or self.overhead_band < 0 or self.overhead_floor_ms < 0:
            raise ValueError(f"RefineConfig {self}: need 1 <= min_steps <= max_steps, overhead_band >= 0, "
                             "overhead_floor_ms >= 0")
        if not 0 < self.drift_band < 1:
            raise ValueError(f"RefineConfig.drift_band={self.drift_band} must be in (0, 1)")


def _median_rel_err(model, pts) -> float:
    """Median |predicted / measured - 1| of a stage's forward times (`model`: the forward model alone; the
    per-chunk overhead is no part of a logged forward)."""
    if not pts:
        return math.inf
    L, x, y = (np.array(v, dtype=float) for v in zip(*pts))
    return float(np.median(np.abs(model.time(L, x) / y - 1.0)))


def _with_meta(model, meta: dict):
    """`model` (a CostModel or PiecewiseCost) tagged with `meta`."""
    if isinstance(model, PiecewiseCost):
        return replace(model, meta=dict(meta))
    return CostModel(**model.coeffs, meta=dict(meta), fit=model.fit)


def _fit_err(model) -> float:
    """A calibrated model's median relative error on its fit's held-out samples (in-sample without a
    holdout); the largest over a piecewise model's regimes; nan without a fit record."""
    parts = model.models if isinstance(model, PiecewiseCost) else [model]
    errs = []
    for m in parts:
        fit = getattr(m, "fit", None) or {}
        err = (fit.get("holdout") or {}).get("median_rel_err", fit.get("median_rel_err"))
        if err is not None and math.isfinite(float(err)):
            errs.append(float(err))
    return max(errs, default=math.nan)


@dataclass
class StageRefit:
    """One stage's samples: the calibration's (kept), and the online ones (fitted or held back)."""

    base: list  # [(L, x, ms)] from the calibration
    overhead: ChunkOverhead  # the per-chunk overhead the stage carries beside its forward model
    fitted: deque  # online samples the refit uses (the most recent max_online)
    held: deque  # every holdback-th online sample: the refit's judge
    steps: deque  # serving steps' cost beyond forward and waits (ms): the per-chunk overhead measured
    new: int = 0
    new_steps: int = 0
    seen: int = 0
    streak: int = 0
    err: float = math.nan  # the model in force's median error on held-back forwards (nan: not judged yet)


class Refiner:
    """Samples in, accepted models out. `model` is the PipelineCost (or CostModel) the planner runs on: each
    stage's forward model in `stages`, its per-chunk overhead in `overheads` (PipelineCost's carrier). Logged
    forwards refit the first, serving steps the second; `model` gives both back in the same carrier."""

    def __init__(self, model, calibration: list[dict], cfg: RefineConfig | None = None):
        self.cfg = cfg or RefineConfig()
        stages = list(model.stages) if isinstance(model, PipelineCost) else [model]
        over = list(overheads_of(model)) or [ChunkOverhead()] * len(stages)
        self.models = stages
        self.version = 0
        self.stages = []
        for s, o in enumerate(over):
            self.stages.append(StageRefit([(d["L"], d["x"], d["ms"]) for d in calibration if d.get("stage", 0) == s],
                                          o, deque(maxlen=self.cfg.max_online),
                                          deque(maxlen=max(8, self.cfg.max_online // 4)),
                                          deque(maxlen=self.cfg.max_steps)))
        for st, m in zip(self.stages, stages):
            st.err = _fit_err(m)
        self.drifted: set = set()
        self.bad_steps = 0  # negative or non-finite step costs dropped (a broken timer)

    @property
    def error(self) -> float:
        """The largest stage's median relative error on forwards its model did not fit (the last refit's
        held-back ones, else the calibration fit's holdout); 0.0 when no stage has one. A predicted
        difference below it is one the model cannot resolve (core/hysteresis.py)."""
        errs = [st.err for st in self.stages if math.isfinite(st.err)]
        return max(errs, default=0.0)

    @property
    def measured(self) -> list[list[int]]:
        """Per stage, the chunk-size regimes (x_bounds_of its model) of the served forwards it holds: what
        its refits can speak for. A plan moves only into these (core/hysteresis.py)."""
        out = []
        for st, m in zip(self.stages, self.models):
            xs = [x for _, x, _ in (*st.fitted, *st.held)]
            out.append(sorted({int(i) for i in regime_index(x_bounds_of(m), xs)}) if xs else [])
        return out

    @property
    def model(self):
        """Every stage's forward model with its per-chunk overhead (a lone model without one: as it is)."""
        over = tuple(st.overhead for st in self.stages)
        if len(self.models) == 1 and not any(o != ChunkOverhead() for o in over):
            return self.models[0]
        return PipelineCost(tuple(self.models), over)

    def add(self, stage: int, L: int, x: int, ms: float) -> bool:
        """One logged forward of `stage`; True the first time this stage drifts (the caller warns once)."""
        if not (0 <= stage < len(self.stages)) or not (ms > 0 and math.isfinite(ms)) or x < 1 or L < 0:
            return False
        st = self.stages[stage]
        st.seen += 1
        (st.held if st.seen % self.cfg.holdback == 0 else st.fitted).append((int(L), int(x), float(ms)))
        st.new += 1
        ratio = ms / max(float(self.models[stage].time(L, x)), 1e-9)
        st.streak = st.streak + 1 if abs(ratio - 1.0) > self.cfg.drift_band else 0
        if st.streak >= self.cfg.drift_run and stage not in self.drifted:
            self.drifted.add(stage)
            return True
        return False

    def add_step(self, stage: int, ms: float) -> None:
        """One serving step's cost beyond its forward and its waits (plugin/serving/steps.py) on `stage`."""
        if not (0 <= stage < len(self.stages)):
            return
        if not (math.isfinite(ms) and ms >= 0):
            self.bad_steps += 1
            return
        st = self.stages[stage]
        st.steps.append(float(ms))
        st.new_steps += 1

    def _overhead(self, s: int, st: StageRefit) -> str | None:
        """The median serving step replaces the per-chunk ms in force (the probe's, or an earlier median) once
        min_steps are in and it differs by more than the band (the forward model stays). The received hidden
        states (their fixed and per-token parts: a wait the steps leave out) stay the probe's."""
        if st.new_steps < self.cfg.min_new or len(st.steps) < self.cfg.min_steps:
            return None
        st.new_steps = 0
        new = float(np.median(st.steps))
        old = st.overhead.ms
        if abs(new - old) <= max(self.cfg.overhead_band * old, self.cfg.overhead_floor_ms):
            return None
        st.overhead = replace(st.overhead, ms=new)
        return (f"stage {s}: per-chunk overhead {old:.2f} -> {new:.2f} ms (the median of the last {len(st.steps)} "
                "serving steps' cost beyond forward and waits)")

    def refit(self) -> list[str]:
        """Refit every stage with enough new samples; returns one line per decision (accepted or why not).
        The model changes (and `version` grows) only on an accepted refit or a new per-chunk overhead."""
        notes, changed = [], False
        for s, st in enumerate(self.stages):
            note = self._overhead(s, st)
            if note:
                notes.append(note)
                changed = True
            if st.new < self.cfg.min_new or not st.held:
                continue
            st.new = 0
            pts = st.base + list(st.fitted)
            m = self.models[s]
            try:  # a piecewise stage: every regime on its own samples, as the calibration fits it
                lb = m.bounds if isinstance(m, PiecewiseCost) and m.axis == "L" else ()
                fwd = fit_piecewise(*zip(*pts), lb, names=m.names if lb else (), x_bounds=x_bounds_of(m),
                                    holdout=0.0, name=f"online refit of stage {s}")
            except ValueError as exc:
                notes.append(f"stage {s}: refit skipped ({exc})")
                continue
            new = _with_meta(fwd, dict(m.meta, refit=self.version + 1))
            held = [(L, x, ms) for L, x, ms in st.held]
            old_err = _median_rel_err(self.models[s], held)
            new_err = _median_rel_err(new, held)
            st.err = old_err
            if new_err >= old_err:
                notes.append(f"stage {s}: refit rejected, held-back error {new_err:.1%} >= the model's {old_err:.1%}")
                continue
            self.models[s] = new
            st.err = new_err
            changed = True
            notes.append(f"stage {s}: refit accepted on {len(pts)} samples, held-back error {old_err:.1%} -> "
                         f"{new_err:.1%}")
        if changed:
            self.version += 1
        return notes


__all__ = ["RefineConfig", "Refiner"]
