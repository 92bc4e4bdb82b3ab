"""Planning speed: how long the equal-time planner takes for 128K and 1M-token prompts, and the
cost of looking up the next chunk of an existing plan. Writes results/plan_speed_alone.md (benchmarks/plan_speed.py times whole queue-aware decisions).

Cost model: the analytic Qwen3-235B-A22B-FP8 stage (PP8 TP4 on H20) in FA form, and a
torch_native-like (L+x)^2 model; planner settings as the plugin derives them from
--chunked-prefill-size 12288 (min chunk C/4, max chunk --max-prefill-tokens 16384, align 64).
Usage: python benchmarks/plan_speed_alone.py [--repeats 50]
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import scipy

from sglang_cpp.core.costmodel import CostModel
from sglang_cpp.machine import provenance_lines
from sglang_cpp.core.planner import PlanConfig, plan_dp, plan_equal_time
from sglang_cpp.whatif.analytic import DEVICES, MODELS, analytic_cost_model

ROOT = Path(__file__).resolve().parents[1]


def timed(fn, repeats):
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        r = fn()
        out.append(time.perf_counter() - t)
    return r, statistics.median(out), min(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--out", default=str(ROOT / "results" / "plan_speed_alone.md"))
    a = ap.parse_args()
    model = MODELS["qwen3-235b-a22b-fp8"]
    stage = analytic_cost_model(model, DEVICES["H20"], layers=model.num_layers // 8, tp=4)
    costs = {"qwen3-235b-fp8 PP8TP4 H20 (FA form)": (stage, 8),
             "torch_native-like (L+x)^2": (CostModel(c0=50, g=0.01, b=0.5, d=6e-5, e=1.2e-4, f=6e-5), 2)}
    rows = []
    for name, (cost, P) in costs.items():
        for N in (131072, 1 << 20):
            for min_chunk in (3072, 64):
                cfg = PlanConfig(pp_size=P, align=64, min_chunk=min_chunk, max_chunk=16384)
                plan_equal_time(N, cost, cfg)  # warm caches
                plan, med, best = timed(lambda: plan_equal_time(N, cost, cfg), a.repeats)
                starts = plan.starts
                n_look = 100000
                t = time.perf_counter()
                for i in range(n_look):
                    plan.next_chunk(starts[i % len(starts)])
                look = (time.perf_counter() - t) / n_look
                rows.append((name, N, min_chunk, len(plan.chunks), plan.ttft_ms / 1e3, med * 1e3, best * 1e3,
                             look * 1e9))
                print(rows[-1], flush=True)
    cfg = PlanConfig(pp_size=8, align=1024, min_chunk=3072, max_chunk=16384)
    dp, dp_med, _ = timed(lambda: plan_dp(131072, stage, cfg), 3)
    eq = plan_equal_time(131072, stage, cfg)
    lines = [
        "# Planning speed", "",
        *provenance_lines(f"python benchmarks/plan_speed_alone.py --repeats {a.repeats}",
                          f"; numpy {np.__version__}, scipy {scipy.__version__}"), "",
        "Equal-time planner (`--policy plan`), median and best of the repeats; lookup = `ChunkPlan.next_chunk`.", "",
        "| cost model | prompt | min chunk | chunks | predicted TTFT (s) | plan median (ms) | plan best (ms) "
        "| next-chunk lookup (ns) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]:.2f} | {r[5]:.2f} | {r[6]:.2f} | {r[7]:.0f} |")
    lines += ["", f"Exact DP reference at 128K (align 1024, PP8): {dp_med * 1e3:.0f} ms, predicted TTFT "
              f"{dp.ttft_ms / 1e3:.3f} s vs equal-time {eq.ttft_ms / 1e3:.3f} s "
              f"(equal-time / DP = {eq.ttft_ms / dp.ttft_ms:.4f})."]
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
