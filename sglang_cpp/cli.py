"""`sglang-cpp` command line: plan, simulate, simulate-serve, profile, tune, bench.

Each subcommand lives in its own module and is imported lazily, so `sglang-cpp plan` never pays
for matplotlib, transformers or sglang imports.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys

from . import __version__
from .args import alias, parse_len
from .client import ServerError

# name -> (module, add_args, run, help)
SUBCOMMANDS = {
    "plan": ("sglang_cpp.cli", "add_plan_args", "run_plan", "print the chunk plan for one prompt"),
    "simulate": ("sglang_cpp.simulate_cli", "add_simulate_args", "run_simulate",
                 "simulate a pipeline running a chunk plan (TTFT, bubbles, Perfetto trace)"),
    "simulate-serve": ("sglang_cpp.serving_cli", "add_args", "run",
                       "simulate PP serving of a request stream under each batch policy (gLLM, TD-Pipe, SiPipe, ours)"),
    "profile": ("sglang_cpp.profiler.cli", "add_args", "run", "measure t(L, x) on this hardware"),
    "tune": ("sglang_cpp.tuning.cli", "add_args", "run", "fit, recommend chunking/sigma/plan, partition layers"),
    "bench": ("sglang_cpp.bench_cli", "add_args", "run", "TTFT benchmark client and side-by-side comparison"),
}


def add_cost_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--profile", help="profile / cost-model JSON (from `sglang-cpp profile` or `tune`)")
    g.add_argument("--coeffs", help="A,B,C (upstream f(l)=A l^2+B l+C) or c0,g,b,d,e,f (2-D model)")


def load_cost_arg(args):
    from .costmodel import load_cost, parse_coeffs

    if getattr(args, "profile", None):
        return load_cost(args.profile)
    if getattr(args, "coeffs", None):
        return parse_coeffs(args.coeffs)
    raise ValueError("give a cost model: --profile JSON or --coeffs c0,g,b,d,e,f")


def add_plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", choices=["plan", "quadratic", "fixed"], default="plan")
    add_cost_args(p)
    p.add_argument("--input-len", dest="prompt_len", type=parse_len, required=True, help="prompt tokens (8k, 1m)")
    p.add_argument("--prefix-len", type=parse_len, default=0, help="tokens already cached (radix/HiCache hit)")
    p.add_argument("--pp-size", type=int, default=2)
    p.add_argument("--chunked-prefill-size", dest="chunk_size", type=parse_len, default=None, help="the base chunk C")
    p.add_argument("--sigma", type=float, default=0.75, help="SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR (quadratic)")
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--context-length", dest="context_len", type=parse_len, default=None)
    p.add_argument("--max-prefill-tokens", type=int, default=16384)
    p.add_argument("--align", type=int, default=None, help="chunk alignment (default max(page-size, 64))")
    p.add_argument("--min-chunk", type=int, default=None,
                   help="smallest non-final chunk (default one alignment unit: the cost model decides)")
    p.add_argument("--max-chunk", type=int, default=None,
                   help="largest chunk (default SGLang's prefill-buffer ceiling: max(C, --max-prefill-tokens, "
                        "1.25 C) with dynamic chunking on PP)")
    p.add_argument("--chunk-overhead-ms", dest="overhead_ms", type=float, default=0.0,
                   help="fixed cost per chunk: launch, scheduling, P2P setup (SGLANG_CPP_CHUNK_OVERHEAD_MS)")
    p.add_argument("--method", choices=["equal-time", "dp"], default="equal-time")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--out", help="also write the plan JSON here")
    alias(p, "--input-len", "--prompt-len")
    alias(p, "--chunked-prefill-size", "--chunk-size")
    alias(p, "--context-length", "--context-len")
    alias(p, "--chunk-overhead-ms", "--overhead-ms")


def build_plan(args):
    """The plan for `args` (shared by `plan`, `simulate` and `tune`)."""
    from .plan import ChunkPlan
    from .planner import PlanConfig, make_plan, plan_dp, plan_equal_time, plan_fixed

    align = args.align or max(args.page_size, 64)
    if args.policy == "quadratic":
        from .costmodel import CostModel
        from .upstream import UpstreamPredictor

        if not args.coeffs or len(args.coeffs.split(",")) != 3:
            raise ValueError("--policy quadratic needs --coeffs A,B,C (upstream's fitted f(l) = A l^2 + B l + C)")
        if not args.chunk_size:
            raise ValueError("--policy quadratic needs --chunked-prefill-size (the base chunk C)")
        a, b, c = (float(v) for v in args.coeffs.split(","))
        up = UpstreamPredictor(a=a, b=b, c=c, chunk_size=args.chunk_size, sigma=args.sigma,
                               page_size=args.page_size, context_len=args.context_len or 1 << 62,
                               max_prefill_tokens=args.max_prefill_tokens)
        chunks = up.chunk_sequence(args.prompt_len, args.prefix_len)
        cfg = PlanConfig(pp_size=args.pp_size, align=align, max_chunk=max(chunks + [align]),
                         overhead_ms=args.overhead_ms)
        plan = make_plan(chunks, args.prompt_len, args.prefix_len, CostModel.from_upstream(a, b, c), cfg,
                         "quadratic")
        return ChunkPlan(**{**plan.__dict__, "meta": {"sigma": up.sigma, "target_ms": up.target_latency}})
    cost = load_cost_arg(args)
    cfg = plan_config_of(args)
    if args.policy == "fixed":
        if not args.chunk_size:
            raise ValueError("--policy fixed needs --chunked-prefill-size (the fixed chunk C)")
        return plan_fixed(args.prompt_len, cost, cfg, args.chunk_size, args.prefix_len)
    fn = plan_dp if args.method == "dp" else plan_equal_time
    return fn(args.prompt_len, cost, cfg, args.prefix_len)


def plan_config_of(args):
    """The server's planner settings for a command's flags (--pp-size, --chunked-prefill-size,
    --max-prefill-tokens, --page-size, --context-length, and where the command has them --min-chunk,
    --max-chunk, --align, --method): `PlanConfig.from_server`, the plugin's own mapping."""
    from .planner import PlanConfig

    C = getattr(args, "chunk_size", None)
    return PlanConfig.from_server(pp_size=args.pp_size, chunk_size=C or 0,
                                  max_prefill_tokens=args.max_prefill_tokens,
                                  page_size=getattr(args, "page_size", 1) or 1,
                                  context_len=getattr(args, "context_len", None),
                                  min_chunk=getattr(args, "min_chunk", None) or 0,
                                  max_chunk=getattr(args, "max_chunk", None) or 0,
                                  overhead_ms=args.overhead_ms,
                                  method=getattr(args, "method", "equal-time"),
                                  align=getattr(args, "align", None) or 64)


def run_plan(args) -> int:
    plan = build_plan(args)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(plan.to_json(indent=1))
    print(plan.to_json() if args.json else plan.timeline())
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="sglang-cpp", description=__doc__.splitlines()[0])
    ap.add_argument("--version", action="version", version=f"sglang-cpp {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, (mod, add, _run, help_) in SUBCOMMANDS.items():
        try:
            m = importlib.import_module(mod)
        except ImportError as exc:  # keep the other commands usable
            sp = sub.add_parser(name, help=f"{help_} (unavailable: {exc})")
            sp.set_defaults(_unavailable=str(exc))
            continue
        sp = sub.add_parser(name, help=help_, description=help_)
        getattr(m, add)(sp)
        sp.set_defaults(_run=getattr(m, _run))
    args = ap.parse_args(argv)
    if getattr(args, "_unavailable", None):
        print(f"sglang-cpp {args.cmd}: unavailable: {args._unavailable}", file=sys.stderr)
        return 2
    try:
        return int(args._run(args) or 0)
    except (ValueError, OSError, ServerError) as exc:  # bad input or an unreachable server: one message
        print(f"{command_name(args)}: error: {exc}", file=sys.stderr)
        return 2


def command_name(args) -> str:
    """'sglang-cpp tune fit', 'sglang-cpp bench ttft', 'sglang-cpp plan'."""
    sub = getattr(args, "bench_cmd", None) or getattr(args, "tune_cmd", None)
    return f"sglang-cpp {args.cmd}" + (f" {sub}" if sub else "")


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["main", "parse_len", "build_plan", "json"]
