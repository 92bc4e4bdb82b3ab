"""The serving step's cost beyond its forward and waits, and the plugin's own cost per step
(sglang_cpp/plugin/serving/steps.py), on a fake clock: no SGLang, no timing."""
from __future__ import annotations

import pytest

from sglang_cpp.plugin import STEP_PATH, TARGETS
from sglang_cpp.plugin.serving import steps


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t

    def tick(self, ms: float):
        self.t += ms / 1e3


@pytest.fixture
def fake(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(steps, "clock", clock)
    monkeypatch.setattr(steps, "CLOCK", steps.StepClock())
    return clock


def test_a_step_is_the_gap_less_the_forward_and_the_waits(fake):
    c = steps.CLOCK
    assert c.forward_start() is None  # nothing before the first forward
    fake.tick(40)  # the forward
    c.forward_end("r1", 40.0)
    fake.tick(3)  # loop work
    steps.Scheduler__pp_recv_typed_dict(lambda self: fake.tick(25), None)  # a wait on the other stage
    fake.tick(2)
    steps.Scheduler__pp_commit_comm_work(lambda self, work: fake.tick(5), None, [])
    fake.tick(1)
    s = c.forward_start()
    assert s["rid"] == "r1" and s["gap_ms"] == pytest.approx(76.0) and s["blocked_ms"] == pytest.approx(30.0)
    assert s["loop_ms"] == pytest.approx(6.0) and s["plugin_ms"] == 0.0
    c.forward_end(None, None)  # a batch of two requests, a decode or a CUDA forward: no step after it
    fake.tick(10)
    assert c.forward_start() is None


def test_a_timed_hook_counts_its_own_time_not_the_call_it_wraps(fake):
    def around(original, x):  # 1 ms before, the call (50 ms), 2 ms after
        fake.tick(1)
        out = original(x)
        fake.tick(2)
        return out

    def after(result, x):
        fake.tick(0.5)

    steps.CLOCK.forward_start()
    assert steps.timed(around, "AROUND")(lambda x: fake.tick(50) or x + 1, 4) == 5
    steps.timed(after, "AFTER")(None, 4)
    fake.tick(7)
    s = steps.CLOCK.forward_start()
    assert s is None and steps.CLOCK.plugin == 0.0  # reset at each forward start
    steps.CLOCK.forward_end("r", 1.0)
    steps.timed(around, "AROUND")(lambda x: fake.tick(50), 0)
    assert steps.CLOCK.forward_start()["plugin_ms"] == pytest.approx(3.0)


def test_every_step_path_hook_is_a_target():
    assert STEP_PATH <= {fn for fn, _ in TARGETS.values()}
    assert "TorchNativeAttnBackend__run_sdpa_forward_extend" not in STEP_PATH  # compute, not overhead


def test_a_served_forward_is_timed_over_model_runner_forward_alone(fake, monkeypatch, tmp_path):
    """Issue 45 item 5: serving times the window calibration times, ModelRunner.forward alone. SGLang 0.5.23's
    run_batch -> TpModelWorker.forward_batch_generation builds the ForwardBatch, runs the runner's forward,
    then samples on the last stage (managers/tp_worker.py:622-680); a runner that is neither the scheduler's nor
    its speculative draft's is not timed. The fake clock drives the host timer (timing.py), so the logged ms is
    exact."""
    import json
    import time
    from types import SimpleNamespace

    from sglang_cpp.plugin.serving import forwards
    from sglang_cpp.plugin import hooks, state
    from sglang_cpp.plugin.decision_log import DecisionLog

    monkeypatch.setattr(time, "perf_counter", fake)
    log = DecisionLog(0, str(tmp_path / "dec_{rank}.jsonl"), rank=0)
    monkeypatch.setattr(state, "LOG", log)
    monkeypatch.setattr(state, "ONLINE", None)
    runner, draft = object(), object()
    model_forward = lambda self: fake.tick(30)  # noqa: E731  the model's own 30 ms

    def run_batch(sched, batch):  # SGLang's run_batch, as the worker calls it
        fake.tick(5)  # ForwardBatch.init_new
        hooks.ModelRunner_forward(model_forward, draft)  # another runner (no draft worker here): untimed
        hooks.ModelRunner_forward(model_forward, runner)
        fake.tick(4)  # sampling
        return "out"

    batch = SimpleNamespace(reqs=[SimpleNamespace(rid="r1", origin_input_ids=[0] * 100)],
                            forward_mode=SimpleNamespace(is_extend=lambda: True, is_decode=lambda: False),
                            prefix_lens=[0], extend_lens=[64], hicache_consumer_index=-1)
    sched = SimpleNamespace(device="cpu", tp_worker=SimpleNamespace(model_runner=runner))
    assert forwards._run_batch(run_batch, sched, batch) == "out"
    assert hooks.ModelRunner_forward(model_forward, runner) is None  # unarmed outside run_batch: a pass
    forwards._run_batch(lambda s, b: fake.tick(9), sched, batch)  # a batch whose runner never ran
    log.flush()
    recs = [json.loads(x) for x in (tmp_path / "dec_0.jsonl").read_text().splitlines()]
    fwd = [r for r in recs if r["event"] == "forward"]
    assert [r["ms"] for r in fwd] == [pytest.approx(30.0), None]
    assert fwd[1]["timing"] == "none"


def test_with_speculative_decoding_the_served_window_holds_the_drafts_extend_too(fake, monkeypatch, tmp_path):
    """Issue 57 item 1: with speculative decoding on the stage that hosts the draft, SGLang's run_batch runs the
    target's extend and then the draft model's (scheduler.py:1203-1208, model_worker = draft_worker;
    eagle_worker_v2.py:1416-1490 on `_draft_worker.draft_runner`, eagle_worker_v2.py:235, 1335-1340). A chunk
    there costs both, so the logged window runs from the target's start to the draft's end; a runner of
    neither stays untimed. Multi-layer EAGLE's runners (draft_runner_list) count alike."""
    import json
    import time
    from types import SimpleNamespace

    from sglang_cpp.plugin.serving import forwards
    from sglang_cpp.plugin import hooks, state
    from sglang_cpp.plugin.decision_log import DecisionLog

    monkeypatch.setattr(time, "perf_counter", fake)
    log = DecisionLog(0, str(tmp_path / "dec_{rank}.jsonl"), rank=0)
    monkeypatch.setattr(state, "LOG", log)
    monkeypatch.setattr(state, "ONLINE", None)
    runner, draft, step2, other = object(), object(), object(), object()
    model_forward = lambda self: fake.tick(30)  # noqa: E731  each model's own 30 ms

    def run_batch(sched, batch):
        fake.tick(5)  # ForwardBatch.init_new
        hooks.ModelRunner_forward(model_forward, other)  # neither the target nor the draft: untimed
        hooks.ModelRunner_forward(model_forward, draft)  # an idle draft before the target (DP spec coordination):
        fake.tick(2)  # it opens no window, so neither it nor this gap is timed
        hooks.ModelRunner_forward(model_forward, runner)  # the target's extend
        fake.tick(3)  # the draft's input prepared from the target's hidden states
        hooks.ModelRunner_forward(model_forward, draft)  # the draft's extend
        hooks.ModelRunner_forward(model_forward, step2)  # a multi-layer draft's next step
        fake.tick(4)  # sampling
        return "out"

    batch = SimpleNamespace(reqs=[SimpleNamespace(rid="r1", origin_input_ids=[0] * 100)],
                            forward_mode=SimpleNamespace(is_extend=lambda: True, is_decode=lambda: False),
                            prefix_lens=[0], extend_lens=[64], hicache_consumer_index=-1)
    eagle = SimpleNamespace(model_runner=runner,  # an alias of the target's, as some workers keep
                            _draft_worker=SimpleNamespace(draft_runner=draft, draft_runner_list=[draft, step2]))
    sched = SimpleNamespace(device="cpu", tp_worker=SimpleNamespace(model_runner=runner), draft_worker=eagle)
    assert forwards.draft_runners(sched, runner) == (draft, step2)
    assert forwards.draft_runners(SimpleNamespace(draft_worker=None), runner) == ()  # a stage without the draft
    assert forwards._run_batch(run_batch, sched, batch) == "out"
    log.flush()
    fwd = [r for r in map(json.loads, (tmp_path / "dec_0.jsonl").read_text().splitlines()) if r["event"] == "forward"]
    assert [r["ms"] for r in fwd] == [pytest.approx(30.0 + 3.0 + 30.0 + 30.0)]


def test_without_a_log_path_or_online_refinement_a_forward_is_not_timed(fake, monkeypatch):
    """Issue 45 item 8: with no decision-log file and SGLANG_CPP_ONLINE off, run_batch does no per-step
    work beyond what the client is told (the plan that ran, in meta_info): no step clock, no timer, no
    window armed, no record."""
    from types import SimpleNamespace

    from sglang_cpp.plugin.serving import forwards
    from sglang_cpp.plugin import state
    from sglang_cpp.plugin.decision_log import DecisionLog
    from sglang_cpp.plugin.timing import FORWARD

    monkeypatch.setattr(state, "LOG", DecisionLog(0, "", buffer_lines=256))
    monkeypatch.setattr(state, "ONLINE", None)
    monkeypatch.setattr(steps.CLOCK, "forward_start", lambda: pytest.fail("the step clock ran"))
    monkeypatch.setattr(forwards, "DeviceTimer", lambda *a: pytest.fail("a timer was made"))
    req = SimpleNamespace(rid="quiet-r1", origin_input_ids=[0] * 100, customized_info=None)
    batch = SimpleNamespace(reqs=[req], forward_mode=SimpleNamespace(is_extend=lambda: True, is_decode=lambda: False),
                            prefix_lens=[36], extend_lens=[64], hicache_consumer_index=-1)
    sched = SimpleNamespace(device="cpu", tp_worker=SimpleNamespace(model_runner=object()))
    armed = []
    assert forwards._run_batch(lambda s, b: armed.append(FORWARD._timer) or "out", sched, batch) == "out"
    assert armed == [None]
    assert req.customized_info["sglang_cpp_plan"][0]["ran"] == [64]


def test_the_overhead_probe_commits_the_previous_send_before_its_forward(monkeypatch):
    """Issue 45 item 6: the probe's step orders its work as SGLang's PP loop does (scheduler_pp_mixin.py:
    175-177: _pp_commit_proxy_send_work, then _pp_launch_batch), so a wait for the previous chunk's send is
    a wait on a peer, counted apart, not hidden in the timer's sync before the forward."""
    from types import SimpleNamespace

    import sglang.srt.distributed.parallel_state as ps
    import sglang.srt.mem_cache.common as mc

    from sglang_cpp.plugin.startup import harness, overhead

    order = []

    class Req:
        prefix_len, extend_end = 0, 0

        def init_next_round_input(self):
            self.prefix_len = self.extend_end

    class Work:
        def __init__(self, k):
            self.work = SimpleNamespace(wait=lambda: order.append(f"commit {k}"))

    sent = []
    pp = SimpleNamespace(recv_tensor_dict=lambda: order.append("recv") or {},
                         send_tensor_dict=lambda t, async_send: sent.append(len(sent)) or order.append("send")
                         or [Work(len(sent) - 1)])
    monkeypatch.setattr(ps, "get_pp_group", lambda: pp)
    monkeypatch.setattr(mc, "checkpoint_kv_cache", lambda req, tree: None)
    monkeypatch.setattr(mc, "release_kv_cache", lambda req, tree, checkpoint=False: None)
    monkeypatch.setattr(harness, "synthetic_req", lambda sched, rng, n, rid: Req())
    monkeypatch.setattr(harness, "forward", lambda sched, req, cache, received: order.append("forward") or (
        1.0, SimpleNamespace(logits_output=SimpleNamespace(tensors={}))))
    monkeypatch.setattr(overhead, "tick", lambda what: None)
    from sglang_cpp.plugin import timing

    limits = []  # each wait's bound (issue 57 item 4): none until every stage has run a forward
    monkeypatch.setattr(timing, "DeviceTimer", lambda device: SimpleNamespace(
        sync=lambda *a: order.append("sync") or limits.append(a[0] if a else None)))
    got = overhead.probe_stage(SimpleNamespace(tree_cache=None), pp_rank=1, pp_size=3, n_chunks=2, chunk=128)
    assert len(got["steps"]) == 2 and got["transfer"] == {}  # no sizes given: no receive timed alone
    # on NCCL a receive and a commit only queue a wait on the stream: the stream sync right after each, inside
    # the blocked time, is where a wait on a peer shows
    assert order == ["recv", "sync", "sync", "forward", "send", "recv", "sync", "commit 0", "sync", "forward", "send",
                     "recv", "sync", "commit 1", "sync", "forward", "send", "commit 2"]
    # a first forward may JIT-compile for minutes: a wait that may lie behind one is unbounded (the startup deadline
    # bounds it), the others bounded by SGLANG_CPP_TRANSFER_TIMEOUT_S: this middle stage of 3 receives chunk k >= 1
    # from a warm stage, and its commits wait on the last stage's first forward until step 2 (3 - 1 - 1) + 1 = 3
    assert overhead.bounded_from(1, 3) == (1, 3) and overhead.bounded_from(0, 8) == (1, 15)
    assert limits == [0.0, 0.0, 60.0, 0.0, 60.0, 0.0]  # (receive, commit) per step
    limits.clear()
    overhead.probe_stage(SimpleNamespace(tree_cache=None), pp_rank=1, pp_size=3, n_chunks=4, chunk=128)
    assert limits == [0.0, 0.0, 60.0, 0.0, 60.0, 0.0, 60.0, 60.0, 60.0, 60.0]


def test_a_rank_failing_in_the_probe_tells_its_peers_before_the_transfer_timing(monkeypatch, caplog):
    """Review finding: the transfer timing's gathers follow the pipelined steps; a rank that failed in a step
    must not meet its peers' gathers with the caller's. Every rank gathers once first: the failing rank logs its
    error and sends it, a healthy rank that hears of one raises before any transfer, and with no failure the
    transfer timing runs, one status gather before each transfer and one at its end."""
    from types import SimpleNamespace

    import sglang.srt.distributed.parallel_state as ps
    import sglang.srt.mem_cache.common as mc

    from sglang_cpp.plugin import timing
    from sglang_cpp.plugin.startup import harness, overhead

    class Req:
        prefix_len, extend_end = 0, 0

        def init_next_round_input(self):
            self.prefix_len = self.extend_end

    said, released = [], []
    pp = SimpleNamespace(recv_tensor_dict=lambda **k: {}, send_tensor_dict=lambda t, **k: [])
    monkeypatch.setattr(ps, "get_pp_group", lambda: pp)
    monkeypatch.setattr(mc, "checkpoint_kv_cache", lambda req, tree: None)
    monkeypatch.setattr(mc, "release_kv_cache", lambda req, tree, checkpoint=False: released.append(req))
    monkeypatch.setattr(harness, "synthetic_req", lambda sched, rng, n, rid: Req())
    monkeypatch.setattr(overhead, "tick", lambda what: None)
    monkeypatch.setattr(overhead, "_rank", lambda: 3)
    monkeypatch.setattr(timing, "DeviceTimer", lambda device: SimpleNamespace(sync=lambda *a: None))
    ok = lambda sched, req, cache, received: (1.0, SimpleNamespace(logits_output=SimpleNamespace(tensors={})))  # noqa: E731

    def oom(sched, req, cache, received):
        raise RuntimeError("CUDA out of memory")
    sched = SimpleNamespace(tree_cache=None)
    probe = lambda agree: overhead.probe_stage(sched, 1, 2, 2, 128, sizes=(128,), agree=agree)  # noqa: E731
    monkeypatch.setattr(harness, "forward", oom)
    with caplog.at_level("ERROR", logger="sglang_cpp"), pytest.raises(RuntimeError, match="CUDA out of memory"):
        probe(lambda e: said.append(e) or [e, ""])
    assert said == ["world rank 3: RuntimeError: CUDA out of memory (in the pipelined overhead probe)"]
    assert len(released) == 1 and "CUDA out of memory" in caplog.text  # logged on the rank that failed
    monkeypatch.setattr(harness, "forward", ok)
    with pytest.raises(RuntimeError, match="another rank failed in the pipelined overhead probe: world rank 0: Runtime"):
        probe(lambda e: said.append(e) or ["world rank 0: RuntimeError: CUDA out of memory", e])
    assert said[1:] == [""]  # it said it got there, heard of a failure, timed no transfer
    got = probe(lambda e: said.append(e) or [e, e])
    assert said[2:] == [""] * 6 and sorted(got["transfer"]) == [128]  # agreement, 1 warm-up + 3 timed, the end


def test_each_hop_is_timed_alone_at_two_sizes_after_a_gather_of_every_rank(monkeypatch):
    """Issue 45 item 6: the middle stage of three receives hop 0 -> 1 and sends hop 1 -> 2, each at both sizes,
    one warm-up and three timed repeats, each after a status gather of every rank (a barrier that says who
    failed); it sends its forward's proxy tensors with x rows, split over attention TP as the scheduler's send
    does (all_gather_group), and keeps the timed receives. A receive that fails is said at the next gather and
    every rank raises there."""
    from types import SimpleNamespace

    import torch

    from sglang_cpp.plugin.startup import overhead

    order, shapes = [], []
    ag = object()
    pp = SimpleNamespace(
        recv_tensor_dict=lambda all_gather_group=None: order.append(("recv", all_gather_group is ag)) or {},
        send_tensor_dict=lambda t, all_gather_group=None: shapes.append({k: tuple(v.shape) for k, v in t.items()})
        or order.append(("send", all_gather_group is ag)))
    monkeypatch.setattr(overhead, "tick", lambda what: None)
    monkeypatch.setattr(overhead, "_rank", lambda: 1)
    template = {"hidden_states": torch.zeros(128, 8), "residual": torch.zeros(128, 8)}
    barrier = lambda e: order.append("barrier") or [e]  # noqa: E731
    got = overhead.time_transfers(pp, 1, 3, template, (128, 2048), SimpleNamespace(sync=lambda *a: None), ag, agree=barrier)
    assert sorted(got) == [128, 2048] and all(len(v) == 3 and min(v) >= 0 for v in got.values())
    one_size = ["barrier", ("recv", True)] * 4 + ["barrier", ("send", True)] * 4
    assert order == one_size * 2 + ["barrier"]  # and one at the end: a rank that failed the last transfer says so
    assert shapes == [{"hidden_states": (x, 8), "residual": (x, 8)} for x in (128, 2048) for _ in range(4)]
    assert overhead.time_transfers(pp, 0, 1, template, (128, 2048), None) == {}  # one stage: nothing to time

    def lost(all_gather_group=None):
        raise RuntimeError("recv timed out")
    pp.recv_tensor_dict, said = lost, []
    with pytest.raises(RuntimeError, match="transfer timing failed: world rank 1: RuntimeError: recv timed out"):
        overhead.time_transfers(pp, 1, 3, template, (128,), SimpleNamespace(sync=lambda *a: None), ag,
                                agree=lambda e: said.append(e) or [e])
    assert said[0] == "" and said[1].startswith("world rank 1: RuntimeError: recv timed out (in the transfer PP0")
    assert len(said) == 2  # raised at the gather after the failed receive, on every rank alike


def test_a_transfer_a_failed_peer_strands_fails_within_its_timeout_naming_it(monkeypatch):
    """Issue 57 item 4: on a GPU a receive queued on the stream waits forever for a peer that failed after
    posting nothing (`synchronize()` has no timeout; only the 600 s startup deadline or NCCL's watchdog ended
    it). The probe's wait polls an event on the stream instead: past SGLANG_CPP_TRANSFER_TIMEOUT_S it raises
    naming the transfer, this rank says so at the next gather, and every rank raises there."""
    from types import SimpleNamespace

    import torch

    from sglang_cpp.plugin.startup import overhead
    from sglang_cpp.plugin.timing import DeviceTimer

    class Stuck:  # an event behind a receive that never completes
        def record(self):
            pass

        def query(self):
            return False

    mod = SimpleNamespace(Event=lambda enable_timing=False: Stuck(),
                          current_stream=lambda: pytest.fail("an unbounded stream synchronize"))
    timer = DeviceTimer("cuda:0", module=mod)
    monkeypatch.setenv("SGLANG_CPP_TRANSFER_TIMEOUT_S", "0.05")
    monkeypatch.setattr(overhead, "tick", lambda what: None)
    monkeypatch.setattr(overhead, "_rank", lambda: 1)
    pp = SimpleNamespace(recv_tensor_dict=lambda all_gather_group=None: {})
    said = []  # the stuck event never completes: only the bound can end the wait, so raising proves it bounded
    with pytest.raises(RuntimeError, match=r"transfer timing failed: world rank 1: TimeoutError: the receive of the "
                                           r"transfer PP0 -> PP1 of 128 tokens did not complete within 0.05 s"):
        overhead.time_transfers(pp, 1, 2, {"hidden_states": torch.zeros(128, 8)}, (128,), timer, None,
                                agree=lambda e: said.append(e) or [e])
    assert len(said) == 2  # the warm-up's receive timed out; said at the next gather


def test_a_startup_forward_waits_for_its_stream_not_the_device(monkeypatch):
    """Issue 45 item 6: before a timed startup forward the timer waits for the current stream's work only; a
    device-wide synchronize would also wait for NCCL sends on their own stream."""
    from types import SimpleNamespace

    import sglang.srt.utils.common as common

    from sglang_cpp.plugin.timing import DeviceTimer

    waited = []
    mod = SimpleNamespace(current_stream=lambda: SimpleNamespace(synchronize=lambda: waited.append("stream")),
                          synchronize=lambda: pytest.fail("a device-wide synchronize"))
    monkeypatch.setattr(common, "get_device_module", lambda: mod)
    DeviceTimer("cuda:0", event_factory=lambda: None).sync()
    assert waited == ["stream"]


def test_an_idle_pass_writes_the_forwards_whose_events_completed_after_their_batch(monkeypatch, tmp_path):
    """On a GPU the last forward before idle is still pending (its CUDA events) when run_batch returns, and no
    run_batch follows: SGLang's on_idle, which every loop calls (scheduler.py:5241), drains it once done."""
    import json
    from types import SimpleNamespace

    from sglang_cpp.plugin import decision_log, hooks, state
    from sglang_cpp.plugin.decision_log import DecisionLog
    from sglang_cpp.plugin.timing import LazyTimes

    log = DecisionLog(0, str(tmp_path / "dec_{rank}.jsonl"), rank=0, buffer_lines=256)
    monkeypatch.setattr(state, "LOG", log)
    monkeypatch.setattr(state, "ONLINE", None)
    monkeypatch.setattr(state, "PENDING", LazyTimes())
    events = {"done": False}
    timer = SimpleNamespace(done=lambda: events["done"], elapsed_ms=lambda: 12.5)
    state.PENDING.add(timer, {"event": "forward", "rids": ["r"], "prefix": [0], "chunk": [64]})
    lines = lambda: [json.loads(x) for x in (tmp_path / "dec_0.jsonl").read_text().splitlines()] \
        if (tmp_path / "dec_0.jsonl").exists() else []  # noqa: E731
    hooks.Scheduler_on_idle(None, None)
    decision_log._WRITER.drain()
    assert lines() == []  # its events have not completed: still pending
    events["done"] = True
    hooks.Scheduler_on_idle(None, None)
    decision_log._WRITER.drain()
    assert [(r["event"], r["ms"]) for r in lines()] == [("forward", 12.5)]


def test_an_eplb_rebalance_step_inside_a_served_forward_marks_it_and_keeps_it_out_of_online_refits():
    """EPLB's manager steps its generator once per forward (model_runner.py:1897-1898) and every
    --eplb-rebalance-num-iterations steps runs `yield from self.rebalance()` (eplb_manager.py:83-94): here SGLang's own
    `_entrypoint` drives the plugin's hook on a stand-in rebalance of two steps. Forwards whose window held a
    rebalance step are marked; others, and steps outside an armed window, are not."""
    from types import SimpleNamespace

    from sglang.srt.eplb.eplb_manager import EPLBManager

    from sglang_cpp.plugin.serving import forwards
    from sglang_cpp.plugin import hooks
    from sglang_cpp.plugin.timing import FORWARD

    ran = []

    def rebalance(self):  # the stand-in: two steps, as a layer-chunked rebalance spreads over forwards
        ran.append("step 1")
        yield
        ran.append("step 2")

    mgr = SimpleNamespace(_rebalance_num_iterations=2)
    mgr.rebalance = lambda: hooks.EPLBManager_rebalance(rebalance, mgr)
    gen = EPLBManager._entrypoint(mgr)
    runner, timer = object(), SimpleNamespace(start=lambda: None, stop=lambda: None)
    marked = []
    for k in range(6):  # six served forwards, each stepping the manager once inside its window
        FORWARD.arm(runner, timer)
        next(gen)
        marked.append("eplb_rebalance" in FORWARD.marks)
        FORWARD.disarm()
    # forwards 2 and 3 ran the two steps (3 also the loop's next plain step), 5 began the next rebalance
    assert ran == ["step 1", "step 2", "step 1"] and marked == [False, False, True, True, False, True]
    before = set(FORWARD.marks)
    FORWARD.mark("something")  # nothing armed: nothing marked
    assert FORWARD.marks == before
    rec = {"event": "forward", "chunk": [512], "prefix": [0], "ms": 10.0}
    assert forwards.online_sample(rec) == (0, 512, 10.0)
    assert forwards.online_sample({**rec, "eplb_rebalance": True}) is None
