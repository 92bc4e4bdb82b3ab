"""Planner basics shared by every planner: the settings (`PlanConfig`), the objective
TTFT = sum(t_k) + (P-1) * max(t_k), and fixed chunks.

Under chunked pipeline parallelism with equal stages, P stages run K chunks as a proportionate flow
shop, whose makespan is exactly sum + (P-1)*max.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .plan import ChunkPlan, makespan_equal

METHODS = ("equal-time", "dp")


@dataclass(frozen=True)
class PlanConfig:
    """Planner knobs; each field is one kebab-case CLI flag (--pp-size, --align, ...)."""

    pp_size: int = 2
    align: int = 64
    min_chunk: int = 0  # 0: one alignment unit
    max_chunk: int = 16384
    context_len: int | None = None
    method: str = "equal-time"

    def __post_init__(self):
        for name in ("pp_size", "align", "max_chunk"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"--{name.replace('_', '-')}={v!r} must be an integer >= 1")
        if self.min_chunk < 0 or self.min_chunk > self.max_chunk:
            raise ValueError(f"--min-chunk={self.min_chunk} must be in [0, --max-chunk={self.max_chunk}]")
        if self.max_chunk < self.align:
            raise ValueError(f"--max-chunk={self.max_chunk} is smaller than --align={self.align}")
        if self.method not in METHODS:
            raise ValueError(f"--method={self.method!r}: choose one of {METHODS}")
        if self.lo > self.hi:
            raise ValueError(f"--min-chunk={self.min_chunk} rounds up to {self.lo} (--align {self.align}), above "
                             f"--max-chunk={self.max_chunk} rounded down to {self.hi}; widen the range")

    @classmethod
    def from_server(cls, *, pp_size: int, chunk_size: int, max_prefill_tokens: int, page_size: int = 1,
                    context_len: int | None = None, min_chunk: int = 0, max_chunk: int = 0,
                    method: str = "equal-time", align: int = 64,
                    buffer_tokens: int = 0) -> "PlanConfig":
        """The planner settings an SGLang server with these arguments uses: the one mapping that the plugin,
        `plan`, `simulate`, `bench` and `tune` all call, so a simulated plan is the served plan. Chunks are
        aligned to SGLang's grid and bounded only by memory: at most the prefill-buffer ceiling
        (`buffer_tokens` as the server reports it, else `prefill_buffer_tokens`), at least one alignment
        unit. C enters only through that ceiling: it is a memory cap, not a hint, and no floor derives
        from it (SGLANG_CPP_MIN_CHUNK / SGLANG_CPP_MAX_CHUNK stay explicit overrides)."""
        ceiling = buffer_tokens or prefill_buffer_tokens(chunk_size, max_prefill_tokens, pp_size)
        cap = min(max_chunk or ceiling, ceiling)
        align = math.lcm(max(1, align), max(1, page_size), 64)
        return cls(pp_size=pp_size, align=align, min_chunk=min(min_chunk, cap), max_chunk=max(cap, align),
                   context_len=context_len, method=method)

    @property
    def lo(self) -> int:
        """Smallest non-final chunk: min_chunk rounded up to the alignment."""
        return max(self.align, -(-self.min_chunk // self.align) * self.align)

    @property
    def hi(self) -> int:
        """Largest chunk: max_chunk rounded down to the alignment."""
        return self.max_chunk // self.align * self.align


def prefill_buffer_tokens(chunk_size: int | None, max_prefill_tokens: int, pp_size: int,
                          dynamic: bool = True) -> int:
    """The most tokens one prefill forward may hold: SGLang 0.5.23's prefill-buffer ceiling
    (`srt/arg_groups/overrides.py: max_prefill_buffer_tokens`, read by `runtime_context` and every
    workspace sized for a prefill: MoE dispatch, FlashInfer autotune, the PD staging buffers). With dynamic
    chunking on PP it is max(C, --max-prefill-tokens, ceil(1.25 C)); otherwise C (or
    --max-prefill-tokens without chunked prefill). A mirror for the tools that run no server; the plugin
    passes SGLang's own value, and tests/inproc/test_mapping.py checks that the two agree."""
    C = chunk_size if chunk_size and chunk_size > 0 else 0
    if dynamic and pp_size > 1 and C:
        return max(C, max_prefill_tokens or 0, math.ceil(1.25 * C))
    return C or max_prefill_tokens


def _check(prompt_len: int, prefix_len: int, cfg: PlanConfig) -> int:
    if prompt_len < 1 or prefix_len < 0:
        raise ValueError(f"prompt_len={prompt_len} must be >= 1 and prefix_len={prefix_len} >= 0")
    if prefix_len >= prompt_len:
        raise ValueError(f"prefix_len={prefix_len} must be < prompt_len={prompt_len}: "
                         "at least one token has to be computed")
    if cfg.context_len is not None and prompt_len > cfg.context_len:
        raise ValueError(f"prompt_len={prompt_len} exceeds the context length {cfg.context_len}; "
                         "raise --context-length or shorten the prompt")
    return prompt_len - prefix_len


def _times(cost, L, x, o: float = 0.0) -> np.ndarray:
    """Chunk times, each stage's per-chunk overhead included (the cost carries it: PipelineCost.overheads),
    plus `o`: the equal-time search's uniform overhead, split off the cost (costmodel.split_uniform_overhead)."""
    return np.asarray(cost.time(np.asarray(L, float), np.asarray(x, float)), float) + o


def make_plan(chunks, prompt_len: int, prefix_len: int, cost, cfg: PlanConfig, policy: str) -> ChunkPlan:
    chunks = [int(c) for c in chunks]
    starts = prefix_len + np.concatenate([[0], np.cumsum(chunks)[:-1]])
    pred = _times(cost, starts, chunks)
    return ChunkPlan(prompt_len=prompt_len, prefix_len=prefix_len, chunks=tuple(chunks),
                     pred_ms=tuple(float(t) for t in pred), pp_size=cfg.pp_size, policy=policy)


def ttft(chunks, prefix_len: int, cost, pp_size: int) -> float:
    """Predicted TTFT of a chunk list on equal stages: `makespan_equal` of its chunk times."""
    return _ttft(chunks, prefix_len, cost, pp_size)


def _ttft(chunks, prefix_len: int, cost, pp_size: int, o: float = 0.0) -> float:
    """`ttft` on a cost whose uniform per-chunk overhead `o` the search split off (split_uniform_overhead)."""
    starts = prefix_len + np.concatenate([[0], np.cumsum(chunks)[:-1]])
    t = _times(cost, starts, chunks, o)
    return makespan_equal(t.tolist(), pp_size)


def chunk_rows(lists: list, starts) -> tuple:
    """Many chunk lists as one flat job list: (lengths, chunks, row, column, prefix of each chunk), every list
    after its own start (`starts`: one per list, or one for all). Integers throughout, so exact: the one home of
    this indexing for everything that prices many lists in one cost call."""
    lens = np.array([len(ch) for ch in lists], np.int64)
    flat = np.concatenate([np.asarray(ch, np.int64) for ch in lists])
    row = np.repeat(np.arange(len(lists)), lens)
    first = np.concatenate([[0], np.cumsum(lens)[:-1]])
    col = np.arange(len(flat)) - np.repeat(first, lens)
    before = np.cumsum(flat) - flat  # tokens before each chunk over the concatenation, less its list's start
    L = np.broadcast_to(np.asarray(starts, np.int64), (len(lists),))[row] + before - np.repeat(before[first], lens)
    return lens, flat, row, col, L


def _ttfts(lists: list, prefix_len: int, cost, pp_size: int, o: float = 0.0) -> list[float]:
    """`_ttft` of many chunk lists, every chunk priced in one cost call (the same element-wise values, so the
    same floats as one call per list): the threshold walks and the fixed grid score dozens of lists a plan."""
    if not lists:
        return []
    lens, flat, _, _, starts = chunk_rows(lists, prefix_len)
    t = _times(cost, starts, flat, o).tolist()
    out, k = [], 0
    for n in lens.tolist():
        out.append(makespan_equal(t[k:k + n], pp_size))
        k += n
    return out


def flow_shop(t, start=None) -> np.ndarray:
    """Completion times on the last stage of jobs run in order through P stages: the permutation flow shop
    C[k, s] = max(C[k-1, s], C[k, s-1]) + t[s, k], for `t` shaped (..., P, K) (leading axes: independent
    sequences, e.g. candidate plans), each stage free from `start[..., s]` (default 0). With equal stages
    from an empty pipe, job j completes at sum_{i<=j} t_i + (P-1) max_{i<=j} t_i. A zero-time job is
    transparent (it completes with the job before it), so sequences of different lengths can be padded."""
    return _scan(t, start)[-1]


def advance(t, start=None) -> np.ndarray:
    """When each stage is free again after jobs `t` (..., P, K), from free times `start` (..., P): the
    flow-shop state a sequence leaves behind, shaped (..., P). The map is max-plus linear in `start`:
    from a state F the stages end at max_s' (F[s'] + D[s', s]), D the ends from a start 0 at stage s' only."""
    return np.stack([C[..., -1] for C in _scan(t, start)], axis=-1)


def _scan(t, start) -> list[np.ndarray]:
    """Per stage, the completion of every job: a max-plus scan per stage, C_s = S + max(F_s, cummax(C_{s-1}
    - S + t_s)) with S the running sum of t_s: P numpy passes, not K * P Python steps."""
    t = np.asarray(t, float)
    P = t.shape[-2]
    F = np.zeros(P) if start is None else np.asarray(start, float)
    lead = np.broadcast_shapes(t.shape[:-2], F.shape[:-1])
    t, F = np.broadcast_to(t, lead + t.shape[-2:]), np.broadcast_to(F, lead + (P,))
    out, C = [], None
    with np.errstate(invalid="ignore"):
        for s in range(P):
            ts = t[..., s, :]
            S = np.cumsum(ts, axis=-1)
            best = F[..., s, None] if C is None else np.maximum(F[..., s, None], np.maximum.accumulate(C - S + ts, axis=-1))
            C = S + best
            out.append(C)
    return out


def stage_times(cost, L, x, pp_size: int) -> np.ndarray:
    """Every stage's time of chunks (L, x), shaped (P,) + L's shape: a per-stage model (`cost.stages`, one
    per stage) prices each stage apart, one shared model prices every stage alike."""
    stages = getattr(cost, "stages", None)
    L, x = np.broadcast_arrays(np.asarray(L, float), np.asarray(x, float))
    if stages and len(stages) == pp_size and hasattr(cost, "stage_times"):
        return np.asarray(cost.stage_times(L, x), float)
    return np.broadcast_to(np.asarray(cost.time(L, x), float), (pp_size,) + L.shape)


def makespan(chunks, prefix_len: int, cost, pp_size: int) -> float:
    """Exact TTFT of a chunk list on P stages that may differ: the flow-shop recurrence (`flow_shop`, the
    simulator's with free P2P). For equal stages it is sum + (P-1) * max (`ttft`); stages that differ (the
    embedding on the first, the LM head on the last, uneven layer counts) make that formula an upper
    bound that can rank plans wrongly."""
    stages = getattr(cost, "charged", None)  # each stage with its own per-chunk overhead
    if not stages or len(stages) != pp_size or all(m == stages[0] for m in stages[1:]):
        return ttft(chunks, prefix_len, cost, pp_size)
    x = np.asarray(chunks, float)
    L = prefix_len + np.concatenate([[0.0], np.cumsum(x)[:-1]])
    return float(flow_shop(stage_times(cost, L, x, pp_size))[-1])


def fixed_candidates(cfg: PlanConfig, n_tokens: int = 0) -> list[int]:
    """Fixed chunk sizes the search weighs beside its equal-time plans: the largest chunk and the
    alignment times the powers of two below it, from the smallest chunk up. The grid comes from the bounds alone, never from
    --chunked-prefill-size, so the plan does not lean on the chunk the user picked. With `n_tokens`, sizes
    that would cut more than MAX_FIXED_CHUNKS chunks are left out (bounded planning time)."""
    out, c = {cfg.hi}, cfg.align
    while c < cfg.hi:  # align * 2^k: the same grid under every ceiling
        if c >= cfg.lo:
            out.add(c)
        c *= 2
    if n_tokens:
        out = {c for c in out if -(-n_tokens // c) <= MAX_FIXED_CHUNKS} or {cfg.hi}
    return sorted(out)


MAX_FIXED_CHUNKS = 4096


def fixed_split(n: int, chunk: int) -> list[int]:
    """n tokens in chunks of `chunk`, the remainder last (SGLang without dynamic chunking)."""
    if chunk < 1:
        raise ValueError(f"fixed chunk size {chunk} must be >= 1")
    return [chunk] * (n // chunk) + ([n % chunk] if n % chunk else [])


def plan_fixed(prompt_len: int, cost, cfg: PlanConfig, chunk: int, prefix_len: int = 0) -> ChunkPlan:
    """Fixed chunks of `chunk` tokens (SGLang without dynamic chunking)."""
    R = _check(prompt_len, prefix_len, cfg)
    return make_plan(fixed_split(R, chunk), prompt_len, prefix_len, cost, cfg, "fixed")


__all__ = ["PlanConfig", "METHODS", "prefill_buffer_tokens", "make_plan", "ttft", "makespan", "flow_shop", "advance", "stage_times", "fixed_split", "fixed_candidates", "plan_fixed"]
