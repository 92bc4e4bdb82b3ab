"""Analytic cost model: hand-counted FLOPs, the FA form, anchors.md's physical-limit numbers, a what-if."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sglang_cpp.core.partition import default_partition
from sglang_cpp.whatif.analytic import (DEVICES, MODELS, DeviceSpec, ModelSpec, analytic_cost_model, ideal_ttft_ms,
                                 lm_head_ms, per_layer_costs, percent_of_limit, prefill_flops)
from sglang_cpp.whatif.simulator import SimConfig, simulate

# 1 FLOP per ms at efficiency 1: times in ms equal FLOP counts
TOY_DEV = DeviceSpec("toy", peak_bf16_tflops=1e-9, peak_fp8_tflops=2e-9, mem_bw_gbps=1.0, efficiency=1.0)
TINY = ModelSpec(num_layers=2, hidden_size=8, num_heads=2, num_kv_heads=1, head_dim=4, intermediate_size=16,
                 vocab_size=32, name="tiny")


def test_tiny_dense_flops_by_hand():
    L, x = 10, 6
    # per layer: q 8*2*4=64, k 8*1*4=32, v 32, o 2*4*8=64 -> 192; FFN gate/up/down 3*8*16=384 -> 576 params
    linear = 2 * x * 576  # 6912
    attn = 2 * 2 * 2 * 4 * x * (L + x / 2)  # 2*2*n_q*d_h*x*(L + x/2) = 2496
    per_layer = linear + attn  # 9408 FLOP = 9408 ms on TOY_DEV
    np.testing.assert_allclose(per_layer_costs(TINY, TOY_DEV, L, x), [per_layer, per_layer], rtol=1e-12)
    m = analytic_cost_model(TINY, TOY_DEV)
    assert m.time(L, x) == pytest.approx(2 * per_layer, rel=1e-12)
    assert analytic_cost_model(TINY, TOY_DEV, layers=1, first_layer=1).time(L, x) == pytest.approx(per_layer)
    # TP2 splits q, o, the FFN and attention; the one KV head's k and v (64 params) run on both ranks:
    # per GPU and layer 2*6*(128/2 + 64 + 384/2) + 2496/2 = 5088
    assert analytic_cost_model(TINY, TOY_DEV, tp=2).time(L, x) == pytest.approx(2 * 5088, rel=1e-12)
    assert analytic_cost_model(replace(TINY, num_kv_heads=2), TOY_DEV, tp=2).time(L, x) == pytest.approx(
        analytic_cost_model(replace(TINY, num_kv_heads=2), TOY_DEV).time(L, x) / 2, rel=1e-12)  # 2 heads: all split
    assert analytic_cost_model(TINY, replace(TOY_DEV, efficiency=0.5)).time(L, x) == pytest.approx(4 * per_layer)
    # fp8 GEMMs run at 2e-9 TFLOP/s: the linear part halves, attention (bf16) does not
    assert analytic_cost_model(TINY, TOY_DEV, dtype="fp8").time(L, x) == pytest.approx(2 * (linear / 2 + attn))
    from sglang_cpp.core.costmodel import with_overheads

    assert with_overheads(analytic_cost_model(TINY, TOY_DEV), 7.0, 1).time(L, x) == pytest.approx(2 * per_layer + 7)


def test_tiny_moe_and_mla_by_hand():
    moe = replace(TINY, num_experts=4, top_k=2, moe_intermediate_size=8, num_dense_layers=1, num_shared_experts=1)
    # layer 0 dense: 192 + 384 = 576; layer 1: router 8*4=32 + (2 routed + 1 shared)*3*8*8=576 -> 192+608 = 800
    x = 5
    np.testing.assert_allclose(per_layer_costs(moe, TOY_DEV, 0, x),
                               [2 * x * 576 + 16 * x * x, 2 * x * 800 + 16 * x * x], rtol=1e-12)
    assert moe.active_params == 576 + 800
    assert moe.total_params == 2 * 32 * 8 + 576 + (192 + 32 + (4 + 1) * 3 * 64)
    mla = replace(TINY, kv_lora_rank=4, q_lora_rank=0, qk_rope_head_dim=2, qk_nope_head_dim=2, v_head_dim=3)
    # q 8*2*(2+2)=64, kv_a 8*(4+2)=48, kv_b 4*2*(2+3)=40, o 2*3*8=48 -> 200 (+ FFN 384 = 584)
    # attention n_q*(d_qk+d_v) = 2*(4+3) = 14 per x*(2L+x); prefix rebuild 2*40 = 80 per prefix token
    L = 100
    expect = 2 * x * 584 + 14 * x * (2 * L + x) + 80 * L
    np.testing.assert_allclose(per_layer_costs(mla, TOY_DEV, L, x), [expect, expect], rtol=1e-12)
    no_rebuild = per_layer_costs(mla, TOY_DEV, L, x, mla_prefix_rebuild=False)
    np.testing.assert_allclose(no_rebuild, [expect - 80 * L] * 2, rtol=1e-12)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("dev", ["H20", "H100", "H200"])
def test_fa_form_identity(name, dev):
    m = analytic_cost_model(MODELS[name], DEVICES[dev], tp=2, include_embedding=True, include_lm_head=True)
    assert m.d == 0 and m.e == pytest.approx(2 * m.f, rel=1e-12) and m.is_fa_form
    assert (m.g > 0) == MODELS[name].is_mla
    # chunking adds no attention work: sum over a chunking of x*(2L+x) telescopes to S^2
    chunks = np.array([3000, 2000, 1500, 1000, 692])
    L = np.concatenate([[0], np.cumsum(chunks)[:-1]])
    attn = m.f * np.sum(chunks * (2 * L + chunks))
    assert attn == pytest.approx(m.f * chunks.sum() ** 2, rel=1e-12)


def test_moe_active_below_total_and_dense_equal():
    for name in ("qwen3-235b-a22b", "deepseek-v3"):
        spec = MODELS[name]
        emb = 2 * spec.vocab_size * spec.hidden_size
        assert spec.active_params < (spec.total_params - emb) / 5
    llama = MODELS["llama3-8b"]
    assert llama.active_params == llama.total_params - 2 * llama.vocab_size * llama.hidden_size
    assert 7.9e9 < llama.total_params < 8.1e9  # "8B"
    assert 225e9 < MODELS["qwen3-235b-a22b"].total_params < 240e9  # "235B"
    assert 660e9 < MODELS["deepseek-v3"].total_params < 690e9  # "671B"
    assert 20e9 < MODELS["qwen3-235b-a22b"].active_params < 24e9  # "A22B"
    assert 130e6 < MODELS["smollm2-135m"].total_params < 140e6


def test_flops_match_anchors():
    """anchors.md 2.1: F_lin 41.9 / 71.4 GFLOP per token, F_attn 1.54e6 / 2.50e6 * S^2."""
    for name, lin, att in (("qwen3-235b-a22b", 41.9e9, 1.54e6), ("deepseek-v3", 71.4e9, 2.50e6)):
        fl, fa = prefill_flops(MODELS[name], 1000)
        assert fl / 1000 == pytest.approx(lin, rel=2e-3)
        assert fa / 1000**2 == pytest.approx(att, rel=3e-3)


@pytest.mark.parametrize("S,measured,pct", [(128 * 1024, 10540, 58.5), (256 * 1024, 32680, 71.9),
                                            (512 * 1024, 114330, 80.2), (1024 * 1024, 420910, 86.0)])
def test_percent_of_limit_reproduces_anchors_table(S, measured, pct):
    q = MODELS["qwen3-235b-a22b-fp8"]
    assert percent_of_limit(measured, q, DEVICES["H20"], S, 32, tp=4, pp=8) == pytest.approx(pct, abs=0.1)


def test_ideal_ttft_cross_checks():
    h20 = DEVICES["H20"]
    assert ideal_ttft_ms(MODELS["qwen3-235b-a22b-fp8"], h20, 128 * 1024, 4) == pytest.approx(49.3e3, rel=2e-3)
    assert ideal_ttft_ms(MODELS["deepseek-v3"], h20, 128 * 1024, 8) == pytest.approx(40.2e3, rel=2e-3)
    # all-bf16 bound at 128K: 6.75 s
    assert ideal_ttft_ms(MODELS["qwen3-235b-a22b-fp8"], h20, 128 * 1024, 32, dtype="bf16") == \
        pytest.approx(6.75e3, rel=2e-3)
    with pytest.raises(ValueError, match="tp\\*pp"):
        percent_of_limit(1000, MODELS["llama3-8b"], h20, 1024, num_gpus=16, tp=4, pp=2)


def test_bad_inputs():
    with pytest.raises(ValueError, match="FP8"):
        analytic_cost_model(MODELS["llama3-8b"], DEVICES["A100"], dtype="fp8")
    with pytest.raises(ValueError, match="FP8"):
        analytic_cost_model(MODELS["deepseek-v3"], DEVICES["A100"])  # fp8 checkpoint
    assert analytic_cost_model(MODELS["deepseek-v3"], DEVICES["A100"], dtype="bf16").b > 0
    with pytest.raises(ValueError):
        analytic_cost_model(TINY, TOY_DEV, layers=3)
    with pytest.raises(ValueError):
        analytic_cost_model(TINY, TOY_DEV, tp=0)
    with pytest.raises(ValueError):
        replace(TINY, num_experts=4, top_k=5, moe_intermediate_size=8)
    with pytest.raises(ValueError):
        DeviceSpec("x", 1.0, 0.0, 1.0, efficiency=1.5)
    with pytest.raises(ValueError, match="num_hidden_layers"):
        ModelSpec.from_hf_config({"hidden_size": 8})


def test_embedding_and_lm_head_terms():
    h100 = DEVICES["H100"]
    base = analytic_cost_model(MODELS["llama3-8b"], h100, layers=2)
    both = analytic_cost_model(MODELS["llama3-8b"], h100, layers=2, include_embedding=True, include_lm_head=True)
    # lm head: one token's logits, bound by reading the 4096 x 128256 bf16 weight at 3350 GB/s
    assert both.c0 - base.c0 == pytest.approx(4096 * 128256 * 2 / 3350e9 * 1e3, rel=1e-9)
    assert lm_head_ms(MODELS["llama3-8b"], h100, tp=2) == pytest.approx((both.c0 - base.c0) / 2, rel=1e-9)
    assert both.b - base.b == pytest.approx(4096 * 2 / 3350e9 * 1e3, rel=1e-9)


QWEN3_MOE_FP8_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "decoder_sparse_step": 1, "head_dim": 128,
    "hidden_size": 4096, "intermediate_size": 12288, "mlp_only_layers": [], "moe_intermediate_size": 1536,
    "num_attention_heads": 64, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 94,
    "num_key_value_heads": 4, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 151936,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}
DEEPSEEK_V3_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "first_k_dense_replace": 3,
    "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512, "moe_intermediate_size": 2048,
    "moe_layer_freq": 1, "n_routed_experts": 256, "n_shared_experts": 1, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
    "tie_word_embeddings": False, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"},
}
LLAMA3_8B_CONFIG = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256, "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize("cfg,preset", [(QWEN3_MOE_FP8_CONFIG, "qwen3-235b-a22b-fp8"),
                                        (DEEPSEEK_V3_CONFIG, "deepseek-v3"), (LLAMA3_8B_CONFIG, "llama3-8b")])
def test_from_hf_config_matches_presets(cfg, preset):
    assert ModelSpec.from_hf_config(cfg, name=preset) == MODELS[preset]


def test_from_hf_config_rejects_interleaved_moe():
    with pytest.raises(ValueError, match="mlp_only_layers"):
        ModelSpec.from_hf_config({**QWEN3_MOE_FP8_CONFIG, "mlp_only_layers": [5, 7]})


def _qwen_pp8_costs(efficiency=0.889, chunk_overhead_ms=15.0):
    from sglang_cpp.core.costmodel import PipelineCost, with_overheads

    dev = replace(DEVICES["H20"], efficiency=efficiency)
    q, costs, first = MODELS["qwen3-235b-a22b-fp8"], [], 0
    for s, n in enumerate(default_partition(q.num_layers, 8)):
        costs.append(analytic_cost_model(q, dev, layers=n, first_layer=first, tp=4, include_embedding=s == 0,
                                         include_lm_head=s == 7))
        first += n
    return with_overheads(PipelineCost(tuple(costs)), chunk_overhead_ms, 8)


def test_what_if_qwen3_235b_pp8_tp4_32xh20():
    """128K..1M through the simulator: superlinear TTFT, never below the physical limit."""
    costs = _qwen_pp8_costs()
    q, h20 = MODELS["qwen3-235b-a22b-fp8"], DEVICES["H20"]
    cfg = SimConfig(p2p_latency_ms=0.05, p2p_bandwidth_gbps=50.0, hidden_size=q.hidden_size * 2 // 4)
    ttft = {}
    for S in (128 * 1024, 256 * 1024, 512 * 1024, 1024 * 1024):
        res = simulate([8192] * (S // 8192), costs, 8, cfg)
        ttft[S] = res.ttft_ms
        assert res.ttft_ms > ideal_ttft_ms(q, h20, S, 32)
        assert 0 < percent_of_limit(res.ttft_ms, q, h20, S, tp=4, pp=8) < 100
    ratios = [ttft[2 * S] / ttft[S] for S in (128 * 1024, 256 * 1024, 512 * 1024)]
    assert all(r > 2 for r in ratios), ratios
    assert ratios == sorted(ratios)  # tends to 4 as attention dominates
    # anchors.md 2.5's calibrated model (c = 15 ms, 88.9% efficiency) puts fixed 4K / 8K at 10.37 / 12.89 s
    for c, ref in ((4096, 10.37e3), (8192, 12.89e3)):
        assert simulate([c] * (128 * 1024 // c), costs, 8).ttft_ms == pytest.approx(ref, rel=0.05)


# -- calibration on measured TTFTs (issue 14) ----------------------------------------------------------
# Seed 004 (shared/seeds/004_26665f2ba558731c.txt): Qwen3-235B-A22B-FP8 on H20, "the baseline TTFT of
# ~55.5s (PP1 TP4)" and Table 1, PP8 TP4 with dynamic chunking (--chunked-prefill-size 18432, sigma 0.8).
BLOG_PP1_128K_S = 55.5
BLOG_TABLE1_S = {128 * 1024: 10.54, 256 * 1024: 32.68, 512 * 1024: 114.33, 1024 * 1024: 420.91}


def test_fit_on_the_pp1_point_predicts_the_blogs_table1_within_5_percent():
    """One published point without pipeline effects fixes the efficiency; the PP8 predictions come from the
    simulator running upstream's dynamic chunking, with no further fitting."""
    from sglang_cpp.whatif.analytic_fit import Measured, fit, predict_ms

    q, h20 = MODELS["qwen3-235b-a22b-fp8"], DEVICES["H20"]
    f = fit(q, h20, 4, [Measured(1, 128 * 1024, BLOG_PP1_128K_S * 1e3)])
    assert f.rows[0][1] == pytest.approx(BLOG_PP1_128K_S * 1e3, rel=1e-3)
    assert 0.5 < f.efficiency < 1.0
    dev = replace(h20, efficiency=f.efficiency)
    for S, published in BLOG_TABLE1_S.items():
        pred = predict_ms(q, dev, 4, Measured(8, S, 1.0, "quadratic", 18432, 0.8)) / 1e3
        # 1.4-3.4% off on 2026-11-25 (issue 29: a 15% band let a regression of 4x that pass); 5% is the
        # fidelity target issue 30 keeps
        assert pred == pytest.approx(published, rel=0.05), (S, pred, published)


def test_measured_point_parsing_and_fit_errors():
    from sglang_cpp.whatif.analytic_fit import Measured, fit

    m = Measured.parse("8, 128k, 10.54, quadratic, 18k, 0.8")
    assert (m.pp_size, m.input_len, m.ttft_ms, m.policy, m.chunk, m.sigma) == (8, 131072, 10540.0, "quadratic",
                                                                              18432, 0.8)
    for bad in ("8,128k", "x,128k,10", "8,128k,-1", "8,128k,10,greedy"):
        with pytest.raises(ValueError, match="--measured"):
            Measured.parse(bad)
    with pytest.raises(ValueError, match="needs two or more --measured points"):
        fit(MODELS["llama3-8b"], DEVICES["H100"], 1, [m], fit_overhead=True)
    with pytest.raises(ValueError, match="sits at a bound"):  # 1 ms for 128K tokens: faster than any peak
        fit(MODELS["llama3-8b"], DEVICES["H100"], 1, [Measured(1, 131072, 1.0)])


def test_tune_analytic_writes_a_json_that_simulate_loads(tmp_path, capsys):
    import json

    from sglang_cpp.cli import main

    rc = main(["tune", "analytic", "--analytic", "qwen3-235b-a22b-fp8", "--gpu", "H20", "--tp-size", "4",
               "--measured", "1,128k,55.5", "--pp-size", "8", "--input-lens", "128k", "--chunked-prefill-size",
               "18k", "--out-dir", str(tmp_path), "--json", str(tmp_path / "fit.json")])
    out = capsys.readouterr().out
    assert rc == 0, out
    said = float(out.split("predicted PP8 131072 tokens, quadratic C=18432: ")[1].split(" s")[0])
    (path,) = tmp_path.glob("model=qwen3-235b-a22b-fp8,pp=8,tp=4,device_name=H20,*.json")
    fit = json.loads((tmp_path / "fit.json").read_text())  # --json: what it printed, strict JSON
    assert fit["profile"] == str(path) and (fit["gpu"], fit["tp_size"], fit["pp_size"]) == ("H20", 4, 8)
    assert fit["predictions"][0]["input_len"] == 131072 and round(fit["predictions"][0]["ttft_s"], 2) == said
    (point,) = fit["points"]
    assert point["measured"] == 55.5 and 0 < fit["efficiency"] <= 1 and point["predicted"] == pytest.approx(55.5, rel=0.05)
    rc = main(["simulate", "--profile", str(path), "--pp-size", "8", "--input-len", "128k", "--policy", "quadratic",
               "--chunked-prefill-size", "18k", "--sigma", "0.8", "--json"])
    sim = json.loads(capsys.readouterr().out)
    assert rc == 0 and sim["ttft_ms"] / 1e3 == pytest.approx(said, abs=0.01)


# -- roofline ----------------------------------------------------------------------------------------
def test_roofline_rows_by_hand():
    """TINY on a device of 1000 FLOP/ms and 1 byte/ms: every term counted by hand (bf16 weights, 2 layers).
    Linear: 2*576 FLOP per token and layer vs 1152 weight bytes per layer + 64 activation and 16 KV-write
    bytes per token and layer. Attention: 16 x (2L + x) FLOP per layer vs a 16-byte KV read per prefix
    token and layer, once plus once per 128-query tile."""
    from sglang_cpp.whatif.roofline import roofline_stage

    dev = DeviceSpec("toy-mem", 1e-6, 2e-6, 1e-6, efficiency=1.0, mem_efficiency=1.0)
    st = roofline_stage(TINY, dev)

    def hand(L, x):
        lin = max(2 * 2 * 576 * x / 1000, 2 * 1152 + 2 * (64 + 16) * x)
        att = max(2 * 16 * x * (2 * L + x) / 1000, 2 * 16 * L + 2 * 16 * L * x / 128)
        return lin + att

    for L, x in [(0, 1), (0, 50_000), (10_000, 1), (10_000, 4096), (123, 77), (200_000, 300_000)]:
        assert float(st.time(L, x)) == pytest.approx(hand(L, x), rel=1e-12), (L, x)
    # the FLOP-only model is below it on this slow-memory device, and equal to it where the bytes are fast
    assert float(analytic_cost_model(TINY, dev).time(10_000, 4096)) < float(st.time(10_000, 4096))
    fast = DeviceSpec("toy-fast-mem", 1e-6, 2e-6, 1.0, efficiency=1.0, mem_efficiency=1.0)  # 1e6 bytes/ms
    assert float(roofline_stage(TINY, fast).time(10_000, 4096)) == pytest.approx(
        float(analytic_cost_model(TINY, fast).time(10_000, 4096)), rel=1e-12)


def test_expected_experts_matches_random_routing():
    """E(1 - (1 - k/E)^x) against top-k routing drawn at random (k distinct experts per token)."""
    from sglang_cpp.whatif.roofline import expected_experts

    rng = np.random.default_rng(0)
    for E, k, x in [(128, 8, 16), (128, 8, 64), (256, 8, 4), (64, 6, 40)]:
        seen = [len({int(e) for _ in range(x) for e in rng.choice(E, size=k, replace=False)}) for _ in range(400)]
        assert expected_experts(E, k, x) == pytest.approx(np.mean(seen), rel=0.02), (E, k, x)
    assert expected_experts(128, 8, 1) == pytest.approx(8) and expected_experts(128, 8, 10_000) == pytest.approx(128)
    assert expected_experts(0, 0, 100) == 0.0


def test_roofline_charges_small_moe_chunks_their_expert_reads():
    """Qwen3-235B-A22B-FP8, 12 layers on TP4 H20: a 128-token chunk reads ~98% of every layer's experts
    (fp8, a quarter per GPU), which takes longer than its FLOPs; a 16K chunk is compute-bound."""
    from sglang_cpp.whatif.roofline import roofline_stage

    q, h20 = MODELS["qwen3-235b-a22b-fp8"], DEVICES["H20"]
    H, I = 4096, 1536
    attn = 4096 * 64 * 128 * 2 + 2 * 4096 * 4 * 128
    experts = 128 * (1 - (1 - 8 / 128) ** 64)  # charged at a 64-token chunk's count
    layer = attn + 4096 * 128 + experts * 3 * H * I  # fp8: one byte per weight
    weights_ms = 12 * layer / 4 / (4000e9 * 0.8) * 1e3
    st, flops = roofline_stage(q, h20, layers=12, tp=4), analytic_cost_model(q, h20, layers=12, tp=4)
    assert weights_ms == pytest.approx(2.30, abs=0.01)
    assert float(st.time(0, 128)) > weights_ms > 1.5 * float(flops.time(0, 128))
    assert float(st.time(0, 16384)) == pytest.approx(float(flops.time(0, 16384)), rel=1e-12)


def test_roofline_json_round_trip(tmp_path):
    """A roofline stage (a maximum of rows) saves and loads as the same function of (L, x)."""
    from sglang_cpp.whatif.analytic_fit import stage_models
    from sglang_cpp.core.costmodel import PipelineCost
    from sglang_cpp.core.profile_io import load_cost, save_profile

    stages = stage_models(MODELS["qwen3-235b-a22b-fp8"], DEVICES["H20"], 4, 2)
    path = save_profile(tmp_path / "p.json", cost=PipelineCost(tuple(stages)))
    back = load_cost(path)
    L, x = np.meshgrid([0, 1000, 500_000], [64, 128, 4096, 16384])
    np.testing.assert_allclose(back.time(L, x), PipelineCost(tuple(stages)).time(L, x), rtol=1e-12)
    assert len(back.rows) == 8 and all(len(s.rows) == 4 for s in back.stages)


def test_bench_ttft_analytic_side_by_side(tmp_path, capsys):
    """One call: fixed 6K and 18K, upstream DCK 18K sigma 0.8 and the plan, at 128K and 1M, with the plan
    against DCK and each policy's percent of the physical limit; the JSONL and the PNG hold every row."""
    import json

    from sglang_cpp.cli import main

    out, png = tmp_path / "s.jsonl", tmp_path / "s.png"
    rc = main(["bench", "ttft", "--analytic", "qwen3-235b-a22b-fp8", "--gpu", "H20", "--tp-size", "4",
               "--pp-size", "8", "--efficiency", "0.3", "--input-lens", "128k,1m", "--num-requests", "1",
               "--policy", "fixed:6k,fixed:18k,quadratic:18k,plan:18k", "--sigma", "0.8",
               "--output-jsonl", str(out), "--plot", str(png)])
    text = capsys.readouterr().out
    assert rc == 0, text
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 8 and png.read_bytes()[:4] == b"\x89PNG"
    table = text.split("SIMULATED side by side: median TTFT\n")[1].splitlines()
    assert table[0].count("% of limit") == 4 and "plan / upstream dynamic" in table[0]
    for line, S in zip(table[2:4], (131072, 1048576)):
        cells = [c.strip() for c in line.strip("| ").split("|")]
        med = {r["chunk_plan"]["policy"] + str(r["simulated_setup"]["chunk_size"]): r["median_ttft_ms"]
               for r in recs if r["random_input_len"] == S}
        assert cells[0] == str(S)
        assert float(cells[5]) == pytest.approx(med["plan18432"] / med["quadratic18432"], abs=1e-3)
        # percent of the limit: T_min = FLOPs / (32 GPUs at dense peak), hand-checked at 128K in anchors.md
        lin, att = prefill_flops(MODELS["qwen3-235b-a22b-fp8"], S)
        t_min = (lin / (32e12 * 296) + att / (32e12 * 148)) * 1e3
        assert float(cells[9].rstrip("%")) == pytest.approx(100 * t_min / med["plan18432"], abs=0.06)
        assert all(r["simulated_setup"]["chunk_overhead_ms"] == 2.0 for r in recs)  # the H20 preset's


def test_plan_on_the_roofline_stops_cutting_memory_bound_chunks():
    """Qwen3-235B-A22B-FP8 PP8 TP4 on H20, 128K, no per-chunk overhead. FLOPs alone make a 64-token chunk
    nearly free, so the plan cuts >1000 of them; charged their expert reads, the plan keeps chunks above
    64 tokens, and on the roofline model it is faster than the FLOP-only plan."""
    from sglang_cpp.whatif.analytic_fit import stage_models
    from sglang_cpp.core.costmodel import PipelineCost
    from sglang_cpp.core.planner import plan_chunks

    q, h20 = MODELS["qwen3-235b-a22b-fp8"], DEVICES["H20"]
    flops, roof = stage_models(q, h20, 4, 8, roofline=False), stage_models(q, h20, 4, 8)
    ch_f = list(plan_chunks(131072, PipelineCost(tuple(flops)), 8).chunks)
    ch_r = list(plan_chunks(131072, PipelineCost(tuple(roof)), 8).chunks)
    assert len(ch_f) > 1000 and min(ch_f) <= 128
    assert len(ch_r) <= len(ch_f) / 2 and min(ch_r[:-1]) > 128
    assert simulate(ch_r, roof, 8, SimConfig()).ttft_ms < simulate(ch_f, roof, 8, SimConfig()).ttft_ms


def test_bench_side_by_side_from_the_tune_analytic_json(tmp_path, capsys):
    """`tune analytic` on the blog's PP1 point, then `bench ttft --simulate` on its JSON: the same table,
    with the percent of the physical limit (the JSON names its model and device)."""
    from sglang_cpp.cli import main

    assert main(["tune", "analytic", "--analytic", "qwen3-235b-a22b-fp8", "--gpu", "H20", "--tp-size", "4",
                 "--measured", "1,128k,55.5", "--pp-size", "8", "--out-dir", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*.json")
    capsys.readouterr()
    assert main(["bench", "ttft", "--simulate", str(path), "--pp-size", "8", "--input-lens", "128k",
                 "--num-requests", "1", "--policy", "quadratic:18k,plan:18k", "--sigma", "0.8"]) == 0
    table = capsys.readouterr().out.split("SIMULATED side by side: median TTFT\n")[1].splitlines()
    cells = [c.strip() for c in table[2].strip("| ").split("|")]
    assert table[0].count("% of limit") == 2 and cells[0] == "131072"
    # the published DCK point is 10.54 s; the fitted model predicts it within 15% (the fidelity target)
    assert float(cells[1]) == pytest.approx(10.54, rel=0.15)
    lin, att = prefill_flops(MODELS["qwen3-235b-a22b-fp8"], 131072)
    t_min = (lin / (32e12 * 296) + att / (32e12 * 148))
    assert float(cells[4].rstrip("%")) == pytest.approx(100 * t_min / float(cells[1]), abs=0.1)


# -- a measured ratio (issue 25 part 5) ---------------------------------------------------------------
def test_measured_ratio_parsing_and_errors():
    from sglang_cpp.whatif.analytic_fit import Ratio, fit

    r = Ratio.parse("8, 128k, fixed:6k/quadratic:18k:0.75, 1.105")
    assert (r.pp_size, r.input_len, r.a, r.b, r.ratio) == (8, 131072, ("fixed", 6144, 0.8),
                                                         ("quadratic", 18432, 0.75), 1.105)
    assert [p.chunk for p in r.points()] == [6144, 18432]
    for bad in ("8,128k,fixed:6k,1.1", "8,128k,fixed:6k/greedy:18k,1.1", "8,128k,fixed/quadratic:18k,1.1",
                "8,128k,fixed:6k/quadratic:18k,-1", "8,128k,fixed:6k/quadratic:18k"):
        with pytest.raises(ValueError, match="--measured-ratio"):
            Ratio.parse(bad)
    with pytest.raises(ValueError, match="fixes no time scale"):
        fit(MODELS["llama3-8b"], DEVICES["H100"], 1, [r], fit_overhead=False)


def test_fit_recovers_efficiency_and_overhead_from_one_ttft_and_one_ratio():
    """Synthetic truth (efficiency 0.6, 50 ms per chunk): its PP1 TTFT and its fixed 2K / DCK 8K ratio at PP8
    pin both parameters; a fit that ignored the ratio could not find the overhead (one TTFT fixes only one)."""
    from sglang_cpp.whatif.analytic_fit import Measured, Ratio, fit, predict

    q, h20 = MODELS["qwen3-235b-a22b-fp8"], DEVICES["H20"]
    truth = replace(h20, efficiency=0.6)
    pp1 = Measured(1, 32768, 1.0)
    pp1 = replace(pp1, ttft_ms=predict(q, truth, 4, pp1, 50.0))
    r = Ratio(8, 32768, ("fixed", 2048, 0.8), ("quadratic", 8192, 0.8), 1.0)
    r = replace(r, ratio=predict(q, truth, 4, r, 50.0))
    assert r.ratio > 1.02  # the overhead shows in the ratio: fixed 2K cuts more chunks than DCK 8K
    f = fit(q, h20, 4, [pp1, r], fit_overhead=True)
    assert f.efficiency == pytest.approx(0.6, rel=0.01)
    assert f.chunk_overhead_ms == pytest.approx(50.0, rel=0.05)
    assert f.rows[1][1] == pytest.approx(r.ratio, rel=1e-3)


def test_tune_analytic_fits_the_overhead_on_a_ttft_and_a_ratio(tmp_path, capsys):
    from sglang_cpp.cli import main

    rc = main(["tune", "analytic", "--analytic", "qwen3-235b-a22b-fp8", "--gpu", "H20", "--tp-size", "4",
               "--measured", "1,32k,8.0", "--measured-ratio", "8,32k,fixed:2k/quadratic:8k:0.8,1.08",
               "--fit-overhead", "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    line = next(ln for ln in out.splitlines() if ln.startswith("PP8 32768 tokens fixed C=2048 / quadratic C=8192"))
    measured, predicted, ratio = (float(v) for v in line.split()[-3:])
    assert measured == 1.08 and predicted == pytest.approx(1.08, abs=0.002)
    overhead = float(out.split("per-chunk overhead ")[1].split(" ms")[0])
    assert overhead > 2.0  # more than the H20 preset's: the ratio asks for a per-chunk cost


# -- the user's own model: --model-path DIR or config.json (issue 47 item 1) -----------------------------
FAMILIES = {
    "llama3-8b": {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                  "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256},
    "qwen3-235b-a22b": {"model_type": "qwen3_moe", "num_hidden_layers": 94, "hidden_size": 4096,
                        "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128,
                        "intermediate_size": 12288, "vocab_size": 151936, "num_experts": 128,
                        "num_experts_per_tok": 8, "moe_intermediate_size": 1536, "decoder_sparse_step": 1,
                        "mlp_only_layers": []},
    "deepseek-v3": {"model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168,
                    "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432,
                    "vocab_size": 129280, "n_routed_experts": 256, "num_experts_per_tok": 8,
                    "moe_intermediate_size": 2048, "first_k_dense_replace": 3, "n_shared_experts": 1,
                    "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
                    "qk_nope_head_dim": 128, "v_head_dim": 128, "quantization_config": {"quant_method": "fp8"}},
}


@pytest.mark.parametrize("preset", sorted(FAMILIES))
def test_a_users_config_is_the_model_its_preset_is(preset, tmp_path, capsys):
    """Dense GQA (llama), MoE (qwen3_moe) and MLA + MoE (deepseek_v3) configs, written here as HF writes them:
    `--model-path` a folder or its config.json gives the preset's model and the preset's simulated TTFT."""
    import dataclasses
    import json

    from sglang_cpp.cli import main as cli_main
    from sglang_cpp.whatif.analytic import MODELS, model_of

    folder = tmp_path / preset
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(FAMILIES[preset]))
    for src in (folder, folder / "config.json"):
        assert dataclasses.replace(model_of(str(src)), name=preset) == MODELS[preset]
    ttft = []
    for source in (str(folder), preset):
        assert cli_main(["simulate", "--model-path", source, "--gpu", "H100", "--tp-size", "8", "--pp-size", "4",
                         "--input-len", "32k", "--chunked-prefill-size", "8192", "--json"]) == 0
        ttft.append(json.loads(capsys.readouterr().out)["ttft_ms"])
    assert ttft[0] == pytest.approx(ttft[1], rel=1e-9) and ttft[0] > 0


@pytest.mark.parametrize("content,msg", [
    (None, "neither a preset"),
    ("{not json", "is not readable JSON"),
    ({"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 32000,
      "sliding_window": 4096, "max_position_embeddings": 32768}, "sliding_window=4096"),
    ({"hidden_size": 4096}, "missing or bad key"),
])
def test_a_config_the_model_cannot_price_is_one_line_naming_the_flag(content, msg, tmp_path, capsys):
    import json

    from sglang_cpp.cli import main as cli_main

    path = tmp_path / "m" / "config.json"
    if content is not None:
        path.parent.mkdir()
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    rc = cli_main(["simulate", "--model-path", str(path.parent), "--gpu", "H100", "--pp-size", "2",
                   "--input-len", "8k", "--chunked-prefill-size", "4096"])
    err = capsys.readouterr().err
    assert rc == 2 and msg in err and "--model-path" in err and "Traceback" not in err


def test_plan_takes_the_users_model_as_simulate_does(tmp_path, capsys):
    """Issue 47 item 1: `plan` had no analytic mode. With --model-path (a preset or a config.json) and
    --device it plans on the same per-stage models `simulate` runs, with the device's per-chunk cost by
    default; without --device it says which devices there are."""
    import json

    from sglang_cpp.cli import main as cli_main
    from sglang_cpp.core.costmodel import PipelineCost, with_overheads
    from sglang_cpp.core.policy import plan_for
    from sglang_cpp.whatif.analytic_fit import stage_models

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(FAMILIES["llama3-8b"]))
    argv = ["plan", "--model-path", str(cfg), "--gpu", "H100", "--tp-size", "2", "--pp-size", "4",
            "--input-len", "64k", "--chunked-prefill-size", "8192", "--json"]
    assert cli_main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    cost = with_overheads(PipelineCost(tuple(stage_models(MODELS["llama3-8b"], DEVICES["H100"], 2, 4, None))),
                          DEVICES["H100"].chunk_overhead_ms, 4)  # the preset's per-chunk overhead, carried by the cost
    want = plan_for("plan", 65536, cost, 4, 8192, max_prefill=16384)
    assert got["chunks"] == list(want.chunks) and got["pred_ms"] == pytest.approx(list(want.pred_ms), rel=1e-12)
    assert cli_main(argv[:3] + argv[5:]) == 2
    assert "an analytic model needs --gpu: one of" in capsys.readouterr().err


def test_the_device_is_required_and_matched_in_any_case(capsys):
    """Issue 47 item 1: --analytic without --device silently meant H100; presets are case-insensitive."""
    import json

    from sglang_cpp.cli import main as cli_main

    base = ["simulate", "--analytic", "llama3-8b", "--pp-size", "2", "--input-len", "8k", "--json"]
    assert cli_main(base) == 2
    assert "an analytic model needs --gpu: one of" in capsys.readouterr().err
    ttft = []
    for dev in ("h20", "H20"):
        assert cli_main(base + ["--gpu", dev]) == 0
        ttft.append(json.loads(capsys.readouterr().out)["ttft_ms"])
    assert ttft[0] == ttft[1]
    assert cli_main(base + ["--gpu", "B300x"]) == 2
    assert "--gpu 'B300x': choose one of" in capsys.readouterr().err


def test_b200_and_mi300x_presets_carry_their_datasheet_figures_and_price_a_chunk_by_them():
    """Issue 47 item 1: B200 (DGX B200 datasheet, per GPU) and MI300X (AMD Instinct MI300X datasheet), matched in
    any case; a compute-bound chunk on them costs what their dense BF16 peaks say against an H100's."""
    from sglang_cpp.whatif.analytic import MODELS, analytic_cost_model, device_of

    b200, mi = device_of("b200"), device_of("mi300x")
    assert (b200.peak_bf16_tflops, b200.peak_fp8_tflops, b200.mem_bw_gbps, b200.mem_gb) == (2250.0, 4500.0, 8000.0, 180.0)
    assert (mi.peak_bf16_tflops, mi.peak_fp8_tflops, mi.mem_bw_gbps, mi.mem_gb) == (1307.4, 2614.9, 5300.0, 192.0)
    h100 = device_of("H100")
    m = MODELS["llama3-8b"]
    for dev, peak in ((b200, 2250.0), (mi, 1307.4)):
        ratio = analytic_cost_model(m, dev, dtype="bf16").time(0, 16384) / analytic_cost_model(m, h100, dtype="bf16").time(0, 16384)
        assert abs(float(ratio) - 989.0 / peak) < 1e-9  # FLOPs only: no overhead, one efficiency
