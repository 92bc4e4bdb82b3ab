"""`sglang-cpp tune fit`: refit t(L, x) per PP stage from a profile or the plugin's decision log (sglang_cpp.tuning.fit
holds the fit; this module its flags)."""
from __future__ import annotations

import argparse

from ...args import alias
from ...core.profile_io import save_profile
from ...tuning import config_from_args
from ...tuning.fit import FORMS, FitConfig, as_cost, fit_stages, load_samples, plot_fit, report, residuals


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("profile", nargs="?", default=None,
                   help="profile JSON (sglang-cpp profile); optional with --from-log")
    p.add_argument("--from-log", nargs="+", default=(), metavar="FILE.jsonl",
                   help="refit from the plugin's SGLANG_CPP_DECISION_LOG files (one per rank; stage = pp_rank)")
    p.add_argument("--form", choices=FORMS, default="full",
                   help="full: c0+gL+bx+dL^2+eLx+fx^2 (any backend); fa: d=0, e=2f (FlashAttention kernels)")
    p.add_argument("--plot", dest="png", default=None, metavar="OUT.png", help="measured vs fitted plot")
    alias(p, "--plot", "--png")
    p.add_argument("--json", dest="out", default=None, metavar="FITTED.json",
                   help="write samples + fitted stages + residuals (strict JSON, loadable as SGLANG_CPP_PROFILE)")
    alias(p, "--json", "--out")


def run(args) -> int:
    cfg = config_from_args(FitConfig, args)
    samples, meta, where = load_samples(cfg)
    models = fit_stages(samples, cfg.form, meta, where)
    print(f"fitted {len(models)} stage(s) from {len(samples)} samples of {where}:")
    print(report(models))
    if cfg.png:
        print(f"wrote {plot_fit(models, samples, meta, cfg.png)}")
    if cfg.out:
        save_profile(cfg.out, samples=samples, meta=meta, cost=as_cost(models),
                     extra={"residuals": residuals(models, samples), "fit_source": where})
        print(f"wrote {cfg.out} (loadable as SGLANG_CPP_PROFILE)")
    return 0


__all__ = ["add_args", "run"]
