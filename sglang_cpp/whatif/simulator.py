"""Discrete-event simulator of chunked pipeline-parallel prefill (SGLang CPP).

Why: the planner optimises sum(t) + (P-1)*max(t), which is exact only for equal stages and free
communication. The simulator replays a chunk plan with per-stage cost models, P2P transfers and
per-chunk CPU overhead, so a plan can be judged under upstream's real send/receive semantics
(async send, serial blocking receive) and dumped as a Perfetto timeline.

Model: chunk k runs on stage s after stage s finished chunk k-1 and chunk k arrived from stage s-1.
  send_mode "sync":      the sender is blocked until its transfer completes (rendezvous with the receiver).
  send_mode "deferred":  the sender moves on at once; only the arrival time matters downstream.
  recv_mode "serial":    upstream's per-tensor blocking recv: the transfer starts only when the receiver
                         is free, and the receiver is blocked for it (no overlap with its compute).
  recv_mode "batched":   receives are pre-posted: the transfer overlaps the receiver's compute.
Each chunk then costs o_s(x) + t_s(L, x) on stage s: the stage's per-chunk overhead (the cost's carrier,
PipelineCost.overheads; an "overhead" event in the trace) and its forward.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.costmodel import ChunkOverhead


SEND_MODES = ("sync", "deferred")
RECV_MODES = ("serial", "batched")


@dataclass(frozen=True)
class SimConfig:
    """Communication knobs. The defaults are upstream SGLang's modes with free P2P. The per-chunk overhead
    is the cost's (PipelineCost.overheads), not a knob here."""

    p2p_latency_ms: float = 0.0
    p2p_bandwidth_gbps: float = math.inf  # GB/s
    hidden_size: int = 0
    dtype_bytes: int = 2
    send_mode: str = "deferred"
    recv_mode: str = "serial"

    def __post_init__(self):
        v = self.p2p_latency_ms
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise ValueError(f"SimConfig.p2p_latency_ms={v!r} must be a finite number >= 0")
        bw = self.p2p_bandwidth_gbps
        if not (isinstance(bw, (int, float)) and bw > 0) or math.isnan(bw):
            raise ValueError(f"SimConfig.p2p_bandwidth_gbps={bw!r} must be > 0 (use inf for free transfers)")
        for name in ("hidden_size", "dtype_bytes"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"SimConfig.{name}={v!r} must be an integer >= 0")
        if self.send_mode not in SEND_MODES:
            raise ValueError(f"SimConfig.send_mode={self.send_mode!r}: choose one of {SEND_MODES}")
        if self.recv_mode not in RECV_MODES:
            raise ValueError(f"SimConfig.recv_mode={self.recv_mode!r}: choose one of {RECV_MODES}")

    def transfer_ms(self, x):
        """P2P time of a chunk of x tokens: latency + x*hidden*dtype_bytes / bandwidth."""
        nbytes = np.asarray(x, dtype=float) * self.hidden_size * self.dtype_bytes
        return self.p2p_latency_ms + nbytes / (self.p2p_bandwidth_gbps * 1e9) * 1e3


@dataclass(frozen=True)
class Event:
    stage: int
    chunk: int  # index within its request
    request: int
    start: float  # ms
    end: float
    kind: str  # compute | overhead | plan | send | recv
    L: int = 0
    x: int = 0
    blocking: bool = True  # False: an in-flight transfer that does not occupy the stage


@dataclass(frozen=True)
class SimResult:
    pp_size: int
    makespan_ms: float
    ttfts_ms: tuple
    arrivals_ms: tuple
    busy_ms: tuple  # per stage: planning + per-chunk overhead + compute (the planner models the last two)
    comm_ms: tuple  # per stage: time blocked in sync sends / serial receives
    events: tuple = field(repr=False)
    config: SimConfig = field(default_factory=SimConfig)

    @property
    def ttft_ms(self) -> float:
        """TTFT (prefill completion) of the single request; the mean over requests when several."""
        return float(np.mean(self.ttfts_ms))

    @property
    def idle_ms(self) -> tuple:
        """Per stage, time in [0, makespan] not spent on its own chunk work (includes comm blocking)."""
        return tuple(self.makespan_ms - b for b in self.busy_ms)

    @property
    def bubble_ratio(self) -> float:
        return sum(self.idle_ms) / (self.pp_size * self.makespan_ms) if self.makespan_ms > 0 else 0.0

    def to_dict(self) -> dict:
        """Summary without the event list (the trace carries those)."""
        return {"pp_size": self.pp_size, "ttft_ms": self.ttft_ms, "ttfts_ms": list(self.ttfts_ms),
                "arrivals_ms": list(self.arrivals_ms), "makespan_ms": self.makespan_ms,
                "bubble_ratio": self.bubble_ratio, "busy_ms": list(self.busy_ms),
                "idle_ms": list(self.idle_ms), "comm_ms": list(self.comm_ms),
                "num_chunks": sum(1 for e in self.events if e.kind == "compute" and e.stage == 0),
                "config": {k: getattr(self.config, k) for k in self.config.__dataclass_fields__}}

    def to_chrome_trace(self) -> dict:
        """Chrome/Perfetto JSON: one thread per stage; non-blocking transfers on a 'link' thread."""
        P = self.pp_size
        out = [{"name": "process_name", "ph": "M", "pid": "pipeline", "args": {"name": "pipeline"}}]
        for s in range(P):
            out.append({"name": "thread_name", "ph": "M", "pid": "pipeline", "tid": s,
                        "args": {"name": f"stage {s}"}})
            out.append({"name": "thread_sort_index", "ph": "M", "pid": "pipeline", "tid": s,
                        "args": {"sort_index": s}})
        links = sorted({e.stage for e in self.events if not e.blocking})
        for s in links:
            out.append({"name": "thread_name", "ph": "M", "pid": "pipeline", "tid": P + s,
                        "args": {"name": f"stage {s} p2p (async)"}})
        for e in self.events:
            out.append({"name": f"{e.kind} r{e.request}c{e.chunk}", "cat": e.kind, "ph": "X",
                        "pid": "pipeline", "tid": e.stage if e.blocking else P + e.stage,
                        "ts": e.start * 1e3, "dur": (e.end - e.start) * 1e3,
                        "args": {"L": e.L, "x": e.x, "request": e.request, "chunk": e.chunk}})
        return {"traceEvents": out, "displayTimeUnit": "ms"}

    def save_trace(self, path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_chrome_trace()))
        return p

    def summary(self) -> str:
        lines = [f"TTFT {self.ttft_ms:.2f} ms  makespan {self.makespan_ms:.2f} ms  "
                 f"bubble {self.bubble_ratio:.1%}  pp={self.pp_size}"]
        if len(self.ttfts_ms) > 1:
            lines.append("per-request TTFT ms: " + ", ".join(f"{t:.2f}" for t in self.ttfts_ms))
        for s in range(self.pp_size):
            lines.append(f"  stage {s:>2}: busy {self.busy_ms[s]:10.2f} ms  idle {self.idle_ms[s]:10.2f} ms"
                         f"  (comm-blocked {self.comm_ms[s]:.2f} ms)")
        return "\n".join(lines)


# -- inputs -----------------------------------------------------------------------------------
def _as_plan(plan, prefix_len) -> tuple[list[int], int]:
    """(chunks, prefix) from a ChunkPlan-like object or a plain sequence plus prefix_len."""
    if hasattr(plan, "chunks"):
        chunks, L0 = plan.chunks, getattr(plan, "prefix_len", 0) if prefix_len is None else prefix_len
    else:
        chunks, L0 = plan, 0 if prefix_len is None else prefix_len
    try:
        chunks = [int(c) for c in chunks]
    except (TypeError, ValueError):
        raise ValueError(f"chunk plan {plan!r}: expected a sequence of integer chunk sizes") from None
    if not chunks or any(c < 1 for c in chunks):
        raise ValueError(f"chunk plan {chunks}: needs at least one chunk, every chunk >= 1 token")
    if int(L0) < 0:
        raise ValueError(f"prefix_len={L0} must be >= 0")
    return chunks, int(L0)


def _stage_costs(cost, pp_size, plan_pp=None) -> tuple[list, list]:
    """One cost model per stage from a list, a PipelineCost (.stages) or one shared model, and each stage's
    per-chunk overhead (the PipelineCost's carrier; a lone stage carrying one is every stage's)."""
    over = list(getattr(cost, "overheads", ()) or ())
    if over and len(cost.stages) == 1 and pp_size is not None and pp_size > 1:  # one model for every stage
        return [cost.stages[0]] * int(pp_size), over * int(pp_size)  # (a PipelineCost carrying its overhead)
    if isinstance(cost, (list, tuple)):
        models = list(cost)
    elif getattr(cost, "stages", None) is not None and pp_size is not None and len(cost.stages) != pp_size:
        raise ValueError(f"cost has {len(cost.stages)} stage models but pp_size={pp_size}; "
                         "pass one model, or one per stage")
    elif getattr(cost, "stages", None) is not None:
        models = list(cost.stages)
    else:
        P = pp_size if pp_size is not None else plan_pp
        if P is None:
            raise ValueError("pp_size is required with a single cost model")
        models = [cost] * int(P)
    if pp_size is not None and len(models) != pp_size:
        raise ValueError(f"got {len(models)} stage cost models but pp_size={pp_size}; give one per stage")
    if not models or any(not hasattr(m, "time") for m in models):
        raise ValueError("cost: every stage model needs a .time(L, x) method (e.g. a CostModel)")
    return models, over or [ChunkOverhead()] * len(models)  # a PipelineCost's carrier has one per stage


def _overhead_times(over: list, x: np.ndarray, fixed: float | None = None) -> list:
    """[stage][chunk] ms of each stage's per-chunk overhead for chunks of x tokens (`fixed`: that many ms
    instead, whatever the stage)."""
    return [np.broadcast_to(ov.at(x) if fixed is None else float(fixed), x.shape).tolist() for ov in over]


def _times(model, L: np.ndarray, x: np.ndarray, stage: int) -> np.ndarray:
    t = np.broadcast_to(np.asarray(model.time(L.astype(float), x.astype(float)), dtype=float), L.shape)
    if not np.all(np.isfinite(t)) or np.any(t < 0):
        raise ValueError(f"stage {stage} cost model returned a negative or non-finite time; check its coefficients")
    return t


# -- engine -----------------------------------------------------------------------------------
def _run(jobs: list[tuple], staged: tuple[list, list], cfg: SimConfig, arrivals: list[float]) -> SimResult:
    """jobs: (request, chunk index, L, x, release ms, planning ms) in FIFO order; staged: (models, overheads)
    per stage. The planning time of a chunk (the decision that cut it) occupies every stage from when it is
    free and the request has arrived: every stage computes the same decision on its scheduler thread before
    it launches the chunk, while it may still wait for the chunk's activations."""
    costs, over = staged
    P = len(costs)
    L = np.array([j[2] for j in jobs])
    x = np.array([j[3] for j in jobs])
    T = np.stack([_times(m, L, x, s) for s, m in enumerate(costs)]).tolist()
    O = _overhead_times(over, x)
    tr = np.broadcast_to(cfg.transfer_ms(x), x.shape).tolist()
    sync, serial = cfg.send_mode == "sync", cfg.recv_mode == "serial"
    free = [0.0] * P
    busy, comm = [0.0] * P, [0.0] * P
    ends: dict[int, float] = {}
    ev: list[Event] = []
    for k, (r, c, Lk, xk, release, plan_ms) in enumerate(jobs):
        meta = {"chunk": c, "request": r, "L": int(Lk), "x": int(xk)}
        prev_end = 0.0
        for s in range(P):
            if plan_ms > 0:
                p0 = max(free[s], release)
                ev.append(Event(s, start=p0, end=p0 + plan_ms, kind="plan", **meta))
                free[s] = p0 + plan_ms
                busy[s] += plan_ms
            if s == 0:
                start = max(free[0], release)
            else:
                t0 = max(prev_end, free[s]) if serial else prev_end
                t1 = t0 + tr[k]
                if sync:
                    free[s - 1] = max(free[s - 1], t1)
                    comm[s - 1] += t1 - prev_end
                if serial:
                    comm[s] += t1 - t0
                if sync and t1 > prev_end:
                    ev.append(Event(s - 1, start=prev_end, end=t1, kind="send", **meta))
                if serial and t1 > t0:
                    ev.append(Event(s, start=t0, end=t1, kind="recv", **meta))
                if not (sync or serial) and t1 > t0:  # in flight, occupies neither stage
                    ev.append(Event(s - 1, start=t0, end=t1, kind="send", blocking=False, **meta))
                start = max(free[s], t1)
            o = O[s][k]
            if o > 0:
                ev.append(Event(s, start=start, end=start + o, kind="overhead", **meta))
            end = start + o + T[s][k]
            ev.append(Event(s, start=start + o, end=end, kind="compute", **meta))
            busy[s] += o + T[s][k]
            free[s] = prev_end = end
        ends[r] = prev_end
    makespan = max(max(free), max(ends.values()))
    ttfts = tuple(ends[r] - arrivals[r] for r in range(len(arrivals)))
    return SimResult(pp_size=P, makespan_ms=makespan, ttfts_ms=ttfts, arrivals_ms=tuple(arrivals),
                     busy_ms=tuple(busy), comm_ms=tuple(comm), events=tuple(ev), config=cfg)


def simulate(plan, cost, pp_size: int | None = None, config: SimConfig | None = None, *,
             prefix_len: int | None = None) -> SimResult:
    """Simulate one request's chunk plan (a ChunkPlan or a list of chunk sizes) arriving at t = 0."""
    return simulate_requests([(0.0, plan)], cost, pp_size, config, prefix_len=prefix_len)


def simulate_requests(requests, cost, pp_size: int | None = None, config: SimConfig | None = None, *,
                      prefix_len: int | None = None, planning_ms=None) -> SimResult:
    """FIFO over requests [(arrival_ms, plan), ...]: all chunks of one request before the next's.
    `planning_ms`: per request, the planning time charged before each of its chunks (a "plan" event on
    every stage); None charges none.

    TTFT here is prefill completion: last chunk leaves the last stage, minus arrival."""
    cfg = config if config is not None else SimConfig()
    if pp_size is not None and (not isinstance(pp_size, (int, np.integer)) or pp_size < 1):
        raise ValueError(f"pp_size={pp_size!r} must be an integer >= 1")
    requests = list(requests)
    if not requests:
        raise ValueError("simulate_requests: give at least one (arrival_ms, plan) pair")
    jobs, arrivals, plan_pp = [], [], None
    for r, item in enumerate(requests):
        try:
            arrival, plan = item
        except (TypeError, ValueError):
            raise ValueError(f"request {r}: expected an (arrival_ms, plan) pair, got {item!r}") from None
        if not (math.isfinite(arrival) and arrival >= 0):
            raise ValueError(f"request {r}: arrival_ms={arrival!r} must be a finite number >= 0")
        chunks, L = _as_plan(plan, prefix_len)
        plan_pp = plan_pp or getattr(plan, "pp_size", None)
        charge = [0.0] * len(chunks) if planning_ms is None else [float(d) for d in planning_ms[r]]
        if len(charge) != len(chunks) or not all(math.isfinite(d) and d >= 0 for d in charge):
            raise ValueError(f"request {r}: planning_ms {charge} must give one finite time >= 0 per chunk "
                             f"({len(chunks)} chunks)")
        for c, xk in enumerate(chunks):
            jobs.append((r, c, L, xk, float(arrival), charge[c]))
            L += xk
        arrivals.append(float(arrival))
    jobs.sort(key=lambda j: (j[4], j[0], j[1]))  # FIFO by arrival, stable in request order
    return _run(jobs, _stage_costs(cost, pp_size, plan_pp), cfg, arrivals)


__all__ = ["SimConfig", "SimResult", "Event", "simulate", "simulate_requests", "SEND_MODES", "RECV_MODES"]
