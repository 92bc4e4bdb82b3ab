"""PD disaggregation end to end: prefill PP2 + sglang-cpp plan policy -> Mooncake (TCP) -> decode PP1.

Runs on CPU (needs mooncake-transfer-engine-non-cuda + libibverbs1) and on CUDA. Greedy output through
the PD pair must equal the non-disaggregated PP=1 reference server (conftest.pp1), and the prefill
server must chunk the long prompt with sglang-cpp's decisions (KV is sent after every chunk). The
prefill server runs HiCache (`--enable-hierarchical-cache`, a 4,096-token device pool): the long prompt,
sent again after a filler, is a host-tier hit there, planned from the cached length on both stages.

On CPU two SGLang 0.5.23 paths need help (docs/compatibility.md):
* prefill: `_send_kv_chunk` (disaggregation/prefill.py:1753) allocates a pinned tensor + torch.cuda.Event
  for Mooncake -> sglang_cpp.plugin.compat.cpu hooks MooncakeKVSender.__init__ to use the host path;
* decode: the default retraction backup is a HiCache host pool that calls cudaHostRegister
  (pool_host/common.py:147) -> we pass `--disaggregation-decode-retraction-backup cpu_tensor`.
If the main plugin does not register cpu_compat yet, a throw-away entry point registers it.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sglang_cpp.bench.client import ServerError, _session, flush_cache, generate, random_ids
from sglang_cpp.bench.server import ServerSpec, free_port, launched, reported_calibration

from conftest import CHAT, pd_long_ids, read_events

pytestmark = pytest.mark.server
TIMEOUT = 900
PREFILL_TOKENS, FILLER = 4096, 3500  # the prefill server's device pool; a filler that overflows it
CUT = 3000  # the aborted and the failed request: many chunks of at most 512, so both are hit while prefilling
ABORT_RID, FAIL_RID = "sglang-cpp-abort", "sglang-cpp-fail"
CUDA = __import__("torch").cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"

if importlib.util.find_spec("mooncake") is None:
    pytest.skip("mooncake transfer engine not installed (pip install mooncake-transfer-engine-non-cuda; "
                "apt-get install libibverbs1)", allow_module_level=True)
try:
    from mooncake.engine import TransferEngine  # noqa: F401
except ImportError as exc:  # installed but broken (e.g. libibverbs.so.1 missing): a failure, not a skip
    raise RuntimeError(f"mooncake transfer engine is installed but does not import: {exc}; "
                       "apt-get install libibverbs1 (examples/cpu/setup.sh does)") from None


def _env(tmp: Path) -> dict:
    env = {"SGLANG_CPP_POLICY": "plan", "SGLANG_CPP_CALIB_MAX_LEN": "1024", "MOONCAKE_PROTOCOL": "tcp",
           "MC_TCP_ENABLE_CONNECTION_POOL": "true",
           # chunks of at most 512 whatever the calibration says: the test follows a multi-chunk prefill
           "SGLANG_CPP_MAX_CHUNK": "512",
           # issue 31: every assertion below holds with PP0 deciding releases from the consensus store
           "SGLANG_CPP_PD_FAST_RING": "1",
           # ... and with each last chunk's KV sent at the pass after its forward (one page kept for the end)
           "SGLANG_CPP_PD_EARLY_KV": "1"}
    if not CUDA:
        env["OMP_NUM_THREADS"] = "1"
    return env


def _spec(model, env, pp, extra, cores):
    return ServerSpec(model, pp_size=pp, chunk_size=512, dynamic=pp > 1, device=DEVICE, env=env,
                      extra_args=tuple(extra), cores=None if CUDA else cores)


def _requests(url: str, ids: list[int]) -> dict:
    """Chat, the long prompt, then (HiCache on the prefill side) a filler that evicts part of the long
    prompt from the prefill server's device pool, and the long prompt again: a host-tier hit."""
    chat = generate(url, text=CHAT, max_new_tokens=16, stream=False, timeout=600)
    long = generate(url, input_ids=ids, max_new_tokens=16, stream=False, timeout=900)
    generate(url, input_ids=random_ids(FILLER, seed=81), max_new_tokens=1, stream=False, timeout=900)
    again = generate(url, input_ids=ids, max_new_tokens=16, stream=False, timeout=900)
    return {"chat": chat.text, "long": long.output_ids, "long_text": long.text, "again": again.output_ids}


def _router(prefill_url: str, bootstrap: int, decode_url: str, log: Path):
    """sglang-router in PD mode: the requests' path in a PD deployment (the test needs it installed)."""
    if importlib.util.find_spec("sglang_router") is None:
        raise RuntimeError("sglang-router is not installed; examples/cpu/setup.sh installs sglang-router==0.3.2")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation",
                             "--prefill", prefill_url, str(bootstrap), "--decode", decode_url,
                             "--host", "127.0.0.1", "--port", str(port),
                             # an aborted or failed request reaches the client as it is: the router's
                             # retry would prefill it again under a new bootstrap room
                             "--disable-retries"],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def _via_router(url: str, ids: list[int]) -> dict:
    # Retry while the router is still binding (connection refused) and while /health already answers
    # but the workers are not registered yet (HTTP 503 "No prefill workers available").
    deadline = time.time() + 180
    while True:
        try:
            return _requests(url, ids)
        except ServerError as exc:
            if not ("HTTP 503" in str(exc) or "ConnectionError" in str(exc)) or time.time() > deadline:
                raise
            time.sleep(2)


def _in_background(url: str, ids: list[int], rid: str):
    box: dict = {}

    def run():
        try:
            box["out"] = generate(url, input_ids=ids, max_new_tokens=4, stream=False, timeout=600, extra={"rid": rid})
        except ServerError as exc:
            box["error"] = str(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def _wait_for(what: str, probe, timeout: float = 300.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _idle(base_url: str) -> None:
    """Two flushes in a row succeed only on an idle scheduler (SGLang refuses one while requests are queued
    or running), and between them the loop passed `on_idle`, whose pool check (strict by default:
    SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE) raises on a KV slot that was not freed."""
    for _ in range(2):
        _wait_for(f"{base_url} to go idle (/flush_cache)", lambda: flush_cache(base_url), 120)


def _abort_then_fail(url: str, pre, dec, tmp: Path) -> dict:
    """Issue 31 item 4, on the running pair: a request aborted while it prefills, then one whose transfer
    fails because the decode server is killed while it prefills (the last thing this fixture does)."""
    log0 = tmp / "prefill_0.jsonl"

    def prefilling(rid):
        return lambda: any(rid in e["rids"] for e in read_events(log0, "forward"))

    def planned(rid):  # a decision line is written at once (forward lines are buffered)
        return lambda: any(e.get("rid") == rid for e in read_events(log0, "decision"))

    t, abort = _in_background(url, random_ids(CUT, seed=91), ABORT_RID)
    _wait_for(f"{ABORT_RID}'s first chunk decided", planned(ABORT_RID))
    for base in (pre.base_url, dec.base_url):  # the client's abort reaches both servers of the pair
        _session().post(f"{base}/abort_request", json={"rid": ABORT_RID}, timeout=30)
    t.join(300)
    _idle(pre.base_url)
    after_abort = generate(url, text=CHAT, max_new_tokens=16, stream=False, timeout=600).text

    t, fail = _in_background(url, random_ids(CUT, seed=92), FAIL_RID)
    _wait_for(f"{FAIL_RID}'s first forward", prefilling(FAIL_RID))
    os.killpg(dec.proc.pid, signal.SIGKILL)
    dec.proc.wait(60)

    def released(r):
        return [e["it"] for e in read_events(tmp / f"prefill_{r}.jsonl", "release") if FAIL_RID in e["rids"]]

    _wait_for(f"{FAIL_RID}'s release on both prefill stages", lambda: released(0) and released(1))
    t.join(300)
    _idle(pre.base_url)
    return {"abort": abort, "after_abort": after_abort, "fail": fail, "prefill_alive": pre.proc.poll() is None}


@pytest.fixture(scope="module")
def pd_run(smollm2, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pd")
    env, ids, boot = _env(tmp), pd_long_ids(smollm2), free_port()
    backend = ["--disaggregation-transfer-backend", "mooncake"]
    penv = dict(env, SGLANG_CPP_DECISION_LOG=str(tmp / "prefill_{rank}.jsonl"))
    pspec = _spec(smollm2, penv, 2, ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port",
                                    str(boot), *backend, "--enable-hierarchical-cache",
                                    "--max-total-tokens", str(PREFILL_TOKENS)], "0|1")
    dextra = ["--disaggregation-mode", "decode", *backend]
    if not CUDA:
        dextra += ["--disaggregation-decode-retraction-backup", "cpu_tensor"]
    dspec = _spec(smollm2, env, 1, dextra, "1")
    t0 = time.time()
    # Sequential start: a server picks its HTTP port up front but binds it only when ready, so a second
    # server starting meanwhile can take it for an internal port ("[Errno 98] address already in use").
    with launched(pspec, TIMEOUT, str(tmp)) as pre, launched(dspec, TIMEOUT, str(tmp)) as dec:
        router, url = _router(pre.base_url, boot, dec.base_url, tmp / "router.log")
        try:
            out = _via_router(url, ids)
            out.update(_abort_then_fail(url, pre, dec, tmp))
        finally:
            os.killpg(router.pid, 15)
            router.wait(30)
        out.update(prefill_log=pre.log(), decode_log=dec.log(), ids=ids,
                   sends=[read_events(tmp / f"prefill_{r}.jsonl", "kv_send") for r in (0, 1)],
                   host_hits=[read_events(tmp / f"prefill_{r}.jsonl", "host_hit") for r in (0, 1)],
                   releases=[read_events(tmp / f"prefill_{r}.jsonl", "release") for r in (0, 1)],
                   forwards=[read_events(tmp / f"prefill_{r}.jsonl", "forward") for r in (0, 1)],
                   aborts=[read_events(tmp / f"prefill_{r}.jsonl", "chunked_abort") for r in (0, 1)],
                   transferred=[read_events(tmp / f"prefill_{r}.jsonl", "transferred") for r in (0, 1)],
                   early=[read_events(tmp / f"prefill_{r}.jsonl", "kv_early") for r in (0, 1)],
                   chunks_sent=[read_events(tmp / f"prefill_{r}.jsonl", "kv_chunk") for r in (0, 1)],
                   statuses=[read_events(tmp / f"prefill_{r}.jsonl", "kv_status") for r in (0, 1)],
                   seconds=time.time() - t0)
        return out


def test_pd_chat_equals_non_disaggregated(pd_run, pp1):
    """conftest.pp1: the PP=1 SmolLM2 reference server, shared with test_server_e2e."""
    assert pd_run["chat"] == pp1["chat"]
    assert "Paris" in pd_run["chat"]


def test_pd_chunked_long_prompt_equals_non_disaggregated(pd_run, pp1):
    assert pd_run["long"] == pp1["pd_long"].output_ids, (pd_run["long_text"], pp1["pd_long"].text)
    assert len(pd_run["long"]) == 16


def _long_plans(pd_run) -> list[tuple[int, list[int]]]:
    """(prefix, chunks) the prefill server's PP0 planned for each run of the long prompt, in order."""
    n = len(pd_run["ids"])
    rows = re.findall(r"PP0 request rid=\S+ prompt=(\d+) prefix=(\d+) chunks=\[([\d, ]+)\] .*\(plan\)",
                      pd_run["prefill_log"])
    return [(int(prefix), [int(c) for c in chunks.split(",")]) for prompt, prefix, chunks in rows if int(prompt) == n]


def test_prefill_chunks_follow_sglang_cpp_plan(pd_run):
    """The long prompt is prefilled in several chunks decided by the plugin (KV sent after each), and
    they are the chunks `sglang-cpp plan` gives for the cost model the prefill server reports."""
    n = len(pd_run["ids"])
    prefix, chunks = _long_plans(pd_run)[0]
    assert len(chunks) >= 2 and all(c <= 512 for c in chunks), (prefix, chunks)
    assert prefix + sum(chunks) == n
    cal = reported_calibration(pd_run["prefill_log"])
    assert cal, "the prefill server did not report its cost model"
    cli = subprocess.run([sys.executable, "-m", "sglang_cpp.cli", "plan", "--profile", cal, "--input-len", str(n),
                          "--prefix-len", str(prefix), "--pp-size", "2", "--chunked-prefill-size", "512",
                          "--max-prefill-tokens", "16384", "--max-chunk", "512", "--context-length", "8192",
                          "--json"],
                         capture_output=True, text=True, check=True)
    assert chunks == json.loads(cli.stdout)["chunks"]


def test_kv_goes_to_decode_once_per_chunk(pd_run):
    """Each prefill rank hands Mooncake one KV transfer per chunk of the long prompt (its own layers),
    each the size of its chunk (page size 1: one page per token), after one transfer of the cached
    prefix the chunks start from (SGLang sends cached KV before the first chunk runs). Both runs of the
    long prompt: the first after a 3-token radix hit, the second after a HiCache host-tier hit (the whole
    prompt but its last token: one pass, so one transfer). With SGLANG_CPP_PD_EARLY_KV the last transfer
    is two: all of it but its last page at the pass after the forward, that page with the metadata at
    result time."""
    n, plans = len(pd_run["ids"]), _long_plans(pd_run)
    assert len(plans[0][1]) > 1  # the first run is chunked
    assert len(plans) == 2 and all(len(c) >= 1 for _, c in plans)
    for rank, sends in enumerate(pd_run["sends"]):
        rooms: dict = {}
        for e in sends:
            rooms.setdefault(e["room"], []).append(e["pages"])
        longs = [p for p in rooms.values() if sum(p) == n]
        # chunked: the cached prefix, then one transfer per chunk; one pass (the host hit left a 1-token
        # suffix): one transfer, cached prefix included
        want = [[prefix] * (prefix > 0) + chunks if len(chunks) > 1 else [prefix + chunks[0]]
                for prefix, chunks in plans]
        want = [w[:-1] + [w[-1] - 1, 1] for w in want]  # the early send, then the last page
        assert longs == want, (rank, longs, plans)


def test_prefill_host_tier_hit_with_hicache(pd_run, pp1):
    """PD + HiCache on the prefill side: after a filler overflows the prefill server's device pool, the
    long prompt comes back partly from the host tier; both prefill stages log the same load back, plan
    from device prefix + host hit, and the decode server's greedy tokens are unchanged."""
    hits = [[(e["device_prefix"], e["host_hit"]) for e in pd_run["host_hits"][r]] for r in (0, 1)]
    assert hits[0] and hits[0] == hits[1]
    (first, _), (again, chunks) = _long_plans(pd_run)
    assert [sum(h) for h in hits[0] if h[1] > 0][-1] == again > first  # planned from device + host
    assert again + sum(chunks) == len(pd_run["ids"])
    assert pd_run["again"] == pd_run["long"] == pp1["pd_long"].output_ids


def test_no_scheduler_crash_in_pd_logs(pd_run):
    for name in ("prefill_log", "decode_log"):
        assert "Scheduler hit an exception" not in pd_run[name], name


def test_fast_ring_frees_every_request_on_every_stage_at_one_loop_index(pd_run):
    """Issue 31 (SGLANG_CPP_PD_FAST_RING=1): PP0 decides from the consensus store, and every stage frees
    the same requests at the same loop index: the index of the forward-pass list that named them, not
    P-1 iterations later when upstream's ring brings the list back."""
    assert "PD prefill release: fast" in pd_run["prefill_log"]
    rel = [{room: e["it"] for e in pd_run["releases"][r] for room in e["rooms"]} for r in (0, 1)]
    assert len(rel[0]) >= 4 and rel[0] == rel[1], rel  # chat, long, filler, long again: all freed, alike
    for r in (0, 1):
        named = {}
        for e in pd_run["transferred"][r]:
            for rid in e["rids"]:
                named.setdefault(rid, e["it"])  # the index PP0's decision reached this stage
        # real transfers (the warm-up's is fake: upstream's ring frees it) are freed at that index
        freed = {rid: e["it"] for e in pd_run["releases"][r] for rid, fake in zip(e["rids"], e["fake"]) if not fake}
        assert len(freed) >= 4 and freed == {rid: named[rid] for rid in freed}, (r, freed, named)


def test_last_chunk_kv_leaves_at_the_pass_after_its_forward(pd_run):
    """Issue 31 item 2 (SGLANG_CPP_PD_EARLY_KV=1): on every stage, each request's last chunk's KV but its
    last page is handed to the transfer engine at the loop index after the forward that ran it, and the
    final send (that page and the metadata) follows at result time, later (in the same pass at PP2,
    whose results come back one pass after the launch); the outputs above are unchanged
    (test_pd_*_equals_non_disaggregated)."""
    assert "PD prefill last-chunk KV: sent at the pass after its forward" in pd_run["prefill_log"]
    n = len(pd_run["ids"])
    for r in (0, 1):
        last_fwd = {rid: e["it"] for e in pd_run["forwards"][r]
                    for rid, L, x in zip(e["rids"], e["prefix"], e["chunk"]) if L + x == n}
        early = {e["rid"]: e for e in pd_run["early"][r]}
        final = {e["rid"]: (e["it"], e["t"]) for e in pd_run["chunks_sent"][r] if e["last"]}
        assert len(last_fwd) == 2 and set(last_fwd) <= set(early), (r, last_fwd, early)  # both long runs
        for rid, it in last_fwd.items():
            assert early[rid]["it"] == it + 1 and early[rid]["end"] == n - 1 and early[rid]["total"] == n
            # at PP2 (P + d - 1 = 1) result processing is that same pass, later in it; at PP4 two passes later
            assert final[rid][0] >= early[rid]["it"] and final[rid][1] > early[rid]["t"], (r, final[rid], early[rid])


def test_every_prefill_stage_forms_the_same_batches(pd_run):
    """With releases moved, the stages still run the same micro-batch at every loop index (a stage that
    freed a different set would admit differently, and the PP ring would hang)."""
    def batches(r):
        return [(e["it"], e["rids"], e["prefix"], e["chunk"]) for e in pd_run["forwards"][r]]

    assert batches(0) and batches(0) == batches(1)


def _stopped(res: dict) -> str:
    """How the client learnt its request was stopped: an HTTP error, or SGLang's abort finish reason."""
    if "error" in res:
        return res["error"]
    reason = res["out"].meta.get("finish_reason") or {}
    assert reason.get("type") == "abort", f"the request ran to its end: {res['out'].meta}"
    return reason.get("message", "abort")


def test_an_aborted_request_is_released_on_every_stage_and_the_pair_serves_on(pd_run, pp1):
    """Issues 31 item 4 and 44 item 5 (fast ring and early KV on): a request aborted after its first chunk is
    stopped for the client, and its prefill stops: SGLang 0.5.23's PD PP loop never stopped an aborted chunked
    prefill (it ran every chunk to the end); the plugin stops it at one loop index on every stage (a
    `chunked_abort` event at the same index), and no stage runs a chunk of it from that index on. Both stages
    ran the same chunks of it, fewer than its prompt; neither sent its last chunk's KV (early KV skips an
    aborted request; no final send), and both returned every KV slot and request slot (the fixture waits for
    an idle pass, where SGLang's strict pool check raises on a leak: test_no_scheduler_crash_in_pd_logs and
    the log check below). The next request's output is the reference's."""
    _stopped(pd_run["abort"])
    runs = [[(e["it"], L, x) for e in pd_run["forwards"][r] for rid, L, x in zip(e["rids"], e["prefix"], e["chunk"])
             if rid == ABORT_RID] for r in (0, 1)]
    assert runs[0] and runs[0] == runs[1], runs
    stops = [[(e["it"], e["computed"]) for e in pd_run["aborts"][r] if e["rid"] == ABORT_RID] for r in (0, 1)]
    assert len(stops[0]) == 1 and stops[0] == stops[1], stops
    (it, computed), = stops[0]
    assert all(i < it for i, _, _ in runs[0])  # no chunk launched at or after the stop
    assert computed < CUT  # stopped short of its end (SGLang 0.5.23 alone ran it to CUT)
    for r in (0, 1):  # and no KV of it handed to the transfer engine from the stop on
        assert all(e["it"] < it for e in pd_run["chunks_sent"][r] if e["rid"] == ABORT_RID), r
    for r in (0, 1):
        assert not [e for e in pd_run["early"][r] if e["rid"] == ABORT_RID], r
        assert not [e for e in pd_run["chunks_sent"][r] if e["rid"] == ABORT_RID and e["last"]], r
    assert pd_run["after_abort"] == pp1["chat"]
    assert "memory leak" not in pd_run["prefill_log"]


def test_a_failed_transfer_is_released_on_every_stage_at_one_loop_index(pd_run):
    """Issue 31 item 4: the decode server dies while a request prefills; its KV transfer fails (a Failed
    status from the transfer engine on each stage), PP0 decides from the consensus store, and both stages
    free it once, at the same loop index; the prefill server stays up with no KV lost."""
    _stopped(pd_run["fail"])
    r0, r1 = ([e["it"] for e in pd_run["releases"][r] if FAIL_RID in e["rids"]] for r in (0, 1))
    assert len(r0) == 1 and r0 == r1, (r0, r1)
    room = next(room for e in pd_run["releases"][0] for rid, room in zip(e["rids"], e["rooms"]) if rid == FAIL_RID)
    for r in (0, 1):
        assert any(e["room"] == room and e["status"] == 0 for e in pd_run["statuses"][r]), (r, room)  # KVPoll.Failed
    assert pd_run["prefill_alive"]
    assert "memory leak" not in pd_run["prefill_log"]
