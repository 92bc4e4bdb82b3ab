"""The runner's flags (`bench compare`, `tune sweep`): one set, so both commands read a flag alike. The cost
source of the commands that price chunks is cli/cost_source.py."""
from __future__ import annotations

import argparse
import sys

from ..args import alias, parse_floats, parse_ints, parse_len, parse_lens, positive_int


def add_experiment_args(p, preset) -> None:
    """The flags of `bench compare` and `tune sweep`: one set, the preset's defaults."""
    from ..bench import experiment

    d, a = preset, p.add_argument
    a("--model-path", dest="model", default=d.model, help=f"model folder (default {experiment.DEFAULT_MODEL})")
    a("--pp-size", type=positive_int, default=d.pp_size, metavar="N", help="pipeline stages (SGLang's --pp-size)")
    a("--input-len", dest="input_lens", metavar="LEN[,LEN...]", type=parse_lens,
      default=d.input_lens, help="prompt length, or several comma-separated, e.g. 8k,16k")
    a("--fixed-chunks", type=parse_ints, default=d.fixed_chunks, help="the fixed-chunk sweep")
    a("--sigmas", type=parse_floats, default=d.sigmas, help="SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR values")
    a("--dynamic-base", type=int, default=d.dynamic_base,
      help="upstream dynamic chunking's --chunked-prefill-size as a multiple of the best fixed chunk")
    a("--plan", action=argparse.BooleanOptionalAction, default=d.plan, help="run the sglang-cpp plan server")
    a("--pp1", action=argparse.BooleanOptionalAction, default=d.pp1, help="run PP=1 on one core")
    a("--num-prompts", dest="num_requests", type=int, default=d.num_requests, metavar="N",
      help="measured requests per length and server")
    a("--warmup-requests", dest="warmup", type=int, default=d.warmup, help="unmeasured requests per length and server")
    a("--warmup-len", type=parse_len, default=d.warmup_len, help="tokens per warmup request (0: the measured length)")
    a("--seed", type=int, default=d.seed, help="the random prompts (bench_serving's --seed)")
    a("--profile", default=d.profile, help="SGLANG_CPP_PROFILE for the plan server and the simulator check "
                                            "(default: the plan server calibrates and reports its file)")
    a("--calib-max-len", type=parse_len, default=d.calib_max_len,
      help="the plan server's SGLANG_CPP_CALIB_MAX_LEN (0: the longest input)")
    a("--context-length", type=parse_len, default=d.context_length,
      help="server --context-length (default: the model's, raised to the longest input + 16 when too short)")
    a("--device", default=d.device, help="server --device")
    a("--upstream-profiling", action="store_true",
      help="upstream dynamic chunking profiles at startup (128 fresh prefills of up to 1.25*C tokens) instead "
           "of running its algorithm through SGLANG_CPP_POLICY=quadratic on the fit emulated from the calibration")
    a("--results", default=d.results, help=f"markdown table; state, .jsonl and logs beside it (default {d.results})")
    a("--plot", default=None, help="bar chart of median TTFT per configuration")
    a("--json", default=None, metavar="OUT.json", help="also write every row as strict JSON (each request's TTFT, "
                                                          "the simulator's figure, the machine and commit)")
    a("--timeout-per-server", type=float, default=d.timeout_per_server,
      help="seconds a server may take to become healthy (the plan server calibrates at its first start)")
    a("--request-timeout", type=float, default=d.request_timeout, help="seconds per request")
    a("--fresh", action="store_true", help="ignore the saved state of an earlier, interrupted run")
    a("--plan-chunks", type=parse_ints, default=d.plan_chunks,
      help="the tuning-free mode: the plan server at each of these --chunked-prefill-size values beside the "
           "--fixed-chunks, interleaved over --rounds rounds, with no sweep (no upstream or PP1 rows)")
    a("--rounds", type=int, default=d.rounds, help="tuning-free mode: rounds, each starting every configuration once")
    alias(p, "--model-path", "--model")
    alias(p, "--fixed-chunks", "--fixed")
    alias(p, "--sigmas", "--sigma")
    alias(p, "--plot", "--png")
    alias(p, "--input-len", "--input-lens")
    alias(p, "--num-prompts", "--num-requests")
    alias(p, "--warmup-requests", "--warmup")


def run_experiment(args) -> int:
    import dataclasses
    import shlex

    from ..bench import experiment

    cls = experiment.ExperimentConfig
    cfg = cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})
    return experiment.experiment(cfg, command=" ".join(shlex.quote(a) for a in ["sglang-cpp", *sys.argv[1:]]))
