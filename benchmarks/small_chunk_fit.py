"""Issue 25 part 5: what the analytic model misses for small chunks, tested against the design blog.

The blog (shared/seeds/004_26665f2ba558731c.txt) gives three figures for Qwen3-235B-A22B-FP8 on H20, TP4, 128K:
PP1 "~55.5 s"; PP8 DCK 18K sigma 0.8 10.54 s (Table 1); and, at PP8, 69.6% (fixed 6K) against 76.9%
(DCK 18K) strong-scaling efficiency, i.e. fixed 6K / DCK 18K = 1.105. Today's model, fitted on the PP1
point, gives 10.39 s and 1.038.

Each candidate term below gets one free parameter theta. For every theta the efficiency is refitted so that
PP1 stays at 55.5 s; theta is then solved (brentq) for the ratio 1.105. The table says what theta that
takes, and what it does to the other two figures:

- per-chunk overhead: o ms per chunk and stage (launch, scheduler, P2P); small-GEMM tile waste and MoE
  padding have the same shape (a constant per chunk and stage), so they need the same total;
- per-layer overhead: theta ms per chunk and layer (PP1 pays it 94 times per chunk, a PP8 stage 11-12 times);
- per-chunk cost growing with the prefix: theta ms per 1K prefix tokens, per chunk and layer;
- attention slower than GEMMs: attention efficiency = theta x the GEMM efficiency.

Each row also reports both readings of "strong-scaling efficiency": TTFT (one request) and throughput
(16 requests queued at once, the blog's throughput test), as T(PP1) / (8 T(PP8)).
Writes results/small_chunk_fit.md. Every figure is a simulation on the analytic roofline model.

Usage: python benchmarks/small_chunk_fit.py
"""
from __future__ import annotations

import shlex
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.optimize import brentq

from sglang_cpp.core.costmodel import CostModel, PipelineCost, add_constant
from sglang_cpp.core.partition import default_partition
from sglang_cpp.core.policy import chunks_for
from sglang_cpp.machine import provenance_lines
from sglang_cpp.whatif.analytic import DEVICES, MODELS
from sglang_cpp.whatif.analytic_fit import Measured, Ratio, fit, stage_models
from sglang_cpp.whatif.simulator import simulate_requests

Q, H20, TP, S = MODELS["qwen3-235b-a22b-fp8"], DEVICES["H20"], 4, 128 * 1024
PP1_S, TABLE1_S, RATIO = 55.5, 10.54, 1.105
BLOG_EFF = {"fixed": 0.696, "quadratic": 0.769}
FIXED6K, DCK18K = ("fixed", 6144, 0.8), ("quadratic", 18432, 0.8)
PP1_CFG = ("fixed", 16384, 0.8)  # the PP1 point as `tune analytic --measured 1,128k,55.5` reads it
RATIO_ARG = "8,128k,fixed:6k/quadratic:18k:0.8,1.105"


def _add_g(cost, g: float):
    if isinstance(cost, PipelineCost):
        return PipelineCost(tuple(_add_g(m, g) for m in cost.stages))
    return CostModel(**{**cost.coeffs, "g": cost.g + g}, meta=cost.meta, fit=cost.fit)


def stages(kind: str, theta: float, eff: float, pp: int) -> list:
    """Per-stage models of candidate `kind` at parameter theta (the H20 preset's 2 ms per chunk besides)."""
    dev = replace(H20, efficiency=eff, attn_efficiency=min(theta * eff, 1.0) if kind == "attention" else None)
    out = []
    for m, n in zip(stage_models(Q, dev, TP, pp), default_partition(Q.num_layers, pp)):
        m = add_constant(m, H20.chunk_overhead_ms + {"chunk": theta, "layer": theta * n}.get(kind, 0.0))
        out.append(_add_g(m, theta * n / 1024) if kind == "prefix" else m)
    return out


def ttft_ms(kind: str, theta: float, eff: float, pp: int, cfg: tuple, requests: int = 1) -> float:
    """Mean per-request time: the TTFT of one request, or makespan / n of n requests queued at 0."""
    st = stages(kind, theta, eff, pp)
    cost = st[0] if pp == 1 else PipelineCost(tuple(st))
    chunks = chunks_for(cfg[0], S, cost, pp, cfg[1], sigma=cfg[2], max_prefill=16384)
    r = simulate_requests([(0.0, chunks)] * requests, st, pp)
    return r.ttft_ms if requests == 1 else r.makespan_ms / requests


def efficiency_at(kind: str, theta: float) -> float:
    """The efficiency that keeps PP1 at 55.5 s under this candidate."""
    return brentq(lambda e: ttft_ms(kind, theta, e, 1, PP1_CFG) - PP1_S * 1e3, 0.05, 1.0, xtol=1e-6)


def row(kind: str, theta: float) -> dict:
    eff = efficiency_at(kind, theta)
    t = {c[0]: ttft_ms(kind, theta, eff, 8, c) for c in (FIXED6K, DCK18K)}
    thr = {c[0]: ttft_ms(kind, theta, eff, 1, c, 16) / (8 * ttft_ms(kind, theta, eff, 8, c, 16))
           for c in (FIXED6K, DCK18K)}
    return dict(theta=theta, eff=eff, ratio=t["fixed"] / t["quadratic"], dck=t["quadratic"] / 1e3,
                ttft_eff={k: PP1_S * 1e3 / (8 * v) for k, v in t.items()}, thr_eff=thr)


# kind: (label, unit, theta with no effect, the largest theta tried). The largest is about what PP1 allows:
# beyond it no efficiency <= 1 keeps PP1 at 55.5 s (attention alone is 44.7 s at peak).
CANDIDATES = {
    "chunk": ("per-chunk overhead (also: small-GEMM tile waste, MoE padding)", "ms per chunk and stage", 0.0, 600.0),
    "layer": ("per-layer overhead", "ms per chunk and layer", 0.0, 6.0),
    "prefix": ("per-chunk cost growing with the prefix", "ms per 1K prefix tokens, per chunk and layer", 0.0, 0.12),
    "attention": ("attention slower than GEMMs", "attention / GEMM efficiency", 1.0, 0.9),
}


def solve(kind: str) -> tuple[dict | None, dict]:
    """(the row at the theta that reproduces 1.105, or None; the row at the largest theta tried)."""
    _, _, lo, hi = CANDIDATES[kind]
    far = row(kind, hi)
    if (far["ratio"] - RATIO) * (row(kind, lo)["ratio"] - RATIO) > 0:
        return None, far
    th = brentq(lambda t: row(kind, t)["ratio"] - RATIO, lo, hi, xtol=abs(hi - lo) * 1e-4)
    return row(kind, th), far


def fmt(r: dict) -> str:
    return (f"{r['eff']:.3f} | {r['ratio']:.3f} | {r['dck']:.2f} ({r['dck'] / TABLE1_S:.2f}x) | "
            f"{r['ttft_eff']['fixed']:.1%} / {r['ttft_eff']['quadratic']:.1%} | "
            f"{r['thr_eff']['fixed']:.1%} / {r['thr_eff']['quadratic']:.1%}")


def main() -> int:
    cmd = "python benchmarks/small_chunk_fit.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    base = row("chunk", 0.0)
    out = ["# The small-chunk regime: which model term reproduces the blog's fixed 6K / DCK 18K = 1.105", "",
           *provenance_lines(cmd.strip()),
           "- host-independent: pure numpy/scipy (analytic roofline model, chunk policies, simulator); SIMULATED", "",
           "Qwen3-235B-A22B-FP8, TP4 on H20, 128K tokens. Blog figures: PP1 55.5 s; PP8 DCK 18K sigma 0.8 "
           "10.54 s (Table 1); strong-scaling efficiency at PP8 69.6% (fixed 6K) and 76.9% (DCK 18K), ratio 1.105. "
           "Each row refits the efficiency so that PP1 stays at 55.5 s. 'Scaling' columns: fixed 6K / DCK 18K, as "
           "T(PP1) / (8 T(PP8)), per single request (TTFT) and with 16 requests queued (throughput).", "",
           "| candidate | theta | efficiency | fixed 6K / DCK 18K | DCK 18K TTFT, s (vs 10.54) | scaling, TTFT | "
           "scaling, 16 requests |", "|---|---:|---:|---:|---:|---:|---:|",
           f"| today's model (2 ms per chunk) | — | {fmt(base)} |",
           f"| blog | — | — | {RATIO} | 10.54 (1.00x) | — | {BLOG_EFF['fixed']:.1%} / {BLOG_EFF['quadratic']:.1%} |"]
    notes = []
    for kind, (label, unit, lo, hi) in CANDIDATES.items():
        hit, far = solve(kind)
        if hit is None:
            out.append(f"| {label} | {hi:g} {unit} (the most tried) | {fmt(far)} |")
            notes.append(f"- {label}: never reaches 1.105; at {hi:g} {unit} it gives {far['ratio']:.3f}.")
        else:
            out.append(f"| {label} | {hit['theta']:.3g} {unit} | {fmt(hit)} |")
            notes.append(f"- {label}: 1.105 at {hit['theta']:.3g} {unit}, and DCK 18K is then "
                         f"{hit['dck']:.2f} s against the blog's 10.54 s ({hit['dck'] / TABLE1_S:.2f}x).")
        print(out[-1], flush=True)
    q3 = fit(Q, H20, TP, [Measured(1, S, PP1_S * 1e3), Ratio.parse(RATIO_ARG),
                          Measured(8, S, TABLE1_S * 1e3, *DCK18K)], fit_overhead=True)
    out += ["", "## What it says", "", *notes, "",
            "Why they cannot: the two chunk sequences differ little. Fixed 6K cuts 22 chunks; DCK 18K (our mirror "
            "of upstream's predictor) cuts 18, from 18432 down to about 5.5K, so their late chunks are alike and a "
            "term that prices small or late chunks prices both. What separates them is 4 chunks and the first 48K "
            "tokens, and a cost per chunk large enough to make that 10% makes every chunk expensive, DCK's too. "
            "The terms other than the per-chunk overhead are also bounded by the PP1 point: beyond the largest "
            "theta tried, no efficiency <= 1 keeps PP1 at 55.5 s.", "",
            "What the data cannot settle: 69.6% and 76.9% come from the blog's throughput test (\"the average of 16 "
            "consecutive requests\"), and each configuration may be scaled against its own PP1 run. In this model, "
            "16 queued requests scale at 94-95% under every candidate but the large overhead, so the blog's "
            "efficiencies are neither TTFT nor saturated-throughput quantities of this model. The what-if default "
            "stays today's model (2 ms per chunk; Table 1's 10.54 s predicted within 1.5%).", "",
            "All three figures fitted together (`sglang-cpp tune analytic --analytic qwen3-235b-a22b-fp8 --gpu H20 "
            f"--tp-size 4 --measured 1,128k,55.5 --measured 8,128k,10.54,quadratic,18k,0.8 --measured-ratio "
            f"{RATIO_ARG} --fit-overhead`): efficiency {q3.efficiency:.3f}, per-chunk overhead {q3.chunk_overhead_ms:.1f} "
            f"ms; it gives " + ", ".join(f"{p}: {v:.3f}" if isinstance(p, Ratio) else
                                         f"PP{p.pp_size} {p.policy}: {v / 1e3:.2f} s" for p, v in q3.rows) + ".",
            "", "results/tuning_free_analytic-ratio-fit.md reports the issue's targets on the fit to the PP1 point and "
            "the ratio alone (`--measured 1,128k,55.5 --measured-ratio ... --fit-overhead`)."]
    Path("results/small_chunk_fit.md").write_text("\n".join(out) + "\n")
    print("\n".join(out[-8:]))
    print("wrote results/small_chunk_fit.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
