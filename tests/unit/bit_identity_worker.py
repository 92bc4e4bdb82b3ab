"""Run by tests/unit/test_bit_identity.py in subprocesses under different numpy CPU features and OpenBLAS
settings: a seeded fuzz of whole planning decisions (the single-prompt plan, then the queue-aware plan with
chunks in flight, prompts waiting and a load estimate), printed as one JSON line per case with every chunk
and every predicted time as the exact float (repr). Usage: python bit_identity_worker.py N SEED."""
from __future__ import annotations

import json
import sys

import numpy as np

from sglang_cpp.core.costmodel import CostModel, PipelineCost, with_overheads
from sglang_cpp.core.load import Load
from sglang_cpp.core.planner import PlanConfig, plan
from sglang_cpp.core.queue_plan import QueueView, plan_in_queue


def case(rng: np.random.Generator):
    P = int(rng.choice([4, 8, 16]))
    stages = []
    for _ in range(int(rng.integers(1, 4))):  # a few distinct stage shapes, repeated over P stages
        stages.append(CostModel(c0=float(rng.uniform(1, 30)), b=float(rng.uniform(0.005, 0.1)),
                                d=float(rng.choice([0.0, rng.uniform(0, 1e-9)])), e=float(rng.uniform(1e-7, 4e-6)),
                                f=float(rng.uniform(1e-7, 2e-6))))
    cost = PipelineCost(tuple(stages[i % len(stages)] for i in range(P)))
    cost = with_overheads(cost, [float(rng.uniform(0, 20)) for _ in range(P)], P)
    n = int(rng.integers(32 * 1024, 1024 * 1024 + 1))
    prefix = int(rng.choice([0, 0, int(rng.integers(1, n // 2))]))
    cfg = PlanConfig(pp_size=P, max_chunk=int(rng.choice([16384, 32768, 65536])))
    inflight = tuple((int(rng.integers(0, 200000)), int(rng.integers(512, 32768)))
                     for _ in range(int(rng.integers(0, P))))
    waiting = []
    for _ in range(int(rng.choice([0, 1, 4, 16]))):
        m = int(rng.integers(1024, 1024 * 1024))
        waiting.append((m, int(rng.choice([0, int(rng.integers(0, m))]))))
    load = None
    if rng.random() < 0.6:
        k = int(rng.integers(2, 17))
        load = Load(k, float(rng.uniform(0, 600000)), int(rng.integers(1024, 1 << 20)), int(rng.integers(0, k + 1)))
    view = QueueView(inflight, tuple(waiting), tuple(f"w{i}" for i in range(len(waiting))), load)
    return n, prefix, cost, cfg, view


def main(num: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for i in range(num):
        n, prefix, cost, cfg, view = case(rng)
        alone = plan(n, cost, cfg, prefix)
        got = plan_in_queue(n, cost, cfg, prefix, view, alone=alone)
        print(json.dumps({"i": i, "alone": [list(alone.chunks), [repr(t) for t in alone.pred_ms]],
                          "queue": [list(got.chunks), [repr(t) for t in got.pred_ms]]}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
