"""`sglang-cpp profile`: measure t(L, x) and write a profile JSON (optionally with the fitted model)."""
from __future__ import annotations

import argparse
import datetime as _dt
import re
import sys
from pathlib import Path

from ..args import alias, parse_ints, parse_len
from ..core.costmodel import COEFS, META_KEYS, fit_cost_model
from ..core.profile_io import save_profile
from .grid import BACKENDS, DEVICES, DTYPES, ProfileConfig


def parse_chunks(text: str) -> list[int]:
    """'256,512,1k' -> [256, 512, 1024]."""
    return list(parse_ints(text))


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=BACKENDS, default="hf",
                   help="hf: in-process transformers, per layer; server: a live SGLang server")
    p.add_argument("--model-path", dest="model", help="local Hugging Face model folder (hf backend)")
    alias(p, "--model-path", "--model")
    p.add_argument("--base-url", help="SGLang server URL, e.g. http://127.0.0.1:30000 (server backend)")
    p.add_argument("--max-len", type=parse_len, default=None,
                   help="largest L + x (default: the model's max_position_embeddings, capped at 32k)")
    p.add_argument("--chunks", type=parse_chunks, default=None,
                   help="chunk sizes x, e.g. 256,512,1k (default: geometric max-len/16 .. max-len/2)")
    p.add_argument("--num-prefixes", type=int, default=6, help="prefix lengths L per chunk size")
    p.add_argument("--align", type=int, default=64, help="prefix / default chunk alignment")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per point (median kept)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per point")
    p.add_argument("--layers", type=int, default=None, help="hf: load only the first K decoder layers")
    p.add_argument("--stage-layers", type=int, default=None,
                   help="hf: scale the layer time to an N-layer PP stage (default: the loaded layers)")
    p.add_argument("--include-embedding", action="store_true", help="hf: add the embedding (first stage)")
    p.add_argument("--include-head", action="store_true", help="hf: add final norm + lm_head (last stage)")
    p.add_argument("--device", choices=DEVICES, default="auto", help="where the HF backend runs (auto: cuda if present)")
    p.add_argument("--dtype", choices=DTYPES, default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--out", default=None, help="profile JSON (default ./profile-<model>-<device>.json)")
    p.add_argument("--fit", action="store_true", help="also fit the cost model and store it in the JSON")
    p.add_argument("--seed", type=int, default=0, help="random token ids")
    p.add_argument("--threads", type=int, default=None,
                   help="hf on cpu: torch threads (default: torch's; 1 is steadier on a shared host)")
    p.add_argument("--request-timeout", dest="timeout", type=float, default=600.0, help="server: seconds per request")
    alias(p, "--request-timeout", "--timeout")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _versions() -> dict:
    from sglang_cpp.machine import versions

    v = versions("sglang", "torch")
    return {f"{k}_version": None if s == "not installed" else s for k, s in v.items()}


def default_out(model: str | None, device: str | None) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(str(model or "model").rstrip("/")).name) or "model"
    return f"profile-{name}-{device or 'unknown'}.json"


def build_meta(cfg: ProfileConfig, backend_meta: dict) -> dict:
    meta = {k: None for k in META_KEYS}
    meta.update(_versions())
    meta.update(model=cfg.model, backend=cfg.backend,
                date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    meta.update({k: v for k, v in backend_meta.items() if v is not None or k not in meta})
    meta.update(repeats=cfg.repeats, warmup=cfg.warmup, include_embedding=cfg.include_embedding,
                include_head=cfg.include_head, seed=cfg.seed)
    return meta


def summary_table(samples: list[dict]) -> str:
    """ms pivot: one row per prefix L, one column per chunk size x."""
    Ls = sorted({s["L"] for s in samples})
    xs = sorted({s["x"] for s in samples})
    cell = {(s["L"], s["x"]): s["ms"] for s in samples}
    corner = "L \\ x"
    head = f"{corner:>8} " + " ".join(f"{x:>10}" for x in xs)
    rows = [head, "-" * len(head)]
    for L in Ls:
        rows.append(f"{L:>8} " + " ".join(f"{cell[L, x]:>10.3f}" if (L, x) in cell else f"{'':>10}" for x in xs))
    return "\n".join(rows)


def run(args) -> int:
    cfg = ProfileConfig.from_args(args)
    progress = not getattr(args, "quiet", False)
    if cfg.backend == "hf":
        from .hf import profile_hf

        samples, bmeta = profile_hf(cfg, progress=progress)
    else:
        from .server import profile_server

        samples, bmeta = profile_server(cfg, progress=progress)
    meta = build_meta(cfg, bmeta)
    out = cfg.out or default_out(meta.get("model"), bmeta.get("device") or meta.get("device_name"))
    path = save_profile(out, samples=samples, meta=meta)  # keep the measurements even if the fit fails
    print(f"chunk time (ms) on {meta.get('device_name')} [{meta.get('dtype')}], backend {cfg.backend}:")
    print(summary_table(samples))
    print(f"wrote {len(samples)} samples to {path}")
    if not cfg.fit:
        return 0
    try:
        cost = fit_cost_model([s["L"] for s in samples], [s["x"] for s in samples],
                              [s["ms"] for s in samples], meta=meta, name=f"profile {path}")
    except ValueError as exc:
        print(f"sglang-cpp profile: --fit failed: {exc}\n(the samples are saved; refit later with "
              "`sglang-cpp tune`)", file=sys.stderr)
        return 1
    save_profile(path, samples=samples, meta=meta, cost=cost)
    fit = cost.fit
    print(f"fit: {cost}")
    print("coeffs: " + ", ".join(f"{k}={getattr(cost, k):.6g}" for k in COEFS))
    held = fit.get("holdout", {})
    print(f"R^2={fit['r2']:.4f}  median rel err={fit['median_rel_err']:.3%}  max rel err="
          f"{fit['max_rel_err']:.3%}" + (f"  held-out median rel err={held['median_rel_err']:.3%}"
                                         if held else ""))
    print(f"stored the fitted model in {path}")
    return 0


__all__ = ["add_args", "run", "parse_chunks", "summary_table", "build_meta", "default_out"]
