"""Seeded fuzz of the whole-prompt planner (`plan_equal_time`, what every PP stage runs in its scheduler).

Each input is a random prompt (up to 2M tokens) and prefix, PP 1-64, a cost model of one of several
shapes (FA form, torch_native form, upstream's 1-D f(l), near-zero and huge coefficients, per-stage
models that differ), an alignment, min/max chunk, context limit and per-chunk overhead; about 5% are
made invalid on purpose. Every plan is checked: it covers the prompt exactly, every chunk but the last
is aligned and inside [min, max], it fits the context, and it is deterministic (a second process
replans every input and must produce the same chunks). Invalid input must raise a ValueError that
names the input; any other exception is a crash. Planning time is reported as p50/p99/max, and the
five slowest inputs are replanned to tell planning work from host jitter.

Usage: OMP_NUM_THREADS=1 python benchmarks/fuzz_planner.py [--num 100000] [--seed 0]
(one thread each; the second process for the determinism check runs at the same time on the other core).
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

from sglang_cpp.core.costmodel import CostModel, PipelineCost, with_overheads
from sglang_cpp.core.planner import PlanConfig, plan_equal_time

SHAPES = ("fa", "torch_native", "upstream", "near_zero", "huge", "per_stage")
# (what is broken, the words the ValueError must contain)
INVALID = {"prompt_len=0": "prompt_len", "prefix>=prompt": "prefix_len", "prefix<0": "prefix_len",
           "min>max": "--min-chunk", "align=0": "--align", "max<align": "--max-chunk",
           "overhead<0": "per-chunk overhead", "overhead=nan": "per-chunk overhead", "context<prompt": "context length",
           "coef<0": "coefficient", "b=e=f=0": "b = e = f = 0", "pp=0": "--pp-size"}


def _logu(rng, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _model(rng, shape: str) -> dict:
    if shape == "fa":  # GPU kernels: c0 + b x + a x (2L + x)
        a = _logu(rng, 1e-10, 1e-6)
        return {"c0": _logu(rng, 0.1, 50), "g": 0.0, "b": _logu(rng, 1e-4, 0.1), "d": 0.0, "e": 2 * a, "f": a}
    if shape == "torch_native":  # CPU SDPA over the whole prefix: ~ (L + x)^2
        q = _logu(rng, 1e-7, 1e-4)
        return {"c0": _logu(rng, 1, 100), "g": _logu(rng, 1e-4, 0.05), "b": _logu(rng, 0.01, 1), "d": q,
                "e": 2 * q * rng.uniform(0.5, 1.5), "f": q}
    if shape == "upstream":  # f(l) = A l^2 + B l + C as upstream fits it
        m = CostModel.from_upstream(_logu(rng, 1e-11, 1e-6), _logu(rng, 1e-4, 0.1), _logu(rng, 0.1, 100))
        return m.coeffs
    if shape == "near_zero":
        return {"c0": _logu(rng, 1e-12, 1e-8), "g": 0.0, "b": _logu(rng, 1e-15, 1e-11), "d": 0.0,
                "e": 0.0, "f": _logu(rng, 1e-18, 1e-14)}
    if shape == "huge":
        a = _logu(rng, 1e-3, 10)
        return {"c0": _logu(rng, 1e3, 1e7), "g": _logu(rng, 1e-2, 10), "b": _logu(rng, 1, 1e4), "d": 0.0,
                "e": 2 * a, "f": a}
    raise ValueError(shape)


def gen_case(rng) -> dict:
    """One JSON-able planner input; 'invalid' names the defect injected, if any."""
    shape = SHAPES[rng.integers(len(SHAPES))]
    P = int(rng.choice([1, 2, 3, 4, 8, 16, 32, 64]))
    if shape == "per_stage":
        base = _model(rng, ("fa", "torch_native")[rng.integers(2)])
        stages = [{k: v * rng.uniform(0.5, 2.0) for k, v in base.items()} for _ in range(P)]
    else:
        stages = [_model(rng, shape)]
    N = int(_logu(rng, 1, 2 * 1024 * 1024))
    prefix = 0 if rng.random() < 0.5 else int(rng.integers(0, N))
    align = int(rng.choice([1, 16, 64, 64, 128, 256, 1024]))
    mx = int(_logu(rng, align, 65536)) // align * align or align
    mn = int(rng.choice([0, align, mx // 4, int(_logu(rng, 1, mx))]))
    case = {"N": N, "prefix": prefix, "P": P, "align": align, "min": mn, "max": mx,
            "ctx": None if rng.random() < 0.5 else N + int(rng.integers(0, 4096)),
            "o": float(rng.choice([0.0, _logu(rng, 0.01, 50)])), "C": int(rng.choice([0, 512, 4096, 12288])) or None,
            "stages": stages, "invalid": None}
    if rng.random() < 0.05:
        bad = list(INVALID)[rng.integers(len(INVALID))]
        case["invalid"] = bad
        if bad == "prompt_len=0":
            case.update(N=0, prefix=0)
        elif bad == "prefix>=prompt":
            case["prefix"] = N
        elif bad == "prefix<0":
            case["prefix"] = -1
        elif bad == "min>max":
            case["min"] = mx + align
        elif bad == "align=0":
            case["align"] = 0
        elif bad == "max<align":
            case.update(align=max(align, 64) * 2, max=max(align, 64))
        elif bad == "overhead<0":
            case["o"] = -1.0
        elif bad == "overhead=nan":
            case["o"] = float("nan")
        elif bad == "context<prompt":
            case.update(N=max(N, 2), ctx=max(N, 2) - 1, prefix=0)
        elif bad == "coef<0":
            case["stages"][0] = {**case["stages"][0], "g": -1e-3}
        elif bad == "b=e=f=0":
            case["stages"][0] = {**case["stages"][0], "b": 0.0, "e": 0.0, "f": 0.0}
        elif bad == "pp=0":
            case["P"] = 0
    return case


def plan_case(case: dict) -> list[int]:
    models = [CostModel(**s) for s in case["stages"]]
    cost = models[0] if len(models) == 1 else PipelineCost(tuple(models))
    cost = with_overheads(cost, case["o"], max(1, case["P"]))  # the per-chunk overhead rides on the cost
    cfg = PlanConfig(pp_size=case["P"], align=case["align"], min_chunk=case["min"], max_chunk=case["max"],
                     context_len=case["ctx"])
    return list(plan_equal_time(case["N"], cost, cfg, case["prefix"]).chunks)


def too_many_chunks(case: dict) -> bool:
    """Valid but degenerate: more chunks than any server runs (planner.MAX_PLAN_CHUNKS); a clear error."""
    from sglang_cpp.core.planner import MAX_PLAN_CHUNKS

    hi = case["max"] // case["align"] * case["align"]
    return -(-(case["N"] - case["prefix"]) // hi) > MAX_PLAN_CHUNKS


def violations(case: dict, chunks: list[int]) -> list[str]:
    """What is wrong with a plan for a valid input (empty: nothing)."""
    al, mx = case["align"], case["max"] // case["align"] * case["align"]
    lo = max(al, -(-case["min"] // al) * al)
    out = []
    if case["prefix"] + sum(chunks) != case["N"]:
        out.append(f"covers {case['prefix'] + sum(chunks)} of {case['N']} tokens")
    out += [f"chunk {i}={c} not a multiple of {al}" for i, c in enumerate(chunks[:-1]) if c % al]
    out += [f"chunk {i}={c} outside [{lo}, {mx}]" for i, c in enumerate(chunks[:-1]) if not lo <= c <= mx]
    if not chunks or not 1 <= chunks[-1] <= mx:
        out.append(f"last chunk {chunks[-1] if chunks else None} outside [1, {mx}]")
    if case["ctx"] is not None and case["prefix"] + sum(chunks) > case["ctx"]:
        out.append("exceeds the context")
    return out


def run(num: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(num):
        if i % 1000 == 0:  # the fuzz's own records out of the collector's scans (SGLang's /freeze_gc does
            gc.freeze()    # the same for a serving process); the planner's garbage is still collected
        case = gen_case(rng)
        t0 = time.perf_counter()
        try:
            chunks, err, etype = plan_case(case), "", ""
        except Exception as exc:  # noqa: BLE001 -- classified below: ValueError expected only for invalid input
            chunks, err, etype = None, str(exc), type(exc).__name__
        ms = (time.perf_counter() - t0) * 1e3
        out.append({"i": i, "case": case, "chunks": chunks, "error": err, "etype": etype, "ms": ms})
    return out


def digest(chunks) -> str:
    return hashlib.sha1(json.dumps(chunks).encode()).hexdigest()[:16]


def classify(rec: dict) -> str:
    case, bad = rec["case"], rec["case"]["invalid"]
    if bad:
        if rec["etype"] == "ValueError" and INVALID[bad] in rec["error"]:
            return "rejected"
        return "crash" if rec["etype"] and rec["etype"] != "ValueError" else "bad-rejection"
    if rec["etype"] == "ValueError":  # a valid input has a plan (max-size chunks, a shorter last one)
        return "rejected" if too_many_chunks(case) and "--max-chunk" in rec["error"] else "bad-rejection"
    if rec["etype"]:
        return "crash"
    return "invalid-plan" if violations(case, rec["chunks"]) else "ok"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", default="results/reliability.md")
    ap.add_argument("--sequential", action="store_true", help="run the determinism process after the timed one")
    ap.add_argument("--digests-only", action="store_true", help=argparse.SUPPRESS)  # the second process
    args = ap.parse_args()
    t0 = time.time()
    if args.digests_only:
        print(json.dumps([digest(r["chunks"]) for r in run(args.num, args.seed)]))
        return 0
    argv = [sys.executable, __file__, "--num", str(args.num), "--seed", str(args.seed), "--digests-only"]
    env = {**os.environ, "PYTHONHASHSEED": "1", "OMP_NUM_THREADS": "1"}
    if args.sequential:  # one core: the second process after the first, so it never slows the timed one
        recs = run(args.num, args.seed)
        other = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout)
        return report(args, recs, other, time.time() - t0)
    # the second process replans every input on the other core, at the same time
    second = subprocess.Popen([sys.executable, __file__, "--num", str(args.num), "--seed", str(args.seed),
                               "--digests-only"], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONHASHSEED": "1", "OMP_NUM_THREADS": "1"})
    recs = run(args.num, args.seed)
    out, _ = second.communicate()
    if second.returncode:
        raise SystemExit(f"the second fuzz process failed with exit code {second.returncode}")
    return report(args, recs, json.loads(out), time.time() - t0)


def report(args, recs: list[dict], other: list[str], wall_s: float) -> int:
    from sglang_cpp.files import update_section
    from sglang_cpp.machine import provenance_lines

    kinds: dict[str, list] = {}
    for r in recs:
        kinds.setdefault(classify(r), []).append(r)
    nondet = [r for r, d in zip(recs, other) if digest(r["chunks"]) != d]
    valid = [r for r in recs if not r["case"]["invalid"]]
    upto1m = np.array([r["ms"] for r in valid if r["case"]["N"] <= 1 << 20])
    al64 = np.array([r["ms"] for r in valid if r["case"]["N"] <= 1 << 20 and r["case"]["align"] >= 64])
    allv = np.array([r["ms"] for r in valid])
    slow = sorted(valid, key=lambda r: -r["ms"])[:5]

    def pct(a, q):
        return f"{np.percentile(a, q):.2f}" if a.size else "-"

    cmd = (f"OMP_NUM_THREADS=1 python benchmarks/fuzz_planner.py --num {args.num} --seed {args.seed}"
           + (" --sequential" if args.sequential else ""))
    lines = [*provenance_lines(cmd), f"- wall time: {wall_s:.0f} s (both processes)", "",
             "| inputs | valid | invalid (injected) | ok plans | invalid plans | crashes | invalid input not named "
             "| valid input rejected | nondeterministic |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
             f"| {len(recs)} | {len(valid)} | {len(recs) - len(valid)} | {len(kinds.get('ok', []))} | "
             f"{len(kinds.get('invalid-plan', []))} | {len(kinds.get('crash', []))} | "
             f"{sum(1 for r in kinds.get('bad-rejection', []) if r['case']['invalid'])} | "
             f"{sum(1 for r in kinds.get('bad-rejection', []) if not r['case']['invalid'])} | {len(nondet)} |", "",
             "Planning time (ms, valid inputs, one core):", "",
             "| inputs | n | p50 | p99 | max | target |", "|---|---:|---:|---:|---:|---|",
             f"| prompt <= 1M, align >= 64 | {al64.size} | {pct(al64, 50)} | {pct(al64, 99)} | {pct(al64, 100)} "
             "| p99 <= 20, max <= 100 |",
             f"| prompt <= 1M, any align | {upto1m.size} | {pct(upto1m, 50)} | {pct(upto1m, 99)} | {pct(upto1m, 100)} "
             "| every input <= 50 |",
             f"| all (up to 2M) | {allv.size} | {pct(allv, 50)} | {pct(allv, 99)} | {pct(allv, 100)} | |", "",
             "Slowest valid inputs:", ""]
    for r in slow:
        c = r["case"]
        again = []
        for _ in range(5):  # replanned: a slow time that does not come back was the host, not the planner
            t0 = time.perf_counter()
            plan_case(c)
            again.append((time.perf_counter() - t0) * 1e3)
        lines.append(f"- {r['ms']:.1f} ms (replanned 5 times: {min(again):.1f}-{max(again):.1f} ms): N={c['N']} "
                     f"prefix={c['prefix']} PP={c['P']} align={c['align']} min={c['min']} max={c['max']} "
                     f"overhead={c['o']:.3g} ms, {len(c['stages'])} stage model(s), {len(r['chunks'] or [])} chunks")
    bad = [r for k in ("invalid-plan", "crash", "bad-rejection") for r in kinds.get(k, [])] + nondet
    if bad:
        lines += ["", "Failures (first 10):", ""]
        lines += [f"- input {r['i']}: {classify(r)} {r['etype']} {r['error'][:200]} "
                  f"{violations(r['case'], r['chunks'])[:3] if r['chunks'] else ''} case={json.dumps(r['case'])[:400]}"
                  for r in bad[:10]]
    text = "\n".join(lines)
    print(text)
    update_section(args.results, "1. The planner, fuzzed", text)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
