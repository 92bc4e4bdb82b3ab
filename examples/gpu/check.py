"""The GPU check (issue 27): what no CPU test reaches, in 10 minutes or less on one H100 or H200.

Steps, each a row of the results file (results/gpu_check.md), each PASS / FAIL with its figure:
  1. env      CUDA is there, SGLang 0.5.23 and sglang-cpp import, the plugin's entry point is registered
  2. hooks    SGLang's HookRegistry applies every TARGET of the plugin (a child process, as at startup)
  3. timer    the calibration's timer (plugin/timing.py) on CUDA events agrees with a synchronised host clock
  4. server   a real PP=1 `launch_server` with the plugin on CUDA starts (its startup hook check ran)
  5. fit      t(L, x) measured through that server (`sglang-cpp profile --backend server`, prefixes from the
              radix cache, the server's own prefill span) over L + x up to 64K is FlashAttention-shaped: the
              d L^2 term is a small share of the longest sample's time
  6. predict  a model fitted on half of the samples predicts the other half (8K-64K), median error
  7. pp2      only with 2+ GPUs: a PP=2 server's startup calibration ran on CUDA events
  8. kernels  torch only (kernels.py): t(L, x) of a Llama-shaped stack from cuBLAS GEMMs and torch's fused
              attention up to 128K, its FlashAttention shape, held-out error and small-chunk efficiency
              (results/gpu_kernels.md, and per shape results/gpu_kernels-<shape>.profile.json for
              `bench ttft --simulate`). Runs with or without SGLang: the lent GPU machines have none.

Steps 2 and 4-7 need `pip install sglang==0.5.23`; without it env FAILs, they are NOT RUN, and timer and
kernels still run. No model hub (the model is a random-init Llama built here).
Usage: bash examples/gpu/check.sh [--out FILE]
"""
from __future__ import annotations

import argparse
import datetime as _dt
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LEN = 65536
CHUNKS = (2048, 4096, 8192, 16384)
FA_SHARE = 0.10  # d L^2 at most this share of the longest sample's predicted time
PREDICT_ERR = 0.10  # median held-out |predicted / measured - 1|
TIMER_TOL = 0.10


def fa_share(model, L: float, x: float) -> float:
    """The share of t(L, x) that the d L^2 term predicts: near 0 on a FlashAttention kernel, where a chunk
    attends its x queries over L + x keys (e = 2f, d = 0); near 1/3 of the attention on SGLang's CPU
    torch_native backend without the plugin's prefix-aware extend."""
    t = float(model.time(L, x))
    return float(model.d * L * L) / t if t > 0 else math.inf


def split_error(samples: list[dict], fit) -> tuple[float, int]:
    """(median |predicted / measured - 1|, count) of a model fitted on the even-indexed samples (sorted by
    L, x), evaluated on the odd ones; `fit(samples) -> model`."""
    ordered = sorted(samples, key=lambda s: (s["L"], s["x"]))
    train, test = ordered[0::2], ordered[1::2]
    model = fit(train)
    errs = sorted(abs(float(model.time(s["L"], s["x"])) / s["ms"] - 1.0) for s in test)
    if not errs:
        return math.inf, 0
    mid = len(errs) // 2
    return (errs[mid] if len(errs) % 2 else 0.5 * (errs[mid - 1] + errs[mid])), len(errs)


def _fit(samples: list[dict]):
    from sglang_cpp.core.costmodel import fit_cost_model

    return fit_cost_model([s["L"] for s in samples], [s["x"] for s in samples], [s["ms"] for s in samples],
                          name="gpu check")


def _row(rows: list, step: str, ok: bool, figure: str) -> bool:
    rows.append((step, "PASS" if ok else "FAIL", figure))
    print(f"[gpu-check] {step:8s} {'PASS' if ok else 'FAIL'}  {figure}", flush=True)
    return ok


def check_env(rows: list) -> dict:
    import torch
    from importlib.metadata import PackageNotFoundError, entry_points, version

    def installed(pkg: str) -> str:
        try:
            return version(pkg)
        except PackageNotFoundError:
            return "not installed"

    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "sglang": installed("sglang"),
            "sglang_cpp": installed("sglang-cpp"), "python": sys.version.split()[0]}
    info["cuda_ok"] = torch.cuda.is_available()
    info["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    info["gpus"] = torch.cuda.device_count()
    eps = [ep.value for ep in entry_points(group="sglang.srt.plugins")]
    ok = torch.cuda.is_available() and info["sglang"] == "0.5.23" and any(v.startswith("sglang_cpp") for v in eps)
    _row(rows, "env", ok, f"{info['device']} x{info['gpus']}, torch {info['torch']}, sglang {info['sglang']}, "
                          f"entry points {eps}")
    return info


def check_hooks(rows: list) -> bool:
    code = ("from sglang.srt.plugins.hook_registry import HookRegistry; import sglang_cpp.plugin as p; "
            "p.register(); HookRegistry.apply_hooks(); print('UNAPPLIED=' + repr(p.unapplied()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    ok = "UNAPPLIED=''" in out.stdout
    return _row(rows, "hooks", ok, "every TARGET applied" if ok else (out.stdout + out.stderr)[-300:])


def check_timer(rows: list) -> bool:
    import torch

    from sglang_cpp.plugin.timing import DeviceTimer

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    ratios = []
    for _ in range(5):  # torch's events passed in, as SGLang's get_device_module() would give on CUDA
        timer = DeviceTimer("cuda", event_factory=lambda: torch.cuda.Event(enable_timing=True))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        timer.start()
        for _ in range(20):
            a @ a
        timer.stop()
        ev = timer.wait_ms()
        torch.cuda.synchronize()
        ratios.append(ev / ((time.perf_counter() - t0) * 1e3))
    r = sorted(ratios)[len(ratios) // 2]
    return _row(rows, "timer", abs(r - 1) <= TIMER_TOL and timer.cuda,
                f"CUDA events / synchronised host clock = {r:.3f} (median of 5, 20 bf16 8192^3 GEMMs each)")


def build_model(out: Path) -> Path:
    """A random-init Llama (hidden 2048, 8 layers, GQA 16/4, head 128) declaring a 64K+ context."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
                      num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=MAX_LEN + 4096,
                      tie_word_embeddings=False, torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2)
    cfg.architectures = ["LlamaForCausalLM"]
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    return out


def _server(model: Path, pp: int, env: dict, dynamic: bool = False):
    from sglang_cpp.bench.server import ServerSpec

    return ServerSpec(str(model), pp_size=pp, chunk_size=max(CHUNKS), device="cuda", env=env, dynamic=dynamic,
                      extra_args=("--skip-tokenizer-init", "--enable-metrics", "--disable-cuda-graph",
                                  "--mem-fraction-static", "0.7", "--context-length", str(MAX_LEN + 4096)))


def check_server_and_fit(rows: list, model: Path, work: Path) -> list[dict]:
    """Rows server, fit and predict; the measured samples (for the results file)."""
    from sglang_cpp.profiler.grid import ProfileConfig
    from sglang_cpp.profiler.server import profile_server
    from sglang_cpp.bench.server import launched

    with launched(_server(model, 1, {}), 600, log_dir=str(work)) as srv:
        _row(rows, "server", True, f"PP=1 launch_server on CUDA healthy at {srv.base_url}")
        cfg = ProfileConfig(backend="server", base_url=srv.base_url, max_len=MAX_LEN, chunks=CHUNKS,
                            num_prefixes=5, repeats=3, warmup=1)
        samples, meta = profile_server(cfg, progress=False)
    model_all = _fit(samples)
    longest = max(samples, key=lambda s: s["L"] + s["x"])
    share = fa_share(model_all, longest["L"], longest["x"])
    _row(rows, "fit", share <= FA_SHARE,
         f"d L^2 is {share:.1%} of t at L={longest['L']}, x={longest['x']} (bound {FA_SHARE:.0%}); "
         f"e/f = {model_all.e / model_all.f if model_all.f else math.inf:.2f} (FlashAttention: 2); timing "
         f"{meta.get('timing')}; {model_all}")
    err, n = split_error(samples, _fit)
    _row(rows, "predict", err <= PREDICT_ERR,
         f"median |predicted/measured - 1| = {err:.1%} over {n} held-out samples (L + x up to {MAX_LEN})")
    return samples


def check_pp2(rows: list, model: Path, work: Path, gpus: int) -> None:
    from sglang_cpp.bench.server import launched
    from sglang_cpp.files import read_events

    if gpus < 2:
        rows.append(("pp2", "SKIPPED", f"{gpus} GPU: a PP=2 calibration needs two (not counted as a pass)"))
        print("[gpu-check] pp2      SKIPPED (one GPU)", flush=True)
        return
    env = {"SGLANG_CPP_CACHE_DIR": str(work / "cache"), "SGLANG_CPP_CALIB_MAX_LEN": "16384",
           "SGLANG_CPP_DECISION_LOG": str(work / "dec_{rank}.jsonl")}
    with launched(_server(model, 2, env, dynamic=True), 600, log_dir=str(work)) as srv:
        log = srv.log()
    dec = work / "dec_0.jsonl"
    events = read_events([dec]) if dec.exists() else []
    ok = "[sglang-cpp] calibrated" in log and "policy=plan ready" in log
    _row(rows, "pp2", ok, f"PP=2 startup calibration on CUDA: {'done' if ok else 'missing'}; {len(events)} log events")


def check_kernels(rows: list, out: Path, shapes: list) -> None:
    """Step 8: kernels.py's measurement of `shapes`, in that order (JSON beside `out`, written after each shape),
    then kernels_report.py's fit and verdicts, its report and each shape's profile
    (gpu_kernels-<shape>.profile.json) beside `out` too."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import kernels

    cfg = kernels.KernelsConfig()
    doc = kernels.new_doc(torch, cfg, "cuda", "python examples/gpu/check.py (step kernels)")
    js = out.with_name("gpu_kernels.json")
    try:
        kernels.measure(torch, doc, shapes, cfg, "cuda", js)
        import kernels_report

        _, verdicts, profiles = kernels_report.write_report(
            doc, out.with_name("gpu_kernels.md"), doc["commit"], f"python examples/gpu/kernels_report.py {js}")
    except Exception as exc:  # a row, not a crash: what was measured is in the JSON already
        _row(rows, "kernels", False, f"{type(exc).__name__}: {str(exc)[-400:]}")
        return
    print("[gpu-check] profiles: " + ", ".join(str(p) for p in profiles), flush=True)
    for shape, v in verdicts:
        _row(rows, f"kernels {shape}", v["fa_ok"] and v["predict_ok"],
             f"d L^2 {v['fa_share']:.1%} of t (bound {FA_SHARE:.0%}), e/f {v['e_over_f']:.2f}, held-out median "
             f"error {v['predict_err']:.1%} (bound {PREDICT_ERR:.0%}), c0 {v['c0_ms']:.3f} ms; "
             + ", ".join(f"L={k[len('knee_L'):]}: within 5% of the analytic model from x={val}"
                         for k, val in v.items() if k.startswith("knee_")) + " (gpu_kernels.md)")


def write_results(path: Path, rows: list, info: dict, cmd: str, samples: list) -> None:
    lines = [f"# GPU check ({info.get('device')})", "",
             f"- date: {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')}",
             f"- command: `{cmd}`",
             f"- versions: torch {info.get('torch')} (CUDA {info.get('cuda')}), sglang {info.get('sglang')}, "
             f"sglang-cpp {info.get('sglang_cpp')}, python {info.get('python')}; GPUs: {info.get('gpus')}",
             "", "| step | result | figure |", "|---|---|---|"]
    lines += [f"| {s} | {r} | {f.replace('|', '/')} |" for s, r, f in rows]
    if samples:
        lines += ["", "Samples (L, x, ms; the server's prefill span):", "", "| L | x | ms |", "|---:|---:|---:|"]
        lines += [f"| {s['L']} | {s['x']} | {s['ms']:.2f} |" for s in sorted(samples, key=lambda s: (s["L"], s["x"]))]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print(f"[gpu-check] wrote {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "results" / "gpu_check.md"), help="results file")
    ap.add_argument("--shapes", default=None,
                    help="comma list of kernels.py's shapes for step 8, measured in that order (default: all); "
                         "put first the ones a short lease must not lose")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import kernels

    shapes = a.shapes.split(",") if a.shapes else list(kernels.SHAPES)
    if unknown := sorted(set(shapes) - set(kernels.SHAPES)):
        ap.error(f"--shapes: unknown {unknown}; pick from {sorted(kernels.SHAPES)}")
    rows: list = []
    info = check_env(rows)
    samples: list = []
    if info["cuda_ok"]:
        check_timer(rows)
    if info["cuda_ok"] and info["sglang"] != "0.5.23":
        rows.append(("hooks, server, fit, predict, pp2", "NOT RUN",
                     f"sglang {info['sglang']}: they need SGLang 0.5.23 (pip install sglang==0.5.23)"))
    elif rows[0][1] == "PASS":
        check_hooks(rows)
        with tempfile.TemporaryDirectory(prefix="sglang-cpp-gpu-") as tmp:
            work = Path(tmp)
            model = build_model(work / "model")
            try:
                samples = check_server_and_fit(rows, model, work)
            except Exception as exc:  # a row, not a crash: the results file still says what ran
                _row(rows, "server", False, f"{type(exc).__name__}: {str(exc)[-400:]}")
            try:
                check_pp2(rows, model, work, info["gpus"])
            except Exception as exc:
                _row(rows, "pp2", False, f"{type(exc).__name__}: {str(exc)[-400:]}")
    if info["cuda_ok"]:
        check_kernels(rows, Path(a.out), shapes)
    write_results(Path(a.out), rows, info, " ".join([os.path.relpath(sys.argv[0], ROOT), *(argv or sys.argv[1:])]),
                  samples)
    return 0 if all(r in ("PASS", "SKIPPED") for _, r, _ in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
