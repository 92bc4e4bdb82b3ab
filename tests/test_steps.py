"""The serving step's cost beyond its forward and waits, and the plugin's own cost per step
(sglang_cpp/plugin/steps.py), on a fake clock: no SGLang, no timing."""
from __future__ import annotations

import pytest

from sglang_cpp.plugin import STEP_PATH, TARGETS, steps


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
