"""End-to-end on the real SGLang 0.5.23 server (CPU, torch_native) with the real SmolLM2-135M model.

Servers start on free loopback ports and are always torn down (sglang_cpp.bench.server.launched).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sglang_cpp import files
from sglang_cpp.bench.client import generate
from sglang_cpp.bench.server import ServerSpec, launch_fails, launched, reported_calibration
from sglang_cpp.cli import main as cli_main
from sglang_cpp.core.upstream import UpstreamPredictor

from conftest import (CHAT, LONG, MIXED_CHUNK, OFF_CHUNK, OFF_CTX, OFF_PROMPT, QUAD_ABC, QUAD_PROMPT, QUAD_SIGMA,
                      SMALL_POOL, chunks_of, mixed_prompts, read_events, run_cached_pair, sglang_reference_chunks,
                      switch_stream)

pytestmark = pytest.mark.server
TIMEOUT = 900


def _decisions(path):
    return [(d["rid"], d["prefix"], d["chunk"]) for d in read_events(path, "decision")]


@pytest.fixture(scope="module")
def plan_run(smollm2, tmp_path_factory):
    """PP=2, dynamic chunking, plan policy, startup calibration into a fresh cache dir."""
    d = tmp_path_factory.mktemp("plan")
    env = {"SGLANG_CPP_POLICY": "plan", "SGLANG_CPP_DECISION_LOG": str(d / "dec_{rank}.jsonl"),
           "SGLANG_CPP_CACHE_DIR": str(d / "cache"), "SGLANG_CPP_CALIB_MAX_LEN": "3072"}
    with launched(ServerSpec(smollm2, pp_size=2, chunk_size=1024, dynamic=True, env=env), TIMEOUT) as srv:
        chat = generate(srv.base_url, text=CHAT, max_new_tokens=16).text
        cached = run_cached_pair(srv.base_url, smollm2)  # its first request is the LONG-token prompt
        # `sglang-cpp profile --backend server` against this live PP=2 server (radix cache on)
        prof = d / "server_profile.json"
        rc = cli_main(["profile", "--backend", "server", "--base-url", srv.base_url, "--max-len", "2048",
                       "--chunks", "256,512", "--num-prefixes", "2", "--repeats", "1", "--warmup", "0",
                       "--quiet", "--out", str(prof)])
        # `bench ttft` records the chunks each request ran, from the server's meta_info
        ttft_rc = cli_main(["bench", "ttft", "--base-url", srv.base_url, "--input-lens", "2500", "--num-requests", "1",
                            "--warmup", "0", "--output-jsonl", str(d / "ttft.jsonl")])
        queued = _arrivals_mid_prompt(srv.base_url, d / "dec_0.jsonl")
        aborted = _abort_mid_prompt(srv.base_url, d / "dec_0.jsonl")
        stream = _stream_then_burst(srv.base_url, smollm2, d)
        log = srv.log()
    calib = sorted((d / "cache" / "calibration").glob("*.json"))
    return {"dir": d, "chat": chat, "log": log, "calib": calib, "cached": cached,
            "profile": (rc, prof), "ttft": (ttft_rc, d / "ttft.jsonl"), "queued": queued, "aborted": aborted,
            "stream": stream}


# bench_serving drops a custom-dataset prompt over 2048 tokens or with an output under 2 (its sharegpt filter)
STREAM = ("--num-prompts", "5", "--request-rate", "4", "--input-len", "1:1000-1800", "--output-len", "2-3",
          "--seed", "3")
BURST_LENS = (2000, 1800, 1600)


def _stream_then_burst(url: str, model: str, d) -> dict:
    """Issue 54 item 3: Poisson arrivals through `bench serve` (bench_serving's --request-rate), then a burst
    of BURST_LENS sent at once through our client, whose responses carry each prompt's plan meta."""
    from concurrent.futures import ThreadPoolExecutor

    from sglang_cpp.bench.client import random_ids

    rc = cli_main(["bench", "serve", "--base-url", url, "--model-path", model, *STREAM, "--label", "stream",
                   "--out-dir", str(d / "serve")])
    rec = json.loads((d / "serve" / "bench_serving-stream.jsonl").read_text().strip().splitlines()[-1])
    with ThreadPoolExecutor(len(BURST_LENS)) as pool:
        futs = [pool.submit(generate, url, input_ids=random_ids(n, 5200 + i), timeout=TIMEOUT)
                for i, n in enumerate(BURST_LENS)]
        burst = [f.result() for f in futs]
    return {"rc": rc, "rec": rec, "burst": burst}


QUEUE_LENS = (6000, 3000, 3000)  # a long prompt, then two multi-chunk ones sent once its first chunk is decided


def _arrivals_mid_prompt(url: str, log0) -> list:
    """Send a QUEUE_LENS[0]-token prompt, wait until stage 0 logged its first chunk's decision (decision
    lines are written at once), then send the other two: they reach the waiting queue while it is mid-prompt."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from sglang_cpp.bench.client import random_ids

    ids = [random_ids(n, 4400 + i) for i, n in enumerate(QUEUE_LENS)]
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(generate, url, input_ids=ids[0], timeout=TIMEOUT)
        deadline = time.monotonic() + TIMEOUT
        while not any(e.get("prompt_len") == QUEUE_LENS[0] for e in read_events(log0, "decision")):
            assert not first.done() and time.monotonic() < deadline, "the long prompt was never planned"
            time.sleep(0.02)
        rest = [pool.submit(generate, url, input_ids=x, timeout=TIMEOUT) for x in ids[1:]]
        return [f.result() for f in [first, *rest]]


def test_pp2_plan_greedy_output_equals_pp1(plan_run, pp1):
    """The chat prompt (one chunk), and the LONG-token document, which the plan cut into several chunks on
    both stages: its first token is computed over KV written chunk by chunk, so it differs if a chunk's KV
    or attention is wrong."""
    assert plan_run["chat"] == pp1["chat"]
    assert "Paris" in pp1["chat"]
    first = plan_run["cached"]["first"]
    chunks = [c for r, _, c in _decisions(plan_run["dir"] / "dec_0.jsonl") if r == first.meta["id"]]
    assert len(chunks) >= 2 and sum(chunks) >= LONG - 64  # several chunks (a few tokens may hit the radix cache)
    assert first.output_ids == pp1["cached"]["first"].output_ids


def test_calibration_saved_per_device(plan_run):
    assert len(plan_run["calib"]) == 1
    name = plan_run["calib"][0].name
    assert name.startswith("model=smollm2-135m,pp=2,tp=1,device_name=") and "dtype=float32" in name
    doc = json.loads(plan_run["calib"][0].read_text())
    assert {s["stage"] for s in doc["samples"]} == {0, 1} and len(doc["stages"]) == 2
    assert "[sglang-cpp] calibrated" in plan_run["log"]
    # the CPU flash kernel's query-block switches: sampled on both sides, one L*x coefficient per regime
    assert doc["meta"]["chunk_switches"] == [192, 768] and "widens its query block" in plan_run["log"]
    for st in (0, 1):
        xs = {s["x"] for s in doc["samples"] if s["stage"] == st and s["L"] > 0}
        assert {min(xs) < 192, any(192 <= x < 768 for x in xs), max(xs) >= 768} == {True}
        assert doc["stages"][st]["axis"] == "x" and doc["stages"][st]["bounds"] == [192, 768]
        es = [r["coeffs"]["e"] for r in doc["stages"][st]["regimes"]]
        assert len({tuple(sorted(set(r["coeffs"]) - {"e"})) for r in doc["stages"][st]["regimes"]}) == 1 and len(es) == 3


def test_long_prompt_follows_cli_plan_on_both_stages(plan_run):
    """The LONG-token document: both stages decide the same chunks, run them, and they equal `sglang-cpp plan`."""
    d = plan_run["dir"]
    first = plan_run["cached"]["first"]
    rid, cached = first.meta["id"], first.meta.get("cached_tokens", 0)  # the chat prompt may share a few tokens
    per_stage = []
    for rank in (0, 1):
        decided = [(p, c) for r, p, c in _decisions(d / f"dec_{rank}.jsonl") if r == rid]
        assert decided and decided[0][0] == cached and sum(c for _, c in decided) == LONG - cached
        executed = chunks_of(d / f"dec_{rank}.jsonl")[rid]
        assert executed == decided, f"stage {rank} ran {executed}, decided {decided}"
        per_stage.append(decided)
    assert per_stage[0] == per_stage[1], "PP stages made different chunk decisions"
    assert len(per_stage[0]) > 1  # LONG tokens at C=1024 is a multi-chunk plan
    # the cost model the server planned on (the calibration plus each stage's measured overhead), as it reports
    served = reported_calibration(plan_run["log"])
    assert "/served/" in served
    cli = subprocess.run([sys.executable, "-m", "sglang_cpp.cli", "plan", "--profile", str(served),
                          "--input-len", str(LONG), "--prefix-len", str(cached), "--pp-size", "2",
                          "--chunked-prefill-size", "1024", "--max-prefill-tokens", "16384", "--context-length", "8192",
                          "--json"], capture_output=True, text=True, check=True)
    plan = json.loads(cli.stdout)
    assert [c for _, c in per_stage[0]] == plan["chunks"]
    # the server reports what ran and what was decided in the response's meta_info (issue 29 part 3)
    (meta,) = first.meta["sglang_cpp_plan"]
    assert meta["ran"] == meta["chunks"] == plan["chunks"] and meta["ran_prefix"] == meta["prefix"] == cached
    decided_ms = [d_["predicted_ms"] for d_ in read_events(d / "dec_0.jsonl", "decision") if d_["rid"] == rid]
    assert meta["policy"] == "plan" and meta["predicted_ms"] == pytest.approx(sum(decided_ms), abs=1e-2)


def test_bench_ttft_records_the_chunks_the_server_ran(plan_run):
    rc, path = plan_run["ttft"]
    assert rc == 0
    (rec,) = [json.loads(line) for line in path.read_text().splitlines()]
    (plan,) = rec["chunk_plan"]
    ran = {rid: [c for _, c in v] for rid, v in chunks_of(plan_run["dir"] / "dec_0.jsonl").items()}
    assert sum(plan["ran"]) == 2500 and len(plan["ran"]) > 1
    assert plan["ran"] in ran.values() and plan["ran"] == plan["chunks"]


ABORT_RID, ABORT_LEN = "sglang-cpp-pp-abort", 6000


def _abort_mid_prompt(url: str, log0) -> dict:
    """A ABORT_LEN-token prompt aborted once stage 0 logged its first chunk's decision; then two idle passes
    (SGLang flushes only an idle scheduler, and its strict pool check at idle raises on a leaked KV slot),
    then the chat prompt."""
    import threading
    import time

    from sglang_cpp.bench.client import ServerError, _session, flush_cache, random_ids

    box: dict = {}

    def run():
        try:
            box["out"] = generate(url, input_ids=random_ids(ABORT_LEN, 4500), timeout=TIMEOUT, stream=False,
                                  extra={"rid": ABORT_RID})
        except ServerError as exc:
            box["error"] = str(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    deadline = time.monotonic() + TIMEOUT
    while not any(e.get("rid") == ABORT_RID for e in read_events(log0, "decision")):
        assert t.is_alive() and time.monotonic() < deadline, "the prompt to abort was never planned"
        time.sleep(0.02)
    _session().post(f"{url}/abort_request", json={"rid": ABORT_RID}, timeout=30)
    t.join(TIMEOUT)
    box["returned"] = not t.is_alive()
    for _ in range(2):  # fails the fixture (and every test on it) when the server never goes idle again
        while not flush_cache(url):
            assert time.monotonic() < deadline, "the server never went idle after the abort"
            time.sleep(0.1)
    box["after"] = generate(url, text=CHAT, max_new_tokens=16).text
    return box


def test_an_aborted_prompt_stops_on_both_stages_and_the_server_serves_on(plan_run, pp1):
    """Issue 44 item 5, plain PP (a parity check: SGLang's own PP loop stops an aborted chunked prefill at the
    top of the next batch formation, scheduler.py:3897; the plugin's hook serves the PD loops): a long prompt
    aborted after its first chunk's decision reaches the client as aborted, both stages ran the same chunks
    of it and stopped short of its end, every KV slot came back (the fixture's two idle passes, SGLang's
    strict pool check), and the next prompt's output equals PP=1's."""
    box = plan_run["aborted"]
    assert box["returned"] and ("out" in box or "error" in box), box  # it came back, not hung
    reason = box["out"].meta.get("finish_reason") or {} if "out" in box else {"type": "abort"}  # or an HTTP error
    assert reason.get("type") == "abort", box
    ran = [[(p, c) for r, p, c in _decisions(plan_run["dir"] / f"dec_{k}.jsonl") if r == ABORT_RID] for k in (0, 1)]
    assert ran[0] and ran[0] == ran[1]
    fw = [chunks_of(plan_run["dir"] / f"dec_{k}.jsonl").get(ABORT_RID, []) for k in (0, 1)]
    assert fw[0] == fw[1] and sum(c for _, c in fw[0]) < ABORT_LEN
    assert "memory leak" not in plan_run["log"]
    assert box["after"] == pp1["chat"]


def test_arrivals_replan_the_running_prompt_alike_on_both_stages(plan_run):
    """Issue 44: two prompts arrive while a long one is mid-prompt. At its next chunk boundary both stages
    replan its remaining chunks on the waiting queue (`queue_plan`, replan=True), identically, and run
    exactly those chunks; the next prompt is planned with the long one's last chunk still in flight and
    the third waiting behind it; every stage logs the same queue plans and decisions, nothing hangs."""
    d = plan_run["dir"]
    res = plan_run["queued"]
    rids = [r.meta["id"] for r in res]
    assert [r.meta["prompt_tokens"] for r in res] == list(QUEUE_LENS)
    plans = []
    for rank in (0, 1):
        ev = [{k: v for k, v in e.items() if k not in ("t", "pp_rank")}
              for e in read_events(d / f"dec_{rank}.jsonl", "queue_plan") if e["rid"] in rids]
        plans.append(ev)
    assert plans[0] == plans[1], "PP stages made different queue-aware plans"
    dec = [[x for x in _decisions(d / f"dec_{rank}.jsonl") if x[0] in rids] for rank in (0, 1)]
    assert dec[0] == dec[1] and len(dec[0]) >= 4
    replans = [e for e in plans[0] if e["rid"] == rids[0] and e["replan"]]
    assert replans, f"the long prompt was never replanned: {plans[0]}"
    last = replans[-1]
    assert 0 < last["prefix"] < QUEUE_LENS[0] and {tuple(w) for w in last["waiting"]} <= {(QUEUE_LENS[1], 0)}
    assert len(last["waiting"]) >= 1 and sum(last["chunks"]) == QUEUE_LENS[0] - last["prefix"]
    for rank in (0, 1):
        ran = chunks_of(d / f"dec_{rank}.jsonl")[rids[0]]
        assert [c for p, c in ran if p >= last["prefix"]] == last["chunks"]
    # the prompt that started next is planned with the long prompt's last chunks still in the pipe (the
    # other PP slot's batch) and the third prompt waiting behind it
    second = min(rids[1:], key=lambda r: next(i for i, x in enumerate(dec[0]) if x[0] == r))
    (p2,) = [e for e in plans[0] if e["rid"] == second and not e["replan"]]
    assert p2["inflight"] and p2["waiting"] == [[QUEUE_LENS[2], 0]] and sum(p2["chunks"]) == QUEUE_LENS[1] - p2["prefix"]
    for r in res:
        assert len(r.output_ids) == 1


def _load_fields(load: dict) -> dict:
    return {k: load[k] for k in ("n", "span_ms", "mean_len", "busy")}


def test_a_poisson_stream_is_planned_with_one_load_estimate_on_both_stages(plan_run):
    """Issue 54 item 3: PP0's leader stamps each pull that brought prompts, and every stage takes the stamps
    from the relayed requests (plugin/serving/arrivals.py). Through a Poisson stream from `bench serve` and a
    burst: both stages log the same arrivals, decisions and queue plans; replaying a stage's log through
    core/load.ArrivalClock (each arrival fed in, each decided chunk's predicted ms issued) gives the load every
    prompt's first decision logged, on both stages; each burst response's plan meta carries the load its plan
    was made with; and the burst's later prompts found prefill work ahead of them (their estimate counts
    them busy)."""
    from sglang_cpp.core.load import ArrivalClock

    d, st = plan_run["dir"], plan_run["stream"]
    assert st["rc"] == 0 and st["rec"]["completed"] == int(STREAM[1])
    logs = []
    for rank in (0, 1):
        lines = (json.loads(x) for x in (d / f"dec_{rank}.jsonl").read_text().splitlines() if x.strip())
        ev = [{k: v for k, v in e.items() if k not in ("t", "pp_rank")} for e in lines
              if e["event"] in ("arrival", "plan", "decision", "queue_plan")]
        logs.append(ev)
    assert logs[0] == logs[1], "PP stages saw different arrivals or made different decisions"
    arrivals = [e for e in logs[0] if e["event"] == "arrival"]
    # every prompt the fixture sent is an arrival, the stream's and the burst's among them
    assert len(arrivals) >= int(STREAM[1]) + len(BURST_LENS)
    assert sorted(a["prompt_len"] for a in arrivals[-len(BURST_LENS):]) == sorted(r.meta["prompt_tokens"]
                                                                                  for r in st["burst"])
    clock, issued, checked = ArrivalClock(), {}, 0
    for e in logs[0]:
        if e["event"] == "arrival":
            clock.arrive(e["t_ms"], e["prompt_len"], e["busy"])
        elif e["event"] == "decision":
            if e["rid"] not in issued and "load" in e:
                assert _load_fields(e["load"]) == clock.load().to_dict(), e
                checked += 1
            if issued.get(e["rid"]) != e["prefix"]:  # a retried admission of one chunk moves the clock once
                issued[e["rid"]] = e["prefix"]
                clock.issue(e["predicted_ms"])
    assert checked >= int(STREAM[1]) + len(BURST_LENS)
    last = {e["rid"]: e for e in logs[0] if e["event"] == "decision"}
    for r in st["burst"]:
        (plan,) = r.meta["sglang_cpp_plan"]
        assert plan["load"] == last[r.meta["id"]]["load"] and sum(plan["ran"]) == r.meta["prompt_tokens"]
    # issue 56 item 4: a plan is made at a prompt's admission and again only after an arrival, never per step:
    # the count each decision carries is the `plan` events' count, at most 1 + the arrivals during its prompt
    for rid, dec in last.items():
        mine = [i for i, e in enumerate(logs[0]) if e.get("rid") == rid]
        made = [e for e in logs[0] if e["event"] == "plan" and e["rid"] == rid]
        during = sum(e["event"] == "arrival" for e in logs[0][mine[0]:mine[-1]])
        assert dec["plans"] == len(made) and 1 <= len(made) <= 1 + during, (rid, made, during)
    later = sorted(st["burst"], key=lambda r: [e.get("rid") for e in logs[0]].index(r.meta["id"]))[1:]
    for r in later:
        load = r.meta["sglang_cpp_plan"][0]["load"]
        assert load["n"] >= 2 and load["busy"] >= 1, load


def test_the_console_gets_one_line_per_request_from_world_rank_0_only(plan_run):
    """Issue 57 item 7: both stages plan every request alike and both log it to their files; the console
    line for a request comes from world rank 0 (PP0), once, never from PP1."""
    import re

    lines = re.findall(r"\[sglang-cpp\] PP(\d+) request rid=(\S+) ", plan_run["log"])
    done = {e["rid"] for e in read_events(plan_run["dir"] / "dec_1.jsonl", "decision")
            if e["prefix"] + e["chunk"] >= e["prompt_len"]}  # every request PP1 ran to its last chunk
    assert len(done) >= 10
    assert {pp for pp, _ in lines} == {"0"}
    rids = [rid for _, rid in lines]
    assert len(rids) == len(set(rids)) and done <= set(rids)


def test_overhead_measured_in_the_pipeline_is_charged_alike_on_every_stage(plan_run):
    """Issue 25: the startup pipelined probe measures each stage's overhead beyond its forward (>= 0),
    world rank 0's figures reach both stages, and each stage's planning model is its calibrated model
    with that overhead added to c0 (a probe removed or not charged fails here)."""
    d = plan_run["dir"]
    over = [read_events(d / f"dec_{r}.jsonl", "overhead") for r in (0, 1)]
    assert len(over[0]) == len(over[1]) == 1 and over[0][0]["stages_ms"] == over[1][0]["stages_ms"]
    o, pt, rc = over[0][0]["stages_ms"], over[0][0]["per_token_ms"], over[0][0]["received_ms"]
    assert len(o) == 2 and all(v >= 0 for v in o) and over[0][0]["chunks"] == 8
    # issue 45 item 6: PP1's receive of the hidden states timed alone at two sizes gives it a term in x
    # (PP0 receives nothing); world rank 0's figures on both stages
    assert over[1][0]["per_token_ms"] == pt and pt[0] == 0 and pt[1] >= 0 and rc[0] == 0 and rc[1] >= 0
    small, big = over[0][0]["transfer_sizes"]
    assert small == over[0][0]["chunk"] and big >= 4 * small
    recv = over[0][0]["transfer_ms"]
    # >= 0: a receive is timed less the sender's 2 ms delay and clamped at 0 (issue 60: a receiver that leaves the
    # barrier late on a busy host can time 0)
    assert recv[0] == [] and [x for x, _ in recv[1]] == [small, big] and all(ms >= 0 for _, ms in recv[1])
    calib = json.loads(plan_run["calib"][0].read_text())["stages"]
    saved_doc = json.loads(open(reported_calibration(plan_run["log"])).read())
    saved = saved_doc["stages"]
    for st in (0, 1):  # each stage's measured overhead rides beside its forward model (the profile's carrier)
        assert saved_doc["chunk_overheads"][st]["ms"] == pytest.approx(o[st], abs=2e-3)
        assert saved_doc["chunk_overheads"][st]["received_ms"] == pytest.approx(rc[st], abs=2e-3)
        assert saved_doc["chunk_overheads"][st]["per_token_ms"] == pytest.approx(pt[st], rel=1e-5, abs=1e-12)
    for r in (0, 1):
        startup = read_events(d / f"dec_{r}.jsonl", "startup")[0]["cost"]
        served = startup["stages"]
        assert [_rows(m) for m in served] == [_rows(m) for m in saved]
        assert startup["chunk_overheads"] == saved_doc["chunk_overheads"]
        for st in (0, 1):  # every regime of the stage: the calibrated forward model, never folded
            assert len(_rows(served[st])) == len(_rows(calib[st])) >= 1
            for got, cal in zip(_rows(served[st]), _rows(calib[st])):
                assert got["c0"] == pytest.approx(cal["c0"], abs=2e-3)
                assert got["b"] == pytest.approx(cal["b"], rel=1e-5, abs=1e-12)
    assert "per-chunk overhead measured in the pipeline" in plan_run["log"]


def _rows(model: dict) -> list:
    """A stage model's coefficient rows, regime by regime (a CPU server's is piecewise in the chunk size)."""
    return [model["coeffs"]] if "coeffs" in model else [r for g in model["regimes"] for r in _rows(g)]


def test_plan_chunks_outside_the_calibrated_range_are_measured_before_serving(tiny, tmp_path):
    """Issue 25 (at 16K the plan's first chunk, 3x the largest sampled one, ran 1.13x its prediction): a
    calibration cached under SGLANG_CPP_MAX_CHUNK=128 sampled no chunk above 128 (prefixes computed, as
    serving computes them: SGLANG_CPP_CALIB_PREFIX=computed). A start without that cap, and with
    SGLANG_CPP_MIN_CHUNK=256 (issue 60: every non-final planned chunk then leaves the samples, whatever the host
    measured, so a coverage round is certain, not a consequence of the calibrated times), plans bigger chunks, so
    before serving both stages measure the planned chunks that leave the samples, at the prefixes where the plan
    runs them; the cache keeps them, and the chunks served lie among them."""
    from sglang_cpp.bench.client import random_ids

    cache = tmp_path / "cache"
    base = {"SGLANG_CPP_POLICY": "plan", "SGLANG_CPP_CACHE_DIR": str(cache), "SGLANG_CPP_CALIB_MAX_LEN": "2048",
            "SGLANG_CPP_ONLINE": "0", "SGLANG_CPP_CALIB_PREFIX": "computed"}
    args = ("--max-prefill-tokens", "1024")  # the prefill-buffer ceiling: max(C, this, 1.25 C) = 1280 tokens
    capped = {**base, "SGLANG_CPP_MAX_CHUNK": "128", "SGLANG_CPP_DECISION_LOG": str(tmp_path / "capped_{rank}.jsonl")}
    with launched(ServerSpec(tiny, pp_size=2, chunk_size=1024, dynamic=True, env=capped, extra_args=args), TIMEOUT):
        pass
    # issue 45 item 1: computed prefixes are walked in forwards no longer than the plan's largest chunk
    for r in (0, 1):
        (st,) = read_events(tmp_path / f"capped_{r}.jsonl", "startup_forwards")
        assert st["count"] > 0 and st["largest"] <= 128, st
    (calib,) = sorted((cache / "calibration").glob("*.json"))
    first = json.loads(calib.read_text())["samples"]
    assert max(s["x"] for s in first) <= 128
    env = {**base, "SGLANG_CPP_DECISION_LOG": str(tmp_path / "dec_{rank}.jsonl"), "SGLANG_CPP_MIN_CHUNK": "256"}
    # issue 57 item 2: a tuned file for this server's name, tuned under another layer partition, is not applied
    from sglang_cpp.files import device_file_name
    from sglang_cpp.plugin.startup.profiles import device_name

    tuned = cache / "tuned" / device_file_name(Path(str(tiny)).name, 2, 1, device_name("cpu"), "float32")
    tuned.parent.mkdir(parents=True)
    tuned.write_text(json.dumps({"format": "sglang-cpp-profile", "samples": [], "meta": {"layer_partition": "3,1"},
                                 "coeffs": {"c0": 2.0, "b": 0.02, "e": 1e-5, "f": 1e-6}}))
    with launched(ServerSpec(tiny, pp_size=2, chunk_size=1024, dynamic=True, env=env, extra_args=args), TIMEOUT) as srv:
        out = generate(srv.base_url, input_ids=random_ids(2000, seed=91), max_new_tokens=1)
        log = srv.log()
    assert (f"tuned config {tuned} was measured under other settings than this server's: layer_partition='3,1' "
            "there, '' here; not applied: this server's calibration is used instead") in log
    for r in (0, 1):  # coverage computed prefixes up to ~1900 tokens: walked under the 1280-token ceiling
        (st,) = read_events(tmp_path / f"dec_{r}.jsonl", "startup_forwards")
        assert st["ceiling"] == 1280 and 128 < st["largest"] <= 1280, st
    assert "cost model from calibration cache" in log and "outside the calibrated (L, x) range" in log
    rounds = [read_events(tmp_path / f"dec_{r}.jsonl", "coverage") for r in (0, 1)]
    assert rounds[0] and [e["measured"] for e in rounds[0]] == [e["measured"] for e in rounds[1]]
    measured = [tuple(s) for e in rounds[0] for s in e["measured"]]
    assert max(x for _, x in measured) > 128 and any(L > 0 for L, x in measured if x > 128)
    (kept,) = sorted((cache / "calibration").glob("*.json"))  # the same file, now with the measured shapes
    after = json.loads(kept.read_text())["samples"]
    for st in (0, 1):
        assert set(measured) <= {(s["L"], s["x"]) for s in after if s["stage"] == st}
    assert len(after) == len(first) + 2 * len(measured)
    # issue 45 item 12: by construction, whatever the last refit predicts, the served plans cut no chunk
    # bigger than the largest measured one (the cap every stage logs, world rank 0's samples' largest chunk)
    caps = [[e["chunk"] for e in read_events(tmp_path / f"dec_{r}.jsonl", "measured_chunk")] for r in (0, 1)]
    assert caps[0] == caps[1] == [max(s["x"] for s in after)]
    rid = out.meta["id"]
    ran = chunks_of(tmp_path / "dec_0.jsonl")[rid]
    assert ran == chunks_of(tmp_path / "dec_1.jsonl")[rid] and sum(x for _, x in ran) == 2000
    assert max(x for _, x in ran) <= caps[0][0], (ran, caps)  # how big they are is the measured times' call


def test_radix_hit_plans_only_the_suffix_from_the_cached_prefix(plan_run, pp1):
    c = plan_run["cached"]
    d = plan_run["dir"]
    rid = c["second"].meta["id"]
    cached = c["second"].meta.get("cached_tokens", 0)
    assert cached >= len(c["doc"]) - 1
    stages = [[(p, x) for r, p, x in _decisions(d / f"dec_{rank}.jsonl") if r == rid] for rank in (0, 1)]
    assert stages[0] == stages[1] and stages[0], "stages disagree on the cached request's chunks"
    assert stages[0][0][0] == cached  # the plan starts at the cached prefix
    assert sum(x for _, x in stages[0]) == len(c["full"]) - cached
    for rank in (0, 1):  # what ran is what was decided: the suffix only
        assert chunks_of(d / f"dec_{rank}.jsonl")[rid] == stages[0]
    # greedy output with a cached prefix under PP=2 equals PP=1's
    assert c["second"].output_ids == pp1["cached"]["second"].output_ids


def test_server_profiler_measures_extend_over_cached_prefix(plan_run):
    rc, path = plan_run["profile"]
    assert rc == 0
    doc = json.loads(path.read_text())
    pts = {(s["L"], s["x"]): s for s in doc["samples"]}
    assert set(pts) == {(0, 256), (1792, 256), (0, 512), (1536, 512)}
    for (L, x), s in pts.items():
        assert s["backend"] == "server" and s["ms"] > 0
        assert s["cached_tokens"] >= L - 1  # the prefix came from the radix cache: only x tokens computed
    assert doc["meta"]["pp"] == 2 and doc["meta"]["model"].endswith("smollm2-135m")


def _ran(path, total: int) -> list[int]:
    (seq,) = [[c for _, c in v] for v in chunks_of(path).values() if sum(c for _, c in v) == total]
    return seq


def test_policy_off_leaves_upstream_unchanged(off_run):
    """Upstream's own profiling and fit run, and its chunks are exactly its algorithm's on both stages
    (the tiny model with HiCache on: conftest.off_run, shared with tests/server/test_hicache.py)."""
    d, log = off_run["dir"], off_run["log"]
    assert _decisions(d / "dec_0.jsonl") == [] and _decisions(d / "dec_1.jsonl") == []  # we decided nothing
    (fit,) = read_events(d / "dec_0.jsonl", "upstream_fit")[:1]
    # issue 60: upstream's fit of 128 timed startup prefills can fail on a busy host (its quadratic term <= 0), and
    # then SGLang turns dynamic chunking off: either way the plugin decided nothing, and the chunks that ran are
    # upstream's, its algorithm's with the fit, else fixed chunks of C
    assert fit["ok"] == ("Dynamic chunking will be disabled" not in log), log[-2000:]
    for rank in (0, 1):
        seq = _ran(d / f"dec_{rank}.jsonl", OFF_PROMPT)
        if fit["ok"]:
            up = UpstreamPredictor(a=fit["a"], b=fit["b"], c=fit["c"], chunk_size=OFF_CHUNK, context_len=OFF_CTX)
            assert seq == up.chunk_sequence(OFF_PROMPT)  # upstream's run equals our reproduction, chunk for chunk
        else:
            assert seq == [OFF_CHUNK] * (OFF_PROMPT // OFF_CHUNK) + ([OFF_PROMPT % OFF_CHUNK] if OFF_PROMPT % OFF_CHUNK
                                                                     else [])


def test_quadratic_reproduces_upstream_chunks(quadratic_run, monkeypatch):
    """Same coefficients in, same chunk sequence out as SGLang's own predictor, on both stages (the tiny
    model: the chunks depend on the coefficients, not on the weights; conftest.quadratic_run)."""
    monkeypatch.setenv("SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR", QUAD_SIGMA)
    d, n = quadratic_run["dir"], QUAD_PROMPT
    want = sglang_reference_chunks(*QUAD_ABC, 1024, n, OFF_CTX, 16384)
    assert len(set(want)) > 2  # the coefficients make upstream shrink its chunks
    for rank in (0, 1):
        assert _ran(d / f"dec_{rank}.jsonl", n) == want
        runs: dict = {}
        for r, _, c in _decisions(d / f"dec_{rank}.jsonl"):  # also warm-up and health-check requests
            runs.setdefault(r, []).append(c)
        assert want in runs.values()  # our decisions (not a fallback) produced upstream's sequence


@pytest.mark.parametrize("env,needle", [
    ({"SGLANG_CPP_PROFILE": "/nonexistent/profile.json"}, "SGLANG_CPP_PROFILE=/nonexistent/profile.json"),
    # issue 27 item 5: a log folder missing on a node fails every rank at startup, not one rank at its first line
    ({"SGLANG_CPP_DECISION_LOG": "/nonexistent-dir/dec_{rank}.jsonl"},
     "SGLANG_CPP_DECISION_LOG: cannot write /nonexistent-dir/dec_0.jsonl"),
])  # a bad sigma or SGLANG_CPP_* value: SizerConfig.from_env on each rank, then every rank fails with the
#     reason (tests/inproc/test_sizer.py, tests/inproc/test_consensus.py); a value set on one node only: tests/server/test_multinode.py
def test_bad_config_fails_fast_at_startup(tiny, env, needle):
    rc, log = launch_fails(ServerSpec(tiny, pp_size=2, chunk_size=1024, dynamic=True, env=env,
                                      extra_args=SMALL_POOL), 600)
    assert rc is not None and rc != 0, f"the server did not exit by itself (exit code {rc})"  # a hang is no pass
    assert needle in log


def test_async_recv_and_upstream_extend_output_equal_pp1(smollm2, pp1):
    """One PP=2 server with SGLANG_CPP_ASYNC_RECV=1 at --pp-async-batch-depth 1 (batched irecvs, proxy waits
    deferred to the forward, micro-batches in flight: no deadlock) and SGLANG_CPP_FAST_EXTEND=0 (upstream's
    redundant-query extend) gives the greedy tokens of the PP=1 reference, which runs the prefix-aware
    extend, over 12 prompts with chunking and radix hits. One server for both keeps CI under 30 minutes."""
    env = {"SGLANG_CPP_ASYNC_RECV": "1", "SGLANG_CPP_FAST_EXTEND": "0"}
    spec = ServerSpec(smollm2, pp_size=2, chunk_size=MIXED_CHUNK, env=env,
                      extra_args=("--pp-async-batch-depth", "1"))
    with launched(spec, TIMEOUT) as srv:
        res = [generate(srv.base_url, text=p, max_new_tokens=8, timeout=600) for p in mixed_prompts()]
        log = srv.log()
    assert "[sglang-cpp] async PP recv on" in log
    assert "[sglang-cpp] async PP recv: 16 messages" in log  # the hook's own receive path ran (it counts)
    assert "prefix-aware extend attention on" in pp1["log"]
    assert "prefix-aware extend attention on" not in log
    assert sum(r.meta.get("cached_tokens", 0) > 0 for r in res) >= len(res) - 2  # the prompts share openings
    assert max(r.meta["prompt_tokens"] for r in res) > MIXED_CHUNK  # and the longer ones take two chunks
    assert [r.output_ids for r in res] == pp1["mixed"]


def _mixed_at_once(smollm2, plan_run, tmp_path, env: dict):
    """The 12 mixed prompts sent at once to a PP=2 --enable-mixed-chunk server with `env` (a batch policy),
    on plan_run's calibration cache, decision logs in tmp_path; returns (results, server log)."""
    from concurrent.futures import ThreadPoolExecutor

    env = {**env, "SGLANG_CPP_DECISION_LOG": str(tmp_path / "dec_{rank}.jsonl"),
           "SGLANG_CPP_CACHE_DIR": str(plan_run["dir"] / "cache"), "SGLANG_CPP_CALIB_MAX_LEN": "3072"}
    spec = ServerSpec(smollm2, pp_size=2, chunk_size=MIXED_CHUNK, dynamic=True, env=env,
                      extra_args=("--enable-mixed-chunk",))
    with launched(spec, TIMEOUT) as srv:
        with ThreadPoolExecutor(12) as pool:
            res = list(pool.map(lambda p: generate(srv.base_url, text=p, max_new_tokens=8, timeout=600),
                                mixed_prompts()))
        _until_idle_flushed(tmp_path, "decode_forward")
        return res, srv.log()


def _until_idle_flushed(d, event: str, timeout: float = 60.0) -> None:
    """Wait until both stages have flushed their buffered `event` lines (each stage's first pass with no
    batch after the last request, issue 45 item 8): a server stopped before that keeps them in memory."""
    import time

    deadline, seen = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        counts = tuple(len(read_events(d / f"dec_{r}.jsonl", event)) for r in (0, 1))
        if counts[0] and counts[0] == counts[1] and counts == seen:
            return
        seen = counts
        time.sleep(0.5)


def test_time_batch_policy_cuts_the_same_micro_batches_on_both_stages(smollm2, plan_run, pp1, tmp_path):
    """SGLANG_CPP_BATCH_POLICY=time and SGLANG_CPP_EVEN_DECODES=1 with --enable-mixed-chunk on the real PP=2
    server (the plan policy's cost model from plan_run's calibration cache): the 12 mixed prompts sent at once. Both stages log
    the same micro-batch budgets, chunk cuts and admission caps, the budget cuts some request below
    what is left of it, the decodes are split evenly over the two slots (eq. 4), and every greedy output
    equals the PP=1 reference's."""
    res, log = _mixed_at_once(smollm2, plan_run, tmp_path, {"SGLANG_CPP_BATCH_POLICY": "time",
                                                            "SGLANG_CPP_EVEN_DECODES": "1"})
    assert "from calibration cache" in log  # plan_run's calibration, not a new one
    stages = [[{k: v for k, v in e.items() if k not in ("t", "pp_rank")}
               for ev in ("batch", "batch_chunk", "admit_cap") for e in read_events(tmp_path / f"dec_{r}.jsonl", ev)]
              for r in (0, 1)]
    assert stages[0] == stages[1], "PP stages cut different micro-batches"
    cuts = [e for e in stages[0] if e["event"] == "batch_chunk"]
    assert any(e["chunk"] < e["remaining"] for e in cuts)  # the ms budget cut a prompt
    assert {e["policy"] for e in stages[0] if e["event"] == "batch"} == {"time"}
    # eq. 4: a slot admits up to its even share of the 12 requests, so no decode micro-batch holds more
    # than ceil(12 / 2); the cap bound at least once
    caps = [e for e in stages[0] if e["event"] == "admit_cap"]
    assert caps and all(len(e["loads"]) == 2 and sum(e["loads"]) + e["waiting"] <= 12 for e in caps)
    assert any(e["cap"] < e["waiting"] for e in caps)
    # the decode forwards the serving simulator's decode cost is fitted on: the same batches on both stages
    dec = [[(e["batch_size"], e["context"]) for e in read_events(tmp_path / f"dec_{r}.jsonl", "decode_forward")]
           for r in (0, 1)]
    assert dec[0] and dec[0] == dec[1]
    assert all(1 <= b <= 6 and c > b for b, c in dec[0])
    assert [r.output_ids for r in res] == pp1["mixed"]


def test_gllm_batch_policy_caps_every_micro_batch_alike_on_both_stages(smollm2, plan_run, pp1, tmp_path):
    """SGLANG_CPP_BATCH_POLICY=gllm with --enable-mixed-chunk on the real PP=2 server: the 12 mixed prompts
    sent at once. Both stages log the same micro-batch caps (gLLM eq. 3 on #WP and the KV in use); every
    prefill forward holds at most its micro-batch's cap of new prompt tokens, the cap cuts some prompt
    below what is left of it, and every greedy output equals the PP=1 reference's."""
    res, _ = _mixed_at_once(smollm2, plan_run, tmp_path, {"SGLANG_CPP_BATCH_POLICY": "gllm"})
    logs = [tmp_path / f"dec_{r}.jsonl" for r in (0, 1)]
    batches = [[{k: v for k, v in e.items() if k not in ("t", "pp_rank")} for e in read_events(p, "batch")]
               for p in logs]
    assert batches[0] and batches[0] == batches[1], "PP stages capped different micro-batches"
    assert {e["policy"] for e in batches[0]} == {"gllm"} and all(e["budget_ms"] is None for e in batches[0])
    # eq. 3 with the paper's defaults (#T=8, #MaxP=2048, #MinP=32, KV_thresh=0.05), by hand
    for e in batches[0]:
        wp, free = e["waiting_tokens"], max(e["kv_capacity"] - e["kv_used"], 0) / e["kv_capacity"]
        want = 0 if wp == 0 or free < 0.05 else int(min(max(min(wp / 8, 2048 * (free - 0.05) / 0.95), 32), wp))
        assert e["tokens"] in (want, max(want, 1)), e  # at least a page (1 token) while a prompt is mid-chunk
    assert any(e["tokens"] < e["waiting_tokens"] for e in batches[0])
    # each prefill forward on stage 0 comes right after the micro-batch cap it was formed under
    prompt_len = {r.meta["id"]: r.meta["prompt_tokens"] for r in res}
    cap, checked, cut = None, 0, False
    events = list(map(json.loads, logs[0].read_text().splitlines()))
    for e in events:
        if e["event"] == "batch":
            cap = e["tokens"]
        elif e["event"] == "forward" and cap is not None:
            new = [(r, L, x) for r, L, x in zip(e["rids"], e["prefix"], e["chunk"]) if L < prompt_len.get(r, 0)]
            if new:
                assert sum(x for *_, x in new) <= cap, (e, cap)
                cut |= any(L + x < prompt_len[r] for r, L, x in new)  # a prompt stopped short of its end
                checked += 1
            cap = None
        elif e["event"] == "decode_forward":
            cap = None
    assert checked >= 3 and cut
    assert [r.output_ids for r in res] == pp1["mixed"]


def test_dp_planner_on_the_server_plans_what_plan_method_dp_plans(tiny, tmp_path):
    """SGLANG_CPP_PLANNER=dp on the real PP=2 server, on a profile file (no probe overhead, no online
    refit, so the served model is the file): both stages decide and run the chunks of `sglang-cpp plan
    --method dp`, which on this model differ from the default equal-time planner's. The file is found as
    `tune chunk` leaves it (issue 47 item 6): SGLANG_CPP_CACHE_DIR/tuned/, named for this server's model, PP and
    TP size, device and dtype, with no SGLANG_CPP_PROFILE."""
    from sglang_cpp.bench.client import random_ids
    from sglang_cpp.files import device_file_name
    from sglang_cpp.plugin.startup.profiles import device_name

    prof = tmp_path / "cache" / "tuned" / device_file_name(Path(str(tiny)).name, 2, 1, device_name("cpu"), "float32")
    prof.parent.mkdir(parents=True)
    prof.write_text(json.dumps({"format": "sglang-cpp-profile", "samples": [],
                                "coeffs": {"c0": 2.0, "b": 0.02, "e": 1e-5, "f": 1e-6}}))
    env = {"SGLANG_CPP_POLICY": "plan", "SGLANG_CPP_CACHE_DIR": str(tmp_path / "cache"), "SGLANG_CPP_PLANNER": "dp",
           "SGLANG_CPP_OVERHEAD_PROBE": "0", "SGLANG_CPP_ONLINE": "0",
           "SGLANG_CPP_DECISION_LOG": str(tmp_path / "dec_{rank}.jsonl")}
    with launched(ServerSpec(tiny, pp_size=2, chunk_size=2048, dynamic=True, env=env), TIMEOUT) as srv:
        out = generate(srv.base_url, input_ids=random_ids(4000, seed=81), max_new_tokens=1)
        log = srv.log()
    assert f"cost model from the tuned config {prof}" in log
    assert not (tmp_path / "cache" / "calibration").exists()  # found, so nothing was calibrated
    rid, logs = out.meta["id"], [tmp_path / f"dec_{r}.jsonl" for r in (0, 1)]
    assert all(read_events(p, "startup")[0]["config"]["method"] == "dp" for p in logs)
    decided = [[(L, x) for r, L, x in _decisions(p) if r == rid] for p in logs]
    assert decided[0] and decided[0] == decided[1]
    assert all(chunks_of(p)[rid] == decided[0] for p in logs)  # run as decided

    def cli_plan(method: str) -> list[int]:
        cli = subprocess.run([sys.executable, "-m", "sglang_cpp.cli", "plan", "--profile", str(prof), "--input-len",
                              "4000", "--pp-size", "2", "--chunked-prefill-size", "2048", "--max-prefill-tokens",
                              "16384", "--context-length", "65536", "--method", method, "--json"],
                             capture_output=True, text=True, check=True)
        return json.loads(cli.stdout)["chunks"]

    dp = cli_plan("dp")
    assert [x for _, x in decided[0]] == dp and dp != cli_plan("equal-time")


def test_a_stage_that_cuts_another_chunk_fails_naming_the_request_both_stages_and_sizes(tiny, tmp_path):
    """Issue 56 item 2, the run-time guard on the real PP=2 server: SGLANG_CPP_CUT_FAULT_RANK=1 makes stage 1
    cut every planned chunk one alignment unit short of stage 0's. Stage 1 checks the rows stage 0 sent with its
    proxy before its forward and fails with one line naming the request, both stages and both sizes, not with a
    shape error inside the forward."""
    from sglang_cpp.bench.client import random_ids

    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({"format": "sglang-cpp-profile", "samples": [],
                                "coeffs": {"c0": 2.0, "b": 0.02, "e": 1e-5, "f": 1e-6}}))
    env = {"SGLANG_CPP_POLICY": "plan", "SGLANG_CPP_CACHE_DIR": str(tmp_path / "cache"),
           "SGLANG_CPP_PROFILE": str(prof), "SGLANG_CPP_OVERHEAD_PROBE": "0", "SGLANG_CPP_ONLINE": "0",
           "SGLANG_CPP_CUT_FAULT_RANK": "1", "SGLANG_CPP_DECISION_LOG": str(tmp_path / "dec_{rank}.jsonl")}
    with launched(ServerSpec(tiny, pp_size=2, chunk_size=2048, dynamic=True, env=env), TIMEOUT) as srv:
        with pytest.raises(Exception):
            generate(srv.base_url, input_ids=random_ids(4000, seed=82), max_new_tokens=1, timeout=300)
        import time

        deadline = time.monotonic() + 120
        while "PP stages cut" not in srv.log() and time.monotonic() < deadline:
            time.sleep(0.5)
        log = srv.log()
    first = [e for e in read_events(tmp_path / "dec_0.jsonl", "decision") if e["prompt_len"] == 4000][0]
    align = read_events(tmp_path / "dec_0.jsonl", "startup")[0]["config"]["align"]
    lines = [ln for ln in log.splitlines() if "PP stages cut different chunks for request" in ln]
    assert lines, log[-3000:]
    assert (f"PP0 sent {first['chunk']} tokens after a prefix of 0, PP1 cut {first['chunk'] - align} tokens after "
            f"a prefix of 0") in lines[0] and first["rid"] in lines[0]


# -- issue 26: online refinement on the real PP=2 server ---------------------------------------------------
ONLINE_LENS = (1600, 1700, 1800, 1900, 2000)
REPEATS = 2  # then ONLINE_LENS[0] again, this many times: plan hysteresis on a prompt length seen before


@pytest.fixture(scope="module")
def online_run(tiny, tmp_path_factory):
    """Tiny PP=2, plan policy on a profile over 10x too cheap (what a stale or foreign profile does), online
    refinement on (the default): the first request's tiny chunks give world rank 0 both stages' forwards."""
    from sglang_cpp.bench.client import random_ids

    d = tmp_path_factory.mktemp("online")
    # its x^2 term f makes the startup plan cut near-equal chunks ([256 x 4, 192 x 3] or [192 x 3, 256 x 4] for 1600
    # tokens, whichever stage the probe's overheads make the slower, checked offline over stage overheads 0.9-2.5
    # ms), where the served forwards' c0-dominated models cut one small chunk and 256s: the repeats of
    # ONLINE_LENS[0] are then weighed (plan hysteresis), never planned alike by chance. Its part of a 256-token
    # chunk (1.06 ms) stays under a tenth of a real forward's (15-25 ms on these hosts)
    cheap = {"coeffs": {"c0": 0.05, "b": 1e-4, "e": 1e-5, "f": 1.5e-5}}
    (d / "cheap.json").write_text(json.dumps({"format": "sglang-cpp-profile", "stages": [cheap, cheap]}))
    env = {"SGLANG_CPP_POLICY": "plan", "SGLANG_CPP_PROFILE": str(d / "cheap.json"),
           "SGLANG_CPP_DECISION_LOG": str(d / "dec_{rank}.jsonl"),
           "SGLANG_CPP_MAX_CHUNK": "256"}  # 7+ chunks per request: forwards at several prefixes, two sizes
    with launched(ServerSpec(tiny, pp_size=2, chunk_size=512, dynamic=True, env=env), TIMEOUT) as srv:
        lens = ONLINE_LENS + (ONLINE_LENS[0],) * REPEATS
        res = [generate(srv.base_url, input_ids=random_ids(n, seed=70 + i), max_new_tokens=1)
               for i, n in enumerate(lens)]
        log = srv.log()
    return {"dir": d, "res": res, "log": log}


def test_online_refit_reaches_every_stage_at_the_same_request(online_run):
    """World rank 0 gets both stages' forwards (stage 1's over the side group), refits, and every rank
    switches to the refined model between the same two requests; the requests planned after it are
    planned on it, and both stages decide every request alike."""
    from sglang_cpp.core.costmodel import model_from_dict

    d, log = online_run["dir"], online_run["log"]
    logs = [d / f"dec_{r}.jsonl" for r in (0, 1)]
    streams = [switch_stream(p) for p in logs]
    # a refit after the last request reaches stage 1 only with the next iteration's requests, which the
    # shutdown cuts off: compare up to each stage's last planned request
    cut = [max(i for i, (k, _) in enumerate(st) if k == "plan") + 1 for st in streams]
    assert streams[0][:cut[0]] == streams[1][:cut[1]] and streams[0][0][0] == "plan"  # 1st: the startup model
    want = list(ONLINE_LENS) + [ONLINE_LENS[0]] * REPEATS
    assert [n for k, n in streams[0] if k == "plan" and n in ONLINE_LENS] == want  # (and health checks)
    applied = sum(k == "refit" for k, _ in streams[0][:cut[0]])
    refits = [[(e["version"], e["cost"], e["covered"]) for e in read_events(p, "refit")][:applied] for p in logs]
    assert applied >= 1 and refits[0] == refits[1]
    # strictly increasing, not contiguous: an accepted model not yet sent is superseded by a newer refit (which
    # holds every stage's current model), so a version can be skipped (seen once in CI: [1, 3, 4, ...])
    versions = [v for v, *_ in refits[0]]
    assert versions == sorted(set(versions)) and versions[0] >= 1
    assert "online stage 0: refit accepted" in log and "online stage 1: refit" in log
    assert log.count("forwards drift from the cost model") <= 2  # once per stage at most
    decided = [_decisions(p) for p in logs]
    assert decided[0] == decided[1]
    # the first request after a switch is planned on the refined model: its predicted times are that model's
    events = list(map(json.loads, logs[0].read_text().splitlines()))
    i = next(k for k, e in enumerate(events) if e["event"] == "refit")
    planned = {e["rid"] for e in events[:i] if e["event"] == "decision"}  # their plans were made before it
    j = next(k for k in range(i, len(events)) if events[k]["event"] == "decision" and events[k]["rid"] not in planned)
    first = events[j]
    cost = model_from_dict(next(e for e in reversed(events[:j]) if e["event"] == "refit")["cost"])  # in force
    assert first["predicted_ms"] == pytest.approx(float(cost.time(first["prefix"], first["chunk"])), rel=1e-9)
    # it follows the forwards, not the profile: the profile's part of a 256-token chunk is 1.06 ms; the
    # refined model's is what a real forward costs, more than ten times that. A refit refines the stages
    # whose samples are in, so the first one may hold stage 1 still on the profile (seen once in CI: stage
    # 1's samples travel every 0.2 s): look at each stage in the first applied refit that refitted it
    startup = model_from_dict(read_events(logs[0], "startup")[0]["cost"])  # forward models, overheads beside
    applied_events = read_events(logs[0], "refit")[:applied]
    for s_ in (0, 1):
        refined = next((model_from_dict(e["cost"]).stages[s_]
                        for e in applied_events if "refit" in model_from_dict(e["cost"]).stages[s_].meta), None)
        assert refined is not None, f"stage {s_}: no applied refit refitted it"
        assert float(refined.time(0, 256)) > 10 * float(startup.stages[s_].time(0, 256))


def _flow_shop_ms(chunks, stages) -> float:
    """The TTFT of chunks on stages that may differ: C[k, s] = max(C[k-1, s], C[k, s-1]) + t_s(k), written out."""
    done = [0.0] * len(stages)
    L = 0
    for x in chunks:
        prev = 0.0
        for s, m in enumerate(stages):
            done[s] = max(done[s], prev) + float(m.time(L, x))
            prev = done[s]
        L += x
    return done[-1]


def test_a_repeated_prompt_keeps_its_plan_unless_the_refit_predicts_a_gain_beyond_its_held_back_error(online_run):
    """Plan hysteresis on the real PP=2 server: the first prompt length comes back after the refits. Each
    repeat whose new plan differs from the last one run for that length is weighed on the model in force:
    the last chunks priced on it, kept unless the new plan is predicted faster by more than the margin the
    refit sent (its held-back error) into chunk sizes whose regimes served forwards measured, and then run as
    they ran before. Both stages weigh and decide alike."""
    from sglang_cpp.core.costmodel import model_from_dict
    from sglang_cpp.core.regimes import x_bounds_of

    d = online_run["dir"]
    logs = [d / f"dec_{r}.jsonl" for r in (0, 1)]
    weighed = [[(e["event"], e["rid"], e["kept_chunks"], e["new_chunks"]) for e in
                files.read_events([p], "plan_kept", "plan_moved")] for p in logs]
    assert weighed[0] == weighed[1]
    events = list(map(json.loads, logs[0].read_text().splitlines()))
    rids, refit, in_force = [], None, {}  # the requests of ONLINE_LENS[0] in order; the refit in force at each
    for e in events:
        if e["event"] == "refit":
            refit = e
        elif e["event"] == "decision" and e["prompt_len"] == ONLINE_LENS[0] and e["rid"] not in in_force:
            rids.append(e["rid"])
            in_force[e["rid"]] = refit
    assert len(rids) == 1 + REPEATS and all(in_force[r] is not None for r in rids[1:])
    ran = {r: [x["chunk"] for x in read_events(logs[0], "decision") if x["rid"] == r] for r in rids}
    n_weighed = 0
    for prev, rid in zip(rids, rids[1:]):
        ev = [e for e in events if e["event"] in ("plan_kept", "plan_moved") and e["rid"] == rid]
        if not ev:  # the model in force planned the same chunks again: nothing to weigh
            assert ran[rid] == ran[prev]
            continue
        n_weighed += 1
        e, refit = ev[0], in_force[rid]
        assert e["margin"] == pytest.approx(refit["error"], abs=1e-5) and refit["error"] > 0
        stages = model_from_dict(refit["cost"]).charged  # each stage's forward model with its per-chunk overhead
        assert e["kept_ms"] == pytest.approx(_flow_shop_ms(ran[prev], stages), abs=2e-3)
        assert e["kept_chunks"] == len(ran[prev])
        # chunk sizes of the new plan in a regime (the stage model's x switches) no served forward measured on
        # some stage, by the refit's own list of measured regimes: such a plan is never moved to
        for c in e.get("unmeasured", []):
            assert any(int(np.searchsorted(x_bounds_of(m), c, side="right")) not in refit["measured"][k]
                       for k, m in enumerate(stages))
        keep = e["new_ms"] >= e["kept_ms"] * (1 - e["margin"]) or bool(e.get("unmeasured"))
        assert e["event"] == ("plan_kept" if keep else "plan_moved")
        assert (ran[rid] == ran[prev]) == keep and (keep or e["new_chunks"] == len(ran[rid]))
    # Whether a repeat is weighed at all depends on what the refit measured (issue 60: in a fresh-clone run on a
    # quiet 2-core AMD EPYC host no repeat was), so no branch is asserted here: every repeat above either ran its
    # previous chunks with nothing to weigh, or was weighed by the rule, alike on both stages. Both branches, on
    # fixed numbers: tests/unit/test_hysteresis.py (kept inside the margin, moved beyond it, never into an
    # unmeasured regime, every stage alike through set_model).
    assert 0 <= n_weighed <= REPEATS


def test_serving_steps_are_logged_per_chunk_and_their_median_becomes_the_charged_overhead(online_run):
    """Issue 25: every stage logs one `step` per pair of consecutive chunks of a request (the cost beyond
    forward and waits, and the plugin's own), and world rank 0 charges the median of those it received
    in place of the startup probe's overhead: the refined model's overhead is the median of a run of
    logged steps, on both stages."""
    from collections import Counter

    d = online_run["dir"]
    probe = read_events(d / "dec_0.jsonl", "overhead")[0]["stages_ms"]
    refits = read_events(d / "dec_0.jsonl", "refit")
    assert refits
    for s in (0, 1):
        path = d / f"dec_{s}.jsonl"
        chunks = Counter(e["rids"][0] for e in read_events(path, "forward") if len(e["rids"]) == 1)
        logged = read_events(path, "step")
        assert Counter(e["rid"] for e in logged) == {rid: n - 1 for rid, n in chunks.items() if n > 1}
        assert all(e["blocked_ms"] >= 0 and e["plugin_ms"] >= 0 and e["loop_ms"] > -0.01 for e in logged)
        assert all(e["gap_ms"] == pytest.approx(e["forward_ms"] + e["blocked_ms"] + e["loop_ms"], abs=0.01)
                   for e in logged)
        charged = refits[-1]["overheads_ms"][s]
        loop = [e["loop_ms"] for e in logged]
        medians = [float(np.median(loop[max(0, k - 64):k])) for k in range(8, len(loop) + 1)]
        # issue 60: whether a median left the band around the probe's value depends on this host's times; either
        # the probe's value stays or the charge is the median of a run of logged steps (both branches on fixed
        # numbers: tests/unit/test_refine.py)
        assert charged == probe[s] or min(abs(m - charged) for m in medians) < 0.01, (charged, probe[s], medians)
