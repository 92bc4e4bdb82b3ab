"""Simulator: closed forms of the flow shop, an independent recurrence oracle, mode orderings, CLI."""
from __future__ import annotations

import itertools
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_cpp.args import parse_len
from sglang_cpp.cli import main as cli_main
from sglang_cpp.core.costmodel import CostModel, PipelineCost, with_overheads
from sglang_cpp.whatif.simulator import SimConfig, simulate, simulate_requests

MODES = list(itertools.product(("sync", "deferred"), ("serial", "batched")))


class TableCost:
    """Chunk time looked up by the chunk's start position L (lets a test pick arbitrary t_k)."""

    def __init__(self, by_start: dict):
        self.by_start = by_start

    def time(self, L, x):
        return np.array([self.by_start[int(v)] for v in np.atleast_1d(L)], dtype=float)


def table_plan(times):
    """Chunks of 1 token each, so chunk k starts at L = k; cost lookup gives t_k."""
    return [1] * len(times), TableCost({k: t for k, t in enumerate(times)})


# -- closed forms -------------------------------------------------------------------------------
@pytest.mark.parametrize("M,P", [(1, 1), (1, 4), (7, 1), (8, 4), (13, 8), (3, 5)])
@pytest.mark.parametrize("send,recv", MODES)
def test_equal_chunks_closed_form(M, P, send, recv):
    cost = CostModel(b=0.5)  # t = 0.5 * 64 = 32 ms, exact in binary floating point
    t = 32.0
    res = simulate([64] * M, cost, P, SimConfig(send_mode=send, recv_mode=recv))
    assert res.makespan_ms == (M + P - 1) * t
    assert res.ttft_ms == (M + P - 1) * t
    assert res.bubble_ratio == pytest.approx((P - 1) / (P - 1 + M), rel=1e-12)
    assert all(b == M * t for b in res.busy_ms)
    assert all(i == (P - 1) * t for i in res.idle_ms)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=12), st.integers(1, 6), st.randoms())
def test_proportionate_flow_shop_identity(times, P, rnd):
    """Identical stage times per chunk: makespan = sum t_k + (P-1) max t_k, in any chunk order."""
    chunks, cost = table_plan([float(t) for t in times])
    expect = sum(times) + (P - 1) * max(times)
    res = simulate(chunks, cost, P)
    assert res.makespan_ms == expect
    assert res.bubble_ratio == pytest.approx((P - 1) * max(times) / expect, rel=1e-12)
    shuffled = list(times)
    rnd.shuffle(shuffled)
    chunks2, cost2 = table_plan([float(t) for t in shuffled])
    assert simulate(chunks2, cost2, P).makespan_ms == expect


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.01, 100.0), min_size=1, max_size=10), st.integers(1, 6))
def test_flow_shop_identity_real_times(times, P):
    chunks, cost = table_plan(times)
    assert simulate(chunks, cost, P).makespan_ms == pytest.approx(sum(times) + (P - 1) * max(times), rel=1e-12)


def _oracle(p, tr, sync):
    """Textbook flow-shop recurrence with batched receives, written independently of the engine.

    C[s][k] = max(arrival from s-1, stage s free) + p[s][k]; a sync sender stays busy tr[k] longer."""
    P, K = p.shape
    C = np.zeros((P, K))
    free = np.zeros(P)
    for k in range(K):
        for s in range(P):
            arrive = C[s - 1, k] + tr[k] if s else 0.0
            C[s, k] = max(arrive, free[s]) + p[s, k]
            free[s] = C[s, k]
            if s and sync:
                free[s - 1] = max(free[s - 1], C[s - 1, k] + tr[k])
    return C[-1, -1]


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 5), st.integers(1, 8), st.data())
def test_matches_recurrence_oracle_batched(P, K, data):
    coef = data.draw(st.lists(st.tuples(st.floats(0, 5), st.floats(0.001, 0.05), st.floats(0, 1e-5)),
                              min_size=P, max_size=P))
    models = [CostModel(c0=c, b=b, e=2 * a, f=a) for c, b, a in coef]
    chunks = data.draw(st.lists(st.integers(1, 4096), min_size=K, max_size=K))
    lat = data.draw(st.floats(0, 3))
    cfg_kw = dict(p2p_latency_ms=lat, p2p_bandwidth_gbps=5.0, hidden_size=1024)
    starts = np.concatenate([[0], np.cumsum(chunks)[:-1]])
    p = np.array([[m.time(L, x) for L, x in zip(starts, chunks)] for m in models])
    tr = [lat + x * 1024 * 2 / 5e9 * 1e3 for x in chunks]
    for send in ("sync", "deferred"):
        res = simulate(chunks, models, P, SimConfig(send_mode=send, recv_mode="batched", **cfg_kw))
        assert res.ttft_ms == pytest.approx(_oracle(p, tr, send == "sync"), rel=1e-12, abs=1e-9)


# -- communication modes and overhead ----------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.integers(2, 5), st.lists(st.integers(64, 8192), min_size=1, max_size=8), st.floats(0, 5),
       st.floats(0.5, 100), st.floats(0, 3), st.integers(0, 4096), st.data())
def test_mode_orderings(P, chunks, lat, bw, o, L0, data):
    coef = data.draw(st.lists(st.tuples(st.floats(0.001, 0.02), st.floats(1e-8, 1e-6)), min_size=P, max_size=P))
    models = with_overheads(PipelineCost(tuple(CostModel.fa(a=a, b=b) for b, a in coef)), o, P)  # o per chunk
    run = lambda s, r: simulate(chunks, models, P, SimConfig(  # noqa: E731
        p2p_latency_ms=lat, p2p_bandwidth_gbps=bw, hidden_size=4096, send_mode=s, recv_mode=r), prefix_len=L0).ttft_ms
    t = {m: run(*m) for m in MODES}
    eps = 1e-9
    for r in ("serial", "batched"):
        assert t[("deferred", r)] <= t[("sync", r)] + eps
    for s in ("sync", "deferred"):
        assert t[(s, "batched")] <= t[(s, "serial")] + eps
    # and no mode beats the communication-free pipeline
    free = simulate(chunks, models, P, SimConfig(), prefix_len=L0).ttft_ms
    assert min(t.values()) >= free - eps


def test_modes_differ_when_stages_are_busy():
    """4 equal chunks, 10 ms compute, 4 ms transfers on 2 stages: hand-timed schedules."""
    cost = CostModel(b=10 / 1024)
    cfg = dict(p2p_latency_ms=4.0, hidden_size=0)
    t = {m: simulate([1024] * 4, cost, 2, SimConfig(send_mode=m[0], recv_mode=m[1], **cfg)).ttft_ms for m in MODES}
    # deferred+batched: stage 1 starts at 14, then every 10 ms: 14 + 4*10
    assert t[("deferred", "batched")] == pytest.approx(54.0)
    # sync+batched: stage 0 takes 10 + 4 ms per chunk; the last chunk is sent 52..56 and done at 66
    assert t[("sync", "batched")] == pytest.approx(66.0)
    # deferred+serial: stage 1 receives for 4 ms after each compute: 10 + 4*(4+10)
    assert t[("deferred", "serial")] == pytest.approx(66.0)
    assert t[("sync", "serial")] >= t[("sync", "batched")]


@pytest.mark.parametrize("send,recv", MODES)
def test_single_chunk_overhead_and_transfers(send, recv):
    # stage s: t = c0_s + b_s * x at L = 0, x = 1000 -> 11, 21, 31 ms
    models = [CostModel(c0=1.0 + 10 * s, b=0.01) for s in range(3)]
    o, lat = 2.5, 0.1
    tr = lat + 1000 * 4096 * 2 / (10 * 1e9) * 1e3  # 0.1 + 0.8192 ms
    cfg = SimConfig(p2p_latency_ms=lat, p2p_bandwidth_gbps=10.0, hidden_size=4096, send_mode=send,
                    recv_mode=recv)
    res = simulate([1000], with_overheads(PipelineCost(tuple(models)), o, 3), 3, cfg)
    assert res.ttft_ms == pytest.approx(3 * o + (11 + 21 + 31) + 2 * tr, rel=1e-12)
    base = simulate([1000], models, 3, SimConfig(p2p_latency_ms=lat, p2p_bandwidth_gbps=10.0, hidden_size=4096,
                                                 send_mode=send, recv_mode=recv))
    assert res.ttft_ms - base.ttft_ms == pytest.approx(3 * o)


@pytest.mark.parametrize("M,P", [(5, 3), (16, 8)])
def test_overhead_adds_per_chunk_slot(M, P):
    """Equal chunks, free P2P: every chunk slot grows by o, so TTFT grows by (M + P - 1) * o."""
    cost = CostModel(b=0.25)
    a = simulate([128] * M, cost, P).ttft_ms
    b = simulate([128] * M, with_overheads(cost, 3.0, P), P).ttft_ms
    assert b - a == pytest.approx((M + P - 1) * 3.0)


# -- several requests ----------------------------------------------------------------------------
def test_requests_fifo():
    cost = CostModel(b=0.5)  # 64-token chunks: 32 ms
    M, P, t = 3, 4, 32.0
    alone = (M + P - 1) * t
    res = simulate_requests([(0.0, [64] * M), (0.0, [64] * M)], cost, P)
    assert res.ttfts_ms[0] == alone
    assert res.ttfts_ms[1] == (2 * M + P - 1) * t  # one pipeline of 2M chunks
    late = simulate_requests([(0.0, [64] * M), (1000.0, [64] * M)], cost, P)
    assert late.ttfts_ms == (alone, alone)
    assert late.makespan_ms == 1000.0 + alone


def test_requests_restart_prefix():
    cost = CostModel.fa(a=1e-6, b=0.01, g=1e-3)
    solo = simulate([512, 256], cost, 2, prefix_len=100).ttft_ms
    res = simulate_requests([(0.0, [512, 256]), (1e6, [512, 256])], cost, 2, prefix_len=100)
    assert res.ttfts_ms == pytest.approx((solo, solo), rel=1e-9)  # 1e6 + 14.7 - 1e6 loses digits


# -- events and traces -----------------------------------------------------------------------------
def test_events_and_chrome_trace(tmp_path):
    models = [CostModel(c0=1.0, b=0.01), CostModel(c0=2.0, b=0.02)]
    cfg = SimConfig(p2p_latency_ms=0.5, hidden_size=8, send_mode="sync", recv_mode="serial")
    res = simulate([300, 200, 100], with_overheads(PipelineCost(tuple(models)), 0.25, 2), 2, cfg)
    for s in range(2):
        blk = sorted((e.start, e.end) for e in res.events if e.stage == s and e.blocking)
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(blk, blk[1:])), "blocking events overlap"
        comp = [e for e in res.events if e.stage == s and e.kind == "compute"]
        assert [e.chunk for e in comp] == [0, 1, 2] and [e.L for e in comp] == [0, 300, 500]
        assert res.busy_ms[s] + res.idle_ms[s] == pytest.approx(res.makespan_ms)
    assert {e.kind for e in res.events} == {"compute", "overhead", "send", "recv"}
    tr = res.to_chrome_trace()
    xs = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(res.events)
    assert all(e["pid"] == "pipeline" and isinstance(e["tid"], int) for e in xs)
    first = next(e for e in xs if e["cat"] == "compute" and e["tid"] == 0)
    assert first["ts"] == pytest.approx(250.0) and first["dur"] == pytest.approx(4000.0)  # us
    assert first["args"] == {"L": 0, "x": 300, "request": 0, "chunk": 0}
    names = {e["tid"]: e["args"]["name"] for e in tr["traceEvents"] if e["name"] == "thread_name"}
    assert names[0] == "stage 0" and names[1] == "stage 1"
    path = res.save_trace(tmp_path / "t" / "trace.json")
    assert json.loads(path.read_text()) == json.loads(json.dumps(tr))


def test_plan_object_duck_typing():
    class Plan:
        chunks = (256, 256)
        prefix_len = 1000
        pp_size = 3

    cost = CostModel.fa(a=1e-6, b=0.01)
    a = simulate(Plan(), cost)  # pp_size from the plan
    b = simulate([256, 256], [cost] * 3, prefix_len=1000)
    assert a.pp_size == 3 and a.ttft_ms == b.ttft_ms
    assert a.ttft_ms > simulate([256, 256], cost, 3).ttft_ms  # the prefix makes attention dearer


@pytest.mark.parametrize("call", [
    lambda: SimConfig(send_mode="async"),
    lambda: SimConfig(recv_mode="eager"),
    lambda: SimConfig(p2p_bandwidth_gbps=0),
    lambda: simulate([5], with_overheads(CostModel(b=1), -1.0, 2), 2),
    lambda: simulate([0, 5], CostModel(b=1), 2),
    lambda: simulate([], CostModel(b=1), 2),
    lambda: simulate([5], [CostModel(b=1)] * 3, 2),
    lambda: simulate([5], CostModel(b=1)),
    lambda: simulate_requests([(-1.0, [5])], CostModel(b=1), 1),
])
def test_bad_input_raises(call):
    with pytest.raises(ValueError):
        call()


# -- CLI hooks ---------------------------------------------------------------------------------------
def test_parse_len_and_partition():
    assert parse_len("128k") == 131072 and parse_len("1M") == 1048576 and parse_len("1.5k") == 1536
    assert parse_len("4096") == 4096
    for bad in ("abc", "1.3", "-4k", ""):
        with pytest.raises(ValueError):
            parse_len(bad)


def _cli(argv, capsys):
    rc = cli_main(["simulate", *argv])  # through the CLI's one error handler
    return rc, capsys.readouterr()


def test_cli_fixed_json(tmp_path, capsys):
    trace = tmp_path / "tr.json"
    rc, out = _cli(["--input-len", "8k", "--pp-size", "4", "--chunked-prefill-size", "1k", "--coeffs", "0,0,0.01,0,0,0",
                    "--trace", str(trace), "--json"], capsys)
    assert rc == 0
    d = json.loads(out.out)
    assert d["chunks"] == [1024] * 8
    assert d["ttft_ms"] == pytest.approx((8 + 3) * 10.24)
    assert d["bubble_ratio"] == pytest.approx(3 / 11)
    assert trace.exists() and "traceEvents" in json.loads(trace.read_text())


def test_cli_plan_not_worse_than_fixed(capsys):
    base = ["--input-len", "64k", "--pp-size", "4", "--coeffs", "2,0,0.002,0,4e-7,2e-7", "--json",
            "--chunked-prefill-size", "8k"]
    rc, out = _cli(base + ["--policy", "fixed"], capsys)
    fixed = json.loads(out.out)["ttft_ms"]
    rc2, out2 = _cli(base + ["--policy", "plan"], capsys)
    assert rc == rc2 == 0
    d = json.loads(out2.out)
    assert sum(d["chunks"]) == 65536
    assert d["ttft_ms"] <= fixed * (1 + 1e-9)


def test_cli_analytic_text_and_errors(capsys):
    rc, out = _cli(["--input-len", "4k", "--pp-size", "2", "--analytic", "smollm2-135m", "--gpu", "cpu-2core",
                    "--chunked-prefill-size", "1024", "--p2p-latency-ms", "1", "--p2p-bandwidth-gbps", "1"], capsys)
    assert rc == 0
    assert "TTFT" in out.out and "stage  1" in out.out and "bubble" in out.out
    rc, out = _cli(["--input-len", "4k", "--prefix-len", "4k", "--pp-size", "2", "--coeffs", "1,2,3"], capsys)
    assert rc == 2 and "prefix-len" in out.err
    rc, out = _cli(["--input-len", "4k", "--pp-size", "2", "--analytic", "nope"], capsys)
    assert rc == 2 and "smollm2-135m" in out.err


def test_cli_quadratic_is_sglangs_own_chunk_sequence(capsys):
    """`simulate --policy quadratic` (upstream's dynamic chunking, the baseline of every what-if) runs the
    chunks SGLang 0.5.23's ChunkSizePredictor gives for the same a, b, c."""
    from conftest import sglang_reference_chunks

    a, b, c = 2e-6, 0.05, 20.0
    rc, out = _cli(["--coeffs", f"{a},{b},{c}", "--pp-size", "2", "--input-len", "32k", "--policy", "quadratic",
                    "--chunked-prefill-size", "4096", "--sigma", "0.75", "--json"], capsys)
    assert rc == 0, out.err
    got = json.loads(out.out)["chunks"]
    assert got == sglang_reference_chunks(a, b, c, 4096, 32768, 1 << 30, 16384)
    assert len(set(got)) > 2  # the coefficients make upstream shrink its chunks


def test_old_flag_spellings_still_parse_and_are_hidden(capsys):
    """SGLang's names are the flags; the old spellings are hidden aliases for one release."""
    new = ["--input-len", "8k", "--pp-size", "2", "--chunked-prefill-size", "1k", "--coeffs", "0,0,0.01,0,0,0",
           "--tp-size", "1", "--chunk-overhead-ms", "2", "--json"]
    old = ["--prompt-len", "8k", "--pp-size", "2", "--chunk-size", "1k", "--coeffs", "0,0,0.01,0,0,0",
           "--tp", "1", "--cpu-overhead-ms", "2", "--json"]
    rc_new, out_new = _cli(new, capsys)
    rc_old, out_old = _cli(old, capsys)
    assert rc_new == rc_old == 0 and json.loads(out_new.out) == json.loads(out_old.out)
    with pytest.raises(SystemExit):
        cli_main(["simulate", "--help"])
    helptext = capsys.readouterr().out
    assert "--input-len" in helptext and "--chunked-prefill-size" in helptext and "--tp-size" in helptext
    assert "--prompt-len" not in helptext and "--chunk-size " not in helptext and "--tp " not in helptext


@pytest.mark.parametrize("argv,msg", [
    (["--policy", "fixed"], "sglang-cpp plan: error: --policy fixed needs --chunked-prefill-size"),
    (["--policy", "quadratic", "--chunked-prefill-size", "1k"], "sglang-cpp plan: error: --policy quadratic needs --coeffs"),
    (["--policy", "quadratic", "--coeffs", "1e-9,1e-3,1"], "sglang-cpp plan: error: --policy quadratic needs --chunked-prefill-size"),
])
def test_plan_cli_missing_setting_is_one_error_naming_the_flag(argv, msg, capsys):
    rc = cli_main(["plan", "--input-len", "8k", "--pp-size", "2", "--coeffs", "0,0,0.01,0,0,0", *argv])
    assert rc == 2 and msg in capsys.readouterr().err


def test_plan_cli_cuts_under_a_served_profiles_measured_chunk(tmp_path, capsys):
    """A served profile keeps the cap its server planned under (the largest chunk calibration and coverage
    measured, plugin/startup/coverage.py): `plan --profile` cuts under it as the server did; --max-chunk overrides."""
    from sglang_cpp.core.profile_io import save_profile

    cost = CostModel.fa(a=1e-6, b=0.05, c0=20.0)
    runs = {}
    for name, meta in (("free", {}), ("served", {"backend": "served", "measured_chunk": 1024})):
        path = save_profile(tmp_path / f"{name}.json", cost=cost, meta=meta)
        for extra in ([], ["--max-chunk", "4096"]):
            assert cli_main(["plan", "--profile", str(path), "--input-len", "32k", "--pp-size", "4",
                             "--chunked-prefill-size", "8192", "--chunk-overhead-ms", "20", "--json", *extra]) == 0
            runs[name, len(extra)] = json.loads(capsys.readouterr().out)["chunks"]
    assert max(runs["free", 0]) > 1024  # the cap binds here
    assert max(runs["served", 0]) <= 1024 and sum(runs["served", 0]) == 32768
    assert runs["served", 2] == runs["free", 2]


def _strict(text: str):
    """json.loads that refuses Infinity and NaN, as strict JSON parsers do."""
    def refuse(tok):
        raise ValueError(f"not strict JSON: {tok}")
    return json.loads(text, parse_constant=refuse)


def test_every_json_output_is_strict_json(capsys):
    """Issue 47 item 5: `simulate --json` printed a bare Infinity (the default unbounded P2P bandwidth); every
    --json output is strict JSON now, an unbounded or undefined figure as null: simulate, plan, simulate-serve and
    bench ttft's records here, the tune commands in tests/unit/test_flags.py."""
    rc, out = _cli(["--input-len", "8k", "--pp-size", "2", "--coeffs", "0,0,0.01,0,0,0", "--json"], capsys)
    assert rc == 0
    doc = _strict(out.out)
    assert doc["config"]["p2p_bandwidth_gbps"] is None and doc["ttft_ms"] > 0
    assert cli_main(["plan", "--input-len", "8k", "--pp-size", "2", "--coeffs", "0,0,0.01,0,0,0", "--json"]) == 0
    assert _strict(capsys.readouterr().out)["chunks"]
    # simulate-serve --json, with the default unbounded P2P bandwidth and an unbounded KV pool
    assert cli_main(["simulate-serve", "--coeffs", "1,0,0.01,0,2e-6,1e-6", "--pp-size", "2", "--num-prompts", "8",
                     "--request-rate", "4", "--input-len", "200-2k", "--output-len", "8-16", "--json"]) == 0
    assert _strict(capsys.readouterr().out)
    # bench ttft --simulate --output-file: one strict line per run, a burst (request rate inf) and a stream
    out = Path(tempfile.mkdtemp()) / "b.jsonl"
    assert cli_main(["bench", "ttft", "--coeffs", "1,0,0.01,0,2e-6,1e-6", "--pp-size", "2", "--input-len", "8k",
                     "--num-prompts", "3", "--max-concurrency", "3", "--request-rate", "inf,2", "--planning-ms", "0",
                     "--policy", "fixed:2k,plan:4k", "--output-file", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 4 and all(_strict(x)["completed"] == 3 for x in lines)


@pytest.mark.parametrize("cmd", [["plan"], ["simulate"], ["bench", "ttft", "--num-requests", "1"]])
def test_a_profile_for_another_pp_size_is_refused_naming_file_and_flag(cmd, tmp_path, capsys):
    """Issue 47 item 2: an 8-stage profile with --pp-size 4 planned with exit 0 (`plan`) or failed naming
    neither the file nor the flag (`simulate`, `bench ttft`). One stage's model still serves any PP size."""
    from sglang_cpp.core.costmodel import PipelineCost
    from sglang_cpp.core.profile_io import save_profile

    m = CostModel.fa(a=1e-6, b=0.05, c0=20.0)
    eight = save_profile(tmp_path / "pp8.json", cost=PipelineCost((m,) * 8), meta={"pp": 8})
    one = save_profile(tmp_path / "stage.json", cost=m, meta={"pp": 1})
    src = ["--simulate" if cmd[0] == "bench" else "--profile"]
    base = [*cmd, "--input-len", "32k", "--chunked-prefill-size", "8192"]
    assert cli_main([*base, *src, str(eight), "--pp-size", "4"]) == 2
    err = capsys.readouterr().err
    assert str(eight) in err and "8 per-stage models" in err and "--pp-size is 4" in err and "Traceback" not in err
    assert cli_main([*base, *src, str(eight), "--pp-size", "8"]) == 0
    assert cli_main([*base, *src, str(one), "--pp-size", "4"]) == 0
    capsys.readouterr()


COST_CMDS = [["plan", "--input-len", "32k"], ["simulate", "--input-len", "32k"],
             ["bench", "ttft", "--num-prompts", "1", "--input-len", "32k"],
             ["simulate-serve", "--num-prompts", "2", "--input-len", "1k-2k", "--output-len", "4-8", "--disable-tqdm"]]


@pytest.mark.parametrize("cmd", COST_CMDS, ids=lambda c: c[0] + (" " + c[1] if c[0] == "bench" else ""))
def test_a_profile_from_another_tp_size_or_dtype_is_refused_when_the_flag_is_given(cmd, tmp_path, capsys):
    """Issue 47 item 2: every command that prices chunks checks a profile against the --tp-size and --dtype the
    user gave (one line: the file, the field it holds, the flag); a flag left out checks nothing, so a TP8
    profile still runs without --tp-size. An analytic profile's bf16 (16-bit GEMMs) agrees with SGLang's words."""
    from sglang_cpp.core.profile_io import save_profile

    m = CostModel.fa(a=1e-6, b=0.05, c0=20.0)
    tp8 = save_profile(tmp_path / "tp8.json", cost=m, meta={"tp": 8, "dtype": "bf16"})
    src = ["--simulate" if cmd[0] == "bench" else "--profile", str(tp8), "--pp-size", "2"]
    assert cli_main([*cmd, *src, "--tp-size", "4"]) == 2
    err = capsys.readouterr().err
    assert f"profile {tp8} was measured with tp=8 but the command line gives --tp-size 4" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert cli_main([*cmd, *src, "--dtype", "fp8"]) == 2
    assert "measured with dtype=bf16 but the command line gives --dtype fp8" in capsys.readouterr().err
    for ok in ([], ["--tp-size", "8"], ["--dtype", "bfloat16"], ["--dtype", "float16"], ["--dtype", "auto"]):
        assert cli_main([*cmd, *src, *ok]) == 0, ok
    capsys.readouterr()


@pytest.mark.parametrize("cmd", COST_CMDS, ids=lambda c: c[0] + (" " + c[1] if c[0] == "bench" else ""))
def test_every_command_that_prices_chunks_reads_one_cost_source_with_the_dataclass_defaults(cmd):
    """Issue 46 item 3: plan, simulate, simulate-serve and bench ttft take their cost source from one add_args
    whose defaults are CostSource's: a command given only a preset gets every other field at its default."""
    import argparse
    from dataclasses import asdict

    from sglang_cpp.cli import SUBCOMMANDS
    from sglang_cpp.cli.cost_source import CostSource

    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd")
    import importlib
    mod, add, _, _ = SUBCOMMANDS[cmd[0]]
    getattr(importlib.import_module(mod), add)(sub.add_parser(cmd[0]))
    args = ap.parse_args([*cmd, "--model-path", "llama3-8b", "--gpu", "h100", "--pp-size", "2"])
    got = CostSource.from_args(args)
    assert asdict(got) == asdict(CostSource(analytic="llama3-8b", gpu="h100"))
    assert got.kind == "analytic" and got.overhead_ms() > 0  # the preset's per-chunk cost, not 0
    args = ap.parse_args([*cmd, "--analytic", "llama3-8b", "--gpu", "H100", "--tp", "2", "--pp-size", "2"])
    got = CostSource.from_args(args)
    assert (got.model_flag, got.tp_size, got.dtype) == ("--analytic", 2, "auto")


def test_the_cost_source_carries_the_overhead_and_its_bare_stage_costs_leave_it_out():
    """--chunk-overhead-ms (or the preset's) rides on the source's cost, on top of what a served profile
    carries; the bare per-stage models (`stage_costs(overhead=False)`, what simulate-serve prices beside its own
    --batch-overhead-ms; simulate-serve itself is not run here) leave it out."""
    from sglang_cpp.cli.cost_source import CostSource
    from sglang_cpp.core.costmodel import add_overhead, with_overheads
    from sglang_cpp.whatif.analytic import DEVICES

    src = CostSource(analytic="llama3-8b", gpu="h100")
    bare = src.stage_costs(2, overhead=False)
    priced = src.stage_costs(2)
    o = DEVICES["H100"].chunk_overhead_ms
    assert o > 0 and all(float(p.time(1024, 512)) == pytest.approx(float(b.time(1024, 512)) + o)
                         for p, b in zip(priced, bare))
    assert float(src.cost(2).time(1024, 512)) == pytest.approx(max(float(p.time(1024, 512)) for p in priced))
    given = CostSource(coeffs="1,0,0.01,0,2e-6,1e-6", chunk_overhead_ms=3.0)
    base = given._cost(2)
    assert float(given.cost(2).time(0, 100)) == pytest.approx(float(base.time(0, 100)) + 3.0)
    assert len(src.stage_costs(1, overhead=False)) == len(src.stage_costs(1)) == 1  # PP1: one roofline stage
    served = with_overheads(base, 2.0, 2)  # a served profile's overhead, and 3 ms more given
    assert [ov.ms for ov in add_overhead(served, 3.0, 2).overheads] == [5.0]


@pytest.mark.parametrize("o", [0.0, 2.0])
def test_an_analytic_pp1_profile_round_trips_as_one_roofline_stage(tmp_path, o):
    """A PP1 analytic stage is the maximum of its roofline rows: written and read back it stays one stage (never
    its rows taken for stages), with or without a per-chunk overhead."""
    from sglang_cpp.core.profile_io import load_cost, save_profile
    from sglang_cpp.whatif.analytic import DEVICES, MODELS
    from sglang_cpp.whatif.analytic_fit import priced_stages

    cost = priced_stages(MODELS["llama3-8b"], DEVICES["H100"], 1, 1, o)
    back = load_cost(save_profile(tmp_path / "a.json", cost=cost, meta={"pp": 1}), pp_size=1)
    assert len(back.stages) == 1 and float(back.time(2048, 512)) == pytest.approx(float(cost.time(2048, 512)))


def test_a_served_profiles_overhead_reaches_tune_chunk_and_the_experiments_predictions(tmp_path):
    """A served profile carries each stage's overhead beside its forward model (chunk_overheads): tune chunk prices
    its recommendations with it and writes it beside the models again (never folded in, where the server's probe
    would add its own on top); the experiment's calibration stages get it in each stage."""
    import json

    from sglang_cpp.core.costmodel import CostModel, PipelineCost, with_overheads
    from sglang_cpp.core.profile_io import load_cost, save_profile
    from sglang_cpp.tuning.recommend import ChunkTuneConfig, load_stages

    fwd = (CostModel(c0=1.0, b=0.01, e=2e-6, f=1e-6), CostModel(c0=2.0, b=0.01, e=2e-6, f=1e-6))
    path = save_profile(tmp_path / "served.json", cost=with_overheads(PipelineCost(fwd), [4.0, 5.0], 2),
                        meta={"pp": 2})
    assert json.loads(path.read_text())["chunk_overheads"][1]["ms"] == 5.0
    assert [m.c0 for m in load_cost(path).stages] == [1.0, 2.0]  # the forward models stay as fitted
    _, _, models, stages, over = load_stages(ChunkTuneConfig(profile=str(path), pp_size=2, input_lens=(4096,)))
    assert [m.c0 for m in models] == [1.0, 2.0] and [o.ms for o in over] == [4.0, 5.0]
    from sglang_cpp.tuning.recommend import priced

    want = [float(m.time(0, 100)) + o + 3.0 for m, o in zip(fwd, (4.0, 5.0))]  # carried + --chunk-overhead-ms 3
    assert [float(t) for t in priced(stages, over, 3.0, 2).stage_times(0, 100)] == pytest.approx(want)
    from sglang_cpp.cli import main as cli_main

    out = tmp_path / "tuned"
    assert cli_main(["tune", "chunk", str(path), "--pp-size", "2", "--input-len", "4096",
                     "--out-dir", str(out)]) == 0
    (tuned,) = out.glob("*.json")
    doc = json.loads(tuned.read_text())
    assert [s["coeffs"]["c0"] for s in doc["stages"]] == [1.0, 2.0] and [o["ms"] for o in doc["chunk_overheads"]] == [4.0, 5.0]


@pytest.mark.parametrize("argv,msg", [
    (["plan", "--coeffs", "0,0,0.01,0,0,0", "--pp-size", "2", "--input-len", "8k", "--chunked-prefill-size", "0"],
     "--chunked-prefill-size: '0': give a chunk size >= 1"),
    (["simulate", "--coeffs", "0,0,0.01,0,0,0", "--pp-size", "2", "--input-len", "8k", "--chunked-prefill-size", "0"],
     "--chunked-prefill-size: '0': give a chunk size >= 1"),
    (["simulate-serve", "--analytic", "llama3-8b", "--gpu", "H100", "--pp-size", "2", "--num-requests", "4",
      "--chunked-prefill-size", "0"], "--chunked-prefill-size: '0': give a chunk size >= 1"),
    (["plan", "--coeffs", "0,0,0.01,0,0,0", "--pp-size", "2", "--input-len", "8k", "--chunked-prefill-size", "-1"],
     "SGLang's -1 turns chunking off"),
    (["plan", "--coeffs", "0,0,0.01,0,0,0", "--pp-size", "2", "--input-len", "8k", "--page-size", "0"],
     "--page-size: '0': give an integer >= 1"),
    (["simulate", "--analytic", "llama3-8b", "--gpu", "H100", "--tp-size", "3", "--pp-size", "2", "--input-len", "8k"],
     "--tp-size 3: llama3-8b has 32 attention heads and 8 KV heads"),
    (["bench", "ttft", "--analytic", "llama3-8b", "--gpu", "H100", "--tp-size", "0", "--input-len", "8k"],
     "--tp-size: '0': give an integer >= 1"),
    (["tune", "partition", "--model-path", "llama3-8b", "--gpu", "H100", "--tp-size", "3", "--pp-size", "2"],
     "--tp-size 3: llama3-8b has 32 attention heads and 8 KV heads"),
    (["tune", "analytic", "--model-path", "llama3-8b", "--gpu", "H100", "--tp-size", "3", "--measured", "1,8k,1.0"],
     "--tp-size 3: llama3-8b has 32 attention heads and 8 KV heads"),
])
def test_zero_negative_and_unshardable_sizes_are_one_line_naming_the_flag(argv, msg, capsys):
    """Issue 47 item 3: --chunked-prefill-size 0 was ignored by plan, 8192 in simulate and a traceback in
    simulate-serve; --page-size 0 and --tp-size 3 on llama3-8b (32 heads) were accepted."""
    try:
        rc = cli_main(argv)
    except SystemExit as exc:  # argparse's own exit for a flag its type refuses
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err
    assert msg in err.strip().splitlines()[-1] and "Traceback" not in err, err  # one error line after the usage
