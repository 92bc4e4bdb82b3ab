"""Issue 44 item 4 on the real CPU server: bursts of 4 prompts of 8000 tokens at once on SmolLM2-135M, PP2.

Four servers, started fresh and interleaved round by round (A, B, C, D, A, B, C, D, ...): the queue-aware
plan (the default), the per-prompt plan (SGLANG_CPP_QUEUE_AWARE=0), fixed C=1024 (the plugin off) and
upstream's dynamic chunking at C=1024, sigma 0.75 (its algorithm through SGLANG_CPP_POLICY=quadratic, on
upstream's fit emulated from the plan server's calibration, as `bench compare` does). Per burst: each
request's TTFT from the moment all four were sent, the mean, and the input throughput (4 x 8000 tokens over
the time the last one finished). From the decision logs: whether both stages ran the same forwards (every
prefill forward's requests, prefixes and chunks), and the chunks each prompt ran.

What it can show (DEVELOPERS: the CPU server at PP2 can only show ties): the mechanism at work on a real
server (the prompts of a burst planned on the queue, the same chunks on both stages, nothing lost), and that
it costs nothing there. The gains live at PP >= 4 (results/bursts.md, simulated).

Usage: python benchmarks/bursts_cpu.py [--rounds 3] [--results results/bursts_cpu.md]
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from sglang_cpp.bench.client import generate, random_ids
from sglang_cpp.bench.server import ServerSpec, launched, reported_calibration
from sglang_cpp.core.profile_io import load_cost
from sglang_cpp.core.upstream import emulated_fit
from sglang_cpp.files import read_events
from sglang_cpp.machine import provenance_lines

MODEL = os.path.expanduser("~/.cache/sglang-cpp/models/smollm2-135m")
N, LEN, C, SIGMA = 4, 8000, 1024, 0.75
CONFIGS = ("plan", "plan-alone", "fixed", "dck")


def spec(name: str, work: Path, upstream: Path | None, dec: str) -> ServerSpec:
    env = {"SGLANG_CPP_DECISION_LOG": dec, "SGLANG_CPP_CACHE_DIR": str(work / "cache"),
           "SGLANG_CPP_CALIB_MAX_LEN": "8192", "SGLANG_CPP_CALIB_BUDGET_S": "0"}
    if name in ("plan", "plan-alone"):
        env.update(SGLANG_CPP_POLICY="plan", SGLANG_CPP_QUEUE_AWARE="1" if name == "plan" else "0")
    elif name == "dck":
        env.update(SGLANG_CPP_POLICY="quadratic", SGLANG_CPP_PROFILE=str(upstream),
                   SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR=str(SIGMA))
    else:
        env["SGLANG_CPP_POLICY"] = "off"
    return ServerSpec(MODEL, pp_size=2, chunk_size=C, dynamic=name != "fixed", env=env)


def burst(url: str, r: int) -> dict:
    generate(url, input_ids=random_ids(512, 90000 + r), timeout=3600)  # warm-up, unmeasured
    ids = [random_ids(LEN, 1000 * r + i) for i in range(N)]  # the same prompts for every server of a round
    t0 = time.perf_counter()
    with ThreadPoolExecutor(N) as pool:
        res = list(pool.map(lambda x: generate(url, input_ids=x, timeout=3600), ids))
    # each request's clock starts at its own send, all within milliseconds of t0
    return {"ttft_s": [g.ttft_s for g in res], "duration_s": time.perf_counter() - t0,
            "ids": [g.meta.get("id") for g in res]}


def forwards(dec: str) -> list[list]:
    """Per stage, every prefill forward (requests, prefixes, chunks) in order."""
    return [[(tuple(e["rids"]), tuple(e["prefix"]), tuple(e["chunk"])) for e in read_events([dec.format(rank=k)], "forward")]
            for k in (0, 1)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--results", default="results/bursts_cpu.md")
    ap.add_argument("--work", default="/tmp/sglang-cpp-bursts-cpu")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    upstream, rows = None, []
    for r in range(args.rounds):
        for name in CONFIGS:
            dec = str(work / f"{name}-r{r}-dec_{{rank}}.jsonl")
            for k in (0, 1):
                Path(dec.format(rank=k)).unlink(missing_ok=True)
            with launched(spec(name, work, upstream, dec), timeout=1800, log_dir=str(work / "logs")) as srv:
                if name == "plan" and upstream is None:  # upstream's fit, emulated from this calibration
                    stages = load_cost(reported_calibration(srv.log()))
                    a, b, c = emulated_fit(stages, C, 8192)
                    upstream = work / f"upstream-C={C}.json"
                    upstream.write_text(json.dumps({"format": "sglang-cpp-profile", "samples": [],
                                                    "upstream": {"a": a, "b": b, "c": c}}))
                out = burst(srv.base_url, r)
            fw = forwards(dec)
            ran = {}
            for rids, pre, ch in fw[0]:
                for rid, p, x in zip(rids, pre, ch):
                    if rid in out["ids"]:
                        ran.setdefault(rid, []).append(x)
            qp = [e for e in read_events([dec.format(rank=0)], "queue_plan") if e["rid"] in out["ids"]]
            row = {"config": name, "round": r, **out, "same_on_both_stages": fw[0] == fw[1],
                   "chunks": [ran.get(i, []) for i in out["ids"]], "queue_plans": len(qp),
                   "replans": sum(e["replan"] for e in qp)}
            row["mean_ttft_s"] = float(np.mean(row["ttft_s"]))
            row["input_throughput"] = N * LEN / row["duration_s"]
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("ids",)}), flush=True)
    Path(args.results).with_suffix(".jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    cmd = " ".join(shlex.quote(a) for a in ["python", "benchmarks/bursts_cpu.py", *sys.argv[1:]])
    lines = ["# Bursts of 4 x 8000 tokens on the real CPU server (SmolLM2-135M, PP2)", "", *provenance_lines(cmd), "",
             __doc__.split("\n\n")[1], "",
             "| server | input tok/s per round | median (range) | mean TTFT s per round | median (range) | "
             "both stages ran the same forwards | chunks per prompt (last round) | queue plans / replans |",
             "|---|---|---:|---|---:|---|---|---:|"]
    summary = {}
    for name in CONFIGS:
        rs = [x for x in rows if x["config"] == name]
        tp, mt = [x["input_throughput"] for x in rs], [x["mean_ttft_s"] for x in rs]
        summary[name] = (tp, mt)
        lines.append(f"| {name} | {', '.join(f'{v:.0f}' for v in tp)} | {np.median(tp):.0f} ({min(tp):.0f}-{max(tp):.0f}) | "
                     f"{', '.join(f'{v:.2f}' for v in mt)} | {np.median(mt):.2f} ({min(mt):.2f}-{max(mt):.2f}) | "
                     f"{'yes' if all(x['same_on_both_stages'] for x in rs) else 'NO'} | "
                     f"{' / '.join(str(len(c)) for c in rs[-1]['chunks'])} | "
                     f"{sum(x['queue_plans'] for x in rs)} / {sum(x['replans'] for x in rs)} |")
    lines += ["", "The queue-aware plan against each other server (noise rule: ranges that overlap are a tie):", ""]
    q_tp, q_mt = summary["plan"]
    for name in CONFIGS[1:]:
        tp, mt = summary[name]
        tie = max(min(q_tp), min(tp)) <= min(max(q_tp), max(tp))
        verdict = "tie" if tie else ("plan higher" if np.median(q_tp) > np.median(tp) else "plan LOWER")
        lines.append(f"- vs {name}: throughput {np.median(q_tp) / np.median(tp):.3f}x ({verdict}), "
                     f"mean TTFT {np.median(q_mt) / np.median(mt):.3f}x")
    Path(args.results).write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-4:]))
    return 0 if all(x["same_on_both_stages"] for x in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
