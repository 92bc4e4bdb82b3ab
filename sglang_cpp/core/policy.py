"""The policy dispatch, one copy: the plan a server running plan, quadratic (upstream's dynamic
chunking) or fixed chunks gives one prompt. `sglang-cpp plan` prints it; `simulate`, `bench ttft
--simulate`, `bench compare`'s simulator check and `tune` replay its chunks; the plugin's SizerConfig
maps the server settings to the same planner settings."""
from __future__ import annotations

import json
from pathlib import Path

POLICIES = ("plan", "plan-alone", "quadratic", "fixed")  # plan-alone: SGLANG_CPP_QUEUE_AWARE=0


def upstream_coeffs(cost, coeffs: str | None, profile: str | None, chunk: int) -> tuple[float, float, float]:
    """Upstream's f(l) = a l^2 + b l + c: --coeffs A,B,C, the profile's 'upstream', else a fit of the
    cost model's fresh prefills at the lengths upstream's startup profiling measures."""
    if coeffs and len(coeffs.split(",")) == 3:
        return tuple(float(v) for v in coeffs.split(","))
    if profile:
        doc = json.loads(Path(profile).read_text())
        if isinstance(doc, dict) and "upstream" in doc:
            u = doc["upstream"]
            return float(u["a"]), float(u["b"]), float(u["c"])
    from .upstream import emulated_fit

    return emulated_fit(cost, chunk)


def plan_for(policy: str, L: int, cost, pp: int, chunk: int, *, sigma: float = 0.75, ctx: int | None = None,
             max_prefill: int = 16384, coeffs=None, profile=None, prefix_len: int = 0,
             page_size: int = 1, method: str = "equal-time", max_chunk: int = 0, min_chunk: int = 0,
             align: int = 64, view=None):
    """The ChunkPlan a server with this policy runs for an L-token prompt after `prefix_len` cached
    tokens: fixed C, upstream's dynamic chunking (quadratic, its predicted times from `cost`, per-chunk
    overheads included: PipelineCost.overheads), or the
    sglang-cpp plan on the server's planner settings (`PlanConfig.from_server`, the plugin's mapping):
    `plan` sees `view` (core/queue_plan.QueueView: the chunks in flight and the prompts waiting behind),
    `plan-alone` plans the prompt as if alone (the two agree when nothing is in view)."""
    from .plan import ChunkPlan
    from .planner import PlanConfig, make_plan, plan_fixed
    from .planner import plan as plan_single
    from .queue_plan import plan_in_queue
    from .upstream import UpstreamPredictor

    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r}: choose one of {', '.join(POLICIES)}")
    pcfg = PlanConfig.from_server(pp_size=pp, chunk_size=chunk, max_prefill_tokens=max_prefill, page_size=page_size,
                                  context_len=ctx or 1 << 62, method=method,
                                  max_chunk=max_chunk, min_chunk=min_chunk, align=align)
    if policy == "fixed":
        return plan_fixed(L, cost, pcfg, chunk, prefix_len)
    if policy in ("plan", "plan-alone"):
        alone = plan_single(L, cost, pcfg, prefix_len)
        return plan_in_queue(L, cost, pcfg, prefix_len, view, alone=alone) if policy == "plan" else alone
    a, b, c = upstream_coeffs(cost, coeffs, profile, chunk)
    up = UpstreamPredictor(a=a, b=b, c=c, chunk_size=chunk, context_len=ctx or 1 << 62, sigma=sigma,
                           page_size=page_size, max_prefill_tokens=max_prefill)
    chunks = up.chunk_sequence(L, prefix_len)
    qcfg = PlanConfig(pp_size=pp, align=pcfg.align, max_chunk=max(chunks + [pcfg.align]))
    plan = make_plan(chunks, L, prefix_len, cost, qcfg, "quadratic")
    return ChunkPlan(**{**plan.__dict__, "meta": {"sigma": up.sigma, "target_ms": up.target_latency}})


def chunks_for(policy: str, L: int, cost, pp: int, chunk: int, *, sigma: float = 0.75, **kw) -> list[int]:
    """The chunk sequence of `plan_for` (same arguments): what `bench ttft --simulate`, `simulate`, the
    runner's simulator check and `tune analytic` replay."""
    from .upstream import check_sigma

    check_sigma(sigma)
    return list(plan_for(policy, L, cost, pp, chunk, sigma=sigma, **kw).chunks)
