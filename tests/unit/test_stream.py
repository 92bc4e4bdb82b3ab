"""Streams (issue 54): the offered-load estimate (core/load.py), the plan that counts the prompts it expects,
the replan rule, arrivals and the planning time in the simulated stream (whatif/stream.py), and `bench ttft
--simulate`'s bench_serving flags. Expected values are computed here by hand or by a plain loop."""
from __future__ import annotations

import json

import numpy as np
import pytest

from sglang_cpp.cli import main as cli_main
from sglang_cpp.core.costmodel import CostModel, with_overheads
from sglang_cpp.core.load import ArrivalClock, Load, estimate_load, expected_behind
from sglang_cpp.core.planner import PlanConfig, plan_equal_time
from sglang_cpp.core.queue_plan import QueueView, counted_behind, needs_replan, plan_in_queue
from sglang_cpp.whatif.stream import StreamPolicy, plan_stream, poisson_arrivals

COST = CostModel(c0=20, b=0.05, e=2e-6, f=1e-6)
COEFFS = "20,0,0.05,0,2e-6,1e-6"


# -- the estimate ----------------------------------------------------------------------------------
def test_the_rate_is_the_arrivals_over_the_span_to_now_never_over_less_than_the_horizon():
    load = estimate_load([(0.0, 100, False), (1000.0, 200, True), (3000.0, 301, False), (5000.0, 9, True)],
                         now_ms=4000.0)
    assert load == Load(n=3, span_ms=4000.0, mean_len=200, busy=1)  # the arrival after now is not seen; 601 // 3
    assert load.rate_per_ms(100.0) == 2 / 4000
    assert load.rate_per_ms(8000.0) == 2 / 8000  # a span shorter than the horizon reads over the horizon
    burst = estimate_load([(0.0, 64, True)] * 5, now_ms=0.0)
    assert burst.span_ms == 0.0 and burst.rate_per_ms(500.0) == 4 / 500  # a burst is never an infinite rate
    assert estimate_load([(0.0, 64, True)], 10.0) == Load() and not Load().known
    assert estimate_load([(float(t), 10, t % 2 == 0) for t in range(40)], 39.0) == Load(16, 15.0, 10, 8)  # window


def test_the_expected_prompts_are_the_queues_fixed_point_capped_by_the_window_the_busy_arrivals_and_the_room():
    load = Load(n=5, span_ms=4000.0, mean_len=100, busy=5)  # rate 1 per 1000 ms
    # H = 2000, S = 500: m = 0.001 * 2000 / (1 - 0.5) = 4.0
    assert expected_behind(load, 2000.0, room=16, service_ms=500.0) == [1.0, 1.0, 1.0, 1.0]
    # S = 0: m = 2.0; the last weight is fractional when m is
    assert expected_behind(load, 2000.0, room=16) == [1.0, 1.0]
    assert expected_behind(load, 2500.0, room=16) == [1.0, 1.0, 0.5]
    assert expected_behind(load, 2000.0, room=1, service_ms=500.0) == [1.0]  # the room in the view
    assert expected_behind(load, 2000.0, room=16, service_ms=1000.0) == [1.0] * 4  # saturated: n - 1 = 4
    # only 2 of the 5 arrivals found prefill work ahead of them: at most 2 expected; none found any: none
    assert expected_behind(Load(5, 4000.0, 100, busy=2), 2000.0, room=16, service_ms=500.0) == [1.0, 1.0]
    assert expected_behind(Load(5, 4000.0, 100, busy=0), 2000.0, room=16, service_ms=500.0) == []
    assert expected_behind(Load(), 2000.0, room=16) == [] and expected_behind(None, 1.0, 16) == []


def test_the_servers_clock_is_the_newest_stamp_plus_the_chunks_issued_since():
    """core/load.ArrivalClock, what every PP stage feeds alike: `now` = newest relayed stamp + the predicted ms
    of the chunks decided since, so a prompt planned long after the last arrival reads a lower rate."""
    clock = ArrivalClock(window=3)
    clock.issue(50.0)  # before any arrival: no clock to advance
    assert clock.now_ms == 0.0 and clock.load() == Load()
    clock.arrive(1000.0, 100, False)
    clock.arrive(1500.0, 300, True)
    assert clock.now_ms == 1500.0 and clock.load() == Load(2, 500.0, 200, 1)
    clock.issue(400.0)
    clock.issue(None)
    clock.issue(-3.0)
    clock.issue(100.0)
    assert clock.now_ms == 2000.0 and clock.load() == Load(2, 1000.0, 200, 1)
    clock.arrive(1700.0, 500, True)  # an arrival stamped before now: the stamp is the clock, issued restarts
    assert clock.now_ms == 1700.0 and clock.load() == Load(3, 700.0, 300, 2)
    clock.arrive(1600.0, 1, True)  # a stamp that went back is read as the newest one (one clock never does)
    assert clock.recent[-1] == (1700.0, 1, True) and clock.load() == Load(3, 200.0, 267, 3)  # the window is 3


def test_a_bad_load_is_named():
    with pytest.raises(ValueError, match="load estimate"):
        Load(n=2, span_ms=float("nan"), mean_len=5)


# -- the plan --------------------------------------------------------------------------------------
CFG = PlanConfig(pp_size=8, max_chunk=16384)
CHARGED = with_overheads(COST, 5.0, 8)


def test_a_prompt_in_an_empty_pipe_runs_todays_plan_whatever_the_load_when_none_is_expected():
    alone = plan_equal_time(131072, CHARGED, CFG)
    for load in (None, Load(), Load(n=1, span_ms=0.0, mean_len=5)):
        assert plan_in_queue(131072, CHARGED, CFG, 0, QueueView(load=load), alone=alone).chunks == alone.chunks
    # a known load, but its rate expects nobody within the horizon (one arrival a day)
    quiet = Load(n=2, span_ms=86.4e6, mean_len=131072, busy=1)
    assert plan_in_queue(131072, CHARGED, CFG, 0, QueueView(load=quiet), alone=alone).chunks == alone.chunks


def test_the_expected_prompts_stand_behind_the_visible_queue_and_cut_fewer_bigger_chunks():
    """Nothing waits, but the load expects prompts: the plan is the one it makes with that many prompts of the
    window's mean length waiting (weights 1), and so cuts fewer chunks than the single-prompt plan."""
    alone = plan_equal_time(131072, CHARGED, CFG)
    busy = Load(n=9, span_ms=1.0, mean_len=131072, busy=9)  # 8 arrivals within any horizon: capped at n - 1 = 8
    got = plan_in_queue(131072, CHARGED, CFG, 0, QueueView(load=busy), alone=alone)
    same = plan_in_queue(131072, CHARGED, CFG, 0, QueueView(waiting=((131072, 0),) * 8), alone=alone)
    assert got.chunks == same.chunks and len(got.chunks) < len(alone.chunks)
    q = got.meta["queue"]
    assert q["waiting"] == 0 and q["load"]["expected_prompts"] == 8 and q["load"]["expected"] == 8.0
    assert counted_behind(got) == 8 and counted_behind(alone) == 0
    assert QueueView.from_dict(json.loads(json.dumps(QueueView(load=busy).to_dict()))).load == busy


def test_a_replan_is_owed_for_an_arrival_the_plan_did_not_count():
    assert not needs_replan(("a",), ("a",), 1)
    assert not needs_replan(("a",), ("a", "b", "c"), 3)  # two arrivals, both expected
    assert needs_replan(("a",), ("a", "b", "c"), 2)  # one more than it counted
    assert needs_replan(("a",), ("a", "b"), 1)  # no load: the visible queue is the count, an arrival replans
    assert not needs_replan(("a", "b"), ("b",), 2) and not needs_replan(("a", "b"), ("b", "a"), 2)  # gone, re-sorted
    assert needs_replan(("a", "b"), ("b", "c"), 2)  # one left, one came: three seen behind, two counted
    assert needs_replan((), ("x",), 0) and not needs_replan((), ("x",), 1)
    assert needs_replan(("a", "a"), ("a", "a", "b"), 2)  # a key listed twice counts once: "b" was not counted


# -- the stream ------------------------------------------------------------------------------------
def naive(chunk_lists, sent, P, charge):
    """Completion on the last stage of every prompt (FIFO, free P2P), the planning time charged to a chunk
    spent on every stage once it is free and the prompt has been sent, by the textbook double loop."""
    free, out = [0.0] * P, []
    for chunks, t0, d in zip(chunk_lists, sent, charge):
        L = 0
        for x, dk in zip(chunks, d):
            prev = t0
            for s in range(P):
                ready = max(free[s], t0) + dk if dk else free[s]
                prev = free[s] = max(ready, prev) + float(COST.time(L, x)) + 5.0
            L += x
        out.append(free[-1] - t0)
    return out


@pytest.mark.parametrize("planning_ms", [0.0, 7.5])
def test_arrivals_and_the_planning_charge_are_what_the_double_loop_gives(planning_ms):
    """Prompts arriving over time, at most 2 at once (bench_serving's semaphore): each is sent at its arrival or
    when a slot frees; a decision of a planner policy charges its time to the chunk it cuts, on every stage;
    fixed chunks charge nothing."""
    charged, P = with_overheads(COST, 5.0, 4), 4
    arrivals = [0.0, 100.0, 200.0, 90000.0, 90001.0]
    lens = [40000, 20000, 30000, 10000, 50000]
    for planner in (True, False):
        pol = StreamPolicy("p", lambda m, p, v: [min(16384, m - p)] if m - p <= 16384 else [16384] +
                           [16384] * ((m - p - 16384) // 16384) + ([(m - p) % 16384] if (m - p) % 16384 else []),
                           planner=planner)
        run = plan_stream(lens, pol, charged, P, max_concurrency=2, arrivals_ms=arrivals, planning_ms=planning_ms)
        want_charge = planning_ms if planner else 0.0
        assert run.planning_ms == tuple((want_charge,) + (0.0,) * (len(c) - 1) for c in run.chunks)
        assert run.arrivals_ms[:3] == (0.0, 100.0, run.sim.ttfts_ms[0])  # prompt 2 waits for prompt 0's slot
        assert run.arrivals_ms[3:] == (90000.0, 90001.0)  # a quiet pipe: sent at their arrival
        got = naive([list(c) for c in run.chunks], run.arrivals_ms, P, run.planning_ms)
        assert run.sim.ttfts_ms == pytest.approx(got)
        plans = [e for e in run.sim.events if e.kind == "plan"]
        assert len(plans) == (P * len(lens) if planner and planning_ms else 0)


def test_each_arrival_knows_whether_prefill_work_was_ahead_of_it_so_a_closed_loop_counts_nobody():
    """The load a queue-aware policy sees: an arrival found prefill work ahead of it iff the prompt before it
    (FIFO) had not left the last stage yet. Prompt 1 arrives while prompt 0 runs, prompt 2 long after both
    finished. A closed loop (one at a time) finds the pipe empty every time: its estimates know the rate, yet
    count no prompt behind (busy 0), so every prompt runs the plan it would run alone."""
    pol = StreamPolicy("q", lambda m, p, v: [4096] * ((m - p) // 4096) + ([(m - p) % 4096] if (m - p) % 4096 else []),
                       queue_aware=True)
    run = plan_stream([8192, 8192, 8192], pol, COST, 2, arrivals_ms=[0.0, 1.0, 1e7])
    assert run.sim.ttfts_ms[0] > 1.0 and run.arrivals_ms[2] > run.arrivals_ms[1] + run.sim.ttfts_ms[1]
    # each prompt's first decision: prompt 0 alone (no estimate), 1 found 0 running, 2 found the pipe empty
    assert [(ld["n"], ld["busy"]) for ld in run.loads] == [(0, 0), (2, 1), (3, 1)]
    closed = plan_stream([8192] * 6, pol, COST, 2, max_concurrency=1)
    assert [(ld["n"], ld["busy"]) for ld in closed.loads] == [(0, 0), (2, 0), (3, 0), (4, 0), (5, 0), (6, 0)]
    alone = plan_equal_time(131072, CHARGED, CFG)
    planner = StreamPolicy("plan", lambda m, p, v: plan_in_queue(m, CHARGED, CFG, p, v, alone=alone),
                           queue_aware=True)
    loop = plan_stream([131072] * 4, planner, CHARGED, 8, max_concurrency=1)
    assert loop.chunks == (alone.chunks,) * 4 and loop.counted == (0, 0, 0, 0)
    assert loop.loads[-1]["n"] == 4 and loop.loads[-1]["busy"] == 0


def test_a_measured_planning_charge_is_the_decisions_own_time():
    clock = iter(np.arange(0.0, 10.0, 0.5))
    import sglang_cpp.whatif.stream as stream

    real = stream.time.perf_counter
    stream.time.perf_counter = lambda: float(next(clock))  # each decision reads 0.5 s between its two reads
    try:
        run = plan_stream([1000, 1000], StreamPolicy("f", lambda m, p, v: [500, 500]), COST, 2, planning_ms=None)
    finally:
        stream.time.perf_counter = real
    assert run.planning_ms == ((500.0, 0.0), (500.0, 0.0))


def test_bench_serving_arrivals_are_seeded_gamma_gaps_at_the_rate():
    a = poisson_arrivals(2000, 4.0, 1.0, seed=3)
    assert a == poisson_arrivals(2000, 4.0, 1.0, seed=3) and a != poisson_arrivals(2000, 4.0, 1.0, seed=4)
    assert a[0] == 0.0 and all(y >= x for x, y in zip(a, a[1:]))
    assert np.mean(np.diff(a)) == pytest.approx(250.0, rel=0.05)  # 4 per second
    bursty = np.diff(poisson_arrivals(2000, 4.0, 0.25, seed=3))
    assert np.std(bursty) > 1.5 * np.std(np.diff(a))  # shape 0.25: coefficient of variation 2, Poisson's 1
    assert poisson_arrivals(5, float("inf")) == [0.0] * 5


# -- the command line ------------------------------------------------------------------------------
def _bench(tmp_path, *extra):
    out = tmp_path / "s.jsonl"
    out.unlink(missing_ok=True)
    try:
        rc = cli_main(["bench", "ttft", "--coeffs", COEFFS, "--pp-size", "4", "--chunked-prefill-size", "16384",
                       "--chunk-overhead-ms", "5", "--planning-ms", "0", "--output-file", str(out), *extra])
    except SystemExit as exc:  # argparse's own exit on a flag it refuses
        rc = exc.code
    return rc, [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []


def test_a_stream_with_a_length_mixture_runs_every_prompt_with_bench_servings_keys(tmp_path, capsys):
    rc, recs = _bench(tmp_path, "--input-len", "0.5:16k-32k,0.5:64k", "--num-prompts", "12", "--max-concurrency",
                      "12", "--request-rate", "0.5,2", "--seed", "7", "--policy", "fixed:8k,plan:16k",
                      "--plot", str(tmp_path / "load.png"))
    assert rc in (0, None) and len(recs) == 4  # 2 policies x 2 rates
    for r in recs:
        assert {"mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "input_throughput", "request_rate"} <= set(r)
        lens = r["input_lens"]
        assert len(lens) == 12 and all(16384 <= n <= 32768 or n == 65536 for n in lens)
        assert r["total_input_tokens"] == sum(lens) and r["input_len_mix"] == "0.5:16384-32768,0.5:65536"
        assert [sum(c) for c in r["chunk_plan"]["chunks_per_request"]] == lens
        gaps = np.diff(r["arrivals_ms"])
        assert r["seed"] == 7 and all(g >= 0 for g in gaps)
    by = {(r["chunk_plan"]["policy"], r["request_rate"]): r for r in recs}
    assert by[("fixed", 0.5)]["input_lens"] == by[("plan", 2.0)]["input_lens"]  # one draw for every run
    assert by[("fixed", 0.5)]["arrivals_ms"][-1] > by[("fixed", 2.0)]["arrivals_ms"][-1]
    assert (tmp_path / "load.png").stat().st_size > 0
    assert "@ 0.5 req/s" in capsys.readouterr().out


@pytest.mark.parametrize("argv,needle", [
    (["--request-rate", "0"], "--request-rate"),
    (["--request-rate", "-2"], "--request-rate"),
    (["--request-rate", "fast"], "--request-rate"),
    (["--max-concurrency", "0", "--request-rate", "1"], "--max-concurrency"),
    (["--input-len", "0.9:8k,0.2:16k"], "sum to 1.1"),
    (["--input-len", "0.5:8k,16k"], "every part or to none"),
    (["--burstiness", "0"], "--burstiness"),
    (["--planning-ms", "-1"], "--planning-ms"),
])
def test_bad_stream_flags_get_one_line_naming_the_flag(tmp_path, capsys, argv, needle):
    argv = argv if "--input-len" in argv else ["--input-len", "8k", *argv]
    rc, _ = _bench(tmp_path, *argv)
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if "error" in line.lower()]) == 1


def test_a_stream_on_a_server_is_sent_to_bench_serve(capsys):
    rc = cli_main(["bench", "ttft", "--base-url", "http://127.0.0.1:1", "--input-len", "8k", "--request-rate", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "simulated only" in err and "bench serve --request-rate" in err


def test_a_length_past_the_profiles_measured_range_is_warned_naming_both(tmp_path, capsys):
    prof = tmp_path / "p.json"
    samples = [{"L": L, "x": x, "ms": float(COST.time(L, x))} for L in (0, 2048, 4096) for x in (512, 1024, 2048)]
    prof.write_text(json.dumps({"format": "sglang-cpp-profile", "samples": samples}))
    for n, warned in (("6k", False), ("8k", True)):
        rc = cli_main(["bench", "ttft", "--simulate", str(prof), "--pp-size", "2", "--input-len", n,
                       "--num-prompts", "1", "--planning-ms", "0"])
        err = capsys.readouterr().err
        assert rc in (0, None)
        assert ("WARNING: --input-len 8192 is past the profile's measured range (prompt positions up to 6144"
                in err) is warned
