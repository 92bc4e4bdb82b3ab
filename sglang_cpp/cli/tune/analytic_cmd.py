"""`sglang-cpp tune analytic`: calibrate the analytic model on measured TTFTs.

Fits the fraction of peak the stack reaches (one efficiency for GEMMs and attention) and, with
--fit-overhead and two or more points, the per-chunk overhead, so that the simulated TTFT of each
--measured configuration (and the TTFT ratio of each --measured-ratio pair) matches it (least squares
on the log ratio). Prints predicted vs measured,
optionally predicts --input-len at --pp-size, and writes the per-device JSON (the --pp-size stage
models, each stage's per-chunk overhead beside it as the profile's `chunk_overheads`) that `simulate --profile`, `bench ttft --simulate`
and `plan --profile` load.
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from ...args import add_model_source, alias, parse_gemm_dtype, parse_len, parse_lens, parse_sigma, positive_int


def add_args(p: argparse.ArgumentParser) -> None:
    add_model_source(p.add_argument, required=True)
    p.add_argument("--gpu", dest="device", required=True, help="GPU preset, e.g. H20 (any case)")
    p.add_argument("--tp-size", dest="tp", type=positive_int, default=1, metavar="N", help="tensor parallel size")
    p.add_argument("--dtype", type=parse_gemm_dtype, default=None, metavar="DTYPE",
      help="GEMM dtype in SGLang's words: auto (the checkpoint's, the default), bfloat16, float16, fp8")
    p.add_argument("--measured", action="append", required=True, metavar="PP,INPUT_LEN,TTFT_S[,POLICY[,CHUNK[,SIGMA]]]",
                   help="a measured TTFT, e.g. 1,128k,55.5 (repeat the flag for more points)")
    p.add_argument("--measured-ratio", action="append", default=[],
                   metavar="PP,INPUT_LEN,POLICY:CHUNK[:SIGMA]/POLICY:CHUNK[:SIGMA],RATIO",
                   help="a measured TTFT ratio of two chunk policies, e.g. the blog's "
                        "8,128k,fixed:6k/quadratic:18k:0.8,1.105 (repeatable; counts as a point)")
    p.add_argument("--fit-overhead", action="store_true", help="also fit the per-chunk overhead (>= 2 points)")
    p.add_argument("--chunk-overhead-ms", type=float, default=None,
                   help="per-chunk overhead when it is not fitted (SGLANG_CPP_CHUNK_OVERHEAD_MS; default: the "
                        "device preset's)")
    p.add_argument("--max-prefill-tokens", type=parse_len, default=16384, metavar="LEN",
                   help="SGLang's --max-prefill-tokens")
    p.add_argument("--pp-size", type=positive_int, default=None, metavar="N", help="pipeline of the JSON and the predictions "
                                                            "(default: the largest measured)")
    p.add_argument("--input-len", dest="input_lens", metavar="LEN[,LEN...]", type=parse_lens,
                   default=(), help="predict this length (or these, comma-separated) at --pp-size")
    p.add_argument("--policy", choices=("fixed", "quadratic", "plan"), default="quadratic",
                   help="chunk policy of the predictions")
    p.add_argument("--chunked-prefill-size", dest="chunk", type=parse_len, default=16384, metavar="LEN",
                   help="the base chunk C of --policy's predictions (SGLang's --chunked-prefill-size)")
    p.add_argument("--sigma", type=parse_sigma, default=0.8, help="SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR (quadratic)")
    p.add_argument("--out-dir", default=None, metavar="DIR",
                   help="write the fitted model as a per-device profile JSON in this folder (none: nothing written)")
    p.add_argument("--json", default=None, metavar="OUT.json",
                   help="also write the fit (efficiency, overhead, each point measured vs predicted, the predictions "
                        "and the per-device file's path) as strict JSON")
    alias(p, "--tp-size", "--tp")
    alias(p, "--gpu", "--device")
    alias(p, "--input-len", "--input-lens")


def run(args) -> int:
    from ...whatif.analytic import check_tp, device_of, model_of
    from ...whatif.analytic_fit import Measured, Ratio, fit, predict_ms, priced_stages
    from ...core.profile_io import save_profile
    from ...files import device_file_name

    model = model_of(args.analytic, getattr(args, "model_flag", "--analytic"))
    check_tp(model, args.tp)
    device = device_of(args.device)
    points = [Measured.parse(m) for m in args.measured] + [Ratio.parse(r) for r in args.measured_ratio]
    f = fit(model, device, args.tp, points, chunk_overhead_ms=args.chunk_overhead_ms, fit_overhead=args.fit_overhead,
            max_prefill=args.max_prefill_tokens, dtype=args.dtype)
    print(f"{model.name} on {device.name}, TP{args.tp}: efficiency {f.efficiency:.4f} of peak, per-chunk overhead "
          f"{f.chunk_overhead_ms:.2f} ms ({'fitted' if args.fit_overhead else 'given'})")
    print(f"{'measured configuration':<44} {'measured (s)':>12} {'predicted (s)':>13} {'ratio':>7}")
    rows, preds = [], []
    for p, v in f.rows:
        if isinstance(p, Ratio):
            print(f"{str(p) + ' (ratio)':<44} {p.ratio:>12.3f} {v:>13.3f} {v / p.ratio:>7.3f}")
            rows.append({"configuration": str(p), "kind": "ratio", "measured": p.ratio, "predicted": v})
            continue
        name = f"PP{p.pp_size} {p.input_len} tokens {p.policy} C={p.chunk}" + (f" sigma={p.sigma:g}"
                                                                                if p.policy == "quadratic" else "")
        print(f"{name:<44} {p.ttft_ms / 1e3:>12.2f} {v / 1e3:>13.2f} {v / p.ttft_ms:>7.3f}")
        rows.append({"configuration": name, "kind": "ttft_s", "measured": p.ttft_ms / 1e3, "predicted": v / 1e3})
    P = args.pp_size or max(p.pp_size for p in points)  # a Ratio's PP counts
    dev = replace(device, efficiency=f.efficiency, attn_efficiency=None)
    for L in args.input_lens:
        q = Measured(P, L, 1.0, args.policy, args.chunk, args.sigma)
        t = predict_ms(model, dev, args.tp, q, f.chunk_overhead_ms, args.max_prefill_tokens, args.dtype) / 1e3
        print(f"predicted PP{P} {L} tokens, {args.policy} C={args.chunk}: {t:.2f} s")
        preds.append({"pp_size": P, "input_len": L, "policy": args.policy, "chunked_prefill_size": args.chunk,
                      "sigma": args.sigma if args.policy == "quadratic" else None, "ttft_s": t})
    cost = priced_stages(model, dev, args.tp, P, f.chunk_overhead_ms, dtype=args.dtype)  # the overhead: its carrier
    meta = {"model": model.name, "device_name": device.name, "dtype": cost.stages[0].meta.get("dtype"), "tp": args.tp,
            "pp": P, "backend": "analytic-fit", "efficiency": f.efficiency,
            "measured": [vars(p) for p in points if isinstance(p, Measured)],
            "measured_ratio": [vars(p) for p in points if isinstance(p, Ratio)]}
    path = None
    if args.out_dir:
        path = Path(args.out_dir) / device_file_name(model.name, P, args.tp, device.name, meta["dtype"])
        save_profile(path, meta=meta, cost=cost)
        print(f"wrote {path} (load it with simulate --profile, bench ttft --simulate or plan --profile)")
    else:
        print("(--out-dir DIR writes the fitted model as a profile for simulate --profile, bench ttft --simulate or "
              "plan --profile)")
    if args.json:
        from ...files import save_json

        doc = {"model": model.name, "gpu": device.name, "tp_size": args.tp, "pp_size": P, "dtype": meta["dtype"],
               "efficiency": f.efficiency, "chunk_overhead_ms": f.chunk_overhead_ms, "overhead_fitted": args.fit_overhead,
               "points": rows, "predictions": preds, "profile": str(path) if path else None}
        print(f"wrote {save_json(args.json, doc)}")
    return 0


__all__ = ["add_args", "run"]
