"""`sglang-cpp tune chunk`: rank the chunking options of a profile (recommend.py), print the table and
the launch lines, and write the per-device JSON a server with the plugin finds at startup (SGLANG_CPP_CACHE_DIR/tuned; or give it as SGLANG_CPP_PROFILE).
"""
from __future__ import annotations

import argparse
import platform
import shlex
from pathlib import Path

from ...core.costmodel import with_overheads
from ...core.profile_io import save_profile
from ...files import tuned_path
from ...tuning import config_from_args
from ...tuning.fit import FORMS, as_cost, residuals
from ...tuning.recommend import DEFAULT_SIZES, SGLANG_MAX_PREFILL, ChunkTuneConfig, load_stages, recommend


def profile_name(meta: dict, pp_size: int, model_name: str | None = None, device_name: str | None = None,
                 dtype: str | None = None, folder=None) -> Path:
    """The per-device file a server with the plugin looks for (files.tuned_path, the one name both use): the
    flags win over the profile's meta."""
    return tuned_path({"model": model_name or meta.get("model"), "pp": pp_size, "tp": meta.get("tp"),
                       "device_name": device_name or meta.get("device_name"), "dtype": dtype or meta.get("dtype")},
                      folder)


def launch_line(env: dict, meta: dict, cfg: ChunkTuneConfig, C: int, dynamic: bool, mpt: int) -> str:
    model = str(meta.get("model_path") or meta.get("model") or "MODEL_PATH")
    envs = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in env.items())
    cmd = ["python -m sglang.launch_server --model-path", shlex.quote(model), "--pp-size", str(cfg.pp_size)]
    tp = int(meta.get("tp") or 1)
    if tp > 1:
        cmd += ["--tp-size", str(tp)]
    cmd += ["--chunked-prefill-size", str(C)] + (["--enable-dynamic-chunking"] if dynamic else [])
    if cfg.page_size > 1:
        cmd += ["--page-size", str(cfg.page_size)]
    if mpt != SGLANG_MAX_PREFILL:
        cmd += ["--max-prefill-tokens", str(mpt)]
    if cfg.context_length:
        cmd += ["--context-length", str(cfg.context_length)]
    return f"{envs} {' '.join(cmd)}"


def launch_lines(rec: dict, meta: dict, cfg: ChunkTuneConfig, json_path: Path) -> dict:
    p, f, u = rec["plan"].settings, rec["fixed"].settings, rec["upstream"]
    out = {"plan": launch_line({"SGLANG_CPP_PROFILE": json_path.resolve(), "SGLANG_CPP_POLICY": "plan",
                                "SGLANG_CPP_MIN_CHUNK": p["min_chunk"], "SGLANG_CPP_MAX_CHUNK": p["max_chunk"],
                                "SGLANG_CPP_CHUNK_OVERHEAD_MS": f"{cfg.chunk_overhead_ms:g}"}, meta, cfg, p["chunked_prefill_size"], True,
                               p["max_prefill_tokens"]),
           "fixed": launch_line({"SGLANG_CPP_POLICY": "off"}, meta, cfg, f["chunked_prefill_size"], False,
                                max(cfg.max_prefill_tokens, f["chunked_prefill_size"]))}
    if u is not None:
        s = u.settings
        env = {"SGLANG_CPP_POLICY": "off", "SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR": f"{s['sigma']:g}"}
        out["upstream"] = launch_line(env, meta, cfg, s["chunked_prefill_size"], True, s["max_prefill_tokens"])
    return out


def table(rec: dict, cfg: ChunkTuneConfig) -> str:
    rows = [("(a) plan", rec["plan"]), ("(b) upstream", rec["upstream"]),
            ("    upstream, default sigma", rec["upstream_default_sigma"]), ("(c) fixed", rec["fixed"])]
    worst = max((o for o in rec["all"] if o.family == "fixed"), key=lambda o: o.score)
    rows.append(("    worst fixed", worst))
    head = (f"{'option':<30} {'settings':<44}" + "".join(f" {f'TTFT@{L}':>13}" for L in cfg.input_lens)
            + "  vs best fixed")
    lines = [head, "-" * len(head)]
    for name, o in rows:
        if o is None:
            lines.append(f"{name:<30} {'(upstream fit fails: dynamic chunking would be disabled)':<44}")
            continue
        s = o.settings
        desc = (f"C={s['chunked_prefill_size']} MIN={s['min_chunk']} MAX={s['max_chunk']}" if o.family == "plan" else
                f"C={s['chunked_prefill_size']} sigma={s['sigma']:g}" if o.family == "upstream" else
                f"C={s['chunked_prefill_size']}")
        lines.append(f"{name:<30} {desc:<44}" + "".join(f" {o.ttft[L]:>13.1f}" for L in cfg.input_lens)
                     + f"  {o.score:>8.3f}x")
    lines.append("vs best fixed: mean over the lengths of TTFT / the fastest fixed chunk at that length")
    return "\n".join(lines)


def versions(meta: dict) -> dict:
    from ...machine import versions as installed

    return {**installed("sglang-cpp", "numpy", "scipy"),
            "python": platform.python_version(), "profile_sglang": meta.get("sglang_version"),
            "profile_torch": meta.get("torch_version")}


def write_json(cfg, doc, samples, models, rec, P, overheads: tuple = ()) -> tuple[Path, dict, dict]:
    meta = {**doc.get("meta", {}), "pp": P,  # the server's names, where the flags give them: the plugin checks them
            **({"device_name": cfg.device_name} if cfg.device_name else {}), **({"dtype": cfg.dtype} if cfg.dtype else {})}
    if doc.get("meta", {}).get("pp") not in (None, P):
        meta["profiled_pp"] = doc["meta"]["pp"]
    path = profile_name(doc.get("meta", {}), P, cfg.model_name, cfg.device_name, cfg.dtype, cfg.out_dir or None)
    lines = launch_lines(rec, meta, cfg, path)
    recs = {k: (v.to_dict() if v is not None else None) for k, v in rec.items() if k not in ("all", "upstream_failed")}
    recs.update(objective="mean over input_lens of predicted TTFT / best fixed TTFT (simulator)",
                input_lens=list(cfg.input_lens), pp_size=P, page_size=cfg.page_size, chunk_overhead_ms=cfg.chunk_overhead_ms,
                max_prefill_tokens=cfg.max_prefill_tokens, context_length=cfg.context_length, launch=lines,
                upstream_failed={str(k): v for k, v in rec["upstream_failed"].items()},
                table=[{"label": o.label, "score": o.score, "ttft_ms": {str(k): v for k, v in o.ttft.items()}}
                       for o in rec["all"]])
    extra = {"recommendations": recs, "residuals": residuals(models, samples) if samples else [],
             "versions": versions(meta)}
    if rec["upstream"] is not None:
        extra["upstream"] = dict(rec["upstream"].settings["coeffs"])
    cost = as_cost(models)  # the forward models, and a served profile's overhead beside them, as it came
    save_profile(path, samples=samples, meta=meta, cost=with_overheads(cost, list(overheads), P) if overheads else cost,
                 extra=extra)
    return path, lines, recs


# -- CLI -------------------------------------------------------------------------------------------------
def add_args(p: argparse.ArgumentParser) -> None:
    from ...args import alias, parse_ints, parse_len, parse_lens, positive_int

    p.add_argument("profile", help="profile JSON (sglang-cpp profile, or tune fit --out)")
    p.add_argument("--pp-size", type=positive_int, required=True, metavar="N", help="pipeline stages (SGLang's --pp-size)")
    p.add_argument("--input-len", dest="input_lens", metavar="LEN[,LEN...]", type=parse_lens,
                   required=True, help="prompt length(s) to optimise, e.g. 32k,128k")
    p.add_argument("--page-size", type=int, default=1, help="server --page-size (alignment is max(page, 64))")
    p.add_argument("--max-prefill-tokens", type=parse_len, default=SGLANG_MAX_PREFILL, metavar="LEN",
                   help="SGLang's --max-prefill-tokens")
    p.add_argument("--model-name", default=None, help="model name in the output file name (default: profile meta)")
    p.add_argument("--device-name", default=None,
                   help="the server's device in the file name, as the plugin logs it (e.g. NVIDIA_H100_80GB_HBM3; "
                        "default: the profile's)")
    p.add_argument("--dtype", default=None, help="the server's weight dtype in the file name (e.g. bfloat16; default: "
                                                 "the profile's)")
    p.add_argument("--out-dir", default=ChunkTuneConfig.out_dir,
                   help="folder for the per-device JSON (default: SGLANG_CPP_CACHE_DIR/tuned, where a server with "
                        "the plugin finds the file for its model, PP and TP size, device and dtype at startup)")
    p.add_argument("--context-length", type=parse_len, default=None,
                   help="server --context-length (default: unbounded)")
    p.add_argument("--chunk-overhead-ms", dest="chunk_overhead_ms", type=float, default=0.0,
                   help="fixed cost per chunk the profile misses: P2P, scheduling (SGLANG_CPP_CHUNK_OVERHEAD_MS)")
    alias(p, "--chunk-overhead-ms", "--p2p-ms")
    alias(p, "--input-len", "--input-lens")
    p.add_argument("--fixed-chunks", dest="chunk_sizes", type=parse_ints, default=DEFAULT_SIZES,
                   metavar="LEN[,LEN...]", help="C grid for fixed and upstream (default 1k..32k)")
    alias(p, "--fixed-chunks", "--chunk-sizes")
    p.add_argument("--form", choices=FORMS, default="full", help="cost-model form when refitting samples")
    p.add_argument("--json", default=None, metavar="OUT.json",
                   help="also write the recommendations, every option's predicted TTFT and the launch lines (strict "
                        "JSON; the tuned file holds them too, under 'recommendations')")


def run(args) -> int:
    cfg = config_from_args(ChunkTuneConfig, args)
    doc, samples, models, stages, over = load_stages(cfg)
    xs = [s["x"] for s in samples]
    rec = recommend(cfg, models, stages, (min(xs), max(xs)) if xs else (), over)
    P = cfg.pp_size
    print(f"cost model: {len(models)} stage model(s) from {cfg.profile}" +
          (" (replicated: stages assumed equal)" if len(models) < P else ""))
    for st, m in enumerate(models):
        fit = m.fit or {}
        print(f"  stage {st}: {m}" + (f"  [R^2={fit['r2']:.4f}, median rel err {fit['median_rel_err']:.2%}]"
                                      if "r2" in fit else ""))
    if over:
        print("  per-chunk overhead carried by the profile: " + ", ".join(f"PP{s} {o.per_chunk_ms:.2f} ms + "
                                                                         f"{o.per_token_ms * 1e3:.3f} us per token"
                                                                         for s, o in enumerate(over)))
    print(f"\npredicted TTFT (ms, simulator; pp={P}, chunk overhead {cfg.chunk_overhead_ms:g} ms per chunk and stage; lower is better):")
    print(table(rec, cfg))
    if rec["upstream_failed"]:
        print(f"upstream's fit fails at C={sorted(rec['upstream_failed'])} (dynamic chunking would switch off)")
    path, lines, recs = write_json(cfg, doc, samples, models, rec, P, over)
    print(f"\nwrote {path}")
    if cfg.json:
        from ...files import save_json

        print(f"wrote {save_json(cfg.json, {'tuned_profile': str(path), **recs})}")
    print("\n(a) sglang-cpp plan policy:\n  " + lines["plan"])
    if "upstream" in lines:
        print("(b) upstream dynamic chunking (sglang-cpp off):\n  " + lines["upstream"])
    print("(c) fixed chunks:\n  " + lines["fixed"])
    return 0



__all__ = ["profile_name", "launch_line", "table", "write_json", "add_args", "run"]
