"""SGLang 0.5.23's dynamic chunking, reproduced to the token (`--policy quadratic`).

Source: sglang/srt/managers/scheduler_components/dynamic_chunk_sizer.py (ChunkSizePredictor,
DynamicChunkSizer.predict) and the call site in Scheduler._get_new_batch_prefill_raw. This is the
baseline of every comparison we publish, so the arithmetic follows upstream's operation order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np


def check_sigma(sigma: float, name: str = "SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR") -> float:
    """Upstream accepts any float; outside [0, 1] it grows chunks (<0) or over-shrinks them (>1)."""
    try:
        s = float(sigma)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={sigma!r} is not a number; use a value in [0, 1] (default 0.75)") from None
    if not (0.0 <= s <= 1.0) or math.isnan(s):
        raise ValueError(f"{name}={sigma!r} is outside [0, 1]: sigma<0 grows chunks past the base size and "
                         "sigma>1 over-shrinks them. Use a value in [0, 1] (upstream default 0.75).")
    return s


@dataclass(frozen=True)
class UpstreamPredictor:
    """f(l) = a l^2 + b l + c, target T = f(C) - f(0), next chunk solves f(L+x) - f(L) = T."""

    a: float
    b: float
    c: float
    chunk_size: int
    context_len: int
    sigma: float = 0.75
    page_size: int = 1
    max_prefill_tokens: Optional[int] = 16384

    def __post_init__(self):
        check_sigma(self.sigma)
        if not self.a > 0:
            raise ValueError(f"upstream quadratic coefficient a={self.a!r} must be > 0 "
                             "(attention is O(n^2)); re-profile or pass positive --coeffs")
        if self.b < 0:
            object.__setattr__(self, "b", 0.0)  # upstream clamps b to 0
        for name in ("chunk_size", "context_len", "page_size"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be a positive integer")
        if self.target_latency <= 0:
            raise ValueError(f"target latency f(C)-f(0)={self.target_latency:.3g} ms is not positive")

    @property
    def target_latency(self) -> float:
        f = lambda n: self.a * n * n + self.b * n + self.c  # noqa: E731  (upstream's f)
        return f(float(self.chunk_size)) - f(0.0)

    @property
    def align(self) -> int:
        return max(self.page_size, 64)

    def predict(self, history_len: int) -> Optional[int]:
        """Upstream's predict_next_chunk_size; None means 'keep the static chunk size C'."""
        A, T, C = self.a, self.target_latency, self.chunk_size
        B = 2 * self.a * history_len + self.b
        disc = B * B - 4 * A * (-T)
        if disc < 0:
            return None
        x_star = (-B + math.sqrt(disc)) / (2 * A)
        if x_star <= 0:
            return None
        smoothed = C + self.sigma * (x_star - C)
        x = max(int(smoothed), C // 4)
        al = self.align
        x = (x // al) * al
        if x < al:
            x = al
        cap = self.context_len - history_len - 100
        if self.max_prefill_tokens is not None:
            cap = min(cap, self.max_prefill_tokens)
        x = (min(x, cap) // al) * al
        return None if x < al else x

    def chunk_sequence(self, prompt_len: int, prefix_len: int = 0) -> list[int]:
        """Chunks upstream runs for one request: first chunk C, then predictions, min with remaining."""
        if prompt_len <= 0 or prefix_len < 0 or prefix_len >= prompt_len:
            raise ValueError(f"need 0 <= prefix_len ({prefix_len}) < prompt_len ({prompt_len})")
        chunks, L = [], prefix_len
        while L < prompt_len:
            size = self.chunk_size if not chunks else (self.predict(L) or self.chunk_size)
            x = min(size, prompt_len - L)
            chunks.append(x)
            L += x
        return chunks

    @classmethod
    def fit(cls, seq_lens: Sequence[float], latencies_ms: Sequence[float], **kw) -> "UpstreamPredictor":
        """Upstream's ChunkSizePredictor.fit: drop sample 0, OLS on [l^2, l, 1], a <= 0 is an error."""
        L = np.array(seq_lens[1:], dtype=np.float64)
        T = np.array(latencies_ms[1:], dtype=np.float64)
        if len(L) < 8:
            raise ValueError(f"upstream fit needs >= 8 samples after dropping the first, got {len(L)}")
        X = np.column_stack([L * L, L, np.ones_like(L)])
        coeffs = np.linalg.lstsq(X, T, rcond=None)[0]
        a, b, c = (float(v) for v in coeffs)
        if a <= 0:
            raise ValueError(f"upstream fit: quadratic coefficient a={a:.2e} is not positive; "
                             "the profile does not grow quadratically (check warm-up and noise)")
        return cls(a=a, b=max(b, 0.0), c=c, **kw)


def profile_lengths(chunk_size: int, context_len: int | None = None) -> list[int]:
    """The fresh-prefill lengths upstream's startup profiling runs: 128 from min(1.25*C, ctx) down."""
    top = min(int(chunk_size * 1.25), context_len or 1 << 62)
    step = max(1, top // 128)
    return [top - i * step for i in range(128) if top - i * step > 0]


def emulated_fit(cost, chunk_size: int, context_len: int | None = None) -> tuple[float, float, float]:
    """(a, b, c) upstream's fit would get from a noise-free run of its own profiling on `cost`.

    Lets a benchmark run upstream's algorithm (policy `quadratic`) without the 128 startup prefills, which
    on a slow CPU take longer than the benchmark itself."""
    lens = profile_lengths(chunk_size, context_len)
    p = UpstreamPredictor.fit(lens, [float(cost.time(0.0, float(n))) for n in lens], chunk_size=chunk_size,
                              context_len=1 << 62)
    return p.a, p.b, p.c
