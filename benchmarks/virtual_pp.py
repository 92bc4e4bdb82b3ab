"""Virtual PP with large fixed chunks against the sglang-cpp plan at V = 1 (issue 30 item 2), on the analytic
model of Qwen3-235B-A22B-FP8, PP8 TP4 on 32 H20, 128K to 1M tokens.

The efficiency is fitted on the blog's PP1 point (as benchmarks/analytic_whatif.py does); the stage models
are the roofline per rank. Fixed chunks C = 8K, 16K, 32K run at V = 1, 2 and 4 virtual stages per rank
(whatif/virtual_pp.py: V slices per rank, each visit t/V plus a per-visit overhead, fill and drain
(P-1)/V stage times); the plan runs at V = 1 (the plain pipeline it plans for) and, for reference, its
V = 1 chunks at V = 2. The per-visit overhead is the H20 preset's per-chunk overhead unless --visit-overhead-ms
says otherwise; a second table repeats the comparison at 4x that overhead, where more visits cost more.
Pure numpy: the figures do not depend on the host. Writes results/virtual_pp.md.

Usage: python benchmarks/virtual_pp.py [--visit-overhead-ms MS]
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from sglang_cpp.core.costmodel import PipelineCost, with_overheads
from sglang_cpp.core.policy import chunks_for
from sglang_cpp.machine import provenance_lines
from sglang_cpp.whatif.analytic import DEVICES, MODELS
from sglang_cpp.whatif.analytic_fit import BLOG_PP1, fit, stage_models
from sglang_cpp.whatif.simulator import SimConfig
from sglang_cpp.whatif.virtual_pp import simulate_virtual

LENGTHS = (128 * 1024, 256 * 1024, 512 * 1024, 1024 * 1024)
FIXED = (8192, 16384, 32768)
P, TP = 8, 4


def table(stages, cost, o: float) -> tuple[list[str], dict]:
    """Rows of predicted TTFT (s) per length, and {length: (winner, its TTFT)}."""
    cfg = SimConfig()
    cost = with_overheads(cost, o, P)  # o per visit (V > 1: simulate_virtual charges it per visit)
    cols = [("plan V=1", "plan", 18432, 1), ("plan chunks V=2", "plan", 18432, 2)]
    cols += [(f"fixed {C // 1024}K V={V}", "fixed", C, V) for C in FIXED for V in (1, 2, 4)]
    rows, winners = [], {}
    for S in LENGTHS:
        got = {}
        for name, pol, C, V in cols:
            ch = chunks_for(pol, S, cost, P, C, max_prefill=max(C, 18432))
            got[name] = simulate_virtual(ch, cost, P, V, cfg).ttft_ms / 1e3
        best_virtual = min((v, n) for n, v in got.items() if "fixed" in n and not n.endswith("V=1"))
        winners[S] = min((v, n) for n, v in got.items())[::-1]
        rows.append(f"| {S // 1024}K | " + " | ".join(f"{got[n]:.2f}" for n, *_ in cols) +
                    f" | {best_virtual[1]} | {got['plan V=1'] / best_virtual[0]:.3f} | {winners[S][0]} |")
    head = ["| input | " + " | ".join(n for n, *_ in cols) + " | best virtual fixed | plan V=1 / it | winner |",
            "|---:|" + "---:|" * (len(cols) + 1) + "---|---|"]
    return head + rows, winners


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--visit-overhead-ms", dest="o", type=float, default=None,
                    help="fixed cost per visit (and per chunk at V=1); default the H20 preset's per-chunk overhead")
    ap.add_argument("--results", default="results/virtual_pp.md")
    args = ap.parse_args()
    q, h20 = MODELS["qwen3-235b-a22b-fp8"], DEVICES["H20"]
    o = h20.chunk_overhead_ms if args.o is None else args.o
    f = fit(q, h20, TP, [BLOG_PP1], chunk_overhead_ms=o)
    dev = f.on(h20)
    stages = stage_models(q, dev, TP, P)
    cost = PipelineCost(tuple(stages))
    cmd = "python benchmarks/virtual_pp.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    out = ["# Virtual PP with large fixed chunks against the plan at V = 1 (Qwen3-235B-A22B-FP8, PP8 TP4, 32 H20)",
           "", *provenance_lines(cmd.strip()), "- host-independent: pure numpy (analytic model, planner, simulator)", "",
           f"Efficiency {f.efficiency:.4f} fitted on the blog's PP1 TP4 128K point (~55.5 s); predicted TTFT in s. "
           "A visit is one chunk on one virtual stage (1/V of a rank's layers): it costs t/V plus the per-visit "
           "overhead, and its activations cross one link (free here, as in the other analytic what-ifs).", ""]
    for mult in (1, 4):
        rows, winners = table(stages, cost, o * mult)
        out += [f"## Per-visit overhead {o * mult:g} ms{' (the H20 preset)' if mult == 1 else ' (4x the preset)'}",
                "", *rows, ""]
        out += [f"- {S // 1024}K: {w} wins ({v:.2f} s)." for S, (w, v) in winners.items()] + [""]
    text = "\n".join(out) + "\n"
    Path(args.results).write_text(text)
    print(text + f"\nwrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
