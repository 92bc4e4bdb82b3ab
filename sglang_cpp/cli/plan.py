"""`sglang-cpp plan`: the chunk plan for one prompt, as an ASCII timeline or JSON."""
from __future__ import annotations

import argparse

from ..args import alias, parse_chunk, parse_len, parse_prompt_len, parse_sigma, positive_int
from .cost_source import CostSource, add_cost_source_args, alias_cost_source


def add_plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", choices=["plan", "quadratic", "fixed"], default="plan",
                   help="plan: sglang-cpp's planner (default); quadratic: upstream's dynamic chunking from --coeffs "
                        "A,B,C; fixed: chunks of --chunked-prefill-size")
    add_cost_source_args(p)
    p.add_argument("--input-len", dest="prompt_len", type=parse_prompt_len, required=True, metavar="LEN",
                   help="prompt tokens (8k, 1m)")
    p.add_argument("--prefix-len", type=parse_len, default=0, metavar="LEN",
                   help="tokens already cached (radix/HiCache hit)")
    p.add_argument("--pp-size", type=positive_int, default=2, metavar="N", help="pipeline stages (SGLang's --pp-size)")
    p.add_argument("--chunked-prefill-size", dest="chunk_size", type=parse_chunk, default=None, metavar="LEN",
                   help="the base chunk C (SGLang's --chunked-prefill-size; a memory cap for the plan)")
    p.add_argument("--sigma", type=parse_sigma, default=0.75, help="SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR (quadratic)")
    p.add_argument("--page-size", type=positive_int, default=1, metavar="N",
                   help="KV page size (SGLang's --page-size): chunks align to it")
    p.add_argument("--context-length", dest="context_len", type=parse_len, default=None, metavar="LEN",
                   help="SGLang's --context-length (quadratic: its profiling range); default the prompt's")
    p.add_argument("--max-prefill-tokens", type=parse_len, default=16384, metavar="LEN",
                   help="SGLang's --max-prefill-tokens (the prefill-buffer ceiling's second term)")
    p.add_argument("--align", type=parse_len, default=None, metavar="LEN",
                   help="chunk alignment (default max(page-size, 64))")
    p.add_argument("--min-chunk", type=parse_len, default=None, metavar="LEN",
                   help="smallest non-final chunk (default one alignment unit: the cost model decides)")
    p.add_argument("--max-chunk", type=parse_len, default=None, metavar="LEN",
                   help="largest chunk (default SGLang's prefill-buffer ceiling: max(C, --max-prefill-tokens, "
                        "1.25 C) with dynamic chunking on PP)")
    p.add_argument("--method", choices=["equal-time", "dp"], default="equal-time",
                   help="the planner: equal-time (default) or the exact DP (slow past a few thousand aligned units)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--out", help="also write the plan JSON here")
    alias(p, "--input-len", "--prompt-len")
    alias(p, "--chunked-prefill-size", "--chunk-size")
    alias(p, "--context-length", "--context-len")
    alias_cost_source(p)


def build_plan(args):
    """The plan for `args`: the policy dispatch (core/policy.py) that `simulate`, `bench` and `tune` replay."""
    from ..core.policy import plan_for

    if args.policy == "quadratic":
        if not args.coeffs or len(args.coeffs.split(",")) != 3:
            raise ValueError("--policy quadratic needs --coeffs A,B,C (upstream's fitted f(l) = A l^2 + B l + C)")
        if not args.chunk_size:
            raise ValueError("--policy quadratic needs --chunked-prefill-size (the base chunk C)")
    if args.chunk_size and args.page_size and args.chunk_size % args.page_size:  # validation_hook.py:243-246
        raise ValueError(f"--chunked-prefill-size {args.chunk_size} is not divisible by --page-size {args.page_size}: "
                         "SGLang refuses it at startup; give a multiple of the page size")
    if args.min_chunk and args.max_chunk and args.min_chunk > args.max_chunk:
        raise ValueError(f"--min-chunk {args.min_chunk} is above --max-chunk {args.max_chunk}: lower the first or "
                         "raise the second")
    if args.method == "dp" and args.policy == "plan":
        from ..core.dp import check_dp_size

        check_dp_size(args.prompt_len, args.prefix_len, args.align or max(args.page_size or 1, 64))
    src = CostSource.from_args(args)
    cost = src.cost(args.pp_size)  # carrying the per-chunk overhead
    src.check_lengths([args.prompt_len])
    max_chunk = args.max_chunk or served_cap(args.profile)
    if args.policy == "fixed" and not args.chunk_size:
        raise ValueError("--policy fixed needs --chunked-prefill-size (the fixed chunk C)")
    return plan_for(args.policy, args.prompt_len, cost, args.pp_size, args.chunk_size or 0, sigma=args.sigma,
                    ctx=args.context_len, max_prefill=args.max_prefill_tokens,
                    coeffs=args.coeffs, prefix_len=args.prefix_len, page_size=args.page_size or 1,
                    method=args.method, max_chunk=max_chunk, min_chunk=args.min_chunk or 0,
                    align=args.align or 64)


def served_cap(profile: str | None) -> int:
    """A served profile's `measured_chunk` (the largest chunk the server measured, which its plans never
    exceed; plugin/startup/coverage.py), else 0: `plan --profile <served>` cuts the server's chunks."""
    if not profile:
        return 0
    from ..core.profile_io import load_profile, profile_cap

    return profile_cap(load_profile(profile), f"--profile {profile}")  # the server's check, the server's cap


def run_plan(args) -> int:
    plan = build_plan(args)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(plan.to_json(indent=1))
    src = CostSource.from_args(args)
    if not args.json and src.kind == "analytic":
        print(f"cost: {src.describe()}")
    print(plan.to_json() if args.json else plan.timeline())
    return 0
