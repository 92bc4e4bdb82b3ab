"""The calibration design (which shapes get measured), without a server."""
from __future__ import annotations

import pytest

from sglang_cpp.plugin.calibrate import calibration_levels, calibration_schedule


@pytest.mark.parametrize("M", [1024, 2048, 4096, 8192, 8128, 131072])
def test_schedule_covers_prefixes_and_chunk_sizes(M):
    sched = calibration_schedule(M)
    points = []
    for seq in sched:
        assert sum(seq) <= M
        L = 0
        for x in seq:
            points.append((L, x))
            L += x
    Ls, xs = {p[0] for p in points}, {p[1] for p in points}
    assert len(xs) >= 3 and len(Ls) >= 5  # enough to identify all six cost terms
    assert max(L + x for L, x in points) == M
    assert len({x for x in xs if x % 64 == 0}) >= 3


def test_levels_double_to_the_target():
    assert calibration_levels(8192) == [1024, 2048, 4096, 8192]
    assert calibration_levels(6000) == [1024, 2048, 4096, 6000]
    assert calibration_levels(512) == [512]
