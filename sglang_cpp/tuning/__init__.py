"""What `sglang-cpp tune` (its commands: sglang_cpp/cli/tune/) computes: turn measurements into server settings.

fit        refit t(L, x) per PP stage from a profile or a plugin decision log; report and plot the fit
chunk      recommend plan-policy settings, upstream's (C, sigma) and the best fixed chunk, and write
           the per-device JSON the plugin loads as SGLANG_CPP_PROFILE
partition  cost-balanced SGLANG_PP_LAYER_PARTITION from per-layer costs (profile or analytic)
layout     rank TP x PP (x virtual stages) layouts of N GPUs for long prefill on the analytic model
sweep      the blog's tuning recipe on a live server (fixed chunks, sigma, plan), measured

Each command reads a frozen dataclass config whose fields map 1:1 to its kebab-case flags.
"""
from __future__ import annotations

from dataclasses import fields


def config_from_args(cls, args):
    """Build the frozen config `cls` from argparse args (field `foo_bar` is flag `--foo-bar`)."""
    return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


__all__ = ["config_from_args"]
