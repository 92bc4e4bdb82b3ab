"""SGLang hooks, each named after the SGLang symbol it wraps (`Class_method`), so that an SGLang
upgrade touches this file only. sglang is imported lazily: this module loads in every process."""
from __future__ import annotations

import functools
import logging
import math
from dataclasses import asdict, replace

from .. import envs
from ..machine import cpu_dtype_warning
from ..core.costmodel import ChunkOverhead
from .calibrate import speculative_warning
from .coverage import cover_plan
from .deadline import startup_deadline
from .overhead import measure_overhead
from .profiles import resolve_cost, resolve_upstream, save_served
from .attention import TorchNativeAttnBackend__run_sdpa_forward_extend  # noqa: F401 (hook)
from .cpu_compat import (  # noqa: F401 (hooks)
    L2TransferEngine_init_cpu,
    MHATokenToKVPoolHost_backup_from_device_all_layer,
    MHATokenToKVPoolHost_init_cpu,
    MooncakeKVSender_init_cpu,
    TorchNativeAttnBackend_init_cpu,
    alloc_with_host_register_cpu,
)
from .hicache_file import HiCacheFile_init  # noqa: F401 (hook)
from .p2p import GroupCoordinator_recv_tensor_dict, Scheduler__pp_launch_batch  # noqa: F401 (hooks)
from . import pd_kv, pd_ring, switches
from .batch import BatchConfig, BatchPolicy, slot_loads
from .decision_log import DecisionLog
from .sizer import CppChunkSizer, SizerConfig
from .steps import CLOCK, Scheduler__pp_commit_comm_work, Scheduler__pp_recv_typed_dict  # noqa: F401 (hooks)
from . import steps
from .timing import FORWARD, DeviceTimer, LazyTimes

logger = logging.getLogger("sglang_cpp")

ACTIVE: CppChunkSizer | None = None  # one scheduler per process
LOG: DecisionLog | None = None
LOG_BUFFER_LINES = 256  # hot-path lines a server's decision log holds before one write (decision_log.py)
BATCH: BatchPolicy | None = None  # SGLANG_CPP_BATCH_POLICY other than sglang
ONLINE = None  # online.Online: SGLANG_CPP_ONLINE with the plan policy
_FORMING = None  # the Scheduler forming a prefill batch (set around _get_new_batch_prefill_raw)
_PP_RANK = 0  # this process's PP stage (set at start-up)


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
    global ACTIVE, LOG, BATCH, ONLINE, _PP_RANK
    from sglang.srt.runtime_context import get_parallel, get_schedule

    from .consensus import check_agreement, env_snapshot, on_every_rank, planner_inputs, world_rank

    from .targets import unapplied

    par, sch = get_parallel(), get_schedule()
    _PP_RANK = int(par.pp_rank)
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
    LOG = DecisionLog(par.pp_rank, path, tp_rank=par.tp_rank, rank=world_rank(), buffer_lines=LOG_BUFFER_LINES) \
        if (path or active or batch_cfg.policy != "sglang") else None
    if batch_cfg.policy != "sglang":  # the smallest pool of all ranks: the same KV fraction everywhere
        BATCH = BatchPolicy(batch_cfg, kv_capacity=min(g["kv_tokens"] for g in gathered), log=LOG,
                            depth=par.pp_size + int(getattr(par, "pp_async_batch_depth", 0) or 0))
    if not active or policy == "off":
        return original(self)
    cost = upstream = None
    calibrated_len, samples, over = 0, [], [ChunkOverhead()] * par.pp_size
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
                cost, over = measure_overhead(self, cfg, cost, probe, log=LOG)
            # the chunks the served plans run, measured where the calibration did not reach (plugin/coverage.py)
            cost, samples, measured_chunk = cover_plan(self, cfg, cost, over, samples, calibrated_len,
                                                       refit and refit["meta"], log=LOG, save=refit and refit["save"])
            cfg = replace(cfg, measured_chunk=measured_chunk)  # no plan cuts a chunk bigger than was measured
            if probe:
                save_served(self, cfg, cost, over, calibrated_len)
        from .calibrate import STARTUP_FORWARDS

        LOG.write("startup_forwards", **STARTUP_FORWARDS, ceiling=cfg.ceiling)  # calibration, probe, coverage
    sizer = CppChunkSizer(cfg, cost=cost, upstream=upstream, current_req=lambda: _current_chunked_req(self),
                          log=LOG, calibrated_len=calibrated_len, align_source=lambda: _align(self),
                          queue_view=lambda rid: _queue_view(self, rid, int(par.pp_size)))
    self.dynamic_chunk_sizer = sizer
    ACTIVE = sizer
    if BATCH is not None:
        BATCH.cost = cost  # rank 0's cost model, the same on every rank
    if policy == "plan" and envs.ONLINE.get():  # every rank alike (the settings agree): the side group is collective
        ONLINE = _start_online(cost, samples, over, gathered, par.pp_rank)
    LOG.write("startup", **sizer.describe())
    logger.info("[sglang-cpp] PP%d policy=%s ready: %s", par.pp_rank, policy,
                cost if cost is not None else f"upstream a={upstream.a!r} b={upstream.b!r} c={upstream.c!r}")
    return None


def _start_online(cost, samples: list, overheads: list, gathered: list, pp_rank: int):
    """Every rank: the side group (a collective, so all call it here), then each its part of online.Online."""
    import torch.distributed as dist

    from ..core.costmodel import PipelineCost
    from .consensus import world_rank
    from .online import Online, side_group

    P = len(overheads)
    if not isinstance(cost, PipelineCost) or len(cost.stages) != P:  # one model for every stage: refined per stage
        cost = PipelineCost((cost,) * P)
    leaders = [min(r for r, g in enumerate(gathered) if g["pp_rank"] == s) for s in range(P)]
    relays = tuple(r for r, g in enumerate(gathered) if g.get("relay") and r != 0)
    group = side_group(dist, len(gathered))
    return Online(cost, samples, overheads, rank=world_rank(), leaders=leaders, pp_rank=pp_rank, log=LOG,
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


def SchedulerRequestReceiver__pull_raw_reqs(original, self, *args, **kwargs):
    """AROUND the request pull, every scheduler step on every rank: online refinement moves its samples to
    world rank 0, which puts an accepted model into the requests it pulls from the tokenizer (online.py).
    On a later stage the pull is a blocking receive from the previous stage: a wait on a peer (steps.py)."""
    if _PP_RANK:
        t0 = steps.clock()
        try:
            out = original(self, *args, **kwargs)
        finally:
            CLOCK.blocked += steps.clock() - t0
    else:
        out = original(self, *args, **kwargs)
    online = ONLINE
    if online is not None:
        online.pump()
        if online.injects and isinstance(out, list):
            upd = online.take_update()
            if upd is not None:
                out.append(upd)
    return out


def Scheduler_process_input_requests(original, self, recv_reqs, *args, **kwargs):
    """AROUND: a refined cost model that came with these requests is applied before they are processed,
    on every rank alike; SGLang never sees it. The list itself, which later stages receive, keeps it."""
    from .online import ModelUpdate, apply

    if recv_reqs and any(isinstance(r, ModelUpdate) for r in recv_reqs):
        for r in recv_reqs:
            if isinstance(r, ModelUpdate) and ACTIVE is not None:
                apply(r, ACTIVE, BATCH, LOG)
        recv_reqs = [r for r in recv_reqs if not isinstance(r, ModelUpdate)]
    return original(self, recv_reqs, *args, **kwargs)


def get_pp_indices(original, num_hidden_layers, pp_rank, pp_size, *args, **kwargs):
    """AROUND sglang.srt.distributed.get_pp_indices (each stage's layer range, at model build): a bad
    SGLANG_PP_LAYER_PARTITION fails naming the variable, the model's layer count and a value that works
    (SGLang's own error names neither the variable nor the fix)."""
    import os

    from ..core.partition import parse_partition

    raw = os.environ.get("SGLANG_PP_LAYER_PARTITION")
    if raw is not None and pp_size > 1:
        parse_partition(raw, int(num_hidden_layers), int(pp_size))
    return original(num_hidden_layers, pp_rank, pp_size, *args, **kwargs)


def Scheduler__get_new_batch_prefill_raw(original, self, *args, **kwargs):
    """Expose the scheduler forming this prefill batch to the PrefillAdder hooks below (its waiting
    queue and KV pool are the batch policy's inputs)."""
    global _FORMING
    _FORMING = self
    try:
        return original(self, *args, **kwargs)
    finally:
        _FORMING = None


def Scheduler_get_next_batch_to_run(original, self, *args, **kwargs):
    """With SGLANG_CPP_EVEN_DECODES under PP: note which micro-batch slot is being scheduled (the index of
    its running batch in running_mbs), for the admission cap below."""
    if BATCH is not None and BATCH.cfg.even_decodes:
        running = kwargs.get("running_batch", args[0] if args else None)
        self.sglang_cpp_slot = next((i for i, b in enumerate(getattr(self, "running_mbs", ()))
                                     if b is running), None)
    plan = original(self, *args, **kwargs)
    # a pass with no batch to run (idle, or an empty micro-batch slot under PP): the decision log's buffered
    # lines go to its writer thread. SGLang 0.5.23 returns a NextBatchPlan here, never None (scheduler.py:3894)
    if LOG is not None and getattr(plan, "batch_to_run", plan) is None:
        LOG.flush()
    return plan


def Scheduler_on_idle(result, self, *args, **kwargs):
    """AFTER SGLang's idle housekeeping, which every event loop calls when a pass ran nothing (scheduler.py:5241;
    the PD loops never call get_next_batch_to_run): the forwards whose device events completed since the last
    batch (on a GPU the last forward before idle is still pending when run_batch returns, and no run_batch
    follows) and the decision log's buffered lines go to its writer."""
    if LOG is not None:
        _drain_pending(LOG, ONLINE)
        LOG.flush()
    return None


def Scheduler_get_num_allocatable_reqs(original, self, running_bs, *args, **kwargs):
    """SGLANG_CPP_EVEN_DECODES: gLLM's even decode split (eq. 4), as admission: the slot being scheduled
    takes new requests only up to its even share of all running and waiting ones (batch.py `slot_loads`)."""
    res = original(self, running_bs, *args, **kwargs)
    slot = getattr(self, "sglang_cpp_slot", None)
    if BATCH is None or slot is None:
        return res
    return min(res, BATCH.admit_cap(slot_loads(self, slot, running_bs), slot, len(self.waiting_queue)))


_SKIPPED: set = set()  # waiting requests already named in a WARNING (once each)


def _inflight(sched, pp_size: int) -> list:
    """The prefill batches issued in the last pp_size - 1 loop iterations (SGLang's other micro-batch slots,
    oldest first; with pp_async_batch_depth the older slots have left the pipe), each folded into one job
    (prefix of its longest chunk, all its new prompt tokens): one forward per batch. Decode rows (a mixed
    batch's running decodes, DP attention's 1-token extends) are left out. The slot being scheduled is the
    one whose running batch the loop made current (`running_batch is running_mbs[mb_id]`, set before the
    batch is formed in event_loop_pp and event_loop_pp_disagg_prefill alike)."""
    mbs, running = getattr(sched, "mbs", None) or [], getattr(sched, "running_mbs", None) or []
    slot = next((i for i, b in enumerate(running) if b is sched.running_batch), None)
    if slot is None or len(mbs) != len(running):
        return []
    out = []
    for k in range(max(1, len(mbs) - (pp_size - 1)), len(mbs)):
        b = mbs[(slot + k) % len(mbs)]
        if b is None or not b.reqs or not b.forward_mode.is_extend():
            continue
        prefix, ext = getattr(b, "prefix_lens", None), getattr(b, "extend_lens", None)
        if not isinstance(prefix, list) or not isinstance(ext, list):
            continue
        rows = [(int(p), int(x)) for r, p, x in zip(b.reqs, prefix, ext)
                if int(x) > 0 and int(p) < len(r.origin_input_ids)]
        if rows:
            out.append((max(rows, key=lambda px: px[1])[0], sum(x for _, x in rows)))
    return out


def _queue_view(sched, rid: str, pp_size: int):
    """What every stage shares when it plans request `rid` at this loop index (core/queue_plan.py): the
    prefill batches still in the pipe ahead of it (`_inflight`) and the requests waiting behind it in the
    scheduler's order (`waiting_queue`, sorted by calc_priority before the adder runs; the requests after
    `rid` when it is still there, at its first chunk), up to MAX_WAITING, each with the prefix SGLang last
    matched for it (under FCFS, SGLang 0.5.23 matches a waiting request only when it is admitted, so a new
    arrival counts as uncached until then: the same on every rank). A waiting request that cannot be planned
    (longer than the context) is left out with one WARNING naming it."""
    from itertools import islice

    from ..core.queue_plan import MAX_WAITING, QueueView

    queue = getattr(sched, "waiting_queue", None) or []
    chunked = getattr(sched, "chunked_req", None)
    start = 0
    if chunked is None or chunked.rid != rid:  # a first chunk: the request is still in the queue
        start = next((i + 1 for i, r in enumerate(queue) if r.rid == rid), 0)
    waiting, ids = [], []
    ctx = int(sched.model_config.context_len)
    for req in islice(queue, start, None):
        if len(waiting) >= MAX_WAITING:
            break
        n = len(req.origin_input_ids) + len(getattr(req, "output_ids", None) or ())  # a retracted one re-prefills
        p = min(int(req.prefix_len or 0) + int(getattr(req, "host_hit_length", 0) or 0), max(n - 1, 0))
        if not 1 <= n <= ctx:
            if req.rid not in _SKIPPED:
                _SKIPPED.add(req.rid)
                logger.warning("[sglang-cpp] PP%d queue-aware plan leaves out waiting request rid=%s: its %d-token "
                               "prompt is outside [1, the context length %d]", _PP_RANK, req.rid, n, ctx)
            continue
        waiting.append((n, p))
        ids.append(req.rid)
    while len(_SKIPPED) > 4096:
        _SKIPPED.pop()
    return QueueView(tuple(_inflight(sched, pp_size)), tuple(waiting), tuple(ids))


def _waiting_tokens(sched) -> int:
    """gLLM's #WP: prompt tokens not yet prefilled, over the waiting queue and the chunked request
    (replicated state: the same on every rank)."""
    total = sum(len(r.origin_input_ids) for r in sched.waiting_queue)
    req = sched.chunked_req
    if req is not None:
        total += max(len(req.full_untruncated_fill_ids) - req.prefix_len, 0)
    return total


def PrefillAdder_init(result, self, *args, **kwargs):
    """A continuing planned chunk keeps its size: upstream's __init__ took the mixed-chunk decode tokens
    out of rem_chunk_tokens (the plan's predict() became its chunk budget), they go back up to the
    forward's --max-prefill-tokens room (rem_input_tokens). With a batch
    policy, cap this micro-batch's prefill tokens at its budget (gllm) or start its ms budget."""
    bound = _adder_signature().bind(self, *args, **kwargs)
    mixed = int(bound.arguments.get("num_mixed_decode_tokens") or 0)
    sched, policy = _FORMING, BATCH
    if sched is None:
        return None
    if ACTIVE is not None and sched.chunked_req is not None and mixed and self.rem_chunk_tokens is not None:
        # the planned next chunk is the request's own tokens, within the forward's room (first_chunk_limit)
        self.rem_chunk_tokens = max(min(self.rem_chunk_tokens + mixed, self.rem_input_tokens), 1)
    if policy is None:
        return None
    free = sched.token_to_kv_pool_allocator.available_size() + sched.tree_cache.evictable_size()
    cap = policy.start_batch(_waiting_tokens(sched), int(sched.max_total_num_tokens) - int(free),
                             pending=sched.chunked_req is not None, page=max(1, int(self.page_size)))
    if cap is not None and policy.cfg.policy == "gllm":
        self.rem_input_tokens = min(self.rem_input_tokens, cap)
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens = min(self.rem_chunk_tokens, cap)
    return None


def _time_limit(adder, req, prefix: int) -> bool:
    """The time policy: cap rem_chunk_tokens at the tokens of `req` that fit the ms left. False when the
    budget is spent and the batch already holds work (the request waits for the next micro-batch)."""
    policy = BATCH
    if policy is None or policy.ms_left is None or adder.rem_chunk_tokens is None:
        return True
    if policy.ms_left <= 0 and adder.can_run_list:
        return False
    remaining = len(req.full_untruncated_fill_ids) - prefix
    if remaining <= 0:
        return True
    page = max(1, int(adder.page_size))
    x = policy.chunk_for(req.rid, prefix, remaining, page)
    adder.rem_chunk_tokens = min(adder.rem_chunk_tokens, x if x < remaining else -(-remaining // page) * page)
    return True


def PrefillAdder_add_chunked_req(original, self, req, *args, **kwargs):
    """The time policy sizes the continuing chunk of a chunked request too (over its own prefix)."""
    _time_limit(self, req, req.prefix_len)
    return original(self, req, *args, **kwargs)


@functools.cache
def _adder_signature():
    import inspect

    from sglang.srt.managers.schedule_policy import PrefillAdder

    return inspect.signature(inspect.unwrap(PrefillAdder.__init__))


def first_chunk_limit(chunk: int | None, remaining: int, static_limit: int, page_size: int,
                      room: int | None = None) -> int:
    """rem_chunk_tokens for a request's first chunk. A planned cut keeps its size; a chunk that ends the
    prompt is rounded up to a page (SGLang compares the page-ceiled length with the limit, so the bare
    remainder would leave a sub-page pass). `room` is what the forward has left under
    --max-prefill-tokens once --enable-mixed-chunk's decode tokens are in (the adder's rem_input_tokens):
    the cut never exceeds it, but is otherwise not shrunk by the decodes (deducting them from a
    2-token final piece under 2 decodes made a 0-token extend, fatal in the forward)."""
    if chunk is None:
        return static_limit
    cap = chunk if room is None else max(min(chunk, room), 1)
    if chunk < remaining:
        return cap
    page = max(1, page_size)
    ceiled = -(-remaining // page) * page
    return max(static_limit, ceiled if room is None else max(min(ceiled, room), 1))


def PrefillAdder_add_one_req(original, self, req, *args, **kwargs):
    """Size a request's first chunk from its plan (upstream always uses the static C here). The plan
    starts where SGLang's admission does: after the device prefix and any HiCache host hit. The time
    batch policy then caps it at what fits the micro-batch's ms left."""
    from sglang.srt.managers.schedule_policy import AddReqResult

    sizer = ACTIVE
    has_chunked = kwargs.get("has_chunked_req", args[0] if args else False)
    host_hit = int(getattr(req, "host_hit_length", 0) or 0)
    prefix = req.prefix_len + host_hit
    if host_hit and LOG is not None:  # HiCache: this prefix is loaded back from the host tier
        LOG.write("host_hit", rid=req.rid, device_prefix=int(req.prefix_len), host_hit=host_hit)
    if not (sizer is None or self.rem_chunk_tokens is None or self.can_run_list or has_chunked):
        prompt_len = len(req.full_untruncated_fill_ids)
        remaining = prompt_len - prefix
        if remaining > 0:
            chunk = sizer.decide(req.rid, prompt_len, prefix, first=True)
            self.rem_chunk_tokens = first_chunk_limit(chunk, remaining, self.rem_chunk_tokens, self.page_size,
                                                      self.rem_input_tokens)
    if not _time_limit(self, req, prefix):
        return AddReqResult.OTHER
    return original(self, req, *args, **kwargs)


_PENDING = LazyTimes()


def ModelRunner_forward(original, self, *args, **kwargs):
    """AROUND the model runner's forward: the timed window of a served forward (timing.FORWARD, armed by the
    run_batch hook for the scheduler's own runner), the same window calibration times. Unarmed, a pass."""
    return FORWARD.run(self, original, self, *args, **kwargs)


def EPLBManager_rebalance(original, self):
    """AROUND EPLB's rebalance, a generator that `ModelRunner.forward` steps once per forward
    (`on_forward_pass_end`, model_runner.py:1897-1898; eplb_manager.py:83-94): each step marks the timed window
    it runs in (timing.FORWARD.mark), so a served forward that ran a rebalance step (a record dump, maybe an expert
    move) is logged `eplb_rebalance` and left out of online refinement. Startup forwards never step it (calibrate.no_expert_recording sets it aside)."""
    steps = original(self)

    def marked():
        while True:
            FORWARD.mark("eplb_rebalance")
            try:
                item = next(steps)
            except StopIteration as stop:
                return stop.value
            yield item

    return marked()


def Scheduler_run_batch(original, self, batch, *args, **kwargs):
    """The forward, timed and logged (`_run_batch`); on a PD prefill stage with SGLANG_CPP_PD_EARLY_KV, the
    requests whose last chunk it ran are remembered for the early KV send at the next pass (pd_kv.py)."""
    out = _run_batch(original, self, batch, *args, **kwargs)
    if pd_kv.STATE.on:
        pd_kv.ran(self, batch)
    return out


def _run_batch(original, self, batch, *args, **kwargs):
    """Record each prefill forward's time, so `sglang-cpp tune fit` can refit from a real run; with a
    decision log file, each decode forward's too (`decode_forward`: batch size and total context, what
    the serving simulator's decode cost is fitted on). On GPUs the time comes from CUDA events on the
    current stream, written once they complete (timing.py). Between two chunks of one request, the step's
    cost beyond the forward and the waits (`step`, steps.py) goes to online refinement as the per-chunk
    overhead."""
    log = LOG
    if log is None or not batch.reqs:
        return original(self, batch, *args, **kwargs)
    if not log.path and ONLINE is None:  # nothing to time or log: only what the client is told
        extend = batch.forward_mode.is_extend()
        prefix, ext = getattr(batch, "prefix_lens", None), getattr(batch, "extend_lens", None)
        out = original(self, batch, *args, **kwargs)
        if extend and prefix is not None and ext is not None:
            _report_plans(log, batch.reqs, prefix, ext)
        return out
    step = CLOCK.forward_start()
    if batch.forward_mode.is_extend():
        prefix = [int(v) for v in (getattr(batch, "prefix_lens", None) or [r.prefix_len for r in batch.reqs])]
        ext = [int(v) for v in (getattr(batch, "extend_lens", None) or [])]
        event, rec = "forward", {"rids": [r.rid for r in batch.reqs], "prefix": prefix, "chunk": ext}
        if int(getattr(batch, "hicache_consumer_index", -1)) >= 0:  # SGLang's own "a load is pending" (HiCache)
            rec["host_loaded"] = True  # this forward waits for host-tier KV loaded back, layer by layer
        if any(r and p for r, p in zip(getattr(batch, "encoder_swa_reset", None) or (), prefix)):
            rec["replay"] = True  # the worker replays the encoder window of a cached prefix first (tp_worker.py:
            # 639-651, encoder_swa_replay.py:128-142: rows with a prefix only): not what the chunk costs
        if pd_ring.LOOP.it:  # a PD prefill stage with PP > 1: the loop index, for the release lags
            rec["it"] = pd_ring.LOOP.it
    elif batch.forward_mode.is_decode() and log.path:  # seq_lens_sum is None after filter/merge_batch
        ctx = getattr(batch, "seq_lens_sum", None)
        event, rec = "decode_forward", {"batch_size": len(batch.reqs),
                                        "context": int(ctx if ctx is not None else sum(len(r.origin_input_ids) +
                                                                                       len(r.output_ids) for r in batch.reqs))}
    else:
        return original(self, batch, *args, **kwargs)
    timer = DeviceTimer(str(self.device))
    FORWARD.arm(getattr(getattr(self, "tp_worker", None), "model_runner", None), timer)
    try:  # timed over ModelRunner.forward alone (ModelRunner_forward), the window calibration times
        out = original(self, batch, *args, **kwargs)
    finally:
        marks = FORWARD.marks
        ran = FORWARD.disarm()
    if "eplb_rebalance" in marks:
        rec["eplb_rebalance"] = True  # a rebalance step (its record dump, maybe an expert move) ran inside: not the chunk
    online = ONLINE
    done = event == "forward" and _report_plans(log, batch.reqs, prefix, ext)
    if ran:
        chunk = event == "forward" and len(ext) == 1 and ext[0] > 0 and prefix[0] < len(batch.reqs[0].origin_input_ids)
        if chunk and step is not None and step["rid"] == rec["rids"][0]:  # the same request's next chunk
            if online is not None:
                online.record_step(step["loop_ms"])
            if log.path:
                log.write("step", **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in step.items()})
        CLOCK.forward_end(rec["rids"][0] if chunk else None, None if timer.cuda else timer.elapsed_ms())
        _PENDING.add(timer, {"event": event, **rec, "synchronous": True,
                             "timing": "cuda-event" if timer.cuda else "host"})
    _drain_pending(log, online)
    if not ran:  # no forward of the scheduler's own runner ran (nothing to time): logged untimed
        log.write(event, **rec, ms=None, timing="none")
    if done:  # a prompt ran its last chunk: its lines go to the writer before its first token reaches the client
        log.flush()
        if online is not None:
            online.prompt_done()
    return out


def _drain_pending(log, online) -> None:
    """The timed forwards whose events have completed: each to online refinement (if it may fit it) and to
    the decision log, in order."""
    for rec in _PENDING.drain():
        sample = online_sample(rec)
        if online is not None and sample is not None:
            online.record(*sample)
        log.write(rec.pop("event"), **rec)


def online_sample(rec: dict) -> tuple | None:
    """(prefix, chunk, ms) of a logged forward that online refinement may fit, else None: one request's prefill
    chunk, not one that loaded host-tier KV back (HiCache's per-layer wait for the load sits inside the timed
    window, SGLang's `wait_until`; it is not what a chunk costs), nor one an EPLB rebalance step ran in."""
    if (rec.get("event") != "forward" or len(rec.get("chunk", ())) != 1 or rec["chunk"][0] <= 0
            or rec.get("host_loaded") or rec.get("replay") or rec.get("eplb_rebalance")):
        return None
    return rec["prefix"][0], rec["chunk"][0], rec["ms"]


_RAN: dict = {}  # rid -> [first prefix, chunks that ran], until the prompt's last chunk has run


def _report_plans(log: DecisionLog, reqs, prefix: list, ext: list) -> bool:
    """A request whose prompt's last chunk just ran carries its plan to the client: the chunks that ran,
    and the decided plan with its policy and predicted ms, as `meta_info["sglang_cpp_plan"]` (SGLang's
    per-request `customized_info`, which the tokenizer manager accumulates into meta_info). True when
    some request's prompt finished in this forward."""
    done = False
    for req, p, x in zip(reqs, prefix, ext):
        n = len(req.origin_input_ids)
        if p >= n:  # a decode token riding in a mixed batch
            continue
        ent = _RAN.setdefault(req.rid, [p, []])
        ent[1].append(int(x))
        if p + x >= n:
            del _RAN[req.rid]
            plan = {"ran_prefix": ent[0], "ran": ent[1], **log.finished.pop(req.rid, {})}
            info = req.customized_info if isinstance(req.customized_info, dict) else {}
            info["sglang_cpp_plan"] = [plan]
            req.customized_info = info
            done = True
    while len(_RAN) > 4096:  # aborted requests never reach their last chunk
        _RAN.pop(next(iter(_RAN)))
    return done


def MooncakeKVSender_send(result, self, kv_indices, *args, **kwargs):
    """Observe only: one `kv_send` event per KV transfer a prefill rank hands to Mooncake (with a
    decision log file), so a test or a user can count transfers per request (one per chunk)."""
    log = LOG
    if log is not None and log.path:
        log.write("kv_send", room=int(getattr(self, "bootstrap_room", -1)), pages=int(len(kv_indices)))
    return None


def Scheduler__pp_pd_get_prefill_transferred_ids(original, self):
    """PD prefill, PP > 1: the release ring's forward pass, once per loop index (plugin/pd_ring.py: the
    index count and, with SGLANG_CPP_PD_FAST_RING, the fast release)."""
    return pd_ring.transferred_ids(original, self, LOG)


def Scheduler_process_prefill_chunk(original, self, *args, **kwargs):
    """AROUND, every pass of a PD prefill loop: an abort pending on the chunked request stops it first, at one
    loop index on every stage (pd_ring.chunked_abort; SGLang's PD PP loop never did)."""
    pd_ring.chunked_abort(self, LOG)
    return original(self, *args, **kwargs)


def Scheduler_abort_request(result, self, recv_req=None, *args, **kwargs):
    """AFTER: note the chunked request an AbortReq from the request relay marked (pd_ring.abort_requested)."""
    pd_ring.abort_requested(self, recv_req if recv_req is not None else kwargs.get("recv_req"))
    return None


def Scheduler_process_disagg_prefill_inflight_queue(result, self, *args, **kwargs):
    """Observe only: a `release` event, the requests this stage freed (pd_ring.py)."""
    pd_ring.released(result, LOG)
    return None


def Scheduler_send_kv_chunk(result, self, req, last_chunk: bool = False, *args, **kwargs):
    """Observe only: a `kv_chunk` event per KV send handed to the transfer engine (pd_ring.py)."""
    pd_ring.kv_chunk(req, last_chunk, LOG)
    return None


def CommonKVManager_update_status(result, self, bootstrap_room, status, *args, **kwargs):
    """Observe only: a `kv_status` event per transfer status change (pd_ring.py)."""
    pd_ring.kv_status(bootstrap_room, status, LOG)
    return None


def DynamicChunkSizer_profile_and_fit(result, self, *args, **kwargs):
    """Observe only (policy off/quadratic): record upstream's exact fitted coefficients."""
    p = self.predictor
    if LOG is not None:
        LOG.write("upstream_fit", ok=bool(result), a=p.quadratic_coeff_a, b=p.linear_coeff_b,
                  c=p.constant_coeff_c, target_ms=p.target_latency)
    return None
