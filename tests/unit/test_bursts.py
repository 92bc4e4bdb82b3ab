"""`bench ttft --simulate` for many prompts at once: every prompt runs the chunks the plugin would give it
when it starts (whatif/stream.py), in bench_serving's record keys, every prompt's chunks in the trace."""
from __future__ import annotations

import json

import numpy as np

from sglang_cpp.cli import main as cli_main
from sglang_cpp.core.costmodel import CostModel, with_overheads
from sglang_cpp.core.planner import PlanConfig, plan_equal_time
from sglang_cpp.core.queue_plan import QueueView

COEFFS = "20,0,0.05,0,2e-6,1e-6"  # c0,g,b,d,e,f: FlashAttention-shaped, 20 ms a chunk
COST = CostModel(c0=20, b=0.05, e=2e-6, f=1e-6)


def _run(tmp_path, n: int, policies: str, extra=()) -> dict:
    out = tmp_path / f"b{n}.jsonl"
    rc = cli_main(["bench", "ttft", "--coeffs", COEFFS, "--pp-size", "4", "--input-len", "65536", "--num-requests",
                   str(n), "--max-concurrency", str(n), "--chunked-prefill-size", "16384", "--max-prefill-tokens",
                   "16384", "--chunk-overhead-ms", "5", "--policy", policies, "--output-jsonl", str(out), "--planning-ms", "0",
                   *extra])
    assert rc in (0, None)
    return {r["chunk_plan"]["policy"]: r for r in map(json.loads, out.read_text().splitlines())}


def _naive_ttfts(chunk_lists, P=4, o=5.0):
    """Every prompt's completion on the last stage, all sent at 0, by the textbook double loop."""
    free, out = [0.0] * P, []
    for chunks in chunk_lists:
        L = 0
        for x in chunks:
            prev = 0.0
            for s in range(P):
                prev = free[s] = max(free[s], prev) + float(COST.time(L, x)) + o
            L += x
        out.append(free[-1])
    return out


def test_a_burst_gives_each_prompt_its_own_plan_and_beats_planning_them_alone(tmp_path, capsys):
    recs = _run(tmp_path, 8, "fixed:16k,plan-alone:16k,plan:16k", ["--trace", str(tmp_path / "{policy}.json")])
    plan, alone = recs["plan"], recs["plan-alone"]
    for r in recs.values():  # bench_serving's keys
        assert {"mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "input_throughput"} <= set(r)
        assert r["completed"] == 8 and r["max_concurrency"] == 8
    per = plan["chunk_plan"]["chunks_per_request"]
    assert len(per) == 8 and all(sum(c) == 65536 for c in per)
    want_alone = list(plan_equal_time(65536, with_overheads(COST, 5.0, 4), PlanConfig.from_server(
        pp_size=4, chunk_size=16384, max_prefill_tokens=16384)).chunks)
    assert alone["chunk_plan"]["chunks_per_request"] == [want_alone] * 8
    assert len(per[0]) < len(want_alone)  # a prompt with others behind it cuts fewer, bigger chunks
    # the records' times are the flow shop of the chunks that ran (free P2P), priced here independently
    for r in (plan, alone):
        got = np.array(r["ttfts"]) * 1e3
        assert np.allclose(got, _naive_ttfts(r["chunk_plan"]["chunks_per_request"]))
    assert plan["mean_ttft_ms"] < alone["mean_ttft_ms"] and plan["input_throughput"] > alone["input_throughput"]
    # the trace: every prompt's chunks on every stage, tagged request and chunk
    trace = json.loads((tmp_path / "plan.json").read_text())["traceEvents"]
    on0 = [e for e in trace if e.get("cat") == "compute" and e["tid"] == 0]
    for r, chunks in enumerate(per):
        assert [e["args"]["x"] for e in on0 if e["args"]["request"] == r] == chunks


def test_a_burst_of_one_runs_todays_plan(tmp_path):
    recs = _run(tmp_path, 1, "plan-alone:16k,plan:16k")
    assert recs["plan"]["chunk_plan"]["chunks"] == recs["plan-alone"]["chunk_plan"]["chunks"]
    assert recs["plan"]["mean_ttft_ms"] == recs["plan-alone"]["mean_ttft_ms"]


def test_a_closed_loop_replans_the_running_prompt_when_an_arrival_exceeds_what_its_plan_counted(tmp_path):
    """Concurrency 2 over 4 prompts: prompt 2 arrives when prompt 0 finishes, while prompt 1 is mid-prompt.
    A plan that counted nobody behind prompt 1 (a planner that sees only the queue) plans prompt 1's remaining
    chunks again at its next boundary (`replans`); the served plan, whose load estimate (two arrivals so
    far) counted one prompt behind prompt 1, expected that arrival and keeps its chunks."""
    from sglang_cpp.core.queue_plan import plan_in_queue
    from sglang_cpp.whatif.stream import StreamPolicy, plan_stream

    charged, cfg = with_overheads(COST, 5.0, 4), PlanConfig.from_server(pp_size=4, chunk_size=16384,
                                                                      max_prefill_tokens=16384)
    made = []  # (prefix, chunks) of every decision, in order

    def seen(m, p, v):
        chunks = list(plan_in_queue(m, charged, cfg, p, QueueView(v.inflight, v.waiting, v.ids)).chunks)
        made.append((p, chunks))
        return chunks

    run = plan_stream([65536] * 4, StreamPolicy("plan", seen, queue_aware=True), charged, 4, max_concurrency=2)
    assert run.replans[0] == () and run.replans[1] and all(0 < p < 65536 for p in run.replans[1])
    assert run.counted[1] == 0
    at, first = run.replans[1][0], made[1][1]  # prompt 1's first decision (prompt 0 made one, never replanned)
    starts, ran = [sum(first[:k]) for k in range(len(first))], list(run.chunks[1])
    ran_starts = [sum(ran[:k]) for k in range(len(ran))]
    assert at in starts and at in ran_starts  # a replan happens at a boundary of the plan in force
    assert ran[:ran_starts.index(at)] == first[:starts.index(at)]  # up to it: the first plan's chunks
    assert ran[ran_starts.index(at):] != first[starts.index(at):]  # from it: the remaining chunks changed
    out = tmp_path / "c.jsonl"
    assert cli_main(["bench", "ttft", "--coeffs", COEFFS, "--pp-size", "4", "--input-len", "65536", "--num-requests",
                     "4", "--max-concurrency", "2", "--chunked-prefill-size", "16384", "--chunk-overhead-ms", "5",
                     "--policy", "plan:16k", "--output-jsonl", str(out), "--planning-ms", "0"]) in (0, None)
    (rec,) = [json.loads(x) for x in out.read_text().splitlines()]
    load = rec["chunk_plan"]["load"][1]  # both sent at t = 0, read when prompt 1 starts (prompt 0 left stage 0)
    assert (load["n"], load["mean_len"]) == (2, 65536) and load["span_ms"] > 0
    assert rec["chunk_plan"]["counted_behind"][1] == 1 and rec["chunk_plan"]["replanned_at"][1] == []
