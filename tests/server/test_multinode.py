"""Two `launch_server` processes as two nodes (--nnodes 2), one PP stage each, each with its own cache
directory: world rank 0 decides where the cost model comes from and every rank follows, so a second
start where only node 0 has a cache does not hang, and a setting made on one node only fails fast."""
from __future__ import annotations

import contextlib
import time

import pytest

from sglang_cpp.bench.client import ServerError, generate, random_ids, wait_healthy
from sglang_cpp.bench.server import ServerSpec, free_port, start

from conftest import SMALL_POOL, chunks_of, read_events

pytestmark = pytest.mark.server
PROMPT = 1500


def _spec(model, rank, port, cache, logdir, env):
    return ServerSpec(model, pp_size=2, chunk_size=256, dynamic=True, cores=str(rank),
                      env={"SGLANG_CPP_POLICY": "plan", "SGLANG_CPP_CACHE_DIR": str(cache),
                           "SGLANG_CPP_DECISION_LOG": str(logdir / "dec_{rank}.jsonl"),
                           "SGLANG_CPP_CALIB_MAX_LEN": "1024", "SGLANG_CPP_MAX_CHUNK": "512", **env},
                      extra_args=("--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", f"127.0.0.1:{port}",
                                  *SMALL_POOL))


@contextlib.contextmanager
def two_nodes(model, caches, logdir, env1=None):
    port = free_port()
    nodes = [start(_spec(model, r, port, caches[r], logdir, (env1 or {}) if r == 1 else {}), str(logdir))
             for r in (0, 1)]
    try:
        yield nodes
    finally:
        for n in nodes:
            n.stop()


def _serve_one(model, caches, logdir, seed):
    with two_nodes(model, caches, logdir) as (n0, n1):
        try:
            wait_healthy(n0.base_url, 300, n0.proc)
        except ServerError as exc:
            raise AssertionError(f"{exc}\n--- node 0 ---\n{n0.log()[-3000:]}\n--- node 1 ---\n{n1.log()[-3000:]}")
        generate(n0.base_url, input_ids=random_ids(PROMPT, seed), max_new_tokens=1)
        return n0.log(), n1.log()


def _decided(logdir):
    """Per stage: every decision (rid, prefix, chunk), and the PROMPT-token request's chunks."""
    out = []
    for r in (0, 1):
        ev = read_events(logdir / f"dec_{r}.jsonl", "decision")
        out.append({"all": [(d["rid"], d["prefix"], d["chunk"]) for d in ev],
                    "long": [(d["rid"], d["prefix"], d["chunk"]) for d in ev if d["prompt_len"] == PROMPT]})
    return out


@pytest.fixture(scope="module")
def starts(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("nodes")
    caches = [root / "cache-node0", root / "cache-node1"]
    out = []
    for i in range(2):
        logdir = root / f"start{i}"
        logdir.mkdir()
        logs = _serve_one(tiny, caches, logdir, seed=i)
        out.append({"dir": logdir, "logs": logs, "decided": _decided(logdir),
                    "node0_cache": sorted((caches[0] / "calibration").glob("*.json")),
                    "node1_cache": sorted((caches[1] / "calibration").glob("*.json"))})
    return {"root": root, "caches": caches, "starts": out}


def test_first_start_calibrates_together_and_only_rank0_saves(starts):
    s = starts["starts"][0]
    assert len(s["node0_cache"]) == 1 and s["node1_cache"] == []
    assert "calibrating t(L, x) on every stage" in s["logs"][1]  # node 1 measured its own stage


def test_second_start_with_only_node0_cached_does_not_hang(starts):
    s = starts["starts"][1]
    assert starts["starts"][1]["node1_cache"] == []  # node 1 still has no cache of its own ...
    assert "from calibration cache" in s["logs"][1] and "on world rank 0" in s["logs"][1]  # ... and used rank 0's
    assert "calibrating t(L, x)" not in s["logs"][0] + s["logs"][1]


@pytest.mark.parametrize("start", [0, 1])
def test_both_stages_decide_and_run_the_same_chunks(starts, start):
    s = starts["starts"][start]
    st0, st1 = s["decided"]
    assert st0["all"] == st1["all"], (st0["all"], st1["all"])
    d0 = st0["long"]
    assert len(d0) >= 2 and sum(c for _, _, c in d0) == PROMPT, d0
    for r in (0, 1):
        ran = chunks_of(s["dir"] / f"dec_{r}.jsonl")
        rid = d0[0][0]
        assert ran[rid] == [(p, c) for _, p, c in d0]


def test_setting_on_one_node_only_fails_fast_naming_it(starts, tiny):
    logdir = starts["root"] / "start-mismatch"
    logdir.mkdir()
    with two_nodes(tiny, starts["caches"], logdir, env1={"SGLANG_CPP_CHUNK_OVERHEAD_MS": "5"}) as (n0, n1):
        deadline = time.time() + 300
        while time.time() < deadline and (n0.proc.poll() is None or n1.proc.poll() is None):
            time.sleep(1)
        logs = n0.log() + n1.log()
        assert n0.proc.poll() is not None and n1.proc.poll() is not None, "a node kept running: " + logs[-3000:]
    assert "SGLANG_CPP_CHUNK_OVERHEAD_MS differs between ranks: world rank 0 has '', world rank 1 has '5'" in logs
