"""`tune layout` on the issue's two models (issue 30 items 1, 3 and 4): Qwen3-235B-A22B-FP8 and DeepSeek-V3 on
32 H20, TP x PP x CP x V ranked at 32K to 1M tokens, the PP-depth trend the model predicts, and the CP tax on
short prompts against SGLang #37944 (GLM-5.2 DSA with attn_cp_size 4: 15-21% worse TTFT below ~4K tokens,
break-even near 8K).

Both at the efficiency fitted on the blog's PP1 point for Qwen3-235B (benchmarks/analytic_whatif.py); DeepSeek-V3
has no published anchor here, so it runs at the same efficiency. Each layer's collectives (TP all-reduces, CP
all-gathers) are charged on the H20's NVLink (450 GB/s bus bandwidth, 20 us each); one GEMM efficiency serves
every shape, so TP's and CP's smaller GEMMs are not penalised. Pure numpy. Writes results/tune_layout.md.

Usage: python benchmarks/tune_layout.py
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from sglang_cpp.machine import provenance_lines
from sglang_cpp.core.costmodel import with_overheads
from sglang_cpp.core.policy import chunks_for
from sglang_cpp.whatif.analytic import DEVICES, MODELS
from sglang_cpp.whatif.analytic_fit import BLOG_PP1, fit, stage_models
from sglang_cpp.whatif.layout import crossovers, rank_layouts, ties, winners
from sglang_cpp.whatif.simulator import SimConfig, simulate

LENGTHS = (32768, 131072, 262144, 1048576)
CP_SIZES = (1, 2, 4, 8)
TAX_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 131072)
TAX_CHUNK = 8192  # fixed chunks, as a PP1 prefill server runs them


def cp_tax(model, dev, tp: int, cps, backend: str | None) -> list[str]:
    """Rows of TTFT(CP) / TTFT(TP alone) of one PP1 prefill per length: fixed chunks of TAX_CHUNK, the
    layer collectives charged, MLA priced in SGLang's regimes on `backend`."""
    o = dev.chunk_overhead_ms
    models = {cp: stage_models(model, dev, tp, 1, tp_comm=True, cp=cp, attention_backend=backend)[0]
              for cp in (1, *cps)}
    models = {cp: with_overheads(m, o, 1) for cp, m in models.items()}  # o per chunk, on the cost
    ms = {cp: [simulate(chunks_for("fixed", S, m, 1, TAX_CHUNK), m, 1, SimConfig()).ttft_ms for S in TAX_LENGTHS]
          for cp, m in models.items()}
    rows = [f"| TP{tp} alone | " + " | ".join(f"{v / 1e3:.3f} s" for v in ms[1]) + " |"]
    for cp in cps:
        rows.append(f"| TP{tp} (CP{cp}) / TP{tp} | " + " | ".join(f"{a / b:.3f}" for a, b in zip(ms[cp], ms[1])) + " |")
    return rows


DOC_B = (("llama3-70b", 8, 8, 1, 4.2), ("llama3-70b", 16, 8, 2, 4.5), ("llama3.1-405b", 16, 8, 2, 6.8),
         ("llama3.1-405b", 32, 8, 4, 7.2))  # seed doc B: model, GPUs, its TP, its PP, its decode latency (ms, B=1)
DOC_B_CONTEXT = 4096


def doc_b(h100) -> list[str]:
    """Seed doc B's recommended layouts (recommend_parallelism, latency priority) checked on this model's
    decode step (layout.decode_ms): its layout's latency in bf16 and fp8, and the layout of TP <= 8 (one
    node) x PP that fits 0.88 of 80 GB with the lowest latency."""
    from sglang_cpp.whatif.layout import decode_ms, layouts, stage_memory_gb
    from sglang_cpp.core.partition import default_partition
    from dataclasses import replace

    rows = ["## Seed doc B's decode examples on this model", "",
            f"Batch 1, a context of {DOC_B_CONTEXT} tokens, H100 (3350 GB/s at 0.8, NVLink 450 GB/s and 20 us for every "
            "collective and PP hop), no per-step scheduler overhead. 'Best here': the layout of TP <= 8 x PP whose "
            "weights and KV fit 0.88 of 80 GB with the lowest predicted decode step (bf16).", "",
            "| model | GPUs | doc B's layout | doc B (ms) | this model, bf16 (ms) | this model, fp8 (ms) | best here (bf16) |",
            "|---|---:|---|---:|---:|---:|---|"]
    for name, gpus, tp, pp, ms in DOC_B:
        m = MODELS[name]
        fp8 = replace(m, weight_bytes=1)
        ok = []
        for lay in layouts(gpus, m.num_layers, 8):
            parts = default_partition(m.num_layers, lay.pp)
            if max(stage_memory_gb(m, parts, lay.tp, DOC_B_CONTEXT)) <= 0.88 * 80:
                ok.append((decode_ms(m, h100, lay.tp, lay.pp, DOC_B_CONTEXT), lay.name))
        best = min(ok) if ok else None
        rows.append(f"| {name} | {gpus} | TP{tp} x PP{pp} | {ms} | {decode_ms(m, h100, tp, pp, DOC_B_CONTEXT):.2f} | "
                    f"{decode_ms(fp8, h100, tp, pp, DOC_B_CONTEXT):.2f} | "
                    + (f"{best[1]} ({best[0]:.2f} ms)" if best else "none fits") + " |")
    return rows + [""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="results/tune_layout.md")
    args = ap.parse_args()
    h20 = DEVICES["H20"]
    f = fit(MODELS["qwen3-235b-a22b-fp8"], h20, 4, [BLOG_PP1])
    eff, dev = f.efficiency, f.on(h20)
    cmd = "python benchmarks/tune_layout.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    out = ["# Parallel layouts of 32 H20 for long prefill, ranked on the analytic model (tune layout)", "",
           *provenance_lines(cmd.strip()), "- host-independent: pure numpy (analytic model, partitioner, planner, simulators)",
           "", f"Efficiency {eff:.4f} (fitted on the blog's Qwen3-235B PP1 TP4 128K point), per-chunk (per-visit) "
           "overhead 2 ms, layer collectives on 450 GB/s with 20 us each, 0.88 of 96 GB per GPU for weights and KV. "
           "Predicted TTFT (s) of each layout's best policy (the plan, or fixed 4K-32K chunks). Attention CP "
           f"{', '.join(map(str, CP_SIZES[1:]))} inside each TP group where it divides TP (SGLang's --attn-cp-size). "
           "'tie': within 3% of the fastest (the model's error); '**best**': of those, the least memory per GPU "
           "(`tune layout`'s pick).",
           ""]
    for name in ("qwen3-235b-a22b-fp8", "deepseek-v3"):
        ranked = rank_layouts(MODELS[name], dev, 32, LENGTHS, virtual_stages=(1, 2, 4), cp_sizes=CP_SIZES)
        win = winners(ranked)
        ok = sorted((r for r in ranked if not r.reason), key=lambda r: r.best[LENGTHS[-1]][2])
        out += [f"## {name}", "", "| layout | GB per GPU | " + " | ".join(f"{S // 1024}K" for S in LENGTHS) + " |",
                "|---|---:|" + "---:|" * len(LENGTHS)]
        for r in ok:
            out.append(f"| {r.layout.name} | {r.mem_gb:.1f} | " + " | ".join(
                f"{r.best[S][2] / 1e3:.2f}{' **best**' if win[S] is r else ' tie' if r in ties(ranked, S) else ''}"
                for S in LENGTHS) + " |")
        out += [""] + [f"- infeasible: {r.layout.name}: {r.reason}" for r in ranked if r.reason]
        cross = crossovers(win, ranked)  # a change of winner inside the model's 3% error is a tie, as `tune layout` says
        out += [f"- crossover between {a // 1024}K and {b // 1024}K: {w1} -> {w2}" for a, b, w1, w2 in cross] or \
               [f"- no crossover beyond the model's error: {win[LENGTHS[0]].layout.name} wins or ties at every length"
                if all(win[LENGTHS[0]] in ties(ranked, S) for S in LENGTHS) else
                "- no crossover beyond the model's error between consecutive lengths"]
        by = {(r.layout.tp, r.layout.pp, r.layout.v): r for r in ok if r.layout.cp == 1}
        pairs = [((8, 4, 1), (4, 8, 1)), ((4, 8, 1), (2, 16, 1))]
        for a, b in pairs:
            if a in by and b in by:
                ratios = " / ".join(f"{by[b].best[S][2] / by[a].best[S][2]:.3f}" for S in LENGTHS)
                out.append(f"- PP{b[1]} (TP{b[0]}) over PP{a[1]} (TP{a[0]}), TTFT ratio at "
                           f"{', '.join(f'{S // 1024}K' for S in LENGTHS)}: {ratios}")
        best_cp = {S: min((r for r in ok if r.layout.cp > 1), key=lambda r: r.best[S][2]) for S in LENGTHS}
        best_tp = {S: min((r for r in ok if r.layout.cp == 1), key=lambda r: r.best[S][2]) for S in LENGTHS}
        out.append("- best layout with CP over best without, TTFT ratio at "
                   f"{', '.join(f'{S // 1024}K' for S in LENGTHS)}: " + " / ".join(
                       f"{best_cp[S].best[S][2] / best_tp[S].best[S][2]:.3f} ({best_cp[S].layout.name})" for S in LENGTHS))
        out.append("")
    out += ["## The CP tax on short prompts (against SGLang #37944)", "",
            f"One PP1 prefill instance of 8 GPUs, TP8, fixed {TAX_CHUNK // 1024}K chunks, collectives charged; the ratio "
            "of its TTFT with attention CP to TP alone (below 1: CP wins). #37944 measured GLM-5.2-FP8 (DSA attention, "
            "attn_cp_size 4, zigzag): 1.15-1.21 below ~4K tokens, 1.0 near 8K. DSA's indexer and GLM-5.2 are outside "
            "the model; DeepSeek-V3 (MLA, the same projections) is the nearest preset, on H200 (its fp8 weights "
            "do not fit 8 H20) with SGLang's MLA regimes of the fa3 backend.", "",
            "| model, layout | " + " | ".join(f"{S // 1024}K" for S in TAX_LENGTHS) + " |",
            "|---|" + "---:|" * len(TAX_LENGTHS)]
    h200 = f.on(DEVICES["H200"])
    for name, d, backend in (("deepseek-v3", h200, "fa3"), ("qwen3-235b-a22b-fp8", dev, None)):
        rows = cp_tax(MODELS[name], d, 8, (2, 4, 8), backend)
        out += [f"| {name} on {d.name}: {r[2:]}" if i == 0 else f"| {r[2:]}" for i, r in enumerate(rows)]
    out.append("")
    out += doc_b(f.on(DEVICES["H100"]))
    text = "\n".join(out) + "\n"
    Path(args.results).write_text(text)
    print(text + f"\nwrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
