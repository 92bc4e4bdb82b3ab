"""`sglang-cpp simulate`: the discrete-event simulator (simulator.py) on the command line, with the
cost source (profile, coefficients or analytic model) and the policy dispatch (policy.py)."""
from __future__ import annotations

import argparse
import math

from ..args import alias, parse_chunk, parse_len, parse_prompt_len, parse_sigma, positive_int
from ..files import dumps
from ..whatif.simulator import RECV_MODES, SEND_MODES, SimConfig, simulate
from .cost_source import CostSource, add_cost_source_args, alias_cost_source


def add_simulate_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    a = parser.add_argument
    a("--input-len", dest="prompt_len", type=parse_prompt_len, required=True, metavar="LEN", help="prompt tokens (suffixes k, m: 128k, 1m)")
    a("--prefix-len", type=parse_len, default=0, help="cached prefix tokens (default 0)")
    a("--pp-size", type=positive_int, required=True, metavar="N", help="pipeline stages (SGLang's --pp-size)")
    a("--policy", choices=("fixed", "quadratic", "plan"), default="fixed",
      help="fixed C; quadratic: upstream's dynamic chunking (its fit emulated from the cost model unless "
           "--coeffs A,B,C or the profile's 'upstream'); plan: the sglang-cpp planner")
    a("--sigma", type=parse_sigma, default=0.75, help="SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR (quadratic)")
    a("--max-prefill-tokens", type=parse_len, default=16384, help="SGLang's --max-prefill-tokens")
    a("--chunked-prefill-size", dest="chunk_size", type=parse_chunk, default=None, metavar="LEN",
      help="the base chunk C: the fixed chunk, or upstream's first chunk (default 8k)")
    a("--method", default="equal-time", choices=["equal-time", "dp"],
      help="planner method for --policy plan: equal-time (default) or the exact DP (at most 192 aligned units)")
    a("--max-chunk", type=parse_len, default=None, help="planner's largest chunk")
    add_cost_source_args(parser, required=True)
    a("--p2p-latency-ms", type=float, default=0.0, metavar="MS", help="per hidden-state transfer between stages")
    a("--p2p-bandwidth-gbps", type=float, default=math.inf, help="GB/s (default: free)")
    a("--hidden-size", type=int, default=None, help="bytes per token = hidden * 2 (default: the model's)")
    a("--send-mode", choices=SEND_MODES, default="deferred",
      help="when a stage's send is committed (SGLang: deferred to before the next forward)")
    a("--recv-mode", choices=RECV_MODES, default="serial",
      help="how a stage receives (SGLang: serial, before each forward)")
    a("--virtual-stages", type=int, default=1,
      help="V model slices per rank (interleaved / virtual PP, whatif/virtual_pp.py): each chunk visits every "
           "rank V times; V > 1 simulates deferred sends with pre-posted receives")
    a("--visit-overhead-ms", type=float, default=None,
      help="fixed cost of each visit with --virtual-stages > 1 (default: the per-chunk overhead)")
    a("--trace", metavar="OUT.json", default=None, help="write a Chrome/Perfetto trace")
    a("--json", action="store_true", help="machine-readable output")
    alias(parser, "--input-len", "--prompt-len")
    alias(parser, "--chunked-prefill-size", "--chunk-size")
    alias_cost_source(parser)
    return parser


def run_simulate(args) -> int:
    """`sglang-cpp simulate`: plan (fixed, quadratic or planner) + simulate + report. Bad input raises
    ValueError (sglang_cpp.cli.main prints it and exits 2)."""
    src = CostSource.from_args(args)
    P = args.pp_size
    cost = src.cost(P)  # carrying the per-chunk overhead
    cfg = SimConfig(p2p_latency_ms=args.p2p_latency_ms, p2p_bandwidth_gbps=args.p2p_bandwidth_gbps,
                    hidden_size=args.hidden_size if args.hidden_size is not None else src.hidden_size(),
                    send_mode=args.send_mode, recv_mode=args.recv_mode)
    src.check_lengths([args.prompt_len])
    if args.method == "dp" and args.policy == "plan":
        from ..core.dp import check_dp_size

        check_dp_size(args.prompt_len, args.prefix_len, 64)
    R = args.prompt_len - args.prefix_len
    if R < 1:
        raise ValueError(f"--input-len={args.prompt_len} must exceed --prefix-len={args.prefix_len}")
    from ..core.policy import chunks_for

    C = args.chunk_size or 8192
    if C < 1:
        raise ValueError("--chunked-prefill-size must be >= 1")
    chunks = chunks_for(args.policy, args.prompt_len, cost, P, C, sigma=args.sigma, max_prefill=args.max_prefill_tokens,
                        coeffs=args.coeffs, profile=args.profile,
                        prefix_len=args.prefix_len, method=args.method, max_chunk=args.max_chunk or 0)
    if args.virtual_stages > 1:
        from ..whatif.virtual_pp import simulate_virtual

        res = simulate_virtual(chunks, cost, P, args.virtual_stages, cfg, visit_overhead_ms=args.visit_overhead_ms,
                               prefix_len=args.prefix_len)
    elif args.virtual_stages < 1:
        raise ValueError(f"--virtual-stages={args.virtual_stages} must be >= 1")
    else:
        res = simulate(chunks, cost, P, cfg, prefix_len=args.prefix_len)
    trace = str(res.save_trace(args.trace)) if args.trace else None
    if args.json:
        eff = dict(zip(("efficiency", "efficiency_source"), src.efficiency_used())) if src.kind == "analytic" else {}
        print(dumps({**res.to_dict(), "chunks": chunks, "prefix_len": args.prefix_len, "source": src.describe(),
                     "policy": args.policy, "virtual_stages": args.virtual_stages, "trace": trace, **eff}, indent=1))
    else:
        print(f"cost: {src.describe()}")
        print(f"policy {args.policy}: {len(chunks)} chunks {chunks[:8]}{' ...' if len(chunks) > 8 else ''}")
        print(res.summary())
        if trace:
            print(f"trace: {trace}  (open in https://ui.perfetto.dev)")
    return 0


__all__ = ["add_simulate_args", "run_simulate"]
