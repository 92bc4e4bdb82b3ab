"""Serving simulator and batch policies: closed forms, the papers' mechanisms, and the CLI."""
from __future__ import annotations

import json

import numpy as np
import pytest

from sglang_cpp.core.batch_policy import GLLMThrottle, TimeThrottle, View, WaitingReq, even_share, make_policy
from sglang_cpp.core.costmodel import CostModel
from sglang_cpp.core.planner import fixed_split
from sglang_cpp.whatif.serving_sim import DecodeCost, Request, ServeConfig, simulate_serving
from sglang_cpp.whatif.simulator import simulate

FA = CostModel.fa(a=2e-5, b=0.05, c0=3.0)  # ms: 3 + 0.05 x + 2e-5 x (2L + x)


def _run(reqs, policy, P=2, cost=FA, dec=None, **cfg):
    dec = dec or DecodeCost.from_prefill(cost)
    return simulate_serving(reqs, [cost] * P, [dec] * P, policy, ServeConfig(**cfg))


def test_one_prompt_equals_the_prefill_simulator_and_the_closed_form():
    """One 10K prompt, one output token, SGLang's default with C=2048: the serving simulator's TTFT is the
    chunk-plan simulator's, and sum(t) + (P-1) max(t) for equal stages."""
    for P in (1, 2, 4):
        r = _run([Request(0, 0.0, 10_000, 1)], make_policy("sglang", chunk=2048), P=P)
        chunks = fixed_split(10_000, 2048)
        L = np.concatenate([[0], np.cumsum(chunks)[:-1]])
        t = FA.time(L, np.array(chunks, float))
        assert r.first_ms[0] == pytest.approx(t.sum() + (P - 1) * t.max(), rel=1e-12)
        assert r.first_ms[0] == pytest.approx(simulate(chunks, FA, P).ttft_ms, rel=1e-12)
        assert [x for mb in r.batches for _, _, x in mb.prefill] == chunks


@pytest.mark.parametrize("policy,tpot", [("sglang", 4 * (1 + 0.25 * 16)), ("gllm", 4 * 1 + 0.25 * 16)])
def test_decode_closed_forms(policy, tpot):
    """16 decoding requests on 4 stages, a decode micro-batch costing 1 + 0.25 B ms per stage. SGLang's
    default prefills all 16 in one slot, so they decode together in that slot's micro-batch, which goes
    round the pipeline alone: TPOT = P (c0 + b N).
    gLLM splits them over the 4 micro-batches in flight: TPOT = P c0 + b N (gLLM's decode bubble fix)."""
    reqs = [Request(i, 0.0, 1, 400) for i in range(16)]
    r = _run(reqs, make_policy(policy), P=4, cost=CostModel(c0=0.0, b=1e-6), dec=DecodeCost(c0=1.0, b=0.25))
    lat = r.latencies()
    assert lat["tpot"]["p50"] == pytest.approx(tpot, rel=0.02)
    assert all(len(t) == 400 for t in r.token_ms)


def test_gllm_prefill_throttle_by_hand():
    """Eq. 3 with #T=8, #MaxP=2048, #MinP=32, KV_thresh=0.05."""
    g = GLLMThrottle()

    def view(wp, kv_frac):
        return View(waiting=(WaitingReq(0, 0, wp),), decodes=(), kv_free=int(kv_frac * 100_000), kv_capacity=100_000,
                    running=0, decoding=0, depth=4)

    assert g.prefill_tokens(view(16_000, 1.0)) == 2000  # #WP / #T
    assert g.prefill_tokens(view(80_000, 1.0)) == 2048  # #MaxP
    assert g.prefill_tokens(view(80_000, 0.5)) == int(2048 * 0.45 / 0.95)  # KV-scaled: 970
    assert g.prefill_tokens(view(100, 1.0)) == 32  # #MinP
    assert g.prefill_tokens(view(20, 1.0)) == 20  # never more than waits
    assert g.prefill_tokens(view(80_000, 0.04)) == 0  # below KV_thresh: prefill suspended


def test_time_throttle_sizes_chunks_by_predicted_time():
    """A request 30K tokens deep gets fewer tokens than one at prefix 0, and its chunk takes no longer
    than the #P-token chunk at prefix 0 would (one token less would not reach it)."""
    pred = lambda L, x: FA.time(L, x)  # noqa: E731
    t = TimeThrottle(iters=1)
    for prefix in (0, 30_000):
        v = View(waiting=(WaitingReq(0, prefix, 50_000, admitted=True),), decodes=(), kv_free=10**6,
                 kv_capacity=10**6, running=1, decoding=0, depth=2, predict_ms=pred)
        ((_, x),) = t.schedule(v).prefill
        budget = FA.time(0, 2048)
        assert FA.time(prefix, x) <= budget + 1e-9 and FA.time(prefix, x + 1) > budget
        assert (x == 2048) == (prefix == 0)


def _mixed_long(num=40):
    """Short requests with a 32K-token prompt among them."""
    rng = np.random.default_rng(1)
    reqs = [Request(i, float(i * 50.0), int(rng.integers(200, 2000)), 32) for i in range(num)]
    return reqs + [Request(num, 100.0, 32_768, 32)]


def test_time_throttle_evens_micro_batch_times_where_gllm_does_not():
    """With a long prompt in the stream, gLLM's equal-token micro-batches get slower as its prefix grows;
    throttling by predicted time keeps prefill micro-batches closer to equal (lower spread of their
    stage-0 time), which is the inter-batch imbalance gLLM names as its limitation."""
    spread = {}
    for name in ("gllm", "time"):
        r = _run(_mixed_long(), make_policy(name), P=4, kv_capacity=200_000)
        d = [mb.spans[0][1] - mb.spans[0][0] for mb in r.batches if mb.prefill]
        spread[name] = float(np.std(d) / np.mean(d))
        assert all(len(t) == 32 for t in r.token_ms)
    assert spread["time"] < spread["gllm"]


def test_tdpipe_never_mixes_and_respects_kv():
    reqs = _mixed_long(30)
    r = _run(reqs, make_policy("tdpipe"), P=4, kv_capacity=40_000)
    assert all(not (mb.prefill and mb.decodes) for mb in r.batches)
    assert max(k for _, k in r.kv_timeline) <= 40_000
    assert all(len(t) == q.output_len for t, q in zip(r.token_ms, r.requests))
    # a prefill phase is followed by a decode phase at least once (temporal disaggregation)
    kinds = ["P" if mb.prefill else "D" for mb in r.batches]
    assert "PD" in "".join(kinds) and "DP" in "".join(kinds)


def test_cpu_sampling_takes_sampling_off_the_last_stage():
    """SiPipe: the last stage's busy time drops by exactly sample_ms per sampled sequence."""
    reqs = [Request(i, 0.0, 500, 20) for i in range(8)]
    on = _run(reqs, make_policy("sglang"), P=2, sample_ms=0.5, cpu_sampling=True)
    off = _run(reqs, make_policy("sglang"), P=2, sample_ms=0.5)
    samples = sum(len(mb.decodes) + sum(1 for r, L, x in mb.prefill if L + x == 500) for mb in off.batches)
    assert samples == 8 * 20
    assert off.busy_ms[1] - on.busy_ms[1] == pytest.approx(0.5 * samples, rel=1e-9)
    assert off.busy_ms[0] == pytest.approx(on.busy_ms[0]) and on.makespan_ms < off.makespan_ms


def test_kv_capacity_is_never_exceeded_and_bad_input_is_named():
    reqs = [Request(i, float(i), 3000, 64) for i in range(20)]
    for name in ("sglang", "sarathi", "gllm", "time", "tdpipe"):
        r = _run(reqs, make_policy(name), P=2, kv_capacity=8000)
        assert max(k for _, k in r.kv_timeline) <= 8000 and r.kv_timeline[-1][1] == 0
    with pytest.raises(ValueError, match="kv_capacity=1000"):
        _run([Request(0, 0.0, 990, 20)], make_policy("sglang"), kv_capacity=1000)
    with pytest.raises(ValueError, match="batch policy 'fastest'"):
        make_policy("fastest")
    with pytest.raises(ValueError, match="kv_capacity"):
        ServeConfig(kv_capacity=0)


def test_trace_and_summary():
    r = _run(_mixed_long(10), make_policy("gllm"), P=2)
    tr = r.to_chrome_trace()
    slices = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == 2 * len(r.batches) and {e["tid"] for e in slices} == {0, 1}
    assert any(e["ph"] == "C" for e in tr["traceEvents"])
    s = r.summary()
    assert 0 <= s["bubble_ratio"] < 1 and s["requests"] == 11
    assert s["latency_ms"]["ttft"]["p99"] >= s["latency_ms"]["ttft"]["p50"] > 0


def test_cli_side_by_side(tmp_path, capsys):
    from sglang_cpp.cli import main

    wl = tmp_path / "w.jsonl"
    args = ["simulate-serve", "--coeffs", "3,0,0.05,0,4e-5,2e-5", "--pp-size", "2", "--num-requests", "24",
            "--request-rate", "20", "--input-lens", "0.8:200-1k,0.2:4k-8k", "--output-lens", "8-32"]
    assert main(args + ["--save-workload", str(wl), "--trace-dir", str(tmp_path), "--plot", str(tmp_path / "kv.png")]) == 0
    table = capsys.readouterr().out
    for name in ("sglang", "gllm", "time", "tdpipe", "sipipe"):
        assert f"| {name} |" in table and (tmp_path / f"serving-{name}.json").exists()
    assert (tmp_path / "kv.png").read_bytes()[:4] == b"\x89PNG"
    assert len(wl.read_text().splitlines()) == 24
    # the saved workload replays to the same figures
    assert main(["simulate-serve", "--coeffs", "3,0,0.05,0,4e-5,2e-5", "--pp-size", "2", "--workload", str(wl),
                 "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert f"{again['gllm']['total_tok_s']:.1f}" in table.split("| gllm |")[1].split("\n")[0]
    assert main(args + ["--input-lens", "0.5:x-1k"]) == 2
    assert "--input-len '0.5:x-1k'" in capsys.readouterr().err


def test_sglang_decodes_stay_in_the_slot_that_prefilled_them():
    """SGLang's PP loop: a request joins the running batch of the slot that ran its last prefill chunk and
    decodes only in that slot's turns; gLLM draws each micro-batch's decodes from every slot."""
    reqs = [Request(i, 40.0 * i, 300 + 50 * i, 24) for i in range(12)]
    home_of = {}
    for name in ("sglang", "gllm"):
        r = _run(reqs, make_policy(name), P=4)
        home = {rid: mb.slot for mb in r.batches for rid, L, x in mb.prefill if L + x == 300 + 50 * rid}
        home_of[name] = [{home[rid] for rid, _ in mb.decodes} | {mb.slot} for mb in r.batches if mb.decodes]
        assert len(home) == 12 and len(set(home.values())) > 1  # prefills landed in several slots
    assert all(len(s) == 1 for s in home_of["sglang"])
    assert any(len(s) > 1 for s in home_of["gllm"])


def test_even_share_admission_by_hand():
    """Eq. 4 on the real server, where requests cannot move between slots: a slot admits up to
    ceil((running + waiting) / slots) minus what it holds."""
    assert even_share([0, 0], 0, 12) == 6  # 12 requests at once over 2 slots: 6 each
    assert even_share([6, 0], 1, 6) == 6
    assert even_share([3, 1], 0, 1) == 0  # (3, 1) + 1 new: the share is 3, slot 0 holds 3 already
    assert even_share([3, 1], 1, 1) == 2  # ... slot 1 may take it (and one more arriving later)
    assert even_share([2, 2, 2, 1], 3, 0) == 1  # the remainder rounds up: nobody waits a whole round
    assert even_share([5, 0, 0], 0, 0) == 0  # a slot above its share never admits; it never sheds either


def test_decode_cost_fit_recovers_a_linear_decode_step_from_logged_forwards(tmp_path):
    """Forwards made as 3 ms + 0.5 ms per sequence + 0.01 ms per context token: the fit gives those back;
    read_decode_log fits one per PP rank and skips other events; decode_costs wants every rank."""
    from sglang_cpp.cli.simulate_serve import decode_costs
    from sglang_cpp.whatif.serving_sim import read_decode_log

    rows = [(1, 300), (4, 2000), (8, 1000), (16, 9000), (2, 5000)]
    ms = [3.0 + 0.5 * b + 0.01 * c for b, c in rows]
    d = DecodeCost.fit(*zip(*rows), ms)
    assert (d.c0, d.b, d.e) == pytest.approx((3.0, 0.5, 0.01), rel=1e-6)
    assert float(d.time(10, 4000)) == pytest.approx(3.0 + 5.0 + 40.0)
    log = tmp_path / "dec_0.jsonl"
    lines = [{"event": "decode_forward", "pp_rank": r, "batch_size": b, "context": c, "ms": m * (r + 1)}
             for r in (0, 1) for (b, c), m in zip(rows, ms)]
    lines.append({"event": "forward", "pp_rank": 0, "prefix": [0], "chunk": [64], "ms": 1e6})
    log.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"event": "decode_fo')
    fitted = read_decode_log([str(log)])
    assert sorted(fitted) == [0, 1]
    assert (fitted[1].c0, fitted[1].b, fitted[1].e) == pytest.approx((6.0, 1.0, 0.02), rel=1e-6)
    assert len(decode_costs([str(log)], 2)) == 2
    with pytest.raises(ValueError, match="--pp-size 4 needs ranks 0-3"):
        decode_costs([str(log)], 4)
    with pytest.raises(ValueError, match="need >= 3 decode forwards"):
        DecodeCost.fit([1, 2], [10, 20], [1.0, 2.0])
    with pytest.raises(ValueError, match="no decode_forward events"):
        read_decode_log([str(_only_prefill(tmp_path))])


def _only_prefill(tmp_path):
    p = tmp_path / "prefill.jsonl"
    p.write_text('{"event": "forward", "pp_rank": 0, "prefix": [0], "chunk": [8], "ms": 1.0}\n')
    return p
