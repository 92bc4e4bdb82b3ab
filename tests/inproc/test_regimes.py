"""A cost model piecewise in the prefix L (core/regimes.py), and the kernel switches it is cut at
(plugin/startup/switches.py): the fit, the planner, the simulator, online refinement and the calibration grid."""
from __future__ import annotations

import numpy as np
import pytest

from sglang_cpp.core.costmodel import CostModel, PiecewiseCost, PipelineCost, add_constant, fit_piecewise, model_from_dict, with_overheads
from sglang_cpp.core.profile_io import cost_from_profile
from sglang_cpp.core.planner import plan_chunks
from sglang_cpp.core.objective import ttft
from sglang_cpp.core.regimes import regime_rows

# DeepSeek-like on flashinfer: fresh chunks as MHA, absorbed MLA below 8192 (a dearer attention, no
# rebuild), MHA above it (a cheaper attention, but the prefix's latents re-projected: a g*L term)
FRESH = CostModel.fa(a=2e-6, b=0.02, c0=3.0)
ABSORBED = CostModel.fa(a=6e-6, b=0.03, c0=3.0)
REBUILD = CostModel.fa(a=2e-6, b=0.02, c0=3.0, g=0.004)
DSV = PiecewiseCost((1, 8192), (FRESH, ABSORBED, REBUILD), ("mha", "mla-absorbed", "mha-one-shot"))


def test_a_chunk_is_priced_in_the_regime_of_the_prefix_it_starts_at():
    L = np.array([0, 1, 4096, 8191, 8192, 20000])
    x = np.full(6, 1024)
    want = [FRESH.time(0, 1024), ABSORBED.time(1, 1024), ABSORBED.time(4096, 1024), ABSORBED.time(8191, 1024),
            REBUILD.time(8192, 1024), REBUILD.time(20000, 1024)]
    assert DSV.time(L, x) == pytest.approx(want)
    assert DSV.time(8192, 1024) == pytest.approx(REBUILD.time(8192, 1024))  # scalars stay scalars
    assert list(DSV.regime(L)) == [0, 1, 1, 1, 2, 2]


@pytest.mark.parametrize("bounds,models,match", [((8192, 1), (FRESH, ABSORBED, REBUILD), "strictly increasing"),
                                                 ((0,), (FRESH, ABSORBED), "strictly increasing"),
                                                 ((1, 8192), (FRESH, ABSORBED), "need 3 regime models")])
def test_bad_regimes_are_refused_with_the_reason(bounds, models, match):
    with pytest.raises(ValueError, match=match):
        PiecewiseCost(bounds, models)


def test_it_round_trips_through_json_inside_a_pipeline_and_takes_an_overhead_in_every_regime():
    pipe = PipelineCost((DSV, add_constant(DSV, 1.5)))
    back = model_from_dict(pipe.to_dict())
    L, x = np.array([0, 100, 9000, 30000]), np.array([512, 512, 2048, 64])
    assert back.time(L, x) == pytest.approx(pipe.time(L, x))
    assert back.stage_times(L, x)[1] == pytest.approx(DSV.time(L, x) + 1.5)
    assert back.stages[0].names == DSV.names and back.stages[0].bounds == (1, 8192)
    with pytest.raises(TypeError, match="regime_rows"):
        pipe.rows  # noqa: B018  (a piecewise stage has no fixed rows: the planner must not use them)


def _samples(model, Ls, xs, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    pts = [(L, x) for L in Ls for x in xs]
    ms = [float(model.time(L, x)) * (1 + noise * rng.standard_normal()) for L, x in pts]
    return [p[0] for p in pts], [p[1] for p in pts], ms


def test_one_fit_per_regime_recovers_each_side_where_one_polynomial_cannot():
    Ls = [0, 64, 2048, 4096, 8128, 8192, 12288, 16384, 24576, 28672]
    L, x, ms = _samples(DSV, Ls, [64, 256, 512, 2048, 4096], noise=0.01)
    pw = fit_piecewise(L, x, ms, (1, 8192))
    one = cost_from_profile({"samples": [{"L": a, "x": b, "ms": c, "stage": 0} for a, b, c in zip(L, x, ms)]})
    grid = [(a, b) for a in (0, 1024, 6144, 8192, 16000, 30000) for b in (256, 1024, 3072)]
    err = lambda m: np.median([abs(m.time(a, b) / DSV.time(a, b) - 1) for a, b in grid])  # noqa: E731
    assert err(pw) < 0.02 and err(one) > 0.05
    with pytest.raises(ValueError, match=r"regime 2 \(prefix in \[8192, inf\)\): no sample"):
        fit_piecewise(*_samples(DSV, [0, 64, 2048, 4096], [64, 256, 512, 1024, 2048]), (1, 8192))


def test_a_profile_with_regime_bounds_is_fitted_per_regime_per_stage():
    L, x, ms = _samples(DSV, [0, 64, 2048, 4096, 8192, 12288, 16384], [64, 256, 512, 1024, 2048])
    doc = {"meta": {"regime_bounds": [1, 8192], "regime_names": ["mha", "mla-absorbed", "mha-one-shot"]},
           "samples": [{"L": a, "x": b, "ms": c * (1 + s), "stage": s} for s in (0, 1) for a, b, c in zip(L, x, ms)]}
    cost = cost_from_profile(doc)
    assert isinstance(cost, PipelineCost) and all(isinstance(m, PiecewiseCost) for m in cost.stages)
    assert cost.stages[1].names[2] == "mha-one-shot"
    assert cost.stages[1].time(12288, 512) == pytest.approx(2 * DSV.time(12288, 512), rel=0.01)


def test_the_equal_time_plan_on_regimes_is_within_1pct_of_the_exact_dp():
    """Seeded random three-regime stages (fresh MHA, absorbed MLA, MHA with a prefix rebuild), the
    switch at 2K-8K, PP 2-8, prompts up to 12K behind random cached prefixes, overheads up to 5 ms: the search that inlines polynomial rows picks each chunk's regime right."""
    rng = np.random.default_rng(26)
    worst = 0.0
    for _ in range(10):
        fresh, absorbed, mha = (float(v) for v in rng.uniform(1e-6, 3e-5, 3))
        thr = int(rng.choice([2048, 4096, 8192]))
        stage = PiecewiseCost((1, thr), (CostModel.fa(a=fresh, b=0.05, c0=3.0),
                                         CostModel.fa(a=absorbed, b=rng.uniform(0.03, 0.3), c0=rng.uniform(1, 20)),
                                         CostModel.fa(a=mha, b=rng.uniform(0.03, 0.3), c0=rng.uniform(1, 20),
                                                      g=float(rng.uniform(0, 0.01)))))
        cost, o = stage, float(rng.uniform(0, 5))  # equal stages: the DP's objective is the makespan
        P, n, prefix = int(rng.integers(2, 9)), int(rng.integers(2048, 12288)), int(rng.choice([0, rng.integers(0, 8192)]))
        cost = with_overheads(stage, o, P)  # the per-chunk overhead on the cost
        kw = dict(max_chunk=2048, align=64, prefix_len=prefix)
        et = plan_chunks(prefix + n, cost, P, **kw)
        dp = plan_chunks(prefix + n, cost, P, method="dp", **kw)
        assert sum(et.chunks) == n
        worst = max(worst, ttft(list(et.chunks), prefix, cost, P) / ttft(list(dp.chunks), prefix, cost, P))
        starts = prefix + np.concatenate([[0], np.cumsum(et.chunks)[:-1]])  # the plan's times: each in its regime
        assert list(et.pred_ms) == pytest.approx(list(cost.time(starts, np.array(et.chunks))))
    assert 1.0 <= worst <= 1.01


def test_the_planner_sees_the_switch():
    """Past the switch every chunk re-pays the prefix rebuild (g L): the plan on the regimes cuts fewer,
    larger chunks there than the plan on the absorbed regime alone, and is predicted faster on the real cost."""
    plain = PiecewiseCost((1,), (FRESH, ABSORBED))
    cost = PiecewiseCost((1, 8192), (FRESH, ABSORBED, CostModel.fa(a=2e-6, b=0.02, c0=3.0, g=0.05)))
    n = 65536
    ours = plan_chunks(n, cost, 4, max_chunk=16384)
    blind = plan_chunks(n, plain, 4, max_chunk=16384)
    tail = lambda p: [c for c, s in zip(p.chunks, np.cumsum((0,) + p.chunks[:-1])) if s >= 8192]  # noqa: E731
    assert len(tail(ours)) < len(tail(blind))
    assert ttft(list(ours.chunks), 0, cost, 4) < 0.97 * ttft(list(blind.chunks), 0, cost, 4)


def test_regime_rows_hold_each_interval_padded_to_one_row_count():
    pipe = PipelineCost((DSV, ABSORBED))
    rr = regime_rows(pipe)
    assert rr.bounds == (1, 8192) and rr.table.shape == (3, 2, 6)
    assert list(rr.at(0)[0]) == [FRESH.c0, FRESH.g, FRESH.b, FRESH.d, FRESH.e, FRESH.f]
    assert list(rr.at(9000)[0]) == [REBUILD.c0, REBUILD.g, REBUILD.b, REBUILD.d, REBUILD.e, REBUILD.f]
    assert list(rr.at(9000)[1]) == [ABSORBED.c0, ABSORBED.g, ABSORBED.b, ABSORBED.d, ABSORBED.e, ABSORBED.f]


def test_the_simulator_prices_each_chunk_in_its_regime():
    from sglang_cpp.whatif.simulator import simulate

    chunks = [4096, 4096, 8192, 8192]
    r = simulate(chunks, [DSV, DSV], pp_size=2)
    t = [DSV.time(L, x) for L, x in zip((0, 4096, 8192, 16384), chunks)]
    # two equal stages, free P2P: sum + (P-1) max
    assert r.ttft_ms == pytest.approx(sum(t) + max(t))


def test_online_refinement_refits_every_regime_and_keeps_the_switches():
    from sglang_cpp.core.refine import Refiner

    calib = PiecewiseCost(DSV.bounds, (FRESH, ABSORBED, FRESH), DSV.names)  # no rebuild measured above the switch
    L, x, ms = _samples(calib, [0, 64, 2048, 4096, 8192, 12288, 16384], [64, 256, 512, 1024, 2048])
    r = Refiner(calib, [{"L": a, "x": b, "ms": c} for a, b, c in zip(L, x, ms)])
    rng = np.random.default_rng(0)
    for _ in range(200):  # serving shows the rebuild that the calibration missed above the switch
        a, b = int(rng.integers(8192, 30000)), int(rng.integers(256, 4096))
        r.add(0, a, b, float(DSV.time(a, b)))
    notes = r.refit()
    assert r.version == 1 and notes[0].startswith("stage 0: refit accepted"), notes
    new = r.model
    assert isinstance(new, PiecewiseCost) and new.bounds == DSV.bounds and new.names == DSV.names
    err = lambda m: abs(m.time(20000, 1024) / DSV.time(20000, 1024) - 1)  # noqa: E731
    assert err(new) < 0.5 * err(calib)  # the calibration's samples stay in the fit: halfway there, not all
    assert new.time(4096, 1024) == pytest.approx(ABSORBED.time(4096, 1024), rel=1e-6)  # below: untouched


# -- the switches SGLang 0.5.23 makes, and the calibration that samples both sides ---------------------
@pytest.mark.parametrize("backend,cpc,bounds", [
    ("flashinfer", True, (1, 8192, 131072)), ("fa3", True, (1, 8192, 131072)), ("fa3", False, (1,)),
    ("triton", True, (1,)), ("torch_native", True, (1,)), ("trtllm_mla", True, ()), ("trtllm_mla", False, (1,)),
    ("aiter", True, (131072,)), ("dsa", True, ())])
def test_mla_switches_follow_sglangs_dispatch(backend, cpc, bounds):
    from sglang_cpp.core.regimes import mla_switches

    b, names = mla_switches(backend, 8192, 131072, cpc)
    assert b == bounds and len(names) == (len(b) + 1 if b else 0)


def test_a_switch_past_the_calibration_target_is_dropped_loudly(caplog):
    from sglang_cpp.core.calib_grid import calibrated_switches

    names = ("mha", "mla-absorbed", "mha-one-shot", "mha-chunked-kv")
    with caplog.at_level("WARNING", logger="sglang_cpp"):
        b, n = calibrated_switches((1, 8192, 131072), names, 32768, 64)
    assert b == (1, 8192) and n == names[:3]
    assert "131072" in caplog.text and "SGLANG_CPP_CALIB_MAX_LEN" in caplog.text
    assert calibrated_switches((1, 8192), names[:3], 8192 + 64 * 2, 64)[0] == (1,)  # two units past: too few


@pytest.mark.parametrize("M,switches", [(32768, (1, 8192)), (16384, (1,)), (1024, (1,)), (131072, (1, 8192, 65536))])
def test_the_grid_samples_every_regime_enough_to_fit_it(M, switches):
    from sglang_cpp.core.calib_grid import calibration_grid

    pts = calibration_grid(M, 64, 16384, 0, switches)
    assert all(L + x <= M and L % 64 == 0 and x % 64 == 0 for L, x in pts)
    edges = (0,) + switches + (M + 1,)
    for lo, hi in zip(edges, edges[1:]):
        inside = [(L, x) for L, x in pts if lo <= L < hi]
        if hi == 1:  # fresh prefills alone: a 1-D fit, 5 samples of distinct sizes
            assert len({x for _, x in inside}) >= 5
        else:
            assert len({L for L, _ in inside}) >= 3 and len({x for _, x in inside}) >= 2
    # and the fit on the grid works in every regime
    fit_piecewise(*zip(*[(L, x, float(DSV.time(L, x))) for L, x in pts]), switches)


def test_no_switch_leaves_the_grid_as_it_was():
    from sglang_cpp.core.calib_grid import calibration_grid

    assert calibration_grid(32768, 64, 16384, 0, ()) == calibration_grid(32768, 64, 16384, 0)
    Ls = sorted({L for L, _ in calibration_grid(32768, 64, 16384)})
    assert Ls == [0, 4096, 8192, 16384, 24576, 28672]


# -- the analytic model: MLA's regimes at blog scale ----------------------------------------------------
def test_analytic_mla_stages_switch_where_sglang_does_by_hand_formula():
    """DeepSeek-V3 on fa3: absorbed MLA below 8192 (no prefix rebuild; attention over the latent,
    n_q (2 kv_lora + d_rope) FLOPs per unit of x(2L + x) instead of n_q (d_qk + d_v)), MHA over the rebuilt
    prefix from 8192 on (what the model priced everywhere before), MHA on a fresh chunk."""
    from sglang_cpp.whatif.analytic import DEVICES, MODELS
    from sglang_cpp.whatif.analytic_fit import stage_models

    ds, h20 = MODELS["deepseek-v3"], DEVICES["H20"]
    plain = stage_models(ds, h20, 8, 4, roofline=False)
    fa3 = stage_models(ds, h20, 8, 4, roofline=False, attention_backend="fa3")
    for old, new in zip(plain, fa3):
        assert isinstance(new, PiecewiseCost) and new.bounds == (1, 8192, 131072)
        fresh, absorbed, one_shot, chunked = new.models
        assert one_shot.coeffs == old.coeffs and chunked.coeffs == old.coeffs and fresh.coeffs == old.coeffs
        assert absorbed.g == 0 and old.g > 0 and absorbed.b == old.b
        assert absorbed.f / old.f == pytest.approx((2 * 512 + 64) / (192 + 128))
    assert stage_models(ds, h20, 8, 4, attention_backend="triton")[0].bounds == (1,)
    qwen = stage_models(MODELS["qwen3-235b-a22b"], h20, 4, 8, attention_backend="fa3")
    assert not any(isinstance(m, PiecewiseCost) for m in qwen)  # no MLA: no switch


def test_the_plan_on_mla_regimes_is_no_worse_than_the_plan_blind_to_them():
    """Priced on the regimes (roofline stages, PP4 x TP8 on H20, 64K), the plan made on them beats the plan made
    on the MHA-everywhere model by more than 3%: the switch is information the planner uses."""
    from sglang_cpp.whatif.analytic import DEVICES, MODELS
    from sglang_cpp.whatif.analytic_fit import stage_models

    ds, h20 = MODELS["deepseek-v3"], DEVICES["H20"]
    true = with_overheads(PipelineCost(tuple(stage_models(ds, h20, 8, 4, attention_backend="fa3"))), 2.0, 4)
    blind = with_overheads(PipelineCost(tuple(stage_models(ds, h20, 8, 4))), 2.0, 4)
    kw = dict(max_chunk=16384)
    ours, theirs = plan_chunks(65536, true, 4, **kw), plan_chunks(65536, blind, 4, **kw)
    assert sum(ours.chunks) == sum(theirs.chunks) == 65536
    cost = lambda p: ttft(list(p.chunks), 0, true, 4)  # noqa: E731
    assert cost(ours) < 0.97 * cost(theirs)  # a planner blind to the regimes cuts the blind plan (0.94x here)


CASES = [dict(backend=b, chunked_prefix_cache=c) for b in ("flashinfer", "fa3", "flashmla", "fa4", "intel_xpu",
                                                           "trtllm_mla", "aiter", "triton", "torch_native")
         for c in (True, False)]
CASES += [dict(backend=b, deterministic=True) for b in ("fa3", "fa4", "triton", "flashinfer")]
CASES += [dict(backend=b, disable_ragged=True) for b in ("flashinfer", "flashmla", "fa3")]
CASES += [dict(backend=b, cp=True) for b in ("flashinfer", "fa3", "triton", "aiter")]
CASES += [dict(backend=b, captured_prefill=True) for b in ("flashinfer", "fa3", "trtllm_mla", "triton")]
CASES += [dict(backend="fa4", sm100=False), dict(backend="flashinfer", threshold=1 << 20),
          dict(backend="fa3", threshold=1), dict(backend="fa4", threshold=1 << 20)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_mla_switches_agree_with_sglangs_own_handler_at_every_prefix(case, monkeypatch):
    """Issue 45 item 7: SGLang 0.5.23's MLA dispatch itself (`AttentionBackendRegistry`, with its predicates
    set through the names it reads) run on a single request's extend at prefixes across every switch: one
    regime of the table never holds two methods, and a regime's name says the method (absorbed MLA, one-shot
    MHA over a prefix, chunked-KV MHA)."""
    from types import SimpleNamespace

    import sglang.srt.models.deepseek_common.attention_backend_handler as h
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import AttnForwardMethod as M

    from sglang_cpp.core.regimes import mla_switches, regime_index

    kw = {"chunked_prefix_cache": True, "deterministic": False, "disable_ragged": False, "cp": False,
          "captured_prefill": False, "sm100": True, "threshold": 8192, **case}
    backend, threshold, capacity, x = kw.pop("backend"), kw.pop("threshold"), 131072, 64
    monkeypatch.setattr(h, "get_exec", lambda: SimpleNamespace(
        deterministic=SimpleNamespace(enable_deterministic_inference=kw["deterministic"])))
    monkeypatch.setattr(h, "get_platform", lambda: SimpleNamespace(is_sm100_or_sm110=kw["sm100"]))
    monkeypatch.setattr(h, "get_parallel", lambda: SimpleNamespace(dcp_enabled=False))
    monkeypatch.setattr(h, "is_cp_active", lambda fb: kw["cp"])
    monkeypatch.setattr(h, "is_in_tc_piecewise_cuda_graph", lambda: kw["captured_prefill"])
    monkeypatch.setattr(h, "is_in_breakable_cuda_graph", lambda: False)
    attn = SimpleNamespace(flashinfer_mla_disable_ragged=kw["disable_ragged"], qk_rope_head_dim=64,
                           chunked_prefix_cache_threshold=threshold,
                           disable_chunked_prefix_cache=not kw["chunked_prefix_cache"])
    mode = SimpleNamespace(is_extend_without_speculative=lambda: True, is_extend=lambda: True,
                           is_decode=lambda: False, is_target_verify=lambda: False, is_draft_extend_v2=lambda: False)
    handler = h.AttentionBackendRegistry.get_handler(backend)

    def method(L):
        fb = SimpleNamespace(forward_mode=mode, extend_prefix_lens_cpu=[L], seq_lens_cpu=[L + x],
                             get_max_chunk_capacity=lambda: capacity)
        return handler(attn, fb)

    bounds, names = mla_switches(backend, threshold, capacity, **kw)
    prefixes = sorted({0, 1, 64, 4096, threshold - 64, threshold, threshold + 64, 65536, capacity - 4 * x,
                       capacity + 64, 4 * capacity} - {b for b in bounds} | set(bounds))
    prefixes = [L for L in prefixes if L >= 0 and not capacity - x < L < capacity]  # L + x straddles it
    seen = {}
    for L in prefixes:
        r, m = int(regime_index(bounds, [L])[0]) if bounds else 0, method(L)
        assert seen.setdefault(r, m) == m, f"regime {r} runs {seen[r]} and {m} (L={L})"
        if names and r > 0:
            want = {"mla-absorbed": {M.MLA}, "mha-one-shot": {M.MHA_ONE_SHOT, M.MHA},
                    "mha-chunked-kv": {M.MHA_CHUNKED_KV}}[names[r]]
            assert m in want, (L, names[r], m)
    if not bounds:
        assert len(set(seen.values())) == 1


def test_the_plugin_reads_the_mla_dispatch_predicates_where_sglang_does(monkeypatch):
    """plugin/switches._dispatch_predicates reads what attention_backend_handler.py reads: get_exec()'s
    deterministic flag and flashinfer_mla_disable_ragged (forward_mla.py:141-144), the model's rope dims,
    MLA prefill CP (layers/cp/utils.py) and the platform's SM100/110 test."""
    from types import SimpleNamespace

    import sglang.srt.layers.cp.utils as cpu
    import sglang.srt.runtime_context as rc

    from sglang_cpp.plugin.startup.switches import _dispatch_predicates

    def read(det=False, ragged_off=False, rope=64, cp=False, sm100=False):
        monkeypatch.setattr(rc, "get_exec", lambda: SimpleNamespace(
            deterministic=SimpleNamespace(enable_deterministic_inference=det),
            kernel=SimpleNamespace(flashinfer_mla_disable_ragged=ragged_off)))
        monkeypatch.setattr(rc, "get_platform", lambda: SimpleNamespace(is_sm100_or_sm110=sm100))
        monkeypatch.setattr(cpu, "is_mla_cp_enabled", lambda: cp)
        sched = SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace(qk_rope_head_dim=rope)))
        return _dispatch_predicates(sched)

    assert read() == {"deterministic": False, "disable_ragged": False, "cp": False, "sm100": False}
    assert read(det=True)["deterministic"] and read(ragged_off=True)["disable_ragged"]
    assert read(rope=0)["disable_ragged"] and read(cp=True)["cp"] and read(sm100=True)["sm100"]


def test_a_captured_prefill_graph_that_holds_every_planned_chunk_prices_absorbed_mla_everywhere(monkeypatch, caplog):
    """Issue 45 item 7: SGLang 0.5.23 replays chunks of up to max_num_tokens (over contexts up to the smaller of
    max_context_size and max_seq_len, padded to the next captured bucket by at most 2x) in the captured prefill
    graph, where its MLA dispatch pins absorbed MLA (attention_backend_handler.py:109-112) for the tc_piecewise and
    breakable graphs; a full graph fixes the method at capture. Not tc_piecewise under DP attention (the extending
    rank votes no; breakable graphs replay there, idle ranks padding), nor under a CP strategy the graph did not
    capture, nor when the stages' graphs differ. The stand-ins carry the attributes
    prefill_cuda_graph_runner.py:348-387 sets. Every planned chunk captured: one method at every prefix; some: the
    eager regimes and one WARNING naming both limits."""
    from types import SimpleNamespace

    import sglang.srt.layers.cp.utils as cpu
    import sglang.srt.layers.moe.utils as moe_utils
    import sglang.srt.mem_cache.kv_cache_builder as kvb
    import sglang.srt.runtime_context as rc
    from sglang.srt.layers.moe.utils import MoeA2ABackend
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_cpp.core.regimes import captured_everywhere, mla_switches
    from sglang_cpp.plugin.startup import switches

    class PrefillCudaGraphRunner(SimpleNamespace):
        pass

    class EagerRunner(SimpleNamespace):
        pass

    def runner(graphs):
        return SimpleNamespace(prefill_cuda_graph_runner=graphs)

    dense = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    pcg = PrefillCudaGraphRunner(max_num_tokens=16384, max_context_size=None, max_seq_len=None,
                                 prefill_backend_name="tc_piecewise", capture_num_tokens=list(dense))
    assert switches.captured_prefill(runner(pcg)) == (16384, None, dense, "tc_piecewise")
    bcg = PrefillCudaGraphRunner(max_num_tokens=4096, max_context_size=65536, max_seq_len=32768,
                                 prefill_backend_name="breakable", capture_num_tokens=[4096, 1024, 2048])
    assert switches.captured_prefill(runner(bcg)) == (4096, 32768, (1024, 2048, 4096), "breakable")
    full = PrefillCudaGraphRunner(max_num_tokens=16384, max_context_size=None, max_seq_len=None,
                                  prefill_backend_name="full", capture_num_tokens=list(dense))
    switches._WARNED.clear()
    with caplog.at_level("WARNING", logger="sglang_cpp"):  # read on every rank whatever the model: no MLA warning
        assert switches.captured_prefill(runner(full)) == (16384, None, dense, "full")
    assert "full prefill CUDA graph" not in caplog.text
    assert switches.captured_prefill(runner(None)) is None
    assert switches.captured_prefill(runner(EagerRunner(max_num_tokens=8))) is None
    assert captured_everywhere(16384, None, 16384, 131072) and not captured_everywhere(16384, None, 16385, 131072)
    assert not captured_everywhere(16384, 65536, 8192, 131072) and captured_everywhere(16384, 131072, 8192, 131072)
    # padding: a 3000-token chunk pads to 8192 (2.7x) with buckets (512, 8192): eager; 64-token chunks pad to 512
    assert captured_everywhere(16384, None, 16384, 131072, dense, smallest_chunk=64)
    assert not captured_everywhere(8192, None, 8192, 131072, (512, 8192), smallest_chunk=256)
    assert not captured_everywhere(8192, None, 8192, 131072, (512, 1024, 2048, 4096, 8192), smallest_chunk=64)

    par = SimpleNamespace(attn_dp_enabled=False)
    monkeypatch.setattr(rc, "max_prefill_buffer_tokens", lambda: 16384)
    monkeypatch.setattr(rc, "get_parallel", lambda: par)
    monkeypatch.setattr(cpu, "get_cp_strategy", lambda: None)
    sched = SimpleNamespace(model_config=SimpleNamespace(context_len=131072), page_size=64)
    monkeypatch.setattr(switches, "CAPTURED", None)
    assert switches._captured_everywhere(sched, runner(pcg)) is True
    assert mla_switches("fa3", captured_prefill=True) == ((), ())
    with caplog.at_level("WARNING", logger="sglang_cpp"):  # a full graph holding every chunk: still eager pricing
        assert switches._captured_everywhere(sched, runner(full)) is False
    assert "full prefill CUDA graph fixes the attention method at capture" in caplog.text
    monkeypatch.setattr(switches, "CAPTURED", [switches.captured_prefill(runner(pcg))] * 2)
    assert switches._captured_everywhere(sched, runner(pcg)) is True  # both stages alike
    monkeypatch.setattr(switches, "CAPTURED", [switches.captured_prefill(runner(pcg)), None])
    assert switches._captured_everywhere(sched, runner(pcg)) is False  # PP1 runs eager
    monkeypatch.setattr(switches, "CAPTURED", None)
    par.attn_dp_enabled = True
    assert switches._captured_everywhere(sched, runner(pcg)) is False  # DP: the extending rank votes no (tc_piecewise)
    bcg_all = PrefillCudaGraphRunner(max_num_tokens=16384, max_context_size=None, max_seq_len=None,
                                     prefill_backend_name="breakable", capture_num_tokens=list(dense))
    monkeypatch.setattr(moe_utils, "get_moe_a2a_backend", lambda: a2a[0])
    monkeypatch.setattr(rc, "get_exec", lambda: SimpleNamespace(overlap=SimpleNamespace(enable_two_batch_overlap=tbo[0])))
    monkeypatch.setattr(rc, "get_memory", lambda: SimpleNamespace(enable_hisparse=False))
    monkeypatch.setattr(kvb, "uses_ssm_state", lambda mc: False)
    a2a, tbo = [MoeA2ABackend.NONE], [False]
    assert switches._captured_everywhere(sched, runner(bcg_all)) is True  # breakable: idle DP ranks pad and replay
    # a decoding DP peer votes no on every step under these server settings (dp_attn.py:411-436): priced eager
    switches._WARNED.clear()
    caplog.clear()
    with caplog.at_level("WARNING", logger="sglang_cpp"):
        a2a[0] = MoeA2ABackend.DEEPEP
        assert switches._captured_everywhere(sched, runner(bcg_all)) is False
        a2a[0], tbo[0] = MoeA2ABackend.NONE, True
        assert switches._captured_everywhere(sched, runner(bcg_all)) is False
        tbo[0] = False
        sched.spec_algorithm = SpeculativeAlgorithm.EAGLE
        assert switches._captured_everywhere(sched, runner(bcg_all)) is False
        sched.spec_algorithm = SpeculativeAlgorithm.NONE
        assert switches._captured_everywhere(sched, runner(bcg_all)) is True
    warned = [r.getMessage() for r in caplog.records if "votes no here" in r.getMessage()]
    assert len(warned) == 1 and "the MoE all-to-all backend deepep" in warned[0]  # once per server, the first reason
    small = [r.getMessage() for r in caplog.records if "decodes at least" in r.getMessage()]
    assert len(small) == 1 and "decodes at least 32 requests" in small[0] and "bucket (64 tokens)" in small[0]
    # LoRA: under DP attention every rank with a batch votes no (dp_attn.py:469); without DP only a graph captured
    # with LoRA replays LoRA batches
    caplog.clear()
    with caplog.at_level("WARNING", logger="sglang_cpp"):
        bcg_all.enable_lora, bcg_all._capture_lora = True, True
        assert switches._captured_everywhere(sched, runner(bcg_all)) is False
        par.attn_dp_enabled = False
        assert switches._captured_everywhere(sched, runner(bcg_all)) is True
        bcg_all._capture_lora = False
        assert switches._captured_everywhere(sched, runner(bcg_all)) is False
        bcg_all.enable_lora = False
    assert sum("--enable-lora" in r.getMessage() for r in caplog.records) == 1
    monkeypatch.setattr(cpu, "get_cp_strategy", lambda: "zigzag")
    assert switches._captured_everywhere(sched, runner(pcg)) is False  # CP without a captured CP body
    monkeypatch.setattr(cpu, "get_cp_strategy", lambda: None)
    switches._WARNED.clear()
    caplog.clear()
    with caplog.at_level("WARNING", logger="sglang_cpp"):
        assert switches._captured_everywhere(sched, runner(bcg)) is False
        assert switches._captured_everywhere(sched, runner(bcg)) is False  # once per server
    warned = [r.getMessage() for r in caplog.records if "replay the captured prefill CUDA graph" in r.getMessage()]
    assert len(warned) == 1 and "4096 tokens over contexts of up to 32768" in warned[0] and "16384" in warned[0]
