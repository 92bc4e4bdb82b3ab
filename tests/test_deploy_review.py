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
