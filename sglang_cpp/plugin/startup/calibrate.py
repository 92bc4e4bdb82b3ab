"""Startup calibration on extend-over-prefix shapes (replaces DynamicChunkSizer._profile_prefill_latency).

Upstream times 128 fresh prefills up to 1.25*C on stage 0 only, then extrapolates. Here every stage
times its own layers, at the same moment, on a grid of samples t(L, x) where the prefix L and the chunk
x vary independently: log-spaced L up to the target, three chunk sizes at every L from the planner's
smallest chunk to its largest. A sample costs one chunk, not a prefill of L: the prefix's KV slots are
allocated through SGLang's own extend path and filled with random values (attention time does not
depend on KV values), then the chunk runs over them as a real extend. The samples are all-gathered,
and the per-stage models are fitted from them. A failure on any rank fails every rank: no silent fallback.
"""
from __future__ import annotations

import logging
import math
import time

import numpy as np

from ... import envs
from ...core.calib_grid import _eta_s, calibrated_switches, calibration_levels, cap_at, level_grids, new_points, top_chunk
from .deadline import note_error, tick
from .harness import _empty_cache, _forward_timed, synthetic_req

logger = logging.getLogger("sglang_cpp")


def speculative_warning(algorithm: str, pp_size: int, online: bool) -> str:
    """'' unless speculative decoding runs with PP: then the last stage's prefill forwards also run the
    draft model's extend (EAGLE/MTP), which the startup calibration does not time, so the plan under-costs
    that stage. A served forward's window spans the target's forward and the draft's (timing.ForwardWindow,
    forwards.draft_runners): online refinement fits it after the first requests."""
    if pp_size <= 1 or algorithm.upper() in ("", "NONE"):
        return ""
    fix = ("online refinement (SGLANG_CPP_ONLINE, on) refits the last stage from served forwards, which include "
           "it, after the first requests" if online else
           "SGLANG_CPP_ONLINE=0 keeps this under-costing for the server's life: turn it on, or pass a profile fitted "
           "on served forwards (sglang-cpp tune fit --from-log)")
    if algorithm.upper() == "DSPARK":  # its draft KV is injected outside any ModelRunner.forward: never timed
        fix = ("its draft's prefill KV is injected outside the model's forward (dspark_worker_v2.py:873-880), so "
               "served forwards leave it out too and online refinement cannot fit it: that stage stays under-costed")
    return (f"[sglang-cpp] speculative decoding ({algorithm}) with pp={pp_size}: the last stage's prefill chunks also "
            "run the draft model's extend, which the startup calibration does not time, so plans under-cost that "
            f"stage until it is measured; {fix}")


def default_repeats(device: str) -> tuple[int, bool]:
    """(timed repeats, warm every shape first). GPUs: every (L, x) shape runs once untimed (kernel
    autotuning, allocator growth), then the minimum of 2 repeats. CPU: one timed pass after a single
    warm forward, because each extra pass costs a whole calibration again at startup (set
    SGLANG_CPP_CALIB_REPEATS=2 for the GPU treatment)."""
    return (1, False) if device == "cpu" else (2, True)


def fill_random(pool, loc, seed: int) -> int:
    """Random values in every layer's K and V (or MLA latent) slots at `loc` of this stage's KV pool; the
    number of buffers filled. One random block is generated and tiled (generating L x layers values
    costs more than the copy). Integer storage (fp8 kept as bytes) is left as it is: its values do not
    change attention time either, and random bytes could spell NaN."""
    import torch

    n, filled = int(loc.numel()), 0
    for name in ("k_buffer", "v_buffer", "kv_buffer"):
        for buf in getattr(pool, name, None) or []:
            if not isinstance(buf, torch.Tensor) or not buf.is_floating_point() or n == 0:
                continue
            gen = torch.Generator(device=buf.device).manual_seed(seed + filled)
            block = torch.randn((min(n, 4096), *buf.shape[1:]), generator=gen, device=buf.device,
                                dtype=torch.float32).to(buf.dtype)
            for i in range(0, n, block.shape[0]):
                idx = loc[i:i + block.shape[0]]
                buf[idx] = block[:idx.numel()]
            filled += 1
    return filled


def random_prefix(sched, req, L: int, seed: int = 0) -> None:
    """Give `req` a prefix of L tokens without computing it: SGLang's own extend allocation writes the
    request's KV row (the slots a computed prefix would have), the slots get random values, and the
    request is checkpointed as after a real chunk."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.mem_cache.common import checkpoint_kv_cache

    req.extend_end = req.prefix_len + L
    batch = ScheduleBatch.init_new([req], sched.req_to_token_pool, sched.token_to_kv_pool_allocator,
                                   sched.tree_cache, sched.model_config, False, sched.spec_algorithm)
    batch.prepare_for_extend()
    fill_random(sched.tp_worker.model_runner.token_to_kv_pool, batch.out_cache_loc, seed)
    checkpoint_kv_cache(req, sched.tree_cache)
    req.init_next_round_input()


def computed_prefix(sched, req, L: int, max_chunk: int, proxies: dict) -> None:
    """Give `req` a prefix of L tokens the way serving does: forwards of at most max_chunk tokens."""
    from sglang.srt.mem_cache.common import checkpoint_kv_cache

    end, step = req.prefix_len + L, max_chunk or L
    while req.prefix_len < end:
        req.extend_end = min(end, req.prefix_len + step)
        tick(f"computing a calibration prefix, {req.prefix_len} of {L} tokens")
        _forward_timed(sched, req, proxies)
        checkpoint_kv_cache(req, sched.tree_cache)
        req.init_next_round_input()


def _alloc_error(sched, L: int, x: int, exc: Exception) -> RuntimeError:
    pool = int(getattr(sched, "max_total_num_tokens", 0) or 0)
    return RuntimeError(f"cannot allocate {L + x} KV slots for the calibration sample L={L}, x={x} ({exc}); this "
                        f"stage's KV pool holds {pool} tokens: lower SGLANG_CPP_CALIB_MAX_LEN below that, or give "
                        "the KV cache more memory (--mem-fraction-static)")


def measure_stage(sched, points: list, repeats: int = 1, seed: int = 0, warmup: bool = True,
                  max_chunk: int = 0, warm_shapes: bool = False, prefix: str = "random") -> list[dict]:
    """Time this stage's layers at every (L, x) of `points`; samples {L, x, ms}, each the minimum over
    `repeats` timed forwards (after one untimed one per shape with warm_shapes). Each forward gets a
    fresh synthetic request whose prefix is random (default) or computed, and gives its KV back after."""
    from sglang.srt.mem_cache.common import release_kv_cache

    rng = np.random.default_rng(seed + len(points))  # same on every stage: identical synthetic requests
    best: dict = {}
    proxies: dict = {}
    todo = ([(0, 64, False)] if warmup else [])  # a cold first forward is not timed
    for L, x in points:
        todo += [(L, x, not (warm_shapes and rep == 0)) for rep in range(max(1, repeats) + int(warm_shapes))]
    for i, (L, x, timed) in enumerate(todo):
        req = synthetic_req(sched, rng, L + x, f"sglang-cpp-calib-{L}-{x}-{i}")
        tick(f"in the forward of the calibration sample L={L}, x={x}")
        try:
            try:
                if L and prefix == "random":
                    random_prefix(sched, req, L, seed=seed + i)
                elif L:
                    computed_prefix(sched, req, L, max_chunk, proxies)
                req.extend_end = L + x
                ms = _forward_timed(sched, req, proxies)
            except RuntimeError as exc:
                if "out of memory" in str(exc).lower() or "alloc" in str(exc).lower():
                    raise _alloc_error(sched, L, x, exc) from exc
                raise
            if timed:
                best[(L, x)] = min(ms, best.get((L, x), math.inf))
        finally:
            release_kv_cache(req, sched.tree_cache, checkpoint=False)
    return [{"L": L, "x": x, "ms": ms} for (L, x), ms in best.items()]


def inject_fault(sched, pp_rank: int, tp_rank: int) -> None:
    """SGLANG_CPP_CALIB_FAULT_*: on the chosen PP rank (and TP rank, -1: all of the stage's), raise now
    (`level`) or arm a one-shot raise inside the model's next forward, before the stage's last layer, where
    the TP peers wait in that layer's collectives (`forward`: the hang a failed TP peer caused before the deadline)."""
    if envs.CALIB_FAULT_RANK.get() != pp_rank or envs.CALIB_FAULT_TP_RANK.get() not in (-1, tp_rank):
        return
    if envs.CALIB_FAULT_IN.get() == "level":
        raise RuntimeError("fault injected by SGLANG_CPP_CALIB_FAULT_RANK")
    layer = last_layer(sched.tp_worker.model_runner.model)
    handle = None

    def fail(module, args):
        handle.remove()
        raise RuntimeError(f"fault injected by SGLANG_CPP_CALIB_FAULT_RANK inside the forward (PP{pp_rank} TP{tp_rank})")

    handle = layer.register_forward_pre_hook(fail)


def last_layer(model):
    """The last decoder layer this stage holds: the model's first ModuleList of layers, less SGLang's
    PPMissingLayer placeholders for other stages' layers."""
    import torch

    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] == "layers":
            own = [m for m in mod if type(m).__name__ != "PPMissingLayer"]
            if own:
                return own[-1]
    raise RuntimeError(f"no decoder layers found in {type(model).__name__}")


def measure_gathered(sched, points: list, pp_rank: int, tp_rank: int, what: str, repeats: int, seed: int,
                     warmup: bool = False, max_chunk: int = 0, warm_shapes: bool = False, prefix: str = "random",
                     fault: bool = False) -> tuple[list[dict], float]:
    """Every rank times its stage at `points` (measure_stage), then all ranks all-gather: (stage-tagged
    samples, one copy per stage; the slowest rank's seconds). A failure on any rank fails every rank with
    every rank's reason. Collective: every rank calls it with the same points."""
    from .consensus import all_gather

    t0 = time.time()
    try:
        if fault:
            inject_fault(sched, pp_rank, tp_rank)
        local = {"ok": True, "samples": [dict(s, stage=pp_rank) for s in
                                         measure_stage(sched, points, repeats, seed=seed, warmup=warmup,
                                                       max_chunk=max_chunk, warm_shapes=warm_shapes, prefix=prefix)]}
    except Exception as exc:  # travel to every rank, then fail everywhere
        logger.exception("[sglang-cpp] calibration failed on PP%d", pp_rank)
        local = {"ok": False, "error": f"PP{pp_rank}: {exc!r}"}
        note_error(local["error"])
    local["t"] = time.time() - t0
    tick(f"waiting for every rank's samples of {what} (a gather over the world group)")
    gathered = all_gather(local)
    tick(f"after {what}")
    errors = [g["error"] for g in gathered if not g["ok"]]
    if errors:
        raise RuntimeError("sglang-cpp startup calibration failed: " + "; ".join(errors) +
                           ". Fix the cause, or pass a profile with SGLANG_CPP_PROFILE=<json>.")
    samples, stages = [], set()
    for g in gathered:  # TP/DP ranks of one stage measure the same shapes: keep one copy per stage
        st = g["samples"][0]["stage"] if g["samples"] else None
        if st not in stages:
            stages.add(st)
            samples.extend(g["samples"])
    return samples, max(g["t"] for g in gathered)


def calibrate_all_stages(sched, max_len: int, repeats: int, pp_rank: int, budget_s: float = 0.0,
                         max_chunk: int = 0, align: int = 64, min_chunk: int = 0,
                         prefix: str = "random", plan_cfg=None, tp_rank: int = 0,
                         switches: tuple = (), chunk_switches: tuple = (),
                         chunk_overhead_ms: float = 0.0) -> tuple[list[dict], int]:
    """Every rank measures its own stage on the grids of lengths 4x apart up to max_len; after each
    level all ranks all-gather their samples and times, and stop together once the next level would
    overrun `budget_s` (0: no budget). No forward is longer than max_chunk. With plan_cfg, each level after
    the first samples chunks up to `top_chunk` of the model fitted so far (world rank 0's, sent to all), with
    `chunk_overhead_ms` per chunk (SGLANG_CPP_CHUNK_OVERHEAD_MS, as the served plans have it).
    `switches`, `chunk_switches`: kernel switches in L and in x (plugin/startup/switches.py), sampled on both sides.
    repeats 0: default_repeats. Returns the stage-tagged samples and the length actually reached."""
    from .consensus import from_rank0

    auto_repeats, warm_shapes = default_repeats(str(sched.device))
    repeats = repeats or auto_repeats
    warm_shapes = warm_shapes or repeats > 1
    t0 = time.time()
    samples: list[dict] = []
    levels = calibration_levels(max_len)
    times: list[float] = []  # from gathered times only, so every rank takes the same stop decision
    seen: set = set()
    top = max_chunk
    logger.info("[sglang-cpp] calibrating t(L, x) on every stage: at most %d samples (%s prefixes) in %d levels up to "
                "%d tokens (%s), budget %s; cached for the next start",
                sum(len(g) for _, g in level_grids(max_len, align, max_chunk, min_chunk, switches, chunk_switches)),
                prefix, len(levels), max_len,
                ", ".join(map(str, levels)), f"{budget_s:.0f}s" if budget_s else "none")
    for i, level in enumerate(levels):
        points = new_points(level, seen, align, top, min_chunk, switches, chunk_switches)
        got, t_level = measure_gathered(sched, points, pp_rank, tp_rank, f"calibration level {i + 1}", repeats,
                                        seed=level, warmup=i == 0, max_chunk=max_chunk, warm_shapes=warm_shapes,
                                        prefix=prefix, fault=True)
        samples.extend(got)
        times.append(t_level)
        eta = _eta_s(levels, i + 1, times)
        logger.info("[sglang-cpp] calibration level %d/%d: %d tokens, %d samples per stage, top chunk %s, in %.1fs "
                    "(%.0fs so far, ~%.0fs left)", i + 1, len(levels), level, len(points), cap_at(top, 0) or "uncapped",
                    times[-1], sum(times), eta)
        if budget_s and level < max_len and sum(times) + _eta_s(levels[:i + 2], i + 1, times) > budget_s:
            logger.warning("[sglang-cpp] calibration stops at %d of %d tokens: the next level would overrun the "
                           "%.0fs budget (SGLANG_CPP_CALIB_BUDGET_S; raise it to calibrate further)",
                           level, max_len, budget_s)
            break
        if plan_cfg is not None and i + 1 < len(levels):
            bounds = calibrated_switches(switches, (), level, align, min_chunk, quiet=True)[0]
            top = from_rank0(lambda: _next_top(samples, levels[i + 1], plan_cfg, max_chunk, bounds, chunk_switches,
                                               chunk_overhead_ms))
    logger.info("[sglang-cpp] calibrated %d samples on %d stage(s) up to %d tokens in %.1fs",
                len(samples), len({s["stage"] for s in samples}), level, time.time() - t0)
    _empty_cache(str(sched.device))
    return samples, level


def _next_top(samples: list, length: int, plan_cfg, max_chunk: int, bounds: tuple = (),
              chunk_switches: tuple = (), chunk_overhead_ms: float = 0.0):
    """World rank 0: top_chunk on the samples so far (fitted per regime of `bounds` and `chunk_switches`);
    a fit that fails keeps the cap (and says so)."""
    from ...core.profile_io import cost_from_profile

    try:
        cost = cost_from_profile({"samples": samples, "meta": {"regime_bounds": list(bounds),
                                                               "chunk_switches": list(chunk_switches)}},
                                 "calibration so far")
    except ValueError as exc:
        logger.warning("[sglang-cpp] calibration: no fit after a level (%s); the next level samples chunks up to "
                       "the cap %d", exc, max_chunk)
        return max_chunk
    from ...core.costmodel import add_overhead

    top = top_chunk(add_overhead(cost, chunk_overhead_ms, plan_cfg.pp_size), length, plan_cfg, max_chunk)
    logger.info("[sglang-cpp] calibration: the next level samples chunks up to %d (the largest chunk the plan for "
                "%d tokens cuts on the model so far, rounded up; cap %s), per prefix: %s", top[0][1], length,
                max_chunk or "none", ", ".join(f"{t} to {e}" for e, t in top))
    return top
