"""Cost-balanced pipeline layer partition, emitted as SGLANG_PP_LAYER_PARTITION.

SGLang splits layers evenly by count (extras on the last ranks), but the embedding lives on
stage 0 and lm_head + sampling on the last stage, and layers need not cost the same; the
slowest stage sets the pipeline's pace. Like torchtitan's partitioner we count embedding and
output as weighted pieces and pick the split that minimises the slowest stage, exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

ENV_NAME = "SGLANG_PP_LAYER_PARTITION"
_RTOL = 1e-9  # float sums of the same stage differ in the last bits; ties within this are ties


def default_partition(num_layers: int, pp_size: int) -> tuple[int, ...]:
    """SGLang's get_pp_indices split: N // P each, the last N % P ranks get one more."""
    if pp_size < 1:
        raise ValueError(f"--pp-size {pp_size}: give at least 1 stage")
    if num_layers < pp_size:
        raise ValueError(f"cannot split {num_layers} layers into {pp_size} stages; "
                         f"every stage needs >= 1 layer, so use 1 <= --pp-size <= {num_layers}")
    base, rem = divmod(num_layers, pp_size)
    return tuple(base + (r >= pp_size - rem) for r in range(pp_size))


def format_partition(parts: Iterable[int]) -> str:
    return ",".join(str(int(p)) for p in parts)


def parse_partition(text: str, num_layers: int, pp_size: int) -> tuple[int, ...]:
    """Validate a SGLANG_PP_LAYER_PARTITION value up front, so a bad value fails here with the fix
    instead of deep inside model loading on one rank."""
    hint = f"e.g. {ENV_NAME}={format_partition(default_partition(num_layers, pp_size))}" \
        if 1 <= pp_size <= num_layers else \
        f"but no value can work: --pp-size {pp_size} exceeds {num_layers} layers, lower it"
    where = f"{ENV_NAME}={text!r}"
    entries = [e.strip() for e in str(text).split(",")]
    if entries == [""]:
        raise ValueError(f"{where} is empty; give one layer count per stage, {hint}")
    parts = []
    for e in entries:
        try:
            parts.append(int(e))
        except ValueError:
            raise ValueError(f"{where}: entry {e!r} is not an integer; use comma-separated "
                             f"integer layer counts, {hint}") from None
    if len(parts) != pp_size:
        raise ValueError(f"{where} has {len(parts)} entries but --pp-size is {pp_size}; give "
                         f"exactly one layer count per stage, {hint}")
    for r, p in enumerate(parts):
        if p < 1:
            raise ValueError(f"{where}: stage {r} gets {p} layers; every stage needs >= 1, {hint}")
    if sum(parts) != num_layers:
        raise ValueError(f"{where} sums to {sum(parts)} but the model has {num_layers} layers; "
                         f"the counts must add up to num_hidden_layers, {hint}")
    return tuple(parts)


def stage_times_for(parts: Sequence[int], layer_costs: Sequence[float],
                    embed_cost: float = 0.0, head_cost: float = 0.0) -> tuple[float, ...]:
    """Per-stage time of a given split: its layers, plus embedding on stage 0, head on the last."""
    costs = np.asarray(layer_costs, dtype=float)
    if sum(parts) != len(costs) or any(p < 1 for p in parts):
        raise ValueError(f"partition {format_partition(parts)} does not split {len(costs)} "
                         f"layers into stages of >= 1 layer")
    bounds = np.concatenate([[0], np.cumsum(parts)])
    times = [float(costs[a:b].sum()) for a, b in zip(bounds[:-1], bounds[1:])]
    times[0] += embed_cost
    times[-1] += head_cost
    return tuple(times)


@dataclass(frozen=True)
class Partition:
    parts: tuple[int, ...]
    stage_times: tuple[float, ...]
    bottleneck: float

    def as_string(self) -> str:
        return format_partition(self.parts)

    @property
    def env(self) -> str:
        """Ready to paste in front of `python -m sglang.launch_server`."""
        return f"{ENV_NAME}={self.as_string()}"

    @property
    def layer_ranges(self) -> tuple[tuple[int, int], ...]:
        """Half-open [start, end) per stage, as SGLang's get_pp_indices returns them."""
        ends = np.cumsum(self.parts)
        return tuple((int(e - p), int(e)) for p, e in zip(self.parts, ends))


def _dp(C, M, ok_cut, P, extra_t, extra_m, mem_limit, bound):
    """Prefix DP over stages. bound=None: table of min bottleneck. Else: min sum of squared stage
    times subject to every stage time <= bound (the tie-break that balances non-bottleneck stages)."""
    N = len(C) - 1
    T = np.full((P + 1, N + 1), np.inf)
    T[0, 0] = 0.0
    for k in range(1, P + 1):
        js = [N] if k == P else range(k, N - (P - k) + 1)
        for j in js:
            i = np.arange(k - 1, j)
            t = C[j] - C[i] + extra_t(k - 1)
            ok = ok_cut[i] & np.isfinite(T[k - 1, i])
            if mem_limit is not None:
                ok &= M[j] - M[i] + extra_m(k - 1) <= mem_limit
            if bound is None:
                val = np.maximum(T[k - 1, i], t)
            else:
                val = np.where(t <= bound, T[k - 1, i] + t * t, np.inf)
            val = np.where(ok, val, np.inf)
            T[k, j] = val.min() if val.size else np.inf
    return T


def partition_layers(layer_costs: Sequence[float], pp_size: int, *, embed_cost: float = 0.0,
                     head_cost: float = 0.0, layer_mem: Sequence[float] | None = None,
                     mem_limit: float | None = None, embed_mem: float = 0.0, head_mem: float = 0.0,
                     forbidden_cuts: Iterable[int] = ()) -> Partition:
    """Split layers into pp_size contiguous stages minimising the slowest stage (exact DP).

    Ties on the bottleneck go to the most even split (min sum of squared stage times), then to
    more layers on later ranks, so uniform costs reproduce SGLang's default split exactly."""
    costs = np.asarray(layer_costs, dtype=float)
    N, P = len(costs), int(pp_size)
    if costs.ndim != 1 or not np.all(np.isfinite(costs)) or np.any(costs < 0):
        raise ValueError("layer_costs must be a flat list of finite costs >= 0")
    if P < 1:
        raise ValueError(f"pp_size must be >= 1, got {P}")
    if N < P:
        raise ValueError(f"cannot split {N} layers into {P} stages: every stage needs >= 1 "
                         f"layer; use --pp-size <= {N}")
    if min(embed_cost, head_cost) < 0:
        raise ValueError("embed_cost and head_cost must be >= 0")
    if not costs.any() and not (embed_cost or head_cost):
        costs = np.ones(N)  # no cost information: fall back to balancing layer counts (SGLang)
    mem = np.zeros(N) if layer_mem is None else np.asarray(layer_mem, dtype=float)
    if mem.shape != (N,):
        raise ValueError(f"layer_mem has {mem.size} entries but there are {N} layers")
    ok_cut = np.ones(N + 1, dtype=bool)
    for c in forbidden_cuts:
        if not 1 <= int(c) <= N - 1:
            raise ValueError(f"forbidden cut {c} is not between two layers; cuts are 1..{N - 1} "
                             f"(cut i separates layer i-1 from layer i)")
        ok_cut[int(c)] = False
    n_ok = int(ok_cut[1:N].sum())
    if n_ok < P - 1:
        raise ValueError(f"forbidden_cuts leave {n_ok} allowed cut points but {P} stages need "
                         f"{P - 1}; forbid fewer cuts or lower --pp-size to <= {n_ok + 1}")

    C = np.concatenate([[0.0], np.cumsum(costs)])
    M = np.concatenate([[0.0], np.cumsum(mem)])
    extra_t = lambda s: (embed_cost if s == 0 else 0.0) + (head_cost if s == P - 1 else 0.0)
    extra_m = lambda s: (embed_mem if s == 0 else 0.0) + (head_mem if s == P - 1 else 0.0)
    best = _dp(C, M, ok_cut, P, extra_t, extra_m, mem_limit, None)[P, N]
    if not np.isfinite(best):
        total = M[N] + embed_mem + head_mem
        worst = max(float(mem.max()), mem[0] + embed_mem, mem[-1] + head_mem)
        raise ValueError(
            f"no split of {N} layers into {P} stages keeps every stage within mem_limit="
            f"{mem_limit:g} (total memory {total:g} incl. embedding/head, largest single-layer "
            f"stage needs {worst:g}); raise mem_limit, raise --pp-size, or allow more cut points")

    bound = best + _RTOL * max(abs(best), 1e-300)
    S = _dp(C, M, ok_cut, P, extra_t, extra_m, mem_limit, bound)
    parts, j = [], N
    for k in range(P, 1, -1):  # walk back: the largest last stage that stays optimal wins
        for i in range(k - 1, j):
            t = C[j] - C[i] + extra_t(k - 1)
            fits = mem_limit is None or M[j] - M[i] + extra_m(k - 1) <= mem_limit
            if ok_cut[i] and fits and t <= bound and \
                    S[k - 1, i] + t * t <= S[k, j] + _RTOL * max(S[k, j], 1e-300):
                parts.append(j - i)
                j = i
                break
    parts.append(j)
    parts = tuple(reversed(parts))
    times = stage_times_for(parts, layer_costs, embed_cost, head_cost)
    return Partition(parts=parts, stage_times=times, bottleneck=max(times))


def gain_over_default(layer_costs: Sequence[float], pp_size: int, *, embed_cost: float = 0.0,
                      head_cost: float = 0.0, **constraints) -> float:
    """Default bottleneck / optimal bottleneck: the pipeline speed-up the partition buys (>= 1
    without constraints)."""
    default = max(stage_times_for(default_partition(len(layer_costs), pp_size), layer_costs,
                                  embed_cost, head_cost))
    best = partition_layers(layer_costs, pp_size, embed_cost=embed_cost, head_cost=head_cost,
                            **constraints).bottleneck
    return default / best if best > 0 else 1.0
