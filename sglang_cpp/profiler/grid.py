"""Which (L, x) points to measure, and the profiling run's configuration.

The grid shares one set of prefix lengths across all chunk sizes so the hf backend prefills each
prefix once and reuses its KV cache for every chunk size; each chunk size also gets the longest
prefix it fits (L = max_len - x), so every x is measured up to the end of the context.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, fields
from typing import Sequence

BACKENDS = ("hf", "server")
DEVICES = ("cpu", "cuda", "auto")
DTYPES = ("bfloat16", "float16", "float32")
MAX_LEN_CAP = 32768


def _align_down(v: float, align: int) -> int:
    return int(v) // align * align


def default_chunks(max_len: int, align: int = 64) -> list[int]:
    """Geometric (x2) chunk sizes from max_len/16 to max_len/2, aligned down, at least `align`."""
    out, x = [], max_len / 16
    while x <= max_len / 2 + 1e-9:
        out.append(max(align, _align_down(x, align)))
        x *= 2
    return sorted(set(c for c in out if c <= max_len))


def make_grid(max_len: int, *, chunks: Sequence[int] | None = None, num_prefixes: int = 6,
              align: int = 64) -> list[tuple[int, int]]:
    """Sorted, deduplicated (L, x) points with L aligned, L + x <= max_len; deterministic."""
    if align < 1:
        raise ValueError(f"align={align} must be >= 1")
    if max_len < align:
        raise ValueError(f"--max-len {max_len} is smaller than the alignment {align}; profile a longer context")
    if num_prefixes < 1:
        raise ValueError(f"--num-prefixes {num_prefixes} must be >= 1")
    xs = sorted(set(int(c) for c in chunks)) if chunks else default_chunks(max_len, align)
    if not xs:
        raise ValueError(f"--chunks is empty; give sizes like 256,512,1k (each <= --max-len {max_len})")
    bad = [c for c in xs if c < 1 or c > max_len]
    if bad:
        raise ValueError(f"--chunks {bad}: each chunk size must be in 1..--max-len ({max_len})")
    span = max_len - xs[0]
    if num_prefixes == 1:
        prefixes = [0]
    else:
        prefixes = [_align_down(i * span / (num_prefixes - 1), align) for i in range(num_prefixes)]
    grid = set()
    for x in xs:
        for L in prefixes + [_align_down(max_len - x, align)]:
            if L + x <= max_len:
                grid.add((L, x))
    return sorted(grid)


@dataclass(frozen=True)
class ProfileConfig:
    """One `sglang-cpp profile` run; fields map 1:1 to the kebab-case flags."""

    backend: str = "hf"
    model: str | None = None
    base_url: str | None = None
    max_len: int | None = None          # None: model's max_position_embeddings, capped at 32768
    chunks: tuple[int, ...] | None = None
    num_prefixes: int = 6
    align: int = 64
    repeats: int = 3                    # timed runs per point; the median is kept
    warmup: int = 1                     # untimed runs per point before the timed ones
    layers: int | None = None           # hf: load only the first K decoder layers
    stage_layers: int | None = None     # hf: scale the per-layer sum to an N-layer PP stage
    include_embedding: bool = False
    include_head: bool = False
    device: str = "auto"
    dtype: str | None = None            # None: bfloat16 on cuda, float32 on cpu
    out: str | None = None
    fit: bool = False
    seed: int = 0
    threads: int | None = None          # hf on cpu: torch threads (1 avoids spin-wait stalls on a busy host)
    timeout: float = 600.0              # server: seconds per request

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend {self.backend!r}: choose one of {', '.join(BACKENDS)}")
        if self.backend == "hf" and not self.model:
            raise ValueError("--backend hf needs --model-path PATH (a local Hugging Face model folder)")
        if self.backend == "server" and not self.base_url:
            raise ValueError("--backend server needs --base-url http://HOST:PORT of a running SGLang server")
        for name, lo in (("num_prefixes", 1), ("align", 1), ("repeats", 1), ("warmup", 0)):
            if getattr(self, name) < lo:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)} must be >= {lo}")
        for name in ("layers", "stage_layers", "max_len", "threads"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"--{name.replace('_', '-')} {v} must be >= 1")
        if self.device not in DEVICES:
            raise ValueError(f"--device {self.device!r}: choose one of {', '.join(DEVICES)}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"--dtype {self.dtype!r}: choose one of {', '.join(DTYPES)}")

    @classmethod
    def from_args(cls, args) -> "ProfileConfig":
        kw = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
        if kw.get("chunks") is not None:
            kw["chunks"] = tuple(kw["chunks"])
        return cls(**kw)

    def grid(self, max_len: int) -> list[tuple[int, int]]:
        return make_grid(max_len, chunks=self.chunks, num_prefixes=self.num_prefixes, align=self.align)


def median(vals: Sequence[float]) -> float:
    return float(statistics.median(vals))


__all__ = ["make_grid", "default_chunks", "ProfileConfig", "median", "BACKENDS", "DEVICES", "DTYPES",
           "MAX_LEN_CAP"]
