"""The chunk policy a scheduler holds in its `dynamic_chunk_sizer` slot.

Pure Python on the core (no sglang import), so every decision path is unit-testable. Every PP
stage builds the same object from the same inputs (the broadcast cost model, the request's
length and cached prefix), so every stage makes the same decisions.
"""
from __future__ import annotations

import logging
import math
import os
from collections import OrderedDict
from dataclasses import asdict, dataclass, replace
from typing import Callable, Optional

from ... import envs
from ...core.hysteresis import Incumbents
from ...core.load import ArrivalClock
from ...core.plan import ChunkPlan
from ...core.planner import DP_MAX_UNITS, PlanConfig, prefill_buffer_tokens
from ...core.planner import plan as plan_single
from ...core.queue_plan import QueueView, counted_behind, needs_replan, plan_in_queue
from ...core.upstream import UpstreamPredictor, check_sigma
from ..decision_log import DecisionLog

logger = logging.getLogger("sglang_cpp")
POLICIES = ("plan", "quadratic", "off")


@dataclass(frozen=True)
class SizerConfig:
    """What a stage needs to decide chunk sizes; all of it is identical on every stage."""

    policy: str
    pp_size: int
    pp_rank: int
    chunk_size: int
    max_prefill_tokens: int
    page_size: int
    context_len: int
    sigma: float = 0.75
    min_chunk: int = 0
    max_chunk: int = 0
    chunk_overhead_ms: float = 0.0  # SGLANG_CPP_CHUNK_OVERHEAD_MS: charged per chunk and stage on top of the measured
    method: str = "equal-time"
    align: int = 64  # SGLang's chunk grid (startup._align): lcm of page, 64, truncation and mamba grids
    buffer_tokens: int = 0  # SGLang's prefill-buffer ceiling (runtime_context.max_prefill_buffer_tokens); 0: derived
    dynamic: bool = True  # --enable-dynamic-chunking (without it nothing is planned)
    queue_aware: bool = True  # SGLANG_CPP_QUEUE_AWARE: plans see the chunks in flight and the waiting prompts
    measured_chunk: int = 0  # the largest chunk calibration and coverage measured: no plan cuts a bigger one (0: none)

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"SGLANG_CPP_POLICY={self.policy!r}: choose one of {', '.join(POLICIES)}")
        check_sigma(self.sigma)
        if self.dynamic and (self.chunk_size is None or self.chunk_size <= 0):
            raise ValueError(f"--enable-dynamic-chunking needs --chunked-prefill-size > 0 (the base chunk), got "
                             f"{self.chunk_size}: set --chunked-prefill-size, or drop --enable-dynamic-chunking")
        if not (math.isfinite(self.chunk_overhead_ms) and self.chunk_overhead_ms >= 0):  # added to every stage's
            raise ValueError(f"SGLANG_CPP_CHUNK_OVERHEAD_MS={self.chunk_overhead_ms!r} must be a finite number of ms "
                             ">= 0 (charged per chunk and stage on top of the measured overhead): unset it or give "
                             "one >= 0")  # measured overhead: a negative one fails only later, at a refit
        if self.min_chunk and self.max_chunk and self.min_chunk > self.max_chunk:
            raise ValueError(f"SGLANG_CPP_MIN_CHUNK={self.min_chunk} exceeds SGLANG_CPP_MAX_CHUNK={self.max_chunk}: "
                             "lower the first or raise the second")
        if self.policy == "plan" and self.method == "dp" and self.context_len > DP_MAX_UNITS * max(1, self.align):
            raise ValueError(f"SGLANG_CPP_PLANNER=dp plans prompts of at most {DP_MAX_UNITS} aligned units "
                             f"({DP_MAX_UNITS * max(1, self.align)} tokens at align {self.align}), and this server "
                             f"takes {self.context_len}-token prompts (the context length): unset SGLANG_CPP_PLANNER "
                             "(equal-time, within 1% of the DP), or lower --context-length")
        ceiling = self.ceiling
        if self.max_chunk > ceiling:
            raise ValueError(f"SGLANG_CPP_MAX_CHUNK={self.max_chunk} exceeds SGLang's prefill-buffer ceiling "
                             f"{ceiling} (max(--chunked-prefill-size, --max-prefill-tokens, 1.25x the first) with "
                             "dynamic chunking): no prefill workspace holds a longer forward. Lower it, or raise "
                             "--max-prefill-tokens")

    @property
    def ceiling(self) -> int:
        """SGLang's prefill-buffer ceiling: the most tokens one prefill forward may hold."""
        return self.buffer_tokens or prefill_buffer_tokens(self.chunk_size, self.max_prefill_tokens, self.pp_size)

    @classmethod
    def from_env(cls, **server) -> "SizerConfig":
        """Read and validate SGLANG_CPP_* and the upstream sigma; raises ValueError naming the variable."""
        sigma = os.environ.get("SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR", "0.75")
        server.setdefault("policy", envs.POLICY.get())
        return cls(sigma=check_sigma(sigma), min_chunk=envs.MIN_CHUNK.get(),
                   max_chunk=envs.MAX_CHUNK.get(), chunk_overhead_ms=envs.CHUNK_OVERHEAD_MS.get(),
                   method=envs.PLANNER.get(), queue_aware=envs.QUEUE_AWARE.get(), **server)

    def charged(self, cost):
        """`cost` with SGLANG_CPP_CHUNK_OVERHEAD_MS more per chunk on every stage's overhead (its carrier): what
        every plan of this server is cut on, the served ones (CppChunkSizer) and the ones calibration and
        coverage measure ahead of them."""
        if cost is None:
            return None
        from ...core.costmodel import add_overhead

        return add_overhead(cost, self.chunk_overhead_ms, self.pp_size)

    def plan_config(self) -> PlanConfig:
        return PlanConfig.from_server(pp_size=self.pp_size, chunk_size=self.chunk_size,
                                      max_prefill_tokens=self.max_prefill_tokens, page_size=self.page_size,
                                      context_len=self.context_len, min_chunk=self.min_chunk,
                                      max_chunk=min(filter(None, (self.max_chunk, self.measured_chunk)), default=0),
                                      method=self.method,
                                      align=self.align, buffer_tokens=self.buffer_tokens)


class CppChunkSizer:
    """Duck-types upstream's DynamicChunkSizer (`predict(history_len)`), plus first-chunk sizing."""

    def __init__(self, cfg: SizerConfig, *, cost=None, upstream: Optional[UpstreamPredictor] = None,
                 current_req: Callable[[], Optional[tuple]] = lambda: None, log: DecisionLog | None = None,
                 max_plans: int = 4096, calibrated_len: int = 0, align_source: Callable[[], int] | None = None,
                 queue_view: Callable[[str], Optional[QueueView]] = lambda rid: None,
                 arrivals: ArrivalClock | None = None, cut_fault: bool = False):
        if cfg.policy == "plan" and cost is None:
            raise ValueError("plan policy needs a cost model")
        if cfg.policy == "quadratic" and upstream is None:
            raise ValueError("quadratic policy needs upstream coefficients")
        self.cfg, self.upstream = cfg, upstream
        self.cost = cfg.charged(cost)  # the startup model and each refit: SGLANG_CPP_CHUNK_OVERHEAD_MS on top
        self.plan_cfg = cfg.plan_config()
        self.current_req = current_req
        self.queue_view = queue_view  # rid -> what is in the pipe ahead of it and waiting behind it (admission._queue_view)
        self.log = log or DecisionLog(cfg.pp_rank)
        self._extrapolation_bands: set[int] = set()
        self._plans: OrderedDict[str, ChunkPlan] = OrderedDict()
        self._waiting: dict[str, tuple] = {}  # rid -> the waiting prompts its plan saw (a change replans)
        self._max_plans = max_plans
        self.incumbents = Incumbents(max_plans)  # the last plan per prompt shape (core/hysteresis.py)
        self.margin = 0.0  # the model in force's held-back error: a smaller predicted gain keeps the plan
        self.measured = None  # per stage, the chunk-size regimes its refits measured: a plan moves only into them
        self.calibrated_len = calibrated_len  # longest L+x the cost model measured (0: unknown)
        self._align_source = align_source  # read once, at the first plan (see _settle_align)
        # the offered load (core/load.py): fed the relayed arrival stamps (arrivals.py), advanced per decided chunk
        self.arrivals = arrivals if cfg.policy == "plan" and cfg.queue_aware else None
        self._loads: dict[str, dict] = {}  # rid -> the load estimate its plan in force was made with
        self._issued: dict[str, int] = {}  # rid -> the prefix whose chunk the clock was last advanced by
        self._made: dict[str, int] = {}  # rid -> plans made for it (its first, then one per replan), in its log
        self.cut_fault = cut_fault  # SGLANG_CPP_CUT_FAULT_RANK names this stage: a test of the run-time guard

    def _settle_align(self) -> None:
        """SGLang sets the scheduler's truncation alignment (deterministic inference's split tiles, DSA's
        kpool, mamba's chunk grid) after the sizer is built (scheduler.py: init_deterministic_inference_config
        and the two after it run after maybe_init_dynamic_chunk_sizer), so the startup value can miss it.
        The first plan reads it again; every rank reads the same settings, so every stage plans alike."""
        src, self._align_source = self._align_source, None
        align = int(src())
        if align != self.cfg.align:
            logger.info("[sglang-cpp] PP%d chunk alignment %d -> %d (SGLang's truncation alignment, set after "
                        "start-up)", self.cfg.pp_rank, self.cfg.align, align)
            self.cfg = replace(self.cfg, align=align)
            self.plan_cfg = self.cfg.plan_config()
            self._plans.clear()
            self.incumbents.clear()

    def set_model(self, cost, error: float = 0.0, measured: list | None = None) -> None:
        """A refined model (online.apply, every rank at the same point of the request stream): new requests
        plan on it, and a plan changes only where it predicts a gain beyond `error` (its held-back error)
        and into chunk sizes whose regimes served forwards `measured` (core/hysteresis.py)."""
        self.cost = self.cfg.charged(cost)
        self.margin = float(error)
        self.measured = measured

    # -- planning ----------------------------------------------------------------------------
    def plan_for(self, rid: str, prompt_len: int, prefix_len: int) -> ChunkPlan:
        """The plan this request runs: made at its first chunk, from the chunks in flight and the prompts
        waiting behind it (queue-aware), and made again for its remaining chunks at a chunk boundary where a
        prompt arrived that the plan did not count (a departure or a re-sort does not replan). Every stage sees
        the same view at the same loop index, so every stage replans alike."""
        if self._align_source is not None:
            self._settle_align()
        view = self._view(rid) if self.cfg.queue_aware else None
        plan = self._plans.get(rid)
        # mid-prompt, a prompt arrived that the plan did not count (core/queue_plan.needs_replan)
        replan = (plan is not None and view is not None and plan.prompt_len == prompt_len
                  and plan.next_chunk(prefix_len) is not None
                  and needs_replan(self._waiting.get(rid, ()), view.queue_key, counted_behind(plan)))
        if plan is None or plan.prompt_len != prompt_len or plan.next_chunk(prefix_len) is None or replan:
            old = plan
            plan = self._alone(rid, prompt_len, prefix_len, mid=replan)
            if view is not None and not view.empty:
                plan = self._in_queue(rid, plan, view, old if replan else None)
            self._waiting[rid] = view.queue_key if view is not None else ()
            if view is not None and view.load is not None:
                self._loads[rid] = plan.meta.get("queue", {}).get("load") or view.load.to_dict()
            self._made[rid] = self._made.get(rid, 0) + 1
            self.log.write("plan", rid=rid, prompt_len=prompt_len, prefix=prefix_len, replan=bool(replan),
                           chunks=len(plan.chunks), plans=self._made[rid])
            self._plans[rid] = plan
            self._plans.move_to_end(rid)
            while len(self._plans) > self._max_plans:
                gone = self._plans.popitem(last=False)[0]
                self._waiting.pop(gone, None)
                self._loads.pop(gone, None)
                self._made.pop(gone, None)
        return plan

    def _view(self, rid: str) -> Optional[QueueView]:
        """The queue view, or None (plan alone) with one WARNING when reading it failed: the scheduler never
        stops on the planner's account, and every rank reads the same state, so every rank falls back alike."""
        try:
            view = self.queue_view(rid)
            if view is not None and self.arrivals is not None:
                view = replace(view, load=self.arrivals.load())
            return view
        except Exception as exc:  # noqa: BLE001
            logger.warning("[sglang-cpp] PP%d rid=%s planned alone: reading the queue failed (%s: %s)",
                           self.cfg.pp_rank, rid, type(exc).__name__, exc)
            return None

    def _alone(self, rid: str, prompt_len: int, prefix_len: int, mid: bool) -> ChunkPlan:
        """The single-prompt plan (an empty pipeline), through plan hysteresis at a prompt's start."""
        plan = plan_single(prompt_len, self.cost, self.plan_cfg, prefix_len)
        if mid:  # a replan of the remaining chunks: no incumbent for a mid-prompt start
            return plan
        plan, weighed = self.incumbents.choose(plan, self.cost, self.plan_cfg, self.margin, self.measured)
        if weighed is not None:
            self.log.write("plan_kept" if weighed["kept"] else "plan_moved", rid=rid, prompt_len=prompt_len,
                           prefix=prefix_len, **{k: v for k, v in weighed.items() if k != "kept"})
        if self.calibrated_len and prompt_len > self.calibrated_len:  # any prefix past the samples is a guess
            factor = prompt_len / self.calibrated_len
            band = int(math.log2(factor))  # said once per doubling, by the request stream's leader (the log: every rank)
            if self.log.speaks and band not in self._extrapolation_bands:
                self._extrapolation_bands.add(band)
                logger.warning("[sglang-cpp] PP%d plan for rid=%s extrapolates the cost model %.1fx beyond its "
                               "calibrated length (%d tokens, prompt %d); calibrate longer "
                               "(SGLANG_CPP_CALIB_MAX_LEN, SGLANG_CPP_CALIB_BUDGET_S) or pass SGLANG_CPP_PROFILE; said "
                               "once per doubling of the factor, every request is an `extrapolation` event",
                               self.cfg.pp_rank, rid, factor, self.calibrated_len, prompt_len)
            self.log.write("extrapolation", rid=rid, prompt_len=prompt_len, calibrated_len=self.calibrated_len,
                           factor=round(factor, 3))
        return plan

    def _in_queue(self, rid: str, alone: ChunkPlan, view: QueueView, old: ChunkPlan | None) -> ChunkPlan:
        """The queue-aware plan (core/queue_plan.py), logged as a `queue_plan` event; a view the planner
        cannot use leaves the single-prompt plan in force with one WARNING (the scheduler never stops here)."""
        if len(alone.chunks) == 1:  # one chunk: nothing to choose, whatever is in the pipe
            return alone
        try:
            plan = plan_in_queue(alone.prompt_len, self.cost, self.plan_cfg, alone.prefix_len, view, alone=alone)
        except Exception as exc:  # noqa: BLE001  (every rank fails alike on the same view)
            logger.warning("[sglang-cpp] PP%d rid=%s planned alone: its queue view cannot be planned (%s: %s)",
                           self.cfg.pp_rank, rid, type(exc).__name__, exc)
            return alone
        q = plan.meta.get("queue", {})
        self.log.write("queue_plan", rid=rid, prompt_len=plan.prompt_len, prefix=plan.prefix_len,
                       chunks=list(plan.chunks), replan=old is not None, inflight=[list(c) for c in view.inflight],
                       waiting=[list(w) for w in view.waiting], alone_chunks=len(alone.chunks),
                       mean_completion_ms=q.get("mean_completion_ms"),
                       alone_mean_completion_ms=q.get("alone_mean_completion_ms"), load=q.get("load"),
                       **({"replaced": list(old.chunks[old.index_of(plan.prefix_len):])} if old is not None else {}))
        return plan

    def decide(self, rid: str, prompt_len: int, prefix_len: int, first: bool) -> Optional[int]:
        """Chunk for the step that starts at `prefix_len`; None keeps SGLang's static size."""
        if self.cfg.policy == "quadratic":
            # upstream: the first chunk is the static C; later ones are predictions (None keeps C)
            size = None if first else self.upstream.predict(prefix_len)
            chunk = min(size or self.cfg.chunk_size, prompt_len - prefix_len)
            pred = None
        else:
            plan = self.plan_for(rid, prompt_len, prefix_len)
            chunk = plan.next_chunk(prefix_len)
            pred = plan.pred_ms[plan.index_of(prefix_len)]
            if self.cut_fault and chunk > self.cfg.align:  # fault injection: this stage cuts one unit short
                chunk -= self.cfg.align
            size = chunk
            if self.arrivals is not None and self._issued.get(rid) != prefix_len:
                # the shared clock moves by what this chunk is predicted to take, once: an admission SGLang
                # refused (no KV room, a request cap) decides the same chunk again at a later loop index
                self._issued[rid] = prefix_len
                self.arrivals.issue(pred)
                while len(self._issued) > self._max_plans:
                    self._issued.pop(next(iter(self._issued)))
            # a prompt's plan stays after its last chunk is decided (evicted with the oldest, _max_plans): SGLang
            # may refuse that admission (no KV room, a batch policy's budget) and decide the same chunk again
            load, made = self._loads.get(rid), self._made.get(rid)
        self.log.write("decision", rid=rid, prefix=prefix_len, chunk=chunk, prompt_len=prompt_len,
                       predicted_ms=pred, policy=self.cfg.policy, first=first,
                       **({"load": load} if self.cfg.policy == "plan" and load is not None else {}),
                       **({"plans": made} if self.cfg.policy == "plan" and made is not None else {}))
        return size

    # -- the DynamicChunkSizer interface ------------------------------------------------------------
    def predict(self, history_len: int) -> Optional[int]:
        cur = self.current_req()
        if cur is None:
            return None
        rid, prompt_len = cur
        return self.decide(rid, prompt_len, history_len, first=False)

    def describe(self) -> dict:
        out = {"config": asdict(self.cfg), "calibrated_len": self.calibrated_len}
        if self.cost is not None:
            out["cost"] = self.cost.to_dict()
        if self.upstream is not None:
            out["upstream"] = {"a": self.upstream.a, "b": self.upstream.b, "c": self.upstream.c}
        return out
