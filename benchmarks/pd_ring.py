"""Issue 31 on the real CPU PD set-up: how many prefill loop iterations pass between a request's last chunk
forward, its final KV send, the end of its transfer on every stage, the decode's first token and its
release on each stage; upstream against SGLANG_CPP_PD_FAST_RING=1 and SGLANG_CPP_PD_EARLY_KV=1, interleaved.

Prefill PP=P (default 4, tiny-llama: one layer per stage, ranks on cores 0|1|0|1, a capped
--max-total-tokens), decode PP1, Mooncake over TCP, requests dispatched to both as the router does (with a
bootstrap room each). Per prefill start: a short warm-up, --long requests of --long-len tokens one at a time
(TTFT at decode, streamed), then a stream of --stream requests of --stream-len tokens sent together (KV held
per iteration). Per rank the plugin's decision log gives the loop index `it` of every event
(plugin/pd/ring.py): `forward` (the last chunk's), `kv_early` (the early send of that chunk's KV, plugin/pd/kv.py),
`kv_chunk` (last=True: the final KV send), `kv_status`
(4: this stage's transfer done), `release`. Policy off: no calibration, SGLang's own chunking.

Usage: python benchmarks/pd_ring.py [--pp-size 4] [--rounds 2] [--results results/pd_ring.md]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from sglang_cpp.bench.client import generate, random_ids
from sglang_cpp.bench.server import ServerSpec, free_port, launched
from sglang_cpp.files import read_events
from sglang_cpp.machine import provenance_lines

ENV = {"SGLANG_CPP_POLICY": "off", "MOONCAKE_PROTOCOL": "tcp", "MC_TCP_ENABLE_CONNECTION_POOL": "true",
       "OMP_NUM_THREADS": "1"}
CONFIGS = (("upstream", {}), ("fast ring", {"SGLANG_CPP_PD_FAST_RING": "1"}),
           ("early KV", {"SGLANG_CPP_PD_EARLY_KV": "1"}))


def dispatch(prefill: str, boot: int, decode: str, ids: list, room: int, max_new: int = 4) -> dict:
    """One request to both servers with one bootstrap room (what sglang-router does); the decode leg
    streamed, so the first token's arrival is timed."""
    extra = {"bootstrap_host": "127.0.0.1", "bootstrap_port": boot, "bootstrap_room": room}
    out: dict = {"room": room, "len": len(ids), "t0": time.time()}
    t = threading.Thread(target=lambda: out.setdefault("prefill", generate(
        prefill, input_ids=ids, max_new_tokens=max_new, stream=False, timeout=1800, extra=extra)))
    t.start()
    res = generate(decode, input_ids=ids, max_new_tokens=max_new, timeout=1800, extra=extra,
                   on_first=lambda: out.setdefault("t_first", time.time()))
    out.update(rid=res.meta.get("id"), t_end=time.time())
    t.join()
    return out


def lags(logs: list, reqs: list) -> list[dict]:
    """Per request and stage: the loop indices of its last-chunk forward, final KV send, transfer done and
    release (from the stage's decision log)."""
    rows = []
    by_rank = {k: read_events([p]) for k, p in enumerate(logs)}
    for q in reqs:
        for k, ev in by_rank.items():
            fw = [e for e in ev if e["event"] == "forward" and "it" in e and len(e["rids"]) >= 1
                  and any(p + c >= q["len"] and r == q["prefill_rid"] for r, p, c in zip(e["rids"], e["prefix"], e["chunk"]))]
            send = [e for e in ev if e["event"] == "kv_chunk" and e["room"] == q["room"] and e["last"]]
            early = [e for e in ev if e["event"] == "kv_early" and e["room"] == q["room"]]
            done = [e for e in ev if e["event"] == "kv_status" and e["room"] == q["room"] and e["status"] == 4]
            rel = [e for e in ev if e["event"] == "release" and q["room"] in e["rooms"]]
            if not (fw and send and done and rel):
                continue
            rows.append({"room": q["room"], "stage": k, "kind": q["kind"], "forward": fw[-1]["it"],
                         "send": send[-1]["it"], "done": done[0]["it"], "release": rel[0]["it"],
                         "early": early[-1]["it"] if early else None,
                         "t_forward": fw[-1]["t"], "t_done": done[0]["t"], "t_release": rel[0]["t"],
                         "ttft": q["t_first"] - q["t0"]})
    return rows


def prefill_rids(logs: list, reqs: list) -> None:
    """The prefill server's rid of each request: the one whose forwards ran its whole length and whose
    kv_chunk events carry its room."""
    ev = read_events([logs[0]], "kv_chunk")
    room_rid = {e["room"]: e["rid"] for e in ev}
    for q in reqs:
        q["prefill_rid"] = room_rid.get(q["room"])


def one_start(args, name: str, switches: dict, decode_url: str, tmp: Path, seed: int) -> tuple[list, dict]:
    boot = free_port()
    tag = name.replace(" ", "_")
    logs = [str(tmp / f"{tag}-{seed}-prefill_{k}.jsonl") for k in range(args.pp_size)]
    env = dict(ENV, **switches, SGLANG_CPP_DECISION_LOG=str(tmp / f"{tag}-{seed}-prefill_{{rank}}.jsonl"))
    spec = ServerSpec(args.model_path, pp_size=args.pp_size, chunk_size=args.chunked_prefill_size, env=env,
                      cores=args.cores, extra_args=("--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port",
                                                    str(boot), "--disaggregation-transfer-backend", "mooncake",
                                                    "--max-total-tokens", str(args.max_total_tokens)))
    t0 = time.time()
    with launched(spec, 1800, str(tmp)) as pre:
        start_s = time.time() - t0
        rng = random.Random(seed)
        dispatch(pre.base_url, boot, decode_url, random_ids(256, seed=seed), rng.randint(1, 2**62))
        reqs = []
        for i in range(args.long):
            q = dispatch(pre.base_url, boot, decode_url, random_ids(args.long_len, seed=seed * 100 + i),
                         rng.randint(1, 2**62))
            reqs.append(dict(q, kind="long"))
        out: list = []
        threads = [threading.Thread(target=lambda i=i: out.append(dispatch(
            pre.base_url, boot, decode_url, random_ids(args.stream_len, seed=seed * 1000 + i), rng.randint(1, 2**62))))
            for i in range(args.stream)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        reqs += [dict(q, kind="stream") for q in out]
        time.sleep(2)  # the decision logs' last lines (release) are flushed on the next idle pass
        cost = {"start_s": start_s, "log": pre.log()}
    prefill_rids(logs, reqs)
    return lags(logs, reqs), cost


def spread(vals: list) -> str:
    if not vals:
        return "n/a"
    return f"{statistics.median(vals):g} ({min(vals):g}-{max(vals):g})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", default=os.path.expanduser("~/.cache/sglang-cpp/models/tiny-llama"))
    ap.add_argument("--pp-size", type=int, default=4)
    ap.add_argument("--cores", default="0|1|0|1")
    ap.add_argument("--chunked-prefill-size", type=int, default=512)
    ap.add_argument("--max-total-tokens", type=int, default=32768)
    ap.add_argument("--long", type=int, default=3, help="long requests per start, one at a time")
    ap.add_argument("--long-len", type=int, default=8192)
    ap.add_argument("--stream", type=int, default=16, help="requests sent together after the long ones")
    ap.add_argument("--stream-len", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--results", default="results/pd_ring.md")
    args = ap.parse_args()
    cmd = "python benchmarks/pd_ring.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    tmp = Path(tempfile.mkdtemp(prefix="sglang-cpp-pdring-"))
    dspec = ServerSpec(args.model_path, pp_size=1, chunk_size=args.chunked_prefill_size, env=dict(ENV), cores="1",
                       extra_args=("--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "mooncake",
                                   "--disaggregation-decode-retraction-backup", "cpu_tensor",
                                   "--max-total-tokens", str(args.max_total_tokens)))
    rows: dict = {name: [] for name, _ in CONFIGS}
    starts: dict = {name: [] for name, _ in CONFIGS}
    t_all = time.time()
    with launched(dspec, 1800, str(tmp)) as dec:
        for r in range(args.rounds):
            for name, switches in CONFIGS:  # interleaved: A, B, C, A, B, C
                print(f"round {r + 1}: {name}", flush=True)
                got, cost = one_start(args, name, switches, dec.base_url, tmp, seed=r + 1)
                rows[name] += got
                starts[name].append(cost["start_s"])
                mode = "fast" if "PD prefill release: fast" in cost["log"] else "upstream"
                print(f"  {len(got)} request-stage rows; release mode logged: {mode}; start {cost['start_s']:.0f} s",
                      flush=True)
    minutes = (time.time() - t_all) / 60
    head = ["| config | kind | stage | early KV send - last forward (it) | final KV send - last forward (it) | "
            "transfer done - last forward (it) | transfer done - last forward (ms) | release - transfer done (it) | "
            "release - last forward (it) | TTFT at decode (s) | rows |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    body = []
    for name, _ in CONFIGS:
        for kind in ("long", "stream"):
            for k in range(args.pp_size):
                sel = [x for x in rows[name] if x["stage"] == k and x["kind"] == kind]
                early = [x["early"] - x["forward"] for x in sel if x["early"] is not None]
                body.append(f"| {name} | {kind} | PP{k} | {spread(early) if early else '-'} | "
                            f"{spread([x['send'] - x['forward'] for x in sel])} | "
                            f"{spread([x['done'] - x['forward'] for x in sel])} | "
                            f"{spread([round(1e3 * (x['t_done'] - x['t_forward'])) for x in sel])} | "
                            f"{spread([x['release'] - x['done'] for x in sel])} | "
                            f"{spread([x['release'] - x['forward'] for x in sel])} | "
                            f"{spread([round(x['ttft'], 2) for x in sel])} | {len(sel)} |")
    text = "\n".join([
        "# The PD release ring and the final KV send, in prefill loop iterations (issue 31)", "",
        *provenance_lines(cmd.strip()),
        f"- set-up: prefill PP{args.pp_size} ({Path(args.model_path).name}, cores {args.cores}, --chunked-prefill-size "
        f"{args.chunked_prefill_size}, --max-total-tokens {args.max_total_tokens}), decode PP1 (core 1), Mooncake TCP, "
        f"policy off; {args.rounds} interleaved round(s) of {', '.join(n for n, _ in CONFIGS)}; per start a 256-token "
        f"warm-up, {args.long} request(s) of {args.long_len} tokens one at a time, then {args.stream} of "
        f"{args.stream_len} sent together; {minutes:.0f} min",
        "- prefill server start (launch to healthy, s): " + "; ".join(
            f"{n}: {', '.join(f'{v:.0f}' for v in starts[n])}" for n, _ in CONFIGS),
        "", "Loop indices are each stage's own (`it`, one pass of SGLang's PP loop). Cells: median (min-max) over "
        "the requests of every round.", "", *head, *body, ""])
    Path(args.results).write_text(text)
    (Path(args.results).with_suffix(".jsonl")).write_text("".join(json.dumps({"config": n, **x}) + "\n"
                                                                   for n in rows for x in rows[n]))
    print(text + f"\nwrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
