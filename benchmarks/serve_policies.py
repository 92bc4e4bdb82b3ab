"""Mixed-load serving on the real CPU PP=2 server: SGLang's default, gLLM Token Throttling and our
time throttle (SGLANG_CPP_BATCH_POLICY), one server each, the same Poisson stream from SGLang's own
`python -m sglang.benchmark.serving` (via `sglang-cpp bench serve`'s dataset writer). Then:
- throughput, TTFT, TPOT and p99 ITL side by side, each relative to SGLang's default;
- goodput: the requests that met each latency SLO (`--slos`, chosen before the run), since a throttle's
  claim is latency, not tokens per second;
- with --rounds, the servers interleaved (A, B, A, B) and each row's spread over the rounds; with
  --rate-fractions, the rates taken from the first run's measured capacity (one below it, one above);
- every request's greedy output compared with the default run's;
- the serving simulator's throughput for each policy on the same workload shape and the server's
  calibrated stage models, against the measured one.

gllm and time run with --enable-mixed-chunk (decodes ride in the throttled prefill batches) and the
plan policy's dynamic chunking (the time throttle's cost model); the default runs neither.

Usage: python benchmarks/serve_policies.py [--num-requests 64] [--request-rate 0.5 | --rate-fractions 0.7,1.3]
       [--rounds 3] [--slos 30:500,60:1000]
       [--results results/serving_real.md] [--runs sglang,gllm,time,gllm-even]
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import requests

from sglang_cpp.bench.serve import (SLO, ServeBenchConfig, goodput, plot_runs, run_bench_serving, same_outputs,
                                     summary_table)
from sglang_cpp.bench.report import spread
from sglang_cpp.bench.server import ServerSpec, launched, reported_calibration
from sglang_cpp.bench.ttft import _find
from sglang_cpp.core.profile_io import cost_from_profile, load_profile
from sglang_cpp.files import update_section
from sglang_cpp.machine import provenance_lines

SMOLLM2 = os.path.expanduser("~/.cache/sglang-cpp/models/smollm2-135m")
RUNS = {  # label: (SGLANG_CPP_BATCH_POLICY, plugin env, extra server args)
    "sglang": ("sglang", {"SGLANG_CPP_POLICY": "off"}, ()),
    "gllm": ("gllm", {"SGLANG_CPP_POLICY": "plan"}, ("--enable-mixed-chunk",)),
    "time": ("time", {"SGLANG_CPP_POLICY": "plan"}, ("--enable-mixed-chunk",)),
    # gLLM's eq. 4 as a per-slot admission cap (opt-in); the simulator models gllm's own decode split
    "gllm-even": ("gllm", {"SGLANG_CPP_POLICY": "plan", "SGLANG_CPP_EVEN_DECODES": "1"}, ("--enable-mixed-chunk",)),
}


def measured_requests(rec: dict, cfg: ServeBenchConfig):
    """The requests bench_serving sent (its per-request input and output lengths, in its order) on
    Poisson arrivals at the same rate: our own draw of the length mixture differs (10 vs 5 long
    prompts on seed 0, twice the prefill tokens), which alone made the simulator look 2x off."""
    from sglang_cpp.whatif.serving_sim import Request
    from sglang_cpp.whatif.workload import LengthMix, poisson

    arrivals = [r.arrival_ms for r in poisson(len(rec["input_lens"]), cfg.request_rate, LengthMix.parse("1"),
                                              LengthMix.parse("1"), cfg.seed)]
    return [Request(i, a, int(n), int(m)) for i, (a, n, m) in enumerate(zip(arrivals, rec["input_lens"],
                                                                              rec["output_lens"]))]


def forward_check(stages, logs) -> list[str]:
    """Each stage's logged prefill forwards against its calibrated model, and its decode forwards
    against the prefill model's 1-token-extend estimate (what the simulator uses without a decode log)."""
    import numpy as np

    from sglang_cpp.files import read_events
    from sglang_cpp.whatif.serving_sim import DecodeCost

    out, events = [], read_events(logs, "forward", "decode_forward")
    for rank, m in enumerate(stages):
        ext, dec = [], []
        for r in events:
            if r.get("pp_rank") != rank:
                continue
            if r["event"] == "forward" and r.get("chunk"):
                pred = float(m.time(0, 0)) + float(np.sum(m.time(np.array(r["prefix"], float),
                                                                 np.array(r["chunk"], float)) - m.time(0, 0)))
                ext.append((r["ms"], pred))
            elif r["event"] == "decode_forward":
                dec.append((r["ms"], float(DecodeCost.from_prefill(m).time(r["batch_size"], r["context"]))))
        for kind, rows in (("prefill", ext), ("decode", dec)):
            if rows:
                ms, pred = np.array(rows).T
                out.append(f"| {rank} | {kind} | {len(rows)} | {ms.sum() / 1e3:.1f} | {pred.sum() / 1e3:.1f} | "
                           f"{np.median(ms / pred):.3f} |")
    return ["| stage | forwards | n | measured s | model s | median measured / model |", "|---|---|---:|---:|---:|---:|",
            *out] if out else []


def simulate(reqs, calibration: str, chunk: int, kv: int, decode=None) -> dict:
    """Simulated total tok/s per policy on `reqs` with the server's calibrated stage models."""
    from sglang_cpp.cli.simulate_serve import run_policies

    cost = cost_from_profile(load_profile(calibration), calibration)
    stages = list(getattr(cost, "stages", (cost,)))
    res = run_policies(reqs, stages, sorted({p for p, _, _ in RUNS.values()}), chunk=chunk, kv_capacity=kv,
                       decode=decode)
    return {label: res[policy].throughput()["total_tok_s"] for label, (policy, _, _) in RUNS.items()}


def rate_table(rate: float, labels: list[str], runs: dict, slos: list) -> list[str]:
    """One row per policy at `rate`: each round's throughput, its median and spread, the median TTFT and
    TPOT, and each SLO's goodput per round (requests that met it, of those sent)."""
    import numpy as np

    head = ("| run | throughput per round (tok/s) | median | spread (min / max vs median) | vs first | "
            "TTFT mean, median of rounds (s) | TPOT mean, median of rounds (ms) | "
            + " | ".join(f"goodput {k + 1} per round" for k in range(len(slos))) + " |")
    lines = [head, "|---|---|---:|---:|---:|---:|---:|" + "---|" * len(slos)]
    base = float(np.median([r["total_throughput"] for r in runs[(rate, labels[0])]]))
    for label in labels:
        recs = runs[(rate, label)]
        tput = [r["total_throughput"] for r in recs]
        good = [" / ".join(str(goodput(r, slo)[0]) for r in recs) + f" of {len(recs[0]['ttfts'])}" for slo in slos]
        lines.append(f"| {label} | {' / '.join(f'{v:.1f}' for v in tput)} | {np.median(tput):.1f} | {spread(tput, float(np.median(tput)))} | "
                     f"{np.median(tput) / base:.3f} | {np.median([r['mean_ttft_ms'] for r in recs]) / 1e3:.1f} | "
                     f"{np.median([r['mean_tpot_ms'] for r in recs]):.0f} | " + " | ".join(good) + " |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    d = ServeBenchConfig()
    ap.add_argument("--model-path", default=SMOLLM2)
    ap.add_argument("--num-requests", type=int, default=d.num_requests)
    ap.add_argument("--request-rate", type=float, default=d.request_rate)
    ap.add_argument("--rate-fractions", default="", help="instead of --request-rate: rates as fractions of the "
                    "first run's measured capacity (its request throughput with every request sent at once), "
                    "e.g. 0.7,1.3 for one rate below saturation and one above")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of the runs, interleaved (A, B, A, B): a "
                    "drifting host then moves every run alike; each row shows its spread over the rounds")
    ap.add_argument("--slos", default="", help="latency SLOs for goodput, TTFT_S:TPOT_MS,... (chosen before the run)")
    ap.add_argument("--input-lens", default=d.input_lens)
    ap.add_argument("--output-lens", default=d.output_lens)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--chunked-prefill-size", type=int, default=1024)
    ap.add_argument("--calib-max-len", type=int, default=16384, help="the plan servers' SGLANG_CPP_CALIB_MAX_LEN")
    ap.add_argument("--runs", default="sglang,gllm,time", help="which of " + ", ".join(RUNS))
    ap.add_argument("--results", default="results/serving_real.md")
    ap.add_argument("--section", default="Mixed load on the real CPU PP=2 server")
    ap.add_argument("--cache-dir", default="", help="SGLANG_CPP_CACHE_DIR of the plan servers (a fresh one "
                                                    "calibrates at the first start)")
    args = ap.parse_args()
    if args.rounds < 1:
        raise SystemExit(f"--rounds={args.rounds} must be >= 1")
    slos = SLO.parse_list(args.slos)
    fractions = [float(f) for f in args.rate_fractions.split(",") if f.strip()]
    labels = [r.strip() for r in args.runs.split(",") if r.strip()]
    unknown = [r for r in labels if r not in RUNS]
    if unknown:
        raise SystemExit(f"--runs: unknown {unknown}; choose from {', '.join(RUNS)}")
    cfg = ServeBenchConfig(args.num_requests, args.request_rate, args.input_lens, args.output_lens, args.seed)
    out_dir = Path(args.results).with_suffix("")
    calibration, notes, t0, capacity = None, [], time.time(), None

    def spec_of(label: str):
        policy, env, extra = RUNS[label]
        env = {**env, "SGLANG_CPP_BATCH_POLICY": policy, "SGLANG_CPP_CALIB_MAX_LEN": str(args.calib_max_len),
               "SGLANG_CPP_DECISION_LOG": str((out_dir / f"decisions-{label}-{{rank}}.jsonl").resolve())}
        if args.cache_dir:
            env["SGLANG_CPP_CACHE_DIR"] = args.cache_dir
        return ServerSpec(args.model_path, pp_size=2, chunk_size=args.chunked_prefill_size,
                          dynamic=env["SGLANG_CPP_POLICY"] == "plan", env=env, extra_args=extra), env

    for old in out_dir.glob("decisions-*.jsonl"):
        old.unlink()
    rates = [cfg.request_rate]
    if fractions:  # the first run's saturation throughput, on a server of its own
        spec, _ = spec_of(labels[0])
        with launched(spec, 1800, log_dir=str(out_dir / "logs-capacity")) as srv:
            capacity = run_bench_serving(replace(cfg, request_rate=float("inf")), srv.base_url, args.model_path,
                                         out_dir, "capacity")
        rates = [round(f * capacity["request_throughput"], 4) for f in fractions]
        print(f"capacity {capacity['request_throughput']:.4f} req/s -> rates {rates}", flush=True)
    runs: dict = {}
    for rnd in range(args.rounds):
        for label in labels:
            spec, env = spec_of(label)
            s0 = time.time()
            with launched(spec, 1800, log_dir=str(out_dir / f"logs-{label}-{rnd}")) as srv:
                up = time.time() - s0
                for rate in rates:
                    if requests.post(f"{srv.base_url}/flush_cache", timeout=120).status_code != 200:
                        raise RuntimeError(f"{label} round {rnd}: /flush_cache refused before the {rate}/s stream")
                    rec = run_bench_serving(replace(cfg, request_rate=rate), srv.base_url, args.model_path, out_dir,
                                            f"{label}-{rate:g}-{rnd}")
                    rec.update(label=label, rate=rate, round=rnd)
                    runs.setdefault((rate, label), []).append(rec)
                    notes.append(f"- {label}, round {rnd}, {rate:g}/s: stream {rec['duration']:.0f} s")
                calibration = calibration or reported_calibration(srv.log())
            notes.append(f"- {label}, round {rnd}: server healthy after {up:.0f} s; `{shlex.join(spec.command(0))}` "
                         f"with {env}")
            print(summary_table([runs[(r, lb)][-1] for r in rates for lb in labels if (r, lb) in runs]), flush=True)
    first = [runs[(rates[0], lb)][0] for lb in labels]  # round 0 at the first rate: the simulator's and plot's
    lines = [*provenance_lines("python benchmarks/" + " ".join([Path(__file__).name, *sys.argv[1:]])),
             f"- workload: {cfg.num_requests} requests, Poisson arrivals, input lengths {cfg.input_lens}, "
             f"output lengths {cfg.output_lens}, seed {cfg.seed}; prompts of random words (no shared prefixes); "
             f"the radix cache flushed before each stream",
             f"- driver: `{first[0]['command']}` (paths as run; --request-rate per row)",
             f"- {args.rounds} round(s), each starting every run in turn ({', '.join(labels)}); each server serves "
             f"every rate in turn ({', '.join(f'{r:g}/s' for r in rates)})",
             f"- wall: {time.time() - t0:.0f} s"]
    if capacity:
        lines.append(f"- capacity: {labels[0]} with all {capacity['completed']} requests sent at once served "
                     f"{capacity['request_throughput']:.4f} req/s ({capacity['total_throughput']:.1f} tok/s, "
                     f"{capacity['duration']:.0f} s); rates = {args.rate_fractions} x that")
    if slos:
        lines.append("- SLOs for goodput, chosen before the run: " + "; ".join(f"({k + 1}) {s}" for k, s in
                                                                           enumerate(slos)))
    lines += notes
    for rate in rates:
        lines += ["", f"### {rate:g} requests/s" + (f" ({rate / capacity['request_throughput']:.2f}x capacity)"
                                                    if capacity else ""), "", *rate_table(rate, labels, runs, slos), ""]
        for label in labels[1:]:
            pairs = [same_outputs(a, b) for a, b in zip(runs[(rate, labels[0])], runs[(rate, label)])]
            lines.append(f"- {label}: {sum(p[0] for p in pairs)} of {sum(p[1] for p in pairs)} greedy outputs equal "
                         f"to {labels[0]}'s (every round)")
    lines += ["", "Round 0 at the first rate, every column:", "", summary_table(first)]
    if calibration:
        from sglang_cpp.cli.simulate_serve import decode_costs

        base = first[0]
        kv = _find(base.get("server_info") or {}, "max_total_num_tokens") or 1 << 20
        reqs = measured_requests(base, replace(cfg, request_rate=rates[0]))
        cost = cost_from_profile(load_profile(calibration), calibration)
        stages = list(getattr(cost, "stages", (cost,)))
        logs = sorted(str(p) for p in out_dir.glob("decisions-*.jsonl"))
        sims = {"1-token extend": simulate(reqs, calibration, args.chunked_prefill_size, kv)}
        if logs:
            sims["fitted on the decode log"] = simulate(reqs, calibration, args.chunked_prefill_size, kv,
                                                        decode_costs(logs, len(stages)))
        lines += ["", f"Simulator (`serving_sim`) on the requests bench_serving sent in round 0 (their lengths and "
                      f"order, Poisson arrivals at {rates[0]:g}/s), stage models from `{calibration}`, KV {kv} "
                      f"tokens; decode cost per stage either a 1-token extend of the prefill model or fitted on "
                      f"the servers' logged decode forwards ({', '.join(Path(p).name for p in logs) or 'none'}):", "",
                  "| run | measured tok/s | " + " | ".join(f"simulated, decode {k} | measured / simulated"
                                                          for k in sims) + " |",
                  "|---|---:|" + "---:|---:|" * len(sims)]
        for r in first:
            cells = [f"{sim[r['label']]:.1f} | {r['total_throughput'] / sim[r['label']]:.3f}" for sim in sims.values()]
            lines.append(f"| {r['label']} | {r['total_throughput']:.1f} | " + " | ".join(cells) + " |")
        check = forward_check(stages, logs)
        if check:
            lines += ["", "Logged forwards against the models (all runs; prefill: the calibrated t(L, x) summed over "
                          "the batch's chunks; decode: the 1-token-extend estimate):", "", *check]
    png = plot_runs(first, Path(args.results).with_suffix(".png"))
    lines += ["", f"![measured side by side, round 0 at the first rate]({png.name})"]
    text = "\n".join(lines)
    print(text)
    update_section(args.results, args.section, text, head="# Serving under mixed load")
    return 0


if __name__ == "__main__":
    sys.exit(main())
