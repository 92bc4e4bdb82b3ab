"""The fit behind `sglang-cpp tune fit` (its flags: sglang_cpp/cli/tune/fit_cmd.py): t(L, x) per PP stage, and how well it fits.

Why a separate step: a cost model is only as good as its residuals. This prints the coefficients,
R^2, median and held-out error of every stage, draws measured against fitted times, and can refit
from what a real server measured (the plugin's decision log), not only from an offline profile.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.costmodel import COEFS, PipelineCost
from ..core.profile_io import cost_from_profile, load_profile
from ..files import iter_events

FORMS = ("full", "fa")


@dataclass(frozen=True)
class FitConfig:
    """One refit; every field is a flag of `sglang-cpp tune fit` (profile is the positional)."""

    profile: str | None = None
    from_log: tuple = ()
    form: str = "full"
    png: str | None = None
    out: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "from_log", tuple(self.from_log or ()))
        if self.form not in FORMS:
            raise ValueError(f"--form {self.form!r}: choose one of {', '.join(FORMS)}")
        if not self.profile and not self.from_log:
            raise ValueError("give a PROFILE JSON (from `sglang-cpp profile`) or --from-log FILE.jsonl "
                             "(a SGLANG_CPP_DECISION_LOG written by the plugin)")


# -- inputs ------------------------------------------------------------------------------------
def check_samples(samples: list[dict], where: str) -> None:
    """Reject samples no chunk can have produced, naming the first bad one and the fix."""
    for i, s in enumerate(samples):
        L, x, ms = s["L"], s["x"], s["ms"]
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (L, x, ms)) \
                or L < 0 or x <= 0 or ms <= 0:
            raise ValueError(f"{where}: sample {i} (L={L}, x={x}, ms={ms}, stage={s.get('stage', 0)}) is invalid: "
                             "need prefix L >= 0, chunk x > 0 and time ms > 0, all finite. "
                             "Delete the sample or re-profile.")
        if s.get("stage", 0) < 0:
            raise ValueError(f"{where}: sample {i} has stage={s['stage']}; stages are PP ranks >= 0")


def read_profile(path: str) -> tuple[dict, list[dict]]:
    """(validated profile doc, samples with their extra keys such as layer_ms kept)."""
    where = f"profile {path}"
    try:
        doc = load_profile(path)
    except (TypeError, KeyError) as exc:  # e.g. an 'ms' of null or a string
        raise ValueError(f"{where}: bad samples ({exc!r}); each needs numeric L, x, ms") from None
    check_samples(doc["samples"], where)
    raw = json.loads(Path(path).read_text())
    raw = raw if isinstance(raw, list) else raw.get("samples", [])
    merged = [{**(r if isinstance(r, dict) else {}), **p} for r, p in zip(raw, doc["samples"])]
    return doc, merged


def read_decision_log(paths) -> list[dict]:
    """Samples from the plugin's JSONL: single-request 'forward' events, stage = pp_rank. Events marked
    synchronous=false (a host clock around a GPU forward: launch time, not compute) are rejected."""
    out, launch_timed = [], 0
    for path, n, rec in iter_events(paths, "forward", strict=True):
        try:
            prefix, chunk, ms, rank = rec["prefix"], rec["chunk"], rec["ms"], rec["pp_rank"]
        except KeyError as exc:
            raise ValueError(f"decision log {path} line {n}: forward event lacks {exc}; "
                             "expected keys pp_rank, prefix, chunk, ms") from None
        if len(chunk) != 1 or len(prefix) != 1 or len(rec.get("rids", [0])) != 1 or chunk[0] < 1:
            continue  # batched forwards mix shapes: not one (L, x) point
        if rec.get("synchronous") is False:
            launch_timed += 1
            continue
        out.append({"L": float(prefix[0]), "x": float(chunk[0]), "ms": float(ms), "stage": int(rank),
                    "source": f"{Path(path).name}:{n}"})
    if not out and launch_timed:
        raise ValueError(f"decision log {', '.join(map(str, paths))}: all {launch_timed} forward events are "
                         "synchronous=false (host-timed GPU launches, not compute); rerun with this sglang-cpp, "
                         "which times GPU forwards with CUDA events")
    if launch_timed:
        print(f"[fit] skipped {launch_timed} forward events marked synchronous=false (launch time, not compute)",
              file=sys.stderr)
    if not out:
        raise ValueError(f"decision log {', '.join(map(str, paths))} has no single-request forward events; "
                         "send requests one at a time (concurrency 1) to a server with SGLANG_CPP_DECISION_LOG set")
    check_samples(out, f"decision log {', '.join(map(str, paths))}")
    return out


def load_samples(cfg: FitConfig) -> tuple[list[dict], dict, str]:
    """(samples, meta, description). With both inputs, the log's samples and the profile's meta."""
    meta, where = {}, ""
    if cfg.profile:
        doc, samples = read_profile(cfg.profile)
        meta, where = dict(doc.get("meta", {})), f"profile {cfg.profile}"
        if not samples:
            raise ValueError(f"{where} holds fitted coefficients but no samples; nothing to refit. "
                             "Use the profile that still has its measurements.")
    if cfg.from_log:
        samples = read_decision_log(cfg.from_log)
        where = f"decision log {', '.join(cfg.from_log)}"
        meta = {**meta, "backend": "decision-log", "source": list(cfg.from_log)}
    return samples, meta, where


# -- fit ---------------------------------------------------------------------------------------
def fit_stages(samples: list[dict], form: str = "full", meta: dict | None = None, where: str = "profile") -> list:
    """One CostModel per stage present in the samples, in stage order (profile_io.cost_from_profile's fit,
    which also turns a whole-pipeline profile of scope 'all' into a per-stage share)."""
    by_stage = {int(s.get("stage", 0)) for s in samples}
    if sorted(by_stage) != list(range(len(by_stage))):
        raise ValueError(f"{where}: samples cover stages {sorted(by_stage)}; every stage 0..P-1 needs samples")
    cost = cost_from_profile({"samples": samples, "meta": dict(meta or {})}, where, form)
    return list(getattr(cost, "stages", None) or [cost])


def as_cost(models: list):
    return models[0] if len(models) == 1 else PipelineCost(tuple(models))


def residuals(models: list, samples: list[dict]) -> list[dict]:
    """Per sample: measured, predicted and relative error (what to look at when a plan misses)."""
    out = []
    for s in samples:
        st = int(s.get("stage", 0))
        pred = float(models[st].time(s["L"], s["x"]))
        if s.get("scope") == "all":  # a whole-pipeline sample against the per-stage share
            pred *= models[st].meta.get("pp_share", 1)
        out.append({"stage": st, "L": s["L"], "x": s["x"], "ms": s["ms"], "pred_ms": round(pred, 6),
                    "rel_err": round((s["ms"] - pred) / pred, 6) if pred > 0 else None})
    return out


def report(models: list) -> str:
    lines = []
    for st, m in enumerate(models):
        fit = m.fit
        held = fit.get("holdout") or {}
        lines += [f"stage {st}: {m}",
                  "  " + "  ".join(f"{k}={getattr(m, k):.6g}" for k in COEFS) + f"  (form {fit.get('form')}, "
                  f"{fit.get('n')} samples)",
                  f"  R^2={fit['r2']:.5f}  median rel err={fit['median_rel_err']:.2%}  "
                  f"max rel err={fit['max_rel_err']:.2%}  held-out median rel err="
                  + (f"{held['median_rel_err']:.2%} (n={held['n']})" if held else "n/a (too few samples)")]
    return "\n".join(lines)


def plot_fit(models: list, samples: list[dict], meta: dict, path) -> Path:
    """Measured (markers) vs fitted (lines) chunk time against prefix L; one colour per chunk size."""
    from sglang_cpp.files import pyplot, save_figure

    plt = pyplot()
    P = len(models)
    fig, axes = plt.subplots(1, P, figsize=(6 * P, 4.5), squeeze=False)
    for st, (m, ax) in enumerate(zip(models, axes[0])):
        ss = [s for s in samples if int(s.get("stage", 0)) == st]
        xs = np.array([s["x"] for s in ss])
        uniq = np.unique(xs)
        if len(uniq) > 8:  # a real run's chunks vary: colour by quantile bins of x
            edges = np.unique(np.quantile(xs, np.linspace(0, 1, 7)))
            idx = np.digitize(xs, edges[1:-1])
            groups = [idx == k for k in range(len(edges) - 1)]
        else:
            groups = [xs == v for v in uniq]
        colors = plt.cm.viridis(np.linspace(0, 0.9, max(len(groups), 1)))
        Lmax = max(s["L"] for s in ss) or 1.0
        grid = np.linspace(0, Lmax * 1.05, 200)
        for g, c in zip(groups, colors):
            sel = [s for s, k in zip(ss, g) if k]
            if not sel:
                continue
            gx = np.array([s["x"] for s in sel])
            xrep = float(np.median(gx))
            label = f"x={int(xrep)}" if gx.min() == gx.max() else f"x={int(gx.min())}-{int(gx.max())}"
            ax.scatter([s["L"] for s in sel], [s["ms"] for s in sel], color=c, s=18)
            ax.plot(grid, m.time(grid, xrep), color=c, lw=1.2, label=label)
        r2 = m.fit.get("r2")
        ax.set_title(f"stage {st}: markers measured, lines fitted" + (f" (R^2={r2:.4f})" if r2 is not None else ""),
                     fontsize=9)
        ax.set_xlabel("prefix L (tokens)")
        ax.set_ylabel("chunk time (ms)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, title="chunk size", title_fontsize=7)
    model = Path(str(meta.get("model") or "model?").rstrip("/")).name
    fig.suptitle(f"chunk time t(L, x): {model} on {meta.get('device_name') or 'device?'}"
                 + (f" ({meta['dtype']})" if meta.get("dtype") else ""), fontsize=10)
    return save_figure(fig, path)


__all__ = ["FitConfig", "FORMS", "read_profile", "read_decision_log", "check_samples", "load_samples", "fit_stages",
           "residuals", "report", "plot_fit", "as_cost"]
