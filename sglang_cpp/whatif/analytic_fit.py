"""The analytic model calibrated on measured TTFTs: the efficiency (and optionally the per-chunk
overhead) that makes the simulated TTFT of each measured configuration match its measurement.

Why: the device presets give peaks, not what a real stack reaches; a guessed efficiency of 0.5 makes
every what-if about 2x too slow. One measured point without pipeline effects (PP=1) pins the
efficiency; pipeline behaviour then comes from the simulator and the chunk policy, not from fitting.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..core.partition import default_partition
from .analytic import DeviceSpec, ModelSpec, analytic_cost_model


@dataclass(frozen=True)
class Measured:
    """One measured TTFT and the configuration it was measured on."""

    pp_size: int
    input_len: int
    ttft_ms: float
    policy: str = "fixed"  # fixed | quadratic (upstream dynamic chunking) | plan
    chunk: int = 16384  # --chunked-prefill-size
    sigma: float = 0.8

    @classmethod
    def parse(cls, text: str) -> "Measured":
        """'PP,INPUT_LEN,TTFT_S[,POLICY[,CHUNK[,SIGMA]]]', e.g. '1,128k,55.5' or '8,128k,10.54,quadratic,18k,0.8'."""
        from ..args import parse_len

        parts = [p.strip() for p in str(text).split(",")]
        try:
            if not 3 <= len(parts) <= 6:
                raise ValueError("expected 3 to 6 fields")
            kw = dict(pp_size=int(parts[0]), input_len=parse_len(parts[1]), ttft_ms=float(parts[2]) * 1e3)
            if len(parts) > 3:
                kw["policy"] = parts[3]
            if len(parts) > 4:
                kw["chunk"] = parse_len(parts[4])
            if len(parts) > 5:
                kw["sigma"] = float(parts[5])
            m = cls(**kw)
        except ValueError as exc:
            raise ValueError(f"--measured {text!r}: {exc}; give PP,INPUT_LEN,TTFT_S[,POLICY[,CHUNK[,SIGMA]]], "
                             "e.g. 1,128k,55.5 or 8,128k,10.54,quadratic,18k,0.8") from None
        if m.pp_size < 1 or m.input_len < 1 or not (m.ttft_ms > 0 and math.isfinite(m.ttft_ms)) or m.chunk < 1:
            raise ValueError(f"--measured {text!r}: PP, INPUT_LEN, TTFT_S and CHUNK must be > 0")
        if m.policy not in POLICIES:
            raise ValueError(f"--measured {text!r}: policy {m.policy!r} is not fixed, quadratic or plan")
        return m

    @property
    def value(self) -> float:
        return self.ttft_ms


POLICIES = ("fixed", "quadratic", "plan")


@dataclass(frozen=True)
class Ratio:
    """A measured TTFT ratio of two chunk policies at one PP size and length (a over b).

    Why: a paper often publishes a comparison, not both times. The blog's one figure for small chunks is
    fixed 6K against DCK 18K at 128K on PP8: 69.6% and 76.9% strong-scaling efficiency, i.e. 1.105."""

    pp_size: int
    input_len: int
    a: tuple  # (policy, chunk, sigma)
    b: tuple
    ratio: float

    @staticmethod
    def _config(text: str) -> tuple:
        from ..args import parse_len

        f = [t.strip() for t in text.split(":")]
        if not 2 <= len(f) <= 3 or f[0] not in POLICIES:
            raise ValueError(f"{text!r} is not POLICY:CHUNK[:SIGMA] with POLICY one of {', '.join(POLICIES)}")
        return f[0], parse_len(f[1]), float(f[2]) if len(f) == 3 else 0.8

    @classmethod
    def parse(cls, text: str) -> "Ratio":
        """'PP,INPUT_LEN,POLICY:CHUNK[:SIGMA]/POLICY:CHUNK[:SIGMA],RATIO', e.g. '8,128k,fixed:6k/quadratic:18k:0.8,1.105'."""
        from ..args import parse_len

        parts = [p.strip() for p in str(text).split(",")]
        try:
            if len(parts) != 4 or parts[2].count("/") != 1:
                raise ValueError("expected 4 fields, the third two configurations joined by '/'")
            a, b = (cls._config(t) for t in parts[2].split("/"))
            r = cls(int(parts[0]), parse_len(parts[1]), a, b, float(parts[3]))
        except ValueError as exc:
            raise ValueError(f"--measured-ratio {text!r}: {exc}; give PP,INPUT_LEN,POLICY:CHUNK[:SIGMA]/"
                             "POLICY:CHUNK[:SIGMA],RATIO, e.g. 8,128k,fixed:6k/quadratic:18k:0.8,1.105") from None
        if r.pp_size < 1 or r.input_len < 1 or min(a[1], b[1]) < 1 or not (r.ratio > 0 and math.isfinite(r.ratio)):
            raise ValueError(f"--measured-ratio {text!r}: PP, INPUT_LEN, the chunks and RATIO must be > 0")
        return r

    def points(self) -> tuple:
        return tuple(Measured(self.pp_size, self.input_len, 1.0, *c) for c in (self.a, self.b))

    @property
    def value(self) -> float:
        return self.ratio

    def __str__(self) -> str:
        def name(c):
            return f"{c[0]} C={c[1]}" + (f" sigma={c[2]:g}" if c[0] == "quadratic" else "")
        return f"PP{self.pp_size} {self.input_len} tokens {name(self.a)} / {name(self.b)}"


def stage_models(model: ModelSpec, device: DeviceSpec, tp: int, pp: int, parts=None, dtype: str | None = None,
                 roofline: bool = True, attention_backend: str | None = None, tp_comm: bool = False, cp: int = 1):
    """Per-stage analytic cost models: SGLang's default layer split (or `parts`), the embedding on the
    first stage and the last token's LM head on the last; each the roofline maximum of its FLOP and byte
    times (`roofline.py`), or FLOPs alone with roofline=False. With `attention_backend`, an MLA model's
    stages are piecewise in L at the prefixes where SGLang switches its prefill method on that backend
    (core/regimes.mla_switches): MHA on a fresh chunk, absorbed MLA over a short prefix, MHA over the
    rebuilt prefix past the threshold. tp_comm: charge each layer's collectives (comparing layouts, `tune
    layout`). cp: attention CP inside the TP group (analytic._layer_coefs)."""
    from ..core.regimes import PiecewiseCost, mla_switches
    from .roofline import roofline_stage

    parts = list(parts) if parts is not None else default_partition(model.num_layers, pp)
    if len(parts) != pp or any(n < 1 for n in parts) or sum(parts) > model.num_layers:
        raise ValueError(f"--layers-per-stage {parts}: give {pp} counts >= 1 summing to at most the model's "
                         f"{model.num_layers} layers")
    bounds, names = mla_switches(attention_backend) if attention_backend and model.is_mla else ((), ())
    out, first = [], 0
    for s, n in enumerate(parts):
        build = roofline_stage if roofline else analytic_cost_model
        kw = dict(layers=n, first_layer=first, tp=tp, dtype=dtype, include_embedding=s == 0,
                  include_lm_head=s == pp - 1, tp_comm=tp_comm, cp=cp)
        if bounds:
            out.append(PiecewiseCost(bounds, tuple(build(model, device, **kw, mla_absorbed=r == "mla-absorbed")
                                                   for r in names), names))
        else:
            out.append(build(model, device, **kw))
        first += n
    return out


def predict(model: ModelSpec, device: DeviceSpec, tp: int, point, chunk_overhead_ms: float | None = None,
            max_prefill: int = 16384, dtype: str | None = None) -> float:
    """The simulated counterpart of `point.value`: a TTFT in ms (Measured) or a TTFT ratio (Ratio)."""
    if isinstance(point, Ratio):
        a, b = (predict_ms(model, device, tp, p, chunk_overhead_ms, max_prefill, dtype) for p in point.points())
        return a / b
    return predict_ms(model, device, tp, point, chunk_overhead_ms, max_prefill, dtype)


def priced_stages(model: ModelSpec, device: DeviceSpec, tp: int, pp: int, chunk_overhead_ms: float | None = None,
                  **kw):
    """The per-stage analytic models (`stage_models`, same keywords) as one cost carrying the per-chunk
    overhead of every stage (None: the device preset's)."""
    from ..core.costmodel import PipelineCost, with_overheads

    o = device.chunk_overhead_ms if chunk_overhead_ms is None else float(chunk_overhead_ms)
    stages = stage_models(model, device, tp, pp, **kw)
    return with_overheads(PipelineCost(tuple(stages)), o, pp)  # one per stage, even one (a roofline stage is rows)


def predict_ms(model: ModelSpec, device: DeviceSpec, tp: int, point: Measured, chunk_overhead_ms: float | None = None,
               max_prefill: int = 16384, dtype: str | None = None) -> float:
    """Simulated TTFT of `point`'s configuration: its chunk policy on the per-stage models, replayed by
    the pipeline simulator with `chunk_overhead_ms` per chunk and stage (None: the device preset's)."""
    from ..core.policy import chunks_for
    from .simulator import simulate

    cost = priced_stages(model, device, tp, point.pp_size, chunk_overhead_ms, dtype=dtype)
    chunks = chunks_for(point.policy, point.input_len, cost, point.pp_size, point.chunk, sigma=point.sigma,
                        max_prefill=max_prefill)
    return simulate(chunks, cost, point.pp_size).ttft_ms


@dataclass(frozen=True)
class Fit:
    efficiency: float
    chunk_overhead_ms: float
    rows: tuple  # (point, predicted value: ms for a Measured, the ratio for a Ratio)

    def on(self, device: DeviceSpec) -> DeviceSpec:
        """`device` at the fitted efficiency (attention kernels follow it, as in the fit)."""
        return replace(device, efficiency=self.efficiency, attn_efficiency=None)


# The design blog's one published PP1 point (shared/seeds/004_26665f2ba558731c.txt): Qwen3-235B-A22B-FP8, TP4 on
# H20, 128K tokens in ~55.5 s. The benchmarks fit the H20 efficiency on it.
BLOG_PP1 = Measured(1, 128 * 1024, 55.5e3)


def fit(model: ModelSpec, device: DeviceSpec, tp: int, points: list, *, chunk_overhead_ms: float | None = None,
        fit_overhead: bool = False, max_prefill: int = 16384, dtype: str | None = None) -> Fit:
    """Least squares on log(predicted / measured) over the points (Measured TTFTs and Ratios): one
    efficiency for GEMMs and attention (device.efficiency; attention kernels follow it), and the per-chunk
    overhead when `fit_overhead`. A Ratio alone says nothing of the efficiency: give a Measured too."""
    from scipy.optimize import minimize, minimize_scalar

    if not points:
        raise ValueError("give at least one --measured point")
    if not any(isinstance(p, Measured) for p in points):
        raise ValueError("a --measured-ratio fixes no time scale: give at least one --measured TTFT as well")
    overhead_ms = device.chunk_overhead_ms if chunk_overhead_ms is None else chunk_overhead_ms
    if fit_overhead and len(points) < 2:
        raise ValueError("fitting the per-chunk overhead needs two or more --measured points or ratios (one fixes "
                         "the efficiency only); drop --fit-overhead or add a point")

    def loss(eff: float, o: float) -> float:
        dev = replace(device, efficiency=float(min(max(eff, 1e-3), 1.0)), attn_efficiency=None)
        return sum(math.log(predict(model, dev, tp, p, o, max_prefill, dtype) / p.value) ** 2 for p in points)

    if fit_overhead:
        res = minimize(lambda v: loss(v[0], max(v[1], 0.0)), x0=np.array([0.5, 10.0]), method="Nelder-Mead",
                       options={"xatol": 1e-4, "fatol": 1e-10, "maxiter": 400})
        eff, o = float(res.x[0]), max(float(res.x[1]), 0.0)
    else:
        eff, o = float(minimize_scalar(lambda e: loss(e, overhead_ms), bounds=(1e-3, 1.0), method="bounded",
                                       options={"xatol": 1e-5}).x), overhead_ms
    if not 1e-3 < eff < 1.0 - 1e-4:
        raise ValueError(f"the fitted efficiency {eff:.3f} sits at a bound of (0, 1]: the measurements cannot be "
                         f"reached by this model on {device.name} (check --gpu, --tp-size and the TTFTs)")
    dev = replace(device, efficiency=eff, attn_efficiency=None)
    return Fit(eff, o, tuple((p, predict(model, dev, tp, p, o, max_prefill, dtype)) for p in points))


__all__ = ["Measured", "Ratio", "Fit", "BLOG_PP1", "fit", "predict", "predict_ms", "stage_models", "priced_stages"]
