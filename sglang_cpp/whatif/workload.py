"""Serving workloads: Poisson arrivals with lengths from a mixture of ranges, or a trace file.

Why a file format of our own is not needed: a trace is JSON lines with arrival_ms, input_len and
output_len (what `bench serve` records), or a CSV with those columns (Azure's trace renamed).
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..args import parse_len
from .serving_sim import Request


@dataclass(frozen=True)
class LengthMix:
    """A mixture of uniform ranges: ((weight, lo, hi), ...), parsed from '0.9:200-2k,0.1:8k-16k'. Weights
    are given for every part, summing to 1, or for none (equal parts)."""

    parts: tuple

    @classmethod
    def parse(cls, text: str, flag: str = "--input-len") -> "LengthMix":
        parts, given = [], []
        for item in str(text).split(","):
            w, _, rng = item.strip().rpartition(":")
            lo, _, hi = rng.partition("-")
            try:
                lo_i = parse_len(lo)
                parts.append((float(w) if w else 1.0, lo_i, parse_len(hi) if hi else lo_i))
            except (ValueError, TypeError):
                raise ValueError(f"{flag} {text!r}: give [WEIGHT:]LO[-HI],..., e.g. 0.9:200-2k,0.1:8k-16k") from None
            given.append(bool(w))
        if not parts or any(not w > 0 or lo < 1 or hi < lo for w, lo, hi in parts):
            raise ValueError(f"{flag} {text!r}: weights must be > 0 and 1 <= LO <= HI")
        if any(given) and not all(given):
            raise ValueError(f"{flag} {text!r}: give a weight to every part or to none (equal parts)")
        total = sum(w for w, _, _ in parts)
        if all(given) and abs(total - 1.0) > 1e-6:
            raise ValueError(f"{flag} {text!r}: the mixture's weights sum to {total:g}, not 1; make them sum to 1 "
                             "or leave them out (equal parts)")
        return cls(tuple(parts))

    @property
    def is_single(self) -> bool:
        """One length, no range: '128k'."""
        return len(self.parts) == 1 and self.parts[0][1] == self.parts[0][2]

    @property
    def hi(self) -> int:
        return max(p[2] for p in self.parts)

    def __str__(self) -> str:
        return ",".join(f"{w:g}:{lo}-{hi}" if lo != hi else f"{w:g}:{lo}" for w, lo, hi in self.parts)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        w = np.array([p[0] for p in self.parts])
        k = rng.choice(len(self.parts), size=n, p=w / w.sum())
        lo = np.array([p[1] for p in self.parts])[k]
        hi = np.array([p[2] for p in self.parts])[k]
        return rng.integers(lo, hi + 1)


def poisson(num: int, rate: float, inputs: LengthMix, outputs: LengthMix, seed: int = 0) -> list[Request]:
    """`num` requests with exponential gaps at `rate` per second (inf: all at t = 0)."""
    if num < 1:
        raise ValueError(f"--num-prompts {num} must be >= 1")
    if not rate > 0:
        raise ValueError(f"--request-rate={rate} must be > 0 (inf: every request at t = 0)")
    rng = np.random.default_rng(seed)
    gaps = np.zeros(num) if np.isinf(rate) else rng.exponential(1e3 / rate, size=num)
    arrivals = np.cumsum(gaps) - gaps[0]
    ins, outs = inputs.sample(rng, num), outputs.sample(rng, num)
    return [Request(i, float(arrivals[i]), int(ins[i]), int(outs[i])) for i in range(num)]


def load_trace(path: str | Path) -> list[Request]:
    """JSON lines or CSV with arrival_ms, input_len, output_len per request."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ValueError(f"--workload {path}: cannot read it ({exc})") from None
    rows = list(csv.DictReader(text.splitlines())) if p.suffix == ".csv" else \
        [json.loads(line) for line in text.splitlines() if line.strip()]
    out = []
    for i, r in enumerate(rows):
        try:
            out.append(Request(i, float(r["arrival_ms"]), int(r["input_len"]), int(r["output_len"])))
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"--workload {path} row {i + 1}: need arrival_ms, input_len, output_len ({exc!r})") from None
    if not out:
        raise ValueError(f"--workload {path} holds no requests")
    return out


def save_trace(requests, path: str | Path) -> Path:
    p = Path(path)
    p.write_text("".join(json.dumps({"arrival_ms": r.arrival_ms, "input_len": r.input_len,
                                     "output_len": r.output_len}) + "\n" for r in requests))
    return p


__all__ = ["LengthMix", "poisson", "load_trace", "save_trace"]
