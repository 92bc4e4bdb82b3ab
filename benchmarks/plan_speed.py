"""Issue 56 item 5: how long one planning decision takes on this host, as a PP stage's scheduler thread pays it.

A decision is what the plugin's sizer runs when a prompt starts: the single-prompt plan, then the queue-aware
plan with the chunks in flight (P - 1 of them), the prompts waiting behind it (queue depth 0, 1, 4 or 16, each
of 32K-1M tokens) and a known load estimate (16 arrivals, most of them busy), core/queue_plan.py. The prompt is
32K-1M tokens, PP 4, 8 and 16, on the H100-measured check-llama stage (results/gpu-h100/, 8 decoder layers
per stage) with 20 ms per chunk and stage: every stage that model ("equal"), and every stage its own copy
with each coefficient and the overhead scaled by a seeded factor in [0.9, 1.1] ("uneven": a served model
refitted per stage, where no stage's rows can be shared). Seeded: every run plans the same decisions. Times are the thread's
CPU time (time.thread_time) with OpenBLAS on one thread; p50, p99 and max per cell.

`--avx2`: numpy's AVX-512 paths turned off (NPY_DISABLE_CPU_FEATURES), for a host that has AVX-512 and no
AVX2-only host at hand; the results file says which. Budget (issue 56): p99 <= 20 ms, max <= 50 ms at depth 16
on an AVX2 host. Writes results/plan_speed.md and the raw results/plan_speed.jsonl (one line per decision).

Usage: python benchmarks/plan_speed.py [--avx2] [--decisions 60] [--results results/plan_speed.md]
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

PROFILE = "results/gpu-h100/gpu_kernels-check-llama.profile.json"
DEPTHS = (0, 1, 4, 16)
STAGES = ("equal", "uneven")
PPS = (4, 8, 16)
OVERHEAD_MS = 20.0
BUDGET_P99, BUDGET_MAX = 20.0, 50.0


def _avx512_features() -> str:
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    return " ".join(f for f in __cpu_dispatch__ if f.startswith("AVX512") and __cpu_features__.get(f))


def measure(decisions: int, seed: int = 56) -> list[dict]:
    import time

    import numpy as np

    from sglang_cpp.core.costmodel import COEFS, CostModel, PipelineCost, per_stage, with_overheads
    from sglang_cpp.core.load import Load
    from sglang_cpp.core.planner import PlanConfig, plan
    from sglang_cpp.core.profile_io import cost_from_profile, load_profile
    from sglang_cpp.core.queue_plan import QueueView, plan_in_queue

    stage = cost_from_profile(load_profile(PROFILE), PROFILE)
    rng = np.random.default_rng(seed)
    rows = []
    for kind, P in ((k, P) for k in STAGES for P in PPS):
        if kind == "equal":
            cost = with_overheads(per_stage(stage, P), [OVERHEAD_MS] * P, P)
        else:
            f = rng.uniform(0.9, 1.1, size=(P, 7))
            models = tuple(CostModel(**{k: getattr(stage, k) * f[s, i] for i, k in enumerate(COEFS)}) for s in range(P))
            cost = with_overheads(PipelineCost(models), [OVERHEAD_MS * f[s, 6] for s in range(P)], P)
        cfg = PlanConfig(pp_size=P, max_chunk=32768)
        for depth in DEPTHS:
            for k in range(decisions):
                n = int(rng.integers(32 * 1024, 1024 * 1024 + 1))
                inflight = tuple((int(rng.integers(0, 1 << 20)), int(rng.integers(2048, 32768))) for _ in range(P - 1))
                waiting = tuple((int(rng.integers(32 * 1024, 1024 * 1024 + 1)), 0) for _ in range(depth))
                load = Load(16, float(rng.uniform(1e4, 1e6)), int(rng.integers(32 * 1024, 1 << 20)),
                            int(rng.integers(8, 17)))
                view = QueueView(inflight, waiting, tuple(f"w{i}" for i in range(depth)), load)
                t0 = time.thread_time()
                alone = plan(n, cost, cfg, 0)
                got = plan_in_queue(n, cost, cfg, 0, view, alone=alone)
                ms = (time.thread_time() - t0) * 1e3
                rows.append({"stages": kind, "pp_size": P, "depth": depth, "prompt_len": n, "ms": round(ms, 3),
                             "chunks": len(got.chunks), "expected": got.meta.get("queue", {}).get("load", {})
                             .get("expected_prompts")})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--avx2", action="store_true", help="numpy's AVX-512 paths off (NPY_DISABLE_CPU_FEATURES)")
    ap.add_argument("--decisions", type=int, default=60, help="decisions per PP size and queue depth")
    ap.add_argument("--results", default="results/plan_speed.md")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.child:  # the measurement runs in a child whose numpy reads the settings at import
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        if args.avx2:
            env["NPY_DISABLE_CPU_FEATURES"] = _avx512_features()
        out = subprocess.run([sys.executable, __file__, "--child", "--decisions", str(args.decisions)], env=env,
                             capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(out.stderr[-3000:])
        rows = [json.loads(x) for x in out.stdout.splitlines()]
        write(rows, args, env.get("NPY_DISABLE_CPU_FEATURES", ""))
        return 0
    for r in measure(args.decisions):
        print(json.dumps(r))
    return 0


def write(rows: list[dict], args, disabled: str) -> None:
    import numpy as np

    from sglang_cpp.machine import provenance_lines

    cmd = "python benchmarks/plan_speed.py" + (" --avx2" if args.avx2 else "") + \
        (f" --decisions {args.decisions}" if args.decisions != 60 else "") + \
        (f" --results {args.results}" if args.results != "results/plan_speed.md" else "")
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    flags = next((ln.split(":", 1)[1].split() for ln in lscpu.splitlines() if ln.startswith("Flags")), [])
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    head = provenance_lines(cmd)
    numpy_paths = f"numpy with AVX-512 off (NPY_DISABLE_CPU_FEATURES={disabled})" if disabled else \
        "numpy with every SIMD path this CPU has"
    lines = ["# Planning time per decision (MEASURED on this host's CPU)", "", *head,
             f"- lscpu flags of note: {' '.join(isa)}; {numpy_paths}; OpenBLAS on 1 thread",
             f"- raw records: `{Path(args.results).with_suffix('.jsonl').name}` (one line per decision)", "",
             __doc__.split("\n\n")[1].replace("\n", " "), "",
             f"Budget (issue 56): p99 <= {BUDGET_P99:g} ms and max <= {BUDGET_MAX:g} ms per decision at queue depth 16 "
             "on an AVX2 host.", "",
             "| stages | PP | queue depth | decisions | p50 (ms) | p99 (ms) | max (ms) | within budget |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for kind in STAGES:
        for P in PPS:
            for depth in DEPTHS:
                ms = np.array([r["ms"] for r in rows if r.get("stages", "equal") == kind and r["pp_size"] == P
                               and r["depth"] == depth])
                p50, p99, mx = np.percentile(ms, 50), np.percentile(ms, 99), ms.max()
                ok = "yes" if p99 <= BUDGET_P99 and mx <= BUDGET_MAX else "no"
                lines.append(f"| {kind} | {P} | {depth} | {len(ms)} | {p50:.1f} | {p99:.1f} | {mx:.1f} | {ok} |")
    Path(args.results).write_text("\n".join(lines) + "\n")
    with open(Path(args.results).with_suffix(".jsonl"), "w") as fh:
        fh.write(json.dumps({"provenance": head, "numpy": numpy_paths}) + "\n")
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
