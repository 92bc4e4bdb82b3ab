"""Micro-batch policies for PP serving under mixed load: which prefill tokens and which decodes go into
the next micro-batch. Pure decision logic on a small view of the scheduler's state, so the serving
simulator (serving_sim.py) and a server hook can run the same objects.

- `sglang`:   SGLang's default. Each micro-batch slot keeps its own running requests (a request joins
              the slot that ran its last prefill chunk): a prefill batch of up to
              --chunked-prefill-size tokens whenever requests wait (prefill first), else a decode batch
              of the slot's ready requests; `mixed=True` is --enable-mixed-chunk (the slot's decodes
              ride in the prefill batch, their tokens taken from its budget).
- `gllm`:     gLLM Token Throttling (seeds digest 3.2, eqs. 1-4): prefill tokens #WP/#T bounded by free
              KV, decodes split evenly over the pipeline depth.
- `time`:     ours. gLLM's throttle in predicted milliseconds instead of tokens: every micro-batch gets
              the same predicted time, and a chunk over a long prefix gets fewer tokens, sized with
              t(L, x) (gLLM's stated limitation: it counts tokens, not time).
- `tdpipe`:   TD-Pipe's temporal disaggregation (digest 2.2): prefill-only phases while the KV the
              admitted requests will grow to fits, decode-only phases with work spread evenly, and a
              switch back to prefill when decode intensity falls.
SiPipe's CPU sampling is not a batch policy; it is the simulator's `cpu_sampling` switch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class WaitingReq:
    """A request with prefill tokens left: `prefix` tokens already scheduled (or cached)."""

    rid: int
    prefix: int
    remaining: int
    output_len: int = 1
    admitted: bool = False  # KV already reserved (a chunk of it was scheduled)


@dataclass(frozen=True)
class View:
    """What a policy may look at when it forms a micro-batch."""

    waiting: object  # WaitingReq in arrival order (a sequence; the simulator builds it lazily)
    decodes: object  # (rid, context length, slot) of decode-ready requests, arrival order; sliceable
    kv_free: int  # tokens not reserved
    kv_capacity: int
    running: int  # requests admitted and not finished (decoding, in flight or mid-prefill)
    decoding: int  # requests past their first token and not finished (ready or in flight): gLLM's #RD
    depth: int  # micro-batches the pipeline holds (PP size)
    predict_ms: object = None  # (L array, x array) -> ms per chunk of the slowest stage
    decode_ms: object = None  # (batch size, total context) -> ms of a decode micro-batch, slowest stage
    waiting_tokens: int = -1  # prefill tokens waiting in all requests (gLLM's #WP); -1: sum `waiting`
    slot: int = 0  # the micro-batch slot being scheduled (SGLang's mb_id)

    @property
    def wp(self) -> int:
        return self.waiting_tokens if self.waiting_tokens >= 0 else sum(w.remaining for w in self.waiting)

    @property
    def kv_free_frac(self) -> float:
        return self.kv_free / self.kv_capacity if self.kv_capacity else 0.0


@dataclass(frozen=True)
class Batch:
    prefill: tuple = ()  # (rid, x tokens)
    decodes: tuple = ()  # rid

    def __bool__(self) -> bool:
        return bool(self.prefill or self.decodes)


def _fill(view: View, budget: float, take) -> list[tuple[int, int]]:
    """First come, first served: whole requests while the budget lasts, the last one cut by
    take(request, budget) -> (tokens, budget spent); a new request reserves all its KV, and one that
    does not fit stops the fill (no one overtakes it)."""
    out, kv = [], view.kv_free
    for w in view.waiting:
        if budget <= 0:
            break
        need = 0 if w.admitted else w.remaining + w.output_len
        if need > kv:
            break
        x, spent = take(w, budget)
        if x <= 0:
            break
        out.append((w.rid, x))
        kv -= need
        budget -= spent
    return out


def _fill_tokens(view: View, budget: int) -> list[tuple[int, int]]:
    """A budget in tokens: each request takes what is left of it."""
    return _fill(view, budget, lambda w, b: (min(w.remaining, b),) * 2)


def _even_decodes(view: View) -> tuple:
    """The decodes split evenly over the micro-batches in flight: ceil(#RD / depth) of the ready ones
    (all of them when fewer are ready; the ceiling keeps a remainder from waiting a whole round)."""
    return tuple(r for r, *_ in view.decodes[:max(1, -(-view.decoding // view.depth))])


def even_share(loads, slot: int, waiting: int) -> int:
    """Eq. 4 where a request stays in the micro-batch slot that prefilled it (SGLang): the requests slot
    `slot` may still admit so that it holds no more than its even share ceil((#RD + waiting) / slots) of
    the decodes to come. `loads` is each slot's running requests; `waiting` the requests queued."""
    share = -(-(sum(loads) + waiting) // len(loads))
    return max(share - loads[slot], 0)


@dataclass
class SGLangDefault:
    """SGLang 0.5.23's default scheduling: prefill first, separate prefill and decode batches."""

    chunk: int = 2048  # --chunked-prefill-size
    mixed: bool = False  # --enable-mixed-chunk
    name: str = "sglang"

    def schedule(self, view: View) -> Batch:
        dec = tuple(r for r, _, slot in view.decodes if slot == view.slot)  # this slot's running requests
        if self.mixed:
            return Batch(tuple(_fill_tokens(view, self.chunk - len(dec))), dec)
        pre = _fill_tokens(view, self.chunk)
        return Batch(tuple(pre)) if pre else Batch((), dec)


@dataclass
class GLLMThrottle:
    """gLLM Token Throttling with the paper's defaults (#T=8, #MaxP=2048, #MinP=32, KV_thresh=0.05)."""

    iters: int = 8  # #T
    max_p: int = 2048  # #MaxP
    min_p: int = 32  # #MinP
    kv_thresh: float = 0.05
    name: str = "gllm"

    def prefill_tokens(self, view: View) -> int:
        """Eq. 3: max(min(#WP/#T, #MaxP (KV_free - thresh)/(1 - thresh)), #MinP), 0 below the threshold,
        never more than is waiting."""
        wp = view.wp
        if wp == 0 or view.kv_free_frac < self.kv_thresh:
            return 0
        kv = self.max_p * (view.kv_free_frac - self.kv_thresh) / (1.0 - self.kv_thresh)
        return int(min(max(min(wp / self.iters, kv), self.min_p), wp))

    def decode_split(self, view: View) -> tuple:
        """Eq. 4: #D = #RD / depth (all of them when fewer are ready)."""
        return _even_decodes(view)

    def schedule(self, view: View) -> Batch:
        return Batch(tuple(_fill_tokens(view, self.prefill_tokens(view))), self.decode_split(view))


@dataclass
class TimeThrottle(GLLMThrottle):
    """gLLM's throttle in predicted time: the micro-batch's budget is the time #P tokens would take at
    prefix 0, and each chunk is sized by t(L, x) over its own prefix, so a chunk deep into a long prompt
    gets fewer tokens and every micro-batch takes about the same time."""

    name: str = "time"

    def schedule(self, view: View) -> Batch:
        dec = self.decode_split(view)
        tokens = self.prefill_tokens(view)
        if tokens <= 0 or view.predict_ms is None:
            return Batch(tuple(_fill_tokens(view, tokens)), dec)
        pred = lambda L, x: float(view.predict_ms(np.array([float(L)]), np.array([float(x)]))[0])  # noqa: E731
        return Batch(tuple(_fill(view, time_budget(pred, tokens), lambda w, ms: time_chunk(pred, w.prefix, w.remaining,
                                                                                            ms))), dec)


def time_budget(pred, tokens: int) -> float:
    """The time policy's micro-batch budget: what `tokens` prefill tokens take at prefix 0 (ms beyond
    the fixed per-batch cost)."""
    return pred(0, tokens) - pred(0, 0)


def time_chunk(pred, prefix: int, remaining: int, ms: float, align: int = 1) -> tuple[int, float]:
    """The chunk of a request with `remaining` tokens over `prefix` that fits `ms`, and the ms it spends
    (its time beyond the fixed per-batch cost, so the prefix terms count); aligned down unless it ends
    the prompt, at least one alignment unit (a long prefix never starves)."""
    zero = pred(0, 0)
    x = _tokens_within(pred, prefix, remaining, ms + zero)
    if x < remaining:
        x = min(remaining, max(align, x // align * align))
    return x, pred(prefix, x) - zero


def _tokens_within(pred, L: int, most: int, T: float) -> int:
    """Largest x <= most with pred(L, x) <= T (bisection on a monotone cost; at least 1 token so a long
    prefix never starves)."""
    f = lambda x: pred(L, x)  # noqa: E731
    if f(most) <= T:
        return most
    lo, hi = 1, most
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if f(mid) <= T else (lo, mid)
    return lo


@dataclass
class TDPipe:
    """TD-Pipe: prefill-only and decode-only phases. Prefill admits requests greedily while the KV they
    will grow to (input + output, reserved at admission) fits; it switches to decode when the next
    request does not fit or nothing waits. Decode splits the ready requests evenly over the depth
    (work stealing keeps micro-batches equal) and switches back to prefill when the running requests
    fall below `switch_frac` of the phase's peak, the point where decode intensity no longer pays."""

    chunk: int = 2048
    switch_frac: float = 0.5
    name: str = "tdpipe"
    phase: str = field(default="prefill", init=False)
    peak: int = field(default=0, init=False)

    def schedule(self, view: View) -> Batch:
        if self.phase == "decode":
            self.peak = max(self.peak, view.decoding)
            if view.wp and view.decoding < self.switch_frac * self.peak:
                self.phase = "prefill"
        if self.phase == "prefill":
            pre = _fill_tokens(view, self.chunk)
            if pre:
                return Batch(tuple(pre))
            if not view.decoding:  # nothing to decode either: wait for KV or arrivals
                return Batch()
            self.phase, self.peak = "decode", view.decoding
        return Batch((), _even_decodes(view))


POLICIES = {"sglang": SGLangDefault, "sarathi": lambda **kw: SGLangDefault(mixed=True, name="sarathi", **kw),
            "gllm": GLLMThrottle, "time": TimeThrottle, "tdpipe": TDPipe}


def make_policy(name: str, **kw):
    """A fresh policy object (policies keep per-run state, e.g. TD-Pipe's phase)."""
    if name not in POLICIES:
        raise ValueError(f"batch policy {name!r}: choose one of {', '.join(POLICIES)}")
    return POLICIES[name](**kw)


__all__ = ["View", "WaitingReq", "Batch", "even_share", "time_budget", "time_chunk", "SGLangDefault", "GLLMThrottle", "TimeThrottle", "TDPipe", "POLICIES",
           "make_policy"]
