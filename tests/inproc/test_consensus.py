"""Multi-rank correctness without a server: settings agree or fail fast, rank 0's source wins, errors
travel to every rank, first-chunk limits keep SGLang's deductions, GPU forwards are event-timed."""
from __future__ import annotations

import copy
import json
import logging
import re
from types import SimpleNamespace

import pytest

from sglang_cpp import envs
from sglang_cpp.plugin.startup import consensus
from sglang_cpp.plugin.hooks import first_chunk_limit
from sglang_cpp.plugin.decision_log import DecisionLog
from sglang_cpp.plugin.serving.sizer import CppChunkSizer, SizerConfig
from sglang_cpp.plugin.timing import DeviceTimer, LazyTimes


def snap(**env):
    return consensus.env_snapshot({**{"SGLANG_CPP_POLICY": "plan"}, **env})


def test_snapshot_covers_planning_settings_but_not_per_node_paths():
    s = snap(SGLANG_CPP_CHUNK_OVERHEAD_MS="5", SGLANG_CPP_CACHE_DIR="/node1", SGLANG_CPP_DECISION_LOG="/x")
    assert s["SGLANG_CPP_CHUNK_OVERHEAD_MS"] == "5" and s["SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR"] == ""
    assert "SGLANG_CPP_CACHE_DIR" not in s and "SGLANG_CPP_DECISION_LOG" not in s
    assert {v.name for v in envs.ALL if not v.node_local} <= set(s)


def test_the_old_overhead_name_still_counts(monkeypatch):
    """SGLANG_CPP_P2P_MS is read for one release as SGLANG_CPP_CHUNK_OVERHEAD_MS: by the sizer's getter, by
    the rank agreement check, and a bad value is reported under the name the user set."""
    assert snap(SGLANG_CPP_P2P_MS="7")["SGLANG_CPP_CHUNK_OVERHEAD_MS"] == "7"
    monkeypatch.setenv("SGLANG_CPP_P2P_MS", "7")
    assert envs.CHUNK_OVERHEAD_MS.get() == 7.0
    monkeypatch.setenv("SGLANG_CPP_CHUNK_OVERHEAD_MS", "2")  # the new name wins
    assert envs.CHUNK_OVERHEAD_MS.get() == 2.0
    monkeypatch.delenv("SGLANG_CPP_CHUNK_OVERHEAD_MS")
    monkeypatch.setenv("SGLANG_CPP_P2P_MS", "fast")
    with pytest.raises(ValueError, match="SGLANG_CPP_P2P_MS='fast' is invalid"):
        envs.CHUNK_OVERHEAD_MS.get()


def test_identical_ranks_agree_and_one_value_changed_anywhere_is_named():
    """Three ranks with equal (not shared) settings pass; then each value of each section, changed on the last
    rank alone, fails naming that value: the check compares every entry it is given, not a sample of them."""
    g = {"env": snap(SGLANG_CPP_CHUNK_OVERHEAD_MS="5"), "planner": consensus.planner_inputs(),
         "config": {"chunk_size": 1024, "page_size": 1}, "error": ""}
    assert consensus.check_agreement([g, copy.deepcopy(g), copy.deepcopy(g)]) is None
    for section in ("env", "planner", "config"):
        for key in g[section]:
            other = copy.deepcopy(g)
            other[section][key] = f"{other[section][key]}-changed"
            with pytest.raises(ValueError, match=f"{re.escape(key)} differs between ranks.*world rank 2"):
                consensus.check_agreement([g, copy.deepcopy(g), other])


def test_an_env_set_on_one_node_only_fails_naming_it():
    ranks = [{"env": snap(), "config": {}, "error": ""}, {"env": snap(SGLANG_CPP_CHUNK_OVERHEAD_MS="5"), "config": {}, "error": ""}]
    with pytest.raises(ValueError, match=r"SGLANG_CPP_CHUNK_OVERHEAD_MS differs.*rank 0 has ''.*rank 1 has '5'"):
        consensus.check_agreement(ranks)


def test_a_server_argument_that_differs_fails_naming_it():
    ranks = [{"env": snap(), "config": {"chunk_size": 1024}, "error": ""},
             {"env": snap(), "config": {"chunk_size": 2048}, "error": ""}]
    with pytest.raises(ValueError, match="server setting chunk_size differs.*1024.*2048"):
        consensus.check_agreement(ranks)


def test_a_node_with_another_numpy_or_cpu_type_fails_naming_what_differs():
    """Issue 45 item 9, issue 56: the planner's inputs besides its settings (numpy / scipy / libc builds, the
    planner's own code, a probe of the libm its logs and exponentials come from) must agree, or a near-tie
    rounded the other way on one stage cuts another chunk there. numpy's SIMD dispatch is no longer one of them
    (the planner is bit-identical across it: tests/unit/test_bit_identity.py), so nodes of two CPU types agree."""
    mine = consensus.planner_inputs()
    assert {"numpy", "scipy", "sglang-cpp code", "python", "libc", "arch", "libm probe"} <= set(mine)
    assert "numpy SIMD" not in mine
    assert mine == consensus.planner_inputs()  # stable within a process
    import os
    import subprocess
    import sys
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    on = " ".join(f for f in __cpu_dispatch__ if __cpu_features__.get(f))
    code = "from sglang_cpp.plugin.startup import consensus; print(consensus.planner_inputs()['libm probe'])"
    other_cpu = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300,
                               env={**os.environ, "NPY_DISABLE_CPU_FEATURES": on}).stdout.strip()
    assert other_cpu == mine["libm probe"]  # numpy on its baseline SIMD path: the same probe
    import hashlib  # the code hashed is the whole package: the planner (core) and the sizer (plugin) alike
    from pathlib import Path

    import sglang_cpp
    pkg = Path(sglang_cpp.__file__).resolve().parent
    h = hashlib.sha256()
    for f in sorted(pkg.rglob("*.py")):
        h.update(str(f.relative_to(pkg)).encode() + b"\0" + f.read_bytes())
    assert mine["sglang-cpp code"] == h.hexdigest()[:12]
    assert (pkg / "core" / "planner.py").is_file() and (pkg / "plugin" / "serving" / "sizer.py").is_file()
    other = mine["libm probe"] + "0"
    ranks = [{"env": snap(), "planner": mine, "config": {}, "error": ""},
             {"env": snap(), "planner": {**mine, "libm probe": other}, "config": {}, "error": ""}]
    with pytest.raises(ValueError, match=r"planner's libm probe differs between ranks.*0'"):
        consensus.check_agreement(ranks)
    consensus.check_agreement([ranks[0], dict(ranks[0])])  # the same everywhere: agreed
    ranks[1]["planner"] = {**mine, "numpy": "0.0.1"}
    with pytest.raises(ValueError, match=r"planner's numpy differs.*'0.0.1'.*same numpy, scipy, sglang-cpp and C"):
        consensus.check_agreement(ranks)


PLAN_IN_A_PROCESS = """
import json
from sglang_cpp.core.costmodel import CostModel, PipelineCost, with_overheads
from sglang_cpp.core.planner import PlanConfig, plan_equal_time
from sglang_cpp.core.queue_plan import QueueView, plan_in_queue
cost = PipelineCost((CostModel(c0=4.1, g=1e-5, b=0.051, d=1e-9, e=2.1e-6, f=1.05e-6),
                     CostModel(c0=3.9, b=0.05, e=2e-6, f=1e-6)))
out = []
for n in (20000, 65536, 131072, 200000):
    for P in (2, 4, 8):
        cfg = PlanConfig.from_server(pp_size=P, chunk_size=8192, max_prefill_tokens=16384)
        charged = with_overheads(cost, 2.0, P)
        out.append(plan_equal_time(n, charged, cfg).chunks)
        out.append(plan_in_queue(n, charged, cfg, 0, QueueView(((0, 4096),), ((n, 0), (9000, 512)))).chunks)
print(json.dumps(out))
"""


def test_two_processes_with_different_blas_threads_plan_identically():
    """Issue 45 item 9: every stage plans in its own process; the plans (single-prompt and queue-aware, PP2-8,
    20K-200K tokens) do not depend on how many BLAS / OpenMP threads numpy runs with."""
    import os
    import subprocess
    import sys

    runs = []
    for threads in ("1", "2"):
        env = {**os.environ, "OMP_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        runs.append(subprocess.run([sys.executable, "-c", PLAN_IN_A_PROCESS], capture_output=True, text=True,
                                   env=env, check=True, timeout=300).stdout)
    assert runs[0] == runs[1] and len(json.loads(runs[0])) == 24


def test_one_ranks_bad_value_fails_every_rank_with_its_reason():
    ranks = [{"env": snap(), "config": {}, "error": ""},
             {"env": snap(), "config": {}, "error": "SGLANG_CPP_MIN_CHUNK='x' is invalid"}]
    with pytest.raises(ValueError, match="rank 1: SGLANG_CPP_MIN_CHUNK='x' is invalid"):
        consensus.check_agreement(ranks)


class TwoRanks:
    """A fake all_gather over two ranks run one after the other: rank 0's payload is kept for rank 1."""

    def __init__(self):
        self.seen = []

    def __call__(self, payload):
        self.seen.append(payload)
        return [self.seen[0], payload]


def test_rank0_resolves_and_the_other_rank_never_reads_its_own():
    g = TwoRanks()
    assert consensus.from_rank0(lambda: {"kind": "cache", "doc": 1}, rank=0, gather=g) == {"kind": "cache", "doc": 1}

    def node1_would_calibrate():
        raise AssertionError("rank 1 must not resolve on its own")
    assert consensus.from_rank0(node1_would_calibrate, rank=1, gather=g) == {"kind": "cache", "doc": 1}


def test_rank0s_error_is_raised_on_every_rank():
    g = TwoRanks()

    def bad():
        raise ValueError("SGLANG_CPP_PROFILE=/p: not JSON")
    for rank in (0, 1):
        with pytest.raises(ValueError, match="SGLANG_CPP_PROFILE=/p: not JSON"):
            consensus.from_rank0(bad, rank=rank, gather=g)


def test_a_failure_on_any_rank_fails_all():
    results = [{"ok": True, "value": 1}, {"ok": False, "error": "RuntimeError: fit failed"}]
    with pytest.raises(RuntimeError, match="rank 1: RuntimeError: fit failed"):
        consensus.on_every_rank(lambda: 1, gather=lambda p: results)
    assert consensus.on_every_rank(lambda: 7, gather=lambda p: [p, p]) == [7, 7]



def test_a_rank_that_fails_logs_its_error_and_a_stuck_gather_names_it_when_the_deadline_ends_it(caplog):
    """A rank failing inside the overhead probe can meet peers still inside a collective: its gather then waits
    until the startup deadline, whose message must carry this rank's own error, not only the phase."""
    import threading
    from sglang_cpp.plugin.startup import deadline

    expired, stuck = [], threading.Event()

    def gather_that_hangs(payload):
        stuck.wait(10)  # the peers never arrive; the deadline ends the wait
        return [payload]

    def probe():
        raise RuntimeError("NCCL recv of 'hidden_states' timed out on PP1")
    with deadline.startup_deadline(0.2, "PP1 TP0", expire=lambda msg: (expired.append(msg), stuck.set())):
        with caplog.at_level(logging.ERROR, logger="sglang_cpp"), pytest.raises(RuntimeError, match="rank 0"):
            consensus.on_every_rank(probe, gather=gather_that_hangs)
    assert "NCCL recv of 'hidden_states' timed out on PP1" in caplog.text  # logged on the failing rank itself
    assert len(expired) == 1 and "this rank had failed: RuntimeError: NCCL recv of 'hidden_states'" in expired[0]

# -- first-chunk limit (PrefillAdder_add_one_req) ----------------------------------------------------
def test_planned_cut_keeps_its_size():
    assert first_chunk_limit(2048, 10000, 4096, 1) == 2048


def test_last_chunk_is_rounded_up_to_a_page():
    # SGLang compares ceil_page(remaining)=1008 with the limit: 1000 would split off a sub-page pass
    assert first_chunk_limit(1000, 1000, 512, 16) == 1008
    assert first_chunk_limit(1000, 1000, 4096, 16) == 4096  # the static limit already fits it


def test_mixed_chunk_decode_tokens_ride_on_top_of_a_planned_cut():
    """Under --enable-mixed-chunk upstream's limit has the decode tokens taken out (4096 - 3); a planned
    cut is the request's own tokens, and a final 2-token piece under 2 decodes stays 2 (not 0), as long
    as the forward stays within --max-prefill-tokens (`room`, what is left of it after the decodes)."""
    assert first_chunk_limit(2048, 10000, 4096 - 3, 1, room=16384 - 3) == 2048
    assert first_chunk_limit(1000, 1000, 100, 16, room=16384 - 3) == 1008
    assert first_chunk_limit(2, 2, 0, 1, room=16384 - 2) == 2
    assert first_chunk_limit(2048, 10000, 4096 - 3, 1, room=2048 - 3) == 2045  # the forward's cap binds
    assert first_chunk_limit(3000, 3000, 100, 16, room=2048 - 3) == 2045
    assert first_chunk_limit(None, 10000, 4093, 1, room=16381) == 4093  # no decision: upstream's own limit


def test_adder_init_reads_the_mixed_deduction(monkeypatch):
    """The decode tokens upstream took out come back whether SGLang passed them by position, by name or
    not at all (0): read from the bound arguments, where the planned chunk gets them back."""
    from sglang_cpp.plugin import hooks, state

    monkeypatch.setattr(state, "FORMING", SimpleNamespace(chunked_req=object()))
    monkeypatch.setattr(state, "ACTIVE", object())
    args = (1, None, None, None, 1.0, 16384, 4096)  # page_size .. rem_chunk_tokens
    for extra, kw, mixed in (((5,), {}, 5), ((), {"num_mixed_decode_tokens": 7}, 7), ((), {}, 0)):
        adder = SimpleNamespace(rem_chunk_tokens=1000, rem_input_tokens=16384)
        hooks.PrefillAdder_init(None, adder, *args, *extra, **kw)
        assert adder.rem_chunk_tokens - 1000 == mixed


def test_a_continuing_planned_chunk_gets_the_mixed_decode_tokens_back(monkeypatch):
    """Upstream's __init__ turned the plan's next chunk (predict() = 2, the final piece) into a budget of
    2 - 2 decode tokens = 0: the chunked request then ran a 0-token extend (SIGFPE in the CPU flash
    kernel on the real PP=2 server). With the plan in charge the 2 tokens come back; without it, not."""
    from sglang_cpp.plugin import hooks, state

    args = (1, None, None, None, 1.0, 16384, 2)  # page_size .. rem_chunk_tokens (the plan's predict())
    monkeypatch.setattr(state, "FORMING", SimpleNamespace(chunked_req=object()))
    monkeypatch.setattr(state, "ACTIVE", object())
    adder = SimpleNamespace(rem_chunk_tokens=2 - 2, rem_input_tokens=16384 - 2)  # as upstream's __init__ leaves it
    hooks.PrefillAdder_init(None, adder, *args, num_mixed_decode_tokens=2)
    assert adder.rem_chunk_tokens == 2
    adder = SimpleNamespace(rem_chunk_tokens=16384 - 2, rem_input_tokens=16384 - 2)  # a max-size planned chunk
    hooks.PrefillAdder_init(None, adder, *args, num_mixed_decode_tokens=2)
    assert adder.rem_chunk_tokens == 16384 - 2  # the forward stays within --max-prefill-tokens
    monkeypatch.setattr(state, "ACTIVE", None)  # upstream's sizer (or none): its own budget stands
    adder = SimpleNamespace(rem_chunk_tokens=2 - 2, rem_input_tokens=16384 - 2)
    hooks.PrefillAdder_init(None, adder, *args, num_mixed_decode_tokens=2)
    assert adder.rem_chunk_tokens == 0


def test_plan_aligns_to_sglangs_whole_grid():
    from sglang_cpp.core.costmodel import CostModel

    c = SizerConfig(policy="plan", pp_size=2, pp_rank=0, chunk_size=4096, max_prefill_tokens=16384, page_size=16,
                    context_len=1 << 20, align=192)  # e.g. startup.install._align with a mamba grid of 192
    assert c.plan_config().align == 192
    s = CppChunkSizer(c, cost=CostModel.fa(a=1e-6, b=0.05, c0=20))
    plan = s.plan_for("r", 100003, 0)
    assert all(x % 192 == 0 for x in plan.chunks[:-1]) and sum(plan.chunks) == 100003


# -- decision log ---------------------------------------------------------------------------------
def test_decision_log_path_expands_every_rank(tmp_path):
    d = DecisionLog(1, str(tmp_path / "d_{rank}_{pp_rank}_{tp_rank}.jsonl"), tp_rank=1, rank=3)
    assert d.path.endswith("d_3_1_1.jsonl")
    assert DecisionLog(1, str(tmp_path / "d_{rank}.jsonl")).path.endswith("d_1.jsonl")  # PP only: pp rank


def test_one_info_line_per_request_and_decisions_at_debug(tmp_path, caplog):
    log = DecisionLog(0, str(tmp_path / "d.jsonl"))
    with caplog.at_level(logging.DEBUG, logger="sglang_cpp"):
        for prefix, chunk in ((0, 100), (100, 80), (180, 20)):
            log.write("decision", rid="r", prefix=prefix, chunk=chunk, prompt_len=200, predicted_ms=1.0, policy="plan")
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert info == ["[sglang-cpp] PP0 request rid=r prompt=200 prefix=0 chunks=[100, 80, 20] predicted_ms=3.0 (plan)"]
    assert len(debug) == 3
    assert len((tmp_path / "d.jsonl").read_text().splitlines()) == 3
    caplog.clear()
    other = DecisionLog(1, str(tmp_path / "d1.jsonl"), rank=1)  # the next stage: its file, no console line
    with caplog.at_level(logging.DEBUG, logger="sglang_cpp"):
        for prefix, chunk in ((0, 100), (100, 80), (180, 20)):
            other.write("decision", rid="r", prefix=prefix, chunk=chunk, prompt_len=200, predicted_ms=1.0,
                        policy="plan")
    assert [r for r in caplog.records if r.levelno == logging.INFO] == []
    assert len((tmp_path / "d1.jsonl").read_text().splitlines()) == 3


def test_a_servers_decision_log_buffers_hot_path_lines_and_flushes_them_in_order(tmp_path):
    """Issue 28: forwards, decode steps and micro-batch budgets wait in memory; any other event, a full
    buffer, flush() and exit write them, in the order they were logged."""
    from sglang_cpp.plugin import decision_log

    import threading

    path = tmp_path / "d.jsonl"
    log = DecisionLog(0, str(path), buffer_lines=4)
    writers = []
    real = log._write_file
    log._write_file = lambda lines: writers.append(threading.current_thread().name) or real(lines)

    def lines():  # what is on disk once the writer thread has written what it was handed
        decision_log._WRITER.drain()
        return [json.loads(x)["event"] for x in path.read_text().splitlines()] if path.exists() else []
    log.write("forward", ms=1.0)
    log.write("decode_forward", ms=2.0)
    assert lines() == []  # hot: buffered
    log.write("refit", version=1)  # not hot: everything goes out, in order
    assert lines() == ["forward", "decode_forward", "refit"]
    for ev in ("batch", "batch_chunk", "admit_cap"):
        log.write(ev)
    assert len(lines()) == 3
    log.write("step")  # the fourth buffered line fills the buffer
    assert lines()[3:] == ["batch", "batch_chunk", "admit_cap", "step"]
    log.write("forward", ms=3.0)
    log.flush()
    assert lines()[-1] == "forward"
    log.write("forward", ms=4.0)
    decision_log._flush_all()  # what atexit runs
    assert lines().count("forward") == 3
    # issue 45 item 8: every write on the writer thread, none on the scheduler's (this one)
    assert writers and set(writers) == {"sglang-cpp-decision-log"}
    assert DecisionLog(0, str(tmp_path / "plain.jsonl")).buffer_lines == 0  # tools and tests: line by line


def test_a_pass_that_plans_no_batch_flushes_the_decision_log(tmp_path, monkeypatch):
    """Issue 45 item 8: SGLang 0.5.23's get_next_batch_to_run returns a NextBatchPlan, never None
    (managers/scheduler.py:3894, schedule_batch.py:4138); a plan with no batch to run (an idle scheduler, an
    empty micro-batch slot under PP) hands the buffered lines to the writer."""
    from sglang.srt.managers.schedule_batch import NextBatchPlan

    from sglang_cpp.plugin import decision_log, hooks, state

    path = tmp_path / "d.jsonl"
    log = DecisionLog(0, str(path), buffer_lines=256)
    monkeypatch.setattr(state, "LOG", log)
    monkeypatch.setattr(state, "BATCH", None)
    log.write("decode_forward", ms=1.0)
    running = SimpleNamespace(reqs=[])
    busy = NextBatchPlan(batch_to_run=SimpleNamespace(reqs=[1]), running_batch=running)
    assert hooks.Scheduler_get_next_batch_to_run(lambda self, **k: busy, None, running_batch=running) is busy
    decision_log._WRITER.drain()
    assert not path.exists()  # a batch to run: still buffered
    idle = NextBatchPlan(batch_to_run=None, running_batch=running)
    assert hooks.Scheduler_get_next_batch_to_run(lambda self, **k: idle, None, running_batch=running) is idle
    decision_log._WRITER.drain()
    assert [json.loads(x)["ms"] for x in path.read_text().splitlines()] == [1.0]
    # the PD loops never call get_next_batch_to_run; every loop calls on_idle on an idle pass (scheduler.py:5241)
    log.write("decode_forward", ms=2.0)
    assert hooks.Scheduler_on_idle(None, None) is None
    decision_log._WRITER.drain()
    assert [json.loads(x)["ms"] for x in path.read_text().splitlines()] == [1.0, 2.0]


def test_report_plans_says_when_a_prompt_ran_its_last_chunk(tmp_path):
    """Scheduler_run_batch flushes the decision log when this is true: a request's lines are on disk
    before its first token reaches the client."""
    from sglang_cpp.plugin.serving import forwards

    log = DecisionLog(0, "", buffer_lines=256)
    req = SimpleNamespace(rid="plans-r", origin_input_ids=[0] * 10, customized_info=None)
    assert forwards._report_plans(log, [req], [0], [6]) is False
    assert forwards._report_plans(log, [req], [6], [4]) is True
    assert req.customized_info["sglang_cpp_plan"][0]["ran"] == [6, 4]


# -- timing ---------------------------------------------------------------------------------------
class FakeEvent:
    clock = 0.0

    def __init__(self):
        self.t, self.complete = None, False

    def record(self):
        self.t = FakeEvent.clock

    def query(self):
        return self.complete

    def synchronize(self):
        self.complete = True

    def elapsed_time(self, end):
        return end.t - self.t


def test_gpu_forward_time_comes_from_events_resolved_later():
    timers, lazy = [], LazyTimes()
    for i, dur in enumerate((5.0, 7.0)):
        t = DeviceTimer("cuda:0", event_factory=FakeEvent)
        FakeEvent.clock = 100.0 * i
        t.start()
        FakeEvent.clock += dur  # what the device took; the host returned long before
        t.stop()
        lazy.add(t, {"i": i})
        timers.append(t)
    assert lazy.drain() == []  # nothing completed yet: nothing written, nothing waited for
    timers[1]._e1.complete = True
    assert lazy.drain() == []  # in order: the first is still running
    timers[0]._e1.complete = True
    assert lazy.drain() == [{"i": 0, "ms": 5.0}, {"i": 1, "ms": 7.0}]


def test_fit_rejects_launch_timed_forwards(tmp_path):
    from sglang_cpp.tuning.fit import read_decision_log

    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(json.dumps({"event": "forward", "pp_rank": 0, "rids": ["r"], "prefix": [L], "chunk": [512],
                                       "ms": 0.3, "synchronous": False}) for L in (0, 512, 1024)) + "\n")
    with pytest.raises(ValueError, match="synchronous=false"):
        read_decision_log([p])


def test_plan_starts_after_the_device_prefix_and_the_host_hit(monkeypatch):
    """SGLang admits a request at prefix_len + host_hit_length (HiCache L2 hit): the plan starts there."""
    from sglang_cpp.core.costmodel import CostModel
    from sglang_cpp.plugin import hooks, state

    c = SizerConfig(policy="plan", pp_size=2, pp_rank=0, chunk_size=1024, max_prefill_tokens=4096, page_size=1,
                    context_len=1 << 20)
    sizer = CppChunkSizer(c, cost=CostModel.fa(a=1e-6, b=0.05, c0=20))
    seen = []
    monkeypatch.setattr(sizer, "decide", lambda rid, n, prefix, first: seen.append((n, prefix)) or 512)
    monkeypatch.setattr(state, "ACTIVE", sizer)
    adder = SimpleNamespace(rem_chunk_tokens=1024, rem_input_tokens=16384, can_run_list=[], page_size=1)
    req = SimpleNamespace(rid="r", full_untruncated_fill_ids=[0] * 20000, prefix_len=3000, host_hit_length=6000)
    out = hooks.PrefillAdder_add_one_req(lambda self, r, *a, **k: self.rem_chunk_tokens, adder, req, False, None)
    assert seen == [(20000, 9000)] and out == 512


def test_alignment_is_the_lcm_of_sglangs_grids():
    from sglang_cpp.plugin.startup.install import _align

    assert _align(SimpleNamespace(page_size=1, truncation_align_size=None)) == 64
    assert _align(SimpleNamespace(page_size=16, truncation_align_size=None)) == 64
    assert _align(SimpleNamespace(page_size=96, truncation_align_size=None)) == 192
    assert _align(SimpleNamespace(page_size=16, truncation_align_size=4096)) == 4096  # flashinfer deterministic


def test_online_refinement_fits_single_chunks_but_not_one_that_loaded_host_kv_back():
    """Issue 45 item 10: a chunk whose forward waited for HiCache's load back (SGLang's per-layer wait_until,
    inside the timed window) is no sample of what a chunk costs; nor is a batch of several requests."""
    from sglang_cpp.plugin.serving.forwards import online_sample

    one = {"event": "forward", "rids": ["a"], "prefix": [4096], "chunk": [1024], "ms": 12.5}
    assert online_sample(one) == (4096, 1024, 12.5)
    assert online_sample({**one, "host_loaded": True}) is None
    assert online_sample({**one, "replay": True}) is None  # an encoder-SWA replay ran first in the window
    assert online_sample({**one, "rids": ["a", "b"], "prefix": [0, 9], "chunk": [5, 6]}) is None
    assert online_sample({**one, "event": "decode_forward"}) is None


class FakeGloo:
    """In-process point-to-point with gloo's semantics as online.py uses them: isend queues, irecv fills its
    tensor when a message from that source and tag arrives (posted before or after), recv takes the next."""

    def __init__(self):
        from collections import defaultdict, deque

        self.box, self.posted = defaultdict(deque), defaultdict(deque)

    def at(self, rank: int):
        gloo = self

        class Dist:
            def isend(self, t, dst, group=None, tag=0):
                key = (rank, dst, tag)
                if gloo.posted[key]:
                    gloo.posted[key].popleft().copy_(t)
                else:
                    gloo.box[key].append(t.clone())
                return SimpleNamespace(wait=lambda: None)

            def irecv(self, t, src, group=None, tag=0):
                key = (src, rank, tag)
                if gloo.box[key]:
                    t.copy_(gloo.box[key].popleft())
                else:
                    gloo.posted[key].append(t)
                return SimpleNamespace(wait=lambda: None)

            def recv(self, t, src, group=None, tag=0):
                t.copy_(gloo.box[(src, rank, tag)].popleft())

        return Dist()


def test_online_refits_reach_every_dp_group_under_local_control_broadcast(monkeypatch):
    """Issue 45 item 3: with DP attention and local control broadcast, SGLang 0.5.23 broadcasts control
    messages inside each DP group only (request_receiver.py:181-191), so an update in world rank 0's pulled
    list reaches DP group 0 alone. World rank 0 sends it to the other groups' PP0 leaders (the ranks that
    pull for their group, request_receiver.py:112-125), each of which puts it into its own pulled list.
    World ranks here: PP0 = 0..3 (two DP groups of attention TP 2: leaders 0 and 2), PP1 = 4..7."""
    from sglang_cpp.core.costmodel import CostModel, PipelineCost
    from sglang_cpp.plugin import hooks, state
    from sglang_cpp.plugin.serving.online import ModelUpdate, Online

    cost = PipelineCost((CostModel.fa(a=1e-6, b=0.05, c0=20.0),) * 2)
    log = DecisionLog(0, "")
    gloo = FakeGloo()
    make = lambda r, pp: Online(cost, [], rank=r, leaders=[0, 4], pp_rank=pp, log=log,  # noqa: E731
                                group=None, dist=gloo.at(r), relays=(2,))
    rank0, relay, other = make(0, 0), make(2, 0), make(1, 0)
    assert rank0.injects and relay.injects and not other.injects
    upd = ModelUpdate(version=3, model=cost.to_dict(), overheads=[0.0, 0.0], covered=4096)
    rank0._pending = upd
    pulled = {}
    for name, online in (("rank0", rank0), ("relay", relay), ("other", other)):
        monkeypatch.setattr(state, "ONLINE", online)
        monkeypatch.setattr(state, "PP_RANK", 0)
        pulled[name] = hooks.SchedulerRequestReceiver__pull_raw_reqs(lambda self: ["req"], None)
    assert pulled["rank0"] == ["req", upd]
    assert pulled["relay"][0] == "req" and pulled["relay"][1].version == 3 and len(pulled["relay"]) == 2
    assert pulled["other"] == ["req"]  # an attention-TP follower gets it through its group's broadcast
    monkeypatch.setattr(state, "ONLINE", relay)
    assert hooks.SchedulerRequestReceiver__pull_raw_reqs(lambda self: [], None) == []  # once per update


@pytest.mark.parametrize("par,joiner,relays", [
    (dict(attn_dp_enabled=True, pp_rank=0, attn_tp_rank=0, attn_cp_rank=0,
          enable_dp_attention_local_control_broadcast=True), False, True),
    (dict(attn_dp_enabled=True, pp_rank=0, attn_tp_rank=0, attn_cp_rank=0,
          enable_dp_attention_local_control_broadcast=False), True, True),  # an elastic-EP joiner
    (dict(attn_dp_enabled=True, pp_rank=0, attn_tp_rank=0, attn_cp_rank=0,
          enable_dp_attention_local_control_broadcast=False), False, False),  # rank 0's broadcast reaches all
    (dict(attn_dp_enabled=True, pp_rank=0, attn_tp_rank=1, attn_cp_rank=0,
          enable_dp_attention_local_control_broadcast=True), False, False),  # not the one that pulls
    (dict(attn_dp_enabled=True, pp_rank=1, attn_tp_rank=0, attn_cp_rank=0,
          enable_dp_attention_local_control_broadcast=True), False, False),  # later stages get it relayed
    (dict(attn_dp_enabled=False, pp_rank=0, attn_tp_rank=0, attn_cp_rank=0,
          enable_dp_attention_local_control_broadcast=True), False, False),
])
def test_which_ranks_relay_refits_to_their_dp_group(par, joiner, relays, monkeypatch):
    import sglang.srt.runtime_context as rc

    from sglang_cpp.plugin.startup.install import _relays_updates

    monkeypatch.setattr(rc, "get_exec", lambda: SimpleNamespace(moe=SimpleNamespace(is_ep_scale_joiner=joiner)))
    assert _relays_updates(SimpleNamespace(**par)) is relays


def test_calibration_samples_the_alignment_sglang_settles_after_the_sizer(monkeypatch):
    """Issue 45 item 11: SGLang 0.5.23 sets its truncation alignment (deterministic flashinfer: the 4096-token
    split tile) after the sizer is built (scheduler.py:657 against 698-700), so the startup grid was 64 and
    calibration and coverage sampled shapes the server never runs. SGLang's own setters, run ahead on a
    stand-in, give the served grid."""
    import sglang.srt.managers.scheduler as sm

    from sglang_cpp.plugin.startup.install import _align, _settled_align

    hf = SimpleNamespace(architectures=["LlamaForCausalLM"], model_type="llama")
    sched = SimpleNamespace(page_size=1, truncation_align_size=None, model_config=SimpleNamespace(hf_config=hf))
    det = lambda on: SimpleNamespace(deterministic=SimpleNamespace(enable_deterministic_inference=on))  # noqa: E731
    monkeypatch.setattr(sm, "attention_backends", lambda: ("flashinfer", "flashinfer"))
    monkeypatch.setattr(sm, "get_exec", lambda: det(True))
    assert _align(sched) == 64 and _settled_align(sched) == 4096
    monkeypatch.setenv("SGLANG_FLASHINFER_PREFILL_SPLIT_TILE_SIZE", "2048")
    assert _settled_align(sched) == 2048
    monkeypatch.setattr(sm, "get_exec", lambda: det(False))
    assert _settled_align(sched) == 64
    monkeypatch.setattr(sm, "attention_backends", lambda: ("triton", "triton"))
    monkeypatch.setattr(sm, "get_exec", lambda: det(True))
    assert _settled_align(sched) == 64  # triton tiles keys at absolute positions: no alignment


def test_rank0s_error_of_any_type_reaches_every_rank():
    """Review finding: rank 0 raised a TypeError (a field of the wrong type) alone while its peers waited in the
    gather; now any exception travels, a ValueError as itself and the rest as a RuntimeError naming the type."""
    g = TwoRanks()

    def bad():
        return int([8192])
    for rank in (0, 1):
        with pytest.raises(RuntimeError, match="TypeError: int\\(\\) argument must be"):
            consensus.from_rank0(bad, rank=rank, gather=g)
