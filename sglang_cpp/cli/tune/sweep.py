"""`sglang-cpp tune sweep`: the blog's chunk-tuning recipe, automated and measured on live servers.

One fresh server per configuration; TTFT of prompts of the target length, lower is better:
  1. fixed chunks (SGLANG_CPP_POLICY=off): the best --chunked-prefill-size C*;
  2. the sglang-cpp plan policy at base C* (its startup calibration is cached per device);
  3. upstream dynamic chunking at base 2*C* (clamped to the input length) for each sigma: upstream's
     algorithm through SGLANG_CPP_POLICY=quadratic, on the a, b, c upstream's own fit would get from
     that calibration at its profiling lengths (--upstream-profiling: let upstream profile at startup).
When the base covers the whole prompt, sigma has no effect (one chunk): that server runs once.
This is the `sweep` preset of the runner behind `bench compare` (sglang_cpp/bench/experiment.py): same
flags, resumable, a markdown table with the simulator's prediction beside each row.
"""
from __future__ import annotations

from ...bench.experiment import PRESETS
from ..common import add_experiment_args, run_experiment


def add_args(p) -> None:
    add_experiment_args(p, PRESETS["sweep"])


def run(args) -> int:
    return run_experiment(args)
