"""A cost model piecewise in the prefix L: one set of coefficients per attention regime.

Why: a kernel can switch method at a prefix length. DeepSeek's MLA in SGLang 0.5.23 runs a fresh chunk
(L = 0) as plain MHA, a short prefix with the absorbed MLA kernel and, on flashinfer / fa3 / flashmla,
a prefix of SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD (8192) or more as MHA over the prefix rebuilt from its
latent cache (`deepseek_common/attention_backend_handler.py`). One polynomial across such a switch fits
neither side. Here a chunk is priced in the regime of the prefix it starts at, and every regime is
fitted on its own samples; the planner and the simulator only ever call `time`, or, in the planner's hot
loops, the polynomial rows of the regime the prefix lies in (`regime_rows`).
"""
from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np

COEFS = ("c0", "g", "b", "d", "e", "f")  # costmodel's order; this module sits below it and imports none of it


def regime_index(bounds, L):
    """Index of the regime each prefix lies in: i for bounds[i-1] <= L < bounds[i] (numpy broadcasting)."""
    return np.searchsorted(np.asarray(bounds, float), np.asarray(L, float), side="right")


@dataclass(frozen=True)
class PiecewiseCost:
    """t(L, x) = models[i].time(L, x) for bounds[i-1] <= L < bounds[i] (bounds strictly increasing, > 0).
    A model is a CostModel or a PipelineCost (a roofline stage); a stage of a PipelineCost may be one."""

    bounds: tuple
    models: tuple
    names: tuple = ()
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        b = tuple(int(v) for v in self.bounds)
        if not b or any(v < 1 for v in b) or any(q <= p for p, q in zip(b, b[1:])):
            raise ValueError(f"piecewise cost model: bounds {list(self.bounds)} must be strictly increasing "
                             "prefix lengths >= 1")
        if len(self.models) != len(b) + 1:
            raise ValueError(f"piecewise cost model: {len(b)} bounds need {len(b) + 1} regime models, "
                             f"got {len(self.models)}")
        if self.names and len(self.names) != len(self.models):
            raise ValueError(f"piecewise cost model: {len(self.names)} names for {len(self.models)} regimes")
        object.__setattr__(self, "bounds", b)

    def regime(self, L):
        return regime_index(self.bounds, L)

    def time(self, L, x):
        L, x = np.broadcast_arrays(np.asarray(L, float), np.asarray(x, float))
        out = np.asarray(self.models[0].time(L, x), float)
        for b, m in zip(self.bounds, self.models[1:]):
            out = np.where(L >= b, m.time(L, x), out)
        return out if out.ndim else float(out)

    def model_at(self, L: float):
        return self.models[int(self.regime(L))]

    def max_chunk_for(self, L: float, T: float) -> float:
        return self.model_at(L).max_chunk_for(L, T)

    @property
    def fit(self) -> dict:
        return {"regimes": [dict(getattr(m, "fit", {}) or {}) for m in self.models]}

    def to_dict(self) -> dict:
        return {"bounds": list(self.bounds), "names": list(self.names), "meta": dict(self.meta),
                "regimes": [m.to_dict() for m in self.models]}

    def __str__(self) -> str:
        edges = (0,) + self.bounds + (math.inf,)
        names = self.names or tuple(f"regime {i}" for i in range(len(self.models)))
        return "; ".join(f"{n} [{lo}, {hi}): {m}" for n, lo, hi, m in zip(names, edges, edges[1:], self.models))


def is_piecewise(cost) -> bool:
    """True when any stage's time is piecewise in L (the planner then searches regime by regime). A
    PipelineCost is anything with `stages` (duck-typed: costmodel imports this module, not the reverse)."""
    if isinstance(cost, PiecewiseCost):
        return True
    return any(is_piecewise(m) for m in getattr(cost, "stages", ()))


def _flat_rows(model) -> list[tuple]:
    rows = model.rows if hasattr(model, "stages") else (model,)
    return [tuple(getattr(r, k) for k in COEFS) for r in rows]


def _at(model, L: float):
    """The polynomial model (or maximum of models) a stage uses at prefix L."""
    if isinstance(model, PiecewiseCost):
        return _at(model.model_at(L), L)
    if hasattr(model, "stages"):
        return type(model)(tuple(_at(m, L) for m in model.stages))
    return model


def all_bounds(cost) -> tuple:
    if isinstance(cost, PiecewiseCost):
        inner = {b for m in cost.models for b in all_bounds(m)}
        return tuple(sorted(set(cost.bounds) | inner))
    return tuple(sorted({b for m in getattr(cost, "stages", ()) for b in all_bounds(m)}))


@dataclass(frozen=True)
class RegimeRows:
    """The planner's view of a piecewise pipeline: the polynomial rows in force in each prefix interval
    [bounds[i-1], bounds[i]), every interval padded to the same row count (a repeated row changes no
    minimum or maximum), as (intervals, rows, 6) coefficients."""

    bounds: tuple
    table: np.ndarray

    def __post_init__(self):  # the hot loop's form per interval: tuples for a few rows, numpy for many
        object.__setattr__(self, "_per", tuple([tuple(r) for r in t.tolist()] if len(t) <= 32 else t
                                               for t in self.table))

    def at(self, L: float):
        """The coefficient rows in force at the scalar prefix L (the hot loop's regime lookup)."""
        return self._per[bisect_right(self.bounds, L)]


def regime_rows(cost) -> RegimeRows:
    bounds = all_bounds(cost)
    edges = (0,) + bounds
    per = [_flat_rows(_at(cost, float(e))) for e in edges]
    n = max(len(r) for r in per)
    table = np.array([r + [r[0]] * (n - len(r)) for r in per], float)
    return RegimeRows(bounds, table)


def add_constant_piecewise(cost: PiecewiseCost, ms: float, add) -> PiecewiseCost:
    """The same regimes with `ms` more per chunk (`add` is costmodel.add_constant, applied per regime)."""
    return PiecewiseCost(cost.bounds, tuple(add(m, ms) for m in cost.models), cost.names, cost.meta)


def piecewise_from_dict(d: dict, where: str, parse) -> PiecewiseCost:
    try:
        regimes = [parse(r, f"{where} regime {i}") for i, r in enumerate(d["regimes"])]
        return PiecewiseCost(tuple(d["bounds"]), tuple(regimes), tuple(d.get("names") or ()),
                             dict(d.get("meta") or {}))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{where}: a piecewise model needs 'bounds' and 'regimes' ({exc!r})") from None


MLA_THRESHOLD = 8192  # SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD's default in SGLang 0.5.23
MLA_CAPACITY = 128 * 1024  # SGLANG_MAX_KV_CHUNK_CAPACITY's default
_THRESHOLD_BACKENDS = ("flashinfer", "fa3", "flashmla", "fa4", "intel_xpu")


def mla_switches(backend: str, threshold: int = MLA_THRESHOLD, capacity: int = MLA_CAPACITY,
                 chunked_prefix_cache: bool = True) -> tuple:
    """(bounds, regime names) of an MLA model's prefill on `backend`, as SGLang 0.5.23 dispatches it
    (`deepseek_common/attention_backend_handler.py`; plugin/switches.py reads the settings from a server,
    the analytic model takes them as given)."""
    name = (backend or "").split(":")[0]
    if name in _THRESHOLD_BACKENDS and chunked_prefix_cache:
        if 1 < threshold < capacity:
            return (1, threshold, capacity), ("mha", "mla-absorbed", "mha-one-shot", "mha-chunked-kv")
        return (1, capacity), ("mha", "mla-absorbed", "mha-chunked-kv")
    if name == "trtllm_mla":
        return ((), ()) if chunked_prefix_cache else ((1,), ("mha", "mla-absorbed"))
    if name == "aiter":
        return (capacity,), ("mha-one-shot", "mha-chunked-kv")
    if name in ("ascend", "dsa", "nsa"):  # decided inside the backend: no switch this table knows
        return (), ()
    return (1,), ("mha", "mla-absorbed")  # triton, and backends without a handler (its fallback)


__all__ = ["regime_index", "mla_switches", "MLA_THRESHOLD", "MLA_CAPACITY", "PiecewiseCost", "RegimeRows", "regime_rows", "is_piecewise", "all_bounds", "piecewise_from_dict",
           "add_constant_piecewise"]
