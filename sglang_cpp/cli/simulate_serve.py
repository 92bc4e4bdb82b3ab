"""`sglang-cpp simulate-serve`: the serving simulator (serving_sim.py) on a workload, every batch policy
side by side: throughput, TTFT / TPOT / E2E / ITL percentiles, bubbles, KV occupancy, Perfetto traces."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from ..args import alias, parse_chunk, parse_len, positive_int, progress_bar
from ..files import dumps
from .cost_source import CostSource, add_cost_source_args, alias_cost_source


def add_args(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    add_cost_source_args(p, required=True, overhead=False)
    a("--pp-size", type=positive_int, required=True, metavar="N", help="pipeline stages (SGLang's --pp-size)")
    w = p.add_argument_group("workload: a trace, or Poisson arrivals")
    w.add_argument("--workload", help="JSON lines / CSV with arrival_ms, input_len, output_len")
    w.add_argument("--num-prompts", dest="num_requests", type=int, default=64, metavar="N", help="requests")
    w.add_argument("--request-rate", type=float, default=math.inf, help="requests per second (inf: all at once)")
    w.add_argument("--input-len", dest="input_lens", metavar="MIX", default="0.9:200-2k,0.1:6k-8k",
                   help="prompt lengths: [WEIGHT:]LO-HI,... uniform mixture")
    w.add_argument("--output-len", dest="output_lens", metavar="MIX", default="32-128",
                   help="output lengths: [WEIGHT:]LO-HI,...")
    w.add_argument("--seed", type=int, default=0, help="the random lengths and arrivals (bench_serving's --seed)")
    w.add_argument("--save-workload", help="write the generated requests as JSON lines (a --workload file)")
    a("--policies", default="sglang,gllm,time,tdpipe,sipipe",
      help="batch policies: sglang (SGLang's default), sarathi (--enable-mixed-chunk), gllm (Token "
           "Throttling), time (ours: throttling by predicted time), tdpipe, sipipe (SGLang's default with "
           "SiPipe's CPU sampling)")
    a("--chunked-prefill-size", dest="chunk", type=parse_chunk, default=2048, metavar="LEN",
      help="prefill token budget of sglang/sarathi/tdpipe; #MaxP of gllm/time")
    a("--kv-capacity", type=parse_len, default=parse_len("256k"), help="KV pool in tokens")
    a("--batch-overhead-ms", type=float, default=0.0, help="CPU prep per micro-batch and stage")
    a("--p2p-latency-ms", metavar="MS", type=float, default=0.0,
      help="P2P transfer time per micro-batch and hop (as simulate's --p2p-latency-ms per chunk)")
    a("--sample-ms", type=float, default=0.02,
      help="sampling per sequence on the last stage, which SiPipe's CPU sampling takes off it (an assumption: "
           "SiPipe measures 22-40%% extra last-stage time in decode)")
    a("--decode-log", nargs="+", metavar="JSONL",
      help="decision logs of a real server (SGLANG_CPP_DECISION_LOG) to fit each stage's decode cost on its "
           "measured decode forwards; without it a decode step is priced as a 1-token extend of the prefill "
           "model (1.2x the measured decode steps on the CPU server, results/serving_real.md)")
    a("--json", action="store_true", help="machine-readable output")
    a("--trace-dir", help="write one Perfetto trace per policy here")
    a("--plot", help="PNG of the KV occupancy over time, one line per policy")
    a("--disable-tqdm", action="store_true", help="no progress bar (stderr)")
    alias(p, "--chunked-prefill-size", "--chunk-size")
    alias_cost_source(p, overhead=False)
    alias(p, "--input-len", "--input-lens")
    alias(p, "--num-prompts", "--num-requests")
    alias(p, "--output-len", "--output-lens")
    alias(p, "--p2p-latency-ms", "--p2p-ms")


def run_policies(requests, prefill, names, *, chunk: int = 2048, decode=None, progress=None, **serve) -> dict:
    """{policy name: ServeResult} for each name, each on a fresh policy object: `chunk` is the prefill
    budget (sglang, sarathi, tdpipe) or #MaxP (gllm, time); sipipe is sglang with CPU sampling; `decode`
    the per-stage DecodeCost (default: from each prefill model); `serve` are the ServeConfig settings."""
    from ..core.batch_policy import make_policy
    from ..whatif.serving_sim import DecodeCost, ServeConfig, simulate_serving

    decode = list(decode) if decode is not None else [DecodeCost.from_prefill(m) for m in prefill]
    out = {}
    for name in (progress(names) if progress else names):
        base = "sglang" if name == "sipipe" else name
        pol = make_policy(base, **({"max_p": chunk} if base in ("gllm", "time") else {"chunk": chunk}))
        pol.name = name
        out[name] = simulate_serving(requests, prefill, decode, pol, ServeConfig(**serve, cpu_sampling=name == "sipipe"))
    return out


def decode_costs(paths, pp_size: int):
    """Per-stage DecodeCost fitted on decision logs, or None (the prefill models' estimate)."""
    if not paths:
        return None
    from ..whatif.serving_sim import read_decode_log

    fitted = read_decode_log(paths)
    if sorted(fitted) != list(range(pp_size)):
        raise ValueError(f"--decode-log {' '.join(paths)}: decode forwards of PP ranks {sorted(fitted)}, but "
                         f"--pp-size {pp_size} needs ranks 0-{pp_size - 1}; pass every rank's log")
    return [fitted[r] for r in range(pp_size)]


def format_table(results: dict) -> str:
    head = ("policy", "tok/s", "out tok/s", "TTFT mean", "TTFT p99", "TPOT mean", "TPOT p99", "E2E p50",
            "E2E p99", "ITL p99", "bubble")
    lines = ["SIMULATED serving (ms unless noted)", "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for name, r in results.items():
        th, lat = r.throughput(), r.latencies()
        f = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        lines.append(f"| {name} | {th['total_tok_s']:.1f} | {th['output_tok_s']:.1f} | {f(lat['ttft']['mean'])} | "
                     f"{f(lat['ttft']['p99'])} | {f(lat['tpot']['mean'])} | {f(lat['tpot']['p99'])} | "
                     f"{f(lat['e2e']['p50'])} | {f(lat['e2e']['p99'])} | {f(lat['itl']['p99'])} | "
                     f"{r.bubble_ratio:.3f} |")
    return "\n".join(lines)


def run(args) -> int:
    from ..files import pyplot, save_figure, save_json
    from ..whatif.workload import LengthMix, load_trace, poisson, save_trace

    if args.pp_size < 1:
        raise ValueError(f"--pp-size={args.pp_size} must be >= 1")
    if args.workload:
        requests = load_trace(args.workload)
    else:
        requests = poisson(args.num_requests, args.request_rate, LengthMix.parse(args.input_lens),
                           LengthMix.parse(args.output_lens, "--output-len"), args.seed)
    if args.save_workload:
        save_trace(requests, args.save_workload)
    prefill = CostSource.from_args(args).stage_costs(args.pp_size, overhead=False)  # --batch-overhead-ms prices it
    results = run_policies(requests, prefill, [n.strip() for n in args.policies.split(",") if n.strip()],
                           chunk=args.chunk, decode=decode_costs(args.decode_log, len(prefill)),
                           kv_capacity=args.kv_capacity, batch_overhead_ms=args.batch_overhead_ms,
                           p2p_latency_ms=args.p2p_latency_ms, sample_ms=args.sample_ms,
                           progress=progress_bar("simulate-serve", "policy", args.disable_tqdm))
    if args.trace_dir:
        for name, r in results.items():
            save_json(Path(args.trace_dir) / f"serving-{name}.json", r.to_chrome_trace())
    if args.plot:
        fig, ax = pyplot().subplots(figsize=(7, 4))
        for name, r in results.items():
            t, k = zip(*r.kv_timeline)
            ax.step([v / 1e3 for v in t], k, where="post", label=name)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("KV tokens reserved")
        ax.set_title("KV occupancy (SIMULATED)")
        ax.legend()
        save_figure(fig, args.plot)
    if args.json:
        print(dumps({n: r.summary() for n, r in results.items()}, indent=1))
    else:
        print(format_table(results))
    return 0


__all__ = ["add_args", "run", "run_policies", "decode_costs", "format_table"]
