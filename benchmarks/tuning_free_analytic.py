"""Issue 25 part 5, at blog scale on the analytic model: the plan with no sweep against upstream's
dynamic chunking (DCK), as the blog ran it and as a hand-tuned grid would pick it, for Qwen3-235B-A22B-FP8
on 32 H20 (PP8 TP4), 128K to 1M tokens.

- The plan at C = 8K, 18K and 32K (C a memory cap; the plan's ceiling is SGLang's prefill-buffer
  ceiling, max(C, --max-prefill-tokens 16384, 1.25 C)): target, within 2% across C.
- Against DCK 18K sigma 0.8 (Table 1's settings): targets 0.80x at 128K, 0.90x at 256K, 1.00x at 1M.
- Against the best DCK of a grid (C = 4K, 6K, 8K, 12K, 18K; sigma = 0.6, 0.75, 0.85): target 1.00x at every
  length (the tuning-free claim: no sweep, and no worse than the best sweep).
- A table over the per-chunk overhead (1, 2, 5, 10, 20, 40 ms): where the plan's gain over DCK goes.

The efficiency is fitted on the blog's PP1 point (55.5 s at 128K) at each overhead, as
benchmarks/analytic_whatif.py does. Every figure is a simulation on the analytic roofline model, not a
measurement. Writes results/tuning_free_analytic.md.

Usage: python benchmarks/tuning_free_analytic.py [--chunk-overhead-ms MS] [--results PATH]

The fit that reproduces the blog's fixed 6K / DCK 18K ratio (results/tuning_free_analytic-ratio-fit.md):
  sglang-cpp tune analytic --analytic qwen3-235b-a22b-fp8 --gpu H20 --tp-size 4 --measured 1,128k,55.5 \
    --measured-ratio 8,128k,fixed:6k/quadratic:18k:0.8,1.105 --fit-overhead
  python benchmarks/tuning_free_analytic.py --chunk-overhead-ms <its overhead> \
    --results results/tuning_free_analytic-ratio-fit.md
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from sglang_cpp.machine import provenance_lines
from sglang_cpp.whatif.analytic import DEVICES, MODELS
from sglang_cpp.whatif.analytic_fit import BLOG_PP1, Measured, fit, predict_ms

LENS = (128 * 1024, 256 * 1024, 512 * 1024, 1024 * 1024)
PLAN_CS = (8192, 18432, 32768)
GRID_C = (4096, 6144, 8192, 12288, 18432)
GRID_SIGMA = (0.6, 0.75, 0.85)
TARGET_VS_BLOG = {128 * 1024: 0.80, 256 * 1024: 0.90, 1024 * 1024: 1.00}
OVERHEADS = (1.0, 2.0, 5.0, 10.0, 20.0, 40.0)


def predictions(overhead: float) -> tuple[float, dict]:
    """(fitted efficiency, {(policy, C, sigma): {S: TTFT s}}) at one per-chunk overhead."""
    q, h20 = MODELS["qwen3-235b-a22b-fp8"], DEVICES["H20"]
    f = fit(q, h20, 4, [BLOG_PP1], chunk_overhead_ms=overhead)
    dev = f.on(h20)
    runs = [("plan", C, 0.8) for C in PLAN_CS] + [("quadratic", C, s) for C in GRID_C for s in GRID_SIGMA]
    runs += [("quadratic", 18432, 0.8), ("fixed", 6144, 0.8)]
    return f.efficiency, {r: {S: predict_ms(q, dev, 4, Measured(8, S, 1.0, *r), overhead) / 1e3 for S in LENS}
                          for r in dict.fromkeys(runs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunk-overhead-ms", dest="overhead", type=float, default=None,
                    help="per-chunk overhead of the main tables (default: the H20 preset's)")
    ap.add_argument("--results", default="results/tuning_free_analytic.md")
    args = ap.parse_args()
    o = DEVICES["H20"].chunk_overhead_ms if args.overhead is None else args.overhead
    eff, pred = predictions(o)
    cmd = "python benchmarks/tuning_free_analytic.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    out = ["# Tuning-free at blog scale (analytic): the plan without a sweep against upstream's dynamic chunking", "",
           *provenance_lines(cmd.strip()),
           "- host-independent: pure numpy (cost model, chunk policies, simulator); SIMULATED, not measured", "",
           f"Qwen3-235B-A22B-FP8, PP8 TP4 on 32 H20, per-chunk overhead {o:g} ms, efficiency {eff:.4f} fitted on "
           "the blog's PP1 point. --max-prefill-tokens 16384 (SGLang's default).", "",
           "## The plan at three chunked-prefill sizes (TTFT, s)", "",
           "| input | " + " | ".join(f"plan C={C // 1024}K" for C in PLAN_CS) + " | spread across C | target |",
           "|---:|" + "---:|" * (len(PLAN_CS) + 2)]
    for S in LENS:
        v = [pred[("plan", C, 0.8)][S] for C in PLAN_CS]
        out.append(f"| {S // 1024}K | " + " | ".join(f"{x:.2f}" for x in v) +
                   f" | {max(v) / min(v) - 1:.2%} | <= 2% {'met' if max(v) / min(v) - 1 <= 0.02 else 'MISSED'} |")
    blog = pred[("quadratic", 18432, 0.8)]
    out += ["", "## Against DCK 18K, sigma 0.8 (the blog's settings) and the best DCK of the grid", "",
            "Grid: C in {4K, 6K, 8K, 12K, 18K} x sigma in {0.6, 0.75, 0.85} (15 servers a user would sweep). "
            "The plan column is the plan at C=18K.", "",
            "| input | plan (s) | DCK 18K/0.8 (s) | plan / DCK 18K | target | best DCK of grid | its TTFT (s) | "
            "plan / best DCK | target 1.00 |", "|---:|---:|---:|---:|---|---|---:|---:|---|"]
    for S in LENS:
        p = pred[("plan", 18432, 0.8)][S]
        best = min(((C, s) for C in GRID_C for s in GRID_SIGMA), key=lambda k: pred[("quadratic", *k)][S])
        b = pred[("quadratic", *best)][S]
        tgt = TARGET_VS_BLOG.get(S)
        t1 = "—" if tgt is None else f"<= {tgt:.2f} {'met' if p / blog[S] <= tgt else 'MISSED'}"
        out.append(f"| {S // 1024}K | {p:.2f} | {blog[S]:.2f} | {p / blog[S]:.3f} | {t1} | C={best[0] // 1024}K "
                   f"sigma={best[1]:g} | {b:.2f} | {p / b:.3f} | {'met' if p / b <= 1.0 + 1e-9 else 'MISSED'} |")
    out += ["", "## Where the gain goes: the per-chunk overhead (plan C=18K against DCK 18K/0.8, each refitted)", "",
            "| overhead (ms) | " + " | ".join(f"{S // 1024}K" for S in LENS) + " |", "|---:|" + "---:|" * len(LENS)]
    for oh in OVERHEADS:
        _, pr = predictions(oh)
        out.append(f"| {oh:g} | " + " | ".join(f"{pr[('plan', 18432, 0.8)][S] / pr[('quadratic', 18432, 0.8)][S]:.3f}"
                                              for S in LENS) + " |")
    fx = pred[("fixed", 6144, 0.8)][128 * 1024] / blog[128 * 1024]
    out += ["", "Cells: the plan's predicted TTFT over DCK's (< 1: the plan is faster). The planner charges the "
            "overhead given (in the plugin: SGLANG_CPP_CHUNK_OVERHEAD_MS until a measured one exists).", "",
            "## The small-chunk regime", "",
            f"The blog's one figure for it, fixed 6K / DCK 18K at 128K on PP8 (69.6% and 76.9% strong-scaling "
            f"efficiency), is 1.105; this model gives {fx:.3f} at {o:g} ms per chunk and stage."]
    if abs(fx / 1.105 - 1) <= 0.05:
        out.append(f"The ratio is reproduced within 5% ({fx / 1.105:.3f}x). The same fit puts DCK 18K/0.8 at "
                   f"{blog[128 * 1024]:.2f} s at 128K, against the blog's measured 10.54 s (Table 1): results/"
                   "small_chunk_fit.md shows that no single term reproduces both, so read these figures as the "
                   "what-if of a stack with that much per-chunk cost, not as a forecast for the blog's.")
    else:
        out.append("The ratio is not reproduced: results/small_chunk_fit.md tests the candidate terms (per-chunk and "
                   "per-layer overhead, a prefix-growing per-chunk cost, slower attention) and shows which "
                   "reproduce it and at what cost to Table 1; results/tuning_free_analytic-ratio-fit.md has these "
                   "tables on the fit that does (`--chunk-overhead-ms` from `tune analytic --measured-ratio`).")
    text = "\n".join(out) + "\n"
    Path(args.results).write_text(text)
    print(text + f"\nwrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
