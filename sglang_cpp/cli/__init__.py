"""`sglang-cpp` command line: plan, simulate, simulate-serve, profile, tune, bench.

The entry point (`main`, the `sglang-cpp` console script) and the table of subcommands. Each family
lives in its own module (cli/plan.py, simulate.py, simulate_serve.py, bench.py, the tune/ package;
profiler/cli.py), with the flags they share in cli/common.py; heavy imports (matplotlib, transformers,
sglang) stay inside the commands that need them.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from .. import __version__
from ..bench.client import ServerError

# name -> (module, add_args, run, help)
SUBCOMMANDS = {
    "plan": ("sglang_cpp.cli.plan", "add_plan_args", "run_plan", "print the chunk plan for one prompt"),
    "simulate": ("sglang_cpp.cli.simulate", "add_simulate_args", "run_simulate",
                 "simulate a pipeline running a chunk plan (TTFT, bubbles, Perfetto trace)"),
    "simulate-serve": ("sglang_cpp.cli.simulate_serve", "add_args", "run",
                       "simulate PP serving of a request stream under each batch policy (gLLM, TD-Pipe, SiPipe, ours)"),
    "profile": ("sglang_cpp.profiler.cli", "add_args", "run", "measure t(L, x) on this hardware"),
    "tune": ("sglang_cpp.cli.tune", "add_args", "run", "fit, recommend chunking/sigma/plan, partition layers"),
    "bench": ("sglang_cpp.cli.bench", "add_args", "run", "TTFT benchmark client and side-by-side comparison"),
}


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


__all__ = ["main", "SUBCOMMANDS", "command_name"]
