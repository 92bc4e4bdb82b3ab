"""Plan coverage (plugin/startup/coverage.py): which planned chunks lie outside the calibrated (L, x) range."""
from __future__ import annotations

import numpy as np

from sglang_cpp.core.calib_grid import calibration_grid
from sglang_cpp.plugin.startup.coverage import inside, listed, plan_shapes, regime_of, uncovered


def _samples(points, stages=(0, 1)):
    return [{"L": L, "x": x, "ms": 1.0, "stage": st} for st in stages for L, x in points]


def test_inside_is_the_widened_convex_hull_and_a_flat_set_its_bounding_box():
    tri = np.array([[0, 0], [1000, 0], [0, 1000]])
    assert inside(tri, (100, 100), 0.0) and inside(tri, (500, 500), 0.0)  # on the hypotenuse
    assert not inside(tri, (600, 600), 0.0)  # 141 tokens past it
    assert inside(tri, (600, 600), 150.0) and not inside(tri, (600, 600), 140.0)
    assert not inside(tri, (-65, 10), 64.0) and inside(tri, (-60, 10), 64.0)
    line = np.array([[0, 512], [4096, 512], [8192, 512]])  # one chunk size at every prefix: no area
    assert inside(line, (5000, 512), 0.0) and inside(line, (5000, 560), 64.0)
    assert not inside(line, (5000, 640), 64.0) and not inside(line, (9000, 512), 64.0)
    assert not inside(np.zeros((0, 2)), (0, 0), 64.0)


def test_the_16k_plan_leaves_a_calibration_that_sampled_chunks_up_to_1024():
    """Issue 25's 16K case: the levels sampled chunks up to 1024 at every prefix (top 1024), the served plan's
    first chunk is 3136 and its tail runs past the last sampled prefix (7/8 of 16384 = 14336)."""
    grid = calibration_grid(16384, 64, 1024, 64)
    assert max(x for _, x in grid) == 1024 and max(L for L, _ in grid) == 14336
    shapes = [(0, 3136), (3136, 2048), (5184, 1024), (8192, 960), (12000, 700), (15744, 640)]
    got = uncovered(shapes, _samples(grid))
    # by hand: above 1024 (+64) at any prefix is outside; so is a prefix past 14336 + 64 with any chunk
    assert got == [(0, 3136), (3136, 2048), (15744, 640)]
    # once measured, they are inside, and so is everything between them and the grid
    more = _samples(grid + [(0, 3136), (3136, 2048), (15744, 640)])
    assert uncovered(shapes + [(1000, 2500), (15000, 600)], more) == []
    assert uncovered([(0, 4096), (12000, 2048)], more) == [(0, 4096), (12000, 2048)]


def test_each_regime_is_covered_by_its_own_samples():
    """The fit has one L*x coefficient per chunk-size regime and one fit per prefix regime: a shape in a
    regime with no samples near it extrapolates that regime's coefficients, even inside the union's hull."""
    pts = [(L, x) for L in (0, 4096, 8192) for x in (128, 256, 1024)]
    x_bounds = (192, 768)
    assert regime_of(100, 128, (), x_bounds) == (0, 0) and regime_of(100, 700, (), x_bounds) == (0, 1)
    assert regime_of(5000, 800, (4096,), x_bounds) == (1, 2)
    # 512 lies between sampled sizes (inside the union's hull), but its regime [192, 768) has only 256
    assert uncovered([(4096, 512)], _samples(pts), (), x_bounds) == [(4096, 512)]
    assert uncovered([(4096, 512)], _samples(pts)) == []
    assert uncovered([(4096, 256), (2000, 1024)], _samples(pts), (), x_bounds) == []
    # split in L at 4096: the regime [0, 4096) was sampled at L = 0 alone, [4096, ...) at 4096 and 8192
    assert uncovered([(2000, 1024)], _samples(pts)) == []
    assert uncovered([(2000, 1024)], _samples(pts), (4096,)) == [(2000, 1024)]
    assert uncovered([(2000, 1024)], _samples(pts + [(3008, 1024)]), (4096,)) == []
    assert uncovered([(6000, 1024)], _samples(pts), (4096,)) == []
    assert uncovered([(6000, 1024)], _samples([(L, x) for L, x in pts if L != 8192]), (4096,)) == [(6000, 1024)]


def test_plan_shapes_are_the_plans_chunks_at_their_prefixes():
    from sglang_cpp.core.costmodel import CostModel, PipelineCost
    from sglang_cpp.core.planner import PlanConfig, plan_equal_time

    cpu = CostModel(c0=2.0, b=0.05, e=2e-6, f=3e-6)
    cost, pc = PipelineCost((cpu, cpu)), PlanConfig(pp_size=2, align=64)
    shapes = plan_shapes(cost, pc, [4096, 8192])
    c4, c8 = plan_equal_time(4096, cost, pc).chunks, plan_equal_time(8192, cost, pc).chunks
    assert len(shapes) == len(c4) + len(c8) and len(c8) > 1
    assert [x for _, x in shapes] == [*c4, *c8]
    assert shapes[len(c4)] == (0, c8[0]) and shapes[len(c4) + 1] == (c8[0], c8[1])
    assert shapes[-1] == (8192 - c8[-1], c8[-1])
    assert listed([(0, 3136), (64, 128)]) == "3136@0, 128@64"
    assert listed([(i, 1) for i in range(14)], most=12).endswith("1@11 and 2 more")
