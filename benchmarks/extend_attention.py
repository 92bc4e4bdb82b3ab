"""Attention time per chunk on SGLang's torch_native backend: upstream's extend (a redundant query of
L+x rows, causal SDPA over (L+x)^2) vs sglang-cpp's prefix-aware extend (x queries: prefix keys
unmasked + own keys causal, merged by log-sum-exp), and the one-call lower-right-mask alternative.
SmolLM2-135M's head shapes (9 query heads, 3 KV heads, head dim 64), one layer, one request.
Writes results/extend_attention.md. Usage: python benchmarks/extend_attention.py [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn.functional import scaled_dot_product_attention

from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang_cpp.machine import provenance_lines
from sglang_cpp.plugin.compat.attention import TorchNativeAttnBackend__run_sdpa_forward_extend as ours

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM = TorchNativeAttnBackend._run_sdpa_forward_extend
HQ, HK, D = 9, 3, 64


def inputs(L: int, x: int, dtype):
    n = L + x
    t = lambda v: torch.tensor([v], dtype=torch.int64)  # noqa: E731
    return (torch.randn(x, HQ, D, dtype=dtype), torch.empty(x, HQ, D, dtype=dtype),
            torch.randn(n, HK, D, dtype=dtype), torch.randn(n, HK, D, dtype=dtype),
            torch.arange(n, dtype=torch.int64)[None], t(0), t(n), t(L), t(x))


def masked(_, q, out, k, v, r2t, idx, seq, pre, ext, **kw):
    """x queries over L+x keys with an explicit lower-right causal mask, one SDPA call."""
    L, x = int(pre[0]), int(ext[0])
    allowed = torch.arange(L + x)[None, :] <= (L + torch.arange(x))[:, None]
    qq, kk, vv = q.movedim(0, 1)[None], k[r2t[0]].movedim(0, 1)[None], v[r2t[0]].movedim(0, 1)[None]
    out[:] = scaled_dot_product_attention(qq, kk, vv, attn_mask=allowed, enable_gqa=True)[0].movedim(1, 0)
    return out


def timed(fn, args, repeats: int) -> float:
    kw = dict(scaling=D ** -0.5, enable_gqa=True, causal=True)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(None, *args, **kw)
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prefix-lens", default="0,2048,8192,16384")
    ap.add_argument("--chunk-lens", default="512,2048")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--out", default=str(ROOT / "results" / "extend_attention.md"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    around = lambda *args, **kw: ours(UPSTREAM, *args, **kw)  # noqa: E731
    rows = []
    for L in map(int, a.prefix_lens.split(",")):
        for x in map(int, a.chunk_lens.split(",")):
            args = inputs(L, x, dtype)
            timed(around, args, 1)  # warm-up
            up, mk, us = (timed(f, args, a.repeats) for f in (UPSTREAM, masked, around))
            rows.append((L, x, up, mk, us))
            print(f"L={L} x={x}: upstream {up:.1f} ms, mask {mk:.1f} ms, ours {us:.1f} ms ({up / us:.2f}x)",
                  flush=True)
    lines = ["# Extend attention on torch_native: upstream vs prefix-aware", "",
             *provenance_lines(f"python {' '.join(['benchmarks/extend_attention.py'] + sys.argv[1:])}",
                               f"; {a.threads} thread(s); {a.dtype}"), "",
             f"One layer, one request, {HQ} query heads / {HK} KV heads / head dim {D}; median of {a.repeats}.",
             "upstream = `TorchNativeAttnBackend._run_sdpa_forward_extend`; mask = x queries, one SDPA call with "
             "a lower-right causal mask; ours = the plugin's hook (prefix unmasked + own causal, LSE merge).", "",
             "| prefix L | chunk x | upstream (ms) | mask (ms) | ours (ms) | upstream / ours |",
             "|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {L} | {x} | {up:.1f} | {mk:.1f} | {us:.1f} | {up / us:.2f}x |" for L, x, up, mk, us in rows]
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
