"""The plan stays inside what was measured: chunks a plan runs outside the calibrated (L, x) range are
measured on every stage before serving, and the model is refitted with them.

Why: the calibration narrows its chunk sizes level by level to what the plan on the model so far cuts
(`core.calib_grid.top_chunk`), before the pipelined probe has measured the per-chunk overhead. Charged that
overhead, the served plan wants bigger chunks. At 16K on long-llama its first chunk (3136 tokens) was 3x the
largest sampled one and ran 1.13x its prediction on the critical stage. A shape outside the convex
hull of its regime's samples is an extrapolation. Here every stage measures such shapes exactly as the plan
runs them, world rank 0 refits, and the plans are cut again, up to ROUNDS times. Whatever is still outside
after that is a WARNING naming the shapes, in the log and the decision log.

Each refit moves the plans again, so a last round can still leave them on a chunk size nobody measured, and
a prompt of another length than the calibration's cuts its own sizes. So, by construction, the served plans
cut no chunk bigger than the largest one measured (`measured_chunk`, SizerConfig's cap; the served profile
keeps it, so `sglang-cpp plan --profile` cuts the same chunks), as plan hysteresis keeps online refits on
measured chunk sizes.
"""
from __future__ import annotations

import bisect
import logging

import numpy as np

logger = logging.getLogger("sglang_cpp")

ROUNDS = 3  # measure-refit-replan passes; a plan that still leaves the samples after them is reported


def regime_of(L: int, x: int, bounds: tuple = (), x_bounds: tuple = ()) -> tuple[int, int]:
    """(prefix regime, chunk-size regime) of a shape: the fit is piecewise in L at `bounds` (one fit per
    regime) and has one L*x coefficient per chunk-size regime of `x_bounds` (core/costmodel.py)."""
    return bisect.bisect_right(list(bounds), int(L)), bisect.bisect_right(list(x_bounds), int(x))


def inside(points: np.ndarray, p: tuple, tol: float) -> bool:
    """Whether p lies in the convex hull of `points` (n x 2), widened by `tol` in every direction. Fewer
    than three points, or points on one line, span no area: their bounding box (widened) stands in."""
    from scipy.spatial import ConvexHull

    q = np.asarray(p, dtype=float)
    pts = np.unique(np.asarray(points, dtype=float), axis=0)
    if len(pts) == 0:
        return False
    if len(pts) >= 3:
        try:
            eq = ConvexHull(pts).equations  # unit outward normals: n . q + c is q's distance outside a facet
            # element-wise in a fixed order, no BLAS product: every stage judges a shape alike (issue 56)
            return bool(np.all(eq[:, 0] * q[0] + eq[:, 1] * q[1] + eq[:, 2] <= tol))
        except Exception:  # noqa: BLE001  (scipy's QhullError: a degenerate, flat set)
            pass
    return bool(np.all(q >= pts.min(axis=0) - tol) and np.all(q <= pts.max(axis=0) + tol))


def uncovered(shapes, samples: list, bounds: tuple = (), x_bounds: tuple = (), align: int = 64) -> list[tuple]:
    """The shapes (L, x) outside the convex hull of the sampled (L, x) of their own regime (every stage
    samples the same shapes; their union is taken), widened by one alignment unit. Sorted, each once."""
    groups: dict = {}
    for s in samples:
        groups.setdefault(regime_of(s["L"], s["x"], bounds, x_bounds), set()).add((int(s["L"]), int(s["x"])))
    out = set()
    for L, x in shapes:
        pts = groups.get(regime_of(L, x, bounds, x_bounds), set())
        if not inside(np.array(sorted(pts)).reshape(-1, 2), (L, x), float(align)):
            out.add((int(L), int(x)))
    return sorted(out)


def listed(shapes: list, most: int = 12) -> str:
    """'x@L, ...' for a log line, the first `most` of them."""
    more = f" and {len(shapes) - most} more" if len(shapes) > most else ""
    return ", ".join(f"{x}@{L}" for L, x in shapes[:most]) + more


def plan_shapes(cost, plan_cfg, lengths) -> list[tuple]:
    """Every (prefix, chunk) that the plans for prompts of `lengths` run on `cost`, as the sizer cuts them."""
    from ...core.planner import plan

    out = []
    for n in lengths:
        L = 0
        for c in plan(int(n), cost, plan_cfg).chunks:
            out.append((L, int(c)))
            L += int(c)
    return out


def cover_plan(sched, cfg, cost, overheads: list, samples: list, calibrated_len: int, fit_meta, log=None,
               save=None):
    """(served cost, samples, measured_chunk): the plans for the calibration's lengths, cut on `cost` (the calibrated model
    with each stage's measured overhead), measured wherever they leave the samples, refitted on world rank 0
    and sent to every rank, up to ROUNDS times. `fit_meta`: the meta the calibration was fitted with (world
    rank 0's; None: a profile the user gave, never refitted here: only the warning). `save(samples, cost)`:
    world rank 0 keeps the refit (the calibration cache). measured_chunk: the largest chunk in the samples
    (world rank 0's, on every rank; 0 for a profile the user gave), the served plans' cap. Collective: every
    rank calls it."""
    from ...core.costmodel import model_from_dict, with_overheads
    from ...core.profile_io import cost_from_profile
    from ...core.calib_grid import calibration_levels
    from .calibrate import default_repeats, measure_gathered
    from .consensus import from_rank0, world_rank
    from ... import envs

    pc = cfg.plan_config()
    lengths = calibration_levels(calibrated_len) if calibrated_len else []
    refit = from_rank0(lambda: fit_meta is not None)
    samples = list(samples)

    def outside(pc=pc) -> list:  # world rank 0: a profile of coefficients only has no samples to leave
        meta = fit_meta or {}
        if not samples:
            return []
        return uncovered(plan_shapes(cfg.charged(cost), pc, lengths), samples, tuple(meta.get("regime_bounds") or ()),
                         tuple(meta.get("chunk_switches") or ()), pc.align)

    repeats, warm = default_repeats(str(sched.device))
    repeats = envs.CALIB_REPEATS.get() or repeats
    shapes, calibrated = [tuple(s) for s in from_rank0(outside)], None
    for k in range(ROUNDS if refit else 0):
        if not shapes:
            break
        logger.info("[sglang-cpp] the plans for %s tokens run %d chunk(s) outside the calibrated (L, x) range; "
                    "measuring them on every stage (round %d of %d): %s", lengths, len(shapes), k + 1, ROUNDS,
                    listed(shapes))
        got, secs = measure_gathered(sched, shapes, cfg.pp_rank, 0, f"plan coverage round {k + 1}", repeats,
                                     seed=7 * (k + 1), warmup=False, warm_shapes=warm or repeats > 1,
                                     prefix=envs.CALIB_PREFIX.get(), max_chunk=pc.max_chunk)  # as calibration:
        # a computed prefix is walked in forwards no longer than the plan's largest chunk (the prefill buffer)
        if world_rank() == 0:  # the samples are world rank 0's (resolve_cost)
            samples.extend(got)
        calibrated = model_from_dict(from_rank0(lambda: cost_from_profile(
            {"samples": samples, "meta": fit_meta}, "startup calibration with the plan's chunks").to_dict()),
            "startup calibration with the plan's chunks")
        cost = with_overheads(calibrated, overheads, len(overheads))
        if log is not None:
            log.write("coverage", round=k + 1, measured=[list(s) for s in shapes], seconds=round(secs, 3))
        shapes = [tuple(s) for s in from_rank0(outside)]
    if calibrated is not None and save is not None:  # once, with every round's samples
        save(samples, calibrated)
    cap = int(from_rank0(lambda: max((int(s["x"]) for s in samples), default=0))) if refit else 0
    left = shapes
    if cap and cap < pc.hi:  # the plans the server runs: cut under the cap, as the sizer will (SizerConfig)
        from dataclasses import replace

        logger.info("[sglang-cpp] plans cut no chunk above %d tokens, the largest chunk calibration and coverage "
                    "measured (below the %d-token ceiling): bigger chunks would be priced by extrapolation",
                    cap, pc.hi)
        left = [tuple(s) for s in from_rank0(lambda: outside(replace(cfg, measured_chunk=cap).plan_config()))]
    if left:
        logger.warning("[sglang-cpp] the plans for %s tokens still run %d chunk(s) outside the calibrated (L, x) "
                       "range, so their times are extrapolated: %s. %s", lengths, len(left),
                       listed(left),
                       "Online refinement (SGLANG_CPP_ONLINE) refits them from served forwards" if refit else
                       "The model is a profile given with SGLANG_CPP_PROFILE: profile these shapes, or unset it "
                       "to calibrate this server")
        if log is not None:
            log.write("uncovered", shapes=[list(s) for s in left], lengths=lengths)
    if log is not None and cap:
        log.write("measured_chunk", chunk=cap)
    if calibrated is not None:  # coverage's activations back to the allocator before serving
        from .harness import _empty_cache

        _empty_cache(str(getattr(sched, "device", "cpu")))
    return cost, samples, cap
