"""Where a stage's cost model comes from: SGLANG_CPP_PROFILE, the per-device calibration cache,
or a fresh calibration (saved for the next start). Every path fails loudly, naming the input."""
from __future__ import annotations

import datetime as _dt
import glob
import hashlib
import json
import logging
import os
from dataclasses import replace
from pathlib import Path

from ... import envs
from .cache_key import timing_args
from ...machine import device_name
from ...core.costmodel import PipelineCost, model_from_dict
from ...core.profile_io import check_profile, cost_from_profile, load_profile, profile_cap, save_profile
from .switches import server_chunk_switches, server_switches
from ...files import device_file_name, tuned_path
from ...core.upstream import UpstreamPredictor

logger = logging.getLogger("sglang_cpp")


def _attention_backend(sched) -> str:
    """The backend SGLang actually selected (server_args says None when it was left on auto)."""
    arg = getattr(sched.server_args, "attention_backend", None)
    runner = getattr(getattr(sched, "tp_worker", None), "model_runner", None)
    picked = type(getattr(runner, "attn_backend", None)).__name__ if runner is not None else "NoneType"
    return str(arg) if picked == "NoneType" else f"{arg}:{picked}"


def server_meta(sched, cfg) -> dict:
    """Everything that changes a stage's forward time: all of it keys the calibration cache (the server
    arguments by SGLang's own namespaces, plugin/startup/cache_key.py)."""
    import sglang
    import torch

    mc, sa = sched.model_config, sched.server_args
    return {"model": Path(sa.model_path).name, "num_layers": int(mc.num_hidden_layers),
            "hidden_size": int(mc.hidden_size), "dtype": str(mc.dtype).replace("torch.", ""),
            "tp": int(sa.tp_size), "pp": int(cfg.pp_size), "page_size": int(cfg.page_size),
            "device_name": device_name(sched.device),
            "attention_backend": _attention_backend(sched),
            "kv_cache_dtype": str(getattr(sa, "kv_cache_dtype", None)),
            "quantization": str(getattr(sa, "quantization", None)),
            "moe_runner_backend": str(getattr(sa, "moe_runner_backend", None)),
            "fast_extend": bool(envs.FAST_EXTEND.get()),
            "calib_design": CALIB_DESIGN, "calib_prefix": envs.CALIB_PREFIX.get(),
            "layer_partition": os.environ.get("SGLANG_PP_LAYER_PARTITION", ""),
            "sglang_version": sglang.__version__, "torch_version": torch.__version__,
            "server_args": timing_args(sa), **_switch_meta(sched)}


GRID_SWITCHES = ("kernel_switches", "regime_names", "chunk_switches")  # _switch_meta's keys, where there are switches


def _switch_meta(sched) -> dict:
    """The kernel switches in L and in x (plugin/startup/switches.py), only where there are some (MLA; the CPU flash
    kernel): key fields that a model without switches leaves out, so its calibration cache key is what it was."""
    bounds, names = server_switches(sched)
    xs = server_chunk_switches(sched)
    return {**({"kernel_switches": list(bounds), "regime_names": list(names)} if bounds else {}),
            **({"chunk_switches": list(xs)} if xs else {})}


KEY_FIELDS = ("model", "num_layers", "hidden_size", "dtype", "tp", "pp", "page_size", "device_name",
              "attention_backend", "kv_cache_dtype", "quantization", "moe_runner_backend", "fast_extend",
              "calib_design", "calib_prefix", "layer_partition", "sglang_version", "torch_version", "server_args",
              "kernel_switches", "chunk_switches")
SWITCH_FIELDS = ("kernel_switches", "chunk_switches")  # key fields only where present
CALIB_DESIGN = "grid-3"  # which samples a calibration takes (core.calib_grid.calibration_grid): a new design recalibrates


def calibration_target(requested: int, context_len: int, max_context: int, kv_tokens: int) -> tuple[int, str]:
    """(the calibration's target length, what bounds it). The default is the context length: what users
    plan. Every sample needs L + x KV slots on every stage and a request-table row that long, so the
    target is clamped to min(context - 1, the request table's max context, the smallest stage's KV pool
    less a margin), as upstream clamps its own profiling; an explicit request is clamped the same way."""
    margin = max(256, kv_tokens // 32)  # the warm-up forward, page rounding, slack in the allocator
    bounds = [("the context length - 1", context_len - 1), ("the request table's max context", max_context - 1),
              (f"the smallest stage's KV pool ({kv_tokens} tokens) less {margin}", kv_tokens - margin)]
    if requested:
        bounds.insert(0, ("SGLANG_CPP_CALIB_MAX_LEN", requested))
    name, value = min(((n, v) for n, v in bounds if v > 0), key=lambda b: b[1], default=("nothing", 512))
    return max(512, value // 64 * 64), name


def cache_path(meta: dict, max_len: int) -> Path:
    """Per-device file, named the way SGLang's fused-MoE tuners name theirs, plus a digest of every
    field that changes forward time (KEY_FIELDS), so a stale calibration is never reused silently."""
    digest = hashlib.sha1(json.dumps({k: meta.get(k) for k in KEY_FIELDS if k in meta or k not in SWITCH_FIELDS},
                                     sort_keys=True).encode()).hexdigest()
    name = device_file_name(meta["model"], meta["pp"], meta["tp"], meta["device_name"], meta["dtype"],
                            layers=meta["layer_partition"] or "default", key=digest[:12], maxlen=max_len)
    return Path(envs.CACHE_DIR.get()) / "calibration" / name


def _near_misses(tuned: Path) -> None:
    """One INFO line when the tuned folder holds a file for this model, PP and TP size under another device or
    dtype name (a profile taken elsewhere, or named from a remote server's 'cuda'): `tune chunk --device-name
    --dtype` writes it under this server's name."""
    head = ",".join(tuned.name.split(",")[:3]) + ","  # model=...,pp=...,tp=...,
    try:
        near = sorted(p.name for p in tuned.parent.glob("*.json") if p.name.startswith(head))
    except OSError:
        return
    if near:
        logger.info("[sglang-cpp] no tuned config %s; the folder holds %s for this model, PP and TP size under another "
                    "device or dtype: `sglang-cpp tune chunk ... --device-name %s --dtype %s` names one for this "
                    "server", tuned.name, ", ".join(near), tuned.name.split("device_name=")[1].split(",")[0],
                    tuned.name.split("dtype=")[1].removesuffix(".json"))


def check_writable(folder: Path) -> None:
    """The calibration cache folder can take a file (world rank 0 saves there)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"SGLANG_CPP_CACHE_DIR={envs.CACHE_DIR.get()}: cannot write the calibration to {folder} "
                         f"({exc.strerror or exc}); point SGLANG_CPP_CACHE_DIR at a writable folder, or pass "
                         "SGLANG_CPP_PROFILE") from None


def check_matches(doc: dict, meta: dict, where: str, pp_size: int) -> None:
    """SGLANG_CPP_PROFILE against this server (core.profile_io.check_profile, the one check every command uses)."""
    check_profile(doc, where, pp_size=pp_size, tp_size=meta.get("tp"), model=meta.get("model"),
                  dtype=meta.get("dtype"), hidden_size=meta.get("hidden_size"), num_layers=meta.get("num_layers"),
                  fix="profile this server (`sglang-cpp profile`, `sglang-cpp tune chunk`) or unset SGLANG_CPP_PROFILE")


# the fields of a profile's meta that, where it holds them, must be this server's (issue 57 item 2): what keys the
# calibration cache (KEY_FIELDS) beyond check_profile's model, TP, PP, dtype, width and depth
PROFILE_KEY = ("device_name", "layer_partition", "attention_backend", "kv_cache_dtype", "quantization",
               "moe_runner_backend", "page_size", "fast_extend", "sglang_version", "torch_version", "kernel_switches",
               "chunk_switches")  # not regime_names: a calibration keeps the regimes it reached
_UNKNOWN = (None, "", "None", "none")


def _key_value(field: str, value, held: dict):
    """A key field's value as compared, or None where a side does not know it: an unset value, a generic device
    name a remote profile reports, an HF profile's page size (no SGLang pool). The backend: `_backend`."""
    if field == "layer_partition":
        return None if value is None else (str(value) or "default")
    if field == "device_name" and str(value).lower() in ("cuda", "cpu", "unknown", "gpu"):
        return None
    if field == "page_size" and "server_args" not in held and "base_url" not in held:
        return None
    if value in _UNKNOWN:
        return None
    return json.dumps(value, sort_keys=True, default=str)


def _arg_value(value):
    """A server argument as compared: a path by its last component (a profile copied to a host that mounts the
    draft model or the expert map elsewhere is the same)."""
    text = str(value)
    if text.strip('"').startswith("/") and " " not in text:  # an absolute path; a hub id (org/name) stays whole
        return text.strip('"').rstrip("/").rsplit("/", 1)[-1]
    return text


def _backend(value) -> tuple:
    """(the backend asked for, the class SGLang resolved), None where unknown: the plugin writes "arg:Class"
    (arg None: SGLang's auto), a profiler the arg alone."""
    arg, _, cls = str(value).partition(":") if value is not None else ("", "", "")
    return (None if arg in _UNKNOWN else arg), (cls or None)


def key_mismatches(held: dict, meta: dict) -> list[str]:
    """The key fields a profile's meta holds with another value than this server's (`server_meta`), named with
    both values; a field either side leaves out or cannot know is not compared. The attention backend is
    compared as SGLang resolved it where both sides name the class (an auto one too), else as asked for."""
    out = []
    for k in PROFILE_KEY:
        if k == "attention_backend":
            (aa, ac), (ba, bc) = _backend(held.get(k)), _backend(meta.get(k))
            a, b = (ac, bc) if ac and bc else (aa, ba)
        else:
            a, b = _key_value(k, held.get(k), held), _key_value(k, meta.get(k), meta)
        if a is not None and b is not None and a != b:
            out.append(f"{k}={held[k]!r} there, {meta[k]!r} here")
    ha, ma = held.get("server_args"), meta.get("server_args")
    if isinstance(ha, dict) and isinstance(ma, dict):  # the backend as given (null: auto) is compared resolved, above
        out += [f"server_args.{f}={ha[f]} there, {ma[f]} here" for f in sorted(set(ha) & set(ma) - {"attention_backend"})
                if _arg_value(ha[f]) != _arg_value(ma[f])]
    return out


def cap_for(cap: int, lo: int, where: str) -> int:
    """A served profile's cap as this server can honour it: one below the smallest chunk its plans may cut (`lo`:
    the alignment or SGLANG_CPP_MIN_CHUNK, whichever is larger) is not applied, with one WARNING naming the
    profile (it would leave no chunk size between the bounds); 0 stays 0."""
    if cap and cap < lo:
        logger.warning("[sglang-cpp] %s: measured_chunk=%d is below this server's smallest chunk (%d tokens: --page-size "
                       "alignment or SGLANG_CPP_MIN_CHUNK), so its cap is not applied; profile this server", where, cap, lo)
        return 0
    return int(cap)


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


def resolve_source(meta: dict, cfg, max_context: int = 0, kv_tokens: int = 0) -> dict:
    """World rank 0 only: where the cost model comes from. {'kind': 'profile'|'cache', 'where', 'doc'}
    or {'kind': 'calibrate', 'max_len', 'budget_s', 'repeats', 'bound'}; a bad profile raises ValueError.
    max_context / kv_tokens: the smallest request-table row and KV pool over every rank (0: unknown)."""
    path, where = envs.PROFILE.get(), f"SGLANG_CPP_PROFILE={envs.PROFILE.get()}"
    tuned = tuned_path(meta)
    if not path and tuned.is_file():  # `sglang-cpp tune chunk`'s per-device file for this server
        path, where = str(tuned), f"tuned config {tuned}"
    elif not path:
        _near_misses(tuned)
    if path:
        try:
            doc = load_profile(path)
            check_matches(doc, meta, where, cfg.pp_size)
            model = cost_from_profile(doc, where).to_dict()  # fitted here, so an error names the file
            cap = profile_cap(doc, where)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:  # a hand-edited file: the fields' types
            what = str(exc) if isinstance(exc, ValueError) else f"a field of the wrong type ({type(exc).__name__}: {exc})"
            msg = what if what.startswith(where) else f"{where}: {what}"
            if path != str(tuned):
                raise ValueError(msg) from None
            logger.warning("[sglang-cpp] %s; not applied: this server's calibration is used instead (cached, or "
                           "measured now). Remove %s, or write it again with `sglang-cpp "
                           "tune chunk` from a profile of this server", msg, tuned)
        else:
            other = key_mismatches(doc.get("meta") or {}, meta)
            if other:  # measured under another layout, backend, cache dtype, version...: not this server's times
                logger.warning("[sglang-cpp] %s was measured under other settings than this server's: %s; not applied: "
                               "this server's calibration is used instead (cached, or measured now). Profile this "
                               "server (`sglang-cpp profile`, `sglang-cpp tune chunk`), or %s",
                               where, "; ".join(other), f"remove {tuned}" if path == str(tuned) else
                               "unset SGLANG_CPP_PROFILE")
            else:
                if path == str(tuned):
                    logger.info("[sglang-cpp] cost model from the tuned config %s (written by `sglang-cpp tune chunk` "
                                "for this model, PP and TP size, device and dtype; SGLANG_CPP_PROFILE would win)", tuned)
                return {"kind": "profile", "where": path, "doc": doc, "covered": covered_len(doc), "model": model,
                        "cap": cap}
    max_len, bound = calibration_target(envs.CALIB_MAX_LEN.get(), cfg.context_len, max_context or cfg.context_len + 1,
                                        kv_tokens or 1 << 62)
    budget_s = envs.CALIB_BUDGET_S.get()
    cached = find_cached(meta, max_len, budget_s)
    if cached is not None:  # a corrupt cache is an error too: delete the file to recalibrate
        doc = load_profile(cached)
        return {"kind": "cache", "where": str(cached), "doc": doc, "covered": covered_len(doc), "max_len": max_len,
                "budget_s": budget_s, "model": cost_from_profile(doc, f"calibration cache {cached}").to_dict()}
    check_writable(cache_path(meta, max_len).parent)  # before minutes of calibration, not after
    return {"kind": "calibrate", "max_len": max_len, "budget_s": budget_s, "repeats": envs.CALIB_REPEATS.get(),
            "bound": bound, "prefix": envs.CALIB_PREFIX.get()}


def resolve_cost(sched, cfg, max_context: int = 0, kv_tokens: int = 0, tp_rank: int = 0) -> tuple:
    """(cost model, calibrated length, samples, refit) for this server; the samples (what online refinement
    starts from) and `refit` are world rank 0's only, [] and None elsewhere. `refit` is what the plan
    coverage (plugin/startup/coverage.py) needs to refit a calibration with more samples and keep it: {"meta": the
    fit's meta, "save": save(samples, cost)}; for a profile the user gave (never refitted) {"cap": its measured_chunk}. World rank
    0 resolves the source (its own profile file or cache), fits it, and every rank receives the
    coefficients: no rank fits alone, so
    BLAS or scipy differences between nodes cannot give two stages different plans. A calibration runs
    on all ranks together, rank 0 fits the gathered samples and saves them."""
    from ...core.calib_grid import calibrated_switches
    from .calibrate import calibrate_all_stages
    from .consensus import from_rank0, world_rank

    rank0 = world_rank() == 0
    meta: dict = {}  # world rank 0's, filled inside from_rank0 (an error there reaches every rank); the others
    kept: dict = {}  # take what they need from rank 0. Also rank 0's own: a profile's or cache's samples

    def rank0_source() -> dict:
        meta.update(server_meta(sched, cfg))
        return _rank0_source(meta, cfg, max_context, kv_tokens, kept)
    src = from_rank0(rank0_source)
    if src["kind"] == "profile":
        cost = model_from_dict(src["model"], f"SGLANG_CPP_PROFILE={src['where']}")
        logger.info("[sglang-cpp] cost model from %s (world rank 0's fit): %s", src["where"], cost)
        cap = cap_for(int(src.get("cap") or 0), replace(cfg, measured_chunk=0).plan_config().lo, src["where"])
        if cap:
            logger.info("[sglang-cpp] plans cut no chunk above %d tokens, the profile's measured_chunk (what its "
                        "server measured), as `sglang-cpp plan --profile` does", cap)
        return cost, src["covered"], kept.get("samples", []), {"cap": cap}
    if src["kind"] == "cache":
        reached = src["covered"]
        logger.info("[sglang-cpp] cost model from calibration cache %s on world rank 0 (measured up to %d tokens)",
                    src["where"], reached)
        if reached < src["max_len"]:
            logger.warning("[sglang-cpp] the cached calibration reached %d of %d tokens (cut by the %.0fs "
                           "SGLANG_CPP_CALIB_BUDGET_S); raise the budget to measure further", reached,
                           src["max_len"], src["budget_s"])
        refit = None if "meta" not in kept else {
            "meta": kept["meta"], "save": lambda ss, c: _save_calibration(Path(src["where"]), ss, c, kept["meta"])}
        return model_from_dict(src["model"], f"calibration cache {src['where']}"), reached, kept.get("samples", []), refit
    max_len, budget_s = src["max_len"], src["budget_s"]
    logger.info("[sglang-cpp] calibration target %d tokens, bounded by %s", max_len, src["bound"])
    pc = cfg.plan_config()
    for k in GRID_SWITCHES:  # world rank 0's: a rank that read its own switches otherwise would sample another grid
        meta.pop(k, None)
    meta.update(src["switches"])
    switches = tuple(meta.get("kernel_switches") or ())
    samples, reached = calibrate_all_stages(sched, max_len, src["repeats"], cfg.pp_rank, budget_s,
                                            max_chunk=pc.max_chunk, align=pc.align, min_chunk=pc.min_chunk,
                                            prefix=src["prefix"], plan_cfg=pc, tp_rank=tp_rank,
                                            switches=switches, chunk_switches=tuple(meta.get("chunk_switches") or ()),
                                            chunk_overhead_ms=cfg.chunk_overhead_ms)
    if switches:  # one fit per regime that the calibration sampled on both sides
        bounds, names = calibrated_switches(switches, tuple(meta["regime_names"]), reached, pc.align, pc.min_chunk)
        meta.update(regime_bounds=list(bounds), regime_names=list(names))
    cost = model_from_dict(from_rank0(lambda: cost_from_profile({"samples": samples, "meta": meta},
                                                                 "startup calibration").to_dict()),
                           "startup calibration")
    if not isinstance(cost, PipelineCost) and cfg.pp_size > 1:
        logger.warning("[sglang-cpp] calibration returned one stage for pp=%d", cfg.pp_size)
    refit = None
    if rank0:
        meta["date"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        out = cache_path(meta, reached)  # named by what was measured, not what was asked for
        meta = {**meta, "backend": "sglang-startup", "max_len": reached, "requested_max_len": max_len,
                "budget_s": budget_s}
        _save_calibration(out, samples, cost, meta)
        refit = {"meta": meta, "save": lambda ss, c: _save_calibration(out, ss, c, meta)}
    return cost, reached, samples, refit


def _save_calibration(out: Path, samples: list, cost, meta: dict) -> None:
    """World rank 0 keeps a calibration for the next start; a folder that cannot take it costs a WARNING
    (the model is in hand: this server uses it, the next start calibrates again)."""
    try:
        save_profile(out, samples=samples, cost=cost, meta=meta)
        logger.info("[sglang-cpp] saved calibration to %s", out)
    except OSError as exc:
        logger.warning("[sglang-cpp] could not save the calibration to %s (%s): this server uses it, the next "
                       "start calibrates again; free the disk or point SGLANG_CPP_CACHE_DIR elsewhere", out,
                       exc.strerror or exc)


def _rank0_source(meta: dict, cfg, max_context: int, kv_tokens: int, kept: dict) -> dict:
    """resolve_source as world rank 0 sends it: a profile's or cache's fitted model, not its samples
    (those go into `kept`, rank 0's own)."""
    src = resolve_source(meta, cfg, max_context, kv_tokens)
    if src["kind"] == "calibrate":  # the grid's kernel switches too: every rank samples rank 0's grid
        return {**src, "switches": {k: meta[k] for k in GRID_SWITCHES if k in meta}}
    kept["samples"] = list(src["doc"].get("samples") or [])
    if src["kind"] == "cache":
        kept["meta"] = dict(src["doc"].get("meta") or {})
    return {**src, "doc": None}


def save_served(sched, cfg, cost, calibrated_len: int) -> None:
    """World rank 0 writes the model the planner runs on (the calibration, each stage's measured per-chunk
    overhead beside it as the profile's `chunk_overheads`, and its cap `measured_chunk`) beside the cache, so
    `sglang-cpp plan --profile <it>` gives the server's chunks.
    Best effort: a folder that cannot take it costs a WARNING, never the server."""
    from .consensus import world_rank

    if world_rank() != 0:
        return
    meta = server_meta(sched, cfg)
    path = Path(envs.CACHE_DIR.get()) / "served" / cache_path(meta, calibrated_len).name
    try:
        save_profile(path, cost=cost, meta={**meta, "backend": "served", "calibrated_len": calibrated_len,
                                            "measured_chunk": int(getattr(cfg, "measured_chunk", 0) or 0)})
    except OSError as exc:
        logger.warning("[sglang-cpp] could not write the served cost model to %s: %s", path, exc)
        return
    logger.info("[sglang-cpp] served cost model (calibration + measured per-chunk overhead) saved to %s", path)


def _upstream_from_profile(path: str, kw: dict) -> dict:
    doc = load_profile(path)
    where = f"SGLANG_CPP_PROFILE={path}"
    try:
        if "upstream" in doc:
            u = doc["upstream"]
            p = UpstreamPredictor(a=float(u["a"]), b=float(u["b"]), c=float(u["c"]), **kw)
        else:
            s = doc["samples"]
            p = UpstreamPredictor.fit([v["x"] for v in s], [v["ms"] for v in s], **kw)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: cannot build upstream coefficients: {exc}") from None
    return {"a": p.a, "b": p.b, "c": p.c}


def resolve_upstream(sched, cfg, original) -> UpstreamPredictor:
    """Upstream coefficients from SGLANG_CPP_PROFILE ({'upstream': {a,b,c}} or 1-D samples), else
    upstream's own startup profiling. Every rank uses world rank 0's coefficients; a failed fit on any
    rank stops every rank instead of disabling the feature."""
    from .consensus import from_rank0, on_every_rank

    kw = dict(chunk_size=cfg.chunk_size, context_len=cfg.context_len, sigma=cfg.sigma,
              page_size=cfg.page_size, max_prefill_tokens=cfg.max_prefill_tokens)
    path = envs.PROFILE.get()
    if path:
        abc = from_rank0(lambda: _upstream_from_profile(path, kw))
        return UpstreamPredictor(**abc, **kw)

    def profile() -> dict:
        original(sched)
        sizer = sched.dynamic_chunk_sizer
        if sizer is None:
            raise RuntimeError("upstream dynamic-chunking profiling failed (see the warning above); "
                               "sglang-cpp refuses to fall back to static chunks silently. "
                               "Pass SGLANG_CPP_PROFILE or fix the profiling error.")
        p = sizer.predictor
        return {"a": p.quadratic_coeff_a, "b": p.linear_coeff_b, "c": p.constant_coeff_c}

    try:
        abc = on_every_rank(profile)[0]
    except RuntimeError as exc:
        raise RuntimeError(f"upstream dynamic-chunking profiling failed: {exc}") from None
    return UpstreamPredictor(**abc, **kw)
