"""The offered load a plan counts on: how many prompts are expected to arrive while this one is served.

Why: the queue-aware plan (core/queue_plan.py) weighs this prompt's latency against the prompts waiting
behind it. In a steady stream the prompts that arrive *during* this prompt's service wait behind its chunks
too, and queueing delay grows like 1/(1 - load): near saturation a few percent of throughput lost to small
chunks costs more than the drain they save. A plan that only sees the prompts already waiting cuts the first
prompt of a quiet moment for its own latency and makes every later arrival pay for it.

The estimate is Poisson's maximum-likelihood rate over the last `WINDOW` arrivals, from what every PP stage
shares: the arrival stamps and prompt lengths of the requests, whether each found prefill work ahead of it,
and a `now` the caller derives from shared data (the simulator's clock; the server's `ArrivalClock`: the
newest arrival stamp, taken by PP0's leader and relayed with the requests, plus the predicted time of the
chunks issued since). Never a stage's own wall clock, so every stage derives the same number:

    rate = (n - 1) / max(now - t_first, horizon)        n arrivals in the window, t_first the oldest

The floor `horizon` (the predicted time until the prompts in view complete) keeps a burst that arrived all
at once from reading as an infinite rate: n - 1 arrivals within one horizon predict about n - 1 more in the
next. The plan then counts the prompts of the window's mean length that arrive within the horizon, and those
that arrive while these are served in turn (S each, the pipeline's time per prompt at full throughput):
m = rate * horizon / (1 - rate * S), the queue's fixed point, capped by the room in the view and by the
arrivals in the window that found prefill work ahead of them (`busy`, at most n - 1). They stand behind the
prompts it sees, the k-th with weight min(1, m - k) (`expected_behind`).

Why the `busy` cap: Poisson arrivals see time averages (PASTA), so about a fraction `load` of them find
the pipe busy, and the cap rarely binds in a stream. A closed-loop client that sends its next prompt only
after the last one is answered has a rate as high as the pipe's throughput, yet every prompt it sends finds
the pipe empty and nothing ever waits behind it: its prompts are planned as today's single-prompt plan.
Limits: a closed loop of concurrency C > 1 still reads as a saturated stream (it counts up to n - 1
expected prompts where at most C - 1 can come); the estimate trails a change of rate
by up to `WINDOW` arrivals; lengths are the window's mean, not a distribution; an expected prompt is priced
as if it waited from now (an upper bound on its wait). With fewer than two arrivals there is no estimate and
the plan is the one the visible queue gives. Pure python arithmetic in a fixed order: no reductions whose
order a library chooses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

WINDOW = 16  # arrivals the rate is read from (the queue view's depth, core/queue_plan.MAX_WAITING)


@dataclass(frozen=True)
class Load:
    """An offered-load estimate: `n` arrivals in the window, the oldest `span_ms` before now, of mean length
    `mean_len` tokens, `busy` of them found prefill work ahead of them. The rate is read at a horizon
    (`rate_per_ms`), so a burst is never infinite."""

    n: int = 0
    span_ms: float = 0.0
    mean_len: int = 0
    busy: int = 0

    def __post_init__(self):
        if (int(self.n) < 0 or int(self.mean_len) < 0 or not 0 <= int(self.busy) <= int(self.n)
                or not (math.isfinite(self.span_ms) and self.span_ms >= 0)):
            raise ValueError(f"load estimate {self}: need n >= 0, mean_len >= 0, 0 <= busy <= n and a finite "
                             "span_ms >= 0")
        for k in ("n", "mean_len", "busy"):
            object.__setattr__(self, k, int(getattr(self, k)))
        object.__setattr__(self, "span_ms", float(self.span_ms))

    @property
    def known(self) -> bool:
        return self.n >= 2 and self.mean_len >= 1

    def rate_per_ms(self, horizon_ms: float) -> float:
        """Arrivals per ms: (n - 1) over the span, the span at least `horizon_ms` (0 without an estimate)."""
        if not self.known:
            return 0.0
        span = max(self.span_ms, float(horizon_ms))
        return (self.n - 1) / span if span > 0 else 0.0

    def expected_within(self, horizon_ms: float) -> float:
        """The prompts expected to arrive within `horizon_ms` from now."""
        return self.rate_per_ms(horizon_ms) * max(float(horizon_ms), 0.0)

    def to_dict(self) -> dict:
        return {"n": self.n, "span_ms": round(self.span_ms, 3), "mean_len": self.mean_len, "busy": self.busy}

    @classmethod
    def from_dict(cls, d: dict | None) -> "Load":
        d = d or {}
        return cls(int(d.get("n", 0)), float(d.get("span_ms", 0.0)), int(d.get("mean_len", 0)),
                   int(d.get("busy", 0)))


def estimate_load(arrivals, now_ms: float, window: int = WINDOW) -> Load:
    """The estimate from `arrivals`, ((arrival_ms, prompt_len, busy), ...) in arrival order (`busy`: it found
    prefill work ahead of it), at `now_ms`: the last `window` of those that arrived by now. Integer mean
    length (floor), sums in list order."""
    seen = [(float(t), int(n), bool(b)) for t, n, b in arrivals if float(t) <= now_ms][-int(window):]
    if len(seen) < 2:
        return Load()
    total = busy = 0
    for _, n, b in seen:
        total += n
        busy += int(b)
    return Load(len(seen), max(float(now_ms) - seen[0][0], 0.0), total // len(seen), busy)


class ArrivalClock:
    """The server's arrivals as every PP stage sees them: each request's stamp (PP0 leader's clock when it
    pulled the request, relayed with it), prompt length and whether it found prefill work ahead of it, and
    `now` = the newest stamp plus the predicted time of the chunks issued since (`issue`, once per decided
    chunk). Every stage feeds it the same values at the same point of the request stream, so every stage
    reads the same estimate; no stage's own clock enters it."""

    def __init__(self, window: int = WINDOW):
        self.window = int(window)
        self.recent: list[tuple[float, int, bool]] = []
        self.stamp_ms: float | None = None
        self.issued_ms = 0.0

    def arrive(self, t_ms: float, prompt_len: int, busy: bool) -> None:
        t = float(t_ms) if self.stamp_ms is None else max(float(t_ms), self.stamp_ms)  # one clock never goes back
        self.recent = (self.recent + [(t, int(prompt_len), bool(busy))])[-self.window:]
        if self.stamp_ms is None or t > self.stamp_ms:
            self.issued_ms = 0.0
        self.stamp_ms = t

    def issue(self, ms: float | None) -> None:
        if self.stamp_ms is not None and ms is not None and math.isfinite(ms) and ms > 0:
            self.issued_ms += float(ms)

    @property
    def now_ms(self) -> float:
        return 0.0 if self.stamp_ms is None else self.stamp_ms + self.issued_ms

    def load(self) -> Load:
        return estimate_load(self.recent, self.now_ms, self.window)


def expected_behind(load: Load | None, horizon_ms: float, room: int, service_ms: float = 0.0) -> list[float]:
    """Weights of the expected prompts a plan counts behind the visible queue, min(1, m - k) for k = 0, 1, ...
    while positive, at most `room` of them, at most n - 1 (no more than the window saw arrive) and at most
    `busy` (no more than the window saw arrive while prefill work was ahead of them). m counts
    the arrivals within the horizon and those arriving while the expected ones are served in turn
    (`service_ms` each, the pipeline's time per prompt at full throughput): m = rate H / (1 - rate S), every
    prompt there is room for when rate S >= 1 (a pipe that does not drain)."""
    if load is None or not load.known or room <= 0 or not horizon_ms > 0:
        return []
    rate = load.rate_per_ms(horizon_ms)
    util = rate * max(float(service_ms), 0.0)
    m = rate * float(horizon_ms) / (1.0 - util) if util < 1.0 else math.inf
    m = min(m, float(min(load.n - 1, load.busy)), float(room))
    out = []
    k = 0
    while k < room and m - k > 0:
        out.append(min(1.0, m - k))
        k += 1
    return out


__all__ = ["ArrivalClock", "Load", "WINDOW", "estimate_load", "expected_behind"]
