"""The planner's logarithms, exponentials and geometric grids, the same to the bit on every node.

Why: numpy dispatches float64 log, exp, power and so geomspace to SIMD kernels chosen by the CPU at import
(AVX512F, AVX2, baseline), and their last bits differ: on one AMD EPYC host `NPY_DISABLE_CPU_FEATURES=AVX512F
...` changed np.log, np.exp and np.geomspace of the same inputs. A PP deployment whose nodes differ in ISA would
then search different grids and may cut different chunks (issue 56). These helpers call Python's `math`
(the C library's scalar libm, one code path per build: x86-64 glibc picks its FMA variant on every AVX2 and
AVX-512 CPU) element by element, in a fixed order; the startup agreement check compares the libm build
(plugin/startup/consensus.py). The grids are short (at most a few hundred points), so this costs
microseconds."""
from __future__ import annotations

import math

import numpy as np


def _log(v: float) -> float:
    if 0.0 < v < math.inf:
        return math.log(v)
    return math.inf if v == math.inf else -math.inf if v == 0.0 else math.nan


def _exp(v: float) -> float:
    try:
        return math.exp(v)
    except OverflowError:
        return math.inf


def log(a) -> np.ndarray:
    """Element-wise natural log (np.log's edge values: log 0 = -inf, log inf = inf, nan otherwise)."""
    arr = np.asarray(a, dtype=float)
    return np.array([_log(v) for v in arr.ravel().tolist()], dtype=float).reshape(arr.shape)


def exp(a) -> np.ndarray:
    """Element-wise exponential (overflow gives inf, as np.exp)."""
    arr = np.asarray(a, dtype=float)
    return np.array([_exp(v) for v in arr.ravel().tolist()], dtype=float).reshape(arr.shape)


def geomspace(start: float, stop: float, num: int) -> np.ndarray:
    """`num` points from `start` to `stop` (both > 0, both exact), evenly spaced in log."""
    a, b, num = float(start), float(stop), int(num)
    if not (a > 0 and b > 0) or num < 1:
        raise ValueError(f"geomspace({start}, {stop}, {num}): need start > 0, stop > 0 and num >= 1")
    if num == 1:
        return np.array([a])
    la, lb = math.log(a), math.log(b)
    step = (lb - la) / (num - 1)
    out = np.array([math.exp(la + step * i) for i in range(num)], dtype=float)
    out[0], out[-1] = a, b
    return out


__all__ = ["exp", "geomspace", "log"]
