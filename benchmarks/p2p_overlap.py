"""PP receive microbenchmark: how much P2P time a stage hides with batched / early-posted receives.

Two gloo processes shaped like two PP stages (torch.multiprocessing spawn, OMP_NUM_THREADS=1 each).
Stage 0, per chunk: commit its previous async sends (upstream `_pp_commit_proxy_send_work`), compute
(a fixed matmul loop calibrated to ~--compute-ms), then send a proxy dict like SGLang's
(hidden_states and residual [x, hidden] bf16 + "__msg_type__") with upstream's wire protocol
(async: int64 metadata size, pickled metadata, then each tensor; SGLang's own
GroupCoordinator.send_tensor_dict on a stand-in, sglang_cpp.plugin.serving.p2p.upstream_coordinator).
Stage 1, per chunk: receive, then compute the same loop. Receive modes on stage 1:
  serial       upstream: metadata, then irecv().wait() per tensor (GroupCoordinator.recv_tensor_dict)
  batched      metadata, then all irecvs posted, then all waited (p2p.post_tensor_dict_recvs; what
               SGLANG_CPP_ASYNC_RECV=1 does, before its deferral of proxy waits to the forward)
  posted-early the next chunk's size/metadata/tensor irecvs are posted BEFORE stage 1 computes the
               current chunk and waited after (the layout is known here; not exactly possible in SGLang,
               see sglang_cpp/plugin/serving/p2p.py; the simulator's recv_mode="batched" idealisation)
Reported per mode (median over --reps, modes interleaved): stage 1's total time for --chunks chunks
(after one untimed pipeline-fill chunk), its time blocked in
receive, and hidden comm = serial blocked - mode blocked, each also as a ratio vs serial.
Gloo P2P is a rendezvous (a send leaves once the receive is posted), which is why posting matters.

Usage: OMP_NUM_THREADS=1 python benchmarks/p2p_overlap.py [--chunks 4] [--compute-ms 20] [--reps 5]
Writes results/p2p_overlap.md.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pickle
import platform
import shlex
import socket
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from sglang_cpp.machine import cpu_model  # noqa: E402
from sglang_cpp.plugin.serving import p2p  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODES = ("serial", "batched", "posted-early")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Compute:
    """A fixed amount of matmul work, calibrated once per process to about `ms` milliseconds."""

    def __init__(self, ms: float, n: int = 128):
        self.a = torch.randn(n, n)
        self.b = torch.randn(n, n)
        per = float("inf")
        for _ in range(12):  # best of short batches: the unloaded speed (the machine may be shared)
            t = time.perf_counter()
            for _ in range(5):
                self.a @ self.b
            per = min(per, (time.perf_counter() - t) / 5)
        self.iters = max(1, round(ms / 1e3 / per))

    def __call__(self, x: torch.Tensor | None = None) -> float:
        c = self.a
        for _ in range(self.iters):
            c = self.a @ self.b
        return float(c[0, 0]) + (0.0 if x is None else float(x.reshape(-1)[0]))


def _proxy(x: int, hidden: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"hidden_states": torch.randn(x, hidden, generator=g).to(torch.bfloat16),
            "residual": torch.randn(x, hidden, generator=g).to(torch.bfloat16),
            "__msg_type__": "proxy"}


def _layout(x: int, hidden: int) -> tuple[list, int]:
    """Metadata list of a proxy dict of this shape and its pickled length (known to stage 1 only here)."""
    from sglang.srt.distributed.parallel_state import _split_tensor_dict

    meta, _ = _split_tensor_dict({"hidden_states": torch.empty(x, hidden, dtype=torch.bfloat16),
                                  "residual": torch.empty(x, hidden, dtype=torch.bfloat16),
                                  "__msg_type__": "proxy"})
    return meta, len(pickle.dumps(meta))


def _post_early(meta: list, nbytes: int, grp) -> tuple[list, torch.Tensor, torch.Tensor, dict]:
    size = torch.empty(1, dtype=torch.long)
    payload = torch.empty(nbytes, dtype=torch.uint8)
    works = [dist.irecv(size, 0, group=grp), dist.irecv(payload, 0, group=grp)]
    posted = p2p.post_tensor_dict_recvs(meta, 0, grp, grp)
    return works, size, payload, posted


def _finish_early(early, meta: list) -> dict:
    works, size, payload, posted = early
    for w in works:
        w.wait()
    assert int(size.item()) == payload.numel() and pickle.loads(payload.numpy()) == meta
    return posted.finish()


def _stage0(grp, msgs, chunks, compute) -> None:
    gc, works = p2p.upstream_coordinator(grp, 0), []
    for i in range(chunks):
        for w in works:
            w.work.wait()
        works = []
        compute()
        works = gc.send_tensor_dict(msgs[i % 2], dst=1, async_send=True)  # upstream's send
    for w in works:
        w.work.wait()


def _stage1(grp, shape, chunks, compute, mode) -> tuple[float, float]:
    """Receive+compute chunks+1 chunks; time the last `chunks` (chunk 0 only fills the pipeline)."""
    meta, nbytes = _layout(*shape)
    gc, blocked = p2p.upstream_coordinator(grp, 1), 0.0
    early = _post_early(meta, nbytes, grp) if mode == "posted-early" else None
    chunks += 1
    for i in range(chunks):
        if i == 1:
            t_start, blocked = time.perf_counter(), 0.0
        t = time.perf_counter()
        if mode == "serial":
            d = gc.recv_tensor_dict(src=0)  # upstream's receive
        elif mode == "batched":
            d = p2p.post_tensor_dict_recvs(gc.recv_object(0), 0, grp, grp).finish()
        else:
            d = _finish_early(early, meta)
            early = _post_early(meta, nbytes, grp) if i + 1 < chunks else None
        blocked += time.perf_counter() - t
        compute(d["hidden_states"])
    return time.perf_counter() - t_start, blocked


def _worker(rank: int, port: int, args: dict, out_path: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=120))
    grp = dist.group.WORLD
    compute = Compute(args["compute_ms"])
    results = []
    try:
        for shape in args["shapes"]:
            msgs = [_proxy(*shape, seed=i) for i in range(2)] if rank == 0 else None  # built off the clock
            for rep in range(-1, args["reps"]):  # rep -1: warm-up, not recorded
                for mode in MODES:
                    chunks = 1 if rep < 0 else args["chunks"]
                    dist.barrier()
                    if rank == 0:
                        _stage0(grp, msgs, chunks + 1, compute)
                    else:
                        total, blocked = _stage1(grp, shape, chunks, compute, mode)
                        if rep >= 0:
                            results.append({"x": shape[0], "hidden": shape[1], "mode": mode, "rep": rep,
                                            "total_s": total, "blocked_s": blocked})
        dist.barrier()
        if rank == 1:
            t = time.perf_counter()
            compute()
            Path(out_path).write_text(json.dumps({"results": results, "compute_iters": compute.iters,
                                                  "compute_ms_measured": (time.perf_counter() - t) * 1e3}))
    finally:
        dist.destroy_process_group()


def _table(results: list, chunks: int) -> list[str]:
    rows = ["| x | hidden | MiB/msg | mode | total ms | total vs serial | blocked ms | blocked vs serial "
            "| hidden comm ms | hidden / serial blocked |",
            "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    shapes = sorted({(r["x"], r["hidden"]) for r in results}, key=lambda s: s[0] * s[1])
    for x, h in shapes:
        med = {m: {k: statistics.median(r[k] for r in results if (r["x"], r["hidden"], r["mode"]) == (x, h, m))
                   for k in ("total_s", "blocked_s")} for m in MODES}
        s_tot, s_blk = med["serial"]["total_s"], med["serial"]["blocked_s"]
        mib = 2 * x * h * 2 / 2**20
        for m in MODES:
            tot, blk = med[m]["total_s"], med[m]["blocked_s"]
            rows.append(f"| {x} | {h} | {mib:.1f} | {m} | {tot * 1e3:.1f} | {tot / s_tot:.3f} | {blk * 1e3:.1f} "
                        f"| {blk / s_blk:.3f} | {(s_blk - blk) * 1e3:.1f} | {(s_blk - blk) / s_blk:.3f} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, default=4,
                    help="timed chunks per run (after one pipeline-fill chunk that is not timed)")
    ap.add_argument("--compute-ms", type=float, default=20.0, help="per-chunk compute on each stage")
    ap.add_argument("--reps", type=int, default=5, help="timed runs per (shape, mode); the median is reported")
    ap.add_argument("--shapes", default="1024x576,4096x576,1024x4096,4096x4096", help="x*hidden list")
    ap.add_argument("--out", default=str(ROOT / "results" / "p2p_overlap.md"))
    a = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    args = {"chunks": a.chunks, "compute_ms": a.compute_ms, "reps": a.reps, "shapes": shapes}
    load = os.getloadavg()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out_json = os.path.join(tmp, "r.json")
        mp.spawn(_worker, args=(_free_port(), args, out_json), nprocs=2, join=True)
        data = json.loads(Path(out_json).read_text())
    wall = time.perf_counter() - t0
    rows = _table(data["results"], a.chunks)
    print("\n".join(rows))
    cmd = "OMP_NUM_THREADS=1 python " + " ".join(shlex.quote(v) for v in [os.path.relpath(__file__, ROOT)]
                                                   + sys.argv[1:])
    md = [
        "# PP receive overlap microbenchmark (gloo, 2 stages)",
        "",
        f"- date: {dt.datetime.now().isoformat(timespec='seconds')}",
        f"- machine: {cpu_model()}, {os.cpu_count()} logical CPUs, load average at start "
        f"{load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f} (shared machine: other jobs were running)",
        f"- torch {torch.__version__}, python {platform.python_version()}, gloo over 127.0.0.1",
        f"- command: `{cmd}` (wall {wall:.1f} s incl. process start)",
        f"- {a.chunks} timed chunks per run (after 1 untimed pipeline-fill chunk), compute ~{a.compute_ms:g} ms/chunk on each stage "
        f"(stage 1 measured {data['compute_ms_measured']:.1f} ms at the end), median of {a.reps} runs; "
        "stage 1 times. Message = hidden_states + residual, bf16.",
        "",
        "Modes: serial = upstream (metadata, then irecv().wait() per tensor); batched = all irecvs of a "
        "message posted after the metadata, then waited (SGLANG_CPP_ASYNC_RECV=1, without its deferral of "
        "the proxy wait to the forward); posted-early = the next message's irecvs (metadata included) posted "
        "before stage 1 computes the current chunk (needs the layout in advance: an upper bound, not "
        "implementable exactly in SGLang). blocked = stage 1 time inside receive; hidden comm = serial "
        "blocked - mode blocked.",
        "",
        *rows,
        "",
    ]
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text("\n".join(md))
    print(f"wrote {a.out} ({wall:.1f} s)")


if __name__ == "__main__":
    main()
