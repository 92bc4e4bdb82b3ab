"""`sglang-cpp tune {fit,chunk,partition,analytic,layout,sweep}`: dispatch to one small module per subcommand
(their flags and output here; the computation they share in sglang_cpp/tuning/).

The modules import numpy-level code only; matplotlib, scipy and server launches load when a command
needs them, so `sglang-cpp --help` stays fast.
"""
from __future__ import annotations

import argparse

from . import analytic_cmd, chunk_cmd, fit_cmd, layout_cmd, partition_cmd, sweep

COMMANDS = {
    "fit": (fit_cmd, "refit t(L, x) per stage from a profile or a decision log; coefficients, R^2, plot"),
    "chunk": (chunk_cmd, "recommend plan / upstream (C, sigma) / fixed chunk settings and write the "
                         "per-device SGLANG_CPP_PROFILE JSON"),
    "partition": (partition_cmd, "cost-balanced SGLANG_PP_LAYER_PARTITION vs SGLang's default split"),
    "analytic": (analytic_cmd, "calibrate the analytic model's efficiency (and per-chunk overhead) on measured "
                               "TTFTs; write its per-device JSON"),
    "layout": (layout_cmd, "rank the TP x PP (x virtual stages) layouts of N GPUs for long prefill: memory, best "
                           "chunk policy and partition, TTFT per length, crossovers, the winner's flags"),
    "sweep": (sweep, "measure fixed chunks, upstream sigma values and the plan policy on live servers"),
}


def add_args(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="tune_cmd", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    for name, (mod, help_) in COMMANDS.items():
        sp = sub.add_parser(name, help=help_, description=(mod.__doc__ or help_).strip(),
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_args(sp)


def run(args) -> int:
    return int(COMMANDS[args.tune_cmd][0].run(args) or 0)  # errors: sglang_cpp.cli.main


__all__ = ["add_args", "run", "COMMANDS"]
