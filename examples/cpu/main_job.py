"""The main job on the embedded default: stock SGLang 0.5.23 on this CPU, SmolLM2-135M, PP=2,
`--enable-dynamic-chunking` driven by the sglang-cpp plugin (plan policy).

It launches the server (the first start calibrates t(L, x) on every stage and caches it),
sends one long prompt, and prints the TTFT and the chunk plan the stages actually ran.
Usage: python examples/cpu/main_job.py [--input-len 6000] [--chunked-prefill-size 1024]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from sglang_cpp.bench.client import generate, random_ids
from sglang_cpp.bench.server import ServerSpec, launched
from sglang_cpp.core.plan import ChunkPlan
from sglang_cpp.files import read_events

MODEL = Path(os.environ.get("SGLANG_CPP_CACHE_DIR", Path.home() / ".cache/sglang-cpp")) / "models/smollm2-135m"


def plan_from_log(path: Path, rid: str, prompt_len: int, pp_size: int) -> ChunkPlan:
    dec = {d["prefix"]: d for d in read_events([path], "decision") if d["rid"] == rid}
    steps = [dec[k] for k in sorted(dec)]
    return ChunkPlan(prompt_len=prompt_len, prefix_len=steps[0]["prefix"], chunks=[d["chunk"] for d in steps],
                     pred_ms=[d["predicted_ms"] or 0.0 for d in steps], pp_size=pp_size, policy="plan (as run)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--input-len", "--prompt-len", dest="prompt_len", type=int, default=6000)
    ap.add_argument("--chunked-prefill-size", "--chunk-size", dest="chunk_size", type=int, default=1024)
    ap.add_argument("--model-path", "--model", dest="model", default=str(MODEL))
    ap.add_argument("--results", default=str(Path(__file__).resolve().parents[2] / "results" / "main_job.md"),
                    help="results file to (over)write with this run's figures ('' for none)")
    a = ap.parse_args()
    logdir = Path(tempfile.mkdtemp(prefix="sglang-cpp-main-"))
    # calibrate up to the prompt length (a multiple of 64), not the whole context: what this job needs
    calib = os.environ.get("SGLANG_CPP_CALIB_MAX_LEN") or str(-(-a.prompt_len // 64) * 64)
    env = {"SGLANG_CPP_POLICY": "plan", "SGLANG_CPP_DECISION_LOG": str(logdir / "decisions_pp{rank}.jsonl"),
           "SGLANG_CPP_CALIB_MAX_LEN": calib}
    spec = ServerSpec(a.model, pp_size=2, chunk_size=a.chunk_size, dynamic=True, env=env)
    print(f"[main] launching: {' '.join(spec.command(0)[1:])}", flush=True)
    t0 = time.time()
    print("[main] the first start calibrates t(L, x) on both stages (cached for the next start); progress:",
          flush=True)
    with launched(spec, timeout=1800, log_dir=str(logdir), echo="[sglang-cpp] calibrat") as srv:
        healthy_s = time.time() - t0
        print(f"[main] server healthy after {healthy_s:.0f}s (log: {srv.log_path})", flush=True)
        res = generate(srv.base_url, input_ids=random_ids(a.prompt_len, seed=2026), max_new_tokens=1)
        rid = res.meta.get("id")
        calibrated = [ln for ln in srv.log().splitlines() if "[sglang-cpp] calibrated" in ln or
                      "cost model from calibration cache" in ln][:1]
    plans = [plan_from_log(logdir / f"decisions_pp{r}.jsonl", rid, a.prompt_len, 2) for r in (0, 1)]
    print(f"\n[main] prompt {a.prompt_len} tokens, PP=2: TTFT = {res.ttft_s:.2f} s")
    print(plans[0].timeline())
    same = plans[0].chunks == plans[1].chunks
    print(f"[main] both stages ran chunks {list(plans[0].chunks)}: identical = {same}")
    print(f"[main] decision logs: {logdir}")
    if a.results:
        write_results(Path(a.results), a, healthy_s, time.time() - t0, res.ttft_s, plans[0], calibrated)
    return 0 if same else 1


def write_results(path: Path, a, healthy_s: float, wall_s: float, ttft_s: float, plan: ChunkPlan,
                  calibrated: list) -> None:
    from sglang_cpp.machine import provenance_lines

    cmd = "python examples/cpu/main_job.py" + "".join(f" {x}" for x in sys.argv[1:])
    calib = calibrated[0][calibrated[0].find("[sglang-cpp]"):] if calibrated else "(not logged)"
    lines = ["# Main job: SmolLM2-135M, PP=2, plan policy, one long prompt", "",
             *provenance_lines(cmd), "",
             f"- server healthy after {healthy_s:.0f} s; calibration: {calib}",
             f"- prompt {a.prompt_len} tokens, --chunked-prefill-size {a.chunk_size}: TTFT {ttft_s:.2f} s, "
             f"predicted {plan.ttft_ms / 1e3:.2f} s",
             f"- chunks both stages ran: {list(plan.chunks)}", f"- job wall time: {wall_s:.0f} s", "",
             "```", plan.timeline(), "```"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print(f"[main] wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
