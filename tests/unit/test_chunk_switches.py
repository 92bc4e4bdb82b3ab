"""A cost model piecewise in the chunk size x (core/regimes.py, axis "x"): the CPU flash kernel's query-block
switches (plugin/startup/switches.py), fitted with one prefix-attention coefficient per regime, planned around,
calibrated on both sides and refitted online with the same switches."""
from __future__ import annotations

import numpy as np
import pytest

from sglang_cpp.core.costmodel import CostModel, PiecewiseCost, PipelineCost, add_constant, fit_cost_model, model_from_dict
from sglang_cpp.core.profile_io import cost_from_profile
from sglang_cpp.core.planner import plan_chunks
from sglang_cpp.core.objective import ttft
from sglang_cpp.core.refine import RefineConfig, Refiner
from sglang_cpp.core.regimes import CPU_FLASH_SWITCHES, largest_x, regime_rows
from sglang_cpp.core.calib_grid import calibration_grid

# long-llama's stage on the AVX512 testbed (its 32K calibration, fitted per chunk regime), with the CPU flash
# kernel's measured cost per query over a long prefix (results/flash_split.md): 1.65x below 192 queries,
# 1.27x below 768
BASE = dict(c0=11.0, g=1.1e-4, b=0.274, d=2.7e-7, f=7.2e-5)
E = 1.067e-4
FAST = CostModel(**BASE, e=E)
CPU = PiecewiseCost(CPU_FLASH_SWITCHES, (CostModel(**BASE, e=1.65 * E), CostModel(**BASE, e=1.27 * E), FAST),
                    ("q-block 32", "q-block 64", "q-block 256"), axis="x")


def test_a_chunk_is_priced_in_the_regime_of_its_own_size_by_hand_formula():
    L = 20000
    by_hand = lambda x, e: 11.0 + 1.1e-4 * L + 0.274 * x + 2.7e-7 * L * L + e * L * x + 7.2e-5 * x * x  # noqa: E731
    xs = np.array([128, 191, 192, 767, 768, 4096])
    want = [by_hand(128, 1.65 * E), by_hand(191, 1.65 * E), by_hand(192, 1.27 * E), by_hand(767, 1.27 * E),
            by_hand(768, E), by_hand(4096, E)]
    assert CPU.time(L, xs) == pytest.approx(want)
    assert CPU.time(L, 767) > CPU.time(L, 768)  # not monotone in x: a chunk below the switch costs more
    assert list(CPU.regime(xs)) == [0, 0, 1, 1, 2, 2]


def test_the_largest_chunk_within_a_time_looks_in_every_regime():
    # regime roots 100 / 700 / 700: 700 < 768 does not reach the last regime, 700 >= 192 reaches the middle
    assert largest_x([100.0, 700.0, 700.0], (192, 768)) == pytest.approx(700.0)
    # 900 in the middle regime is capped below its switch; the last regime's 800 is larger
    assert largest_x([150.0, 900.0, 800.0], (192, 768)) == pytest.approx(800.0)
    assert largest_x([150.0, 900.0, 700.0], (192, 768)) == pytest.approx(768 - 1e-6)
    assert largest_x([0.0, 0.0, 0.0], (192, 768)) == 0.0
    for T in (200.0, 2000.0, 9000.0):  # the model's own answer is a chunk within T, and the largest on a grid
        x = CPU.max_chunk_for(20000, T)
        grid = np.arange(1, 8192)
        ok = grid[CPU.time(20000, grid) <= T]
        assert CPU.time(20000, x) <= T * (1 + 1e-9) and x == pytest.approx(ok.max(), abs=1.0)


def test_bad_nesting_and_axes_are_refused():
    with pytest.raises(ValueError, match="axis 'y'"):
        PiecewiseCost((768,), (FAST, FAST), axis="y")
    with pytest.raises(ValueError, match="nest x inside L"):
        PiecewiseCost((768,), (FAST, PiecewiseCost((1,), (FAST, FAST))), axis="x")


def test_it_round_trips_through_json_nested_in_prefix_regimes_and_takes_an_overhead():
    nested = PiecewiseCost((8192,), (CPU, add_constant(CPU, 2.0)))
    pipe = PipelineCost((nested, add_constant(nested, 1.5)))
    back = model_from_dict(pipe.to_dict())
    L, x = np.array([0, 100, 9000, 30000, 30000]), np.array([512, 64, 2048, 700, 768])
    assert back.time(L, x) == pytest.approx(pipe.time(L, x))
    assert back.stages[0].models[1].axis == "x" and back.stages[0].models[1].bounds == CPU_FLASH_SWITCHES
    assert back.stage_times(30000, 700)[1] == pytest.approx(CPU.time(30000, 700) + 2.0 + 1.5)


def _samples(model, Ls, xs, noise=0.01, seed=0):
    rng = np.random.default_rng(seed)
    pts = [(L, x) for L in Ls for x in xs]
    return ([p[0] for p in pts], [p[1] for p in pts],
            [float(model.time(L, x)) * (1 + noise * rng.standard_normal()) for L, x in pts])


def test_one_prefix_attention_coefficient_per_chunk_regime_is_recovered():
    L, x, ms = _samples(CPU, [0, 2048, 4096, 8192, 16384, 24576, 28672], [64, 384, 2048, 4096])
    fit = fit_cost_model(L, x, ms, x_bounds=CPU_FLASH_SWITCHES)
    assert isinstance(fit, PiecewiseCost) and fit.axis == "x" and fit.bounds == CPU_FLASH_SWITCHES
    es = [m.e for m in fit.models]
    assert es == pytest.approx([1.65 * E, 1.27 * E, E], rel=0.05)
    assert len({(m.c0, m.g, m.b, m.d, m.f) for m in fit.models}) == 1  # the rest is shared
    one = fit_cost_model(L, x, ms)  # one polynomial through the switches misprices the middle regime
    grid = [(a, b) for a in (8000, 20000, 30000) for b in (256, 512, 700, 1024, 3000)]
    err = lambda m: max(abs(m.time(a, b) / CPU.time(a, b) - 1) for a, b in grid)  # noqa: E731
    assert err(fit) < 0.03 and err(one) > 0.06


def test_a_regime_nothing_sampled_over_a_prefix_is_priced_by_the_one_below():
    L, x, ms = _samples(CPU, [0, 2048, 8192, 16384], [64, 1024, 4096])  # nothing in [192, 768)
    fit = fit_cost_model(L, x, ms, x_bounds=CPU_FLASH_SWITCHES)
    assert fit.bounds == (768,) and fit.models[0].fit["chunk_switches"] == [768]


def test_one_size_per_regime_cannot_separate_the_terms_and_is_refused():
    """With one chunk size per regime the data fix only each regime's L slope g + e_j x_j: any split of g
    and the e_j fits as well, so the fit refuses instead of picking one."""
    L, x, ms = _samples(CPU, [0, 2048, 8192, 16384], [64, 384, 2048], noise=0.0)
    with pytest.raises(ValueError, match=r"need at least 4 distinct chunk sizes .* hold 3 \(\[64, 384, 2048\]\)"):
        fit_cost_model(L, x, ms, x_bounds=CPU_FLASH_SWITCHES)


def test_a_profile_with_chunk_switches_is_fitted_per_stage_with_them():
    L, x, ms = _samples(CPU, [0, 2048, 4096, 8192, 16384], [64, 384, 1280, 2048], noise=0.0)
    doc = {"meta": {"chunk_switches": [192, 768]},
           "samples": [{"L": a, "x": b, "ms": c * (1 + s), "stage": s} for s in (0, 1) for a, b, c in zip(L, x, ms)]}
    cost = cost_from_profile(doc)
    assert all(isinstance(m, PiecewiseCost) and m.axis == "x" for m in cost.stages)
    assert cost.stages[1].time(16000, 512) == pytest.approx(2 * CPU.time(16000, 512), rel=0.01)


@pytest.mark.parametrize("base", [BASE, dict(c0=2.0, g=0.0, b=0.274, d=0.0, f=5.3e-5)])
@pytest.mark.parametrize("n", [16384, 32768])
def test_the_plan_keeps_off_the_dear_chunk_sizes_and_beats_the_switch_blind_plan(base, n):
    """The switch-blind plan (the fast regime everywhere, as one polynomial would have it) cuts chunks
    below 768; priced by the kernel's real regimes it loses by more than 5% to the plan that sees them."""
    fast = CostModel(**base, e=E)
    cpu = PiecewiseCost(CPU_FLASH_SWITCHES, (CostModel(**base, e=1.65 * E), CostModel(**base, e=1.27 * E), fast),
                        axis="x")
    real = PipelineCost((cpu, cpu))
    aware = plan_chunks(n, real, 2, max_chunk=8192, align=64)
    blind = plan_chunks(n, PipelineCost((fast, fast)), 2, max_chunk=8192, align=64)
    assert any(c < 768 for c in blind.chunks[:-1])  # the scenario bites
    assert all(c >= 768 for c in aware.chunks[:-1]) and sum(aware.chunks) == n
    assert ttft(list(blind.chunks), 0, real, 2) > 1.05 * ttft(list(aware.chunks), 0, real, 2)
    starts = np.concatenate([[0], np.cumsum(aware.chunks)[:-1]])  # the plan's times: each chunk in its regime
    assert list(aware.pred_ms) == pytest.approx(list(real.time(starts, np.array(aware.chunks))))


def test_the_equal_time_plan_on_chunk_regimes_is_within_2pct_of_the_exact_dp():
    """Seeded random stages with the CPU kernel's switches and random per-regime penalties, PP 2-4,
    prompts of 2-6K behind random cached prefixes."""
    rng = np.random.default_rng(768)
    worst = 0.0
    for _ in range(8):
        base = dict(c0=float(rng.uniform(1, 15)), g=float(rng.uniform(0, 2e-4)), b=float(rng.uniform(0.05, 0.3)),
                    d=float(rng.uniform(0, 3e-7)), f=float(rng.uniform(3e-5, 8e-5)))
        e = float(rng.uniform(5e-5, 2e-4))
        pen = sorted(rng.uniform(1.0, 1.8, 2), reverse=True)
        cost = PiecewiseCost(CPU_FLASH_SWITCHES, (CostModel(**base, e=pen[0] * e), CostModel(**base, e=pen[1] * e),
                                                  CostModel(**base, e=e)), axis="x")
        P, n, prefix = int(rng.integers(2, 5)), int(rng.integers(2048, 6144)), int(rng.choice([0, rng.integers(0, 8192)]))
        kw = dict(max_chunk=2048, align=64, prefix_len=prefix)
        et = plan_chunks(prefix + n, cost, P, **kw)
        dp = plan_chunks(prefix + n, cost, P, method="dp", **kw)
        assert sum(et.chunks) == n
        worst = max(worst, ttft(list(et.chunks), prefix, cost, P) / ttft(list(dp.chunks), prefix, cost, P))
    assert 1.0 <= worst <= 1.02


def test_regime_rows_of_a_pipeline_piecewise_in_both_axes():
    nested = PiecewiseCost((8192,), (CPU, FAST))
    rr = regime_rows(PipelineCost((nested, FAST)))
    assert rr.bounds == CPU_FLASH_SWITCHES and len(rr.parts) == 3
    assert rr.parts[1].bounds == (8192,)
    assert list(rr.parts[1].at(0)[0]) == [11.0, 1.1e-4, 0.274, 2.7e-7, 1.27 * E, 7.2e-5]
    assert list(rr.parts[1].at(9000)[0]) == list(rr.parts[2].at(9000)[0])  # past 8192 no chunk switch


def test_online_refinement_refits_with_the_same_chunk_switches():
    calib = [{"L": a, "x": b, "ms": c, "stage": 0}
             for a, b, c in zip(*_samples(CPU, [0, 2048, 8192, 16384], [64, 384, 1280, 2048]))]
    start = cost_from_profile({"samples": calib, "meta": {"chunk_switches": [192, 768]}})
    r = Refiner(start, calib, cfg=RefineConfig(min_new=4, holdback=2))
    truth = PiecewiseCost(CPU.bounds, tuple(CostModel(**{**m.coeffs, "c0": m.c0 * 1.5}) for m in CPU.models),
                          axis="x")  # serving costs more per step than calibration measured
    for L, x in [(a, b) for a in (1024, 6000, 12000, 20000) for b in (128, 512, 1024, 3000)]:
        r.add(0, L, x, float(truth.time(L, x)))
    notes = r.refit()
    assert any("accepted" in n for n in notes), notes
    assert isinstance(r.model, PiecewiseCost) and r.model.axis == "x" and r.model.bounds == CPU_FLASH_SWITCHES


@pytest.mark.parametrize("M,cap,lo", [(32768, 8192, 0), (8192, 4096, 0), (16384, 2048, 256), (4096, 512, 0)])
def test_the_grid_measures_every_chunk_regime_at_every_prefix(M, cap, lo):
    pts = calibration_grid(M, 64, cap, lo, chunk_switches=CPU_FLASH_SWITCHES)
    lo_ = max(64, lo)
    for L in sorted({p[0] for p in pts}):
        xs = [x for a, x in pts if a == L]
        hi = max(xs)
        for start, end in ((0, 192), (192, 768), (768, 1 << 30)):
            if max(start, lo_) <= min(end - 1, hi):  # the regime lies within this prefix's chunk range
                assert any(start <= x < end for x in xs), (L, xs, start)
    assert set(calibration_grid(M, 64, cap, lo)) <= set(pts)  # the plain grid is kept, regimes added


def test_the_largest_regime_takes_its_first_size_as_its_second_sample():
    """Issue 26: the largest regime's second sample is its first aligned size (768 on the CPU kernel), the
    cheapest forward that still separates g from e_j, not the geometric middle (1792 at a 4096 top)."""
    pts = calibration_grid(32768, 64, 4096, 0, chunk_switches=CPU_FLASH_SWITCHES)
    assert [x for L, x in pts if L == 16384] == [64, 512, 768, 4096]
    # a prefix whose range already holds two sizes in the largest regime gets no third
    assert [x for L, x in calibration_grid(32768, 64, 2048, 768, chunk_switches=CPU_FLASH_SWITCHES)
            if L == 16384] == [768, 1280, 2048]
