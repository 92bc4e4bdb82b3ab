"""2-D chunk cost model t(L, x): one forward of x new tokens over a cached prefix of L tokens.

    t = c0 + g*L + b*x + d*L^2 + e*L*x + f*x^2        (ms, per PP stage, all terms >= 0)

Why bivariate: SGLang's torch_native backend recomputes attention over the whole prefix for each
chunk, so a chunk costs about (L+x)^2 (d ~ f, e ~ 2f); FlashAttention-style kernels cost x*(2L+x)
(d = 0, e = 2f). One model with non-negative terms serves both, and upstream's 1-D fit
f(l) = a l^2 + b l + c is the special case c0=c, b=b, f=a, e=2a, d=g=0.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Sequence

import numpy as np

from .regimes import PiecewiseCost, add_constant_piecewise, piecewise_from_dict, regime_index

COEFS = ("c0", "g", "b", "d", "e", "f")
PROFILE_FORMAT = "sglang-cpp-profile"
META_KEYS = ("model", "device_name", "dtype", "tp", "pp", "stage", "page_size", "sglang_version",
             "torch_version", "date", "backend")
_SCALE = 1000.0  # fit in kilo-tokens for conditioning


@dataclass(frozen=True)
class CostModel:
    c0: float = 0.0
    g: float = 0.0
    b: float = 0.0
    d: float = 0.0
    e: float = 0.0
    f: float = 0.0
    meta: dict = field(default_factory=dict, compare=False)
    fit: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        for name in COEFS:
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"cost model coefficient {name}={v!r} must be a finite number >= 0")
        if self.b == 0 and self.e == 0 and self.f == 0:
            raise ValueError("cost model has b = e = f = 0: chunk time would not grow with the chunk size x")

    # -- evaluation ------------------------------------------------------------------
    def time(self, L, x):
        """Predicted ms for a chunk of x tokens over a prefix of L (numpy broadcasting)."""
        return (self.c0 + self.g * L + self.b * x + self.d * L * L + self.e * L * x + self.f * x * x)

    def max_chunk_for(self, L: float, T: float) -> float:
        """Largest real x >= 0 with t(L, x) <= T (closed-form root); 0 when even x=0 exceeds T."""
        qc = self.c0 + self.g * L + self.d * L * L - T
        if qc >= 0:
            return 0.0
        qb = self.b + self.e * L
        if self.f == 0.0:
            return -qc / qb
        disc = qb * qb - 4.0 * self.f * qc
        # numerically stable positive root of f x^2 + qb x + qc = 0 (qc < 0)
        return (-2.0 * qc) / (qb + math.sqrt(disc))

    @property
    def coeffs(self) -> dict:
        return {k: getattr(self, k) for k in COEFS}

    @property
    def is_fa_form(self) -> bool:
        return self.d == 0 and math.isclose(self.e, 2 * self.f, rel_tol=1e-9, abs_tol=1e-15)

    @classmethod
    def fa(cls, a: float, b: float, c0: float = 0.0, g: float = 0.0, **kw) -> "CostModel":
        """FlashAttention form t = c0 + g L + b x + a x (2L + x)."""
        return cls(c0=c0, g=g, b=b, d=0.0, e=2 * a, f=a, **kw)

    @classmethod
    def from_upstream(cls, a: float, b: float, c: float, **kw) -> "CostModel":
        """Upstream's f(l) = a l^2 + b l + c with chunk time f(L+x) - f(L) + c."""
        return cls.fa(a=a, b=max(b, 0.0), c0=max(c, 0.0), **kw)

    def to_dict(self) -> dict:
        return {"coeffs": self.coeffs, "meta": dict(self.meta), "fit": dict(self.fit)}

    @classmethod
    def from_dict(cls, d: dict, where: str = "cost model") -> "CostModel":
        try:
            co = d["coeffs"]
            return cls(**{k: float(co.get(k, 0.0)) for k in COEFS}, meta=dict(d.get("meta", {})),
                       fit=dict(d.get("fit", {})))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{where}: expected {{'coeffs': {{c0,g,b,d,e,f}}}}, got {exc!r}") from None

    def __str__(self) -> str:
        terms = " + ".join(f"{getattr(self, k):.4g}*{t}" for k, t in
                           zip(COEFS, ("1", "L", "x", "L^2", "L*x", "x^2")) if getattr(self, k))
        return f"t(L,x) = {terms} ms"


def _rows_at(coefs: np.ndarray, L, x) -> np.ndarray:
    """Every row of `coefs` (rows, 6) at (L, x), stacked on a leading axis. Element-wise IEEE operations in
    one fixed order, ((((c0 + g L) + b x) + d L^2) + e L x) + f x^2, never a matrix product: a BLAS kernel's
    summation order and FMA use vary with the node's core type and thread count (OPENBLAS_CORETYPE moved the
    last bit of predicted times), and every PP stage must price a chunk to the same bit (issue 56). The
    planner calls this thousands of times per plan."""
    L, x = np.broadcast_arrays(np.asarray(L, float), np.asarray(x, float))
    Lf, xf = L.ravel()[None, :], x.ravel()[None, :]
    c = np.asarray(coefs, float)
    t = c[:, 1:2] * Lf
    t += c[:, 0:1]
    t += c[:, 2:3] * xf
    t += c[:, 3:4] * (Lf * Lf)
    t += c[:, 4:5] * (Lf * xf)
    t += c[:, 5:6] * (xf * xf)
    return t.reshape((len(c),) + L.shape)


def _undominated(coefs: np.ndarray) -> np.ndarray:
    """The rows no other row dominates, first occurrences in order: with every coefficient and L, x >= 0, a
    row whose coefficients are all <= another's is never above it, in exact and in rounded arithmetic (each
    IEEE step of `_rows_at` is monotone), so the maximum over the rest is the maximum over all, bit for bit.
    Equal stages price as one row."""
    keep = []
    for i, r in enumerate(coefs):
        if not any((coefs[j] >= r).all() and ((coefs[j] > r).any() or j < i) for j in range(len(coefs)) if j != i):
            keep.append(i)
    return coefs[keep]


@dataclass(frozen=True)
class PipelineCost:
    """The slowest of several models for every (L, x): a pipeline runs at the pace of its slowest stage,
    and a roofline stage at the slower of its compute and memory bounds (`roofline.py`), so a stage may
    itself be a PipelineCost. The planner sees the flat list of polynomial `rows`.

    `overheads`: the per-chunk overhead of each stage (ChunkOverhead: launch, scheduling, the hidden-state
    receive), the one carrier of that cost, kept apart from the fitted forward models in `stages` (empty:
    none). Every time this object gives (`time`, `stage_times`, `rows`, `max_chunk_for`) includes it; the
    refit and the simulator read the two apart (`kernel`, `overheads`)."""

    stages: tuple
    overheads: tuple = ()

    def __post_init__(self):
        if not self.stages:
            raise ValueError("PipelineCost needs at least one stage model")
        over = tuple(ChunkOverhead.of(o) for o in self.overheads)
        if over and len(over) != len(self.stages):
            raise ValueError(f"PipelineCost: {len(over)} chunk overheads for {len(self.stages)} stages; give one "
                             "per stage")
        object.__setattr__(self, "overheads", over if any(o != ChunkOverhead() for o in over) else ())
        # each stage with its overhead, built once: `time` runs thousands of times per plan
        object.__setattr__(self, "_charged", tuple(add_constant(m, o) for m, o in zip(self.stages, self.overheads))
                           if self.overheads else self.stages)
        # (rows, 6) coefficients: every row evaluated in one matrix product (64 stages are common); None
        # when a stage is piecewise in L (core/regimes.py), whose rows depend on the prefix
        poly = all(isinstance(m, (CostModel, PipelineCost)) and getattr(m, "_coefs", 0) is not None
                   for m in self.stages)
        object.__setattr__(self, "_coefs", np.array([[getattr(m, k) for k in COEFS] for m in self.rows])
                           if poly else None)
        object.__setattr__(self, "_pace", None if self._coefs is None else _undominated(self._coefs))

    @property
    def kernel(self) -> "PipelineCost":
        """The fitted forward models alone, without the per-chunk overheads (what a logged forward measures)."""
        return PipelineCost(self.stages) if self.overheads else self

    @property
    def charged(self) -> tuple:
        """Every stage with its per-chunk overhead added (c0 and b): the same time as this object, stage by
        stage, for code that prices stages one at a time (the simulator, the regime tables)."""
        return self._charged

    @property
    def rows(self) -> tuple:
        """Every polynomial model inside, nested maxima flattened (the time is their maximum), each with its
        stage's overhead; a stage piecewise in L has no fixed rows (`regimes.regime_rows` gives them per
        prefix interval)."""
        if any(not isinstance(m, (CostModel, PipelineCost)) for m in self.stages):
            raise TypeError("a piecewise stage has no fixed polynomial rows; use regimes.regime_rows")
        return tuple(r for m in self.charged for r in (m.rows if isinstance(m, PipelineCost) else (m,)))

    def time(self, L, x):
        L, x = np.asarray(L, float), np.asarray(x, float)
        if self._coefs is None:
            return self.stage_times(L, x).max(axis=0)
        stages = self.charged
        if len(stages) <= 2 and all(isinstance(m, CostModel) for m in stages):
            out = stages[0].time(L, x)
            return out if len(stages) == 1 else np.maximum(out, stages[1].time(L, x))
        return _rows_at(self._pace, L, x).max(axis=0)

    def stage_times(self, L, x) -> np.ndarray:
        """Every stage's time, stacked on a leading axis (a nested stage at its own maximum)."""
        L, x = np.broadcast_arrays(np.asarray(L, float), np.asarray(x, float))
        if self._coefs is not None and len(self._coefs) == len(self.stages):  # flat: one matrix product
            return _rows_at(self._coefs, L, x)
        return np.stack([np.broadcast_to(np.asarray(m.time(L, x), float), L.shape) for m in self.charged])

    def max_chunk_for(self, L: float, T: float) -> float:
        return min(m.max_chunk_for(L, T) for m in self.charged)

    @property
    def meta(self) -> dict:
        return self.stages[0].meta

    def to_dict(self) -> dict:
        return {"stages": [m.to_dict() for m in self.stages],
                **({"chunk_overheads": [asdict(o) for o in self.overheads]} if self.overheads else {})}


def with_overheads(cost, overheads, pp_size: int):
    """`cost` carrying each stage's per-chunk overhead (ChunkOverhead, or ms per chunk; one value: every
    stage alike). The one builder of the carrier: the plugin's measurement, --chunk-overhead-ms and
    SGLANG_CPP_CHUNK_OVERHEAD_MS, a device preset's figure. A PipelineCost of `pp_size` stages carries one
    per stage; one model for every stage (a CostModel, a piecewise or a roofline model) carries the largest,
    as one stage the planner prices every stage by. A carrier already there is replaced."""
    over = [ChunkOverhead.of(o) for o in (overheads if isinstance(overheads, (list, tuple)) else [overheads])]
    if all(o == ChunkOverhead() for o in over):  # none: the model as it is, without a carrier
        if isinstance(cost, PipelineCost) and cost.overheads:
            return cost.stages[0] if len(cost.stages) == 1 else cost.kernel
        return cost
    if isinstance(cost, PipelineCost) and len(cost.stages) == pp_size:
        stages = cost.stages
    elif isinstance(cost, PipelineCost) and cost.overheads and len(cost.stages) == 1:
        stages = cost.stages
    else:  # one model for every stage; a carrier it had is replaced, not charged beneath the new one
        stages = (cost.kernel if isinstance(cost, PipelineCost) else cost,)
    if len(over) == 1:
        over = over * len(stages)
    elif len(over) != len(stages):
        over = [ChunkOverhead.largest(over)] * len(stages)
    return PipelineCost(tuple(stages), tuple(over))


def add_overhead(cost, ms: float, pp_size: int):
    """`cost` with `ms` more per chunk on every stage's overhead (--chunk-overhead-ms and
    SGLANG_CPP_CHUNK_OVERHEAD_MS: on top of what a profile or the probe measured); 0: `cost` as it is."""
    if not ms:
        return cost
    have = overheads_of(cost)
    if not have:
        return with_overheads(cost, ms, pp_size)
    return with_overheads(cost, [ChunkOverhead(o.ms + ms, o.per_token_ms, o.received_ms) for o in have], pp_size)


def per_stage(cost, pp_size: int) -> PipelineCost:
    """One model per stage: a PipelineCost of `pp_size` stages as it is; one model for every stage (a CostModel,
    or a lone stage carrying an overhead) repeated, each copy carrying that overhead (what a per-stage refit
    starts from: the same times the shared model gave)."""
    if isinstance(cost, PipelineCost) and len(cost.stages) == pp_size:
        return cost
    shared = isinstance(cost, PipelineCost) and len(cost.stages) == 1
    one, over = (cost.stages[0], cost.overheads) if shared else (cost, ())
    return PipelineCost((one,) * pp_size, tuple(over) * pp_size)


def split_uniform_overhead(cost) -> tuple:
    """(cost, o): a cost whose every stage carries the same fixed per-chunk overhead (no per-token part) as its
    forward models and that overhead in ms; any other cost as it is and 0. The equal-time search keeps its
    targets and thresholds in forward time and adds `o` per chunk (`_times`), as it always has."""
    over = overheads_of(cost)
    if not over or any(o != over[0] for o in over) or over[0].per_token_ms:
        return cost, 0.0
    return (cost.stages[0] if len(cost.stages) == 1 else cost.kernel), over[0].per_chunk_ms


def overheads_of(cost) -> tuple:
    """The per-chunk overhead each stage carries (empty: none)."""
    return cost.overheads if isinstance(cost, PipelineCost) else ()


def _overheads_from(raw, where: str) -> tuple:
    if raw is None:
        return ()
    try:
        return tuple(ChunkOverhead(**o) for o in raw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: chunk_overheads must be a list of {{ms, per_token_ms, received_ms}} per stage "
                         f"({exc})") from None


def model_from_dict(d: dict, where: str = "cost model"):
    """A CostModel ({'coeffs': ...}), a maximum of models ({'stages': [...]}, e.g. a roofline stage) or
    a model piecewise in L ({'bounds': [...], 'regimes': [...]}, core/regimes.py)."""
    if isinstance(d, dict) and "regimes" in d:
        return piecewise_from_dict(d, where, model_from_dict)
    if isinstance(d, dict) and "stages" in d and "coeffs" not in d:
        if not isinstance(d["stages"], list) or not d["stages"]:
            raise ValueError(f"{where}: 'stages' must be a non-empty list of cost models")
        over = _overheads_from(d.get("chunk_overheads"), where)
        if over and len(over) != len(d["stages"]):
            raise ValueError(f"{where}: {len(over)} chunk_overheads for {len(d['stages'])} stages; give one per stage")
        return PipelineCost(tuple(model_from_dict(s, f"{where} row {i}") for i, s in enumerate(d["stages"])), over)
    return CostModel.from_dict(d, where)


@dataclass(frozen=True)
class ChunkOverhead:
    """What a chunk costs a stage beyond its timed forward: `ms` per chunk plus `per_token_ms` per token of
    the chunk (the hidden states a stage receives grow with x: about 470 MB per hop for 16K tokens at hidden
    7168). Both >= 0 and finite."""

    ms: float = 0.0
    per_token_ms: float = 0.0
    received_ms: float = 0.0  # the hidden-state receive's part at x = 0 (a wait on a peer, apart from `ms`)

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"per-chunk overhead {f.name}={v!r} must be a finite number >= 0")

    @classmethod
    def largest(cls, overheads) -> "ChunkOverhead":
        """Field by field, the largest of several (a stage's TP ranks; one model charged for every stage)."""
        overheads = [cls.of(o) for o in overheads]
        return cls(*(max(getattr(o, f.name) for o in overheads) for f in fields(cls)))

    @classmethod
    def of(cls, v) -> "ChunkOverhead":
        """A ChunkOverhead as is; a number as that many ms per chunk."""
        return v if isinstance(v, cls) else cls(float(v))

    @property
    def per_chunk_ms(self) -> float:
        """Everything but the per-token part: the step's own cost and the receive's fixed part."""
        return self.ms + self.received_ms

    def at(self, x):
        """ms for a chunk of x tokens (numpy broadcasting)."""
        return self.per_chunk_ms + self.per_token_ms * np.asarray(x, float)


def add_constant(cost, ms):
    """The same model with a per-chunk overhead more (every row): `ms` ms per chunk, or a ChunkOverhead (its
    ms folded into c0, its per-token ms into b)."""
    ov = ChunkOverhead.of(ms)
    if isinstance(cost, PipelineCost):
        return PipelineCost(tuple(add_constant(m, ov) for m in cost.stages), cost.overheads)
    if isinstance(cost, PiecewiseCost):  # every regime
        return add_constant_piecewise(cost, ov, add_constant)
    return CostModel(**{**cost.coeffs, "c0": cost.c0 + ov.per_chunk_ms, "b": cost.b + ov.per_token_ms}, meta=cost.meta,
                     fit=cost.fit)


def _design(L: np.ndarray, x: np.ndarray, form: str, xi: np.ndarray | None = None, nx: int = 1) -> np.ndarray:
    """Monomials in kilo-tokens. With chunk-size regimes (`xi`, regime of each sample, `nx` of them) the
    L*x column splits into one per regime: the regimes share every other coefficient."""
    Ls, xs = L / _SCALE, x / _SCALE
    if form == "full":
        lx = [Ls * xs] if xi is None else [Ls * xs * (xi == j) for j in range(nx)]
        return np.column_stack([np.ones_like(Ls), Ls, xs, Ls * Ls, *lx, xs * xs])
    if form == "fa":
        return np.column_stack([np.ones_like(Ls), Ls, xs, xs * (2 * Ls + xs)])
    raise ValueError(f"unknown cost-model form {form!r}; use 'full' or 'fa'")


def _to_model(p: np.ndarray, form: str, bounds: tuple = (), **kw):
    """The fitted model; with chunk-size `bounds`, a PiecewiseCost in x whose regimes differ in e alone."""
    s = _SCALE
    p = [float(v) for v in p]
    if form == "full":
        c0, g, b, d, *es, f = p
        models = [CostModel(c0=c0, g=g / s, b=b / s, d=d / s**2, e=e / s**2, f=f / s**2, **kw) for e in es]
        return models[0] if not bounds else PiecewiseCost(bounds, tuple(models), meta=dict(kw.get("meta") or {}),
                                                          axis="x")
    c0, g, b, a = p
    return CostModel.fa(a=a / s**2, b=b / s, c0=c0, g=g / s, **kw)


def _occupied_bounds(bounds: tuple, L: np.ndarray, x: np.ndarray) -> tuple:
    """The chunk-size switches the samples can fit: the first switch of every regime holding a sample over a
    prefix (only those see the L*x term), after the first such regime. A regime nothing sampled is priced
    by the one below it (or above, for the lowest); the fit records which switches it kept."""
    occ = sorted(set(regime_index(bounds, x[L > 0]).tolist()))
    return tuple(int(bounds[j - 1]) for j in occ[1:])


def _check_separable(name: str, xb: tuple, L: np.ndarray, x: np.ndarray) -> None:
    """One chunk size per regime gives each regime's L slope g + e_j x_j and nothing more: the shared g and
    the e_j are then not separable, and a solver would pick any split. Refuse, naming the fix."""
    sizes = np.unique(x[L > 0])
    if len(sizes) < len(xb) + 2:
        raise ValueError(f"{name}: chunk-size switches {list(xb)} need at least {len(xb) + 2} distinct chunk sizes "
                         f"over a prefix to separate each regime's L*x term from the shared L term; the samples hold "
                         f"{len(sizes)} ({[int(v) for v in sizes]}). Sample two sizes in one regime "
                         "(the calibration grid does).")


def _solve(A: np.ndarray, y: np.ndarray, loss: str, free: np.ndarray, f_scale: float = 0.02) -> np.ndarray:
    from scipy.optimize import least_squares, nnls

    w = 1.0 / y  # relative residuals: times span orders of magnitude
    Aw = A[:, free] * w[:, None]
    p0, _ = nnls(Aw, np.ones_like(y))
    p0 = np.maximum(p0, 1e-12)
    res = least_squares(lambda p: Aw @ p - 1.0, p0, bounds=(0.0, np.inf), loss=loss, f_scale=f_scale,
                        method="trf", x_scale="jac")
    p = np.zeros(A.shape[1])
    p[free] = res.x
    return p


def _stats(model: CostModel, L, x, y) -> dict:
    pred = model.time(L, x)
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2)) or 1e-30
    rel = np.abs(pred - y) / y
    return {"r2": 1.0 - ss_res / ss_tot, "median_rel_err": float(np.median(rel)),
            "max_rel_err": float(np.max(rel))}


def fit_cost_model(L: Sequence[float], x: Sequence[float], ms: Sequence[float], *, form: str = "full",
                   loss: str = "soft_l1", holdout: float = 0.2, seed: int = 0,
                   meta: dict | None = None, name: str = "profile", x_bounds: Sequence[int] = ()):
    """Robust non-negative least squares fit; reports R^2, median and held-out relative error.

    Samples with L == 0 everywhere (upstream-style fresh prefills) cannot identify the prefix terms,
    so they are fitted in the FA form with g = 0, which is exactly upstream's assumption.

    `x_bounds`: chunk sizes where the attention kernel switches (core/regimes.py). The result is then a
    PiecewiseCost in x whose regimes have their own L*x coefficient (how often the kernel streams the
    prefix per query) and share the rest: one more coefficient per switch, not six.
    """
    L = np.asarray(L, dtype=float)
    x = np.asarray(x, dtype=float)
    y = np.asarray(ms, dtype=float)
    if not (L.shape == x.shape == y.shape) or L.ndim != 1:
        raise ValueError(f"{name}: L, x and ms must be 1-D arrays of one length")
    bad = ~(np.isfinite(L) & np.isfinite(x) & np.isfinite(y)) | (L < 0) | (x <= 0) | (y <= 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{name}: sample {i} (L={L[i]}, x={x[i]}, ms={y[i]}) is invalid: need L >= 0, "
                         "x > 0, ms > 0, all finite. Re-profile or drop the sample.")
    one_d = bool(np.all(L == 0))
    if one_d:
        form = "fa"
    xb = _occupied_bounds(tuple(int(b) for b in x_bounds), L, x) if form == "full" else ()
    if xb:
        _check_separable(name, xb, L, x)
    xi = regime_index(xb, x) if xb else None
    nparam = 4 if form == "fa" else 6 + len(xb)
    free = np.ones(nparam, dtype=bool)
    if one_d:
        free[1] = False  # g unidentifiable without prefixes
    need = int(free.sum()) + 2
    if len(y) < need or len(np.unique(x)) < 2 or (not one_d and len(np.unique(L)) < 3):
        raise ValueError(f"{name}: cannot fit a {form} cost model from {len(y)} samples with "
                         f"{len(np.unique(L))} distinct prefixes and {len(np.unique(x))} distinct chunk "
                         f"sizes; need >= {need} samples, >= 3 prefixes and >= 2 chunk sizes. Profile a wider grid.")
    A = _design(L, x, form, xi, len(xb) + 1)
    extra = {"meta": dict(meta or {})}
    fit = {"form": form, "loss": loss, "n": int(len(y)), "one_d": one_d,
           **({"chunk_switches": list(xb)} if x_bounds else {})}
    rng = np.random.default_rng(seed)
    n_hold = int(round(holdout * len(y))) if len(y) - int(round(holdout * len(y))) >= need else 0
    if n_hold:
        idx = rng.permutation(len(y))
        te, tr = idx[:n_hold], idx[n_hold:]
        m_tr = _to_model(_solve(A[tr], y[tr], loss, free), form, xb)
        fit["holdout"] = {"n": n_hold, **_stats(m_tr, L[te], x[te], y[te])}
    p = _solve(A, y, loss, free)
    model = _to_model(p, form, xb, **extra)
    fit.update(_stats(model, L, x, y))
    if xb:
        return model.with_models(CostModel(**m.coeffs, meta=m.meta, fit=fit) for m in model.models)
    return CostModel(**model.coeffs, meta=model.meta, fit=fit)


def fit_piecewise(L, x, ms, bounds=(), *, names=(), name: str = "profile", **kw):
    """One `fit_cost_model` per regime on the samples whose prefix lies in it (no bounds: one fit, a
    CostModel). A regime with no sample is an error that names it: a plan must never price a chunk in a
    regime nothing measured."""
    if not bounds:
        return fit_cost_model(L, x, ms, name=name, **kw)
    L, x, ms = (np.asarray(v, float) for v in (L, x, ms))
    bounds = tuple(int(b) for b in bounds)
    idx = regime_index(bounds, L)
    edges = (0,) + bounds + (math.inf,)
    models = []
    for i in range(len(bounds) + 1):
        sel = idx == i
        label = f"{name} regime {names[i] if names else i} (prefix in [{edges[i]}, {edges[i + 1]}))"
        if not sel.any():
            raise ValueError(f"{label}: no sample; calibrate both sides of every kernel switch "
                             f"(bounds {list(bounds)})")
        models.append(fit_cost_model(L[sel], x[sel], ms[sel], name=label, **kw))
    return PiecewiseCost(bounds, tuple(models), tuple(names), dict(kw.get("meta") or {}))


# -- profile JSON ------------------------------------------------------------------------
# the profile files (read, checked, fitted, written): core/profile_io.py


__all__ = ["CostModel", "ChunkOverhead", "PipelineCost", "PiecewiseCost", "fit_piecewise", "model_from_dict", "add_constant", "with_overheads", "add_overhead", "overheads_of", "split_uniform_overhead", "per_stage",
           "fit_cost_model", "COEFS", "META_KEYS", "asdict"]
