"""Planner basics shared by every planner: the settings (`PlanConfig`), the objective
TTFT = sum(t_k) + (P-1) * max(t_k), and fixed chunks.

Under chunked pipeline parallelism with equal stages, P stages run K chunks as a proportionate flow
shop, whose makespan is exactly sum + (P-1)*max.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .plan import ChunkPlan

METHODS = ("equal-time", "dp")


@dataclass(frozen=True)
class PlanConfig:
    """Planner knobs; each field is one kebab-case CLI flag (--pp-size, --align, ...)."""

    pp_size: int = 2
    align: int = 64
    min_chunk: int = 0  # 0: one alignment unit
    max_chunk: int = 16384
    context_len: int | None = None
    overhead_ms: float = 0.0
    chunk_size: int | None = None  # the server's --chunked-prefill-size, a candidate we never lose to
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
        if self.overhead_ms < 0 or not math.isfinite(self.overhead_ms):
            raise ValueError(f"--overhead-ms={self.overhead_ms} must be a finite number >= 0")
        if self.method not in METHODS:
            raise ValueError(f"--method={self.method!r}: choose one of {METHODS}")
        if self.lo > self.hi:
            raise ValueError(f"--min-chunk={self.min_chunk} rounds up to {self.lo} (--align {self.align}), above "
                             f"--max-chunk={self.max_chunk} rounded down to {self.hi}; widen the range")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError(f"--chunked-prefill-size={self.chunk_size} must be >= 1")

    @classmethod
    def from_server(cls, *, pp_size: int, chunk_size: int, max_prefill_tokens: int, page_size: int = 1,
                    context_len: int | None = None, min_chunk: int = 0, max_chunk: int = 0,
                    overhead_ms: float = 0.0, method: str = "equal-time", align: int = 64) -> "PlanConfig":
        """The planner settings an SGLang server with these arguments uses (the plugin and every what-if
        tool call this, so a simulated plan is the served plan): chunks aligned to SGLang's grid, at most
        --max-prefill-tokens, at least upstream's C/4 floor unless SGLANG_CPP_MIN_CHUNK says otherwise."""
        cap = min(max_chunk or max_prefill_tokens, max_prefill_tokens)
        align = math.lcm(max(1, align), max(1, page_size), 64)
        floor = min_chunk or chunk_size // 4
        return cls(pp_size=pp_size, align=align, min_chunk=min(floor, cap), max_chunk=max(cap, align),
                   context_len=context_len, overhead_ms=overhead_ms, chunk_size=chunk_size, method=method)

    @property
    def lo(self) -> int:
        """Smallest non-final chunk: min_chunk rounded up to the alignment."""
        return max(self.align, -(-self.min_chunk // self.align) * self.align)

    @property
    def hi(self) -> int:
        """Largest chunk: max_chunk rounded down to the alignment."""
        return self.max_chunk // self.align * self.align


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


def _times(cost, L, x, o: float) -> np.ndarray:
    return np.asarray(cost.time(np.asarray(L, float), np.asarray(x, float)), float) + o


def make_plan(chunks, prompt_len: int, prefix_len: int, cost, cfg: PlanConfig, policy: str) -> ChunkPlan:
    chunks = [int(c) for c in chunks]
    starts = prefix_len + np.concatenate([[0], np.cumsum(chunks)[:-1]])
    pred = _times(cost, starts, chunks, 0.0)
    return ChunkPlan(prompt_len=prompt_len, prefix_len=prefix_len, chunks=tuple(chunks),
                     pred_ms=tuple(float(t) for t in pred), pp_size=cfg.pp_size, policy=policy,
                     overhead_ms=cfg.overhead_ms)


def ttft(chunks, prefix_len: int, cost, pp_size: int, overhead_ms: float = 0.0) -> float:
    """Predicted TTFT of a chunk list: sum(t + o) + (P-1) * max(t + o)."""
    starts = prefix_len + np.concatenate([[0], np.cumsum(chunks)[:-1]])
    t = _times(cost, starts, chunks, overhead_ms)
    return float(t.sum() + (pp_size - 1) * t.max())


def makespan(chunks, prefix_len: int, cost, pp_size: int, overhead_ms: float = 0.0) -> float:
    """Exact TTFT of a chunk list on P stages that may differ: the flow-shop recurrence
    C[k, s] = max(C[k-1, s], C[k, s-1]) + t_s(k) (the simulator's, with free P2P). For equal stages it
    is sum + (P-1) * max (`ttft`); stages that differ (the embedding on the first, the LM head on the
    last, uneven layer counts) make that formula an upper bound that can rank plans wrongly.

    Per stage the recurrence is a max-plus scan, C_s = S + cummax(C_{s-1} - S + t_s) with S the running
    sum of t_s, so it costs P numpy passes, not K * P Python steps."""
    stages = getattr(cost, "stages", None)
    if not stages or len(stages) != pp_size or all(m == stages[0] for m in stages[1:]):
        return ttft(chunks, prefix_len, cost, pp_size, overhead_ms)
    x = np.asarray(chunks, float)
    L = prefix_len + np.concatenate([[0.0], np.cumsum(x)[:-1]])
    C = np.zeros(len(x))
    for t in cost.stage_times(L, x) + overhead_ms:
        S = np.cumsum(t)
        C = S + np.maximum.accumulate(C - S + t)
    return float(C[-1])


def fixed_candidates(cfg: PlanConfig) -> set[int]:
    """Fixed chunk sizes inside the plan space: the largest chunk, and --chunk-size aligned down."""
    out = {cfg.hi}
    if cfg.chunk_size:
        c = cfg.chunk_size // cfg.align * cfg.align
        if cfg.lo <= c <= cfg.hi:
            out.add(c)
    return out


def fixed_split(n: int, chunk: int) -> list[int]:
    """n tokens in chunks of `chunk`, the remainder last (SGLang without dynamic chunking)."""
    if chunk < 1:
        raise ValueError(f"fixed chunk size {chunk} must be >= 1")
    return [chunk] * (n // chunk) + ([n % chunk] if n % chunk else [])


def plan_fixed(prompt_len: int, cost, cfg: PlanConfig, chunk: int, prefix_len: int = 0) -> ChunkPlan:
    """Fixed chunks of `chunk` tokens (SGLang without dynamic chunking)."""
    R = _check(prompt_len, prefix_len, cfg)
    return make_plan(fixed_split(R, chunk), prompt_len, prefix_len, cost, cfg, "fixed")


__all__ = ["PlanConfig", "METHODS", "make_plan", "ttft", "makespan", "fixed_split", "fixed_candidates", "plan_fixed"]
