"""Online refinement's decisions (sglang_cpp/core/refine.py), on synthetic forwards with a known cost."""
from __future__ import annotations

import math

import numpy as np
import pytest

from sglang_cpp.core.costmodel import CostModel, PipelineCost, with_overheads
from sglang_cpp.core.refine import RefineConfig, Refiner

TRUE = CostModel(c0=20.0, b=0.5, e=2e-4, f=1e-4)  # what the forwards cost while serving
CALIB = CostModel(c0=5.0, b=0.4, e=1e-4, f=0.5e-4)  # what the startup calibration measured: too cheap


def _grid(model, stage):
    return [{"L": L, "x": x, "ms": float(model.time(L, x)), "stage": stage}
            for L in (0, 1024, 2048, 3072) for x in (128, 512, 1024)]


def _serve(r: Refiner, model, n: int, rng, stage: int = 0, noise: float = 0.02, lo: int = 128):
    """n forwards of a long prompt's chunks, timed on `model` with a little noise."""
    for _ in range(n):
        L, x = int(rng.integers(0, 8192)), int(rng.integers(lo, 2048))
        r.add(stage, L, x, float(model.time(L, x)) * (1 + noise * rng.standard_normal()))


def test_a_refit_follows_the_serving_forwards_and_is_accepted_on_held_back_ones():
    rng = np.random.default_rng(0)
    r = Refiner(PipelineCost((CALIB, CALIB)), _grid(CALIB, 0) + _grid(CALIB, 1))
    assert r.refit() == [] and r.version == 0  # nothing new: nothing to do
    _serve(r, TRUE, 40, rng, stage=0)
    notes = r.refit()
    assert r.version == 1 and len(notes) == 1 and notes[0].startswith("stage 0: refit accepted")
    held = [(L, x, ms) for L, x, ms in r.stages[0].held]
    err = lambda m: float(np.median([abs(m.time(L, x) / ms - 1) for L, x, ms in held]))  # noqa: E731
    assert err(r.model.stages[0]) < 0.5 * err(CALIB)
    assert r.model.stages[1] is CALIB  # stage 1 had no new forwards: untouched
    assert r.refit() == []  # and nothing new since


def test_the_overhead_stays_charged_and_out_of_the_judgement():
    """The served model is the forward fit plus each stage's per-chunk overhead (carried beside it); logged
    forwards hold no overhead, so the refit fits forwards and keeps the overhead charged."""
    rng = np.random.default_rng(1)
    served = with_overheads(PipelineCost((TRUE, TRUE)), 7.0, 2)  # exact forwards + 7 ms overhead
    r = Refiner(served, _grid(TRUE, 0) + _grid(TRUE, 1))
    _serve(r, TRUE, 40, rng, noise=0.0)
    assert not any(st.streak for st in r.stages)  # exact forwards are no drift, overhead or not
    r.refit()
    # exact samples: the refit cannot beat the model in force on held-back ones, so it is rejected
    assert r.version == 0 and r.model.stages[0] is TRUE and r.model.charged[0].c0 == pytest.approx(TRUE.c0 + 7.0)


def test_a_refit_worse_on_held_back_forwards_is_rejected():
    """Held-back forwards say the model in force is right; the fitted ones (every other) are off by 2x:
    the refit follows them, predicts the held-back ones worse, and the old model stays."""
    cfg = RefineConfig(holdback=2)
    r = Refiner(TRUE, _grid(TRUE, 0), cfg=cfg)
    rng = np.random.default_rng(2)
    for i in range(40):
        L, x = int(rng.integers(0, 8192)), int(rng.integers(128, 2048))
        r.add(0, L, x, float(TRUE.time(L, x)) * (1.0 if (i + 1) % 2 == 0 else 2.0))
    notes = r.refit()
    assert r.version == 0 and r.model is TRUE and "rejected, held-back error" in notes[0]


def test_drift_is_reported_once_after_a_run_of_bad_forwards():
    r = Refiner(CALIB, _grid(CALIB, 0), cfg=RefineConfig(drift_run=20))
    flags = [r.add(0, 1024, 512, float(CALIB.time(1024, 512)) * 1.5) for _ in range(19)]
    r.add(0, 1024, 512, float(CALIB.time(1024, 512)))  # one good forward breaks the run
    flags += [r.add(0, 1024, 512, float(CALIB.time(1024, 512)) * 0.7) for _ in range(25)]
    assert flags.count(True) == 1 and flags.index(True) == 19 + 19  # the 20th bad one in a row, once


def test_bad_samples_are_ignored_and_bad_settings_refused():
    r = Refiner(CALIB, _grid(CALIB, 0))
    for bad in (math.nan, math.inf, -1.0, 0.0):
        assert r.add(0, 100, 64, bad) is False
    assert r.add(3, 100, 64, 10.0) is False and r.add(0, 100, 0, 10.0) is False  # no stage 3; x = 0
    assert r.stages[0].seen == 0
    with pytest.raises(ValueError, match="holdback"):
        RefineConfig(holdback=1)
    with pytest.raises(ValueError, match="drift_band"):
        RefineConfig(drift_band=1.5)
    with pytest.raises(ValueError, match="2 chunk overheads for 1 stages"):
        Refiner(PipelineCost((CALIB,), (1.0, 2.0)), [])


def test_online_samples_alone_can_start_a_model():
    """With a coefficient-only profile there are no calibration samples: online forwards alone refit it."""
    rng = np.random.default_rng(3)
    r = Refiner(CALIB, [])
    _serve(r, TRUE, 60, rng)
    r.refit()
    assert r.version == 1 and abs(r.model.time(4096, 1024) / TRUE.time(4096, 1024) - 1) < 0.1


def test_serving_steps_replace_the_probes_overhead_and_move_c0_by_the_difference():
    """The probe charged 0.5 ms; the serving steps cost 12 ms beyond forward and waits (their median,
    not their mean: one stalled step of 900 ms is in them). The forward model stays as it was."""
    served = with_overheads(PipelineCost((TRUE, TRUE)), 0.5, 2)
    r = Refiner(served, _grid(TRUE, 0) + _grid(TRUE, 1))
    for ms in [11.0, 12.0, 13.0, 12.0, 900.0, 12.0, 11.5]:  # 7 steps: one short of min_steps
        r.add_step(1, ms)
    assert r.refit() == [] and r.version == 0
    r.add_step(1, 12.5)
    notes = r.refit()
    assert r.version == 1 and notes == ["stage 1: per-chunk overhead 0.50 -> 12.00 ms (the median of the last 8 "
                                        "serving steps' cost beyond forward and waits)"]
    assert r.model.charged[1].c0 == pytest.approx(TRUE.c0 + 12.0) and r.stages[1].overhead.ms == 12.0
    assert r.model.stages[1] is TRUE and r.model.overheads[1].ms == 12.0  # the carrier moved, not the forward model
    assert r.model.stages[0] is TRUE and r.model.charged[0].c0 == pytest.approx(TRUE.c0 + 0.5)  # stage 0 sent no steps
    # a later forward refit adds the new overhead back onto its forward fit, and judges forwards without it
    rng = np.random.default_rng(5)
    _serve(r, CostModel(**{**TRUE.coeffs, "c0": 2 * TRUE.c0}), 40, rng, stage=1, noise=0.0)
    assert any(n.startswith("stage 1: refit accepted") for n in r.refit())
    from sglang_cpp.core.costmodel import fit_cost_model

    pts = r.stages[1].base + list(r.stages[1].fitted)
    assert r.model.charged[1].c0 == pytest.approx(fit_cost_model(*zip(*pts), holdout=0.0).c0 + 12.0)


def test_a_step_median_inside_the_band_leaves_the_probes_overhead_in_force():
    """The other branch of the rule the server test can only check either way (issue 60): a median within
    max(10% of the overhead in force, 0.25 ms) of it is noise, no new model; just past the band it replaces it."""
    served = with_overheads(PipelineCost((TRUE, TRUE)), 2.0, 2)
    r = Refiner(served, _grid(TRUE, 0) + _grid(TRUE, 1))
    for ms in [2.1, 2.2, 1.9, 2.15, 2.18, 2.05, 2.2, 2.19]:  # median 2.165: 0.165 ms off, inside 0.25
        r.add_step(0, ms)
    assert r.refit() == [] and r.version == 0 and r.stages[0].overhead.ms == 2.0
    for ms in [2.3] * 8:  # the last 16 steps' median 2.25: still inside; then more at 2.3 push it to 2.3, past 0.25
        r.add_step(0, ms)
    assert r.refit() == [] and r.version == 0
    for ms in [2.3] * 8:
        r.add_step(0, ms)
    assert r.refit() and r.version == 1 and r.stages[0].overhead.ms == pytest.approx(2.3)


def test_the_probes_per_token_overhead_stays_in_b_through_a_new_step_median_and_a_forward_refit():
    """The probe's overhead has a term in x (the hidden states received): 0.5 ms of step, 3 ms of receive at
    x = 0 and 1 ms per token, carried beside the forward model. Serving steps (which leave the receive out, a wait on a
    peer) replace the step's 0.5 ms only, and the band compares them with it, not with the receive; a forward refit adds both back onto its fit;
    forwards that cost exactly the forward model are no drift (the per-token part is taken out of the
    prediction before the comparison)."""
    from sglang_cpp.core.costmodel import ChunkOverhead, fit_cost_model

    ov = ChunkOverhead(0.5, 1.0, received_ms=3.0)
    served = with_overheads(PipelineCost((TRUE, TRUE)), ov, 2)
    r = Refiner(served, _grid(TRUE, 0) + _grid(TRUE, 1), cfg=RefineConfig(drift_run=5))
    for ms in [12.0] * 8:
        r.add_step(1, ms)
    assert r.refit() and r.stages[1].overhead == ChunkOverhead(12.0, 1.0, 3.0)  # the receive's part kept
    assert r.model.charged[1].c0 == pytest.approx(TRUE.c0 + 15.0) and r.model.charged[1].b == pytest.approx(TRUE.b + 1.0)
    drifted = [r.add(1, L, 2048, float(TRUE.time(L, 2048))) for L in range(0, 5120, 1024)]
    assert not any(drifted) and r.stages[1].streak == 0  # 2048 ms of per-token overhead at x = 2048 taken out
    _serve(r, CostModel(**{**TRUE.coeffs, "c0": 2 * TRUE.c0}), 40, np.random.default_rng(5), stage=1, noise=0.0)
    assert any(n.startswith("stage 1: refit accepted") for n in r.refit())
    fit = fit_cost_model(*zip(*(r.stages[1].base + list(r.stages[1].fitted))), holdout=0.0)
    assert r.model.charged[1].b == pytest.approx(fit.b + 1.0) and r.model.charged[1].c0 == pytest.approx(fit.c0 + 15.0)
    with pytest.raises(ValueError, match="per_token_ms=-1"):
        ChunkOverhead(1.0, -1)


def test_an_overhead_inside_the_band_makes_no_new_model_and_bad_steps_are_dropped():
    cfg = RefineConfig(min_new=4, min_steps=4)
    r = Refiner(with_overheads(TRUE, 10.0, 1), _grid(TRUE, 0), cfg=cfg)
    for ms in (10.5, 10.8, 9.5, 10.9):  # median 10.65: within 10% of 10 ms
        r.add_step(0, ms)
    for ms in (-1.0, math.nan, math.inf):
        r.add_step(0, ms)
    assert r.refit() == [] and r.version == 0 and r.bad_steps == 3 and list(r.stages[0].steps) == [10.5, 10.8, 9.5, 10.9]
    for ms in (14.0, 14.0, 14.0, 14.0):  # median of the last 8: (10.9 + 14) / 2, outside the band
        r.add_step(0, ms)
    assert r.refit() and r.stages[0].overhead.ms == pytest.approx(12.45)
    with pytest.raises(ValueError, match="min_steps"):
        RefineConfig(min_steps=0)
