"""`sglang-cpp bench ttft`'s client: TTFT per input length on a real server (or the simulator).

Why our own client: sglang.bench_serving tokenizes text prompts, so neither the prompt length nor the
radix-cache hit rate is exact. Here every request is random token ids (distinct per request unless
--shared-prefix asks otherwise) sent to the native /generate with max_new_tokens=1, streamed, so TTFT
is prefill time. Output mimics bench_serving's console block and JSONL keys, so existing tooling reads
it. `--simulate/--analytic/--coeffs` produce the same output from the simulator, for lengths and GPU
counts no local machine has; every such block and line is labelled SIMULATED.
"""
from __future__ import annotations

import json
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..machine import machine_info
from .client import ServerError, generate, random_ids, server_info

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
    seed: int | None = None  # None: a fresh one per run (printed and recorded), so a rerun misses the radix cache
    shared_prefix: int = 0
    policy_label: str = ""
    timeout_s: float = 3600.0
    warmup_len: int = 0  # tokens per warmup request; 0 = the measured length (a 16K warmup costs minutes on CPU)

    def __post_init__(self):
        if not self.input_lens or any(int(L) < 1 for L in self.input_lens):
            raise ValueError(f"--input-len {self.input_lens}: give one or more lengths >= 1 (e.g. 8k,16k)")
        for name, flag, lo in (("num_requests", "--num-prompts", 1), ("warmup", "--warmup-requests", 0),
                               ("max_concurrency", "--max-concurrency", 1), ("shared_prefix", "--shared-prefix", 0),
                               ("warmup_len", "--warmup-len", 0)):
            if int(getattr(self, name)) < lo:
                raise ValueError(f"{flag} {getattr(self, name)} must be >= {lo}")
        if self.shared_prefix and self.shared_prefix >= min(self.input_lens):
            raise ValueError(f"--shared-prefix {self.shared_prefix} must be smaller than every --input-len "
                             f"(shortest is {min(self.input_lens)})")


# -- metrics and the console block --------------------------------------------------------------
def summarize(ttfts_s, errors, input_len: int, duration_s: float, e2e_s=None, lens=None) -> dict:
    """bench_serving's result keys for one input length (`lens`: each request's own, when they differ);
    percentiles over successful requests only."""
    lens = [int(input_len)] * len(errors) if lens is None else [int(n) for n in lens]
    ok = [i for i, e in enumerate(errors) if not e]
    ms = np.array([ttfts_s[i] for i in ok], dtype=float) * 1e3
    e2e = np.array([e2e_s[i] for i in ok], dtype=float) * 1e3 if e2e_s is not None else np.array([])

    def st(fn, a=ms):
        return float(fn(a)) if a.size else None

    n, dur = len(ok), float(duration_s)
    tokens = sum(lens[i] for i in ok)
    return {"random_input_len": int(input_len), "random_output_len": 1, "num_prompts": len(errors),
            "completed": n, "failed": len(errors) - n, "duration": dur,
            "total_input_tokens": tokens, "total_output_tokens": n,
            "request_rate": None,  # bench_serving's key; None: closed loop (--max-concurrency), not Poisson
            "request_throughput": n / dur if dur > 0 else None,
            "input_throughput": tokens / dur if dur > 0 else None,
            "output_throughput": n / dur if dur > 0 else None,  # one output token per request
            "mean_ttft_ms": st(np.mean), "median_ttft_ms": st(np.median), "std_ttft_ms": st(np.std),
            "p90_ttft_ms": st(lambda a: np.percentile(a, 90)), "p95_ttft_ms": st(lambda a: np.percentile(a, 95)),
            "p99_ttft_ms": st(lambda a: np.percentile(a, 99)),
            "mean_e2e_latency_ms": st(np.mean, e2e), "median_e2e_latency_ms": st(np.median, e2e),
            "p99_e2e_latency_ms": st(lambda a: np.percentile(a, 99), e2e),
            "input_lens": lens,
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
    m = machine_info()
    return {"policy": label, "tag": label, "simulated": simulated,
            "versions": {"sglang_cpp": m["sglang-cpp"], "server": info.get("version"), "torch": m["torch"]},
            "machine": {"node": platform.node(), "cpu_count": m["cores"], "cpu": m["cpu"], "isa": m["isa"]},
            "date": m["date"],
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
            raise ValueError(f"--input-len {L} {what} the server's context length {ctx} (server_info {where}): "
                             "pass --context-length to the server or shorten --input-len")
    mr = _find(info, "max_req_input_len")  # also bounded by the KV pool (--mem-fraction-static)
    if mr is not None and max(input_lens) > mr:
        pool = _find(info, "max_total_num_tokens")
        raise ValueError(f"--input-len {max(input_lens)} exceeds the server's max_req_input_len {mr} (KV pool of "
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
    if cfg.seed is None:  # a fresh seed per run: the same server's radix cache never serves a rerun's prompts
        import random

        cfg = replace(cfg, seed=random.SystemRandom().randrange(1 << 30))
        log(f"seed {cfg.seed} (pass --seed {cfg.seed} to send these prompts again)")

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
        plans = [_plan_of(m) for _, _, m, _ in out]
        rec = summarize([o[0] for o in out], [o[3] for o in out], L, dur, [o[1] for o in out])
        records.append({"backend": "sglang-native", "dataset_name": "random-ids", "base_url": base_url,
                        "max_concurrency": cfg.max_concurrency, "warmup": cfg.warmup, "seed": cfg.seed,
                        "shared_prefix": cfg.shared_prefix, **rec, "warmup_errors": warm_errors,
                        "chunk_plan": plans if any(p is not None for p in plans) else None, **meta})
    return records


def _plan_of(meta: dict):
    """The plan a sglang-cpp server reports in meta_info (SGLang delivers it as a one-element list)."""
    p = meta.get("sglang_cpp_plan")
    return p[0] if isinstance(p, list) and p else p


def any_failed(records) -> bool:
    return any(r["failed"] or r.get("warmup_errors") for r in records)


def write_jsonl(records, path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")
    return p


def _finite_rate(r: dict):
    v = r.get("request_rate")
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def plot_load(records, path) -> Path:
    """Mean TTFT against the request rate (streams), p99 as the upper error bar; one line per policy label and
    input length."""
    from ..files import pyplot, save_figure

    fig, ax = pyplot().subplots(figsize=(6, 4))
    keys = dict.fromkeys(((r.get("policy") or ""), r.get("input_len_mix") or r["random_input_len"]) for r in records)
    for label, inp in keys:
        rs = sorted((r for r in records if (r.get("policy") or "") == label and _finite_rate(r) is not None
                     and (r.get("input_len_mix") or r["random_input_len"]) == inp and r["mean_ttft_ms"] is not None),
                    key=_finite_rate)
        if not rs:
            continue
        mean = np.array([r["mean_ttft_ms"] for r in rs])
        up = np.array([r["p99_ttft_ms"] for r in rs]) - mean
        name = label + (f", input {inp}" if len({k[1] for k in keys}) > 1 else "")
        ax.errorbar([_finite_rate(r) for r in rs], mean, yerr=[np.zeros_like(mean), up], marker="o", capsize=3,
                    label=name or None)
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("TTFT (ms), mean; bar to p99")
    ax.set_yscale("log")
    ax.set_title("TTFT vs load" + (" (SIMULATED)" if any(r.get("simulated") for r in records) else ""))
    if any(r.get("policy") for r in records):
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def plot_ttft(records, path) -> Path:
    """Median TTFT against input length on log axes, p90 as the upper error bar; one line per policy label. Streams
    (a finite request rate): TTFT against the rate instead (`plot_load`)."""
    from ..files import pyplot, save_figure

    if any(_finite_rate(r) is not None for r in records):
        return plot_load(records, path)
    fig, ax = pyplot().subplots(figsize=(6, 4))
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
    # log axes: TTFT grows about as the square of the length, so a linear axis flattens every length below the
    # longest (128K-256K, where a plan gains most, sat on the floor of a 1M run's plot)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("input length (tokens, log scale)")
    ax.set_ylabel("TTFT (ms, log scale), median; bar to p90")
    ax.set_title("TTFT vs input length" + (" (SIMULATED)" if sim else ""))
    if any(r.get("policy") for r in records):
        ax.legend()
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


# -- CLI ---------------------------------------------------------------------------------------------
