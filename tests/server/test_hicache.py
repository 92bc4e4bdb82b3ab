"""HiCache (--enable-hierarchical-cache, L2 host pool) on the real PP=2 server with the sglang-cpp plugin.

On CPU the host pool's KV copies come from plugin/compat/kvcacheio_cpu.py (SGLang 0.5.23 binds them only on
CUDA/HIP/XPU). A device KV pool of 8192 tokens holds one ~6K-token document, so a second document
evicts the first from the device; the first's KV then lives only on the host tier. The document plus
a new question must come back as a host hit, computed only past the cached length, with the same
decisions on both stages and the greedy tokens of PP=1 without HiCache, under each chunk policy.

The plan server also writes through to HiCache's L3 file backend (`--hicache-storage-backend file`):
after two more documents push the first out of the host tier too, the first document comes back from
the files, again computed only past the cached length with the same decisions on both stages.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sglang_cpp.bench.server import ServerSpec

from sglang_cpp.bench.client import random_ids

from conftest import ASK, ASK2, DEVICE, DOC, HICACHE_ARGS, HICACHE_PROMPTS, read_events, serve_hicache

# L3: two more 6K documents fill the host tier (2x the device pool), then the first document again
L3_PROMPTS = (random_ids(6000, seed=65) + ASK, random_ids(6000, seed=66) + ASK, DOC + random_ids(40, seed=67))
L3_ARGS = ("--hicache-storage-backend", "file", "--hicache-storage-prefetch-policy", "wait_complete")

pytestmark = pytest.mark.server


PROFILE = {"format": "sglang-cpp-profile", "samples": [], "coeffs": {"c0": 20.0, "b": 0.05, "e": 2e-5, "f": 1e-5}}
CAP = 1024  # the profile's measured_chunk (a served profile's cap): below the plan's first chunk for 6K tokens


def _profile(path) -> str:
    """A plan cost model in a file (no start-up calibration in the test), as a served profile: its server measured
    no chunk above CAP, so plans cut none (issue 57 item 2)."""
    path.write_text(json.dumps({**PROFILE, "meta": {"measured_chunk": CAP}}))
    return str(path)


@pytest.fixture(scope="module")
def reference(tiny) -> list[list[int]]:
    """PP=1, no HiCache, the same requests (the three, then the L3 ones)."""
    out = serve_hicache(ServerSpec(tiny, pp_size=1, chunk_size=2048, cores="0"), more=L3_PROMPTS)
    return [r.output_ids for r in out["hicache"] + out["more"]]


@pytest.fixture(scope="module")
def plan_run(tiny, tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("hicache_plan")
    env = {"SGLANG_CPP_POLICY": "plan", "SGLANG_CPP_PROFILE": _profile(d / "profile.json"),
           "SGLANG_CPP_DECISION_LOG": str(d / "dec_{rank}.jsonl"), "SGLANG_CPP_ONLINE": "0",
           "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": str(d / "l3")}
    spec = ServerSpec(tiny, pp_size=2, chunk_size=2048, dynamic=True, env=env, device=DEVICE,
                      extra_args=HICACHE_ARGS + L3_ARGS)
    return dict(serve_hicache(spec, more=L3_PROMPTS), dir=d)


def _extends(path, rid: str) -> list[tuple[int, int]]:
    """(prefix, chunk) of every forward that extended request `rid`."""
    return [(L, x) for e in read_events(path, "forward") for r, L, x in zip(e["rids"], e["prefix"], e["chunk"])
            if r == rid]


@pytest.mark.parametrize("policy", ["plan", "quadratic", "off"])
def test_host_tier_hit_is_served_from_the_cached_length_on_both_stages(request, reference, policy):
    """quadratic and off: conftest's quadratic_run and off_run, the servers of test_server_e2e's upstream
    checks (both with HiCache on), which send one more unrelated prompt after these three."""
    run = request.getfixturevalue(f"{policy}_run")
    res, logs = run["hicache"], [run["dir"] / f"dec_{r}.jsonl" for r in (0, 1)]
    hit = res[2].meta.get("cached_tokens_details") or {}
    cached = res[2].meta["cached_tokens"]
    assert ASK[0] != ASK2[0] and cached == len(DOC), res[2].meta  # the whole document was a hit ...
    assert hit.get("host", 0) >= 1024 and hit["device"] + hit["host"] == cached, hit  # ... its evicted part from the host
    loads = [[(e["rid"], e["device_prefix"], e["host_hit"]) for e in read_events(p, "host_hit")] for p in logs]
    assert loads[0] and loads[0] == loads[1]  # the load back, seen by both stages' admission
    rid = res[2].meta["id"]
    assert [sum(h) for r, *h in loads[0] if r == rid] == [cached]
    runs = [_extends(p, rid) for p in logs]
    assert runs[0] == runs[1], "PP stages ran different chunks"
    assert runs[0][0][0] == cached and sum(x for _, x in runs[0]) == len(HICACHE_PROMPTS[2]) - cached  # only the suffix
    # issue 45 item 10: the forward that waited for the load back is marked, so online refinement leaves it out
    loaded = [[(e["rids"][0], e["prefix"][0]) for e in read_events(p, "forward") if e.get("host_loaded")] for p in logs]
    assert loaded[0] == loaded[1] and (rid, cached) in loaded[0]
    assert {r for r, _ in loaded[0]} <= {r for r, *_ in loads[0]}
    if policy == "plan":
        plans = [[(e["prefix"], e["chunk"]) for e in read_events(p, "decision") if e["rid"] == rid] for p in logs]
        assert plans[0] and plans[0][0][0] == cached  # the plan starts at the cached length
        assert plans[0] == plans[1] and plans[0] == runs[0]  # and ran as planned on both stages
    assert [r.output_ids for r in res] == reference[:3]
    # and the outputs follow the document's KV: the same question after another document (HICACHE_PROMPTS[1])
    # gets other tokens, so a host-tier load of wrong or stale KV would not give the reference's
    assert reference[0] != reference[1]


def test_a_profiles_measured_chunk_caps_the_served_plans_as_plan_profile_does(plan_run, tmp_path):
    """Issue 57 item 2: the server honours a profile's `measured_chunk` as `sglang-cpp plan --profile` does. The
    same model without the cap plans a first chunk above it for these prompts; the server cut none above it."""
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(PROFILE))
    cli = subprocess.run([sys.executable, "-m", "sglang_cpp.cli", "plan", "--profile", str(bare), "--input-len",
                          str(len(HICACHE_PROMPTS[0])), "--pp-size", "2", "--chunked-prefill-size", "2048", "--json"],
                         capture_output=True, text=True, check=True)
    assert max(json.loads(cli.stdout)["chunks"]) > CAP
    logs = [plan_run["dir"] / f"dec_{r}.jsonl" for r in (0, 1)]
    for p in logs:
        assert read_events(p, "startup")[0]["config"]["measured_chunk"] == CAP
    chunks = [[e["chunk"] for e in read_events(p, "decision")] for p in logs]
    assert chunks[0] and chunks[0] == chunks[1] and max(chunks[0]) <= CAP
    assert f"plans cut no chunk above {CAP} tokens, the profile's measured_chunk" in plan_run["log"]


def test_l3_file_backend_hit_is_served_from_the_cached_length_on_both_stages(plan_run, reference):
    """The first document, evicted from the device and the host tier, is prefetched from the L3 files
    (plugin: the CPU host pool is unpinned, and PP stages no longer race to create the directory)."""
    res, logs = plan_run["more"], [plan_run["dir"] / f"dec_{r}.jsonl" for r in (0, 1)]
    hit = res[2].meta.get("cached_tokens_details") or {}
    cached = res[2].meta["cached_tokens"]
    assert hit.get("storage_backend") == "HiCacheFile" and hit.get("storage", 0) >= 1024, hit  # from the files
    assert cached == len(DOC) and hit["device"] + hit["host"] + hit["storage"] == cached, res[2].meta
    # pages written by both stages, each its own layers (file names end in _<pp_size>_<pp_rank>.bin)
    # (only finished pages: the backups keep writing while the test reads the directory)
    pages = [p.name for p in (plan_run["dir"] / "l3").iterdir() if p.name.endswith(".bin")]
    assert {n.rsplit("_", 1)[-1] for n in pages} == {"0.bin", "1.bin"}
    assert "Scheduler hit an exception" not in plan_run["log"]
    rid = res[2].meta["id"]
    runs = [_extends(p, rid) for p in logs]
    assert runs[0] == runs[1] and runs[0][0][0] == cached  # the same chunks on both stages, the suffix only
    assert sum(x for _, x in runs[0]) == len(L3_PROMPTS[2]) - cached
    plans = [[(e["prefix"], e["chunk"]) for e in read_events(p, "decision") if e["rid"] == rid] for p in logs]
    assert plans[0] and plans[0] == plans[1] == runs[0]  # planned from the cached length, run as planned
    assert [r.output_ids for r in res] == reference[3:]
    assert reference[3] != reference[4]  # the same question after two other documents: the KV decides the tokens


def test_online_refinement_off_keeps_the_startup_model(plan_run):
    """SGLANG_CPP_ONLINE=0 on this server (its profile is no measurement of the tiny model, so online
    refinement would refit it, as tests/server/test_server_e2e.py shows): no refit on any stage, no online line."""
    logs = [plan_run["dir"] / f"dec_{r}.jsonl" for r in (0, 1)]
    assert all(read_events(p, "forward") for p in logs)  # it served forwards enough to refit ...
    assert not any(read_events(p, "refit") for p in logs)  # ... and refitted none
    assert "[sglang-cpp] online" not in plan_run["log"] and "drift from the cost model" not in plan_run["log"]
