"""Issue 27, the GPU-deployment review: the items that have a CPU or unit reproduction, each against
SGLang's real objects where one exists."""
from __future__ import annotations

from types import SimpleNamespace

import pytest


def test_a_hook_that_sglang_did_not_apply_is_named_at_startup():
    """Item 8: HookRegistry logs and skips a target it cannot resolve; the plugin names it and fails."""
    from sglang_cpp.plugin import TARGETS, unapplied

    assert unapplied(set(TARGETS)) == ""
    gone = "sglang.srt.managers.scheduler.Scheduler.run_batch"
    msg = unapplied(set(TARGETS) - {gone})
    assert gone in msg and "1 of the plugin's hooks" in msg and "SGLang 0.5.23" in msg


def test_every_target_is_applied_by_sglangs_registry():
    """The real registry on the installed SGLang applies all of them (what the startup check reads); in a
    child process, since applying patches SGLang's classes for good."""
    import subprocess
    import sys

    code = ("from sglang.srt.plugins.hook_registry import HookRegistry; import sglang_cpp.plugin as p; "
            "p.register(); HookRegistry.apply_hooks(); print('UNAPPLIED=' + repr(p.unapplied()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "UNAPPLIED=''" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]


@pytest.mark.parametrize("device,cpu", [("cpu", True), ("npu", False), ("xpu", False), ("cuda", False)])
def test_cpu_fallbacks_switch_on_for_a_cpu_server_only(monkeypatch, device, cpu):
    """Item 9: on an NPU/XPU/MUSA host torch.cuda.is_available() is False too; the Mooncake and pinned-memory
    shims must key off the server's --device, not off CUDA's absence."""
    import sglang.srt.runtime_context as rc

    from sglang_cpp.plugin.compat import cpu as cpu_compat

    monkeypatch.setattr(rc, "get_server_args", lambda: SimpleNamespace(device=device))
    assert cpu_compat.cpu_server() is cpu
    sender = SimpleNamespace(supports_host_tensor_indices=True)
    cpu_compat.MooncakeKVSender_init_cpu(None, sender)
    assert sender.supports_host_tensor_indices is (not cpu)
    seen = {}
    cpu_compat.alloc_with_host_register_cpu(lambda *a, **k: seen.update(k), (4,), "f", "dev", pin_memory=True)
    assert seen["pin_memory"] is (not cpu)


def test_a_forward_on_another_accelerator_is_timed_with_its_device_events(monkeypatch):
    """Item 9: the host clock around an NPU forward measures kernel launches; the timer takes SGLang's device
    module's events for any device but cpu."""
    import sglang.srt.utils.common as common

    from sglang_cpp.plugin.timing import DeviceTimer

    made = []

    class Event:
        def __init__(self, enable_timing=False):
            made.append(enable_timing)

        def record(self):
            pass

        def query(self):
            return True

        def elapsed_time(self, other):
            return 12.5

    monkeypatch.setattr(common, "get_device_module", lambda: SimpleNamespace(Event=Event, synchronize=lambda: None))
    t = DeviceTimer("npu:0")
    t.start()
    t.stop()
    assert t.cuda and made == [True, True] and t.done() and t.elapsed_ms() == 12.5
    assert not DeviceTimer("cpu").cuda


def test_an_alignment_sglang_sets_after_the_sizer_is_built_is_planned_on():
    """Item 4: SGLang sets truncation_align_size (deterministic inference's 4096 split tiles, DSA's kpool)
    after maybe_init_dynamic_chunk_sizer; a fake scheduler that sets it late, as SGLang does, gets every
    non-final chunk on the 4096 grid from the first plan on."""
    from sglang_cpp.core.costmodel import CostModel
    from sglang_cpp.plugin.startup.install import _align
    from sglang_cpp.plugin.serving.sizer import CppChunkSizer, SizerConfig

    sched = SimpleNamespace(page_size=1)  # no truncation_align_size yet
    cfg = SizerConfig(policy="plan", pp_size=2, pp_rank=0, chunk_size=4096, max_prefill_tokens=16384, page_size=1,
                      context_len=65536, align=_align(sched))
    assert cfg.align == 64
    cost = CostModel(c0=5.0, b=0.05, e=2e-6, f=3e-6)  # wants chunks of a few K: off the 4096 grid unaligned
    sizer = CppChunkSizer(cfg, cost=cost, align_source=lambda: _align(sched))
    sched.truncation_align_size = 4096  # scheduler.py: init_deterministic_inference_config, after the sizer
    plan = sizer.plan_for("r", 40000, 0)
    assert sizer.cfg.align == 4096 and all(c % 4096 == 0 for c in plan.chunks[:-1]) and sum(plan.chunks) == 40000
    unaligned = CppChunkSizer(cfg, cost=cost).plan_for("r", 40000, 0)
    assert any(c % 4096 for c in unaligned.chunks[:-1])  # the same model at the startup value is off the grid


def test_two_writers_never_share_a_temp_file(tmp_path):
    """Item 5: save_json's temp file was `<name>.tmp` for every writer: two servers saving one cache file
    raced on it. Now each writer has its own: a stale `<name>.tmp` in the way changes nothing."""
    from sglang_cpp.files import load_json, save_json

    out = tmp_path / "cal.json"
    (tmp_path / "cal.json.tmp").mkdir()  # what the old fixed name would have had to open
    save_json(out, {"a": 1})
    assert load_json(out) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cal.json", "cal.json.tmp"]  # no temp file left over
    assert out.stat().st_mode & 0o777 == 0o644


def test_a_decision_log_that_cannot_be_written_is_a_startup_error_then_best_effort(tmp_path, caplog):
    """Item 5: the probe names the file and the fix (the rank agreement fails every rank with it); a write
    that fails later (the folder removed, the disk full) is one WARNING, and the server goes on."""
    from sglang_cpp.plugin.decision_log import DecisionLog

    bad = DecisionLog(1, str(tmp_path / "missing" / "dec_{rank}.jsonl"), rank=3)
    assert bad.probe().startswith(f"SGLANG_CPP_DECISION_LOG: cannot write {tmp_path}/missing/dec_3.jsonl")
    d = tmp_path / "logs"
    d.mkdir()
    log = DecisionLog(0, str(d / "dec_{rank}.jsonl"))
    assert log.probe() == ""
    log.write("forward", ms=1.0)
    log._fh.close()
    log._fh = None
    (d / "dec_0.jsonl").unlink()
    d.rmdir()
    with caplog.at_level("WARNING", logger="sglang_cpp"):
        log.write("forward", ms=2.0)
        log.write("forward", ms=3.0)
    assert log.path == "" and sum("no more lines are written" in r.message for r in caplog.records) == 1


def _defaults():
    """A ServerArgs stand-in with SGLang 0.5.23's own defaults for every field (building the real one
    resolves hardware)."""
    import msgspec
    from sglang.srt.server_args import ServerArgs

    vals = {f.name: (None if f.default is msgspec.NODEFAULT else f.default) for f in msgspec.structs.fields(ServerArgs)}
    return SimpleNamespace(**vals), ServerArgs._NS_BY_FIELD


def test_the_cache_key_places_every_sglang_namespace_and_names_only_real_fields():
    """Item 3: SGLang's own grouping decides; a namespace it adds fails here until placed, and every field
    named as an exception exists in that namespace (the lists stay in step with SGLang's)."""
    from sglang_cpp.plugin.startup.cache_key import KEYED, UNKEYED, keyed_fields

    _, ns = _defaults()
    assert set(ns.values()) <= set(KEYED) | set(UNKEYED)
    for table in (KEYED, UNKEYED):
        for space, names in table.items():
            assert set(names) <= {f for f, s in ns.items() if s == space}, space
    with pytest.raises(ValueError, match="'exec.future'.*not placed in plugin/startup/cache_key.py"):
        keyed_fields({**ns, "new_field": "exec.future"})


@pytest.mark.parametrize("field,value", [
    ("ep_size", 8), ("moe_a2a_backend", "deepep"), ("deepep_mode", "normal"), ("enable_dp_attention", True),
    ("dp_size", 4), ("attn_cp_size", 2), ("prefill_attention_backend", "fa3"), ("enable_two_batch_overlap", True),
    ("disable_prefill_cuda_graph", True), ("nnodes", 2), ("disable_chunked_prefix_cache", True),
])
def test_settings_the_old_hand_list_missed_now_key_the_cache(field, value):
    from sglang_cpp.plugin.startup.cache_key import timing_args

    sa, ns = _defaults()
    base = timing_args(sa, ns)
    assert timing_args(SimpleNamespace(**{**vars(sa), field: value}), ns) != base


@pytest.mark.parametrize("field,value", [("port", 31000), ("host", "0.0.0.0"), ("log_level", "debug"),
                                         ("dist_init_addr", "10.0.0.1:5000"), ("node_rank", 1),
                                         ("chunked_prefill_size", 4096), ("mem_fraction_static", 0.5)])
def test_settings_that_cannot_change_a_forward_leave_the_cache_alone(field, value):
    from sglang_cpp.plugin.startup.cache_key import timing_args

    sa, ns = _defaults()
    assert timing_args(SimpleNamespace(**{**vars(sa), field: value}), ns) == timing_args(sa, ns)


def test_the_mla_threshold_and_kernel_libraries_key_the_cache(monkeypatch):
    from sglang_cpp.plugin.startup.cache_key import timing_args

    sa, ns = _defaults()
    base = timing_args(sa, ns)
    assert base["lib:flashinfer-python"] and base["lib:sgl-kernel"]  # a version, or "absent"
    monkeypatch.setenv("SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD", "4096")
    assert timing_args(sa, ns) != base


def test_a_rank_without_progress_ends_the_server_naming_what_it_was_doing_and_its_error():
    """Item 2: a rank left in a peer's failed collective makes no progress; its deadline expires once, with
    the step it was in and the error it had seen."""
    import threading

    from sglang_cpp.plugin.startup.deadline import note_error, startup_deadline, tick

    fired, msgs = threading.Event(), []

    def expire(msg):
        msgs.append(msg)
        fired.set()

    with startup_deadline(0.3, "world rank 3 (PP1, TP1)", expire=expire):
        tick("waiting for every rank's samples of calibration level 1 (a gather over the world group)")
        note_error("PP1: RuntimeError('boom')")
        assert fired.wait(30)  # no further tick: it expires
    assert len(msgs) == 1
    assert "world rank 3 (PP1, TP1) made no progress" in msgs[0] and "calibration level 1" in msgs[0]
    assert "this rank had failed: PP1: RuntimeError('boom')" in msgs[0] and "SGLANG_CPP_CALIB_DEADLINE_S" in msgs[0]


def test_progress_keeps_the_deadline_from_expiring():
    """On a clock the test moves (no dependence on how busy the host is): ticks 0.5 s apart keep a 1.5 s
    deadline alive for 4 s; 1.6 s without one expires it, and the watchdog then ends the server once."""
    import threading

    from sglang_cpp.plugin.startup.deadline import Deadline, startup_deadline, tick

    now, msgs, fired = [0.0], [], threading.Event()
    d = Deadline(1.5, "rank", expire=lambda m: (msgs.append(m), fired.set()), clock=lambda: now[0])
    try:
        while now[0] < 4.0:
            now[0] += 0.5
            assert not d.expired()
            d.tick("in a forward")
        assert msgs == []
        now[0] += 1.6
        assert d.expired()
        assert fired.wait(30) and len(msgs) == 1 and "while in a forward" in msgs[0]
    finally:
        d.close()
    with startup_deadline(0, "rank", expire=msgs.append) as none:  # 0: no deadline, no watchdog
        assert none is None
        tick("anything")


def test_the_fault_hook_lands_on_the_stages_last_own_layer():
    """SGLANG_CPP_CALIB_FAULT_IN=forward raises before the last layer this stage holds, not a placeholder."""
    import torch

    from sglang_cpp.plugin.startup.calibrate import last_layer

    class PPMissingLayer(torch.nn.Module):
        pass

    inner = torch.nn.Module()
    inner.layers = torch.nn.ModuleList([PPMissingLayer(), torch.nn.Linear(2, 2), torch.nn.Linear(2, 3),
                                        PPMissingLayer()])
    model = torch.nn.Module()
    model.model = inner
    assert last_layer(model) is inner.layers[2]
    with pytest.raises(RuntimeError, match="no decoder layers"):
        last_layer(torch.nn.Linear(2, 2))


def test_speculative_decoding_with_pp_warns_that_the_draft_extend_is_not_calibrated():
    """Item 10: the last stage's chunks also run the draft extend; calibration does not time it."""
    from sglang_cpp.plugin.startup.calibrate import speculative_warning

    assert speculative_warning("NONE", 4, True) == ""
    assert speculative_warning("EAGLE", 1, True) == ""
    on = speculative_warning("EAGLE", 4, True)
    assert "EAGLE" in on and "pp=4" in on and "draft model's extend" in on and "online refinement" in on
    off = speculative_warning("EAGLE3", 2, False)
    assert "SGLANG_CPP_ONLINE=0" in off and "tune fit --from-log" in off
    dspark = speculative_warning("DSPARK", 2, True)  # its draft KV injection runs outside any timed forward
    assert "injected outside the model's forward" in dspark and "online refinement cannot fit it" in dspark


def _gpu_check():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "gpu" / "check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_check_verdicts_on_known_models():
    """The CPU-safe part of examples/gpu/check.py: the FlashAttention-shape verdict and the held-out error,
    on models and samples written by hand."""
    from sglang_cpp.core.costmodel import CostModel

    check = _gpu_check()
    fa = CostModel(c0=1.0, b=0.01, e=2e-7, f=1e-7)
    assert check.fa_share(fa, 49152, 16384) == 0.0
    native = CostModel(c0=1.0, b=0.01, d=1e-7, e=2e-7, f=1e-7)
    # d L^2 = 241.59, t = 1 + 163.84 + 241.59 + 161.06 + 26.84 = 594.33 (ms)
    assert abs(check.fa_share(native, 49152, 16384) - 241.59 / 594.33) < 1e-3
    assert check.fa_share(native, 49152, 16384) > check.FA_SHARE

    grid = [(L, x) for L in (0, 8192, 16384, 32768, 49152) for x in check.CHUNKS if L + x <= check.MAX_LEN]
    exact = [{"L": L, "x": x, "ms": float(fa.time(L, x))} for L, x in grid]
    err, n = check.split_error(exact, check._fit)
    assert n == len(grid) // 2 and err < 0.05
    ordered = sorted(exact, key=lambda s: (s["L"], s["x"]))
    skewed = [dict(s, ms=s["ms"] * (1.5 if i % 2 else 1.0)) for i, s in enumerate(ordered)]  # the held-out half off
    err, _ = check.split_error(skewed, check._fit)
    assert abs(err - (1 - 1 / 1.5)) < 0.02 and err > check.PREDICT_ERR


def test_calibration_forwards_leave_the_expert_distribution_recorder_alone():
    """Item 1 (EPLB): inside a calibration forward SGLang's global recorder is a no-op one; the server's own is
    back afterwards, also when the forward raised."""
    from sglang.srt.eplb import expert_distribution as ed

    from sglang_cpp.plugin.startup.harness import no_expert_recording

    mine = object()
    prev = ed.get_global_expert_distribution_recorder()
    ed.set_global_expert_distribution_recorder(mine)
    try:
        with no_expert_recording():
            assert isinstance(ed.get_global_expert_distribution_recorder(), ed._ExpertDistributionRecorderNoop)
        assert ed.get_global_expert_distribution_recorder() is mine
        with pytest.raises(RuntimeError), no_expert_recording():
            raise RuntimeError("a forward failed")
        assert ed.get_global_expert_distribution_recorder() is mine
    finally:
        ed.set_global_expert_distribution_recorder(prev)


def test_startup_forwards_do_not_advance_the_eplb_rebalance_counter():
    """Issue 45 item 2: every forward SGLang's ModelRunner runs steps eplb_manager.on_forward_pass_end()
    (model_runner.py:1897-1898), whose generator rebalances every --eplb-rebalance-num-iterations steps
    (eplb_manager.py:72-94). Here SGLang's own EPLBManager methods run on a manager rebalancing every 3 steps:
    300 steps inside the startup guard neither rebalance nor move the counter, and afterwards it goes on where
    it was (the fourth step, after three served iterations, is the first rebalance)."""
    from types import SimpleNamespace

    from sglang.srt.eplb.eplb_manager import EPLBManager

    from sglang_cpp.plugin.startup.harness import no_expert_recording

    fired = []
    mgr = object.__new__(EPLBManager)
    mgr._rebalance_num_iterations = 3
    mgr.rebalance = lambda: iter([fired.append(1)])  # a rebalance, as a generator step
    mgr.reset_generator()
    mgr.on_forward_pass_end()  # one served forward before the guard
    runner = SimpleNamespace(eplb_manager=mgr)
    with no_expert_recording(runner):
        for _ in range(300):
            mgr.on_forward_pass_end()
    assert fired == []
    mgr.on_forward_pass_end()
    mgr.on_forward_pass_end()
    assert fired == []
    mgr.on_forward_pass_end()  # the counter's fourth step: three iterations passed, the rebalance
    assert fired == [1]


def test_the_clis_attention_backends_are_sglangs():
    """args.ATTENTION_BACKENDS (the CLI does not import SGLang) is SGLang 0.5.23's ATTENTION_BACKEND_CHOICES."""
    from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES

    from sglang_cpp.args import ATTENTION_BACKENDS

    assert list(ATTENTION_BACKENDS) == list(ATTENTION_BACKEND_CHOICES)
