"""`sglang-cpp bench`: the subcommand (`ttft` on a real server or simulated, `compare`, and `serve` via
sglang.benchmark.serving). The client itself is bench/ttft.py; the side by side is bench/experiment.py; this module only wires
them to the command line."""
from __future__ import annotations

import argparse
import math
import sys

from ..args import alias, parse_chunk, parse_len, parse_lens, parse_sigma, positive_int
from ..bench import experiment
from ..bench import serve as serve_bench
from ..bench.ttft import (BenchConfig, _log, any_failed, format_block, plot_ttft, run_meta, run_ttft, summarize,
                          write_jsonl)
from ..core.policy import POLICIES
from ..core.upstream import check_sigma
from .common import add_experiment_args, run_experiment
from .cost_source import CostSource, add_cost_source_args, alias_cost_source


def parse_policies(text: str) -> list[tuple[str, int | None]]:
    """'plan' or 'fixed:6k,fixed:18k,quadratic:18k,plan:18k': chunk policies, each with its own
    --chunked-prefill-size (default: the flag's)."""
    out = []
    for item in str(text).split(","):
        name, _, chunk = item.strip().partition(":")
        if name not in POLICIES:
            raise argparse.ArgumentTypeError(f"--policy {text!r}: {name!r} is not one of {', '.join(POLICIES)}; "
                                             "give e.g. plan or fixed:6k,quadratic:18k,plan:18k")
        try:
            out.append((name, parse_len(chunk) if chunk else None))
        except (ValueError, argparse.ArgumentTypeError):
            raise argparse.ArgumentTypeError(f"--policy {text!r}: chunk {chunk!r} is not a length (e.g. 18k)") from None
    return out


def parse_input_lens(text: str):
    """--input-len: comma-separated lengths, each its own run ('8k,16k'), or one length mixture
    [WEIGHT:]LO[-HI],... whose prompts share a run ('0.7:16k-64k,0.3:128k-256k'; simulated only)."""
    if ":" in str(text) or "-" in str(text):
        from ..whatif.workload import LengthMix

        try:
            return LengthMix.parse(text, "--input-len")
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse_lens(text)


def parse_rates(text: str) -> tuple:
    """--request-rate: arrivals per second, > 0, or inf (every prompt at once); several comma-separated."""
    out = []
    for item in str(text).split(","):
        try:
            v = float(item)
        except ValueError:
            v = math.nan
        if not v > 0:
            raise argparse.ArgumentTypeError(f"--request-rate {text!r}: give rates > 0 in requests per second, or "
                                             "inf (every prompt at once), e.g. 0.5,1,inf")
        out.append(v)
    return tuple(out)


def parse_planning_ms(text: str):
    """--planning-ms: 'measured' (each decision's own time on this machine) or a fixed charge in ms >= 0."""
    if str(text).strip() == "measured":
        return None
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v >= 0):
        raise argparse.ArgumentTypeError(f"--planning-ms {text!r}: give 'measured' or a time in ms >= 0")
    return v


def _workloads(args):
    """(input length label, prompt lengths) per run: each plain --input-len its own run; a mixture one run, its
    lengths drawn with --seed."""
    n = args.num_requests
    if not isinstance(args.input_lens, tuple):  # a LengthMix
        import numpy as np

        lens = [int(v) for v in args.input_lens.sample(np.random.default_rng(_seed(args) + 1), n)]
        return [(args.input_lens, lens)]
    return [(L, [int(L)] * n) for L in args.input_lens]


def _seed(args) -> int:
    return 1 if args.seed is None else int(args.seed)  # bench_serving's default seed


def simulate_ttft(args) -> list[dict]:
    """Same records as run_ttft, from the simulator, for every --policy, --request-rate and --input-len, FIFO.
    Prompts arrive as bench_serving sends them (gamma gaps of shape --burstiness at --request-rate; inf: all
    at once), at most --max-concurrency at a time. Each prompt runs the chunks its policy gives it when it
    starts (whatif/stream.py): for `plan`, the plugin's queue-aware plan on the simulated chunks in flight,
    the prompts waiting and the offered load, replanned at the first chunk boundary after an arrival; the
    others are the same for every prompt. Each decision's planning time is charged (--planning-ms)."""
    from ..core.policy import plan_for
    from ..whatif.simulator import SimConfig
    from ..whatif.stream import StreamPolicy, plan_stream, poisson_arrivals
    P, src = args.pp_size, CostSource.from_args(args)
    cost, overhead_ms = src.cost(P), src.overhead_ms()  # the cost carries the overhead
    cfg = SimConfig(p2p_latency_ms=args.p2p_latency_ms, p2p_bandwidth_gbps=args.p2p_bandwidth_gbps,
                    hidden_size=src.hidden_size())
    records, n, C, seed = [], args.num_requests, args.max_concurrency, _seed(args)
    work = _workloads(args)
    src.check_lengths([m for _, lens in work for m in lens], "--input-len")
    check_sigma(args.sigma)
    for policy, pchunk in args.policy:
        chunk = pchunk or args.chunk_size or 8192
        label = args.policy_label if args.policy_label and len(args.policy) == 1 else \
            f"{policy} C={chunk}" + (f" sigma={args.sigma:g}" if policy == "quadratic" else "") + " (simulated)"
        meta = run_meta(label, True)
        hw = {"source": src.describe(), "pp_size": P, "tp": src.tp_size or 1, "chunk_size": chunk,
              "sim_policy": policy, "chunk_overhead_ms": overhead_ms,
              "planning_ms": "measured" if args.planning_ms is None else args.planning_ms}
        kw = dict(sigma=args.sigma, max_prefill=args.max_prefill_tokens, coeffs=args.coeffs, profile=args.profile)
        for rate in args.request_rate:
            for L, lens in work:
                memo = {}  # fixed and quadratic give a prompt the same chunks whatever the queue

                def chunks(m, prefix, view, policy=policy, chunk=chunk):
                    if policy in ("plan", "plan-alone"):  # planned at every decision, as the server does
                        return plan_for(policy, m, cost, P, chunk, prefix_len=prefix, view=view, **kw)
                    if (m, prefix) not in memo:
                        memo[(m, prefix)] = list(plan_for(policy, m, cost, P, chunk, prefix_len=prefix, **kw).chunks)
                    return memo[(m, prefix)]

                pol = StreamPolicy(policy, chunks, queue_aware=policy == "plan", planner=policy in ("plan", "plan-alone"))
                run = plan_stream(lens, pol, cost, P, max_concurrency=C, config=cfg, planning_ms=args.planning_ms,
                                  arrivals_ms=poisson_arrivals(n, rate, args.burstiness, seed))
                res = run.sim
                ttfts = [t / 1e3 for t in res.ttfts_ms]
                rec = summarize(ttfts, [""] * n, L if isinstance(L, int) else sum(lens) // n,
                                res.makespan_ms / 1e3, ttfts, lens=lens)
                records.append({"backend": "sglang-cpp-simulator", "dataset_name": "random-ids",
                                "max_concurrency": C, "warmup": 0, **rec,
                                "request_rate": "inf" if math.isinf(rate) else rate, "burstiness": args.burstiness,
                                "seed": seed, **({} if isinstance(L, int) else {"input_len_mix": str(L)}),
                                "warmup_errors": [],
                                "chunk_plan": {"policy": policy, "chunks": list(run.chunks[0]),
                                               "chunks_per_request": [list(c) for c in run.chunks],
                                               "replanned_at": [list(r) for r in run.replans],
                                               "planning_ms": [round(sum(d), 3) for d in run.planning_ms],
                                               "load": list(run.loads), "counted_behind": list(run.counted)},
                                "arrivals_ms": list(run.arrivals_ms), "simulated_setup": hw, **meta})
                if getattr(args, "trace", None):
                    res.save_trace(str(args.trace).format(policy=policy, chunk=chunk, input_len=L, request_rate=rate))
    return records


def _row(r: dict) -> str:
    """A side-by-side row's name: the input length (or mixture), and the request rate of a stream."""
    name = r.get("input_len_mix") or str(r["random_input_len"])
    rate = r.get("request_rate")
    return name if rate in (None, "inf") else f"{name} @ {rate:g} req/s"


def side_by_side(records: list[dict], args) -> str:
    """One row per input length, one column per policy (median TTFT in s), the plan against upstream
    dynamic chunking, and each policy's percent of the physical limit (analytic models only)."""
    labels = list(dict.fromkeys(r["policy"] for r in records))
    med = {(r["policy"], _row(r)): r["median_ttft_ms"] for r in records}
    kinds = {r["policy"]: r["chunk_plan"]["policy"] for r in records}
    plan = next((lb for lb in labels if kinds[lb] == "plan"), None)
    dck = next((lb for lb in labels if kinds[lb] == "quadratic"), None)
    from ..whatif.analytic import device_of, model_of, percent_of_limit

    limit, model, device, tp = None, args.analytic, args.gpu, args.tp_size or 1
    if args.profile:  # a `tune analytic` JSON names its model and device
        from ..core.profile_io import load_profile

        meta = load_profile(args.profile)["meta"]
        model, device, tp = meta.get("model"), meta.get("device_name"), int(meta.get("tp") or 1)
    try:  # a preset or the user's config on a device preset; a profile naming neither: no limit column
        spec, dev = model_of(model), device_of(device)
        limit = lambda ms, L: percent_of_limit(ms, spec, dev, L, tp=tp, pp=args.pp_size)  # noqa: E731
    except ValueError:
        pass
    head = ["input"] + [f"{lb} (s)" for lb in labels] + (["plan / upstream dynamic"] if plan and dck else [])
    head += [f"{lb} % of limit" for lb in labels] if limit else []
    out = ["SIMULATED side by side: median TTFT", "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for key in dict.fromkeys(_row(r) for r in records):
        L = next(r["random_input_len"] for r in records if _row(r) == key)
        row = [key] + [f"{med[(lb, key)] / 1e3:.2f}" for lb in labels]
        if plan and dck:
            row.append(f"{med[(plan, key)] / med[(dck, key)]:.3f}")
        row += [f"{limit(med[(lb, key)], L):.1f}%" for lb in labels] if limit else []
        out.append("| " + " | ".join(row) + " |")
    if limit:
        out.append("% of limit: the causal prefill FLOPs on tp*pp GPUs at dense peak / the predicted TTFT")
    return "\n".join(out)


def summary_table(records: list[dict]) -> str:
    """One row per input length (and policy): what bench_serving's blocks say, first and on one screen."""
    sim = any(r.get("simulated") for r in records)
    head = ["input", "policy", "completed", "failed", "median TTFT (ms)", "p90 TTFT (ms)", "p99 TTFT (ms)",
            "input tok/s"]
    out = [("SIMULATED " if sim else "") + "TTFT per input length (--detail: bench_serving's block for each)",
           "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    source = (records[0].get("simulated_setup") or {}).get("source") if records else None
    if source:  # the cost the table rests on (an analytic model: its efficiency and where that came from)
        out.insert(0, f"cost: {source}")
    fmt = lambda v: "n/a" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))  # noqa: E731
    for r in records:
        out.append("| " + " | ".join(fmt(v) for v in (_row(r), r.get("policy") or "-", r["completed"],
                                                        r["failed"], r["median_ttft_ms"], r["p90_ttft_ms"],
                                                        r["p99_ttft_ms"], r["input_throughput"])) + " |")
    return "\n".join(out)


# -- outputs --------------------------------------------------------------------------------------
def add_ttft_args(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a("--base-url", help="SGLang server, e.g. http://127.0.0.1:30000 (not needed when simulating)")
    a("--input-len", dest="input_lens", metavar="LEN[,LEN...]|MIX", type=parse_input_lens, required=True,
      help="prompt length, or several comma-separated, each its own run (8k = 8192); simulated, also a length "
           "mixture [WEIGHT:]LO[-HI],... whose prompts share one run (weights summing to 1, or none)")
    d = BenchConfig((1,))
    a("--num-prompts", dest="num_requests", type=int, default=d.num_requests, metavar="N",
      help="measured requests per length")
    a("--warmup-requests", dest="warmup", type=int, default=d.warmup,
      help="unmeasured requests per length, before the measured ones")
    a("--max-concurrency", type=int, default=d.max_concurrency, metavar="N",
      help="requests in flight at most (bench_serving's; default all)")
    a("--seed", type=int, default=d.seed, help="request i gets random ids from seed + i (default: a fresh seed per "
                                              "run, printed and recorded, so a rerun misses the radix cache)")
    a("--shared-prefix", type=parse_len, default=0, help="first LEN ids shared by all requests of a length")
    a("--output-file", dest="output_jsonl", help="append one bench_serving-style JSON line per length")
    a("--detail", action="store_true", help="each length's bench_serving result block (default: one summary table)")
    a("--plot", help="PNG of median TTFT (p90 bars) against input length")
    a("--policy-label", default="", help="name of the server's configuration, carried into the JSONL")
    a("--request-timeout", dest="timeout", type=float, default=3600.0, help="seconds per request")
    alias(p, "--request-timeout", "--timeout")
    alias(p, "--input-len", "--input-lens")
    alias(p, "--num-prompts", "--num-requests")
    alias(p, "--warmup-requests", "--warmup")
    alias(p, "--output-file", "--output-jsonl")
    g = p.add_argument_group("simulation (no server; output labelled SIMULATED)")
    add_cost_source_args(g, profile_flag="--simulate", exclusive=False)
    g.add_argument("--pp-size", type=positive_int, default=2, metavar="N", help="pipeline stages (SGLang's --pp-size)")
    g.add_argument("--chunked-prefill-size", dest="chunk_size", type=parse_chunk, default=None, metavar="LEN",
                   help="the base chunk C (default 8192)")
    g.add_argument("--policy", type=parse_policies, default=[("plan", None)],
                   help="chunk policy, or several side by side: NAME[:CHUNK],... with NAME plan, quadratic "
                        "(upstream dynamic chunking) or fixed, e.g. fixed:6k,fixed:18k,quadratic:18k,plan:18k")
    g.add_argument("--sigma", type=parse_sigma, default=0.75, help="SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR (quadratic)")
    g.add_argument("--max-prefill-tokens", type=parse_len, default=16384,
                   help="SGLang's --max-prefill-tokens: with --chunked-prefill-size, the prefill-buffer ceiling (16k = 16384)")
    g.add_argument("--trace", metavar="PATH",
                   help="Perfetto/Chrome trace of each simulated run, every prompt's chunks tagged r<request>c<chunk> "
                        "({policy}, {chunk} and {input_len} in PATH are filled in)")
    g.add_argument("--request-rate", type=parse_rates, default=(math.inf,), metavar="RATE[,RATE...]",
                   help="bench_serving's arrivals, requests per second (inf, the default: every prompt at once); "
                        "several comma-separated, each its own run")
    g.add_argument("--burstiness", type=float, default=1.0,
                   help="bench_serving's gamma shape of the gaps between arrivals (1: Poisson; lower: burstier)")
    g.add_argument("--planning-ms", type=parse_planning_ms, default=None, metavar="measured|MS",
                   help="planning time charged to each decision of the sglang-cpp planner, delaying the chunk it cuts "
                        "on every stage: 'measured' (the default: the decision's own time on this machine) or a "
                        "fixed charge in ms (fixed and quadratic decisions then cost 0)")
    g.add_argument("--p2p-latency-ms", type=float, default=0.0, metavar="MS",
                   help="simulated: per hidden-state transfer between stages")
    g.add_argument("--p2p-bandwidth-gbps", type=float, default=math.inf, metavar="GBPS",
                   help="simulated: the link between stages (default free)")
    alias(p, "--chunked-prefill-size", "--chunk-size")
    alias_cost_source(p)


def add_args(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_cmd", required=True)
    add_ttft_args(sub.add_parser("ttft", help="TTFT per input length (real server or simulated)",
                                 description="TTFT per input length: measured on a running SGLang server, or simulated"))
    add_experiment_args(sub.add_parser("compare", help="side by side on the CPU SmolLM2 server (launches servers)",
                                       description=experiment.__doc__.strip()), experiment.PRESETS["compare"])
    add_serve_args(sub.add_parser("serve", help="a mixed-load stream via sglang.benchmark.serving",
                                  description=serve_bench.__doc__.strip()))


def add_serve_args(p: argparse.ArgumentParser) -> None:
    """`bench serve`'s flags; defaults read from ServeBenchConfig."""
    d, a = serve_bench.ServeBenchConfig(), p.add_argument
    a("--base-url", required=True, help="a running SGLang server")
    a("--model-path", required=True, help="the served model's folder (its tokenizer writes the prompts)")
    a("--num-prompts", dest="num_requests", type=int, default=d.num_requests, metavar="N",
      help="requests to send")
    a("--request-rate", type=float, default=d.request_rate, help="Poisson arrivals per second (inf: all at once)")
    a("--input-len", dest="input_lens", metavar="MIX", default=d.input_lens,
      help="length mixture [WEIGHT:]LO[-HI],... of the prompts")
    a("--output-len", dest="output_lens", metavar="MIX", default=d.output_lens, help="length mixture of the outputs")
    a("--seed", type=int, default=d.seed, help="the random prompts (bench_serving's --seed)")
    a("--context-length", type=int, default=d.context_length,
      help="cut each prompt so it fits with its output (0: the model config's max_position_embeddings)")
    a("--label", default="run", help="this run's name in the table and the output file")
    a("--out-dir", default="results/serve", help="workload and bench_serving output files go here")
    alias(p, "--input-len", "--input-lens")
    alias(p, "--output-len", "--output-lens")
    alias(p, "--num-prompts", "--num-requests")


def run_ttft_cli(args) -> int:
    simulated = bool(args.profile or args.analytic or args.coeffs)
    if simulated and args.base_url:
        raise ValueError("--base-url cannot be combined with --simulate/--analytic/--coeffs: "
                         "drop --base-url to simulate, or the simulation options to measure")
    if not simulated and not args.base_url:
        raise ValueError("give --base-url of a running SGLang server, or --simulate PROFILE / --analytic MODEL")
    if args.profile and args.analytic:
        raise ValueError("give one cost source: --simulate PROFILE or --analytic MODEL, not both")
    if simulated and args.shared_prefix:
        raise ValueError("--shared-prefix is not simulated; drop it, or measure on a server with --base-url")
    mix = not isinstance(args.input_lens, tuple)
    if not simulated and (mix or args.request_rate != (math.inf,)):
        raise ValueError(f"{'a length mixture in --input-len' if mix else '--request-rate'} is simulated only here: "
                         "on a server, send a stream with `sglang-cpp bench serve --request-rate R --input-len MIX`")
    if not args.burstiness > 0 or not math.isfinite(args.burstiness):
        raise ValueError(f"--burstiness {args.burstiness}: give a finite number > 0 (1: Poisson)")
    if simulated:
        BenchConfig((args.input_lens.hi,) if mix else tuple(args.input_lens), args.num_requests, 0,
                    args.max_concurrency)  # validates
        records = simulate_ttft(args)
    else:
        cfg = BenchConfig(tuple(args.input_lens), args.num_requests, args.warmup, args.max_concurrency, args.seed,
                          args.shared_prefix, args.policy_label, args.timeout)
        records = run_ttft(args.base_url, cfg)
    if simulated and len(args.policy) > 1:
        print(side_by_side(records, args))
    else:
        print(summary_table(records))
    if args.detail:
        for r in records:
            print(format_block(r))
    if args.output_jsonl:
        _log(f"wrote {write_jsonl(records, args.output_jsonl)}")
    if args.plot:
        _log(f"wrote {plot_ttft(records, args.plot)}")
    if any_failed(records):
        n = sum(r["failed"] + len(r.get("warmup_errors") or []) for r in records)
        print(f"sglang-cpp bench: {n} request(s) failed; see 'errors' in the output", file=sys.stderr)
        return 1
    return 0


def run(args) -> int:
    if args.bench_cmd == "serve":
        return run_serve_cli(args)
    return run_ttft_cli(args) if args.bench_cmd == "ttft" else run_experiment(args)  # errors: cli.main


def run_serve_cli(args) -> int:
    cfg = serve_bench.ServeBenchConfig(args.num_requests, args.request_rate, args.input_lens, args.output_lens,
                                       args.seed, args.context_length)
    rec = serve_bench.run_bench_serving(cfg, args.base_url, args.model_path, args.out_dir, args.label)
    print(serve_bench.summary_table([rec]))
    return 0 if rec["completed"] == cfg.num_requests else 1
