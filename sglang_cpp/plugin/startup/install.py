"""The startup hook (`Scheduler.maybe_init_dynamic_chunk_sizer`): every rank checks its settings against world
rank 0's, the cost model is resolved (a profile, the cache or a calibration), the per-chunk overhead probed
and the plans' chunks covered, and our sizer installed in place of upstream's; the plugin's state is set
here once (state.py). Also the other hooks that run once: the layer partition's check and upstream's fit."""
from __future__ import annotations

import logging
import math
from dataclasses import asdict, replace

from ... import envs
from ...core.costmodel import ChunkOverhead
from ...core.load import ArrivalClock
from ...machine import cpu_dtype_warning
from ..pd import kv as pd_kv
from .. import state
from . import switches
from ..serving.admission import _queue_view
from ..serving.batch import BatchConfig, BatchPolicy
from .calibrate import speculative_warning
from .coverage import cover_plan
from .deadline import startup_deadline
from ..decision_log import DecisionLog
from .overhead import measure_overhead
from .profiles import resolve_cost, resolve_upstream, save_served
from ..serving.sizer import CppChunkSizer, SizerConfig

logger = logging.getLogger("sglang_cpp")


LOG_BUFFER_LINES = 256  # hot-path lines a server's decision log holds before one write (decision_log.py)


def _current_chunked_req(sched):
    req = getattr(sched, "chunked_req", None)
    return None if req is None else (req.rid, len(req.full_untruncated_fill_ids))


def _align(sched) -> int:
    """The grid SGLang would floor our chunks to: page size, 64 (upstream's minimum), the deterministic
    or DSA truncation alignment and the mamba chunk grid; a plan on it is never re-planned."""
    from sglang.srt.managers.schedule_policy import mamba_prefill_chunk_grid

    return math.lcm(max(1, int(sched.page_size)), 64, int(getattr(sched, "truncation_align_size", None) or 1),
                    max(1, int(mamba_prefill_chunk_grid())))


def _settled_align(sched) -> int:
    """`_align` as it will be once SGLang has set its truncation alignment, which it does after the sizer is
    built (scheduler.py:657 against 698-700): SGLang's own three setters run on a stand-in, so calibration
    and coverage sample the served grid from the start (4096 under deterministic flashinfer, not 64)."""
    from types import SimpleNamespace

    from sglang.srt.managers.scheduler import Scheduler

    probe = SimpleNamespace(model_config=sched.model_config, truncation_align_size=None)
    try:
        Scheduler.init_deterministic_inference_config(probe)
        Scheduler.init_dsa_kpool_truncation_align(probe)
        Scheduler.init_mamba_truncation_align(probe)
    except AttributeError as exc:  # a setter reads more than 0.5.23's did: the first plan settles it (sizer)
        logger.warning("[sglang-cpp] SGLang's truncation alignment could not be read ahead (%s); calibration "
                       "uses the startup grid and the first plan settles it", exc)
        return _align(sched)
    return math.lcm(_align(sched), int(probe.truncation_align_size or 1))


def _buffer_tokens() -> int:
    """SGLang's own prefill-buffer ceiling (registered ceiling providers included): the most tokens a
    prefill forward's workspaces hold, so the plan's largest chunk (docs/compatibility.md, 'Chunk bounds')."""
    from sglang.srt.runtime_context import max_prefill_buffer_tokens

    return int(max_prefill_buffer_tokens() or 0)


def Scheduler_maybe_init_dynamic_chunk_sizer(original, self):
    """Install our policy in place of upstream's sizer; every rank checks its settings against world
    rank 0's and fails fast on a difference, then all use rank 0's cost model (consensus.py)."""
    from sglang.srt.runtime_context import get_parallel, get_schedule

    from .consensus import check_agreement, env_snapshot, on_every_rank, planner_inputs, world_rank

    from ..targets import unapplied

    par, sch = get_parallel(), get_schedule()
    state.PP_RANK = int(par.pp_rank)
    warning = cpu_dtype_warning(str(self.device), str(self.model_config.dtype))
    if warning:
        logger.warning(warning)
    missing = unapplied()
    if par.pp_size <= 1:  # no chunked pipeline: nothing to plan, nothing to agree on
        if missing:
            raise RuntimeError(missing)
        return original(self)
    cfg, batch_cfg, error = None, None, missing
    try:
        cfg = SizerConfig.from_env(pp_size=par.pp_size, pp_rank=par.pp_rank, chunk_size=self.chunked_prefill_size,
                                   max_prefill_tokens=self.max_prefill_tokens, page_size=self.page_size,
                                   context_len=self.model_config.context_len, align=_settled_align(self),
                                   dynamic=bool(sch.enable_dynamic_chunking), buffer_tokens=_buffer_tokens())
        batch_cfg = BatchConfig(envs.BATCH_POLICY.get(), mixed_chunk=bool(sch.enable_mixed_chunk),
                                has_cost=bool(sch.enable_dynamic_chunking) and cfg.policy == "plan",
                                even_decodes=envs.EVEN_DECODES.get())
    except ValueError as exc:  # every rank fails, below, with every rank's reason
        error = "; ".join(filter(None, (missing, str(exc))))
    from sglang.srt.runtime_context import get_disagg

    error = "; ".join(filter(None, (error, pd_kv.startup_error(get_disagg()))))
    path = envs.DECISION_LOG.get()
    error = "; ".join(filter(None, (error, DecisionLog(par.pp_rank, path, tp_rank=par.tp_rank, rank=world_rank()).probe())))
    mine = {k: v for k, v in asdict(cfg).items() if k != "pp_rank"} if cfg else {}
    mine["enable_dynamic_chunking"] = bool(sch.enable_dynamic_chunking)
    mine["enable_mixed_chunk"] = bool(sch.enable_mixed_chunk)
    plans = bool(sch.enable_dynamic_chunking) and cfg is not None and cfg.policy != "off"  # else nothing is planned
    gathered = on_every_rank(lambda: {"env": env_snapshot(), "planner": planner_inputs() if plans else {},
                                      "config": mine, "error": error,
                                      "kv_tokens": int(self.max_total_num_tokens),
                                      "max_context": int(self.req_to_token_pool.max_context_len),
                                      "pp_rank": int(par.pp_rank), "relay": _relays_updates(par),
                                      "captured": switches.captured_prefill(getattr(self.tp_worker, "model_runner",
                                                                                     None))})
    check_agreement(gathered)
    switches.CAPTURED = [g["captured"] for g in gathered]  # every stage's prefill graph, for the MLA switches
    policy = cfg.policy
    active = bool(sch.enable_dynamic_chunking)
    # the console: each request stream's leader (PP0, attention TP and CP rank 0: world rank 0, or each DP group's)
    speaks = int(par.pp_rank) == 0 and int(getattr(par, "attn_tp_rank", par.tp_rank) or 0) == 0 \
        and int(getattr(par, "attn_cp_rank", 0) or 0) == 0
    state.LOG = DecisionLog(par.pp_rank, path, tp_rank=par.tp_rank, rank=world_rank(), buffer_lines=LOG_BUFFER_LINES,
                            speaks=speaks) \
        if (path or active or batch_cfg.policy != "sglang") else None
    if batch_cfg.policy != "sglang":  # the smallest pool of all ranks: the same KV fraction everywhere
        state.BATCH = BatchPolicy(batch_cfg, kv_capacity=min(g["kv_tokens"] for g in gathered), log=state.LOG,
                            depth=par.pp_size + int(getattr(par, "pp_async_batch_depth", 0) or 0))
    if not active or policy == "off":
        return original(self)
    cost = upstream = None
    calibrated_len, samples, over = 0, [], [ChunkOverhead()] * par.pp_size  # over: the probe's, when it runs
    if policy == "quadratic":
        upstream = resolve_upstream(self, cfg, original)
    else:
        spec = speculative_warning(getattr(self.spec_algorithm, "name", str(self.spec_algorithm)), par.pp_size,
                                   envs.ONLINE.get())
        if spec:
            logger.warning(spec)
        who = f"world rank {world_rank()} (PP{par.pp_rank}, TP{par.tp_rank})"
        with startup_deadline(envs.CALIB_DEADLINE_S.get(), who):  # no rank hangs in a peer's failed collective
            cost, calibrated_len, samples, refit = resolve_cost(
                self, cfg, max_context=min(g["max_context"] for g in gathered),
                kv_tokens=min(g["kv_tokens"] for g in gathered), tp_rank=int(par.tp_rank))
            probe = envs.OVERHEAD_PROBE.get()
            if probe:  # every rank: a pipelined run through the real P2P path
                cost, over = measure_overhead(self, cfg, cost, probe, log=state.LOG)
            # the chunks the served plans run, measured where the calibration did not reach (plugin/startup/coverage.py)
            fit = refit if refit and "meta" in refit else None  # a calibration's; a profile's carries its cap only
            cfg = replace(cfg, measured_chunk=int((refit or {}).get("cap") or 0))  # a served profile's, if any
            cost, samples, measured_chunk = cover_plan(self, cfg, cost, over, samples, calibrated_len,
                                                       fit and fit["meta"], log=state.LOG, save=fit and fit["save"])
            # no plan cuts a chunk bigger than was measured: the calibration's, else a served profile's cap
            cfg = replace(cfg, measured_chunk=measured_chunk or cfg.measured_chunk)
            if probe:
                save_served(self, cfg, cost, calibrated_len)
        from .harness import STARTUP_FORWARDS

        state.LOG.write("startup_forwards", **STARTUP_FORWARDS, ceiling=cfg.ceiling)  # calibration, probe, coverage
    sizer = CppChunkSizer(cfg, cost=cost, upstream=upstream, current_req=lambda: _current_chunked_req(self),
                          log=state.LOG, calibrated_len=calibrated_len, align_source=lambda: _align(self),
                          queue_view=lambda rid: _queue_view(self, rid, int(par.pp_size)),
                          arrivals=ArrivalClock(),  # kept only by a queue-aware plan policy
                          cut_fault=envs.CUT_FAULT_RANK.get() == par.pp_rank)
    self.dynamic_chunk_sizer = sizer
    state.ACTIVE = sizer
    if state.BATCH is not None:
        state.BATCH.cost = cost  # rank 0's cost model, the same on every rank
    if policy == "plan" and envs.ONLINE.get():  # every rank alike (the settings agree): the side group is collective
        state.ONLINE = _start_online(cost, samples, par.pp_size, gathered, par.pp_rank)
    state.LOG.write("startup", **sizer.describe())
    logger.info("[sglang-cpp] PP%d policy=%s ready: %s", par.pp_rank, policy,
                cost if cost is not None else f"upstream a={upstream.a!r} b={upstream.b!r} c={upstream.c!r}")
    return None


def _start_online(cost, samples: list, P: int, gathered: list, pp_rank: int):
    """Every rank: the side group (a collective, so all call it here), then each its part of online.Online."""
    import torch.distributed as dist

    from ...core.costmodel import per_stage
    from .consensus import world_rank
    from ..serving.online import Online, side_group

    cost = per_stage(cost, P)  # one model for every stage: refined per stage, from the times the sizer plans on
    leaders = [min(r for r, g in enumerate(gathered) if g["pp_rank"] == s) for s in range(P)]
    relays = tuple(r for r, g in enumerate(gathered) if g.get("relay") and r != 0)
    group = side_group(dist, len(gathered))
    return Online(cost, samples, rank=world_rank(), leaders=leaders, pp_rank=pp_rank, log=state.LOG,
                  group=group, dist=dist, relays=relays)


def _relays_updates(par) -> bool:
    """Whether this rank pulls requests for a DP group whose control messages never reach world rank 0's:
    DP attention with local control broadcast (or an elastic-EP joiner), PP0, attention TP and CP rank 0
    (request_receiver.py:112-125 and 167-191). Online refits reach such a group through this rank."""
    if not getattr(par, "attn_dp_enabled", False) or int(par.pp_rank) != 0:
        return False
    if int(getattr(par, "attn_tp_rank", 0)) != 0 or int(getattr(par, "attn_cp_rank", 0)) != 0:
        return False
    from sglang.srt.runtime_context import get_exec

    return bool(getattr(par, "enable_dp_attention_local_control_broadcast", False)
                or getattr(getattr(get_exec(), "moe", None), "is_ep_scale_joiner", False))


def get_pp_indices(original, num_hidden_layers, pp_rank, pp_size, *args, **kwargs):
    """AROUND sglang.srt.distributed.get_pp_indices (each stage's layer range, at model build): a bad
    SGLANG_PP_LAYER_PARTITION fails naming the variable, the model's layer count and a value that works
    (SGLang's own error names neither the variable nor the fix)."""
    import os

    from ...core.partition import parse_partition

    raw = os.environ.get("SGLANG_PP_LAYER_PARTITION")
    if raw is not None and pp_size > 1:
        parse_partition(raw, int(num_hidden_layers), int(pp_size))
    return original(num_hidden_layers, pp_rank, pp_size, *args, **kwargs)


def DynamicChunkSizer_profile_and_fit(result, self, *args, **kwargs):
    """Observe only (policy off/quadratic): record upstream's exact fitted coefficients."""
    p = self.predictor
    if state.LOG is not None:
        state.LOG.write("upstream_fit", ok=bool(result), a=p.quadratic_coeff_a, b=p.linear_coeff_b,
                  c=p.constant_coeff_c, target_ms=p.target_latency)
    return None
