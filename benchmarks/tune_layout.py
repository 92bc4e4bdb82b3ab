"""`tune layout` on the issue's two models (issue 30 items 3 and 4): Qwen3-235B-A22B-FP8 and DeepSeek-V3 on 32
H20, TP x PP x V ranked at 32K to 1M tokens, and the PP-depth trend the model predicts.

Both at the efficiency fitted on the blog's PP1 point for Qwen3-235B (benchmarks/analytic_whatif.py); DeepSeek-V3
has no published anchor here, so it runs at the same efficiency. TP all-reduces are charged on the H20's
NVLink (450 GB/s bus bandwidth); one GEMM efficiency serves every shape, so TP's smaller GEMMs are not
penalised, and context parallelism is not priced. Pure numpy. Writes results/tune_layout.md.

Usage: python benchmarks/tune_layout.py
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from sglang_cpp.machine import provenance_lines
from sglang_cpp.whatif.analytic import DEVICES, MODELS
from sglang_cpp.whatif.analytic_fit import BLOG_PP1, fit
from sglang_cpp.whatif.layout import crossovers, rank_layouts, winners

LENGTHS = (32768, 131072, 262144, 1048576)


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
           "overhead 2 ms, TP all-reduces on 450 GB/s, 0.88 of 96 GB per GPU for weights and KV. Predicted TTFT (s) of "
           "each layout's best policy (the plan, or fixed 4K-32K chunks).", ""]
    for name in ("qwen3-235b-a22b-fp8", "deepseek-v3"):
        ranked = rank_layouts(MODELS[name], dev, 32, LENGTHS, virtual_stages=(1, 2, 4))
        win = winners(ranked)
        ok = sorted((r for r in ranked if not r.reason), key=lambda r: r.best[LENGTHS[-1]][2])
        out += [f"## {name}", "", "| layout | GB per GPU | " + " | ".join(f"{S // 1024}K" for S in LENGTHS) + " |",
                "|---|---:|" + "---:|" * len(LENGTHS)]
        for r in ok:
            out.append(f"| {r.layout.name} | {r.mem_gb:.1f} | " + " | ".join(
                f"{r.best[S][2] / 1e3:.2f}{' **best**' if win[S] is r else ''}" for S in LENGTHS) + " |")
        out += [""] + [f"- infeasible: {r.layout.name}: {r.reason}" for r in ranked if r.reason]
        cross = crossovers(win)
        out += [f"- crossover between {a // 1024}K and {b // 1024}K: {w1} -> {w2}" for a, b, w1, w2 in cross] or \
               [f"- one winner at every length: {win[LENGTHS[0]].layout.name}"]
        by = {(r.layout.tp, r.layout.pp, r.layout.v): r for r in ok}
        pairs = [((8, 4, 1), (4, 8, 1)), ((4, 8, 1), (2, 16, 1))]
        for a, b in pairs:
            if a in by and b in by:
                ratios = " / ".join(f"{by[b].best[S][2] / by[a].best[S][2]:.3f}" for S in LENGTHS)
                out.append(f"- PP{b[1]} (TP{b[0]}) over PP{a[1]} (TP{a[0]}), TTFT ratio at "
                           f"{', '.join(f'{S // 1024}K' for S in LENGTHS)}: {ratios}")
        out.append("")
    text = "\n".join(out) + "\n"
    Path(args.results).write_text(text)
    print(text + f"\nwrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
