"""Issue 55 item 1: where the per-forward cost goes missing on the real CPU server (SmolLM2-135M, PP2).

The calibration times isolated forwards with the other stage idle; serving runs both stages at once on the
same cores and memory bandwidth. This script serves the same prompts on a plan server (its startup
calibration, fresh) and a fixed-chunk server (the plugin off, C=1024; its forwards logged too), interleaved
round by round, and reads every served prefill forward back from the decision logs (each stage's timed
`ModelRunner.forward` window, `ms`, at its prefix L and chunk x), then asks:
  - served / predicted: each forward against the plan server's calibrated forward model (no overhead term:
    the logged window holds none);
  - a least-squares fit of the served forwards, ms ~ c0 + b x + a x (2L + x) (torch_native's attention shape),
    per stage: its c0 against the calibrated model's;
  - contention: each forward's overlap with the other stage's forwards (the share of its window in which the
    other stage was computing too), and served / predicted when the other stage was idle (< 10%) or busy
    (> 90%);
  - the wall time outside the forwards: per stage, the burst's duration minus the sum of its forwards.
Per round: a warm-up prompt, a burst of 4 x 6000 random tokens sent at once, and 2 prompts of 6000 one after
the other. Writes results/served_cost.md and its raw records (results/served_cost.jsonl: every forward).

Usage: python benchmarks/served_cost.py [--rounds 1] [--results results/served_cost.md]
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
from sglang_cpp.bench.server import ServerSpec, launched
from sglang_cpp.core.costmodel import PipelineCost, model_from_dict
from sglang_cpp.files import read_events
from sglang_cpp.machine import provenance_lines

MODEL = os.path.expanduser("~/.cache/sglang-cpp/models/smollm2-135m")
N, LEN, C = 4, 6000, 1024
CONFIGS = ("plan", "fixed")


def spec(name: str, work: Path, dec: str) -> ServerSpec:
    env = {"SGLANG_CPP_DECISION_LOG": dec, "SGLANG_CPP_CACHE_DIR": str(work / "cache"),
           "SGLANG_CPP_CALIB_MAX_LEN": "8192", "SGLANG_CPP_POLICY": "plan" if name == "plan" else "off"}
    return ServerSpec(MODEL, pp_size=2, chunk_size=C, dynamic=name == "plan", env=env)


def serve(url: str, r: int) -> dict:
    generate(url, input_ids=random_ids(512, 70000 + r), timeout=3600)  # warm-up, unmeasured
    ids = [random_ids(LEN, 5000 * r + i) for i in range(N)]  # the same prompts for both servers of a round
    t0 = time.time()
    with ThreadPoolExecutor(N) as pool:
        res = list(pool.map(lambda x: generate(url, input_ids=x, timeout=3600), ids))
    t1 = time.time()
    for i in range(2):
        generate(url, input_ids=random_ids(LEN, 5000 * r + 100 + i), timeout=3600)
    return {"burst": (t0, t1), "ttft_s": [g.ttft_s for g in res], "end": time.time()}


def forwards(dec: str, since: float) -> list[list[dict]]:
    """Per stage, every timed prefill forward after `since`: t (end), ms, and for a forward of one request's
    chunk its L and x (a forward of several requests, fixed chunking's, has `rows` instead: no single (L, x))."""
    out = []
    for k in (0, 1):
        rows = []
        for e in read_events([dec.format(rank=k)], "forward"):
            if not e.get("ms") or e["t"] < since:
                continue
            if len(e["chunk"]) == 1:
                rows.append({"t": e["t"], "ms": float(e["ms"]), "L": int(e["prefix"][0]), "x": int(e["chunk"][0])})
            else:
                rows.append({"t": e["t"], "ms": float(e["ms"]), "rows": [list(v) for v in zip(e["prefix"], e["chunk"])]})
        out.append(rows)
    return out


def overlap(fw: list[dict], other: list[dict]) -> np.ndarray:
    """The share of each forward's window [t - ms, t] in which the other stage ran a forward."""
    o = sorted((e["t"] - e["ms"] / 1e3, e["t"]) for e in other)
    out = []
    for e in fw:
        a, b = e["t"] - e["ms"] / 1e3, e["t"]
        cover = sum(max(0.0, min(b, d) - max(a, c)) for c, d in o if d > a and c < b)
        out.append(cover / max(b - a, 1e-9))
    return np.array(out)


def fit(rows: list[dict]) -> tuple[float, float, float]:
    """ms ~ c0 + b x + a x (2L + x), least squares (a benchmark's reading, not the plugin's fit)."""
    L = np.array([r["L"] for r in rows], float)
    x = np.array([r["x"] for r in rows], float)
    A = np.stack([np.ones_like(x), x, x * (2 * L + x)], axis=1)
    c0, b, a = np.linalg.lstsq(A, np.array([r["ms"] for r in rows]), rcond=None)[0]
    return float(c0), float(b), float(a)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--results", default="results/served_cost.md")
    ap.add_argument("--work", default="/tmp/sglang-cpp-served-cost")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model, runs = None, []
    for r in range(args.rounds):
        for name in CONFIGS:
            dec = str(work / f"{name}-r{r}-dec_{{rank}}.jsonl")
            for k in (0, 1):
                Path(dec.format(rank=k)).unlink(missing_ok=True)
            with launched(spec(name, work, dec), 1800) as srv:
                start = time.time()
                got = serve(srv.base_url, r)
            if name == "plan":  # the calibrated forward model in force at startup (no overhead term)
                st = read_events([dec.format(rank=0)], "startup")[0]["cost"]
                model = model_from_dict(st)
            runs.append({"config": name, "round": r, **got, "forwards": forwards(dec, start)})
            print(f"{name} round {r}: burst {got['burst'][1] - got['burst'][0]:.1f} s, "
                  f"{[len(f) for f in runs[-1]['forwards']]} forwards", flush=True)
    kernel = list(model.stages) if isinstance(model, PipelineCost) else [model] * 2  # forward models alone
    if len(kernel) == 1:
        kernel *= 2
    rows = []
    for run in runs:
        fw = run["forwards"]
        t0, t1 = run["burst"]
        for k in (0, 1):
            every = fw[k]
            f = [e for e in every if "x" in e and e["x"] > 1]  # one request's chunk: an (L, x) to price
            pred = np.array([float(kernel[k].time(e["L"], e["x"])) for e in f])
            ratio = np.array([e["ms"] for e in f]) / pred
            ov = overlap(f, fw[1 - k])  # against every forward of the other stage
            for e, p, o in zip(f, pred, ov):
                e["pred_ms"], e["overlap"] = round(float(p), 3), round(float(o), 3)
            c0, b, a = fit(f)
            idle, busy = ratio[ov < 0.1], ratio[ov > 0.9]
            in_burst = [e for e in every if t0 <= e["t"] <= t1]
            outside = (t1 - t0) - sum(e["ms"] for e in in_burst) / 1e3
            rows.append(f"| {run['config']} | {run['round']} | {k} | {np.mean(run['ttft_s']):.1f} | {len(f)} | "
                        f"{np.median(ratio):.2f} | "
                        f"{np.median(idle) if idle.size else float('nan'):.2f} ({idle.size}) | "
                        f"{np.median(busy) if busy.size else float('nan'):.2f} ({busy.size}) | {c0:.0f} | "
                        f"{float(kernel[k].time(0.0, 0.0)):.0f} | {len(in_burst)} | {t1 - t0:.1f} | {outside:.1f} |")
    cmd = " ".join(shlex.quote(a) for a in ["python", "benchmarks/served_cost.py", *sys.argv[1:]])
    import subprocess

    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    flags = next((line.split(":", 1)[1].split() for line in lscpu.splitlines() if line.startswith("Flags")), [])
    isa = ", ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags)
    prov = provenance_lines(cmd, f"; lscpu flags: {isa}")
    raw = Path(args.results).with_suffix(".jsonl")
    with open(raw, "w") as fh:
        fh.write(json.dumps({"provenance": prov, "model": model.to_dict()}) + "\n")
        for run in runs:
            fh.write(json.dumps(run) + "\n")
    lines = ["# Where the per-forward cost goes missing on the real CPU server (SmolLM2-135M, PP2)", "", *prov,
             f"- raw records: `{raw.name}` (every timed forward: t, ms, L, x, the prediction and the overlap)", "",
             __doc__.split("\n\n")[1], "",
             "| server | round | stage | burst mean TTFT (s) | one-request forwards | served / predicted (median) | "
             "other stage idle | other stage busy | fitted c0 (ms) | calibrated t(0, 0) (ms) | forwards in the burst "
             "| burst (s) | burst time outside this stage's forwards (s) |",
             "|---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|", *rows,
             "", "'one-request forwards': the forwards of one request's chunk (every round's prompts), priced and "
             "fitted; 'other stage idle / busy': served / predicted (median) of those whose window the other stage "
             "overlapped < 10% / > 90% (count); 'forwards in the burst': every prefill forward that ended inside the "
             "burst (fixed chunking also batches several requests' chunks into one)."]
    Path(args.results).write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-len(rows) - 2:]))
    print(f"wrote {args.results} and {raw}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
