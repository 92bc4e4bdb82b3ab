"""Queue-aware plans (core/queue_plan.py): the flow-shop objective over the chunks in flight, this prompt
and the prompts behind it (those at the pipeline's pace: every stage takes the slowest stage's time),
checked against a plain double loop written here; alone, today's plan exactly."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_cpp.core.costmodel import CostModel, PipelineCost, with_overheads
from sglang_cpp.core.equal_time_search import EqualCounts
from sglang_cpp.core.planner import PlanConfig, fixed_split, plan_equal_time
from sglang_cpp.core.objective import advance, flow_shop
from sglang_cpp.core.behind import Behind, advance_paced
from sglang_cpp.core.queue_plan import QueueView, completions, mean_completion, plan_in_queue

GPU = CostModel.fa(a=1e-6, b=0.05, c0=20.0)
UNEVEN = PipelineCost((CostModel.fa(a=1e-6, b=0.05, c0=20.0), CostModel.fa(a=1.3e-6, b=0.06, c0=25.0),
                       CostModel.fa(a=0.9e-6, b=0.04, c0=15.0), CostModel.fa(a=1.1e-6, b=0.05, c0=30.0)))


def naive_ends(jobs, cost, P, o=0.0, paced_from=None):
    """Completion on the last stage of every job (L, x), by the textbook double loop; jobs from index
    `paced_from` on take the slowest stage's time on every stage."""
    stages = getattr(cost, "stages", None) or (cost,) * P
    C = [[0.0] * P for _ in jobs]
    for k, (L, x) in enumerate(jobs):
        for s in range(P):
            if paced_from is not None and k >= paced_from:
                t = max(float(m.time(L, x)) for m in stages) + o
            else:
                t = float(stages[s].time(L, x)) + o
            C[k][s] = max(C[k - 1][s] if k else 0.0, C[k][s - 1] if s else 0.0) + t
    return [c[-1] for c in C]


def jobs_of(chunks, start):
    out, L = [], start
    for x in chunks:
        out.append((L, x))
        L += x
    return out


def naive_completions(inflight, segments, cost, P, o=0.0, paced=True):
    """The completion of each segment (start, chunks) run after the chunks in flight, one after another: the
    first segment (this prompt) on every stage apart, the segments behind it at the pipeline's pace (the
    objective's model of prompts not yet planned; `paced=False`: every stage apart, as a run prices them)."""
    jobs, ends = list(inflight), []
    for start, chunks in segments:
        jobs += jobs_of(chunks, start)
        ends.append(len(jobs) - 1)
    C = naive_ends(jobs, cost, P, o, paced_from=ends[0] + 1 if paced else None)
    return [C[e] for e in ends]


def test_flow_shop_of_equal_stages_is_sum_plus_p_minus_1_max():
    t = np.array([5.0, 1.0, 7.0, 2.0, 2.0])
    P = 4
    want = np.cumsum(t) + (P - 1) * np.maximum.accumulate(t)
    assert np.allclose(flow_shop(np.tile(t, (P, 1))), want)


def test_flow_shop_and_advance_match_the_double_loop_from_any_start():
    rng = np.random.default_rng(0)
    t = rng.uniform(0, 10, size=(3, 5, 9))  # 3 sequences, 5 stages, 9 jobs
    F = rng.uniform(0, 30, size=(3, 5))
    for i in range(3):
        C = np.zeros((9, 5))
        for k in range(9):
            for s in range(5):
                C[k, s] = max(C[k - 1, s] if k else F[i, s], C[k, s - 1] if s else -np.inf) + t[i, s, k]
        assert np.allclose(flow_shop(t[i], F[i]), C[:, -1])
        assert np.allclose(advance(t[i], F[i]), C[-1])


def test_the_paced_closed_form_is_the_flow_shop_of_equal_stages_and_bounds_uneven_ones():
    """`advance_paced` from any state a flow shop leaves (non-decreasing over the stages): on equal stages the
    double loop's state exactly; on stages that differ, at or above it (each stage charged the slowest)."""
    rng = np.random.default_rng(1)
    for _ in range(20):
        P, K = int(rng.integers(1, 9)), int(rng.integers(1, 12))
        F = np.cumsum(rng.uniform(0, 30, size=P))  # a flow-shop state: each stage free no earlier than the last
        u = rng.uniform(0.5, 10, size=K)
        got = advance_paced(F[None], np.array([np.cumsum(u)[-1]]), np.array([u.max()]))[0]
        assert np.allclose(got, advance(np.tile(u, (P, 1)), F))
        t = u * rng.uniform(0.6, 1.0, size=(P, K))  # stages that differ, none above the pace
        assert (got >= advance(t, F) - 1e-9).all()


@pytest.mark.parametrize("Rb,p", [(300000, 0), (120000, 40000), (900000, 100000), (20000, 4096)])
def test_a_prompt_behind_is_priced_as_its_equal_time_cut_to_within_a_few_percent(Rb, p):
    """The fluid `Behind` against the chunk lists `EqualCounts` cuts at pacing times from a few chunks to
    hundreds, each priced chunk by chunk at the pace: for the same chunk count, the total within 4% (the
    clamps and the alignment are what a fluid cannot see) and the largest chunk no larger than the cut's,
    whose rounding to 64 tokens puts a few chunks up to 1.5x the target when they are 64-128 tokens; the count at a
    pacing time within 1% and one of the cut's. Three more prompts share the grid (prefix ranges of their own)."""
    P = 8
    cfg, cost = PlanConfig(pp_size=P, max_chunk=16384), with_overheads(GPU, 5.0, P)
    grid = np.geomspace(20.0, 2000.0, 32)
    prompts = [(p + Rb, p), (1_000_000, 0), (70000, 65000), (500_000, 250_000)]
    b = Behind(cost, cfg, prompts, grid)
    ec = EqualCounts(cost, p, Rb, cfg, np.geomspace(20.0, 2000.0, 1024))  # fine: it cuts at the target above T
    for t in np.geomspace(200.0, 1500.0, 8):  # above a minimum chunk's time at the longest prefix: no clamp at lo
        ch = ec.at_target(float(t))
        want = naive_ends(jobs_of(ch, p), GPU, 1, 5.0)  # one stage: the running sum of the paced times
        K = b.counts(np.array([t]))[0, 0]
        assert abs(K - len(ch)) <= 0.01 * len(ch) + 1
        S, M = b.read(np.full((1, len(prompts)), float(len(ch))))[0]
        assert S[0] == pytest.approx(want[-1], rel=0.04)
        assert 0.65 <= M[0] / max(np.diff([0.0] + want)) <= 1.01


@pytest.mark.parametrize("cost,P", [(GPU, 4), (UNEVEN, 4)])
def test_the_objective_is_the_flow_shop_over_every_chunk_in_order(cost, P):
    cfg = PlanConfig(pp_size=P, max_chunk=8192)
    view = QueueView(inflight=((0, 4096), (4096, 4096), (8192, 2048)), waiting=((20000, 0), (9000, 1024)))
    cur = [6144, 4096, 4096, 3000]
    behind = [[8192, 8192, 3616], fixed_split(9000 - 1024, 2048)]
    charged = with_overheads(cost, 2.0, P)  # 2 ms per chunk and stage, on the cost
    got = completions([(cur, behind)], 12288, view, charged, P)[0]
    want = naive_completions(view.inflight, [(12288, cur), (0, behind[0]), (1024, behind[1])], cost, P, 2.0)
    assert np.allclose(got, want)
    assert mean_completion(cur, 12288 + sum(cur), 12288, view, behind, charged, cfg) == pytest.approx(np.mean(want))


@pytest.mark.parametrize("cost,P", [(GPU, 4), (UNEVEN, 4)])
def test_candidates_of_very_different_lengths_are_each_priced_as_the_double_loop(cost, P):
    """Candidates are padded per length group (a 512-chunk fixed cut beside 3-chunk ones): each one's
    completions are still its own flow shop (the prompts behind at the pipeline's pace)."""
    view = QueueView(inflight=((0, 4096),), waiting=((9000, 1024), (9000, 1024)))
    cands = [([8192, 8192, 1616], [[7976], [7976]]), (fixed_split(18000, 64), [fixed_split(7976, 512)] * 2),
             ([4096] * 4 + [1616], [[4096, 3880], fixed_split(7976, 64)])]
    got = completions(cands, 0, view, with_overheads(cost, 1.5, P), P)
    for row, (cur, behind) in zip(got, cands):
        want = naive_completions(view.inflight, [(0, cur), (1024, behind[0]), (1024, behind[1])], cost, P, 1.5)
        assert np.allclose(row, want)


@pytest.mark.parametrize("cost", [GPU, UNEVEN])
@pytest.mark.parametrize("n,prefix", [(131072, 0), (50000, 8192), (3000, 0)])
def test_alone_is_todays_plan_exactly(cost, n, prefix):
    cfg = PlanConfig(pp_size=4, max_chunk=16384)
    cost = with_overheads(cost, 2.0, 4)
    alone = plan_equal_time(n, cost, cfg, prefix)
    for view in (None, QueueView()):
        got = plan_in_queue(n, cost, cfg, prefix, view)
        assert got.chunks == alone.chunks and got.policy == alone.policy


@pytest.mark.parametrize("cost", [GPU, UNEVEN])
def test_a_burst_planned_queue_aware_finishes_sooner_and_with_more_throughput_than_every_prompt_alone(cost):
    """A burst of 8 long prompts on PP4, each prompt planned when it starts (whatif/stream.py, as the plugin
    would) by the queue-aware plan or alone: the chunks each ran, priced here by the double loop, give the
    queue-aware burst a lower mean completion and an earlier end; its first prompts cut fewer, bigger chunks,
    and its last prompt ends in the single-prompt plan's small tail again (nothing behind it)."""
    from sglang_cpp.whatif.stream import StreamPolicy, plan_stream

    P, n, o = 4, 65536, 5.0
    cfg, charged = PlanConfig(pp_size=P, max_chunk=16384), with_overheads(cost, o, P)
    queue = StreamPolicy("plan", lambda m, p, v: plan_in_queue(m, charged, cfg, p, v).chunks, queue_aware=True)
    alone = StreamPolicy("plan-alone", lambda m, p, v: plan_equal_time(m, charged, cfg, p).chunks)
    runs = {pol.name: plan_stream([n] * 8, pol, charged, P) for pol in (queue, alone)}
    ends = {k: naive_completions((), [(0, ch) for ch in r.chunks], cost, P, o, paced=False) for k, r in runs.items()}
    assert np.mean(ends["plan"]) < 0.99 * np.mean(ends["plan-alone"])
    assert ends["plan"][-1] < ends["plan-alone"][-1]  # the burst's makespan: more input tokens per second
    q, a = runs["plan"].chunks, runs["plan-alone"].chunks
    assert all(c == a[0] for c in a) and len(q[0]) < len(a[0])
    assert runs["plan"].sim.ttfts_ms == pytest.approx(ends["plan"])  # the simulator agrees (free P2P)


def test_the_last_prompt_behind_big_chunks_in_flight_does_not_shrink_below_them():
    """Nothing waits, but a 16K chunk and its like are still in the pipe: chunks faster than the running max
    shorten nobody's drain, so the last prompt's plan completes no later than the single-prompt plan would
    after those chunks, and uses fewer chunks."""
    P = 4
    cfg, gpu = PlanConfig(pp_size=P, max_chunk=16384), with_overheads(GPU, 5.0, P)
    inflight = tuple((L, 16384) for L in (65536, 81920, 98304))
    n = 32768
    alone = plan_equal_time(n, gpu, cfg)
    q = plan_in_queue(n, gpu, cfg, 0, QueueView(inflight=inflight))
    t_alone = naive_completions(inflight, [(0, alone.chunks)], GPU, P, 5.0)[0]
    t_q = naive_completions(inflight, [(0, q.chunks)], GPU, P, 5.0)[0]
    assert t_q < t_alone and len(q.chunks) < len(alone.chunks)
    assert q.meta["queue"]["mean_completion_ms"] == pytest.approx(t_q, abs=1e-3)  # rounded to 1 us


costs = st.builds(CostModel, c0=st.floats(0.5, 50), g=st.floats(0, 0.01), b=st.floats(0.001, 0.5),
                  d=st.floats(0, 1e-8), e=st.floats(0, 2e-5), f=st.floats(1e-9, 1e-5))


@settings(max_examples=25, deadline=None)
@given(costs, st.integers(2000, 60000), st.integers(1, 8), st.integers(0, 4), st.integers(0, 3),
       st.floats(0, 20))
def test_queue_plans_are_valid_and_never_cut_more_chunks_than_alone(cost, n, P, n_in, n_wait, o):
    cfg, charged = PlanConfig(pp_size=P, max_chunk=8192), with_overheads(cost, o, P)
    inflight = tuple((4096 * i, 4096) for i in range(n_in))
    view = QueueView(inflight=inflight, waiting=tuple((n // (i + 1) + 64, 0) for i in range(n_wait)))
    q = plan_in_queue(n, charged, cfg, 0, view)
    assert sum(q.chunks) == n
    for c in q.chunks[:-1]:
        assert c % cfg.align == 0 and cfg.lo <= c <= cfg.hi
    assert 1 <= q.chunks[-1] <= cfg.hi
    assert len(q.chunks) <= len(plan_equal_time(n, charged, cfg).chunks)  # a busy pipe never wants more chunks


@settings(max_examples=25, deadline=None)
@given(costs, st.integers(2000, 60000), st.integers(1, 8), st.integers(0, 4), st.floats(0, 20))
def test_with_nothing_waiting_the_last_prompt_never_finishes_later_than_alone(cost, n, P, n_in, o):
    """Nothing behind, chunks in flight ahead: its own completion after them, by the double loop, is never
    later than the single-prompt plan's would be (every example runs this, whatever hypothesis draws)."""
    cfg, charged = PlanConfig(pp_size=P, max_chunk=8192), with_overheads(cost, o, P)
    inflight = tuple((4096 * i, 4096) for i in range(n_in))
    q = plan_in_queue(n, charged, cfg, 0, QueueView(inflight=inflight))
    alone = plan_equal_time(n, charged, cfg)
    t_q = naive_completions(inflight, [(0, q.chunks)], cost, P, o)[0]
    assert t_q <= naive_completions(inflight, [(0, alone.chunks)], cost, P, o)[0] * (1 + 1e-9)


def test_a_bad_view_names_the_entry():
    with pytest.raises(ValueError, match=r"waiting prompt \(prompt_len 10, prefix_len 10\)"):
        QueueView(waiting=((10, 10),))
    with pytest.raises(ValueError, match=r"chunk in flight \(prefix -1, chunk 64\)"):
        QueueView(inflight=((-1, 64),))
    with pytest.raises(ValueError, match="2 request ids for 1 waiting prompts"):
        QueueView(waiting=((10, 0),), ids=("a", "b"))


def test_a_view_round_trips_through_json():
    v = QueueView(inflight=((0, 512),), waiting=((900, 64),))
    assert QueueView.from_dict(v.to_dict()) == v
