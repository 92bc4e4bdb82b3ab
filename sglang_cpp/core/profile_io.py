"""Profile files: a profile or calibration JSON read and validated, checked against what it is used for
(`check_profile`, the one check every command and the plugin make), fitted into the cost model, written
atomically; and --coeffs parsed. The model itself is core/costmodel.py."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Iterable, Sequence

from .costmodel import (COEFS, PROFILE_FORMAT, CostModel, PipelineCost, fit_piecewise, model_from_dict,
                        overheads_of)


def _parse_samples(raw: Iterable, where: str) -> list[dict]:
    out = []
    for i, s in enumerate(raw):
        if isinstance(s, dict):
            if "L" in s and "x" in s:
                L, x = s["L"], s["x"]
            elif "seq_len" in s:  # upstream-style fresh prefill
                L, x = 0, s["seq_len"]
            else:
                raise ValueError(f"{where}: sample {i} needs keys L, x, ms (or seq_len, ms); got {sorted(s)}")
            ms = s.get("ms", s.get("latency_ms"))
            out.append({"L": float(L), "x": float(x), "ms": float(ms), "stage": int(s.get("stage", 0)),
                        **({"scope": str(s["scope"])} if "scope" in s else {})})  # 'all': whole pipeline
        elif isinstance(s, (list, tuple)) and len(s) in (2, 3):
            L, x, ms = (0, *s) if len(s) == 2 else s
            out.append({"L": float(L), "x": float(x), "ms": float(ms), "stage": 0})
        else:
            raise ValueError(f"{where}: sample {i} must be [L, x, ms], [seq_len, ms] or an object; got {s!r}")
    return out


def load_profile(path: str | Path) -> dict:
    """Read and validate a profile JSON: {'format', 'meta', 'samples', optional 'stages' models}."""
    where = f"profile {path}"
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"{where} does not exist; write one with `sglang-cpp profile` or `sglang-cpp tune chunk`") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where} is not readable JSON: {exc}") from None
    if isinstance(doc, list):  # bare sample list (upstream-style)
        doc = {"format": PROFILE_FORMAT, "samples": doc}
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: top level must be an object or a sample list")
    if doc.get("format", PROFILE_FORMAT) != PROFILE_FORMAT:
        raise ValueError(f"{where}: format is {doc.get('format')!r}, expected {PROFILE_FORMAT!r}")
    try:
        doc["samples"] = _parse_samples(doc.get("samples", []), where)
    except (TypeError, ValueError) as exc:
        raise ValueError(str(exc) if str(exc).startswith(where) else f"{where}: bad samples: {exc}") from None
    if not doc["samples"] and not doc.get("stages") and "coeffs" not in doc and "upstream" not in doc:
        raise ValueError(f"{where} has neither samples nor fitted coefficients")
    if doc.get("meta") is None:
        doc["meta"] = {}
    if not isinstance(doc["meta"], dict):
        raise ValueError(f"{where}: meta is {type(doc['meta']).__name__}, expected an object of what it was measured "
                         "on (model, pp, tp, dtype); rewrite it with `sglang-cpp profile` or `sglang-cpp tune chunk`")
    if not isinstance(doc.get("stages") or [], list):
        raise ValueError(f"{where}: stages is {type(doc['stages']).__name__}, expected a list of per-stage models")
    return doc


def cost_from_profile(doc: dict, where: str = "profile", form: str = "full"):
    """CostModel (one stage) or PipelineCost (several) from a loaded profile; fits samples if needed."""
    if "coeffs" in doc:
        return CostModel.from_dict(doc, where)
    if doc.get("stages") and doc.get("chunk_overheads") is not None:  # each stage's overhead beside its model
        return model_from_dict({"stages": doc["stages"], "chunk_overheads": doc["chunk_overheads"]}, where)
    if doc.get("stages"):
        models = [model_from_dict(s, f"{where} stage {i}") for i, s in enumerate(doc["stages"])]
        lone = len(models) == 1 and not isinstance(models[0], PipelineCost)  # a roofline stage's rows stay one stage
        return models[0] if lone else PipelineCost(tuple(models))
    if not doc.get("samples"):
        raise ValueError(f"{where} holds only upstream's a, b, c: use it with SGLANG_CPP_POLICY=quadratic, or "
                         "give a profile with samples (`sglang-cpp profile`) for the 2-D cost model")
    by_stage: dict[int, list] = {}
    for s in doc["samples"]:
        by_stage.setdefault(s["stage"], []).append(s)
    models = []
    meta = doc.get("meta") or {}
    bounds = tuple(meta.get("regime_bounds") or ())  # kernel switches in L: one fit per regime
    x_bounds = tuple(meta.get("chunk_switches") or ())  # ... in x: one L*x coefficient per regime
    for st in sorted(by_stage):
        ss = by_stage[st]
        models.append(fit_piecewise([s["L"] for s in ss], [s["x"] for s in ss], [s["ms"] for s in ss], bounds,
                                    names=tuple(meta.get("regime_names") or ()), form=form, x_bounds=x_bounds,
                                    meta={**meta, "stage": st}, name=f"{where} stage {st}"))
    if any(s.get("scope") == "all" for s in doc["samples"]):
        return _per_stage_of_pipeline(models, doc.get("meta", {}), where)
    return models[0] if len(models) == 1 else PipelineCost(tuple(models))


def _per_stage_of_pipeline(models: list, meta: dict, where: str) -> "CostModel":
    """A profile of scope 'all' (`profile --backend server`) timed each chunk through all P stages. A
    stage is charged 1/P of that (an even split of the layers), never the whole pipeline's time."""
    if len(models) != 1:
        raise ValueError(f"{where}: samples of scope 'all' must all be stage 0 (one whole-pipeline model)")
    P = int(meta.get("pp") or 1)
    m = models[0]
    if P < 1:
        raise ValueError(f"{where}: meta.pp={meta.get('pp')!r} must be >= 1")
    return CostModel(**{k: getattr(m, k) / P for k in COEFS}, fit=m.fit,
                     meta={**m.meta, "scope": "stage", "pp_share": P, "derived": f"whole-pipeline profile / pp={P}"})


def _name(v) -> str:
    return Path(str(v).rstrip("/")).name  # a model path or a folder name: the same model in another folder


_DTYPE_WORDS = {"bf16": "bfloat16", "half": "float16", "fp16": "float16", "float": "float32", "fp32": "float32"}


def same_dtype(held, given) -> bool:
    """One dtype in SGLang's words and torch's or the analytic model's: 'torch.bfloat16', 'bfloat16' and 'bf16'
    agree; an analytic profile's bf16 means 16-bit GEMMs, so float16 agrees with it too."""
    h, g = (_DTYPE_WORDS.get(w, w) for w in (str(v).lower().replace("torch.", "") for v in (held, given)))
    return h == g or (str(held).lower() == "bf16" and g == "float16")


def check_profile(doc: dict, where: str, *, pp_size: int | None = None, tp_size: int | None = None,
                  model: str | None = None, dtype: str | None = None, hidden_size: int | None = None,
                  num_layers: int | None = None, fix: str = "", runs: str = "this server runs") -> None:
    """The one compatibility check of a profile or calibration against what it is used for (every command and
    the plugin): a profile measured on another model, TP size, dtype or split is wrong, not approximately right.
    Each given value is compared with the field the profile's meta holds (absent there: not checked); the
    error names `where` (the file), the field and value it holds, and the flag that disagrees (`runs`: who gave
    it, the server or the command line). A one-stage
    model serves every PP size; per-stage models only theirs."""
    pm = doc.get("meta") or {}
    tail = f"; {fix}" if fix else ""
    for key, want in (("hidden_size", hidden_size), ("num_layers", num_layers)):
        if want is not None and pm.get(key) not in (None, "") and int(pm[key]) != int(want):
            raise ValueError(f"{where} was measured with {key}={pm[key]} but this server's model has "
                             f"{key}={want}{tail}")
    if model and pm.get("model") and _name(pm["model"]) != _name(model):
        raise ValueError(f"{where} was measured on model {_name(pm['model'])} but this server serves "
                         f"{_name(model)}{tail}")
    for key, flag, want, same in (("tp", "--tp-size", tp_size, lambda a, b: str(a) == str(b)),
                                  ("dtype", "--dtype", dtype, same_dtype)):
        if want is not None and pm.get(key) not in (None, "") and not same(pm[key], want):
            raise ValueError(f"{where} was measured with {key}={pm[key]} but {runs} {flag} {want}{tail}")
    if pp_size is None:
        return
    stages = {s.get("stage", 0) for s in doc.get("samples", [])} or set(range(len(doc.get("stages") or [])))
    if len(stages) > 1 and len(stages) != int(pp_size):
        raise ValueError(f"{where} has {len(stages)} per-stage models but --pp-size is {pp_size} (one model per PP "
                         f"stage it was measured on): give --pp-size {len(stages)}, or a profile measured at PP "
                         f"{pp_size} (or one stage's model, which serves every stage){tail}")
    if pm.get("pp") not in (None, "") and len(stages) > 1 and int(pm["pp"]) != int(pp_size):
        raise ValueError(f"{where} was measured with pp={pm['pp']} but --pp-size is {pp_size}{tail}")


def load_cost(path: str | Path, form: str = "full", pp_size: int | None = None, tp_size: int | None = None,
              dtype: str | None = None, runs: str = "this server runs"):
    """The cost model of a profile, checked (`check_profile`) against the command's --pp-size, --tp-size and
    --dtype (`runs`: who gave them, for the error)."""
    doc = load_profile(path)
    check_profile(doc, f"profile {path}", pp_size=pp_size, tp_size=tp_size, dtype=dtype, runs=runs)
    return cost_from_profile(doc, f"profile {path}", form)


def save_profile(path: str | Path, *, samples: Sequence[dict] = (), meta: dict | None = None,
                 cost=None, extra: dict | None = None) -> Path:
    doc: dict = {"format": PROFILE_FORMAT, "version": 1, "meta": dict(meta or {}),
                 "samples": [dict(s) for s in samples]}
    if cost is not None:
        stages = cost.stages if isinstance(cost, PipelineCost) else (cost,)
        doc["stages"] = [m.to_dict() for m in stages]
        if overheads_of(cost):  # each stage's per-chunk overhead, beside its forward model
            doc["chunk_overheads"] = [asdict(o) for o in overheads_of(cost)]
    if extra:
        doc.update(extra)
    from ..files import save_json

    return save_json(path, doc)  # atomic: a crash never leaves a half-written profile


def parse_coeffs(text: str) -> CostModel:
    """'A,B,C' (upstream f(l)) or 'c0,g,b,d,e,f' (full model) from the command line."""
    try:
        vals = [float(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(f"--coeffs {text!r}: expected comma-separated numbers") from None
    if len(vals) == 3:
        return CostModel.from_upstream(*vals)
    if len(vals) == 6:
        return CostModel(**dict(zip(COEFS, vals)))
    raise ValueError(f"--coeffs {text!r}: give 3 values (upstream a,b,c) or 6 (c0,g,b,d,e,f)")


def profile_cap(doc: dict, where: str) -> int:
    """A served profile's `measured_chunk`: the largest chunk its server measured, which its plans never exceed
    (plugin/startup/coverage.py); the server honours it as `sglang-cpp plan --profile` does (0: none). Anything
    but a whole number >= 1 is a ValueError naming the file."""
    meta = doc.get("meta") if isinstance(doc, dict) else None
    raw = meta.get("measured_chunk") if isinstance(meta, dict) else None
    if raw is None or (raw == 0 and not isinstance(raw, bool)):
        return 0
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise ValueError(f"{where}: meta.measured_chunk={raw!r} must be a whole number of tokens >= 1 (the largest "
                         "chunk its server measured), or absent")
    return raw


__all__ = ["load_profile", "cost_from_profile", "check_profile", "load_cost", "save_profile", "parse_coeffs",
           "profile_cap"]
