"""A kernel switch in the chunk size on the CPU testbed: PyTorch's CPU flash attention splits the query into
blocks of 32, 64 or 256 rows by the query length (256 from 768 rows on), and streams the keys once per block,
so a chunk of 767 queries over a long prefix costs more per query than one of 768. The prefix part of the
plugin's extend attention (`plugin/compat/attention.py`) is exactly this call: x queries over L prefix keys.

Why it matters (issue 25's 32K run): the plan's late chunks (640-768 tokens at prefixes past 24K) ran at
1.01-1.11x the cost model's prediction while fixed 1024-token chunks ran at 0.93-0.97x, and a polynomial in x
cannot hold the step. Writes results/flash_split.md.
Usage: python benchmarks/flash_split.py [--prefix-len 30000] [--threads 1]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from sglang_cpp.machine import provenance_lines

ROOT = Path(__file__).resolve().parents[1]
FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def per_query_us(L: int, x: int, heads: int, kv_heads: int, dim: int, repeats: int) -> float:
    q = torch.randn(1, heads, x, dim)
    k, v = torch.randn(1, kv_heads, L, dim), torch.randn(1, kv_heads, L, dim)
    FLASH(q, k, v, 0.0, False, scale=None)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        FLASH(q, k, v, 0.0, False, scale=None)
        best = min(best, time.perf_counter() - t0)
    return best * 1e6 / x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix-len", type=int, default=30000)
    ap.add_argument("--chunk-lens", default="128,191,192,256,384,512,640,704,767,768,896,1024,1536,2048")
    ap.add_argument("--heads", type=int, default=8, help="query heads (long-llama: 8)")
    ap.add_argument("--kv-heads", type=int, default=8, help="KV heads as the kernel sees them (SGLang repeats GQA)")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "results" / "flash_split.md"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    rows = []
    for x in map(int, a.chunk_lens.split(",")):
        us = per_query_us(a.prefix_len, x, a.heads, a.kv_heads, a.head_dim, a.repeats)
        rows.append((x, us))
        print(f"x={x}: {us:.1f} us per query over {a.prefix_len} prefix keys", flush=True)
    ref = dict(rows).get(1024) or rows[-1][1]
    lines = ["# PyTorch's CPU flash attention: cost per query against the chunk size", "",
             *provenance_lines(f"python {' '.join(['benchmarks/flash_split.py'] + sys.argv[1:])}",
                               f"; {a.threads} thread(s); float32"), "",
             f"x queries over {a.prefix_len} prefix keys (non-causal, the prefix part of the plugin's extend "
             f"attention), {a.heads} query heads, {a.kv_heads} KV heads, head dim {a.head_dim}; best of {a.repeats}.",
             "", "| chunk x | us per query | / the 1024 row |", "|---:|---:|---:|"]
    lines += [f"| {x} | {us:.1f} | {us / ref:.3f} |" for x, us in rows]
    lines += ["", "The kernel (`aten/src/ATen/native/cpu/FlashAttentionKernel.cpp`) picks its query block from the "
              "query length: 32 rows below 192, 64 below 768, 256 from 768 on; every block streams all L keys."]
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
