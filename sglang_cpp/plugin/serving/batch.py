"""The prefill budget of each PP micro-batch under mixed load (SGLANG_CPP_BATCH_POLICY).

SGLang gives every micro-batch the same token budget (--chunked-prefill-size), prefill first. With
`gllm` a micro-batch takes gLLM's throttled share #WP/#T of the waiting prefill tokens, bounded by free
KV (Token Throttling eq. 3); with `time` (ours) that share is a budget in predicted milliseconds, and
each request's chunk is sized with t(L, x) over its own prefix, so a chunk deep into a long prompt gets
fewer tokens and every micro-batch takes about the same time. Both ride the slot's decodes in the
prefill batch (--enable-mixed-chunk). With SGLANG_CPP_EVEN_DECODES=1 both also split the decodes evenly
over the slots (eq. 4) the only way SGLang allows: a request stays in the slot that prefilled it, so a
slot admits new requests only up to its even share of all running and waiting ones (`admit_cap`). The
decision logic is the serving simulator's (`batch_policy.py`); this module only reads SGLang's state.

Every input is replicated on every PP rank (the waiting queue, the chunked request, the KV pool's use,
the cost model rank 0 broadcast, the smallest KV capacity of all ranks), so every stage cuts the same
micro-batches; the decision log records them for the cross-stage check.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import envs
from ...core.batch_policy import GLLMThrottle, View, even_share, time_budget, time_chunk

BATCH_POLICIES = envs.BATCH_POLICY.choices


@dataclass(frozen=True)
class BatchConfig:
    """One server's batch policy; identical on every rank (checked at startup)."""

    policy: str = "sglang"
    mixed_chunk: bool = False  # --enable-mixed-chunk
    has_cost: bool = False  # a cost model t(L, x) is loaded (SGLANG_CPP_POLICY=plan with dynamic chunking)
    even_decodes: bool = False  # SGLANG_CPP_EVEN_DECODES: eq. 4 as a per-slot admission cap

    def __post_init__(self):
        envs.BATCH_POLICY.check(self.policy)
        if self.policy != "sglang" and not self.mixed_chunk:
            raise ValueError(f"SGLANG_CPP_BATCH_POLICY={self.policy} throttles the prefill that decodes ride "
                             "with: add --enable-mixed-chunk, or unset SGLANG_CPP_BATCH_POLICY")
        if self.even_decodes and self.policy == "sglang":
            raise ValueError("SGLANG_CPP_EVEN_DECODES=1 is part of gLLM's throttling: set SGLANG_CPP_BATCH_POLICY=gllm "
                             "or time (with --enable-mixed-chunk), or unset SGLANG_CPP_EVEN_DECODES")
        if self.policy == "time" and not self.has_cost:
            raise ValueError("SGLANG_CPP_BATCH_POLICY=time sizes chunks with the cost model t(L, x): run with "
                             "--enable-dynamic-chunking and SGLANG_CPP_POLICY=plan (calibrated or "
                             "SGLANG_CPP_PROFILE), or use SGLANG_CPP_BATCH_POLICY=gllm")


class BatchPolicy:
    """Per micro-batch: a token budget (gllm) or a millisecond budget spent request by request (time)."""

    def __init__(self, cfg: BatchConfig, *, kv_capacity: int, depth: int, cost=None, log=None,
                 throttle: GLLMThrottle | None = None):
        self.cfg, self.kv_capacity, self.depth, self.cost, self.log = cfg, int(kv_capacity), int(depth), cost, log
        self.throttle = throttle or GLLMThrottle()
        self.turn = 0  # micro-batches formed: a replicated counter that tags the log
        self.ms_left: float | None = None  # the time policy's budget for the micro-batch being formed

    def _pred(self, L: float, x: float) -> float:
        return float(self.cost.time(np.array([float(L)]), np.array([float(x)]))[0])

    def prefill_tokens(self, waiting_tokens: int, kv_used: int, pending: bool, page: int) -> int:
        """gLLM eq. 3 on this server's state; at least a page while a chunked request is mid-prompt (its
        KV is held, so starving it would hold memory without progress)."""
        view = View(waiting=(), decodes=(), kv_free=max(self.kv_capacity - kv_used, 0), kv_capacity=self.kv_capacity,
                    running=0, decoding=0, depth=self.depth, waiting_tokens=waiting_tokens)
        tokens = self.throttle.prefill_tokens(view)
        return max(tokens, page) if pending else tokens

    def start_batch(self, waiting_tokens: int, kv_used: int, pending: bool, page: int) -> int | None:
        """The token cap of the micro-batch about to be formed (None: SGLang's own)."""
        if self.cfg.policy == "sglang":
            return None
        tokens = self.prefill_tokens(waiting_tokens, kv_used, pending, page)
        self.turn += 1
        self.ms_left = time_budget(self._pred, tokens) if self.cfg.policy == "time" else None
        if self.log is not None:
            self.log.write("batch", turn=self.turn, policy=self.cfg.policy, waiting_tokens=int(waiting_tokens),
                           kv_used=int(kv_used), kv_capacity=self.kv_capacity, tokens=int(tokens),
                           budget_ms=None if self.ms_left is None else round(self.ms_left, 6))
        return tokens

    def chunk_for(self, rid: str, prefix: int, remaining: int, page: int) -> int | None:
        """The time policy: the tokens of this request that fit the milliseconds left, over its prefix
        (page-aligned unless it ends the prompt); spends them. None when no budget applies."""
        if self.ms_left is None:
            return None
        x, spent = time_chunk(self._pred, prefix, remaining, self.ms_left, align=page)
        self.ms_left -= spent
        if self.log is not None:
            self.log.write("batch_chunk", turn=self.turn, rid=rid, prefix=int(prefix), remaining=int(remaining),
                           chunk=int(x))
        return x

    def admit_cap(self, loads: list[int], slot: int, waiting: int) -> int:
        """How many more requests slot `slot` may admit (eq. 4's even split); logged as `admit_cap`."""
        cap = even_share(loads, slot, waiting)
        if self.log is not None:
            self.log.write("admit_cap", turn=self.turn, slot=int(slot), loads=[int(n) for n in loads],
                           waiting=int(waiting), cap=int(cap))
        return cap


def slot_loads(sched, slot: int, running_bs: int) -> list[int]:
    """Each PP micro-batch slot's requests that will decode next: its running batch plus what its last
    launched batch admitted (merged into the running batch only when the slot is scheduled again), minus
    the request still being chunked. The slot being scheduled counts `running_bs`, as SGLang does.
    All of it is replicated: every rank reaches this point with the same slots."""
    loads = []
    for j, (running, launched) in enumerate(zip(sched.running_mbs, sched.mbs)):
        if j == slot:
            loads.append(int(running_bs))
            continue
        reqs = {id(r): r for r in list(running.reqs) + list(launched.reqs if launched is not None else ())}
        loads.append(sum(1 for r in reqs.values() if r is not sched.chunked_req and not r.finished()))
    return loads


__all__ = ["BATCH_POLICIES", "BatchConfig", "BatchPolicy", "slot_loads"]
