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

    from sglang_cpp.plugin import cpu_compat

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
    from sglang_cpp.costmodel import CostModel
    from sglang_cpp.plugin.hooks import _align
    from sglang_cpp.plugin.sizer import CppChunkSizer, SizerConfig

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
    from sglang_cpp.plugin.sizer import DecisionLog

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
    from sglang_cpp.plugin.cache_key import KEYED, UNKEYED, keyed_fields

    _, ns = _defaults()
    assert set(ns.values()) <= set(KEYED) | set(UNKEYED)
    for table in (KEYED, UNKEYED):
        for space, names in table.items():
            assert set(names) <= {f for f, s in ns.items() if s == space}, space
    with pytest.raises(ValueError, match="'exec.future'.*not placed in plugin/cache_key.py"):
        keyed_fields({**ns, "new_field": "exec.future"})


@pytest.mark.parametrize("field,value", [
    ("ep_size", 8), ("moe_a2a_backend", "deepep"), ("deepep_mode", "normal"), ("enable_dp_attention", True),
    ("dp_size", 4), ("attn_cp_size", 2), ("prefill_attention_backend", "fa3"), ("enable_two_batch_overlap", True),
    ("disable_prefill_cuda_graph", True), ("nnodes", 2), ("disable_chunked_prefix_cache", True),
])
def test_settings_the_old_hand_list_missed_now_key_the_cache(field, value):
    from sglang_cpp.plugin.cache_key import timing_args

    sa, ns = _defaults()
    base = timing_args(sa, ns)
    assert timing_args(SimpleNamespace(**{**vars(sa), field: value}), ns) != base


@pytest.mark.parametrize("field,value", [("port", 31000), ("host", "0.0.0.0"), ("log_level", "debug"),
                                         ("dist_init_addr", "10.0.0.1:5000"), ("node_rank", 1),
                                         ("chunked_prefill_size", 4096), ("mem_fraction_static", 0.5)])
def test_settings_that_cannot_change_a_forward_leave_the_cache_alone(field, value):
    from sglang_cpp.plugin.cache_key import timing_args

    sa, ns = _defaults()
    assert timing_args(SimpleNamespace(**{**vars(sa), field: value}), ns) == timing_args(sa, ns)


def test_the_mla_threshold_and_kernel_libraries_key_the_cache(monkeypatch):
    from sglang_cpp.plugin.cache_key import timing_args

    sa, ns = _defaults()
    base = timing_args(sa, ns)
    assert base["lib:flashinfer-python"] and base["lib:sgl-kernel"]  # a version, or "absent"
    monkeypatch.setenv("SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD", "4096")
    assert timing_args(sa, ns) != base
