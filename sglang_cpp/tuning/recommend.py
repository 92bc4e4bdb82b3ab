"""The chunking settings a profile predicts to be fastest (`sglang-cpp tune chunk`; its outputs and
flags are chunk_cmd.py).

Why: upstream's knobs (--chunked-prefill-size C, SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR sigma) are tuned by
hand today, one server launch per guess. Given a fitted cost model, the simulator ranks every option in
milliseconds: (a) the sglang-cpp `plan` policy and its bounds, (b) upstream's dynamic chunking over a
(C, sigma) grid, with upstream's own fit emulated (stage-0 fresh prefills of 1.25*C .. 1.25*C/128 tokens,
first sample dropped, OLS), (c) fixed chunks. Options are ranked by the mean over --input-len of
predicted TTFT / best fixed TTFT at that length, so every length weighs the same.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..core.planner import fixed_split
from .fit import FORMS, as_cost, fit_stages, read_profile

DEFAULT_SIZES = (1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768)
SIGMAS = tuple(round(0.05 * i, 2) for i in range(21))
UPSTREAM_SIGMA = 0.75
SGLANG_MAX_PREFILL = 16384  # SGLang's default --max-prefill-tokens


@dataclass(frozen=True)
class ChunkTuneConfig:
    """Every field is a flag of `sglang-cpp tune chunk` (profile is the positional)."""

    profile: str
    pp_size: int
    input_lens: tuple
    page_size: int = 1
    max_prefill_tokens: int = SGLANG_MAX_PREFILL
    model_name: str | None = None
    out_dir: str = ""  # "": SGLANG_CPP_CACHE_DIR/tuned (files.tuned_path), where the plugin looks at startup
    device_name: str | None = None  # the file name's device (default: the profile's meta)
    dtype: str | None = None  # ... and dtype
    context_length: int | None = None
    chunk_overhead_ms: float = 0.0
    chunk_sizes: tuple = DEFAULT_SIZES
    form: str = "full"
    json: str | None = None  # also write the recommendations (and the tuned file's path) here

    def __post_init__(self):
        for name in ("pp_size", "page_size", "max_prefill_tokens"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"--{name.replace('_', '-')}={v!r} must be an integer >= 1")
        if not self.input_lens or min(self.input_lens) < 1:
            raise ValueError(f"--input-len {self.input_lens!r}: give prompt lengths >= 1, e.g. 32k,128k")
        if not self.chunk_sizes or min(self.chunk_sizes) < 1:
            raise ValueError(f"--fixed-chunks {self.chunk_sizes!r}: give chunk sizes >= 1, e.g. 1k,2k,4k")
        if not (math.isfinite(self.chunk_overhead_ms) and self.chunk_overhead_ms >= 0):
            raise ValueError(f"--chunk-overhead-ms={self.chunk_overhead_ms!r} must be a finite number >= 0")
        if self.max_prefill_tokens < self.align:
            raise ValueError(f"--max-prefill-tokens={self.max_prefill_tokens} is below the chunk alignment "
                             f"{self.align} (max(--page-size, 64))")
        if self.context_length is not None and self.context_length <= max(self.input_lens):
            raise ValueError(f"--context-length {self.context_length} must exceed the longest --input-len "
                             f"{max(self.input_lens)} (SGLang needs room for the output token)")
        if self.form not in FORMS:
            raise ValueError(f"--form {self.form!r}: choose one of {', '.join(FORMS)}")

    @property
    def align(self) -> int:
        return max(self.page_size, 64)  # the plugin's and upstream's chunk alignment

    @property
    def sizes(self) -> tuple:
        """Chunk-size grid aligned down to the alignment, deduplicated."""
        return tuple(sorted({max(self.align, c // self.align * self.align) for c in self.chunk_sizes}))

    @property
    def ctx(self) -> int:
        return self.context_length or 1 << 40


@dataclass
class Option:
    family: str  # plan | upstream | fixed
    label: str
    settings: dict
    ttft: dict = field(default_factory=dict)  # input length -> predicted ms
    chunks: dict = field(default_factory=dict)
    score: float = math.nan  # mean over lengths of ttft / best fixed ttft

    def to_dict(self) -> dict:
        return {"family": self.family, "label": self.label, "settings": self.settings, "score": self.score,
                "ttft_ms": {str(k): round(v, 3) for k, v in self.ttft.items()},
                "chunks": {str(k): list(v) for k, v in self.chunks.items()}}


# -- building blocks -------------------------------------------------------------------------------
def load_stages(cfg: ChunkTuneConfig) -> tuple[dict, list, list, list, tuple]:
    """(profile doc, samples, fitted forward models, one per PP stage, the per-chunk overhead each stage carries
    in a served profile: its `chunk_overheads`, else none). Refits when samples exist."""
    from ..core.costmodel import overheads_of
    from ..core.profile_io import cost_from_profile

    where = f"profile {cfg.profile}"
    doc, samples = read_profile(cfg.profile)
    meta = dict(doc.get("meta", {}))
    over: tuple = ()
    if samples:
        models = fit_stages(samples, cfg.form, meta, where)
    else:
        c = cost_from_profile(doc, where)
        models, over = list(getattr(c, "stages", None) or (c,)), overheads_of(c)  # the carrier stays apart
    P = cfg.pp_size
    if len(models) > 1 and len(models) != P:
        raise ValueError(f"{where} has {len(models)} per-stage models but --pp-size is {P}; "
                         f"pass --pp-size {len(models)} or re-profile with PP={P}")
    if over and len(over) != P:
        over = over * P if len(over) == 1 else ()
    return doc, samples, models, models if len(models) == P else models * P, tuple(over)


def priced(models: list, overheads: tuple, chunk_overhead_ms: float, pp_size: int):
    """The cost the recommendations run on: the models, each stage's carried overhead, --chunk-overhead-ms more."""
    from ..core.costmodel import add_overhead, with_overheads

    cost = as_cost(models)
    if overheads:
        cost = with_overheads(cost, list(overheads), pp_size)
    return add_overhead(cost, chunk_overhead_ms, pp_size)


class Sim:
    """Memoised simulated TTFT of a chunk sequence (many (C, sigma) pairs give the same chunks)."""

    def __init__(self, stages: list, chunk_overhead_ms: float, overheads: tuple = ()):
        self.cost = priced(stages, overheads, chunk_overhead_ms, len(stages))  # every stage, its overhead
        self.stages, self.cache = stages, {}

    def __call__(self, chunks) -> float:
        key = tuple(int(c) for c in chunks)
        if key not in self.cache:
            from ..whatif.simulator import simulate

            self.cache[key] = simulate(list(key), self.cost, len(self.stages)).ttft_ms
        return self.cache[key]


def _score(opts: list[Option], ref: dict) -> None:
    for o in opts:
        o.score = float(np.mean([o.ttft[L] / ref[L] for L in ref]))


def fixed_options(cfg, sim) -> list[Option]:
    out = []
    for C in cfg.sizes:
        o = Option("fixed", f"fixed C={C}", {"chunked_prefill_size": C})
        for L in cfg.input_lens:
            o.chunks[L] = fixed_split(L, C)
            o.ttft[L] = sim(o.chunks[L])
        out.append(o)
    return out


def upstream_options(cfg, stages, sim) -> tuple[list[Option], dict]:
    from ..core.upstream import UpstreamPredictor, emulated_fit

    out, failed = [], {}
    for C in cfg.sizes:
        try:
            a, b, c = emulated_fit(stages[0], C, cfg.ctx)  # upstream's startup fit, on stage 0
        except ValueError as exc:
            failed[C] = str(exc)  # upstream would disable dynamic chunking at this C
            continue
        mpt = max(cfg.max_prefill_tokens, C)
        for s in SIGMAS:
            pred = UpstreamPredictor(a=a, b=b, c=c, chunk_size=C, context_len=cfg.ctx, sigma=s,
                                     page_size=cfg.page_size, max_prefill_tokens=mpt)
            o = Option("upstream", f"upstream dynamic C={C} sigma={s:g}",
                       {"chunked_prefill_size": C, "sigma": s, "max_prefill_tokens": mpt,
                        "coeffs": {"a": a, "b": b, "c": c}})
            for L in cfg.input_lens:
                o.chunks[L] = pred.chunk_sequence(L)
                o.ttft[L] = sim(o.chunks[L])
            out.append(o)
    return out, failed


def plan_options(cfg, models, stages, sim, C: int, x_range: tuple, overheads: tuple = ()) -> list[Option]:
    """The plan policy at base chunk C, over the plugin's bound knobs (its planner settings exactly)."""
    from ..core.planner import plan_equal_time
    from ..core.objective import PlanConfig

    al = cfg.align
    mpt = max(cfg.max_prefill_tokens, C)
    mins = {al}  # the plugin's default: no floor beyond one alignment unit
    maxs = {mpt}
    if x_range:  # bounds that keep the planner inside the profiled chunk sizes
        mins.add(min(mpt, -(-int(x_range[0]) // al) * al))
        if al <= int(x_range[1]) // al * al < mpt:
            maxs.add(int(x_range[1]) // al * al)
    cost = priced(models if len(models) == len(stages) else stages, overheads, cfg.chunk_overhead_ms, len(stages))
    out = []
    for mn in sorted(mins):
        for mx in sorted(maxs):
            if mn > mx:
                continue
            pcfg = PlanConfig.from_server(pp_size=cfg.pp_size, chunk_size=C, max_prefill_tokens=mpt,  # as the plugin
                                          page_size=cfg.page_size, context_len=cfg.ctx, min_chunk=mn, max_chunk=mx)
            o = Option("plan", f"sglang-cpp plan C={C} min={mn} max={mx}",
                       {"chunked_prefill_size": C, "max_prefill_tokens": mpt, "min_chunk": mn, "max_chunk": mx,
                        "chunk_overhead_ms": cfg.chunk_overhead_ms})
            for L in cfg.input_lens:
                o.chunks[L] = list(plan_equal_time(L, cost, pcfg).chunks)
                o.ttft[L] = sim(o.chunks[L])
            out.append(o)
    return out


def recommend(cfg: ChunkTuneConfig, models: list, stages: list, x_range: tuple = (), overheads: tuple = ()) -> dict:
    """{'fixed', 'upstream', 'upstream_default_sigma', 'plan', 'all', 'upstream_failed'} Options."""
    sim = Sim(stages, cfg.chunk_overhead_ms, overheads)
    fixed = fixed_options(cfg, sim)
    ref = {L: min(o.ttft[L] for o in fixed) for L in cfg.input_lens}
    ups, failed = upstream_options(cfg, stages, sim)
    _score(fixed + ups, ref)
    best_fixed = min(fixed, key=lambda o: (round(o.score, 9), o.settings["chunked_prefill_size"]))
    C = best_fixed.settings["chunked_prefill_size"]
    plans = plan_options(cfg, models, stages, sim, C, x_range, overheads)
    _score(plans, ref)
    best_plan = min(plans, key=lambda o: (round(o.score, 9), -o.settings["min_chunk"], o.settings["max_chunk"]))
    best_up = min(ups, key=lambda o: (round(o.score, 9), abs(o.settings["sigma"] - UPSTREAM_SIGMA),
                                      o.settings["chunked_prefill_size"])) if ups else None
    default_up = next((o for o in ups if best_up and o.settings["sigma"] == UPSTREAM_SIGMA and
                       o.settings["chunked_prefill_size"] == best_up.settings["chunked_prefill_size"]), None)
    return {"plan": best_plan, "upstream": best_up, "upstream_default_sigma": default_up, "fixed": best_fixed,
            "all": fixed + ups + plans, "upstream_failed": failed}


__all__ = ["ChunkTuneConfig", "Option", "recommend", "load_stages", "DEFAULT_SIZES", "SIGMAS"]
