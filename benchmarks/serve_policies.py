"""Mixed-load serving on the real CPU PP=2 server: SGLang's default, gLLM Token Throttling and our
time throttle (SGLANG_CPP_BATCH_POLICY), one server each, the same Poisson stream from SGLang's own
`python -m sglang.benchmark.serving` (via `sglang-cpp bench serve`'s dataset writer). Then:
- throughput, TTFT, TPOT and p99 ITL side by side, each relative to SGLang's default;
- every request's greedy output compared with the default run's;
- the serving simulator's throughput for each policy on the same workload shape and the server's
  calibrated stage models, against the measured one.

gllm and time run with --enable-mixed-chunk (decodes ride in the throttled prefill batches) and the
plan policy's dynamic chunking (the time throttle's cost model); the default runs neither.

Usage: python benchmarks/serve_policies.py [--num-requests 64] [--request-rate 0.5]
       [--results results/serving_real.md] [--runs sglang,gllm,time,gllm-even]
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from sglang_cpp.bench.serve import (ServeBenchConfig, load_runs, plot_runs, run_bench_serving, same_outputs,
                                     summary_table)
from sglang_cpp.bench.server import ServerSpec, launched, reported_calibration
from sglang_cpp.bench.ttft import _find
from sglang_cpp.core.costmodel import cost_from_profile, load_profile
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    d = ServeBenchConfig()
    ap.add_argument("--model-path", default=SMOLLM2)
    ap.add_argument("--num-requests", type=int, default=d.num_requests)
    ap.add_argument("--request-rate", type=float, default=d.request_rate)
    ap.add_argument("--input-lens", default=d.input_lens)
    ap.add_argument("--output-lens", default=d.output_lens)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--chunked-prefill-size", type=int, default=1024)
    ap.add_argument("--calib-max-len", type=int, default=16384, help="the plan servers' SGLANG_CPP_CALIB_MAX_LEN")
    ap.add_argument("--runs", default="sglang,gllm,time", help="which of " + ", ".join(RUNS))
    ap.add_argument("--results", default="results/serving_real.md")
    ap.add_argument("--cache-dir", default="", help="SGLANG_CPP_CACHE_DIR of the plan servers (a fresh one "
                                                    "calibrates at the first start)")
    ap.add_argument("--reuse", default="", help="runs to read from their earlier bench_serving output instead")
    args = ap.parse_args()
    cfg = ServeBenchConfig(args.num_requests, args.request_rate, args.input_lens, args.output_lens, args.seed)
    out_dir = Path(args.results).with_suffix("")
    records, calibration, notes, t0 = [], None, [], time.time()
    reuse = [r.strip() for r in args.reuse.split(",") if r.strip()]
    for label in [r.strip() for r in args.runs.split(",") if r.strip()]:
        if label in reuse:  # measured earlier on the same workload (file kept in results/)
            records.append(load_runs(out_dir, [label])[0])
            notes.append(f"- {label}: read from {out_dir / f'bench_serving-{label}.jsonl'} (an earlier run)")
            continue
        policy, env, extra = RUNS[label]
        env = {**env, "SGLANG_CPP_BATCH_POLICY": policy, "SGLANG_CPP_CALIB_MAX_LEN": str(args.calib_max_len),
               "SGLANG_CPP_DECISION_LOG": str((out_dir / f"decisions-{label}-{{rank}}.jsonl").resolve())}
        for old in out_dir.glob(f"decisions-{label}-*.jsonl"):
            old.unlink()
        if args.cache_dir:
            env["SGLANG_CPP_CACHE_DIR"] = args.cache_dir
        spec = ServerSpec(args.model_path, pp_size=2, chunk_size=args.chunked_prefill_size,
                          dynamic=env["SGLANG_CPP_POLICY"] == "plan", env=env, extra_args=extra)
        s0 = time.time()
        with launched(spec, 1800, log_dir=str(out_dir / f"logs-{label}")) as srv:
            up = time.time() - s0
            rec = run_bench_serving(cfg, srv.base_url, args.model_path, out_dir, label)
            calibration = calibration or reported_calibration(srv.log())
        notes.append(f"- {label}: server healthy after {up:.0f} s, stream {rec['duration']:.0f} s; "
                     f"`{shlex.join(spec.command(0))}` with {env}")
        records.append(rec)
        print(summary_table(records), flush=True)
    base = records[0]
    lines = [*provenance_lines("python benchmarks/" + " ".join([Path(__file__).name, *sys.argv[1:]])),
             f"- workload: {cfg.num_requests} requests, Poisson {cfg.request_rate}/s, input lengths {cfg.input_lens}, "
             f"output lengths {cfg.output_lens}, seed {cfg.seed}; prompts of random words (no shared prefixes)",
             f"- driver: `{next(r['command'] for r in records if 'command' in r)}` (paths as run)",
             f"- wall: {time.time() - t0:.0f} s", *notes, "", summary_table(records), ""]
    for r in records[1:]:
        same, n = same_outputs(base, r)
        lines.append(f"- {r['label']}: {same} of {n} greedy outputs equal to {base['label']}'s")
    if calibration:
        from sglang_cpp.cli.simulate_serve import decode_costs

        kv = _find(base.get("server_info") or {}, "max_total_num_tokens") or 1 << 20
        reqs = measured_requests(base, cfg)
        cost = cost_from_profile(load_profile(calibration), calibration)
        stages = list(getattr(cost, "stages", (cost,)))
        logs = sorted(str(p) for p in out_dir.glob("decisions-*.jsonl"))
        sims = {"1-token extend": simulate(reqs, calibration, args.chunked_prefill_size, kv)}
        if logs:
            sims["fitted on the decode log"] = simulate(reqs, calibration, args.chunked_prefill_size, kv,
                                                        decode_costs(logs, len(stages)))
        lines += ["", f"Simulator (`serving_sim`) on the requests bench_serving sent (their lengths and order, "
                      f"Poisson arrivals at {cfg.request_rate}/s), stage models from `{calibration}`, KV {kv} "
                      f"tokens; decode cost per stage either a 1-token extend of the prefill model or fitted on "
                      f"the servers' logged decode forwards ({', '.join(Path(p).name for p in logs) or 'none'}):", "",
                  "| run | measured tok/s | " + " | ".join(f"simulated, decode {k} | measured / simulated"
                                                          for k in sims) + " |",
                  "|---|---:|" + "---:|---:|" * len(sims)]
        for r in records:
            cells = [f"{sim[r['label']]:.1f} | {r['total_throughput'] / sim[r['label']]:.3f}" for sim in sims.values()]
            lines.append(f"| {r['label']} | {r['total_throughput']:.1f} | " + " | ".join(cells) + " |")
        check = forward_check(stages, logs)
        if check:
            lines += ["", "Logged forwards against the models (all runs; prefill: the calibrated t(L, x) summed over "
                          "the batch's chunks; decode: the 1-token-extend estimate):", "", *check]
    png = plot_runs(records, Path(args.results).with_suffix(".png"))
    lines += ["", f"![measured side by side]({png.name})"]
    text = "\n".join(lines)
    print(text)
    update_section(args.results, "Mixed load on the real CPU PP=2 server", text, head="# Serving under mixed load")
    return 0


if __name__ == "__main__":
    sys.exit(main())
