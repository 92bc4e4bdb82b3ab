"""Plan hysteresis (core/hysteresis.py, issue 25): after a refit the plan of a prompt seen before moves only
for a predicted gain beyond the new model's held-back error, and every stage keeps or moves alike."""
from __future__ import annotations

import json

import numpy as np
import pytest

from sglang_cpp.core.costmodel import CostModel, PipelineCost, fit_cost_model
from sglang_cpp.core.hysteresis import Incumbents, unmeasured_chunks
from sglang_cpp.core.planner import PlanConfig, plan_equal_time
from sglang_cpp.core.refine import Refiner
from sglang_cpp.core.regimes import PiecewiseCost
from sglang_cpp.plugin.decision_log import DecisionLog
from sglang_cpp.plugin.serving.sizer import CppChunkSizer, SizerConfig

from conftest import walk

N = 32000
CFG = PlanConfig.from_server(pp_size=2, chunk_size=4096, max_prefill_tokens=16384, page_size=1, context_len=1 << 20)
A = CostModel(c0=5, b=0.02, e=4e-6, f=2e-6)  # the model in force first
NEAR = CostModel(c0=8, b=0.02, e=4e-6, f=2e-6)  # a refit that moves the optimum's chunks, not its time (flat)
FAR = CostModel(c0=100, b=0.02, e=4e-6, f=2e-6)  # a refit that finds chunks far dearer than thought


def ttft(chunks, model) -> float:
    """sum + (P-1) max of the chunk times on 2 equal stages, written out here (not the planner's code)."""
    t, L = [], 0
    for c in chunks:
        t.append(float(model.time(L, c)))
        L += c
    return sum(t) + max(t)


def test_the_fixture_is_a_flat_optimum():
    """NEAR's own plan cuts other chunks than A's, for a predicted gain of about 1%; FAR's for far more."""
    a, near, far = (plan_equal_time(N, m, CFG).chunks for m in (A, NEAR, FAR))
    assert len(a) != len(near) and len(near) != len(far)
    assert 0.005 < 1 - ttft(near, NEAR) / ttft(a, NEAR) < 0.03
    assert 1 - ttft(far, FAR) / ttft(a, FAR) > 0.2


def test_a_gain_inside_the_margin_keeps_the_plan_priced_on_the_new_model():
    inc = Incumbents()
    first, info = inc.choose(plan_equal_time(N, A, CFG), A, CFG, 0.03)
    assert info is None  # nothing to weigh the first time
    again, info = inc.choose(plan_equal_time(N, A, CFG), A, CFG, 0.03)
    assert again.chunks == first.chunks and info is None  # the same model plans the same chunks
    kept, info = inc.choose(plan_equal_time(N, NEAR, CFG), NEAR, CFG, 0.03)
    assert kept.chunks == first.chunks and info["kept"]
    starts = np.concatenate([[0], np.cumsum(first.chunks)[:-1]])
    assert kept.pred_ms == pytest.approx([float(NEAR.time(L, x)) for L, x in zip(starts, first.chunks)])
    assert info["kept_ms"] == pytest.approx(ttft(first.chunks, NEAR), abs=1e-3)
    assert info["new_ms"] == pytest.approx(ttft(plan_equal_time(N, NEAR, CFG).chunks, NEAR), abs=1e-3)


def test_a_gain_beyond_the_margin_moves_the_plan_and_the_new_one_becomes_the_incumbent():
    inc = Incumbents()
    a = inc.choose(plan_equal_time(N, A, CFG), A, CFG, 0.03)[0]
    near = plan_equal_time(N, NEAR, CFG)
    moved, info = inc.choose(near, NEAR, CFG, 0.005)  # a model that resolves 0.5%: the ~1% gain is real
    assert moved.chunks == near.chunks != a.chunks and not info["kept"]
    far = plan_equal_time(N, FAR, CFG)
    assert inc.choose(far, FAR, CFG, 0.03)[0].chunks == far.chunks
    # the incumbent is now FAR's plan: back on NEAR with a wide margin, FAR's chunks are weighed, not A's
    back, info = inc.choose(plan_equal_time(N, NEAR, CFG), NEAR, CFG, 0.5)
    assert back.chunks == far.chunks and info["kept_ms"] == pytest.approx(ttft(far.chunks, NEAR), abs=1e-3)


def test_other_prompts_and_cached_prefixes_are_their_own_incumbents():
    inc = Incumbents(max_items=2)
    inc.choose(plan_equal_time(N, A, CFG), A, CFG, 0.03)
    for n, pre in ((N, 8192), (N // 2, 0)):  # a new shape gets the new model's plan, nothing weighed
        p = plan_equal_time(n, NEAR, CFG, pre)
        assert inc.choose(p, NEAR, CFG, 0.03) == (p, None)
    assert len(inc) == 2  # the least recent (N, 0) fell out: NEAR's plan for it is taken as is
    p = plan_equal_time(N, NEAR, CFG)
    assert inc.choose(p, NEAR, CFG, 0.03) == (p, None)


@pytest.mark.parametrize("margin", [-0.01, float("nan"), float("inf")])
def test_a_bad_margin_is_refused(margin):
    with pytest.raises(ValueError, match="margin"):
        Incumbents().choose(plan_equal_time(N, A, CFG), A, CFG, margin)


def test_every_stage_keeps_and_moves_alike_through_set_model(tmp_path):
    """The sizer as the plugin drives it: requests of one length, refined models applied between them
    (online.apply calls set_model with the update's held-back error) on both stages."""
    logs = [tmp_path / f"d{r}.jsonl" for r in (0, 1)]
    runs = []
    for r in (0, 1):
        cfg = SizerConfig(policy="plan", pp_size=2, pp_rank=r, chunk_size=4096, max_prefill_tokens=16384,
                          page_size=1, context_len=1 << 20)
        s = CppChunkSizer(cfg, cost=A, log=DecisionLog(r, str(logs[r])))
        seq = [walk(s, "r0", N, 0)]
        s.set_model(NEAR, 0.03)
        seq.append(walk(s, "r1", N, 0))
        seq.append(walk(s, "r2", N // 2, 0))  # a length not seen: NEAR's own plan
        s.set_model(FAR, 0.03)
        seq.append(walk(s, "r3", N, 0))
        runs.append(seq)
    assert runs[0] == runs[1]
    a, kept, other, far = runs[0]
    assert kept == a and tuple(other) == plan_equal_time(N // 2, NEAR, CFG).chunks
    assert tuple(far) == plan_equal_time(N, FAR, CFG).chunks
    events = [[(e["event"], e["rid"]) for e in map(json.loads, p.read_text().splitlines())
               if e["event"] in ("plan_kept", "plan_moved")] for p in logs]
    assert events[0] == events[1] == [("plan_kept", "r1"), ("plan_moved", "r3")]


def test_the_refiners_error_is_its_held_back_error():
    """Refiner.error: the calibration fit's holdout error until a refit judges the model on held-back
    forwards, then that judgement (the larger over stages)."""
    rng = np.random.default_rng(3)
    grid = [(L, x) for L in (0, 1024, 2048, 3072, 4096) for x in (128, 256, 512, 1024, 2048)]
    ms = [float(A.time(L, x)) * (1 + 0.05 * rng.standard_normal()) for L, x in grid]
    calib = fit_cost_model(*zip(*grid), ms)
    r = Refiner(calib, [{"L": L, "x": x, "ms": m} for (L, x), m in zip(grid, ms)])
    assert r.error == pytest.approx(calib.fit["holdout"]["median_rel_err"])
    for _ in range(40):  # serving forwards cost NEAR: the refit follows them
        L, x = int(rng.integers(0, 8192)), int(rng.integers(128, 2048))
        r.add(0, L, x, float(NEAR.time(L, x)) * (1 + 0.02 * rng.standard_normal()))
    assert r.refit()[0].startswith("stage 0: refit accepted")
    held = list(r.stages[0].held)
    want = float(np.median([abs(float(r.model.time(L, x)) / m - 1) for L, x, m in held]))
    assert r.error == pytest.approx(want) and r.error < 0.05


def _two_regimes(chunks):
    """FAR's times with a chunk-size switch above every chunk of `chunks`: regime 0 holds them all."""
    x = PiecewiseCost((max(chunks) + 1,), (FAR, FAR), axis="x")
    return PipelineCost((x, x))


def test_a_plan_moves_only_into_chunk_sizes_whose_regimes_served_forwards_measured(tmp_path):
    """Issue 25 at 32K: refits that had measured one chunk-size regime priced another one cheap, and the move
    ran 1.40x its prediction. FAR's plan is predicted far faster than A's (beyond any margin here), and it
    moves only once served forwards measured the regime of its chunks on every stage."""
    inc = Incumbents()
    a = inc.choose(plan_equal_time(N, A, CFG), A, CFG, 0.03)[0]
    far = plan_equal_time(N, FAR, CFG)
    cost = _two_regimes(far.chunks)
    assert plan_equal_time(N, cost, CFG).chunks == far.chunks != a.chunks
    sizes = sorted(set(far.chunks))
    for measured in ([[1], [1]], [[0, 1], [1]], [[0], []]):  # some stage never measured regime 0
        kept, info = inc.choose(plan_equal_time(N, cost, CFG), cost, CFG, 0.03, measured)
        assert kept.chunks == a.chunks and info["kept"] and info["unmeasured"] == sizes
        assert info["new_ms"] < 0.8 * info["kept_ms"]  # kept for the regime, not for the margin
    moved, info = inc.choose(plan_equal_time(N, cost, CFG), cost, CFG, 0.03, [[0], [0, 1]])
    assert moved.chunks == far.chunks and not info["kept"] and "unmeasured" not in info
    assert unmeasured_chunks(far.chunks, cost, None) == []  # no refit yet: no restriction
    # the sizer as online.apply drives it: the update's measured regimes reach the choice
    s = CppChunkSizer(SizerConfig(policy="plan", pp_size=2, pp_rank=0, chunk_size=4096, max_prefill_tokens=16384,
                                  page_size=1, context_len=1 << 20), cost=A, log=DecisionLog(0, str(tmp_path / "d")))
    first = walk(s, "r0", N, 0)
    s.set_model(cost, 0.03, [[1], [1]])
    assert walk(s, "r1", N, 0) == first
    s.set_model(cost, 0.03, [[0], [0]])
    assert tuple(walk(s, "r2", N, 0)) == far.chunks


def test_the_refiner_names_the_regimes_its_served_forwards_measured_per_stage():
    x = PiecewiseCost((768,), (A, A), axis="x")
    r = Refiner(PipelineCost((x, CostModel(c0=5, b=0.02))), [])
    assert r.measured == [[], []]
    for L in (0, 1024, 2048):
        r.add(0, L, 1024, float(A.time(L, 1024)))
    assert r.measured == [[1], []] and not r.stages[0].held
    r.add(0, 4096, 512, float(A.time(4096, 512)))  # a stage's 4th forward is held back: it counts too
    assert list(r.stages[0].held) == [(4096, 512, float(A.time(4096, 512)))]
    r.add(1, 0, 100, 7.0)  # a stage without switches has one regime
    assert r.measured == [[0, 1], [0]]
