"""SGLang hooks, each named after the SGLang symbol it wraps (`Class_method`), so that an SGLang
upgrade touches this file only. sglang is imported lazily: this module loads in every process."""
from __future__ import annotations

import logging
import time

from .. import envs
from ..machine import cpu_dtype_warning
from .profiles import resolve_cost, resolve_upstream
from .attention import TorchNativeAttnBackend__run_sdpa_forward_extend  # noqa: F401 (hook)
from .cpu_compat import MooncakeKVSender_init_cpu, alloc_with_host_register_cpu  # noqa: F401 (hooks)
from .p2p import GroupCoordinator_recv_tensor_dict, Scheduler__pp_launch_batch  # noqa: F401 (hooks)
from .sizer import CppChunkSizer, DecisionLog, SizerConfig

logger = logging.getLogger("sglang_cpp")

ACTIVE: CppChunkSizer | None = None  # one scheduler per process
LOG: DecisionLog | None = None


def _current_chunked_req(sched):
    req = getattr(sched, "chunked_req", None)
    return None if req is None else (req.rid, len(req.full_untruncated_fill_ids))


def Scheduler_maybe_init_dynamic_chunk_sizer(original, self):
    """Install our policy in place of upstream's sizer; validate config and fail fast."""
    global ACTIVE, LOG
    from sglang.srt.runtime_context import get_parallel, get_schedule

    par, sch = get_parallel(), get_schedule()
    warning = cpu_dtype_warning(str(self.device), str(self.model_config.dtype))
    if warning:
        logger.warning(warning)
    policy = envs.POLICY.get()  # raises ValueError naming SGLANG_CPP_POLICY
    active = bool(sch.enable_dynamic_chunking) and par.pp_size > 1
    path = envs.DECISION_LOG.get()
    LOG = DecisionLog(par.pp_rank, path) if (path or active) else None
    if not active or policy == "off":
        return original(self)
    cfg = SizerConfig.from_env(policy=policy, pp_size=par.pp_size, pp_rank=par.pp_rank,
                               chunk_size=self.chunked_prefill_size, max_prefill_tokens=self.max_prefill_tokens,
                               page_size=self.page_size, context_len=self.model_config.context_len)
    cost = upstream = None
    calibrated_len = 0
    if policy == "quadratic":
        upstream = resolve_upstream(self, cfg, original)
    else:
        cost, calibrated_len = resolve_cost(self, cfg)
    sizer = CppChunkSizer(cfg, cost=cost, upstream=upstream, current_req=lambda: _current_chunked_req(self),
                          log=LOG, calibrated_len=calibrated_len)
    self.dynamic_chunk_sizer = sizer
    ACTIVE = sizer
    LOG.write("startup", **sizer.describe())
    logger.info("[sglang-cpp] PP%d policy=%s ready: %s", par.pp_rank, policy,
                cost if cost is not None else f"upstream a={upstream.a!r} b={upstream.b!r} c={upstream.c!r}")
    return None


def PrefillAdder_add_one_req(original, self, req, *args, **kwargs):
    """Size a request's first chunk from its plan (upstream always uses the static C here)."""
    sizer = ACTIVE
    has_chunked = kwargs.get("has_chunked_req", args[0] if args else False)
    if sizer is None or self.rem_chunk_tokens is None or self.can_run_list or has_chunked:
        return original(self, req, *args, **kwargs)
    prompt_len = len(req.full_untruncated_fill_ids)
    prefix = req.prefix_len
    remaining = prompt_len - prefix
    if remaining <= 0:
        return original(self, req, *args, **kwargs)
    chunk = sizer.decide(req.rid, prompt_len, prefix, first=True)
    if chunk is not None:
        self.rem_chunk_tokens = chunk if chunk < remaining else max(self.rem_chunk_tokens, remaining)
    return original(self, req, *args, **kwargs)


def Scheduler_run_batch(original, self, batch, *args, **kwargs):
    """Record each prefill forward's measured time, so `sglang-cpp tune fit` can refit from a real run."""
    log = LOG
    if log is None or not batch.forward_mode.is_extend() or not batch.reqs:
        return original(self, batch, *args, **kwargs)
    prefix = [int(v) for v in (getattr(batch, "prefix_lens", None) or [r.prefix_len for r in batch.reqs])]
    ext = [int(v) for v in (getattr(batch, "extend_lens", None) or [])]
    t0 = time.perf_counter()
    out = original(self, batch, *args, **kwargs)
    # CPU forwards are synchronous; on GPUs this is launch time unless the stage synchronises.
    ms = (time.perf_counter() - t0) * 1e3
    log.write("forward", rids=[r.rid for r in batch.reqs], prefix=prefix, chunk=ext, ms=round(ms, 3),
              synchronous=self.device == "cpu")
    return out


def DynamicChunkSizer_profile_and_fit(result, self, *args, **kwargs):
    """Observe only (policy off/quadratic): record upstream's exact fitted coefficients."""
    p = self.predictor
    if LOG is not None:
        LOG.write("upstream_fit", ok=bool(result), a=p.quadratic_coeff_a, b=p.linear_coeff_b,
                  c=p.constant_coeff_c, target_ms=p.target_latency)
    return None
