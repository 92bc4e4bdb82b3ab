"""What a serving simulation measured: throughput, latency percentiles, bubbles, KV occupancy and a
Perfetto trace (serving_sim.py produces it)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ServeResult:
    requests: tuple
    first_ms: tuple
    finish_ms: tuple
    token_ms: tuple  # per request: the time of every output token
    batches: tuple
    busy_ms: tuple
    kv_timeline: tuple  # (ms, tokens reserved)
    pp_size: int
    policy: str

    @property
    def makespan_ms(self) -> float:
        return max(self.finish_ms) - min(r.arrival_ms for r in self.requests)

    def throughput(self) -> dict:
        """Tokens per second over the makespan: input + output (gLLM's figure) and output only."""
        s = self.makespan_ms / 1e3
        inp, out = sum(r.input_len for r in self.requests), sum(r.output_len for r in self.requests)
        return {"total_tok_s": (inp + out) / s, "output_tok_s": out / s, "request_s": len(self.requests) / s}

    def latencies(self) -> dict:
        """TTFT, TPOT, E2E latency and inter-token latency (ms): mean, p50, p90, p99."""
        arr = np.array([r.arrival_ms for r in self.requests])
        first, fin = np.array(self.first_ms), np.array(self.finish_ms)
        n_out = np.array([r.output_len for r in self.requests])
        many = n_out > 1
        itl = np.concatenate([np.diff(t) for t in self.token_ms if len(t) > 1] or [np.zeros(0)])
        series = {"ttft": first - arr, "e2e": fin - arr, "tpot": (fin - first)[many] / (n_out[many] - 1), "itl": itl}
        return {k: _stats(v) for k, v in series.items()}

    @property
    def bubble_ratio(self) -> float:
        return 1.0 - sum(self.busy_ms) / (self.pp_size * self.makespan_ms)

    def summary(self) -> dict:
        return {"policy": self.policy, "requests": len(self.requests), "makespan_ms": self.makespan_ms,
                **self.throughput(), "latency_ms": self.latencies(), "bubble_ratio": self.bubble_ratio,
                "busy_ms": list(self.busy_ms), "micro_batches": len(self.batches),
                "peak_kv_tokens": max(k for _, k in self.kv_timeline)}

    def to_chrome_trace(self) -> dict:
        """Perfetto: one thread per stage, a slice per micro-batch, and a KV counter."""
        ev = [{"name": "process_name", "ph": "M", "pid": "serving", "args": {"name": f"serving ({self.policy})"}}]
        for s in range(self.pp_size):
            ev.append({"name": "thread_name", "ph": "M", "pid": "serving", "tid": s, "args": {"name": f"stage {s}"}})
        for mb in self.batches:
            tokens = sum(x for _, _, x in mb.prefill)
            for s, (a, b) in enumerate(mb.spans):
                ev.append({"name": f"mb{mb.index} P{tokens} D{len(mb.decodes)}", "ph": "X", "pid": "serving",
                           "tid": s, "ts": a * 1e3, "dur": (b - a) * 1e3,
                           "args": {"prefill": [list(p) for p in mb.prefill], "decodes": len(mb.decodes)}})
        ev += [{"name": "KV reserved (tokens)", "ph": "C", "pid": "serving", "ts": t * 1e3, "args": {"tokens": k}}
               for t, k in self.kv_timeline]
        return {"traceEvents": ev, "displayTimeUnit": "ms"}


def _stats(v) -> dict:
    v = np.asarray(v, float)
    if v.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    return {"mean": float(v.mean()), **{f"p{q}": float(np.percentile(v, q)) for q in (50, 90, 99)}}


__all__ = ["ServeResult"]
