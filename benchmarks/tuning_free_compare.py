"""Issue 25 part 4: the plan with no sweep, on the real CPU PP=2 server, beside the fixed-chunk sweep.

The plan server runs at several --chunked-prefill-size values (a memory cap, not a hint: the plan should
not move) beside fixed chunks of several sizes. Servers are interleaved: every round starts each
configuration in turn (fixed and plan alternating), sends one short warm-up and one measured request of
the target length, and stops it; `--rounds` rounds give that many measured requests per configuration,
so a host that drifts during the run drifts under every row alike. Every plan request's chunks (what ran,
from the response's meta_info) go into the records. Plan servers share one calibration cache.

Targets (issue 25): for every C the plan's median is at most 1.01x the best fixed chunk's median; the plan's
medians across C lie within 3% of each other. A difference inside a row's spread (min-max over its
requests) is a tie, whichever way it points. Writes results/tuning_free_compare.md (+ .jsonl records).

Usage: python benchmarks/tuning_free_compare.py [--input-len 8000] [--rounds 3]
       [--fixed-chunks 512,1024,2048,4096] [--plan-chunks 1024,4096,8192]
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from sglang_cpp.args import parse_ints
from sglang_cpp.bench import BenchConfig, run_ttft
from sglang_cpp.experiment import ExperimentConfig, Run, server_spec
from sglang_cpp.machine import provenance_lines
from sglang_cpp.server import launched


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input-len", type=int, default=8000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fixed-chunks", type=parse_ints, default=[512, 1024, 2048, 4096])
    ap.add_argument("--plan-chunks", type=parse_ints, default=[1024, 4096, 8192])
    ap.add_argument("--warmup-len", type=int, default=512)
    ap.add_argument("--results", default="results/tuning_free_compare.md")
    args = ap.parse_args()
    L = args.input_len
    cache = tempfile.mkdtemp(prefix="sglang-cpp-tf-cache-")
    cfg = ExperimentConfig(input_lens=(L,), fixed_chunks=tuple(args.fixed_chunks), pp1=False)
    fixed = [Run("fixed", C, (L,)) for C in args.fixed_chunks]
    plan = [Run("plan", C, (L,)) for C in args.plan_chunks]
    order = [r for pair in zip(fixed + [None] * len(plan), plan + [None] * len(fixed)) for r in pair if r]
    got: dict[str, list] = {r.key: [] for r in order}
    plans: dict[str, list] = {r.key: [] for r in order}
    records = []
    t_start = time.time()
    for rnd in range(args.rounds):
        for run in order:
            spec = server_spec(cfg, run)
            spec.env["SGLANG_CPP_CACHE_DIR"] = cache
            t0 = time.time()
            with launched(spec, 1800) as srv:
                bcfg = BenchConfig((L,), 1, 1, 1, 1000 * (rnd + 1), 0, run.label(), 3600.0, args.warmup_len)
                (rec,) = run_ttft(srv.base_url, bcfg, log=lambda m: None)
            if rec["failed"]:
                raise RuntimeError(f"{run.key} round {rnd}: {rec['errors']}")
            got[run.key].append(rec["ttfts"][0])
            plans[run.key].append((rec.get("chunk_plan") or [None])[0])
            records.append({**rec, "round": rnd, "config": run.key})
            print(f"round {rnd + 1} {run.label()}: TTFT {rec['ttfts'][0]:.2f} s ({time.time() - t0:.0f} s with the "
                  "server start)", flush=True)
    wall = time.time() - t_start
    med = {k: float(np.median(v)) for k, v in got.items()}
    spread = {k: (min(v) / med[k] - 1, max(v) / med[k] - 1) for k, v in got.items()}
    best = min((r for r in fixed), key=lambda r: med[r.key])
    b = med[best.key]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cmd = "python benchmarks/tuning_free_compare.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    import glob

    from sglang_cpp.costmodel import load_cost
    from sglang_cpp.planner_base import fixed_split, makespan

    served = sorted(glob.glob(f"{cache}/served/*.json"))
    model = load_cost(served[0]) if served else None

    def predicted(run) -> float | None:  # the served model's makespan of the chunks that ran (s)
        ch = fixed_split(L, run.chunk) if run.kind == "fixed" else (plans[run.key][0] or {}).get("ran")
        return makespan(ch, 0, model, 2, 0.0) / 1e3 if model is not None and ch else None

    out = ["# The plan without a sweep on the real CPU PP=2 server (issue 25 part 4)", "",
           *provenance_lines(cmd.strip()), f"- commit: {commit}",
           f"- SmolLM2-135M, PP=2, fp32, torch_native, {L}-token prompts; {args.rounds} rounds, each starting every "
           f"configuration in turn ({', '.join(r.key.split(':L=')[0] for r in order)}), one {args.warmup_len}-token "
           f"warm-up and one measured request per start; {wall / 60:.0f} min of servers", "",
           "| config | TTFT per round (s) | median (s) | spread (min / max vs median) | vs best fixed median | "
           "served model's prediction (s) | measured / predicted |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for r in order:
        lo, hi = spread[r.key]
        pr = predicted(r)
        out.append(f"| {r.label()} | {' / '.join(f'{t:.2f}' for t in got[r.key])} | {med[r.key]:.2f} | "
                   f"{lo:+.1%} / {hi:+.1%} | {med[r.key] / b:.3f} | "
                   + (f"{pr:.2f} | {med[r.key] / pr:.3f} |" if pr else "— | — |"))
    pm = [med[r.key] for r in plan]
    out += ["", f"Best fixed chunk: C={best.chunk} (median {b:.2f} s, spread {spread[best.key][0]:+.1%} / "
            f"{spread[best.key][1]:+.1%}).", "",
            "| target | value | verdict |", "|---|---:|---|"]
    for r in plan:
        ratio = med[r.key] / b
        tie = min(got[r.key]) <= max(got[best.key]) and max(got[r.key]) >= min(got[best.key])
        verdict = "met" if ratio <= 1.01 else ("tie (the spreads overlap)" if tie else "MISSED")
        out.append(f"| plan C={r.chunk} median <= 1.01x best fixed | {ratio:.3f} | {verdict} |")
    out.append(f"| plan medians across C within 3% | {max(pm) / min(pm) - 1:.1%} | "
               f"{'met' if max(pm) / min(pm) - 1 <= 0.03 else 'MISSED'} |")
    out += ["", "Regret of each fixed chunk against the plan (the plan's median over its C values):", "",
            "| fixed C | median (s) | / plan |", "|---:|---:|---:|"]
    pmed = float(np.median([t for r in plan for t in got[r.key]]))
    for r in fixed:
        out.append(f"| {r.chunk} | {med[r.key]:.2f} | {med[r.key] / pmed:.3f} |")
    out += ["", "Chunks the plan servers ran (response meta_info, first round):", ""]
    for r in plan:
        p = plans[r.key][0] or {}
        out.append(f"- C={r.chunk}: {p.get('ran')}")
        same = all((q or {}).get("ran") == p.get("ran") for q in plans[r.key])
        out.append(f"  (the same in every round: {'yes' if same else 'no'})")
    text = "\n".join(out) + "\n"
    Path(args.results).write_text(text)
    with open(Path(args.results).with_suffix(".jsonl"), "w") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
