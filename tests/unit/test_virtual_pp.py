"""Virtual PP in the simulator (whatif/virtual_pp.py): by-hand fill and drain, V = 1 against the plain
engine, and bad input."""
from __future__ import annotations

import numpy as np
import pytest

from sglang_cpp.core.costmodel import CostModel, PipelineCost, with_overheads
from sglang_cpp.whatif.simulator import SimConfig, simulate
from sglang_cpp.whatif.virtual_pp import simulate_virtual

FLAT = CostModel(b=0.01)  # 10 ms per 1000 tokens whatever the prefix: every chunk of 1000 costs t = 10 ms


@pytest.mark.parametrize("P", [2, 4, 8])
@pytest.mark.parametrize("V", [1, 2, 4])
@pytest.mark.parametrize("o", [0.0, 0.5])
def test_fill_and_drain_shrink_to_p_minus_1_over_v_stage_times(P, V, o):
    """K = 2P equal chunks of t on equal ranks: each rank works K (t + V o) in all; the last chunk's last
    pass leaves rank 0 and crosses P - 1 more ranks at t/V + o each."""
    K, t = 2 * P, 10.0
    res = simulate_virtual([1000] * K, with_overheads(FLAT, o, P), P, V, SimConfig())
    assert res.ttft_ms == pytest.approx(K * (t + V * o) + (P - 1) * (t / V + o))
    assert res.busy_ms == pytest.approx([K * (t + V * o)] * P)
    visits = [e for e in res.events if e.kind == "compute"]
    assert len(visits) == K * P * V and all(e.end - e.start == pytest.approx(t / V) for e in visits)


def test_one_virtual_stage_is_the_plain_pipeline():
    """Random unequal stages, growing prefixes and a slow link: V = 1 reproduces the event engine's
    deferred-send, pre-posted-receive schedule exactly (two independent implementations)."""
    rng = np.random.default_rng(30)
    for _ in range(5):
        P = int(rng.integers(2, 6))
        stages = [CostModel.fa(a=float(rng.uniform(1e-7, 1e-6)), b=float(rng.uniform(0.001, 0.02)),
                               c0=float(rng.uniform(0, 3))) for _ in range(P)]
        chunks = [int(c) for c in rng.integers(256, 4096, int(rng.integers(1, 12)))]
        cfg = SimConfig(p2p_latency_ms=0.3, p2p_bandwidth_gbps=5.0, hidden_size=4096, send_mode="deferred",
                        recv_mode="batched")
        cost = with_overheads(PipelineCost(tuple(stages)), float(rng.uniform(0, 2)), P)  # its per-chunk overhead
        plain = simulate(chunks, cost, P, cfg, prefix_len=1000)
        virt = simulate_virtual(chunks, cost, P, 1, cfg, prefix_len=1000)
        assert virt.ttft_ms == pytest.approx(plain.ttft_ms)
        assert virt.busy_ms == pytest.approx(plain.busy_ms)


def test_more_virtual_stages_pay_more_transfers():
    """With a slow link and one chunk, each of the P V - 1 hops between virtual stages pays the transfer."""
    cfg = SimConfig(p2p_latency_ms=2.0, hidden_size=0)
    for V in (1, 2, 4):
        res = simulate_virtual([1000], FLAT, 4, V, cfg)
        assert res.ttft_ms == pytest.approx(4 * 10.0 + (4 * V - 1) * 2.0)  # 4 ranks of t, 4V - 1 hops


@pytest.mark.parametrize("kw,match", [(dict(pp_size=0, virtual_stages=2), "pp_size=0"),
                                      (dict(pp_size=2, virtual_stages=0), "virtual_stages=0"),
                                      (dict(pp_size=2, virtual_stages=2, visit_overhead_ms=-1.0), "visit_overhead_ms")])
def test_bad_input_names_itself(kw, match):
    with pytest.raises(ValueError, match=match):
        simulate_virtual([1000, 1000], FLAT, **kw)
