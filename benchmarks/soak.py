"""Soak: 50 mixed requests against the real PP=2 CPU server with the plan policy.

Lengths 100 to 8K tokens, a third sharing prefixes (radix hits), concurrency 4, some aborted by the
client mid-prefill (the stream is closed before the first token). Then:
- every completed output equals a PP=1 server's on the same input (greedy);
- both stages' decision logs agree request by request;
- after the run the KV pool is back to idle: /flush_cache succeeds (SGLang refuses it while requests
  hold KV) and a fresh request's prefill reports the same token usage as on the fresh server;
- no ERROR/Traceback lines in the server log.
Writes the "3. Soak" section of results/reliability.md.

Usage: python benchmarks/soak.py [--model-path DIR] [--num 50] [--results results/reliability.md]
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import requests

from sglang_cpp.bench.client import generate, random_ids
from sglang_cpp.bench.server import ServerSpec, launched
from sglang_cpp.files import read_events, update_section
from sglang_cpp.machine import provenance_lines

TINY = os.path.expanduser("~/.cache/sglang-cpp/models/tiny-llama")
NEW_TOKENS = 8


def workload(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    shared = random_ids(2048, seed=seed + 7)
    out = []
    for i in range(n):
        L = int(np.exp(rng.uniform(np.log(100), np.log(8192))))
        ids = random_ids(L, seed=seed * 1000 + i)
        if i % 3 == 0:  # a third share a 2K (or shorter) prefix: radix hits
            k = min(len(shared), max(1, L - 64))
            ids = shared[:k] + ids[k:] if L > 64 else ids
        out.append({"i": i, "ids": ids, "abort": i % 10 == 7})  # 5 of 50 aborted by the client
    return out


def _abort(url: str, ids: list[int], after_s: float) -> str:
    """Stream a request and close the connection before the first token (mid-prefill)."""
    body = {"input_ids": ids, "stream": True, "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0}}
    try:
        with requests.post(f"{url}/generate", json=body, stream=True, timeout=(5, after_s)) as r:
            for _ in r.iter_lines():
                return "finished before the abort"
    except requests.exceptions.RequestException:  # the read timeout: the client hangs up mid-prefill
        return "aborted"
    return "aborted"


def run(url: str, jobs: list[dict], concurrency: int, abort_s: float) -> dict:
    def one(job):
        if job["abort"]:
            return job["i"], {"abort": _abort(url, job["ids"], abort_s)}
        try:
            r = generate(url, input_ids=job["ids"], max_new_tokens=NEW_TOKENS, timeout=1800)
            return job["i"], {"ids": r.output_ids, "cached": int(r.meta.get("cached_tokens", 0) or 0)}
        except Exception as exc:  # noqa: BLE001 -- counted as an error in the report
            return job["i"], {"error": f"{type(exc).__name__}: {exc}"[:200]}

    with ThreadPoolExecutor(concurrency) as ex:
        return dict(ex.map(one, jobs))


def _usage(log: str) -> list[float]:
    return [float(m) for m in re.findall(r"Prefill batch.*?token usage: ([0-9.]+)", log)]


def decisions(path: Path) -> dict:
    """rid -> [(prefix, chunk), ...]: every chunk decision a stage logged."""
    out: dict = {}
    if path.exists():
        for d in read_events([path], "decision"):
            out.setdefault(d["rid"], []).append((d["prefix"], d["chunk"]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", default=TINY)
    ap.add_argument("--num", type=int, default=50)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--abort-after-s", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", default="results/reliability.md")
    args = ap.parse_args()
    jobs = workload(args.num, args.seed)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        env = {"SGLANG_CPP_POLICY": "plan", "SGLANG_CPP_DECISION_LOG": f"{tmp}/dec_{{pp_rank}}.jsonl",
               "SGLANG_CPP_CALIB_MAX_LEN": "8192"}
        spec = ServerSpec(args.model_path, pp_size=2, chunk_size=1024, dynamic=True, env=env, context_length=16384)
        with launched(spec, timeout=1800, log_dir=tmp) as srv:
            generate(srv.base_url, input_ids=random_ids(64, seed=99), max_new_tokens=1)
            idle_before = _usage(srv.log())[-1:]
            pp2 = run(srv.base_url, jobs, args.concurrency, args.abort_after_s)
            time.sleep(2)
            flushed = requests.post(f"{srv.base_url}/flush_cache", timeout=60).status_code == 200
            generate(srv.base_url, input_ids=random_ids(64, seed=99), max_new_tokens=1)
            idle_after = _usage(srv.log())[-1:]
            healthy = requests.get(f"{srv.base_url}/health", timeout=30).status_code == 200
            log = srv.log()
        dec = [decisions(Path(tmp) / f"dec_{r}.jsonl") for r in (0, 1)]
        spec1 = ServerSpec(args.model_path, pp_size=1, chunk_size=1024, env={"SGLANG_CPP_POLICY": "off"},
                           context_length=16384)
        with launched(spec1, timeout=1800, log_dir=tmp) as srv1:
            pp1 = run(srv1.base_url, [j for j in jobs if not j["abort"]], args.concurrency, args.abort_after_s)
    done = [i for i, r in pp2.items() if "ids" in r]
    same = [i for i in done if pp1.get(i, {}).get("ids") == pp2[i]["ids"]]
    errors = [f"{i}: {r['error']}" for i, r in pp2.items() if "error" in r]
    aborted = [i for i, r in pp2.items() if "abort" in r]
    rids = set(dec[0]) | set(dec[1])
    agree = [r for r in rids if dec[0].get(r) == dec[1].get(r)]
    err_lines = [ln for ln in log.splitlines() if re.search(r"\bERROR\b|Traceback", ln)]
    hits = sum(1 for i in done if pp2[i]["cached"] > 0)
    cmd = "python benchmarks/soak.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    ok = (len(same) == len(done) and not errors and len(agree) == len(rids) and flushed and healthy
          and not err_lines and idle_after == idle_before)
    text = "\n".join([
        *provenance_lines(cmd.strip()),
        f"- server: PP=2, `{Path(args.model_path).name}`, CPU, --chunked-prefill-size 1024, plan policy; "
        f"{args.num} requests of 100-8192 tokens (a third with a shared 2K prefix), {NEW_TOKENS} new tokens, "
        f"concurrency {args.concurrency}; {len(aborted)} streamed and closed by the client after "
        f"{args.abort_after_s} s; wall {time.time() - t0:.0f} s (both servers)", "",
        "| check | result |", "|---|---|",
        f"| completed | {len(done)} of {args.num - len(aborted)} (errors: {len(errors)}) |",
        f"| aborted by the client | {len(aborted)} ({', '.join(sorted({pp2[i]['abort'] for i in aborted}))}) |",
        f"| radix hits (cached_tokens > 0) | {hits} |",
        f"| output equals PP=1 (greedy, {NEW_TOKENS} tokens) | {len(same)} of {len(done)} |",
        f"| requests whose plan both stages logged identically | {len(agree)} of {len(rids)} |",
        f"| /flush_cache after the run (refused while KV is held) | {'ok' if flushed else 'REFUSED'} |",
        f"| token usage of a fresh request: before / after the soak | {idle_before} / {idle_after} |",
        f"| healthy after the run | {healthy} |",
        f"| ERROR / Traceback lines in the server log | {len(err_lines)} |",
        "", "All checks pass." if ok else "**Some checks fail**: " + "; ".join(errors[:3] + err_lines[:3])])
    print(text)
    update_section(args.results, "3. Soak", text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
