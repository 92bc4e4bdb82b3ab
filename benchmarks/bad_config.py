"""Bad configurations on the real PP=2 CPU server: each must exit non-zero soon after the model loads,
with one log line that names the input and the fix.

Every case starts stock `python -m sglang.launch_server --pp-size 2 --enable-dynamic-chunking` with the
plugin, on the tiny test model (the weights do not matter here), and records the exit code, the seconds
from start and from the model load (SGLang's "Load weight end" line) to the exit, and the plugin's
message. Writes the "2. Bad-config matrix" section of results/reliability.md.

Usage: python benchmarks/bad_config.py [--model-path DIR] [--results results/reliability.md]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path

from sglang_cpp.bench.server import ServerSpec, start
from sglang_cpp.files import update_section
from sglang_cpp.machine import provenance_lines

TINY = os.path.expanduser("~/.cache/sglang-cpp/models/tiny-llama")


def _profiles(d: Path, model: str) -> dict:
    """Profile files for the profile cases: valid-looking, truncated, mismatched, negative."""
    stage = {"coeffs": {"c0": 5.0, "g": 0.0, "b": 0.01, "d": 0.0, "e": 2e-6, "f": 1e-6}, "meta": {}, "fit": {}}
    base = {"format": "sglang-cpp-profile", "version": 1, "samples": [], "stages": [stage, stage],
            "meta": {"model": Path(model).name, "pp": 2, "tp": 1, "dtype": "float32"}}
    out = {}
    for name, meta, stages in (("other-model", {"model": "Qwen3-8B"}, None), ("other-tp", {"tp": 4}, None),
                               ("other-dtype", {"dtype": "bfloat16"}, None), ("other-pp", {"pp": 3}, [stage] * 3),
                               ("negative", {}, [{**stage, "coeffs": {**stage["coeffs"], "b": -0.01}}] * 2)):
        doc = {**base, "meta": {**base["meta"], **meta}, "stages": stages or base["stages"]}
        (d / f"{name}.json").write_text(json.dumps(doc))
        out[name] = str(d / f"{name}.json")
    text = json.dumps(base)
    (d / "truncated.json").write_text(text[:len(text) // 2])
    out["truncated"] = str(d / "truncated.json")
    (d / "a-folder.json").mkdir(exist_ok=True)  # root reads every file, so 'unreadable' is a folder
    out["unreadable"] = str(d / "a-folder.json")
    (d / "blocker").write_text("")
    return out


def cases(d: Path, model: str) -> list[tuple[str, dict, tuple, str]]:
    """(name, env, extra server args, text the plugin's message must contain)."""
    p = _profiles(d, model)
    return [
        ("unknown SGLANG_CPP_POLICY", {"SGLANG_CPP_POLICY": "fastest"}, (), "SGLANG_CPP_POLICY='fastest'"),
        ("sigma out of range", {"SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR": "1.5"}, (), "SMOOTH_FACTOR"),
        ("sigma not a number", {"SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR": "abc"}, (), "SMOOTH_FACTOR"),
        ("profile missing", {"SGLANG_CPP_PROFILE": str(d / "missing.json")}, (), "SGLANG_CPP_PROFILE="),
        ("profile unreadable (a folder)", {"SGLANG_CPP_PROFILE": p["unreadable"]}, (), "SGLANG_CPP_PROFILE="),
        ("profile truncated", {"SGLANG_CPP_PROFILE": p["truncated"]}, (), "SGLANG_CPP_PROFILE="),
        ("profile of another model", {"SGLANG_CPP_PROFILE": p["other-model"]}, (), "measured on model Qwen3-8B"),
        ("profile for another pp", {"SGLANG_CPP_PROFILE": p["other-pp"]}, (), "--pp-size is 2"),
        ("profile for another tp", {"SGLANG_CPP_PROFILE": p["other-tp"]}, (), "measured with tp=4"),
        ("profile for another dtype", {"SGLANG_CPP_PROFILE": p["other-dtype"]}, (), "measured with dtype=bfloat16"),
        ("profile with a negative coefficient", {"SGLANG_CPP_PROFILE": p["negative"]}, (), "must be a finite number >= 0"),
        ("SGLANG_CPP_MIN_CHUNK > SGLANG_CPP_MAX_CHUNK", {"SGLANG_CPP_MIN_CHUNK": "2048", "SGLANG_CPP_MAX_CHUNK": "1024"},
         (), "SGLANG_CPP_MIN_CHUNK=2048 exceeds SGLANG_CPP_MAX_CHUNK=1024"),
        ("bad SGLANG_PP_LAYER_PARTITION", {"SGLANG_PP_LAYER_PARTITION": "1,1"}, (), "SGLANG_PP_LAYER_PARTITION"),
        ("dynamic chunking without a chunk size", {}, ("--chunked-prefill-size", "-1"), "--chunked-prefill-size > 0"),
        ("unwritable cache dir", {"SGLANG_CPP_CACHE_DIR": str(d / "blocker" / "cache")}, (),
         "SGLANG_CPP_CACHE_DIR="),
        ("unknown SGLANG_CPP_BATCH_POLICY", {"SGLANG_CPP_BATCH_POLICY": "fastest"}, (), "SGLANG_CPP_BATCH_POLICY"),
        ("batch policy gllm without --enable-mixed-chunk", {"SGLANG_CPP_BATCH_POLICY": "gllm"}, (),
         "SGLANG_CPP_BATCH_POLICY=gllm"),
        ("batch policy time without the plan policy's cost model",
         {"SGLANG_CPP_BATCH_POLICY": "time", "SGLANG_CPP_POLICY": "quadratic"}, ("--enable-mixed-chunk",),
         "SGLANG_CPP_BATCH_POLICY=time"),
        ("calibration fails on PP1 only", {"SGLANG_CPP_CALIB_FAULT_RANK": "1", "SGLANG_CPP_CACHE_DIR": str(d / "cache"),
                                           "SGLANG_CPP_CALIB_MAX_LEN": "1024"}, (), "fault injected"),
    ]


_LOADED = re.compile(r"Load weight end")


def run_case(model: str, env: dict, extra: tuple, needle: str, timeout: float) -> dict:
    base = {"SGLANG_CPP_POLICY": "plan", "SGLANG_CPP_CALIB_MAX_LEN": "1024"}
    spec = ServerSpec(model, pp_size=2, chunk_size=None if extra else 1024, dynamic=True, env={**base, **env},
                      extra_args=extra)
    t0 = time.time()
    srv = start(spec)
    loaded_at = None
    try:
        while time.time() - t0 < timeout and srv.proc.poll() is None:
            if loaded_at is None and _LOADED.search(srv.log()):
                loaded_at = time.time()
            time.sleep(0.5)
        rc = srv.proc.poll()
        t_exit = time.time()
    finally:
        srv.stop()
    log = srv.log()
    if loaded_at is None and _LOADED.search(log):
        loaded_at = t_exit  # loaded between the last poll and the exit
    lines = [ln.strip() for ln in log.splitlines() if needle in ln]
    msg = next((ln for ln in lines if "sglang-cpp" in ln or "Error" in ln), lines[0] if lines else "")
    return {"rc": rc, "exit_s": round(t_exit - t0, 1),
            "after_load_s": None if loaded_at is None else round(t_exit - loaded_at, 1),
            "message": re.sub(r"^\[[^\]]*\]\s*", "", msg)[:300], "found": bool(lines),
            "ranks_with_reason": len({m for m in re.findall(r" (PP\d+|TP\d+)", "\n".join(lines))})}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", default=TINY)
    ap.add_argument("--results", default="results/reliability.md")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds before a case counts as hanging")
    args = ap.parse_args()
    rows, bad = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, env, extra, needle in cases(Path(tmp), args.model_path):
            r = run_case(args.model_path, env, extra, needle, args.timeout)
            ok = r["rc"] not in (None, 0) and r["found"] and (r["after_load_s"] or 0) <= 60
            bad += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {name}: rc={r['rc']} exit {r['exit_s']} s "
                  f"({r['after_load_s']} s after load): {r['message']}", flush=True)
            rows.append((name, env, extra, r, ok))
    cmd = "python benchmarks/bad_config.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    out = [*provenance_lines(cmd.strip()), f"- server: PP=2, `{Path(args.model_path).name}`, CPU, --chunked-prefill-size 1024, "
           "--enable-dynamic-chunking, the plugin's plan policy", "",
           f"{len(rows) - bad} of {len(rows)} cases pass (exit code != 0, within 60 s of the model load, a message "
           "naming the input).", "",
           "| case | setting | exit code | s from start | s after model load | message (first line naming it) |",
           "|---|---|---:|---:|---:|---|"]
    for name, env, extra, r, ok in rows:
        setting = " ".join([*(f"{k}={Path(v).name if '/' in v else v}" for k, v in env.items()), *extra])
        out.append(f"| {name}{'' if ok else ' **FAIL**'} | `{setting}` | {r['rc']} | {r['exit_s']} | "
                   f"{r['after_load_s']} | {r['message'].replace('|', '/')} |")
    text = "\n".join(out)
    print(text)
    update_section(args.results, "2. Bad-config matrix on the real PP=2 server", text)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
