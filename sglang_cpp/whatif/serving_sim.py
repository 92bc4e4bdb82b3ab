"""Discrete-event simulator of PP serving under mixed load: a stream of requests, micro-batches that mix
prefill chunks and decodes, up to `depth` of them in flight, a KV capacity, and a batch policy
(batch_policy.py) deciding every micro-batch.

Why: simulator.py replays one prompt's chunks; the seed papers (gLLM, TD-Pipe, SiPipe) are about many
requests at once, where the pipeline runs at the pace of its heaviest in-flight micro-batch. This
answers "which policy, what throughput, TTFT and TPOT" before any GPU is booked.

Model. `depth` micro-batch slots (SGLang's mb_id) are visited in turn; a slot whose micro-batch is
still in flight is skipped, and the first free slot the policy gives work launches when stage 0 is
free. A micro-batch runs on
stage s after stage s finished the previous micro-batch and stage s-1 sent this one (+ p2p_latency_ms), for
    base + sum over chunks (t_s(L, x) - t_s(0, 0)) + b_s * decodes + e_s * decode context
    (+ batch_overhead_ms, + sample_ms per sampled sequence on the last stage)
with base the larger fixed cost of the parts present. A request reserves input + output KV tokens
when its first chunk is scheduled (so decodes never wait for KV, SGLang's conservative admission)
and frees them when it finishes. A decode needs its previous token: a request is in at most one
micro-batch while decoding; its prefill chunks may overlap in the pipeline (chunked PP).
SiPipe's CPU sampling (`cpu_sampling`) takes the sampling off the last stage: the stage is free at
once and the token is ready sample_ms later.
"""
from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from ..core.batch_policy import View, WaitingReq
from .serving_result import ServeResult


@dataclass(frozen=True)
class DecodeCost:
    """ms of a decode micro-batch on one stage: c0 + b * sequences + e * their total context; or, with
    `model` (a prefill t(L, x)), the linear part as a B-token chunk, model.time(0, B), which keeps a
    roofline's weight-read floor (a small decode batch is memory-bound)."""

    c0: float = 0.0
    b: float = 0.0
    e: float = 0.0
    model: object = None

    @classmethod
    def from_prefill(cls, model, ref_ctx: float = 8192.0) -> "DecodeCost":
        """A decode step is a 1-token extend: its attention grows with the context as t(L, 1) does."""
        per_ctx = (float(model.time(ref_ctx, 1.0)) - float(model.time(0.0, 1.0))) / ref_ctx
        return cls(e=max(per_ctx, 0.0), model=model)

    @classmethod
    def fit(cls, batch_size, context, ms) -> "DecodeCost":
        """c0 + b * B + e * context by non-negative least squares on measured decode forwards (the
        plugin's `decode_forward` events): from_prefill carries a prefill model's prefix terms to every
        decoding sequence (on the CPU server it priced decode steps at 1.2x what they took)."""
        from scipy.optimize import nnls

        B, C, y = (np.asarray(v, float).ravel() for v in (batch_size, context, ms))
        if not (len(B) == len(C) == len(y)) or len(y) < 3:
            raise ValueError(f"DecodeCost.fit: need >= 3 decode forwards with batch size, context and ms "
                             f"(got {len(y)}); serve some decodes with SGLANG_CPP_DECISION_LOG set")
        if not (np.all(np.isfinite(y)) and np.all(y >= 0) and np.all(B >= 1) and np.all(C >= B)):
            raise ValueError("DecodeCost.fit: each forward needs batch size >= 1, context >= batch size, ms >= 0")
        (c0, b, e), _ = nnls(np.column_stack([np.ones_like(B), B, C]), y)
        return cls(c0=float(c0), b=float(b), e=float(e))

    @property
    def fixed(self) -> float:
        return float(self.model.time(0.0, 0.0)) if self.model is not None else self.c0

    def time(self, B, ctx):
        lin = self.model.time(0.0, np.asarray(B, float)) if self.model is not None else self.c0 + self.b * np.asarray(B, float)
        return lin + self.e * np.asarray(ctx, float)


@dataclass(frozen=True)
class ServeConfig:
    kv_capacity: int = 1 << 20  # tokens of KV the pool holds (every stage holds its layers' share)
    depth: int = 0  # micro-batches in flight; 0: the PP size
    batch_overhead_ms: float = 0.0  # CPU prep per micro-batch and stage (seeds digest 7: 12-19%)
    p2p_latency_ms: float = 0.0  # per micro-batch and hop
    sample_ms: float = 0.0  # per sampled sequence, on the last stage
    cpu_sampling: bool = False  # SiPipe: sampling overlapped on the CPU, off the last stage

    def __post_init__(self):
        if not isinstance(self.kv_capacity, (int, np.integer)) or self.kv_capacity < 1:
            raise ValueError(f"ServeConfig.kv_capacity={self.kv_capacity!r} must be an integer >= 1 (tokens)")
        if not isinstance(self.depth, (int, np.integer)) or self.depth < 0:
            raise ValueError(f"ServeConfig.depth={self.depth!r} must be an integer >= 0 (0: the PP size)")
        for k in ("batch_overhead_ms", "p2p_latency_ms", "sample_ms"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"ServeConfig.{k}={v!r} must be a finite number >= 0")


@dataclass(frozen=True)
class Request:
    rid: int
    arrival_ms: float
    input_len: int
    output_len: int


@dataclass
class _State:
    req: Request
    sched: int = 0  # prefill tokens scheduled
    generated: int = 0
    admitted: bool = False
    slot: int = 0  # the micro-batch slot that ran its last prefill chunk (its decodes' home in SGLang)
    first_ms: float = math.nan
    finish_ms: float = math.nan
    token_ms: list = field(default_factory=list)


@dataclass(frozen=True)
class MicroBatch:
    index: int
    slot: int
    prefill: tuple  # (rid, L, x)
    decodes: tuple  # (rid, context)
    spans: tuple  # per stage (start, end) ms
    done_ms: float


def read_decode_log(paths) -> dict:
    """{pp_rank: DecodeCost} fitted on the `decode_forward` events of decision logs (JSON lines)."""
    from ..files import read_events

    rows: dict = {}
    for rec in read_events(paths, "decode_forward"):
        if rec.get("synchronous", True):
            rows.setdefault(int(rec["pp_rank"]), []).append((rec["batch_size"], rec["context"], rec["ms"]))
    if not rows:
        raise ValueError(f"decode log {', '.join(map(str, paths))}: no decode_forward events; serve some decodes "
                         "with SGLANG_CPP_DECISION_LOG set (sglang-cpp >= this version writes them)")
    return {rank: DecodeCost.fit(*zip(*r)) for rank, r in sorted(rows.items())}


def _slowest(models):
    return lambda L, x: np.max([np.asarray(m.time(L, x), float) for m in models], axis=0)


class _Lazy:
    """A read-only queue view built on demand: a policy reads only the head of a long queue."""

    def __init__(self, keys, make):
        self._keys, self._make = keys, make

    def __iter__(self):
        return (self._make(k) for k in self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __getitem__(self, sl: slice) -> tuple:
        return tuple(itertools.islice(self, sl.start or 0, sl.stop))


def simulate_serving(requests, prefill_costs: list, decode_costs: list, policy, config: ServeConfig | None = None,
                     ) -> ServeResult:
    """Run `policy` (a batch_policy object) over `requests` on len(prefill_costs) stages."""
    cfg = config or ServeConfig()
    P = len(prefill_costs)
    if P < 1 or len(decode_costs) != P:
        raise ValueError(f"give one prefill and one decode cost model per stage (got {len(prefill_costs)} and "
                         f"{len(decode_costs)})")
    reqs = sorted(requests, key=lambda r: (r.arrival_ms, r.rid))
    if not reqs:
        raise ValueError("simulate_serving: no requests")
    for r in reqs:
        if r.input_len < 1 or r.output_len < 1:
            raise ValueError(f"request {r.rid}: input_len and output_len must be >= 1")
        if r.input_len + r.output_len > cfg.kv_capacity:
            raise ValueError(f"request {r.rid} needs {r.input_len + r.output_len} KV tokens, more than "
                             f"kv_capacity={cfg.kv_capacity}; raise the capacity or shorten the request")
    return _Engine(reqs, prefill_costs, decode_costs, policy, cfg).run()


class _Engine:
    """The event loop's state: queues as insertion-ordered dicts, counters kept as requests move."""

    def __init__(self, reqs, pre_costs, dec_costs, policy, cfg):
        self.reqs, self.pre, self.dec, self.policy, self.cfg = reqs, pre_costs, dec_costs, policy, cfg
        self.P = len(pre_costs)
        self.st = {r.rid: _State(r) for r in reqs}
        self.fixed = [float(m.time(0.0, 0.0)) for m in pre_costs]
        self.predict, self.dec_pred = _slowest(pre_costs), _slowest(dec_costs)
        self.free, self.busy = [0.0] * self.P, [0.0] * self.P
        self.waiting, self.ready = {}, {}  # rid -> None, arrival order
        self.waiting_tokens = self.reserved = self.done = self.running = self.decoding = 0
        self.kv_log, self.batches = [(0.0, 0)], []
        self.depth = cfg.depth or self.P
        self.slot_busy, self.turn = [False] * self.depth, 0  # SGLang's mb_id slots, visited in turn

    def view(self, slot: int) -> View:
        st = self.st
        return View(waiting=_Lazy(self.waiting, lambda r: WaitingReq(r, st[r].sched, st[r].req.input_len - st[r].sched,
                                                                     st[r].req.output_len, st[r].admitted)),
                    decodes=_Lazy(self.ready, lambda r: (r, st[r].req.input_len + st[r].generated, st[r].slot)),
                    kv_free=self.cfg.kv_capacity - self.reserved, kv_capacity=self.cfg.kv_capacity,
                    running=self.running, decoding=self.decoding, depth=self.depth,
                    predict_ms=self.predict, decode_ms=self.dec_pred, waiting_tokens=self.waiting_tokens, slot=slot)

    def token(self, s: _State, t: float) -> None:
        """Request s emitted a token at t: finished, or decode-ready again."""
        s.generated += 1
        s.token_ms.append(t)
        if s.generated == 1:
            s.first_ms = t
            self.decoding += 1
        if s.generated >= s.req.output_len:
            s.finish_ms = t
            self.done += 1
            self.running -= 1
            self.decoding -= 1
            self.reserved -= s.req.input_len + s.req.output_len
        else:
            self.ready[s.req.rid] = None

    def complete(self, mb: MicroBatch, t: float) -> None:
        self.slot_busy[mb.slot] = False
        for rid, L, x in mb.prefill:
            if L + x == self.st[rid].req.input_len:  # the chunk that ends the prefill: the first token
                self.token(self.st[rid], t)
        for rid, _ in mb.decodes:
            self.token(self.st[rid], t)
        self.kv_log.append((t, self.reserved))

    def schedule(self, now: float):
        """SGLang's PP loop visits the slots in turn; a slot whose micro-batch is in flight is skipped and
        an empty one passes its turn. The first slot with work launches."""
        for i in range(self.depth):
            k = (self.turn + i) % self.depth
            if self.slot_busy[k]:
                continue
            batch = self.policy.schedule(self.view(k))
            if batch:
                self.turn = k + 1
                self.slot_busy[k] = True
                return self.launch(batch, now, k)
        return None

    def run(self) -> ServeResult:
        reqs, heap, nxt, now = self.reqs, [], 0, 0.0
        while self.done < len(reqs):
            while nxt < len(reqs) and reqs[nxt].arrival_ms <= now:
                self.waiting[reqs[nxt].rid] = None
                self.waiting_tokens += reqs[nxt].input_len
                nxt += 1
            while heap and heap[0][0] <= now:
                t, _, mb = heapq.heappop(heap)
                self.complete(mb, t)
            if self.done == len(reqs):
                break
            idle = not all(self.slot_busy)
            if self.free[0] <= now and idle:
                mb = self.schedule(now)
                if mb is not None:
                    heapq.heappush(heap, (mb.done_ms, mb.index, mb))
                    continue
            times = [reqs[nxt].arrival_ms] if nxt < len(reqs) else []
            times += [heap[0][0]] if heap else []
            if self.free[0] > now and idle:
                times.append(self.free[0])
            if not times:
                raise RuntimeError(f"serving simulation stalled at {now:.1f} ms with {len(self.waiting)} waiting and "
                                   f"{len(self.ready)} decode-ready requests: the policy {self.policy.name!r} "
                                   "schedules nothing")
            now = max(now, min(times))
        st = self.st
        return ServeResult(tuple(reqs), tuple(st[r.rid].first_ms for r in reqs), tuple(st[r.rid].finish_ms for r in reqs),
                           tuple(tuple(st[r.rid].token_ms) for r in reqs), tuple(self.batches), tuple(self.busy),
                           tuple(self.kv_log), self.P, self.policy.name)

    def launch(self, batch, now: float, slot: int) -> MicroBatch:
        """Admit and place the batch's work, then run it through the stages (FIFO at every stage)."""
        st, cfg, pre, dec = self.st, self.cfg, [], []
        for rid, x in batch.prefill:
            s = st[rid]
            if rid not in self.waiting or not 1 <= x <= s.req.input_len - s.sched:
                raise ValueError(f"batch policy scheduled {x} prefill tokens of request {rid}, which has "
                                 f"{s.req.input_len - s.sched if rid in self.waiting else 0} waiting")
            if not s.admitted:
                self.reserved += s.req.input_len + s.req.output_len
                s.admitted = True
                self.running += 1
            pre.append((rid, s.sched, x))
            s.sched += x
            self.waiting_tokens -= x
            if s.sched == s.req.input_len:
                del self.waiting[rid]
                s.slot = slot
        if self.reserved > cfg.kv_capacity:
            raise ValueError(f"batch policy over-admitted: {self.reserved} KV tokens reserved of {cfg.kv_capacity}")
        for rid in batch.decodes:
            if rid not in self.ready:
                raise ValueError(f"batch policy scheduled a decode of request {rid}, which is not decode-ready")
            del self.ready[rid]
            dec.append((rid, st[rid].req.input_len + st[rid].generated))
        mb = _run_stages(len(self.batches), slot, pre, dec, st, cfg, now, self.free, self.busy, self.fixed, self.pre,
                         self.dec)
        self.batches.append(mb)
        self.kv_log.append((now, self.reserved))
        return mb


def _run_stages(index, slot, pre, dec, st, cfg, now, free, busy, fixed, pre_costs, dec_costs) -> MicroBatch:
    P = len(pre_costs)
    L = np.array([p[1] for p in pre], float)
    x = np.array([p[2] for p in pre], float)
    B, ctx = len(dec), float(sum(c for _, c in dec))
    samples = B + sum(1 for r, l0, xx in pre if l0 + xx == st[r].req.input_len)
    spans, prev = [], now
    for s in range(P):
        t = max(fixed[s] if pre else 0.0, dec_costs[s].fixed if B else 0.0)
        if pre:
            t += float(np.sum(np.asarray(pre_costs[s].time(L, x), float) - fixed[s]))
        if B:
            t += float(dec_costs[s].time(B, ctx)) - dec_costs[s].fixed
        t += cfg.batch_overhead_ms + (cfg.sample_ms * samples if s == P - 1 and not cfg.cpu_sampling else 0.0)
        start = max(free[s], prev + (cfg.p2p_latency_ms if s else 0.0))
        free[s] = prev = start + t
        busy[s] += t
        spans.append((start, prev))
    done_ms = prev + (cfg.sample_ms * samples if cfg.cpu_sampling else 0.0)
    return MicroBatch(index, slot, tuple(pre), tuple(dec), tuple(spans), done_ms)


__all__ = ["DecodeCost", "read_decode_log", "ServeConfig", "Request", "ServeResult", "MicroBatch", "simulate_serving"]
