"""results/gpu_kernels.md from what kernels.py measured (pure numpy/scipy: runs on any machine).

Per shape: the t(L, x) fit over the (L, x) grid, its FlashAttention shape (check.py's verdicts) and held-out
error; and the small-chunk table: per-token cost and GEMM / attention efficiency against x, beside what the
analytic model (one constant efficiency per kernel family) predicts when its efficiencies are set from the
largest chunk. The gap at small x is what the analytic model misses there (issue 25 item 5).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE)]

from check import FA_SHARE, PREDICT_ERR, _fit, fa_share, split_error  # noqa: E402
from sglang_cpp.whatif.analytic import DEVICES, ModelSpec, analytic_cost_model  # noqa: E402

BLOG_SMALL = 6144  # the blog's fixed 6K chunk
KNEE = 1.05  # measured / analytic above this: the constant-efficiency model under-prices the chunk


def device_spec(gpu: str):
    """The analytic preset for a GPU name ('NVIDIA H100 80GB HBM3' -> H100), or None."""
    for key in ("H200", "H100", "H20", "A100", "L20"):  # H200 before H20, H100 before H20
        if key in gpu:
            return DEVICES[key]
    return None


def flops(spec: ModelSpec, layers: int, L: float, x: float) -> tuple[float, float]:
    """(GEMM FLOPs, attention-core FLOPs) of one forward of `layers` layers, as the analytic model counts them;
    MLA adds the prefix's K/V rebuilt from the latent cache (kv_b_proj over the L prefix tokens every chunk: the
    chunk's own x tokens are in layer_params already)."""
    gemm = 2.0 * x * spec.layer_params(0)
    if spec.is_mla:
        gemm += 2.0 * L * spec.kv_b_params
    return gemm * layers, float(spec.attn_coef) * x * (2 * L + x) * layers


def shape_section(sh: dict, dev) -> tuple[list[str], dict]:
    spec = ModelSpec(**{**sh["spec"], "num_kv_heads": sh["attention"]["kv_heads"]})
    layers, rows = sh["layers"], sh["samples"]
    grid = [r for r in rows if r["kind"] == "grid"]
    model = _fit(grid)
    longest = max(grid, key=lambda s: (s["L"] + s["x"], s["x"]))
    share = fa_share(model, longest["L"], longest["x"])
    err, n = split_error(grid, _fit)
    ef = model.e / model.f if model.f else math.inf
    verdicts = {"fa_share": share, "fa_ok": share <= FA_SHARE, "predict_err": err, "predict_ok": err <= PREDICT_ERR,
                "e_over_f": ef, "c0_ms": model.c0}
    att = sh["attention"]
    out = [f"## {sh['shape']}: {layers} layers of hidden {spec.hidden_size}, {spec.num_heads} query heads / "
           f"{spec.num_kv_heads} KV heads ({'GQA' if att['gqa'] else 'K/V per query head'}) of {spec.head_dim}, "
           + (f"MoE {spec.num_experts} experts top-{spec.top_k} of {spec.moe_intermediate_size} "
            f"({sh.get('moe_kernel', '?')}){', MLA' if spec.is_mla else ''}" if spec.num_experts else
            f"FFN {spec.intermediate_size}") + f"; attention kernel {att['backend']}"
           + (f"; one TP{sh['tp']} rank's share" if sh.get("tp", 1) > 1 else ""), "",
           f"- fit over {len(grid)} (L, x) samples (x {min(r['x'] for r in grid)}-{max(r['x'] for r in grid)}, "
           f"L + x up to {max(r['L'] + r['x'] for r in grid)}): {model}",
           f"- FlashAttention shape: d L^2 is {share:.1%} of t at L={longest['L']}, x={longest['x']} (check.py's "
           f"bound {FA_SHARE:.0%}: {'PASS' if verdicts['fa_ok'] else 'FAIL'}); e/f = {ef:.2f} (FlashAttention: 2)",
           f"- held out: a model fitted on half the samples predicts the other half within {err:.1%} (median of "
           f"{n}; check.py's bound {PREDICT_ERR:.0%}: {'PASS' if verdicts['predict_ok'] else 'FAIL'})",
           f"- fixed cost per forward (c0, eager torch: launches, norms, no scheduler or P2P): {model.c0:.3f} ms", ""]
    small = [r for r in rows if r["kind"] == "small"]
    peak = dev.peak_bf16_tflops if dev else None
    for L in sorted({r["L"] for r in small}):
        at = sorted((r for r in small if r["L"] == L), key=lambda r: r["x"])
        big = at[-1]
        f_lin, f_att = flops(spec, layers, L, big["x"])
        eff = (f_lin / big["linear_ms"] / 1e9 / peak, f_att / big["attention_ms"] / 1e9 / peak) if peak else None
        # dtype bf16: kernels.py runs bf16 GEMMs also for an fp8 checkpoint (DeepSeek-V3), whose analytic default is fp8
        ana = (analytic_cost_model(spec, replace(dev, efficiency=min(eff[0], 1.0), attn_efficiency=min(eff[1], 1.0)),
                                   layers=layers, dtype="bf16") if peak else None)
        out += [f"Small chunks at prefix L = {L} (median of {sh.get('repeats', 'the')} forwards; efficiency = "
                f"the analytic model's FLOPs / time / {dev.name if dev else '?'} dense bf16 peak "
                f"{peak if peak else '?'} TFLOP/s; 'analytic' uses the efficiencies of the x = {big['x']} row):", "",
                "| x | ms (min-max) | ms per 1K tokens | per token vs x = %d | GEMM eff | attention eff | "
                "measured / analytic |" % big["x"], "|---:|---:|---:|---:|---:|---:|---:|"]
        for r in at:
            fl, fa = flops(spec, layers, L, r["x"])
            per = r["ms"] / r["x"] * 1e3
            cells = [f"{r['x']}", f"{r['ms']:.3f} ({r['spread'][0]:.3f}-{r['spread'][1]:.3f})", f"{per:.3f}",
                     f"{per / (big['ms'] / big['x'] * 1e3):.3f}"]
            if peak:
                cells += [f"{fl / r['linear_ms'] / 1e9 / peak:.1%}", f"{fa / r['attention_ms'] / 1e9 / peak:.1%}",
                          f"{r['ms'] / float(ana.time(L, r['x'])):.3f}"]
            else:
                cells += ["—", "—", "—"]
            out.append("| " + " | ".join(cells) + " |")
        ratio = {r["x"]: r["ms"] / float(ana.time(L, r["x"])) for r in at} if peak else {}
        if BLOG_SMALL in ratio:
            knee = min((x for x in ratio if all(ratio[y] <= KNEE for y in ratio if y >= x)), default=None)
            verdicts[f"analytic_6k_L{L}"], verdicts[f"knee_L{L}"] = ratio[BLOG_SMALL], knee
            within = (f"every chunk of {knee} tokens or more is within {KNEE - 1:.0%} of it" if knee is not None else
                      f"not even the x = {big['x']} chunk is within {KNEE - 1:.0%} of it (its efficiencies do not "
                      "add up to the whole forward's time)")
            out += ["", f"At L = {L} a {BLOG_SMALL}-token chunk takes {ratio[BLOG_SMALL]:.3f}x what the analytic "
                        f"model predicts at the x = {big['x']} efficiencies; {within}; smaller ones cost more than "
                        f"their FLOPs say (x = {at[0]['x']}: {at[0]['ms'] / layers:.3f} ms per layer, "
                        f"{ratio[at[0]['x']]:.1f}x the analytic model)."]
        out.append("")
    return out, verdicts


def report(doc: dict, commit: str, command: str) -> tuple[str, list]:
    env = doc["env"]
    dev = device_spec(env.get("gpu", ""))
    lines = [f"# Kernel-level t(L, x) on {env.get('gpu')} (torch only, no SGLang)", "",
             f"- date: {env['date']} (measured); machine: {env.get('gpu')}, {env.get('sms', '?')} SMs, "
             f"{env.get('mem_gb', '?')} GiB",
             f"- versions: torch {env['torch']} (CUDA {env['cuda']}), python {env['python']}; SGLang not installed "
             "on the lent machine",
             f"- commit: {commit}",
             f"- command: `{doc['command']}` (measure, on the GPU), then `{command}` (this file)",
             "- what runs: a decoder stack in plain torch (bf16, random weights, no RoPE; MoE experts on torch's "
             "grouped GEMM where it runs; MLA's prefix K/V rebuilt from the latent every chunk): cuBLAS "
             "GEMMs and torch's fused attention with a lower-right causal mask (x queries over L + x keys), each "
             "forward timed on CUDA events by the plugin's DeviceTimer. 'ms' is the whole forward; the efficiency "
             "columns time the GEMMs alone and the attention alone (one pass each).", ""]
    verdicts = []
    for sh in doc["shapes"]:
        sec, v = shape_section({**sh, "repeats": doc["config"]["repeats"]}, dev)
        lines += sec
        verdicts.append((sh["shape"], v))
    return "\n".join(lines) + "\n", verdicts


def save_profiles(doc: dict, folder: Path) -> list[Path]:
    """Each shape's grid samples as a profile (one PP stage of `layers` layers), for `sglang-cpp bench ttft
    --simulate`, `plan` and `tune`: what the planner does on a measured GPU stage."""
    from sglang_cpp.core.profile_io import save_profile

    env, out = doc["env"], []
    for sh in doc["shapes"]:
        meta = {"model": f"{sh['shape']} ({sh['layers']} layers)", "device_name": env.get("gpu"), "dtype": "bf16",
                "tp": 1, "pp": 1, "backend": "torch-kernels (examples/gpu/kernels.py)",
                "torch_version": env["torch"], "date": env["date"]}
        grid = [{"L": r["L"], "x": r["x"], "ms": r["ms"]} for r in sh["samples"] if r["kind"] == "grid"]
        out.append(save_profile(folder / f"gpu_kernels-{sh['shape']}.profile.json", samples=grid, meta=meta))
    return out


def write_report(doc: dict, md: Path, commit: str, command: str) -> tuple[str, list, list[Path]]:
    """(text, verdicts, profiles): the report written to `md` and each shape's profile beside it, the one way
    both this script and check.py's kernels step write them, so a GPU run brings back everything."""
    text, verdicts = report(doc, commit, command)
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(text)
    return text, verdicts, save_profiles(doc, md.parent)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("samples", help="the JSON kernels.py wrote")
    ap.add_argument("--out", default=str(HERE.parents[1] / "results" / "gpu_kernels.md"))
    ap.add_argument("--commit", default=None, help="the commit measured (default: the JSON's)")
    a = ap.parse_args(argv)
    doc = json.loads(Path(a.samples).read_text())
    cmd = " ".join(["python examples/gpu/kernels_report.py", *(argv if argv is not None else sys.argv[1:])])
    text, _, profiles = write_report(doc, Path(a.out), a.commit or doc.get("commit", "unknown"), cmd)
    print(text)
    for path in profiles:
        print(f"profile: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
