"""The quadratic policy must match SGLang 0.5.23's ChunkSizePredictor to the token."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_cpp.core.upstream import UpstreamPredictor, check_sigma


def reference_predict(a, b, c, C, sigma, page, ctx, maxp, L):
    """The issue's formula, written independently of the implementation."""
    T = a * C * C + b * C
    x_star = (-(2 * a * L + b) + math.sqrt((2 * a * L + b) ** 2 + 4 * a * T)) / (2 * a)
    x = max(int(C + sigma * (x_star - C)), C // 4)
    al = max(page, 64)
    x = max(x // al * al, al)
    x = min(x, ctx - L - 100, maxp) // al * al
    return None if x < al else x


coef = st.tuples(st.floats(1e-8, 1e-3), st.floats(0, 2), st.floats(0, 100))


@settings(max_examples=300, deadline=None)
@given(coef, st.sampled_from([1024, 2048, 4096, 12288, 16384]), st.floats(0, 1),
       st.sampled_from([1, 16, 64, 128]), st.integers(0, 1 << 20))
def test_predict_matches_formula(abc, C, sigma, page, L):
    a, b, c = abc
    ctx = (1 << 20) + 4096
    up = UpstreamPredictor(a=a, b=b, c=c, chunk_size=C, sigma=sigma, page_size=page, context_len=ctx,
                           max_prefill_tokens=16384)
    got = up.predict(L)
    want = reference_predict(a, b, c, C, sigma, page, ctx, 16384, L)
    if got != want:  # only a float rounding tie at an exact integer may differ
        assert got is not None and want is not None and abs(got - want) <= max(page, 64)
    if got is not None:
        assert got % max(page, 64) == 0 and got <= 16384 and got <= ctx - L - 100


def test_worked_example_from_reference_notes():
    # shared/reference/cpu-sglang.md: a=6.2e-5, b=0.536, c=49.2, base 1024, context 131072
    up = UpstreamPredictor(a=6.2e-5, b=0.536, c=49.2, chunk_size=1024, context_len=131072)
    assert [up.predict(L) for L in (1024, 4096, 16384, 65536)] == [896, 640, 384, 256]
    # 7000-token prompt with the run's fitted a=6.20e-05 b=5.36e-01: first chunk C, then shrinking
    assert up.chunk_sequence(7000) == [1024, 896, 768, 704, 704, 640, 640, 576, 576, 472]


@given(st.integers(1, 200000), st.integers(0, 5000))
@settings(max_examples=100, deadline=None)
def test_chunk_sequence_covers_prompt(n, prefix):
    up = UpstreamPredictor(a=1e-6, b=0.05, c=20, chunk_size=4096, context_len=1 << 21)
    if prefix >= n:
        with pytest.raises(ValueError):
            up.chunk_sequence(n, prefix)
        return
    seq = up.chunk_sequence(n, prefix)
    assert sum(seq) == n - prefix and seq[0] == min(4096, n - prefix)
    assert all(s >= 1 for s in seq)


@pytest.mark.parametrize("bad", [-0.1, 1.5, "x", float("nan")])
def test_bad_sigma_is_named(bad):
    with pytest.raises(ValueError, match="SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR"):
        check_sigma(bad)


def test_fit_drops_first_sample_and_rejects_non_quadratic():
    rng = np.random.default_rng(0)
    l = np.linspace(1280, 10, 128)
    t = 6e-5 * l * l + 0.5 * l + 40 + rng.normal(0, 0.01, l.size)
    t[0] = 7234.0  # the cold first run upstream drops (sglang#17198)
    up = UpstreamPredictor.fit(l, t, chunk_size=1024, context_len=8192)
    assert up.a == pytest.approx(6e-5, rel=1e-3) and up.b == pytest.approx(0.5, rel=1e-3)
    with pytest.raises(ValueError, match="not positive"):
        UpstreamPredictor.fit(l, -1e-5 * l * l + l + 10, chunk_size=1024, context_len=8192)
    with pytest.raises(ValueError, match=">= 8 samples"):
        UpstreamPredictor.fit(l[:5], t[:5], chunk_size=1024, context_len=8192)


def _sglang_predictor():
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    try:
        from sglang.srt.managers.scheduler_components.dynamic_chunk_sizer import ChunkSizePredictor
    except Exception as exc:  # the CPU environment (examples/cpu/setup.sh) provides sglang
        pytest.fail(f"sglang's ChunkSizePredictor is not importable: {exc!r}; run examples/cpu/setup.sh")
    return ChunkSizePredictor


@pytest.mark.parametrize("sigma", ["0.0", "0.5", "0.75", "1.0"])
def test_matches_real_sglang_predictor(sigma, monkeypatch):
    """Same fit and same chunk for every prefix, against SGLang 0.5.23's own class."""
    ChunkSizePredictor = _sglang_predictor()
    monkeypatch.setenv("SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR", sigma)
    rng = np.random.default_rng(1)
    lens = [int(v) for v in np.linspace(15360, 120, 128)]
    lat = [2e-6 * v * v + 0.05 * v + 20 + float(rng.normal(0, 2)) for v in lens]
    ref = ChunkSizePredictor()
    ref.fit(lens, lat)
    ref.set_target_latency(12288)
    ref.is_ready = True
    ours = UpstreamPredictor.fit(lens, lat, chunk_size=12288, sigma=float(sigma), page_size=64,
                                 context_len=1052672, max_prefill_tokens=16384)
    assert (ours.a, ours.b, ours.c) == (ref.quadratic_coeff_a, ref.linear_coeff_b, ref.constant_coeff_c)
    for L in list(range(0, 1 << 20, 4099)) + [1052672 - 200, 1052672 - 50]:
        want = ref.predict_next_chunk_size(history_len=L, base_chunk_size=12288, page_size=64,
                                           context_len=1052672, max_chunk_size=16384)
        assert ours.predict(L) == want, L
