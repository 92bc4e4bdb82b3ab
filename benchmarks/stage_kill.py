"""Kill the PP1 scheduler (SIGKILL) during a long prefill on the real PP=2 CPU server, with the plugin's
plan policy and with upstream alone (SGLANG_CPP_POLICY=off), and record what the client and the server do.

For each policy: start the server (--watchdog-timeout 60), send one long streamed request, kill the
process titled `sglang::scheduler_PP1` once PP0 has run a few chunks, then wait (up to --wait-s) for:
the client's outcome (an error, a hang, or output), the server's exit, and /health. A silent
truncation (a 200 with fewer tokens than asked and no error) is the outcome that must never happen.
Writes the "4. A stage killed mid-request" section of results/reliability.md.

Usage: python benchmarks/stage_kill.py [--model-path DIR] [--input-len 16384] [--wait-s 180]
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import requests

from sglang_cpp.bench.client import generate, random_ids, wait_healthy
from sglang_cpp.bench.server import ServerSpec, start
from sglang_cpp.files import update_section
from sglang_cpp.machine import provenance_lines

TINY = os.path.expanduser("~/.cache/sglang-cpp/models/tiny-llama")
NEW_TOKENS = 16


def _pp1(pid: int) -> psutil.Process | None:
    for p in psutil.Process(pid).children(recursive=True):
        try:
            if "sglang::scheduler_PP1" in " ".join(p.cmdline()) or p.name().startswith("sglang::scheduler_PP1"):
                return p
        except psutil.Error:
            continue
    return None


def trial(model: str, policy: str, input_len: int, wait_s: float, tmp: str) -> dict:
    env = {"SGLANG_CPP_POLICY": policy, "SGLANG_CPP_CALIB_MAX_LEN": "2048"}
    spec = ServerSpec(model, pp_size=2, chunk_size=512, dynamic=policy != "off", env=env,
                      context_length=input_len + 1024, extra_args=("--watchdog-timeout", "60"))
    srv = start(spec, log_dir=tmp)
    out: dict = {"policy": policy}
    try:
        wait_healthy(srv.base_url, 1800, srv.proc)
        result: dict = {}

        def client():
            try:
                r = generate(srv.base_url, input_ids=random_ids(input_len, seed=5), max_new_tokens=NEW_TOKENS,
                             timeout=wait_s + 60)
                result.update(kind="output", tokens=len(r.output_ids), finish=r.meta.get("finish_reason"))
            except Exception as exc:  # noqa: BLE001 -- the outcome being measured
                result.update(kind="error", error=f"{type(exc).__name__}: {exc}"[:240])
            result["t_end"] = time.time()

        th = threading.Thread(target=client, daemon=True)
        n0 = len(re.findall(r"PP0\] Prefill batch", srv.log()))
        th.start()
        while len(re.findall(r"PP0\] Prefill batch", srv.log())) < n0 + 3 and th.is_alive():
            time.sleep(0.2)  # PP0 is a few chunks into the prompt
        victim = _pp1(srv.proc.pid)
        if victim is None:
            raise RuntimeError("no process titled sglang::scheduler_PP1 under the server")
        t_kill = time.time()
        victim.send_signal(signal.SIGKILL)
        th.join(wait_s)
        result.setdefault("kind", "hang (no answer)")
        while time.time() - t_kill < wait_s and srv.proc.poll() is None:
            time.sleep(0.5)
        try:
            health = requests.get(f"{srv.base_url}/health", timeout=5).status_code
        except requests.RequestException as exc:
            health = type(exc).__name__
        out.update(client=result, server_rc=srv.proc.poll(), health=health,
                   kill_to_client_s=round(result["t_end"] - t_kill, 1) if "t_end" in result else None,
                   server_exit_s=round(time.time() - t_kill, 1) if srv.proc.poll() is not None else None)
    finally:
        srv.stop()
    tail = [ln for ln in srv.log().splitlines() if re.search(r"ERROR|Error|exit|watchdog|killed", ln)]
    out["log"] = tail[-1][:200] if tail else ""
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", default=TINY)
    ap.add_argument("--input-len", type=int, default=16384)
    ap.add_argument("--wait-s", type=float, default=180.0)
    ap.add_argument("--results", default="results/reliability.md")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for policy in ("off", "plan"):
            r = trial(args.model_path, policy, args.input_len, args.wait_s, tmp)
            print(r, flush=True)
            rows.append(r)
    cmd = "python benchmarks/stage_kill.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    lines = [*provenance_lines(cmd.strip()),
             f"- server: PP=2, `{Path(args.model_path).name}`, CPU, --chunked-prefill-size 512, "
             f"--watchdog-timeout 60; one {args.input_len}-token request, {NEW_TOKENS} new tokens; SIGKILL to "
             "`sglang::scheduler_PP1` after PP0 logged 3 prefill chunks", "",
             "| policy | client outcome | client answered after (s) | server exit code | server gone after (s) | "
             "/health after | last error line |", "|---|---|---:|---:|---:|---|---|"]
    silent = False
    for r in rows:
        c = r["client"]
        what = c["kind"] + (f": {c.get('error', '')}" if c["kind"] == "error" else
                            f": {c.get('tokens')} tokens, finish {c.get('finish')}" if c["kind"] == "output" else "")
        silent |= c["kind"] == "output" and c.get("tokens", 0) < NEW_TOKENS and not c.get("finish")
        name = "upstream (SGLANG_CPP_POLICY=off)" if r["policy"] == "off" else "sglang-cpp plan"
        lines.append(f"| {name} | {what.replace('|', '/')[:160]} | {r['kill_to_client_s']} | {r['server_rc']} | "
                     f"{r['server_exit_s']} | "
                     f"{r['health']} | {r['log'].replace('|', '/')} |")
    text = "\n".join(lines)
    print(text)
    update_section(args.results, "4. A stage killed mid-request", text)
    return 1 if silent else 0


if __name__ == "__main__":
    sys.exit(main())
