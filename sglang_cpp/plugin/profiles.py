"""Where a stage's cost model comes from: SGLANG_CPP_PROFILE, the per-device calibration cache,
or a fresh calibration (saved for the next start). Every path fails loudly, naming the input."""
from __future__ import annotations

import datetime as _dt
import glob
import logging
import os
import re
from pathlib import Path

from .. import envs
from ..machine import cpu_model
from ..costmodel import PipelineCost, cost_from_profile, load_profile, save_profile
from ..upstream import UpstreamPredictor

logger = logging.getLogger("sglang_cpp")


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name().replace(" ", "_")
    name = cpu_model()
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") + f"_{os.cpu_count()}cpu"


def server_meta(sched, cfg) -> dict:
    import sglang
    import torch

    mc = sched.model_config
    return {"model": Path(sched.server_args.model_path).name, "num_layers": int(mc.num_hidden_layers),
            "hidden_size": int(mc.hidden_size), "dtype": str(mc.dtype).replace("torch.", ""),
            "tp": int(sched.server_args.tp_size), "pp": int(cfg.pp_size), "page_size": int(cfg.page_size),
            "device_name": device_name(sched.device),
            "attention_backend": str(getattr(sched.server_args, "attention_backend", None)),
            "layer_partition": os.environ.get("SGLANG_PP_LAYER_PARTITION", ""),
            "sglang_version": sglang.__version__, "torch_version": torch.__version__}


def cache_path(meta: dict, max_len: int) -> Path:
    """Per-device file, named the way SGLang's fused-MoE tuners name theirs."""
    keys = ("model", "pp", "tp", "device_name", "dtype", "attention_backend")
    name = ",".join(f"{k}={meta[k]}" for k in keys) + f",layers={meta['layer_partition'] or 'default'}"
    name = re.sub(r"[^A-Za-z0-9_.,=-]+", "_", name) + f",maxlen={max_len}.json"
    return Path(envs.CACHE_DIR.get()) / "calibration" / name


def check_matches(doc: dict, meta: dict, where: str, pp_size: int) -> None:
    """A profile measured on another model or split is wrong, not approximately right."""
    pm = doc.get("meta", {})
    for key in ("hidden_size", "num_layers"):
        if key in pm and int(pm[key]) != int(meta[key]):
            raise ValueError(f"{where} was measured with {key}={pm[key]} but this server's model has "
                             f"{key}={meta[key]}; profile this model (`sglang-cpp profile`) or unset SGLANG_CPP_PROFILE")
    stages = {s.get("stage", 0) for s in doc.get("samples", [])} or set(range(len(doc.get("stages", []))))
    if len(stages) > 1 and len(stages) != pp_size:
        raise ValueError(f"{where} has {len(stages)} per-stage models but --pp-size is {pp_size}; "
                         "re-profile with this PP size")
    if "pp" in pm and len(stages) > 1 and int(pm["pp"]) != pp_size:
        raise ValueError(f"{where} was measured with pp={pm['pp']} but --pp-size is {pp_size}")


def covered_len(doc: dict) -> int:
    """Longest prefix+chunk a profile measured (0: unknown, e.g. coefficients only)."""
    if doc.get("samples"):
        return int(max(s["L"] + s["x"] for s in doc["samples"]))
    return int(doc.get("meta", {}).get("max_len") or 0)


def find_cached(meta: dict, max_len: int, budget_s: float) -> Path | None:
    """The full calibration for max_len, else one that the same budget cut short at a shorter length
    (recalibrating would stop at the same place): its file is named by the length it reached."""
    full = cache_path(meta, max_len)
    if full.exists():
        return full
    stem = full.name[:full.name.rindex(",maxlen=")]
    for path in sorted(full.parent.glob(f"{glob.escape(stem)},maxlen=*.json")):
        pm = load_profile(path).get("meta", {})
        if pm.get("requested_max_len") == max_len and pm.get("budget_s") == budget_s:
            return path
    return None


def resolve_cost(sched, cfg) -> tuple:
    """(cost model, calibrated length) for this server; every rank resolves the same one."""
    from .calibrate import calibrate_all_stages

    meta = server_meta(sched, cfg)
    path = envs.PROFILE.get()
    if path:
        where = f"SGLANG_CPP_PROFILE={path}"
        try:
            doc = load_profile(path)
            check_matches(doc, meta, where, cfg.pp_size)
            cost = cost_from_profile(doc, where)
        except ValueError as exc:
            msg = str(exc)
            raise ValueError(msg if msg.startswith("SGLANG_CPP_PROFILE") else f"{where}: {msg}") from None
        logger.info("[sglang-cpp] cost model from %s: %s", path, cost)
        return cost, covered_len(doc)
    max_len = envs.CALIB_MAX_LEN.get() or min(cfg.context_len - 1, 8192)
    max_len = max(512, max_len // 64 * 64)
    budget_s = envs.CALIB_BUDGET_S.get()
    cached = find_cached(meta, max_len, budget_s)
    if cached is not None:
        doc = load_profile(cached)  # a corrupt cache is an error too: delete the file to recalibrate
        reached = covered_len(doc)
        logger.info("[sglang-cpp] cost model from calibration cache %s (measured up to %d tokens)", cached, reached)
        if reached < max_len:
            logger.warning("[sglang-cpp] the cached calibration reached %d of %d tokens (cut by the %.0fs "
                           "SGLANG_CPP_CALIB_BUDGET_S); raise the budget to measure further", reached, max_len,
                           budget_s)
        return cost_from_profile(doc, f"calibration cache {cached}"), reached
    samples, reached = calibrate_all_stages(sched, max_len, envs.CALIB_REPEATS.get(), cfg.pp_rank, budget_s)
    cost = cost_from_profile({"samples": samples, "meta": meta}, "startup calibration")
    if not isinstance(cost, PipelineCost) and cfg.pp_size > 1:
        logger.warning("[sglang-cpp] calibration returned one stage for pp=%d", cfg.pp_size)
    if cfg.pp_rank == 0 and getattr(sched, "tp_rank", 0) == 0:
        meta["date"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        out = cache_path(meta, reached)  # named by what was measured, not what was asked for
        save_profile(out, samples=samples, cost=cost,
                     meta={**meta, "backend": "sglang-startup", "max_len": reached, "requested_max_len": max_len,
                           "budget_s": budget_s})
        logger.info("[sglang-cpp] saved calibration to %s", out)
    return cost, reached


def resolve_upstream(sched, cfg, original) -> UpstreamPredictor:
    """Upstream coefficients from SGLANG_CPP_PROFILE ({'upstream': {a,b,c}} or 1-D samples), else
    upstream's own startup profiling; a failed fit stops the server instead of disabling the feature."""
    kw = dict(chunk_size=cfg.chunk_size, context_len=cfg.context_len, sigma=cfg.sigma,
              page_size=cfg.page_size, max_prefill_tokens=cfg.max_prefill_tokens)
    path = envs.PROFILE.get()
    if path:
        doc = load_profile(path)
        where = f"SGLANG_CPP_PROFILE={path}"
        try:
            if "upstream" in doc:
                u = doc["upstream"]
                return UpstreamPredictor(a=float(u["a"]), b=float(u["b"]), c=float(u["c"]), **kw)
            s = doc["samples"]
            return UpstreamPredictor.fit([v["x"] for v in s], [v["ms"] for v in s], **kw)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: cannot build upstream coefficients: {exc}") from None
    original(sched)
    sizer = sched.dynamic_chunk_sizer
    if sizer is None:
        raise RuntimeError("upstream dynamic-chunking profiling failed (see the warning above); "
                           "sglang-cpp refuses to fall back to static chunks silently. "
                           "Pass SGLANG_CPP_PROFILE or fix the profiling error.")
    p = sizer.predictor
    return UpstreamPredictor(a=p.quadratic_coeff_a, b=p.linear_coeff_b, c=p.constant_coeff_c, **kw)
