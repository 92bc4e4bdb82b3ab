"""The prefix-aware extend attention against SGLang's own torch_native extend (the function it wraps)."""
from __future__ import annotations

import pytest
import torch

from sglang_cpp.plugin.compat.attention import TorchNativeAttnBackend__run_sdpa_forward_extend, prefix_extend_attention

# a plain import: SGLang is part of the test environment, and an import that fails here is a failure (issue 29),
# not a reason to skip the comparison with SGLang's own extend
from sglang.srt.layers.attention import torch_native_backend as backend  # noqa: E402

ORIGINAL = backend.TorchNativeAttnBackend._run_sdpa_forward_extend


def _batch(prefix_lens, extend_lens, hq=9, hk=3, d=64, dtype=torch.float32, seed=0):
    """A KV pool, req_to_token rows pointing at scattered slots, and the extend queries of all requests."""
    g = torch.Generator().manual_seed(seed)
    seq = [p + x for p, x in zip(prefix_lens, extend_lens)]
    pool = sum(seq) + 16
    k_cache = torch.randn(pool, hk, d, generator=g, dtype=dtype)
    v_cache = torch.randn(pool, hk, d, generator=g, dtype=dtype)
    perm = torch.randperm(pool, generator=g)
    req_to_token = torch.zeros(len(seq) + 2, max(seq) + 8, dtype=torch.int64)
    pool_idx, at = [], 0
    for i, n in enumerate(seq):
        row = i + 1  # not the identity: the backend must index through req_pool_indices
        req_to_token[row, :n] = perm[at:at + n]
        at += n
        pool_idx.append(row)
    q = torch.randn(sum(extend_lens), hq, d, generator=g, dtype=dtype)
    t = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    return dict(query=q, k_cache=k_cache, v_cache=v_cache, req_to_token=req_to_token,
                req_pool_indices=t(pool_idx), seq_lens=t(seq), extend_prefix_lens=t(prefix_lens),
                extend_seq_lens=t(extend_lens))


def _run(fn, b, **kw):
    out = torch.full_like(b["query"], float("nan"))
    args = (b["query"], out, b["k_cache"], b["v_cache"], b["req_to_token"], b["req_pool_indices"], b["seq_lens"],
            b["extend_prefix_lens"], b["extend_seq_lens"])
    return fn(None, *args, **kw)


def _ours(b, **kw):
    return _run(lambda *a, **k: TorchNativeAttnBackend__run_sdpa_forward_extend(ORIGINAL, *a, **k), b, **kw)


@pytest.mark.parametrize("prefix_lens,extend_lens", [
    ([0], [37]),                       # no prefix
    ([300], [64]),                     # one chunk after a cached prefix
    ([0, 513, 7, 1200], [96, 1, 200, 31]),  # a mixed batch: fresh, decode-like 1-token extend, short, long
    ([228, 158, 40], [2, 0, 1]),  # a row with nothing to extend (the flash kernel dies of SIGFPE on 0 keys)
])
@pytest.mark.parametrize("hq,hk", [(9, 3), (4, 4)])  # GQA (SmolLM2's 9/3) and MHA
def test_matches_upstream_extend(prefix_lens, extend_lens, hq, hk):
    b = _batch(prefix_lens, extend_lens, hq=hq, hk=hk)
    kw = dict(scaling=0.125, enable_gqa=hq != hk, causal=True)
    want = _run(ORIGINAL, b, **kw)
    got = _ours(b, **kw)
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_prefix_split_equals_full_causal_softmax():
    """Against attention written out: x queries over L+x keys, query i sees keys <= L+i."""
    g = torch.Generator().manual_seed(1)
    L, x, d = 50, 20, 16
    q, k, v = (torch.randn(2, n, d, generator=g, dtype=torch.float64) for n in (x, L + x, L + x))
    s = q @ k.transpose(-1, -2) / d ** 0.5
    allowed = torch.arange(L + x)[None, :] <= (L + torch.arange(x))[:, None]
    want = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1) @ v
    got = prefix_extend_attention(q.float(), k.float(), v.float(), L)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_delegates_what_it_does_not_reproduce(monkeypatch):
    """Sliding window, non-causal, and SGLANG_CPP_FAST_EXTEND=0 run SGLang's own code."""
    calls = []

    def original(*a, **k):
        calls.append(k)
        return a[2]

    b = _batch([100], [20])
    _run(lambda *a, **k: TorchNativeAttnBackend__run_sdpa_forward_extend(original, *a, **k), b,
         causal=True, sliding_window_size=32)
    _run(lambda *a, **k: TorchNativeAttnBackend__run_sdpa_forward_extend(original, *a, **k), b, causal=False)
    monkeypatch.setenv("SGLANG_CPP_FAST_EXTEND", "0")
    _run(lambda *a, **k: TorchNativeAttnBackend__run_sdpa_forward_extend(original, *a, **k), b, causal=True)
    assert len(calls) == 3
    monkeypatch.setenv("SGLANG_CPP_FAST_EXTEND", "1")
    out = _run(lambda *a, **k: TorchNativeAttnBackend__run_sdpa_forward_extend(original, *a, **k), b, causal=True)
    assert len(calls) == 3 and not torch.isnan(out).any()
