"""A cost model piecewise in the prefix L or in the chunk size x: one set of coefficients per kernel regime.

Why: a kernel can switch method at a prefix length. DeepSeek's MLA in SGLang 0.5.23 runs a fresh chunk
(L = 0) as plain MHA, a short prefix with the absorbed MLA kernel and, on flashinfer / fa3 / flashmla,
a prefix of SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD (8192) or more as MHA over the prefix rebuilt from its
latent cache (`deepseek_common/attention_backend_handler.py`). One polynomial across such a switch fits
neither side. Here a chunk is priced in the regime of the prefix it starts at, and every regime is
fitted on its own samples; the planner and the simulator only ever call `time`, or, in the planner's hot
loops, the polynomial rows of the regime the prefix lies in (`regime_rows`).

A kernel can also switch with the chunk size: PyTorch's CPU flash attention (the testbed's) streams the
prefix keys once per query block of 32 rows below 192 queries, 64 below 768 and 256 from 768 on, so a
query costs 1.25-1.7x more in a short chunk (`results/flash_split.md`). A model piecewise in x
(`axis="x"`) prices a chunk in the regime of its own size; its regimes share every coefficient but the
L*x one (`costmodel.fit_cost_model`), which is where the switch acts. Such a t(L, x) is not monotone in x
(a chunk just below a switch can cost more than one at it), so "the largest chunk within a time" looks in
every x regime (`XRegimeRows`).
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


AXES = ("L", "x")
CPU_FLASH_SWITCHES = (192, 768)  # query lengths where PyTorch's CPU flash kernel widens its query block


@dataclass(frozen=True)
class PiecewiseCost:
    """t(L, x) = models[i].time(L, x) for bounds[i-1] <= v < bounds[i], v the prefix L (axis "L") or the
    chunk size x (axis "x"); bounds strictly increasing, > 0. A model is a CostModel or a PipelineCost (a
    roofline stage); a stage of a PipelineCost may be one. A model piecewise in L may hold models piecewise
    in x (the calibration fits x's switches inside each prefix regime), not the reverse."""

    bounds: tuple
    models: tuple
    names: tuple = ()
    meta: dict = field(default_factory=dict, compare=False)
    axis: str = "L"

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
        if self.axis not in AXES:
            raise ValueError(f"piecewise cost model: axis {self.axis!r} must be one of {AXES}")
        if self.axis == "x" and any(isinstance(m, PiecewiseCost) for m in self.models):
            raise ValueError("piecewise cost model: a model piecewise in x holds no piecewise models (nest x "
                             "inside L)")
        object.__setattr__(self, "bounds", b)

    def regime(self, v):
        """Regime index of a prefix (axis L) or a chunk size (axis x)."""
        return regime_index(self.bounds, v)

    def time(self, L, x):
        L, x = np.broadcast_arrays(np.asarray(L, float), np.asarray(x, float))
        v = L if self.axis == "L" else x
        out = np.asarray(self.models[0].time(L, x), float)
        for b, m in zip(self.bounds, self.models[1:]):
            out = np.where(v >= b, m.time(L, x), out)
        return out if out.ndim else float(out)

    def model_at(self, v: float):
        return self.models[int(self.regime(v))]

    def max_chunk_for(self, L: float, T: float) -> float:
        if self.axis == "L":
            return self.model_at(L).max_chunk_for(L, T)
        return largest_x([m.max_chunk_for(L, T) for m in self.models], self.bounds)

    def with_models(self, models) -> "PiecewiseCost":
        """The same switches (bounds, names, meta, axis) over other regime models."""
        return PiecewiseCost(self.bounds, tuple(models), self.names, self.meta, self.axis)

    @property
    def fit(self) -> dict:
        return {"regimes": [dict(getattr(m, "fit", {}) or {}) for m in self.models]}

    def to_dict(self) -> dict:
        return {"bounds": list(self.bounds), "names": list(self.names), "meta": dict(self.meta),
                **({"axis": self.axis} if self.axis != "L" else {}),
                "regimes": [m.to_dict() for m in self.models]}

    def __str__(self) -> str:
        edges = (0,) + self.bounds + (math.inf,)
        names = self.names or tuple(f"regime {i}" for i in range(len(self.models)))
        what = "prefix" if self.axis == "L" else "chunk"
        return "; ".join(f"{n} ({what} in [{lo}, {hi})): {m}"
                         for n, lo, hi, m in zip(names, edges, edges[1:], self.models))


def largest_x(roots, bounds):
    """The largest chunk within a time over x regimes: regime j's root counts where it reaches the regime
    (its time at the regime's first size is within the time), capped just below the next switch; 0 where
    none does. `roots` per regime, numpy-broadcast."""
    edges = (0,) + tuple(bounds) + (math.inf,)
    out = 0.0
    for r, lo, hi in zip(roots, edges, edges[1:]):
        out = np.maximum(out, np.where(np.asarray(r) >= lo, np.minimum(r, hi - 1e-6), 0.0))
    return out if np.ndim(out) else float(out)


def is_piecewise(cost) -> bool:
    """True when any stage's time is piecewise in L or x (the planner then searches regime by regime). A
    PipelineCost is anything with `stages` (duck-typed: costmodel imports this module, not the reverse)."""
    if isinstance(cost, PiecewiseCost):
        return True
    return any(is_piecewise(m) for m in getattr(cost, "stages", ()))


def _flat_rows(model) -> list[tuple]:
    rows = model.rows if hasattr(model, "stages") else (model,)
    return [tuple(getattr(r, k) for k in COEFS) for r in rows]


def _at(model, v: float, axis: str = "L"):
    """The model (or maximum of models) a stage uses at prefix v (axis L) or at chunk size v (axis x);
    switches on the other axis stay (`regime_rows` resolves x first, then L, down to polynomials)."""
    if isinstance(model, PiecewiseCost):
        if model.axis == axis:
            return _at(model.model_at(v), v, axis)
        return model.with_models(_at(m, v, axis) for m in model.models)
    if hasattr(model, "stages"):  # each stage with its per-chunk overhead (PipelineCost.charged)
        return type(model)(tuple(_at(m, v, axis) for m in getattr(model, "charged", model.stages)))
    return model


def all_bounds(cost, axis: str = "L") -> tuple:
    """Every switch on `axis` anywhere in the model (all stages, all regimes)."""
    if isinstance(cost, PiecewiseCost):
        inner = {b for m in cost.models for b in all_bounds(m, axis)}
        return tuple(sorted((set(cost.bounds) if cost.axis == axis else set()) | inner))
    return tuple(sorted({b for m in getattr(cost, "stages", ()) for b in all_bounds(m, axis)}))


def x_bounds_of(model) -> tuple:
    """The chunk-size switches a stage model was fitted with (what an online refit must fit again)."""
    return all_bounds(model, "x")


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


@dataclass(frozen=True)
class XRegimeRows:
    """The planner's view of a pipeline piecewise in x: for every chunk-size interval [bounds[j-1],
    bounds[j]) the RegimeRows of the model restricted to it. The largest chunk within a time is the
    largest over the intervals (`largest_x`)."""

    bounds: tuple
    parts: tuple


def regime_rows(cost):
    """RegimeRows of a model piecewise in L; XRegimeRows of one piecewise in x (RegimeRows per x interval)."""
    xb = all_bounds(cost, "x")
    if xb:
        return XRegimeRows(xb, tuple(regime_rows(_at(cost, float(e), "x")) for e in (0,) + xb))
    bounds = all_bounds(cost)
    edges = (0,) + bounds
    per = [_flat_rows(_at(cost, float(e))) for e in edges]
    n = max(len(r) for r in per)
    table = np.array([r + [r[0]] * (n - len(r)) for r in per], float)
    return RegimeRows(bounds, table)


def add_constant_piecewise(cost: PiecewiseCost, ms, add) -> PiecewiseCost:
    """The same regimes with the overhead `ms` more per chunk (`add` is costmodel.add_constant, per regime)."""
    return cost.with_models(add(m, ms) for m in cost.models)


def piecewise_from_dict(d: dict, where: str, parse) -> PiecewiseCost:
    try:
        regimes = [parse(r, f"{where} regime {i}") for i, r in enumerate(d["regimes"])]
        return PiecewiseCost(tuple(d["bounds"]), tuple(regimes), tuple(d.get("names") or ()),
                             dict(d.get("meta") or {}), str(d.get("axis", "L")))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{where}: a piecewise model needs 'bounds' and 'regimes' ({exc!r})") from None


MLA_THRESHOLD = 8192  # SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD's default in SGLang 0.5.23
MLA_CAPACITY = 128 * 1024  # SGLANG_MAX_KV_CHUNK_CAPACITY's default
_HANDLED = ("flashinfer", "fa3", "flashmla", "fa4", "intel_xpu")  # `_handle_attention_backend`'s callers
_ONE_SHOT = ("fa3", "flashinfer", "flashmla", "aiter")  # MHA_ONE_SHOT_SUPPORTED_BACKENDS


PADDING_FACTOR = 2  # prefill_cuda_graph_runner.py:158: a replay pads at most this many times the chunk's tokens


def captured_everywhere(max_tokens: int, context_limit: int | None, largest_chunk: int, context_len: int,
                        buckets: tuple = (), smallest_chunk: int = 1) -> bool:
    """Whether every chunk a server plans runs in its captured prefill graph (SGLang 0.5.23
    prefill_cuda_graph_runner.py can_replay_locally, 1325-1421: a chunk of at most `max_tokens` tokens, over a
    context of at most `context_limit` (None: no limit), padded to the next of the captured `buckets` by at most
    PADDING_FACTOR): then MLA runs absorbed at every prefix (mla_switches' captured_prefill). Chunks run from
    `smallest_chunk` to `largest_chunk`. False when some chunk can run eager: the regimes in L then hold for the
    eager chunks only."""
    if largest_chunk > max_tokens or (context_limit is not None and context_len > context_limit):
        return False
    b = sorted(int(v) for v in buckets if int(v) <= max_tokens)
    if not b:
        return True
    if b[0] > PADDING_FACTOR * smallest_chunk:  # the smallest chunks pad too far to the first bucket
        return False
    return all(hi <= PADDING_FACTOR * (lo + 1) for lo, hi in zip(b, b[1:]))


def mla_switches(backend: str, threshold: int = MLA_THRESHOLD, capacity: int = MLA_CAPACITY,
                 chunked_prefix_cache: bool = True, *, deterministic: bool = False, disable_ragged: bool = False,
                 cp: bool = False, captured_prefill: bool = False, sm100: bool = True) -> tuple:
    """(bounds, regime names) of an MLA model's prefill on `backend`, as SGLang 0.5.23 dispatches a single
    request's extend (`models/deepseek_common/attention_backend_handler.py`, the same predicates;
    tests/inproc/test_regimes.py runs the handler itself case by case). ((), ()): one method at every prefix.

    - a captured prefill graph (piecewise / breakable CUDA graph): absorbed MLA (aiter: MHA) everywhere;
    - flashinfer / fa3 / flashmla / fa4 / intel_xpu: MLA everywhere under attention CP, under deterministic
      inference (fa3, fa4), and on flashinfer / flashmla with `flashinfer_mla_disable_ragged` or no rope
      dims (`disable_ragged`); fa4 off SM100/110 runs chunked-KV MHA everywhere. Otherwise MHA on a fresh
      chunk, absorbed MLA for 0 < L < threshold, then MHA over the rebuilt prefix (from 0 when the chunked
      prefix cache is off: MLA for every L > 0): in one shot up to `capacity` tokens on fa3 / flashinfer /
      flashmla, in KV chunks past it and always on fa4 / intel_xpu;
    - trtllm_mla: chunked-KV MHA everywhere, or MHA / MLA at L = 0 / L > 0 without the chunked prefix cache;
    - aiter: MHA in one shot up to `capacity`, then in KV chunks;
    - triton (and every backend without a handler, its fallback): MHA / MLA at L = 0 / L > 0; MLA everywhere
      under deterministic inference;
    - ascend, dsa: decided inside the backend: no switch this table knows.

    The switch reads the batch's summed prefix and sequence lengths: a chunk is priced by its own prefix, so
    a MIXED batch (decodes riding with the chunk under --enable-mixed-chunk) may switch earlier than this
    says; such batches hold several requests and are never fitted (plugin forwards.online_sample). The capacity
    switch really depends on L + x, which this places at L."""
    name = (backend or "").split(":")[0]
    none = ((), ())
    if name in ("ascend", "dsa", "nsa"):
        return none
    if captured_prefill:
        return none
    if name == "aiter":
        return (capacity,), ("mha-one-shot", "mha-chunked-kv")
    if name == "trtllm_mla":
        return none if chunked_prefix_cache else ((1,), ("mha", "mla-absorbed"))
    if name not in _HANDLED:  # triton and the registry's fallback
        return none if deterministic else ((1,), ("mha", "mla-absorbed"))
    if name == "fa4" and not sm100:
        return none
    if cp or (deterministic and name in ("fa3", "fa4")) or (disable_ragged and name in ("flashinfer", "flashmla")):
        return none
    one_shot = name in _ONE_SHOT
    fresh = "mha" if one_shot else "mha-chunked-kv"
    if not chunked_prefix_cache:
        return (1,), (fresh, "mla-absorbed")
    if not one_shot:
        return ((1, threshold), (fresh, "mla-absorbed", "mha-chunked-kv")) if threshold > 1 else none
    if threshold >= capacity:  # absorbed MLA until the threshold, past the one-shot capacity by then
        return (1, threshold), (fresh, "mla-absorbed", "mha-chunked-kv")
    if threshold <= 1:  # the prefix is rebuilt from the first token on
        return (1, capacity), (fresh, "mha-one-shot", "mha-chunked-kv")
    return (1, threshold, capacity), (fresh, "mla-absorbed", "mha-one-shot", "mha-chunked-kv")


__all__ = ["regime_index", "mla_switches", "MLA_THRESHOLD", "MLA_CAPACITY", "CPU_FLASH_SWITCHES", "PiecewiseCost",
           "RegimeRows", "XRegimeRows", "regime_rows", "largest_x", "is_piecewise", "all_bounds", "x_bounds_of", "piecewise_from_dict",
           "add_constant_piecewise"]
