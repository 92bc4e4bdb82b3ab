"""Issue 26 part 2: how long the startup calibration takes on GPUs, estimated on the analytic model, for the
grid with random-KV prefixes against the earlier design (chunk walks through whole synthetic prompts).

Each sample costs the slowest stage's t(L, x) (the stages calibrate at the same moment), times the GPU
forwards per shape (1 untimed + 2 timed, calibrate.default_repeats), plus filling the prefix's KV slots
at the HBM bandwidth. The earlier design walked three or four chunk sequences per level, each a whole
prompt of the level's length, at levels 4x apart (its schedule is copied below from commit e0e426a, the
last one that ran it). Writes results/calibration_cost.md. SIMULATED: analytic model, not a measurement.

Usage: python benchmarks/calibration_cost.py
"""
from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from sglang_cpp.core.partition import default_partition
from sglang_cpp.machine import provenance_lines
from sglang_cpp.plugin.calibrate import calibration_levels, level_grids
from sglang_cpp.whatif.analytic import DEVICES, MODELS
from sglang_cpp.whatif.analytic_fit import BLOG_PP1, fit, stage_models
from sglang_cpp.whatif.roofline import kv_bytes_per_token

FORWARDS_PER_SHAPE = 3  # GPUs: one untimed forward per shape, then the minimum of 2 (default_repeats)


def old_schedule(max_len: int, align: int = 64, max_chunk: int = 0) -> list[list[int]]:
    """The chunk walks of the earlier design (calibrate.calibration_schedule at e0e426a)."""
    u = max(align, (max_len // 8) // align * align)
    r = max(0, max_len - 8 * u)
    q, p = max(align, (u // 4) // align * align), -(-(3 * max_len // 4) // align) * align
    seqs = [[4 * u, 2 * u, u, u + r], [u, u, 2 * u, 4 * u + r], [2 * u, 2 * u, 2 * u, 2 * u + r]]
    if max_len - p - 3 * q >= 1:
        seqs.append([p, q, 2 * q, max_len - p - 3 * q])
    if max_chunk <= 0:
        return seqs
    cap = max(align, max_chunk // align * align)
    return [[piece for x in seq for piece in [cap] * (x // cap) + ([x % cap] if x % cap else [])] for seq in seqs]


def slowest(stages, L: float, x: float) -> float:
    return max(float(s.time(L, x)) for s in stages)


def old_ms(stages, M: int, cap: int) -> float:
    total = 0.0
    for level in calibration_levels(M):
        for seq in old_schedule(level, max_chunk=cap):
            L = 0
            for x in seq:
                total += FORWARDS_PER_SHAPE * slowest(stages, L, x)
                L += x
    return total


def new_ms(stages, M: int, cap: int, fill_ms_per_token: float) -> float:
    return sum(FORWARDS_PER_SHAPE * (slowest(stages, L, x) + L * fill_ms_per_token)
               for _, pts in level_grids(M, 64, cap) for L, x in pts)


CASES = [  # (label, model, device, tp, pp, targets, largest chunk: SGLang's prefill-buffer ceiling)
    ("Llama3-8B, PP2 TP1 on H100 (128K context)", "llama3-8b", "H100", 1, 2, (32768, 131072), 16384),
    ("Llama3-70B, PP2 TP4 on H100 (128K context)", "llama3-70b", "H100", 4, 2, (131072,), 16384),
    ("Qwen3-235B-A22B-FP8, PP8 TP4 on H20 (the blog's)", "qwen3-235b-a22b-fp8", "H20", 4, 8,
     (131072, 262144, 1048576), 23040),
]


def main() -> int:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cmd = "python benchmarks/calibration_cost.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    q, h20 = MODELS["qwen3-235b-a22b-fp8"], DEVICES["H20"]
    eff = fit(q, h20, 4, [BLOG_PP1]).efficiency
    out = ["# Startup calibration time on GPUs (analytic estimate): the random-KV grid against chunk walks", "",
           *provenance_lines(cmd.strip()), f"- commit: {commit}",
           "- host-independent: pure numpy (analytic roofline stage models); SIMULATED, not measured", "",
           f"Efficiency {eff:.3f} of peak (fitted on the blog's Qwen3-235B PP1 point; used for every case). Each "
           f"shape runs {FORWARDS_PER_SHAPE} times (1 untimed + 2 timed); the stages calibrate at once, so a sample "
           "costs the slowest stage's time. Largest calibration chunk: SGLang's prefill-buffer ceiling "
           "(max(C, --max-prefill-tokens 16384, 1.25 C); C = 18432 for the blog's Qwen3 servers).", "",
           "| deployment | target | samples (grid) | grid (s) | chunk walks (s) | grid / walks |",
           "|---|---:|---:|---:|---:|---:|"]
    got = {}
    for label, name, dev_name, tp, pp, targets, cap in CASES:
        model, dev = MODELS[name], replace(DEVICES[dev_name], efficiency=eff, attn_efficiency=None)
        stages = stage_models(model, dev, tp, pp)
        layers = max(default_partition(model.num_layers, pp))
        fill = layers * kv_bytes_per_token(model, tp) / (dev.mem_bw_gbps * 1e9 * dev.mem_efficiency) * 1e3
        for M in targets:
            n = sum(len(p) for _, p in level_grids(M, 64, cap))
            g, w = new_ms(stages, M, cap, fill) / 1e3, old_ms(stages, M, cap) / 1e3
            got[(name, M)] = (g, w)
            out.append(f"| {label} | {M // 1024}K | {n} | {g:.1f} | {w:.1f} | {g / w:.3f} |")
            print(out[-1], flush=True)
    from sglang_cpp import envs

    budget = envs.CALIB_BUDGET_S.default
    at128 = [g for (n, M), (g, w) in got.items() if M == 131072]
    q1m = got[("qwen3-235b-a22b-fp8", 1048576)]
    out += ["", f"The default budget (SGLANG_CPP_CALIB_BUDGET_S = {budget:.0f} s) against these estimates: a "
            f"128K-context model calibrates in {min(at128):.0f}-{max(at128):.0f} s, inside the issue's 2 minutes; "
            f"the blog's Qwen3-235B PP8 on H20 reaches 1M in {q1m[0]:.0f} s, inside the budget (the chunk walks: "
            f"{q1m[1] / 60:.0f} min, far beyond it). Real GPUs add a launch cost per forward that this "
            "model leaves out: a few ms per forward, under a second over these sample counts."]
    out += ["", "The grid's cost grows with the target as (chunk x prefix) for a capped chunk, the walks' as the "
            "target squared: at 1M the walks are a whole-prompt prefill eight times over, per level."]
    Path("results/calibration_cost.md").write_text("\n".join(out) + "\n")
    print("wrote results/calibration_cost.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
