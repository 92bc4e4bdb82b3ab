"""The plugin's decision logic, without a server: every stage built from the same inputs decides alike."""
from __future__ import annotations

import json

import pytest

from sglang_cpp.core.costmodel import CostModel, PipelineCost
from sglang_cpp.core.planner import plan_equal_time
from sglang_cpp.core.upstream import UpstreamPredictor
from sglang_cpp.plugin.decision_log import DecisionLog
from sglang_cpp.plugin.serving.sizer import CppChunkSizer, SizerConfig

from conftest import walk

COST = PipelineCost((CostModel.fa(a=1e-6, b=0.05, c0=20), CostModel(c0=10, b=0.04, d=1e-7, e=2e-6, f=1e-6)))


def cfg(rank=0, **kw):
    base = dict(policy="plan", pp_size=2, pp_rank=rank, chunk_size=4096, max_prefill_tokens=16384,
                page_size=1, context_len=1 << 20)
    return SizerConfig(**{**base, **kw})


def test_two_stages_decide_identically(tmp_path):
    logs = [tmp_path / f"d{r}.jsonl" for r in (0, 1)]
    seqs = []
    for r in (0, 1):
        s = CppChunkSizer(cfg(r), cost=COST, log=DecisionLog(r, str(logs[r])))
        seqs.append([walk(s, f"req{i}", n, p) for i, (n, p) in enumerate([(200000, 0), (70000, 65536), (5000, 0)])])
    assert seqs[0] == seqs[1]
    recs = [[(d["rid"], d["prefix"], d["chunk"]) for d in map(json.loads, f.read_text().splitlines())
             if d["event"] == "decision"] for f in logs]
    assert recs[0] == recs[1] and len(recs[0]) == sum(len(s) for s in seqs[0])
    # one plan per prompt (nothing in view, nothing replans it), numbered in each decision
    plans = [[(d["rid"], d["plans"]) for d in map(json.loads, f.read_text().splitlines()) if d["event"] == "plan"]
             for f in logs]
    assert plans[0] == plans[1] == [("req0", 1), ("req1", 1), ("req2", 1)]


def test_plan_follows_planner_and_starts_from_cached_prefix():
    s = CppChunkSizer(cfg(), cost=COST)
    seq = walk(s, "r", 150000, 40000)
    want = plan_equal_time(150000, COST, cfg().plan_config(), 40000).chunks
    assert tuple(seq) == want and sum(seq) == 110000


def test_sglang_cpp_chunk_overhead_ms_rides_on_every_model_the_server_plans_on():
    """SGLANG_CPP_CHUNK_OVERHEAD_MS is charged on top of the cost's own per-chunk overhead (its carrier): by the
    sizer on the startup model and on each refit, and by calibration's next-level top on the model so far, so
    calibration and coverage measure the chunks the served plans cut."""
    from sglang_cpp.core.calib_grid import top_chunk
    from sglang_cpp.core.costmodel import add_overhead, with_overheads
    from sglang_cpp.plugin.startup.calibrate import _next_top

    fast = PipelineCost((CostModel.fa(a=1e-8, b=0.001, c0=1), CostModel.fa(a=1.2e-8, b=0.001, c0=1)))
    carried = with_overheads(fast, [1.0, 2.0], 2)
    c = cfg(chunk_overhead_ms=10.0)
    s = CppChunkSizer(c, cost=carried)
    assert [o.ms for o in s.cost.overheads] == [11.0, 12.0] and s.cost.stages == fast.stages
    assert tuple(walk(s, "r", 60000, 0)) == plan_equal_time(60000, add_overhead(carried, 10.0, 2), c.plan_config()).chunks
    assert tuple(walk(s, "r", 60000, 0)) != plan_equal_time(60000, carried, c.plan_config()).chunks  # it matters here
    s.set_model(carried)  # a refit: charged again, once
    assert [o.ms for o in s.cost.overheads] == [11.0, 12.0]
    samples = [{"L": L, "x": x, "ms": float(fast.time(L, x)), "stage": 0} for L in (0, 1024, 4096) for x in (64, 256, 1024)]
    pc = c.plan_config()
    fitted = _next_top(samples, 16384, pc, 16384)
    charged = _next_top(samples, 16384, pc, 16384, chunk_overhead_ms=10.0)
    from sglang_cpp.core.profile_io import cost_from_profile

    cost = cost_from_profile({"samples": samples, "meta": {"regime_bounds": [], "chunk_switches": []}})
    assert charged == top_chunk(add_overhead(cost, 10.0, 2), 16384, pc, 16384) and fitted == top_chunk(cost, 16384, pc, 16384)
    assert charged != fitted  # bigger chunks where each costs 10 ms more


def test_a_refit_starts_per_stage_from_the_times_the_sizer_plans_on():
    """One model for every stage (a lone stage carrying the largest overhead) becomes one model per stage, each
    carrying that overhead: version 0 of the refit prices every chunk as the sizer does."""
    from sglang_cpp.core.costmodel import per_stage, with_overheads
    from sglang_cpp.core.refine import Refiner

    one = COST.stages[1]
    shared = with_overheads(one, [1.0, 3.0], 2)  # one model: the largest overhead
    assert len(shared.stages) == 1 and shared.overheads[0].ms == 3.0
    start = per_stage(shared, 2)
    assert start.stages == (one, one) and [o.ms for o in start.overheads] == [3.0, 3.0]
    assert float(Refiner(start, []).model.time(4096, 1024)) == pytest.approx(float(shared.time(4096, 1024)))
    assert per_stage(one, 2).overheads == () and per_stage(COST, 2) is COST


def test_replans_when_sglang_cut_a_chunk_short():
    s = CppChunkSizer(cfg(), cost=COST)
    first = s.decide("r", 100000, 0, first=True)
    cut = first - 1000  # e.g. the memory budget shortened the chunk
    nxt = s.decide("r", 100000, cut, first=False)
    replanned = plan_equal_time(100000, COST, cfg().plan_config(), cut)
    assert nxt == replanned.chunks[0]


def test_quadratic_policy_is_upstream(monkeypatch):
    """Against SGLang's own ChunkSizePredictor (conftest.sglang_reference_chunks), not our reproduction."""
    from conftest import sglang_reference_chunks

    monkeypatch.setenv("SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR", "0.75")
    up = UpstreamPredictor(a=6.2e-5, b=0.536, c=49.2, chunk_size=1024, context_len=8192)
    s = CppChunkSizer(cfg(policy="quadratic", chunk_size=1024), upstream=up)
    assert s.decide("r", 7000, 0, first=True) is None  # SGLang keeps its static C for the first chunk
    s.current_req = lambda: ("r", 7000)
    seq, L = [1024], 1024
    while L < 7000:
        c = min(s.predict(L) or 1024, 7000 - L)
        seq.append(c)
        L += c
    want = sglang_reference_chunks(6.2e-5, 0.536, 49.2, 1024, 7000, 8192, 16384)
    assert len(set(want)) > 2 and seq == want  # the coefficients make upstream vary its chunks


@pytest.mark.parametrize("kw,match", [
    (dict(policy="fast"), "SGLANG_CPP_POLICY"),
    (dict(sigma=2.0), "SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR"),
    (dict(chunk_size=0), "--chunked-prefill-size"),
    # a negative one would pass on top of a larger measured overhead, then fail every rank at a refit
    (dict(chunk_overhead_ms=-0.5), r"SGLANG_CPP_CHUNK_OVERHEAD_MS=-0.5 must be a finite number of ms >= 0"),
    (dict(chunk_overhead_ms=float("nan")), "SGLANG_CPP_CHUNK_OVERHEAD_MS=nan"),
    (dict(max_chunk=32768), "SGLANG_CPP_MAX_CHUNK=32768 exceeds SGLang.s prefill-buffer ceiling 16384"),
    # issue 27 item 6: the exact DP plans at most 4096 aligned units; a longer prompt would kill the server
    (dict(method="dp", context_len=262145), r"SGLANG_CPP_PLANNER=dp plans prompts of at most 4096 aligned units "
                                            r"\(262144 tokens at align 64\)"),
])
def test_bad_config_is_named(kw, match):
    with pytest.raises(ValueError, match=match):
        cfg(**kw)


def test_the_dp_planner_is_accepted_up_to_its_limit():
    assert cfg(method="dp", context_len=262144).method == "dp"
    assert cfg(method="dp", context_len=300000, policy="off").method == "dp"  # nothing is planned


def test_from_env_validates(monkeypatch):
    server = dict(pp_size=2, pp_rank=0, chunk_size=1024, max_prefill_tokens=16384, page_size=1, context_len=8192)
    monkeypatch.setenv("SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR", "-0.5")
    with pytest.raises(ValueError, match="outside"):
        SizerConfig.from_env(**server)
    monkeypatch.setenv("SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR", "0.6")
    monkeypatch.setenv("SGLANG_CPP_MIN_CHUNK", "abc")
    with pytest.raises(ValueError, match="SGLANG_CPP_MIN_CHUNK"):
        SizerConfig.from_env(**server)
    monkeypatch.setenv("SGLANG_CPP_MIN_CHUNK", "512")
    c = SizerConfig.from_env(**server)
    assert c.sigma == 0.6 and c.plan_config().lo == 512 and c.plan_config().hi == 16384


def test_warns_when_the_plan_extrapolates_beyond_the_calibrated_length(tmp_path, caplog):
    """Issue 45 item 11: any prompt past the calibrated length is planned on extrapolated times (it was silent
    up to 2x)."""
    log = tmp_path / "d.jsonl"
    s = CppChunkSizer(cfg(), cost=COST, log=DecisionLog(0, str(log)), calibrated_len=8192)
    with caplog.at_level("WARNING", logger="sglang_cpp"):
        s.decide("short", 8192, 0, first=True)  # exactly the calibrated length: within range
        s.decide("longer", 12288, 0, first=True)
        s.decide("long", 40960, 0, first=True)
    events = [d for d in map(json.loads, log.read_text().splitlines()) if d["event"] == "extrapolation"]
    assert [(e["rid"], e["factor"]) for e in events] == [("longer", 1.5), ("long", 5.0)]
    assert "extrapolates the cost model 5.0x beyond its calibrated length (8192 tokens" in caplog.text


def test_the_extrapolation_warning_is_said_once_per_doubling_and_by_world_rank_0_only(tmp_path, caplog):
    """Issue 57 item 7: every rank logs each long request as an event; the console hears of it from world rank
    0, once per doubling of the factor (1.5x and 1.9x share a band; 5.0x is another)."""
    said = {}
    for rank in (0, 1):
        log = tmp_path / f"d{rank}.jsonl"
        s = CppChunkSizer(cfg(), cost=COST, log=DecisionLog(rank, str(log), rank=rank), calibrated_len=8192)
        caplog.clear()
        with caplog.at_level("WARNING", logger="sglang_cpp"):
            for rid, n in (("a", 12288), ("b", 15565), ("c", 40960), ("d", 40961)):
                s.decide(rid, n, 0, first=True)
        said[rank] = [r.getMessage().split("rid=")[1].split()[0] for r in caplog.records
                      if "extrapolates" in r.getMessage()]
        events = [d["rid"] for d in map(json.loads, log.read_text().splitlines()) if d["event"] == "extrapolation"]
        assert events == ["a", "b", "c", "d"]
    assert said == {0: ["a", "c"], 1: []}


def test_the_env_table_in_docs_is_the_registry_and_names_every_variable():
    from pathlib import Path

    from sglang_cpp import envs

    doc = (Path(__file__).resolve().parents[2] / "docs" / "env.md").read_text()
    assert doc.endswith(envs.markdown_table()), "docs/env.md is stale: python -m sglang_cpp.envs gives its table"
    rows = {line.split("|")[1].strip().strip("`") for line in doc.splitlines() if line.startswith("| `SGLANG_")}
    names = {n for row in rows for n in row.replace("` / `", " ").split()}
    assert {v.name for v in envs.ALL} <= names and "SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR" in names


def test_bf16_on_a_cpu_without_native_bf16_is_warned():
    from sglang_cpp.machine import cpu_dtype_warning

    assert "--dtype float32" in cpu_dtype_warning("cpu", "torch.bfloat16", native=False)
    assert cpu_dtype_warning("cpu", "torch.bfloat16", native=True) is None
    assert cpu_dtype_warning("cpu", "torch.float32", native=False) is None
    assert cpu_dtype_warning("cuda", "torch.bfloat16", native=False) is None


def test_results_headers_carry_the_commit_the_code_ran_from():
    """Issue 29: a figure is dated against later code by its commit; 'local changes' marks changed Python
    files (a results file the benchmark itself rewrites does not)."""
    import subprocess
    from pathlib import Path

    from sglang_cpp.machine import provenance_lines

    root = Path(__file__).resolve().parents[2]
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--",
                                 "*.py"], capture_output=True, text=True, check=True).stdout.strip())
    lines = provenance_lines("python benchmarks/x.py")
    assert f"- commit: {head}{' + local changes' if dirty else ''}" in lines
    assert lines[-1] == "- command: `python benchmarks/x.py`"


# -- bad configurations fail at startup with the variable and the fix (issue 13's matrix, unit level) ---
def test_min_chunk_above_max_chunk_is_an_error_not_a_clamp():
    with pytest.raises(ValueError, match="SGLANG_CPP_MIN_CHUNK=8192 exceeds SGLANG_CPP_MAX_CHUNK=4096"):
        cfg(min_chunk=8192, max_chunk=4096)
    assert cfg(min_chunk=2048, max_chunk=4096).plan_config().lo == 2048


def test_dynamic_chunking_without_a_chunk_size():
    with pytest.raises(ValueError, match="--enable-dynamic-chunking needs --chunked-prefill-size > 0.*got -1"):
        cfg(chunk_size=-1)
    cfg(chunk_size=-1, dynamic=False)  # plain PP without chunking: nothing to plan, nothing to refuse


@pytest.mark.parametrize("pmeta,needle", [
    ({"model": "/models/Qwen3-8B"}, "measured on model Qwen3-8B but this server serves smollm2-135m"),
    ({"tp": 2}, "measured with tp=2 but this server runs --tp-size 1"),
    ({"dtype": "bfloat16"}, "measured with dtype=bfloat16 but this server runs --dtype float32"),
    ({"num_layers": 24}, "measured with num_layers=24 but this server's model has num_layers=30"),
])
def test_a_profile_from_another_model_tp_or_dtype_is_refused(pmeta, needle):
    from sglang_cpp.plugin.startup.profiles import check_matches

    meta = {"model": "smollm2-135m", "tp": 1, "dtype": "float32", "num_layers": 30, "hidden_size": 576}
    with pytest.raises(ValueError, match=needle):
        check_matches({"meta": pmeta, "samples": []}, meta, "SGLANG_CPP_PROFILE=/p.json", 2)
    check_matches({"meta": {"model": "/elsewhere/smollm2-135m/", "tp": 1, "dtype": "torch.float32"}, "samples": []},
                  meta, "SGLANG_CPP_PROFILE=/p.json", 2)  # the same model in another folder is fine


def test_an_unwritable_cache_dir_fails_before_calibrating(tmp_path, monkeypatch):
    from sglang_cpp.plugin.startup.profiles import check_writable

    blocker = tmp_path / "file"
    blocker.write_text("")  # a folder cannot be created below a file (root can write anywhere else)
    monkeypatch.setenv("SGLANG_CPP_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(ValueError, match=r"SGLANG_CPP_CACHE_DIR=.*cannot write the calibration.*writable folder"):
        check_writable(blocker / "cache" / "calibration")
    check_writable(tmp_path / "ok" / "calibration")


def test_a_bad_layer_partition_is_named_with_a_value_that_works(monkeypatch):
    """The get_pp_indices hook: SGLang's own check says 'sum(partitions)=2 does not match
    num_hidden_layers=4.'; ours names the variable and a partition that works, before SGLang's runs."""
    from sglang_cpp.plugin.hooks import get_pp_indices

    calls = []
    original = lambda n, r, p: calls.append((n, r, p)) or (0, 2)  # noqa: E731
    monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", "1,1")
    with pytest.raises(ValueError, match=r"SGLANG_PP_LAYER_PARTITION='1,1' sums to 2 but the model has 4 layers.*"
                                         r"e\.g\. SGLANG_PP_LAYER_PARTITION=2,2"):
        get_pp_indices(original, 4, 0, 2)
    assert calls == []
    monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", "1,3")
    assert get_pp_indices(original, 4, 1, 2) == (0, 2) and calls == [(4, 1, 2)]
    # the value the message offers really works: taken from the message, it passes through to SGLang
    import re

    from sglang_cpp.core.partition import parse_partition

    for bad, layers, pp in (("1,1", 4, 2), ("9,9,9", 7, 3), ("x", 30, 4), ("", 61, 8)):
        with pytest.raises(ValueError) as exc:
            parse_partition(bad, layers, pp)
        hint = re.search(r"e\.g\. SGLANG_PP_LAYER_PARTITION=([0-9,]+)", str(exc.value)).group(1).rstrip(",")
        assert sum(parse_partition(hint, layers, pp)) == layers, (bad, hint)
        monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", hint)
        calls.clear()
        get_pp_indices(original, layers, 0, pp)
        assert calls == [(layers, 0, pp)]


# -- SGLANG_CPP_BATCH_POLICY (plugin/serving/batch.py) ---------------------------------------------------------
def test_batch_config_names_the_bad_setting_and_its_fix():
    from sglang_cpp.plugin.serving.batch import BatchConfig

    with pytest.raises(ValueError, match=r"SGLANG_CPP_BATCH_POLICY='fastest' is not one of sglang, gllm, time"):
        BatchConfig("fastest", mixed_chunk=True)
    with pytest.raises(ValueError, match=r"add --enable-mixed-chunk"):
        BatchConfig("gllm", mixed_chunk=False)
    with pytest.raises(ValueError, match=r"time sizes chunks with the cost model.*SGLANG_CPP_POLICY=plan"):
        BatchConfig("time", mixed_chunk=True, has_cost=False)
    with pytest.raises(ValueError, match=r"SGLANG_CPP_EVEN_DECODES=1 is part of gLLM's throttling: set "
                                         r"SGLANG_CPP_BATCH_POLICY=gllm or time"):
        BatchConfig("sglang", even_decodes=True)
    assert BatchConfig("sglang").policy == "sglang"  # the default needs neither
    assert BatchConfig("gllm", mixed_chunk=True, even_decodes=True).even_decodes


def test_gllm_budget_is_eq3_on_the_servers_state():
    """#P = max(min(#WP/#T, #MaxP (KV_free - thresh) / (1 - thresh)), #MinP) with #T=8, #MaxP=2048,
    thresh=0.05: by hand, 10,000 waiting tokens with half the KV free give min(1250, 970.1) = 970."""
    from sglang_cpp.plugin.serving.batch import BatchConfig, BatchPolicy

    pol = BatchPolicy(BatchConfig("gllm", mixed_chunk=True), kv_capacity=100_000, depth=2)
    assert pol.start_batch(10_000, 50_000, pending=False, page=1) == 970
    assert pol.start_batch(800, 0, pending=False, page=1) == 100  # #WP/#T binds
    assert pol.start_batch(100, 0, pending=False, page=1) == 32  # #MinP floor
    assert pol.start_batch(10_000, 96_000, pending=False, page=1) == 0  # KV below the threshold: no prefill
    assert pol.start_batch(10_000, 96_000, pending=True, page=64) == 64  # but a chunked request keeps going
    assert pol.ms_left is None  # tokens only
    sglang = BatchPolicy(BatchConfig("sglang"), kv_capacity=100_000, depth=2)
    assert sglang.start_batch(10_000, 0, pending=False, page=1) is None  # SGLang's own budget


def test_time_budget_gives_a_chunk_over_a_long_prefix_fewer_tokens(tmp_path):
    """t(L, x) = 5 + 0.1 x + 1e-5 L x: the budget of 1250 tokens at prefix 0 is 125 ms beyond the fixed
    5 ms. At prefix 0 a request gets 1250 tokens (1216 on a 64-token page); at prefix 20,000 each
    token costs 0.3 ms, so 416 (384 on the page). Every rank logs the same micro-batch decisions."""
    from sglang_cpp.plugin.serving.batch import BatchConfig, BatchPolicy

    cost = CostModel(c0=5.0, b=0.1, e=1e-5)
    logs = [DecisionLog(r, str(tmp_path / f"dec_{r}.jsonl")) for r in (0, 1)]
    for log in logs:
        pol = BatchPolicy(BatchConfig("time", mixed_chunk=True, has_cost=True), kv_capacity=10**6, depth=2,
                          cost=cost, log=log)
        assert pol.start_batch(10_000, 0, pending=False, page=64) == 1250
        assert pol.ms_left == pytest.approx(125.0)
        assert pol.chunk_for("a", 0, 5000, 64) == 1216
        assert pol.ms_left == pytest.approx(125.0 - 121.6)
        assert pol.chunk_for("b", 0, 30, 64) == 30  # a whole short prompt: not aligned, 3 ms
        assert pol.ms_left == pytest.approx(0.4)
        pol.start_batch(10_000, 0, pending=False, page=64)
        assert pol.chunk_for("c", 20_000, 5000, 64) == 384
    rows = [[{k: v for k, v in json.loads(line).items() if k not in ("t", "pp_rank")}
             for line in open(tmp_path / f"dec_{r}.jsonl")] for r in (0, 1)]
    assert rows[0] == rows[1] and [r["event"] for r in rows[0]] == ["batch", "batch_chunk", "batch_chunk", "batch", "batch_chunk"]


def test_a_queue_aware_sizer_replans_at_the_boundary_after_an_arrival_alike_on_every_stage(tmp_path):
    """Two stages fed the same view at the same points: the first chunk is planned alone (nothing in view);
    after two chunks three prompts arrive, and the next boundary replans the remaining chunks on the queue
    (a `queue_plan` event with replan=True naming what it replaced); the stages log identical decisions."""
    from sglang_cpp.core.queue_plan import QueueView, plan_in_queue

    fa, big = CostModel.fa(a=1e-6, b=0.05, c0=20.0), dict(pp_size=4)  # a plan whose chunks shrink to its end
    n, arrivals = 65536, ((65536, 0), (65536, 0), (30000, 4096))
    logs = [tmp_path / f"d{r}.jsonl" for r in (0, 1)]
    seqs = []
    for r in (0, 1):
        state = {"waiting": ()}
        view = lambda rid, st=state: QueueView(waiting=st["waiting"], ids=tuple(f"w{i}" for i in range(len(st["waiting"]))))  # noqa: E731
        s = CppChunkSizer(cfg(r, **big), cost=fa, log=DecisionLog(r, str(logs[r])), queue_view=view)
        s.current_req = lambda: ("a", n)
        L, seq = 0, [s.decide("a", n, 0, first=True)]
        L += seq[-1]
        for k in range(40):
            if L >= n:
                break
            if k == 1:
                state["waiting"] = arrivals
            seq.append(s.predict(L))
            L += seq[-1]
        seqs.append(seq)
    assert seqs[0] == seqs[1] and sum(seqs[0]) == n
    alone = plan_equal_time(n, fa, cfg(**big).plan_config()).chunks
    assert tuple(seqs[0][:2]) == alone[:2]
    at = sum(seqs[0][:2])
    want = plan_in_queue(n, fa, cfg(**big).plan_config(), at, QueueView(waiting=arrivals),
                         alone=plan_equal_time(n, fa, cfg(**big).plan_config(), at)).chunks
    assert tuple(seqs[0][2:]) == want and want != alone[2:]
    events = [[json.loads(x) for x in f.read_text().splitlines() if '"queue_plan"' in x] for f in logs]
    for e in events:
        for d in e:
            d.pop("t"), d.pop("pp_rank")
    assert events[0] == events[1] and len(events[0]) == 1
    ev = events[0][0]
    assert ev["replan"] and ev["prefix"] == at and ev["replaced"] == list(alone[2:])
    assert ev["waiting"] == [list(w) for w in arrivals] and ev["chunks"] == list(want)


def test_a_sizer_with_the_queue_off_plans_every_prompt_alone():
    calls = []
    s = CppChunkSizer(cfg(queue_aware=False), cost=COST, queue_view=lambda rid: calls.append(rid))
    assert tuple(walk(s, "r", 150000, 0)) == plan_equal_time(150000, COST, cfg().plan_config()).chunks
    assert calls == []


def test_a_sizer_plans_on_its_arrival_clock_and_advances_it_once_per_chunk_it_decides(tmp_path):
    """Issue 54 item 3, the sizer's half: the view it plans on carries its ArrivalClock's estimate; the plan
    is the queue-aware plan with that load; the clock moves by each decided chunk's predicted ms once (a
    retried admission of the same chunk does not move it again); every decision record carries the load the
    plan in force was made with, and the finished plan does too (what the response's meta_info reports)."""
    from sglang_cpp.core.load import ArrivalClock, Load
    from sglang_cpp.core.queue_plan import QueueView, plan_in_queue

    fa, big = CostModel.fa(a=1e-6, b=0.05, c0=20.0), dict(pp_size=4)
    n = 65536
    clock = ArrivalClock()
    for t, busy in ((0.0, False), (10.0, True), (20.0, True), (30.0, True)):
        clock.arrive(t, n, busy)
    log = DecisionLog(0, str(tmp_path / "d.jsonl"))
    s = CppChunkSizer(cfg(**big), cost=fa, log=log, queue_view=lambda rid: QueueView(), arrivals=clock)
    load = clock.load()
    assert load == Load(4, 30.0, n, 3)
    want = plan_in_queue(n, fa, cfg(**big).plan_config(), 0, QueueView(load=load),
                         alone=plan_equal_time(n, fa, cfg(**big).plan_config()))
    assert want.meta["queue"]["load"]["expected_prompts"] >= 1  # the load changes this plan
    first = s.decide("a", n, 0, first=True)
    again = s.decide("a", n, 0, first=True)  # SGLang refused the admission and tries it again
    assert first == again == want.chunks[0]
    assert clock.now_ms == 30.0 + want.pred_ms[0]
    s.current_req = lambda: ("a", n)
    L = first
    while L < n:
        L += s.predict(L)
    assert clock.now_ms == pytest.approx(30.0 + sum(want.pred_ms))
    recs = [json.loads(x) for x in (tmp_path / "d.jsonl").read_text().splitlines()]
    decisions = [r for r in recs if r["event"] == "decision"]
    assert [r["chunk"] for r in decisions[1:]] == list(want.chunks)
    assert all(r["load"] == want.meta["queue"]["load"] for r in decisions)
    assert log.finished["a"]["load"] == want.meta["queue"]["load"]
    # the queue off: no clock is kept, no load planned or logged
    off = CppChunkSizer(cfg(queue_aware=False, **big), cost=fa, arrivals=ArrivalClock())
    assert off.arrivals is None


def test_the_cut_fault_makes_one_stage_cut_one_alignment_unit_short():
    """SGLANG_CPP_CUT_FAULT_RANK (a test of the run-time guard): the stage it names cuts each planned chunk longer
    than one alignment unit one unit short; the others cut the plan."""
    plain = CppChunkSizer(cfg(1), cost=COST)
    faulty = CppChunkSizer(cfg(1), cost=COST, cut_fault=True)
    first = plain.decide("r", 150000, 0, first=True)
    assert first > 64 and faulty.decide("r", 150000, 0, first=True) == first - 64
