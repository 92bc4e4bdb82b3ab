"""Issues 44 and 55 on the real CPU server: bursts of 4 prompts of 6000 tokens at once on SmolLM2-135M, PP2.

Four servers, started fresh and interleaved round by round (A, B, C, D, A, B, C, D, ...): the plan (the
default: queue-aware, at --chunked-prefill-size 1024 as a memory cap), fixed C=1024 and fixed C=2048 (the
plugin off), and upstream's dynamic chunking at C=4096, sigma 0.75 (its algorithm through
SGLANG_CPP_POLICY=quadratic, on upstream's fit emulated from the plan server's calibration, as `bench compare`
does: upstream's own startup profiling takes about 20 minutes on this kind of host). Per burst: each request's
TTFT from the moment all four were sent, the mean, and the input throughput (4 x 6000 tokens over the time the
last one finished). From the decision logs: whether both stages ran the same forwards (every prefill forward's
requests, prefixes and chunks), the prefill forwards per stage, and the chunks each prompt ran.

What it can show (DEVELOPERS: the CPU server at PP2 can only show ties): the mechanism at work on a real
server (the prompts of a burst planned on the queue, the same chunks on both stages, nothing lost), and
whether the plan's extra chunks cost it anything there (issue 55). The gains live at PP >= 4 (results/bursts.md
and results/stream.md, simulated). Verdicts follow the noise rule both ways: ranges that overlap are a tie.

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
N, LEN, SIGMA = 4, 6000, 0.75
CHUNK = {"plan": 1024, "fixed": 1024, "fixed-2048": 2048, "dck": 4096}  # each server's --chunked-prefill-size
CONFIGS = tuple(CHUNK)
DCK_C = CHUNK["dck"]


def spec(name: str, work: Path, upstream: Path | None, dec: str) -> ServerSpec:
    env = {"SGLANG_CPP_DECISION_LOG": dec, "SGLANG_CPP_CACHE_DIR": str(work / "cache"),
           "SGLANG_CPP_CALIB_MAX_LEN": "8192", "SGLANG_CPP_CALIB_BUDGET_S": "0"}
    if name == "plan":
        env.update(SGLANG_CPP_POLICY="plan")
    elif name == "dck":
        env.update(SGLANG_CPP_POLICY="quadratic", SGLANG_CPP_PROFILE=str(upstream),
                   SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR=str(SIGMA))
    else:
        env["SGLANG_CPP_POLICY"] = "off"
    return ServerSpec(MODEL, pp_size=2, chunk_size=CHUNK[name], dynamic=name in ("plan", "dck"), env=env)


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
                    a, b, c = emulated_fit(stages, DCK_C, 8192)
                    upstream = work / f"upstream-C={DCK_C}.json"
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
                   "forwards": sum(1 for rids, _, _ in fw[0] if set(rids) & set(out["ids"])),
                   "replans": sum(e["replan"] for e in qp)}
            row["mean_ttft_s"] = float(np.mean(row["ttft_s"]))
            row["input_throughput"] = N * LEN / row["duration_s"]
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("ids",)}), flush=True)
    Path(args.results).with_suffix(".jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    cmd = " ".join(shlex.quote(a) for a in ["python", "benchmarks/bursts_cpu.py", *sys.argv[1:]])
    import subprocess

    flags = next((ln.split(":", 1)[1].split() for ln in subprocess.run(["lscpu"], capture_output=True, text=True)
                  .stdout.splitlines() if ln.startswith("Flags")), [])
    isa = ", ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags)
    lines = [f"# Bursts of {N} x {LEN} tokens on the real CPU server (SmolLM2-135M, PP2)", "",
             *provenance_lines(cmd, f"; lscpu flags: {isa}"),
             f"- raw records: `{Path(args.results).with_suffix('.jsonl').name}` (one line per server and round)", "",
             __doc__.split("\n\n")[1], "",
             "| server | input tok/s per round | median (range) | mean TTFT s per round | median (range) | "
             "both stages ran the same forwards | prefill forwards per burst | chunks per prompt (last round) | "
             "queue plans / replans |",
             "|---|---|---:|---|---:|---|---|---|---:|"]
    summary = {}
    for name in CONFIGS:
        rs = [x for x in rows if x["config"] == name]
        tp, mt = [x["input_throughput"] for x in rs], [x["mean_ttft_s"] for x in rs]
        summary[name] = (tp, mt)
        lines.append(f"| {name} | {', '.join(f'{v:.0f}' for v in tp)} | {np.median(tp):.0f} ({min(tp):.0f}-{max(tp):.0f}) | "
                     f"{', '.join(f'{v:.2f}' for v in mt)} | {np.median(mt):.2f} ({min(mt):.2f}-{max(mt):.2f}) | "
                     f"{'yes' if all(x['same_on_both_stages'] for x in rs) else 'NO'} | "
                     f"{', '.join(str(x['forwards']) for x in rs)} | "
                     f"{' / '.join(str(len(c)) for c in rs[-1]['chunks'])} | "
                     f"{sum(x['queue_plans'] for x in rs)} / {sum(x['replans'] for x in rs)} |")
    lines += ["", "The plan against each other server (noise rule, both ways: ranges that overlap are a tie):", ""]
    q_tp, q_mt = summary["plan"]

    def verdict(mine, theirs, better: str, worse: str, higher_is_better: bool) -> str:
        if max(min(mine), min(theirs)) <= min(max(mine), max(theirs)):
            return "tie"
        return better if (np.median(mine) > np.median(theirs)) == higher_is_better else worse

    for name in CONFIGS[1:]:
        tp, mt = summary[name]
        lines.append(f"- vs {name}: throughput {np.median(q_tp) / np.median(tp):.3f}x "
                     f"({verdict(q_tp, tp, 'plan higher', 'plan LOWER', True)}), mean TTFT "
                     f"{np.median(q_mt) / np.median(mt):.3f}x ({verdict(q_mt, mt, 'plan lower', 'plan HIGHER', False)})")
    Path(args.results).write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-4:]))
    return 0 if all(x["same_on_both_stages"] for x in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
