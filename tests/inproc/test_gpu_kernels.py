"""examples/gpu/kernels.py and kernels_report.py (the torch-only GPU step): the report's fit verdicts, FLOP
counts and small-chunk ratios on samples written by hand, and the measurement's code path on CPU at toy sizes."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

GPU = Path(__file__).resolve().parents[2] / "examples" / "gpu"
TINY_MOE = dict(num_experts=8, top_k=2, moe_intermediate_size=32, num_shared_experts=1)
TINY_MLA = dict(kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16)


def _load(name: str):
    sys.path.insert(0, str(GPU))
    spec = importlib.util.spec_from_file_location(name, GPU / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses resolve their annotations through it
    spec.loader.exec_module(mod)
    return mod


def _t(L, x):  # a FlashAttention-shaped stage: c0 + b x + f x (2L + x), in ms
    return 1.0 + 0.01 * x + 1e-7 * x * (2 * L + x)


def _doc(gpu: str = "NVIDIA H100 80GB HBM3") -> dict:
    spec = {"num_layers": 8, "hidden_size": 2048, "num_heads": 16, "num_kv_heads": 4, "head_dim": 128,
            "intermediate_size": 5632, "vocab_size": 32000, "name": "check-llama"}
    grid = [{"L": L, "x": x, "kind": "grid", "ms": _t(L, x), "spread": (_t(L, x), _t(L, x))}
            for L in (0, 16384, 32768, 65536, 98304) for x in (1024, 2048, 4096, 8192, 16384)]
    small = [{"L": L, "x": x, "kind": "small", "ms": _t(L, x), "spread": (_t(L, x), _t(L, x)),
              "linear_ms": 0.01 * x, "attention_ms": 1e-7 * x * (2 * L + x)}
             for L in (0, 65536) for x in (512, 1024, 6144, 18432)]
    return {"env": {"gpu": gpu, "torch": "2.11", "cuda": "13.0", "python": "3.12", "date": "2026-11-26"},
            "config": {"repeats": 5}, "command": "python examples/gpu/kernels.py", "commit": "abc1234",
            "shapes": [{"shape": "check-llama", "spec": spec, "layers": 8,
                        "attention": {"backend": "FLASH_ATTENTION", "gqa": True, "kv_heads": 4},
                        "samples": grid + small}]}


def test_the_report_fits_a_flash_shaped_stage_and_counts_flops_and_small_chunk_cost_by_hand():
    rep = _load("kernels_report")
    text, verdicts = rep.report(_doc(), "abc1234", "python examples/gpu/kernels_report.py x.json")
    (shape, v), = verdicts
    assert shape == "check-llama" and v["fa_ok"] and v["fa_share"] < 0.01 and v["predict_ok"]
    assert abs(v["e_over_f"] - 2.0) < 0.05 and abs(v["c0_ms"] - 1.0) < 0.05
    for L in (0, 65536):  # GEMMs and attention exactly proportional to their FLOPs: the analytic model at the
        # 18432 row's efficiencies is t - c0, so measured / analytic = t / (t - 1), above 1.05 only while t < 21
        assert abs(v[f"analytic_6k_L{L}"] - _t(L, 6144) / (_t(L, 6144) - 1.0)) < 1e-9
    # t(0, 1024) = 11.3 ms, t(0, 6144) = 66.2 ms; t(65536, 512) = 12.9 ms, t(65536, 1024) = 24.8 ms
    assert v["knee_L0"] == 6144 and v["knee_L65536"] == 1024
    # GEMM FLOPs of one check-llama layer: q, o 2 * 2048 * 2048; k, v 2 * 2048 * 512; FFN 3 * 2048 * 5632
    params = 2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 5632
    gemm = 2 * 1024 * params * 8 / (0.01 * 1024) / 1e9 / 989.0  # x = 1024 on the H100's dense bf16 peak
    attn = 16 * 256 * 1024 * (2 * 65536 + 1024) * 8 / (1e-7 * 1024 * (2 * 65536 + 1024)) / 1e9 / 989.0
    row = next(r for r in text.splitlines() if r.startswith("| 1024 |") and f"{attn:.1%}" in r)
    assert f"{gemm:.1%}" in row
    assert "NVIDIA H100 80GB HBM3" in text and "abc1234" in text and "FLASH_ATTENTION" in text


def _mla_doc(slow: float) -> dict:
    """One TP rank's share of a tiny fp8 MLA + MoE checkpoint whose GEMMs and attention take exactly their FLOPs
    counted by hand at a fixed rate, the whole forward `slow` times their sum."""
    spec = {"num_layers": 4, "hidden_size": 64, "num_heads": 2, "num_kv_heads": 2, "head_dim": 24,
            "intermediate_size": 128, "vocab_size": 100, "num_experts": 8, "top_k": 2, "moe_intermediate_size": 32,
            "num_shared_experts": 1, "weight_bytes": 1, "name": "tiny-mla", **TINY_MLA}
    # per layer: q_a 64*48 + q_b 48*2*24, kv_a 64*(32+8), kv_b 32*2*(16+16), o 2*16*64; router 64*8 and
    # (top-2 + 1 shared) SwiGLU experts 3*3*64*32
    params, kv_b = 64 * 48 + 48 * 2 * 24 + 64 * 40 + 2048 + 2 * 16 * 64 + 64 * 8 + 3 * 3 * 64 * 32, 2048
    rows = []
    for L in (0, 65536):
        for x in (512, 1024, 6144, 18432):
            lin = 2 * (2 * x * params + 2 * L * kv_b) / 1e9  # 2 layers at 1 GFLOP per ms
            att = 2 * 2 * (24 + 16) * x * (2 * L + x) / 2e9  # attention at half that rate
            rows.append({"L": L, "x": x, "kind": "small", "ms": slow * (lin + att),
                         "spread": (slow * (lin + att),) * 2, "linear_ms": lin, "attention_ms": att})
    grid = [{"L": L, "x": x, "kind": "grid", "ms": _t(L, x), "spread": (_t(L, x), _t(L, x))}
            for L in (0, 16384, 32768, 65536, 98304) for x in (1024, 2048, 4096, 8192, 16384)]
    return {**_doc("NVIDIA H200"), "shapes": [{"shape": "tiny-mla", "spec": spec, "layers": 2, "tp": 8,
            "attention": {"backend": "FLASH_ATTENTION", "gqa": False, "kv_heads": 2, "pad_v": True},
            "moe_kernel": "grouped_mm", "samples": grid + rows}]}


def test_an_fp8_mla_stage_is_priced_as_the_bf16_kernels_ran_with_its_prefix_rebuilt_once():
    """The GPU run of 2026-11-27 (DeepSeek-V3's TP8 share) read 1.55x the analytic model at its own reference
    row: the report priced an fp8 checkpoint's GEMMs at the fp8 peak while kernels.py runs bf16, and counted the
    chunk's own tokens through kv_b twice. A stage whose parts take exactly their FLOPs is 1.000x everywhere."""
    rep = _load("kernels_report")
    text, ((_, v),) = rep.report(_mla_doc(1.0), "abc1234", "cmd")
    for L in (0, 65536):
        assert abs(v[f"analytic_6k_L{L}"] - 1.0) < 1e-9 and v[f"knee_L{L}"] == 512
    assert "MLA" in text and "one TP8 rank's share" in text
    _, ((_, slow),) = rep.report(_mla_doc(1.5), "abc1234", "cmd")  # 1.5x everywhere: no chunk within 5%
    assert slow["knee_L0"] is None and abs(slow["analytic_6k_L0"] - 1.5) < 1e-9


def test_the_written_report_brings_each_shapes_profile_beside_it(tmp_path):
    """check.py's kernels step and the report script write the same files: the report and, per shape, a
    profile that `bench ttft --simulate` prices chunks with (what the lent GPU runs must bring back)."""
    from sglang_cpp.core.profile_io import load_cost

    rep = _load("kernels_report")
    md = tmp_path / "out" / "gpu_kernels.md"
    text, verdicts, profiles = rep.write_report(_doc(), md, "abc1234", "python examples/gpu/kernels_report.py x")
    assert md.read_text() == text and [s for s, _ in verdicts] == ["check-llama"]
    assert profiles == [tmp_path / "out" / "gpu_kernels-check-llama.profile.json"]
    cost = load_cost(profiles[0])  # fitted on the 25 grid samples of _t alone, not the small-chunk rows
    for L, x in ((0, 1024), (32768, 4096), (98304, 16384)):
        assert abs(float(cost.time(L, x)) / _t(L, x) - 1.0) < 0.01


def test_the_report_names_no_efficiency_for_a_gpu_without_a_preset():
    rep = _load("kernels_report")
    assert rep.device_spec("NVIDIA H200").name == "H200" and rep.device_spec("NVIDIA H20").name == "H20"
    assert rep.device_spec("Tesla T4") is None
    text, _ = rep.report(_doc("Tesla T4"), "abc1234", "cmd")
    assert "| 1024 |" in text and "| — | — | — |" in text


def test_the_measurement_runs_every_configured_point_on_cpu_at_toy_sizes():
    torch = pytest.importorskip("torch")
    ker = _load("kernels")
    from sglang_cpp.whatif.analytic import ModelSpec

    cfg = ker.KernelsConfig(max_len=256, chunks=(16, 32), prefixes=(0, 64, 224), small=(16, 48),
                            small_prefixes=(0, 128), repeats=2, warmup=1)
    tiny = (ModelSpec(2, 64, 4, 2, 16, 128, 100, name="tiny"), 2)
    out = ker.measure_shape(torch, "tiny", cfg, "cpu", progress=lambda *a, **k: None, shape=tiny)
    got = {(s["L"], s["x"], s["kind"]) for s in out["samples"]}
    assert got == {(0, 16, "grid"), (0, 32, "grid"), (64, 16, "grid"), (64, 32, "grid"), (224, 16, "grid"),
                   (224, 32, "grid"), (0, 16, "small"), (0, 48, "small"), (128, 16, "small"), (128, 48, "small")}
    assert out["attention"]["backend"] in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION") and out["layers"] == 2
    for s in out["samples"]:
        assert s["ms"] > 0 and s["spread"][0] <= s["ms"] <= s["spread"][1]
        assert ("linear_ms" in s and s["linear_ms"] > 0 and s["attention_ms"] > 0) == (s["kind"] == "small")


@pytest.mark.parametrize("mla", [False, True], ids=["moe", "mla-moe"])
def test_moe_and_mla_stages_run_every_configured_point_on_cpu_at_toy_sizes(mla):
    """Issue 44 item 3: the blog's stage kinds (MoE with GQA; MLA, its prefix rebuilt from the latent cache,
    with MoE) measured as one TP rank's share, at toy sizes on CPU (a smoke run, not a measurement)."""
    torch = pytest.importorskip("torch")
    ker = _load("kernels")
    from sglang_cpp.whatif.analytic import ModelSpec

    cfg = ker.KernelsConfig(max_len=256, chunks=(16, 32), prefixes=(0, 224), small=(16,), small_prefixes=(128,),
                            repeats=1, warmup=1)
    spec = ModelSpec(2, 64, 4, 4 if mla else 2, 24 if mla else 16, 128, 100, **TINY_MOE, **(TINY_MLA if mla else {}),
                     name="tiny")
    out = ker.measure_shape(torch, "tiny", cfg, "cpu", progress=lambda *a, **k: None, shape=(spec, 2, 2))
    assert out["tp"] == 2 and out["spec"]["num_heads"] == 2 and out["spec"]["moe_intermediate_size"] == 16
    assert out["moe_kernel"] in ("grouped_mm", "per-expert loop")
    assert {(s["L"], s["x"], s["kind"]) for s in out["samples"]} == {
        (0, 16, "grid"), (0, 32, "grid"), (224, 16, "grid"), (224, 32, "grid"), (128, 16, "small")}
    for s in out["samples"]:
        assert s["ms"] > 0


def test_the_moe_layer_routes_each_token_to_its_top_k_experts_weighted_by_the_router():
    """kernels_layers.mlp against a per-token loop written here: each token's output is the router-weighted sum
    of its top-k experts' SwiGLU plus the shared expert's; the grouped GEMM (where torch runs it) and the
    per-expert loop agree with it."""
    torch = pytest.importorskip("torch")
    kl = _load("kernels_layers")
    from sglang_cpp.whatif.analytic import ModelSpec

    spec = ModelSpec(2, 32, 4, 2, 8, 64, 100, num_experts=4, top_k=2, moe_intermediate_size=16, num_shared_experts=1)
    g = torch.Generator().manual_seed(1)
    w = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.bfloat16) * 0.3  # noqa: E731
    lay = kl.make_layer(torch, spec, w, 64, {"kv_heads": 2})
    a = w(10, 32)
    F = torch.nn.functional

    def swiglu(h, gu, down):
        gate, up = (h.float() @ gu.float()).chunk(2, dim=-1)
        return (F.silu(gate) * up) @ down.float()

    prob = torch.softmax(a.float() @ lay["router"].float(), dim=-1)
    want = torch.stack([sum(prob[t, e] * swiglu(a[t:t + 1], lay["gu_e"][e], lay["down_e"][e])[0]
                            for e in prob[t].topk(2).indices.tolist()) for t in range(10)])
    want = want + swiglu(a, lay["gu"], lay["down"])
    for grouped in {None, kl.pick_grouped_mm(torch, "cpu")}:
        got = kl.mlp(torch, spec, lay, a, grouped).float()
        assert torch.allclose(got, want, rtol=0.05, atol=0.05 * float(want.abs().max())), grouped
