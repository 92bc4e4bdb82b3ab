"""One decision for all ranks. A multi-node server reads its environment and its calibration cache on
each node; if ranks decided alone, one node could load a cache while another calibrates (and waits in
the all-gather forever), or two stages could plan with different knobs. So every rank sends rank 0
its raw settings, any difference fails every rank at startup naming the variable, and what has to
be resolved once (the profile, the cache hit or the calibration target) is resolved by world rank 0
and sent to all. Errors travel too: a rank never raises alone while the others wait in a collective.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable

from ... import envs
from .deadline import note_error, tick

logger = logging.getLogger("sglang_cpp")

# Settings that shape the plan or the P2P protocol but are read outside envs.ALL.
EXTRA_ENV = ("SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR", "SGLANG_PP_LAYER_PARTITION")


def env_snapshot(environ=None) -> dict:
    """Raw values (unparsed, '' when unset) of every variable that must agree across ranks."""
    environ = os.environ if environ is None else environ
    snap = {v.name: v.lookup(environ)[1] for v in envs.ALL if not v.node_local}  # old spellings included
    return snap | {n: environ.get(n, "") for n in EXTRA_ENV}


def planner_inputs() -> dict:
    """What the planner's floating-point arithmetic depends on besides its inputs: every stage plans on its own
    CPU, and a near-tie rounded the other way on one stage cuts another chunk there and the pipeline hangs on a
    shape mismatch. The planner uses element-wise IEEE operations in a fixed order (no BLAS, issue 56), the
    same in every SIMD path numpy dispatches to, and takes its logarithms and exponentials from the C library's
    scalar libm (core/detmath.py). What remains: the numpy and scipy builds, the planner's code, Python, the C
    library and a probe of its libm (`libm probe`, those functions at fixed points, to the bit)."""
    import hashlib
    import platform
    from pathlib import Path

    import numpy as np

    from ...core import detmath
    from ...machine import versions

    pkg = Path(__file__).resolve().parents[2]  # sglang_cpp/: the planner's and the sizer's code, installed or a checkout
    h = hashlib.sha256()
    for f in sorted(pkg.rglob("*.py")):
        h.update(str(f.relative_to(pkg)).encode() + b"\0" + f.read_bytes())
    digest = h.hexdigest()[:12]
    x = np.linspace(1e-3, 50.0, 257)
    pts = x * x * x  # 1e-9 to 1.25e5, the ranges the searches take logs of (element-wise: no numpy pow)
    probe = hashlib.sha256(detmath.log(pts).tobytes() + detmath.exp(np.linspace(-30.0, 30.0, 241)).tobytes()
                           + detmath.geomspace(1e-9, 1e7, 97).tobytes()).hexdigest()[:12]
    return {**versions("numpy", "scipy"), "sglang-cpp code": digest, "python": ".".join(platform.python_version_tuple()[:2]),
            "libc": " ".join(platform.libc_ver()), "arch": platform.machine(), "libm probe": probe}


def check_agreement(gathered: list[dict]) -> None:
    """gathered[r] = {"env": env_snapshot(), "planner": planner_inputs(), "config": {...}, "error": str} from world
    rank r.
    Raises ValueError naming the first setting that differs from rank 0, or every rank's own error."""
    errors = [f"rank {r}: {g['error']}" for r, g in enumerate(gathered) if g.get("error")]
    if errors:
        raise ValueError("sglang-cpp startup failed: " + "; ".join(errors))
    ref = gathered[0]
    for r, g in enumerate(gathered[1:], 1):
        for name, val in ref["env"].items():
            mine = g["env"].get(name, "")
            if mine != val:
                raise ValueError(f"{name} differs between ranks: world rank 0 has {val!r}, world rank {r} has "
                                 f"{mine!r}. Every stage must plan with the same settings: set it identically on "
                                 "every node, or unset it everywhere.")
        for key, val in ref.get("planner", {}).items():
            mine = g.get("planner", {}).get(key)
            if mine != val:
                raise ValueError(f"the planner's {key} differs between ranks: world rank 0 has {val!r}, world rank "
                                 f"{r} has {mine!r}. Every stage plans in floating point on its own CPU, and a "
                                 "near-tie rounded the other way on one stage cuts a different chunk there (a hang): "
                                 "install the same numpy, scipy, sglang-cpp and C library on every node.")
        for key, val in ref.get("config", {}).items():
            mine = g.get("config", {}).get(key)
            if mine != val:
                raise ValueError(f"server setting {key} differs between ranks: world rank 0 has {val!r}, world "
                                 f"rank {r} has {mine!r}. Launch every node with the same server arguments.")


def _world():
    import torch.distributed as dist
    from sglang.srt.runtime_context import get_parallel

    group = get_parallel().world_group.cpu_group
    return dist, group


def all_gather(payload: Any) -> list:
    """all_gather_object over the world CPU group (gloo), in world-rank order."""
    dist, group = _world()
    out = [None] * dist.get_world_size(group=group)
    dist.all_gather_object(out, payload, group=group)
    return out


def world_rank() -> int:
    dist, group = _world()
    return dist.get_rank(group=group)


def from_rank0(fn: Callable[[], Any], *, rank: int | None = None, gather: Callable = all_gather) -> Any:
    """Rank 0's fn() on every rank. An exception on rank 0 is re-raised on every rank (same type when
    it is a ValueError, so a bad profile reads the same everywhere; any other type as a RuntimeError naming its
    type)."""
    rank = world_rank() if rank is None else rank
    payload = None
    if rank == 0:
        try:
            payload = {"ok": True, "value": fn()}
        except Exception as exc:  # any type: rank 0 never raises alone while its peers wait in the gather
            if not isinstance(exc, ValueError):
                logger.exception("[sglang-cpp] failed on world rank 0; sending the error to every rank")
            payload = {"ok": False, "type": type(exc).__name__,
                       "error": str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"}
    tick("waiting for world rank 0's result (a gather over the world group)")
    got = gather(payload)[0]
    if not got["ok"]:
        raise (ValueError if got["type"] == "ValueError" else RuntimeError)(got["error"])
    return got["value"]


def on_every_rank(fn: Callable[[], Any], *, gather: Callable = all_gather) -> list:
    """fn() on every rank; if any rank fails, every rank raises with all the errors. Returns all values.
    A failure is logged here and kept for the startup deadline's message: if a peer is stuck in a collective
    fn() left half done, this rank waits in the gather and the deadline is what ends it, naming the cause."""
    try:
        payload = {"ok": True, "value": fn()}
    except Exception as exc:  # travels to every rank, then fails everywhere
        payload = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        logger.exception("[sglang-cpp] failed on this rank; sending the error to every rank")
        note_error(payload["error"])
    tick("waiting for every rank's result (a gather over the world group)")
    got = gather(payload)
    errors = [f"rank {r}: {g['error']}" for r, g in enumerate(got) if not g["ok"]]
    if errors:
        raise RuntimeError("; ".join(errors))
    return [g["value"] for g in got]
