"""The planner at PP >= 4 on stages measured on a GPU (issue 44 item 3): `sglang-cpp bench ttft --simulate` on
each profile examples/gpu/check.sh brought back, side by side with fixed chunks and upstream's dynamic chunking.

Why: the CPU server at PP2 can only show ties; planning gains live at PP >= 4, which only the simulator reaches.
Here every chunk is priced by a t(L, x) fitted on CUDA-event timings of one TP rank's share of 2 layers (the
measured stage, torch only: cuBLAS / grouped GEMMs and FlashAttention; no SGLang, no P2P), every PP stage the
same stage, plus a per-chunk overhead the kernels cannot see (--chunk-overhead-ms, the analytic presets' 2 ms).
Pure simulation: host-independent (no planning time charged, `--planning-ms 0`: one prompt's one decision;
results/stream.md charges it). Writes results/<folder>/measured_stages.md.
Usage: python benchmarks/measured_stages.py [--folder results/gpu-h200] [--pp-size 4,8] [--input-len 128k]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from sglang_cpp.machine import provenance_lines

ROOT = Path(__file__).resolve().parents[1]
POLICIES = "fixed:1k,fixed:2k,fixed:4k,fixed:8k,fixed:16k,quadratic:16k,plan:4k,plan:16k"


def side_by_side(profile: Path, pp: int, input_len: str, overhead: float) -> tuple[str, list[str]]:
    """(the command, the table rows `bench ttft` printed under 'SIMULATED side by side')."""
    cmd = ["sglang-cpp", "bench", "ttft", "--simulate", str(profile.relative_to(ROOT)), "--pp-size", str(pp),
           "--input-len", input_len, "--num-prompts", "1", "--chunk-overhead-ms", f"{overhead:g}",
           "--planning-ms", "0", "--policy", POLICIES]
    out = subprocess.run([sys.executable, "-m", "sglang_cpp.cli", *cmd[1:]], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.splitlines()
    start = next(i for i, line in enumerate(out) if line.startswith("SIMULATED side by side"))
    return " ".join(cmd), [line for line in out[start + 1:] if line.startswith("|")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", default=str(ROOT / "results" / "gpu-h200"), help="where the GPU run's profiles lie")
    ap.add_argument("--pp-size", default="4,8", help="comma list of PP sizes")
    ap.add_argument("--input-len", default="128k")
    ap.add_argument("--chunk-overhead-ms", type=float, default=2.0)
    ap.add_argument("--results", default=None, help="the results file (default <folder>/measured_stages.md)")
    a = ap.parse_args(argv)
    folder = Path(a.folder).resolve()
    profiles = sorted(folder.glob("gpu_kernels-*.profile.json"))
    if not profiles:
        ap.error(f"--folder {a.folder}: no gpu_kernels-*.profile.json there; run examples/gpu/check.sh first")
    lines = ["# The planner on GPU-measured stages at PP >= 4 (SIMULATED)", "",
             *provenance_lines("python benchmarks/measured_stages.py " + " ".join(argv if argv is not None
                                                                                  else sys.argv[1:])),
             f"- stages: {folder.relative_to(ROOT)}/gpu_kernels.md (measured on that GPU, CUDA events, torch only);"
             f" each pipeline stage is that measured stage, plus {a.chunk_overhead_ms:g} ms per chunk and stage",
             "- what the figures are: simulated TTFT of one prompt, in s; 'plan / upstream dynamic' is the first plan "
             "column (C = 4096) over upstream's quadratic dynamic chunking at C = 16384 and its default sigma", ""]
    for profile in profiles:
        shape = profile.name[len("gpu_kernels-"):-len(".profile.json")]
        for pp in (int(p) for p in a.pp_size.split(",")):
            cmd, table = side_by_side(profile, pp, a.input_len, a.chunk_overhead_ms)
            lines += [f"## {shape}, PP{pp}", "", f"`{cmd}`", "", *table, ""]
            print(f"[measured-stages] {shape} PP{pp}: {table[-1]}", flush=True)
    out = Path(a.results) if a.results else folder / "measured_stages.md"
    out.write_text("\n".join(lines))
    print(f"[measured-stages] wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
