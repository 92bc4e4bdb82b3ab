"""`sglang-cpp bench`: TTFT benchmark client (`ttft`) and the side-by-side on a real server (`compare`).

Why our own client: sglang.bench_serving tokenizes text prompts, so neither the prompt length nor the
radix-cache hit rate is exact. Here every request is random token ids (distinct per request unless
--shared-prefix asks otherwise) sent to the native /generate with max_new_tokens=1, streamed, so TTFT
is prefill time. Output mimics bench_serving's console block and JSONL keys, so existing tooling reads
it. `--simulate/--analytic/--coeffs` produce the same output from the simulator, for lengths and GPU
counts no local machine has; every such block and line is labelled SIMULATED.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from . import __version__
from .client import ServerError, generate, random_ids, server_info
from .simulator import parse_len

W = 50  # bench_serving's block width


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass(frozen=True)
class BenchConfig:
    """One TTFT run: every input length gets `warmup` unmeasured then `num_requests` measured requests."""

    input_lens: tuple
    num_requests: int = 2
    warmup: int = 1
    max_concurrency: int = 1
    seed: int = 0
    shared_prefix: int = 0
    policy_label: str = ""
    timeout_s: float = 3600.0
    warmup_len: int = 0  # tokens per warmup request; 0 = the measured length (a 16K warmup costs minutes on CPU)

    def __post_init__(self):
        if not self.input_lens or any(int(L) < 1 for L in self.input_lens):
            raise ValueError(f"--input-lens {self.input_lens}: give one or more lengths >= 1 (e.g. 8k,16k)")
        for name, lo in (("num_requests", 1), ("warmup", 0), ("max_concurrency", 1), ("shared_prefix", 0),
                         ("warmup_len", 0)):
            if int(getattr(self, name)) < lo:
                raise ValueError(f"--{name.replace('_', '-')}={getattr(self, name)} must be >= {lo}")
        if self.shared_prefix and self.shared_prefix >= min(self.input_lens):
            raise ValueError(f"--shared-prefix {self.shared_prefix} must be smaller than every --input-lens "
                             f"(shortest is {min(self.input_lens)})")


# -- metrics and the console block --------------------------------------------------------------
def summarize(ttfts_s, errors, input_len: int, duration_s: float, e2e_s=None) -> dict:
    """bench_serving's result keys for one input length; percentiles over successful requests only."""
    ok = [i for i, e in enumerate(errors) if not e]
    ms = np.array([ttfts_s[i] for i in ok], dtype=float) * 1e3
    e2e = np.array([e2e_s[i] for i in ok], dtype=float) * 1e3 if e2e_s is not None else np.array([])

    def st(fn, a=ms):
        return float(fn(a)) if a.size else None

    n, dur = len(ok), float(duration_s)
    return {"random_input_len": int(input_len), "random_output_len": 1, "num_prompts": len(errors),
            "completed": n, "failed": len(errors) - n, "duration": dur,
            "total_input_tokens": n * int(input_len), "total_output_tokens": n,
            "request_throughput": n / dur if dur > 0 else None,
            "input_throughput": n * int(input_len) / dur if dur > 0 else None,
            "mean_ttft_ms": st(np.mean), "median_ttft_ms": st(np.median), "std_ttft_ms": st(np.std),
            "p90_ttft_ms": st(lambda a: np.percentile(a, 90)), "p95_ttft_ms": st(lambda a: np.percentile(a, 95)),
            "p99_ttft_ms": st(lambda a: np.percentile(a, 99)),
            "mean_e2e_latency_ms": st(np.mean, e2e), "median_e2e_latency_ms": st(np.median, e2e),
            "input_lens": [int(input_len)] * len(errors),
            "ttfts": [0.0 if e else float(t) for t, e in zip(ttfts_s, errors)],  # seconds, as bench_serving
            "errors": [e or "" for e in errors]}


def format_block(rec: dict) -> str:
    """The '==== Serving Benchmark Result ====' block, one per input length."""
    sim = rec.get("simulated")
    fmt = lambda k, v: ("{:<40} {:<10.2f}" if isinstance(v, float) else "{:<40} {:<10}").format(  # noqa: E731
        k, "n/a" if v is None else v)
    title = " Serving Benchmark Result (SIMULATED) " if sim else " Serving Benchmark Result "
    lines = ["{s:{c}^{n}}".format(s=title, n=W, c="=")]
    if sim:
        lines.append("SIMULATED: sglang-cpp simulator output, not a measurement")
    lines += [fmt("Backend:", rec.get("backend")), fmt("Policy:", rec.get("policy") or "-"),
              fmt("Max request concurrency:", rec.get("max_concurrency")),
              fmt("Random input len:", rec["random_input_len"]),
              fmt("Successful requests:", rec["completed"])]
    if rec.get("failed"):
        lines.append(fmt("Failed requests:", rec["failed"]))
    lines += [fmt("Benchmark duration (s):", rec["duration"]),
              fmt("Total input tokens:", rec["total_input_tokens"]),
              fmt("Request throughput (req/s):", rec["request_throughput"]),
              fmt("Input token throughput (tok/s):", rec["input_throughput"]),
              "{s:{c}^{n}}".format(s="Time to First Token", n=W, c="-")]
    for label, key in (("Mean", "mean"), ("Median", "median"), ("P90", "p90"), ("P95", "p95"), ("P99", "p99")):
        lines.append(fmt(f"{label} TTFT (ms):", rec[f"{key}_ttft_ms"]))
    lines.append("=" * W)
    return "\n".join(lines)


def run_meta(label: str, simulated: bool, info: dict | None = None) -> dict:
    """Provenance every JSONL line carries."""
    info = info or {}
    keep = ("model_path", "pp_size", "tp_size", "chunked_prefill_size", "enable_dynamic_chunking",
            "context_length", "max_prefill_tokens", "attention_backend", "device", "max_req_input_len")
    return {"policy": label, "tag": label, "simulated": simulated,
            "versions": {"sglang_cpp": __version__, "server": info.get("version")},
            "machine": {"node": platform.node(), "cpu_count": os.cpu_count()},
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "server_info": {k: info[k] for k in keep if k in info} or None}


# -- real server ---------------------------------------------------------------------------------
_CTX_KEYS = ("context_len", "max_context_length", "context_length", "max_model_len")


def context_limit(info: dict) -> tuple[int | None, str]:
    """(context length, where it was found) from server_info, whose layout differs across versions."""
    places = [("", info)] + [(f"{k}.", info.get(k)) for k in ("model_config", "server_args", "model_info")]
    places += [(f"internal_states[{i}].", s) for i, s in enumerate(info.get("internal_states") or [])]
    for prefix, d in places:
        if not isinstance(d, dict):
            continue
        for k in _CTX_KEYS:
            v = d.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
                return int(v), prefix + k
    for prefix, d in places:  # the scheduler's bound on prompts is context_len - 1 (or the KV pool)
        if isinstance(d, dict) and isinstance(d.get("max_req_input_len"), int):
            return int(d["max_req_input_len"]) + 1, prefix + "max_req_input_len + 1"
    return None, ""


def _find(info: dict, key: str):
    places = [info] + [info.get(k) for k in ("model_config", "server_args")] + list(info.get("internal_states") or [])
    for d in places:
        if isinstance(d, dict) and isinstance(d.get(key), int) and not isinstance(d.get(key), bool):
            return d[key]
    return None


def check_context(info: dict, input_lens) -> int | None:
    """Fail before sending when SGLang would reject a prompt (it needs input_len < context_len)."""
    ctx, where = context_limit(info)
    if ctx is None:
        _log("warning: server_info names no context length; lengths are not checked")
        return None
    for L in input_lens:
        if L >= ctx:
            what = "exceeds" if L > ctx else "leaves no room for the output token in"
            raise ValueError(f"--input-lens {L} {what} the server's context length {ctx} (server_info {where}): "
                             "pass --context-length to the server or shorten --input-lens")
    mr = _find(info, "max_req_input_len")  # also bounded by the KV pool (--mem-fraction-static)
    if mr is not None and max(input_lens) > mr:
        pool = _find(info, "max_total_num_tokens")
        raise ValueError(f"--input-lens {max(input_lens)} exceeds the server's max_req_input_len {mr} (KV pool of "
                         f"{pool} tokens): raise the server's --mem-fraction-static / --context-length or shorten")
    return ctx


def make_input_ids(L: int, index: int, seed: int, shared_prefix: int = 0) -> list[int]:
    """Request `index` gets seed+index, so no two requests share a prefix unless --shared-prefix asks."""
    if not shared_prefix:
        return random_ids(L, seed + index)
    return random_ids(shared_prefix, seed + 10**9 + L) + random_ids(L - shared_prefix, seed + index)


def run_ttft(base_url: str, cfg: BenchConfig, log=_log) -> list[dict]:
    """Measure TTFT per input length on a running server; failed requests are kept, with their error."""
    base_url = base_url.rstrip("/")
    info = server_info(base_url)  # ServerError naming the URL when unreachable
    check_context(info, cfg.input_lens)
    meta = run_meta(cfg.policy_label, False, info)
    index, records = 0, []

    def one(job):
        i, ids = job
        try:
            r = generate(base_url, input_ids=ids, max_new_tokens=1, timeout=cfg.timeout_s)
            return r.ttft_s, r.e2e_s, r.meta, ""
        except Exception as exc:  # keep going: one bad request must not lose the others
            return 0.0, 0.0, {}, str(exc) if isinstance(exc, ServerError) else f"{type(exc).__name__}: {exc}"

    for L in cfg.input_lens:
        warm_errors = []
        for w in range(cfg.warmup):
            n = min(L, cfg.warmup_len) if cfg.warmup_len else L
            *_, err = one((w, make_input_ids(n, index, cfg.seed, cfg.shared_prefix if n == L else 0)))
            index += 1
            log(f"len {L} warmup {w}: " + (f"FAILED: {err}" if err else "done"))
            if err:
                warm_errors.append(err)
        jobs = [(i, make_input_ids(L, index + i, cfg.seed, cfg.shared_prefix)) for i in range(cfg.num_requests)]
        index += cfg.num_requests
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=cfg.max_concurrency) as ex:
            out = list(ex.map(one, jobs))
        dur = time.perf_counter() - t0
        for i, (t, _, _, err) in enumerate(out):
            log(f"len {L} request {i}: " + (f"FAILED: {err}" if err else f"TTFT {t * 1e3:.1f} ms"))
        plans = [m.get("sglang_cpp_plan") for _, _, m, _ in out]
        rec = summarize([o[0] for o in out], [o[3] for o in out], L, dur, [o[1] for o in out])
        records.append({"backend": "sglang-native", "dataset_name": "random-ids", "base_url": base_url,
                        "max_concurrency": cfg.max_concurrency, "warmup": cfg.warmup, "seed": cfg.seed,
                        "shared_prefix": cfg.shared_prefix, **rec, "warmup_errors": warm_errors,
                        "chunk_plan": plans if any(p is not None for p in plans) else None, **meta})
    return records


def any_failed(records) -> bool:
    return any(r["failed"] or r.get("warmup_errors") for r in records)


# -- simulated ----------------------------------------------------------------------------------
def _upstream_coeffs(cost, coeffs: str | None, profile: str | None, chunk: int) -> tuple[float, float, float]:
    """Upstream's f(l) = a l^2 + b l + c: --coeffs A,B,C, the profile's 'upstream', else a fit of the
    cost model's fresh prefills at the lengths upstream's startup profiling measures."""
    if coeffs and len(coeffs.split(",")) == 3:
        return tuple(float(v) for v in coeffs.split(","))
    if profile:
        doc = json.loads(Path(profile).read_text())
        if isinstance(doc, dict) and "upstream" in doc:
            u = doc["upstream"]
            return float(u["a"]), float(u["b"]), float(u["c"])
    from .upstream import emulated_fit

    return emulated_fit(cost, chunk)


def chunks_for(policy: str, L: int, cost, pp: int, chunk: int, *, sigma: float = 0.75, ctx: int | None = None,
               max_prefill: int = 16384, overhead_ms: float = 0.0, coeffs=None, profile=None) -> list[int]:
    """The chunk sequence a server with this policy runs for an L-token prompt (no cached prefix)."""
    from .planner import plan_equal_time, plan_fixed
    from .plugin.sizer import SizerConfig
    from .upstream import UpstreamPredictor

    scfg = SizerConfig(policy="plan", pp_size=pp, pp_rank=0, chunk_size=chunk, max_prefill_tokens=max_prefill,
                       page_size=1, context_len=ctx or 1 << 62, sigma=sigma, overhead_ms=overhead_ms)
    pcfg = scfg.plan_config()  # exactly the server's planner settings
    if policy == "fixed":
        return list(plan_fixed(L, cost, pcfg, chunk).chunks)
    if policy == "plan":
        return list(plan_equal_time(L, cost, pcfg).chunks)
    a, b, c = _upstream_coeffs(cost, coeffs, profile, chunk)
    return UpstreamPredictor(a=a, b=b, c=c, chunk_size=chunk, context_len=ctx or 1 << 62, sigma=sigma,
                             max_prefill_tokens=max_prefill).chunk_sequence(L)


def simulate_ttft(args) -> list[dict]:
    """Same records as run_ttft, from the simulator; closed loop at --max-concurrency, FIFO."""
    from .costmodel import PipelineCost
    from .simulator import SimConfig, _cli_costs, simulate_requests

    P = args.pp_size
    src = SimpleNamespace(profile=args.simulate, analytic=args.analytic if not args.simulate else None,
                          coeffs=args.coeffs if not (args.simulate or args.analytic) else None,
                          device=args.device, tp=args.tp, dtype=None, efficiency=None, layers_per_stage=None,
                          pp_size=P)
    stages, hidden = _cli_costs(src)
    cost = stages[0] if P == 1 else PipelineCost(tuple(stages))
    cfg = SimConfig(p2p_latency_ms=args.p2p_latency_ms, p2p_bandwidth_gbps=args.p2p_bandwidth_gbps,
                    hidden_size=hidden, cpu_overhead_ms=args.cpu_overhead_ms)
    chunk = args.chunk_size or 8192
    label = args.policy_label or f"{args.policy} (simulated)"
    meta = run_meta(label, True)
    hw = {"source": args.simulate and f"profile {args.simulate}" or args.analytic and
          f"analytic {args.analytic} on {args.device}" or f"coeffs {args.coeffs}", "pp_size": P, "tp": args.tp,
          "chunk_size": chunk, "sim_policy": args.policy}
    records, n, C = [], args.num_requests, args.max_concurrency
    for L in args.input_lens:
        chunks = chunks_for(args.policy, L, cost, P, chunk, sigma=args.sigma, max_prefill=args.max_prefill_tokens,
                            overhead_ms=args.cpu_overhead_ms, coeffs=args.coeffs, profile=args.simulate)
        arrivals = [0.0] * min(C, n)
        res = simulate_requests([(a, chunks) for a in arrivals], stages, P, cfg)
        while len(arrivals) < n:  # the next request starts when the one C places earlier finished
            j = len(arrivals) - C
            arrivals.append(arrivals[j] + res.ttfts_ms[j])
            res = simulate_requests([(a, chunks) for a in arrivals], stages, P, cfg)
        ttfts = [t / 1e3 for t in res.ttfts_ms]
        rec = summarize(ttfts, [""] * n, L, res.makespan_ms / 1e3, ttfts)
        records.append({"backend": "sglang-cpp-simulator", "dataset_name": "random-ids", "max_concurrency": C,
                        "warmup": 0, **rec, "warmup_errors": [],
                        "chunk_plan": {"policy": args.policy, "chunks": chunks}, "simulated_setup": hw, **meta})
    return records


# -- outputs --------------------------------------------------------------------------------------
def write_jsonl(records, path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")
    return p


def plot_ttft(records, path) -> Path:
    """Median TTFT against input length, p90 as the upper error bar; one line per policy label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label in dict.fromkeys(r.get("policy") or "" for r in records):
        rs = sorted((r for r in records if (r.get("policy") or "") == label and r["median_ttft_ms"] is not None),
                    key=lambda r: r["random_input_len"])
        if not rs:
            continue
        x = [r["random_input_len"] for r in rs]
        med = np.array([r["median_ttft_ms"] for r in rs])
        up = np.array([r["p90_ttft_ms"] for r in rs]) - med
        ax.errorbar(x, med, yerr=[np.zeros_like(med), up], marker="o", capsize=3, label=label or None)
    sim = any(r.get("simulated") for r in records)
    ax.set_xlabel("input length (tokens)")
    ax.set_ylabel("TTFT (ms), median; bar to p90")
    ax.set_title("TTFT vs input length" + (" (SIMULATED)" if sim else ""))
    if any(r.get("policy") for r in records):
        ax.legend()
    ax.grid(alpha=0.3)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(p, dpi=120)
    plt.close(fig)
    return p


# -- CLI ---------------------------------------------------------------------------------------------
def parse_lens(text: str) -> tuple:
    try:
        lens = tuple(parse_len(t) for t in str(text).split(",") if t.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not lens or min(lens) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated lengths >= 1, e.g. 8k,16k")
    return lens


def parse_ints(text: str) -> tuple:
    try:
        return tuple(parse_len(t) for t in str(text).split(",") if t.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_ttft_args(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a("--base-url", help="SGLang server, e.g. http://127.0.0.1:30000 (not needed when simulating)")
    a("--input-lens", type=parse_lens, required=True, help="comma-separated prompt lengths (8k = 8192)")
    a("--num-requests", type=int, default=2, help="measured requests per length")
    a("--warmup", type=int, default=1, help="unmeasured requests per length, before the measured ones")
    a("--max-concurrency", type=int, default=1)
    a("--seed", type=int, default=0, help="request i gets random ids from seed + i")
    a("--shared-prefix", type=parse_len, default=0, help="first LEN ids shared by all requests of a length")
    a("--output-jsonl", help="append one bench_serving-style JSON line per length")
    a("--plot", help="PNG of median TTFT (p90 bars) against input length")
    a("--policy-label", default="", help="name of the server's configuration, carried into the JSONL")
    a("--timeout", type=float, default=3600.0, help="per-request timeout (s)")
    g = p.add_argument_group("simulation (no server; output labelled SIMULATED)")
    g.add_argument("--simulate", metavar="PROFILE", help="profile / cost-model JSON to simulate")
    g.add_argument("--analytic", metavar="MODEL", help="analytic model preset (sglang_cpp.analytic.MODELS)")
    g.add_argument("--coeffs", help="A,B,C (upstream f(l), also the cost model when alone) or c0,g,b,d,e,f")
    g.add_argument("--device", default="H100", help="device preset for --analytic")
    g.add_argument("--tp", type=int, default=1)
    g.add_argument("--pp-size", type=int, default=2)
    g.add_argument("--chunk-size", type=parse_len, default=None, help="--chunked-prefill-size (default 8192)")
    g.add_argument("--policy", choices=("plan", "fixed", "quadratic"), default="plan")
    g.add_argument("--sigma", type=float, default=0.75, help="SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR (quadratic)")
    g.add_argument("--max-prefill-tokens", type=int, default=16384)
    g.add_argument("--p2p-latency-ms", type=float, default=0.0)
    g.add_argument("--p2p-bandwidth-gbps", type=float, default=math.inf)
    g.add_argument("--cpu-overhead-ms", type=float, default=0.0, help="host overhead per chunk and stage")


def add_args(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_cmd", required=True)
    add_ttft_args(sub.add_parser("ttft", help="TTFT per input length (real server or simulated)",
                                 description=__doc__.splitlines()[0]))
    from .compare import add_compare_args, compare_doc

    add_compare_args(sub.add_parser("compare", help="side-by-side on the CPU SmolLM2 server (launches servers)",
                                    description=compare_doc()))


def run_ttft_cli(args) -> int:
    simulated = bool(args.simulate or args.analytic or args.coeffs)
    if simulated and args.base_url:
        raise ValueError("--base-url cannot be combined with --simulate/--analytic/--coeffs: "
                         "drop --base-url to simulate, or the simulation options to measure")
    if not simulated and not args.base_url:
        raise ValueError("give --base-url of a running SGLang server, or --simulate PROFILE / --analytic MODEL")
    if args.simulate and args.analytic:
        raise ValueError("give one cost source: --simulate PROFILE or --analytic MODEL, not both")
    if simulated and args.shared_prefix:
        raise ValueError("--shared-prefix is not simulated; drop it, or measure on a server with --base-url")
    if simulated:
        BenchConfig(tuple(args.input_lens), args.num_requests, 0, args.max_concurrency)  # validates
        records = simulate_ttft(args)
    else:
        cfg = BenchConfig(tuple(args.input_lens), args.num_requests, args.warmup, args.max_concurrency, args.seed,
                          args.shared_prefix, args.policy_label, args.timeout)
        records = run_ttft(args.base_url, cfg)
    for r in records:
        print(format_block(r))
    if args.output_jsonl:
        _log(f"wrote {write_jsonl(records, args.output_jsonl)}")
    if args.plot:
        _log(f"wrote {plot_ttft(records, args.plot)}")
    if any_failed(records):
        n = sum(r["failed"] + len(r.get("warmup_errors") or []) for r in records)
        print(f"sglang-cpp bench: {n} request(s) failed; see 'errors' in the output", file=sys.stderr)
        return 1
    return 0


def run(args) -> int:
    try:
        if args.bench_cmd == "ttft":
            return run_ttft_cli(args)
        from .compare import run_compare

        return run_compare(args)
    except (ServerError, ValueError) as exc:
        print(f"sglang-cpp bench {args.bench_cmd}: error: {exc}", file=sys.stderr)
        return 2
