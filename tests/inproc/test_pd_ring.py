"""The fast PD release (plugin/pd/ring.py) without servers: its gates, PP0's decision from every stage's
store column, a later stage applying exactly what it received, and the loud check. The real PD servers
(tests/server/test_pd_disagg.py) run it end to end with outputs, batches and releases compared across stages."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_cpp.plugin.pd import ring as pd_ring

SUCCESS, FAILED, TRANSFERRING = 4, 0, 3


class Store:
    def __init__(self, columns: dict):
        self.columns = columns

    def collect(self, room):
        return self.columns[room]


class Sender:
    def __init__(self, store, status):
        self.kv_mgr = SimpleNamespace(request_status=store)
        self.status = status

    def poll(self):
        return self.status


def _req(rid, room, store, status=SUCCESS, fake=False):
    return SimpleNamespace(rid=rid, bootstrap_room=room, disagg_kv_sender=Sender(store, status), fake=fake)


class Sched:
    def __init__(self, queue, first: bool, received=None, staging=False, cp=1):
        self.disagg_prefill_inflight_queue = queue
        self.pp_group = SimpleNamespace(is_first_rank=first, rank_in_group=0 if first else 1)
        self.enable_staging = staging
        self.attn_cp_cpu_group = SimpleNamespace(size=lambda: cp)
        self.attn_tp_cpu_group = SimpleNamespace(size=lambda: 1)
        self.received, self.freed = received, []

    def _pp_recv_pyobj_from_prev_stage(self):
        return self.received

    def process_disagg_prefill_inflight_queue(self, rids):
        self.freed.append(list(rids))
        self.disagg_prefill_inflight_queue = [r for r in self.disagg_prefill_inflight_queue if r.rid not in rids]


@pytest.fixture
def local_polls(monkeypatch):
    """One TP and CP rank: the MIN-reductions return their input."""
    import sglang.srt.disaggregation.utils as u

    monkeypatch.setattr(u, "_all_reduce_polls", lambda flags, group: list(flags))
    monkeypatch.setattr(u, "poll_and_all_reduce_attn_cp_tp_group", lambda pollers, cp, tp: [p.poll() for p in pollers])
    monkeypatch.setattr(u, "_is_fake_transfer", lambda req: req.fake)
    monkeypatch.setenv("SGLANG_CPP_PD_FAST_RING", "1")
    pd_ring.LOOP.fast, pd_ring.LOOP.it = None, 0
    yield
    pd_ring.LOOP.fast, pd_ring.LOOP.it = None, 0


def test_pp0_frees_only_what_every_stage_finished(local_polls):
    store = Store({1: [SUCCESS, SUCCESS, SUCCESS], 2: [SUCCESS, TRANSFERRING, SUCCESS], 3: [SUCCESS, None, SUCCESS],
                   4: [FAILED, SUCCESS, SUCCESS]})
    sched = Sched([_req(f"r{i}", i, store) for i in (1, 2, 3, 4)], first=True)
    out = pd_ring.transferred_ids(lambda s: pytest.fail("upstream's forward pass ran"), sched)
    # r2 still transfers on stage 1, stage 2 has not published r3: both wait; Failed is terminal
    assert out == ["r1", "r4"] and sched.freed == [["r1", "r4"]] and pd_ring.LOOP.it == 1
    assert [r.rid for r in sched.disagg_prefill_inflight_queue] == ["r2", "r3"]


def test_a_warm_up_transfer_keeps_upstreams_ring(local_polls):
    """SGLang's warm-up request (a fake transfer) never writes the store: PP0 names it by its own poll, as
    upstream does, and nobody frees it now; a later stage forwards it only where it is terminal too, and the
    return ring frees it P-1 iterations later (upstream's path)."""
    store = Store({1: [SUCCESS, SUCCESS]})
    pp0 = Sched([_req("w", 9, store, fake=True), _req("r", 1, store)], first=True)
    assert pd_ring.transferred_ids(lambda s: pytest.fail("upstream ran"), pp0) == ["w", "r"]
    assert pp0.freed == [["r"]] and [r.rid for r in pp0.disagg_prefill_inflight_queue] == ["w"]
    pd_ring.LOOP.fast = None
    pp1 = Sched([_req("w", 9, store, status=TRANSFERRING, fake=True), _req("r", 1, store)], first=False,
                received=["w", "r"])
    assert pd_ring.transferred_ids(lambda s: pytest.fail("upstream ran"), pp1) == ["r"]  # w not done here yet
    assert pp1.freed == [["r"]]


def test_a_later_stage_frees_exactly_what_it_received_and_forwards_it(local_polls):
    store = Store({})
    sched = Sched([_req("a", 1, store), _req("b", 2, store)], first=False, received=["b"])
    assert pd_ring.transferred_ids(lambda s: pytest.fail("upstream ran"), sched) == ["b"]
    assert sched.freed == [["b"]]


def test_a_stage_waits_out_the_transfer_threads_bookkeeping(local_polls, monkeypatch):
    """The transfer thread publishes Success before it drops its outstanding-chunk count, and the local poll
    reads Transferring in between: a stage told to free such a request polls again until it is terminal."""
    store = Store({})
    req = _req("a", 1, store, status=TRANSFERRING)
    polls = iter([TRANSFERRING, TRANSFERRING, SUCCESS])
    req.disagg_kv_sender.poll = lambda: next(polls)
    monkeypatch.setattr(pd_ring.time, "sleep", lambda s: None)
    sched = Sched([req], first=False, received=["a"])
    assert pd_ring.transferred_ids(lambda s: [], sched) == ["a"] and sched.freed == [["a"]]


def test_a_stage_told_to_free_a_transfer_it_still_runs_fails_loudly(local_polls, monkeypatch):
    monkeypatch.setattr(pd_ring, "WAIT_POLLS", 3)
    monkeypatch.setattr(pd_ring.time, "sleep", lambda s: None)
    store = Store({})
    sched = Sched([_req("a", 1, store, status=TRANSFERRING)], first=False, received=["a"])
    with pytest.raises(RuntimeError, match="not finished.*SGLANG_CPP_PD_FAST_RING=0"):
        pd_ring.transferred_ids(lambda s: [], sched)
    assert sched.freed == []  # nothing freed
    missing = Sched([], first=False, received=["ghost"])
    with pytest.raises(RuntimeError, match="not in its inflight queue"):
        pd_ring.transferred_ids(lambda s: [], missing)


@pytest.mark.parametrize("env,staging,cp,why", [("0", False, 1, "SGLANG_CPP_PD_FAST_RING=0"),
                                                ("1", True, 1, "staging"), ("1", False, 2, "attention CP is 2")])
def test_upstreams_ring_runs_where_the_fast_path_is_off(local_polls, monkeypatch, env, staging, cp, why):
    monkeypatch.setenv("SGLANG_CPP_PD_FAST_RING", env)
    sched = Sched([], first=True, staging=staging, cp=cp)
    assert why in pd_ring.fast_release_ok(sched)[1]
    calls = []
    assert pd_ring.transferred_ids(lambda s: calls.append(1) or ["x"], sched) == ["x"]
    assert calls == [1] and sched.freed == []


# -- the early last-chunk KV send (plugin/pd/kv.py) ------------------------------------------------------
from sglang_cpp.plugin.pd import kv as pd_kv  # noqa: E402


@pytest.mark.parametrize("start,total,page,want", [
    (0, 1000, 1, 999),  # page 1: all but the last token
    (512, 1000, 1, 999),  # after the middle chunks' sends
    (0, 1000, 64, 960),  # whole pages, the last (partial) page kept back
    (0, 1024, 64, 960),  # the last page kept back even when it is whole: the final send must hold one
    (960, 1000, 64, 0),  # nothing left to send early
    (999, 1000, 1, 0),
    (0, 1, 1, 0),  # a one-token prompt: its only page is the final send's
])
def test_early_end_keeps_the_last_page_for_the_final_send(start, total, page, want):
    assert pd_kv.early_end(start, total, page) == want


def test_early_kv_gates(monkeypatch):
    base = dict(enable_staging=False, enable_overlap=False, attn_cp_cpu_group=SimpleNamespace(size=lambda: 1))
    monkeypatch.setenv("SGLANG_CPP_PD_EARLY_KV", "1")
    assert pd_kv.early_kv_ok(SimpleNamespace(**base)) == (True, "")
    for change, why in (({"enable_staging": True}, "staging"), ({"enable_overlap": True}, "overlap"),
                        ({"attn_cp_cpu_group": SimpleNamespace(size=lambda: 2)}, "CP is 2")):
        on, reason = pd_kv.early_kv_ok(SimpleNamespace(**{**base, **change}))
        assert not on and why in reason
    monkeypatch.setenv("SGLANG_CPP_PD_EARLY_KV", "0")
    assert pd_kv.early_kv_ok(SimpleNamespace(**base)) == (False, "SGLANG_CPP_PD_EARLY_KV=0")


class _KVSched:
    device = "cpu"
    token_to_kv_pool_allocator = SimpleNamespace(page_size=1)

    def __init__(self):
        self.sent = []

    def send_kv_chunk(self, req, last_chunk=False, end_idx=None):
        self.sent.append((req.rid, last_chunk, end_idx))
        req.start_send_idx = end_idx


def _kv_req(rid, n, end, **kw):
    fields = dict(rid=rid, origin_input_ids=list(range(n)), extend_end=end, pending_bootstrap=False,
                  start_send_idx=0, bootstrap_room=1, to_finish=None, finished_reason=None,
                  disagg_kv_sender=SimpleNamespace(conclude_state=None))
    return SimpleNamespace(**{**fields, **kw})


def test_early_send_goes_out_at_the_next_pass_for_last_chunks_only(monkeypatch):
    """A batch's requests whose last chunk it ran are sent (non-final, all but the last page) when the next
    pass calls send_ran; a middle chunk, a request still bootstrapping, an aborted one and a concluded
    transfer are not, and nothing is sent twice."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    monkeypatch.setattr(pd_kv.STATE, "on", True)
    monkeypatch.setattr(pd_kv.STATE, "ran", [])
    sched = _KVSched()
    reqs = [_kv_req("last", 1000, 1000), _kv_req("middle", 1000, 512), _kv_req("boot", 1000, 1000),
            _kv_req("abort", 1000, 1000), _kv_req("done", 1000, 1000)]
    batch = SimpleNamespace(reqs=reqs, forward_mode=SimpleNamespace(is_extend=lambda: True))
    pd_kv.ran(sched, batch)
    assert [r.rid for r, _ in pd_kv.STATE.ran] == ["last", "boot", "abort", "done"]  # the middle chunk is not last
    reqs[2].pending_bootstrap = True
    reqs[3].to_finish = FINISH_ABORT("client gone")
    reqs[4].disagg_kv_sender.conclude_state = FAILED
    assert sched.sent == []  # nothing at the forward itself
    pd_kv.send_ran(sched, it=7)
    assert sched.sent == [("last", False, 999)] and pd_kv.STATE.ran == []
    pd_kv.send_ran(sched, it=8)
    assert sched.sent == [("last", False, 999)]
    decode = SimpleNamespace(reqs=reqs, forward_mode=SimpleNamespace(is_extend=lambda: False))
    pd_kv.ran(sched, decode)
    assert pd_kv.STATE.ran == []


def test_early_kv_on_a_backend_that_drops_the_forward_event_fails_at_startup(monkeypatch):
    """Issue 45 item 4: NIXL's add_transfer_request takes the early send's event and drops it
    (nixl/conn.py:3261-3271), where Mooncake and Mori wait on it before reading the KV (mooncake/conn.py:2532-2538,
    mori/conn.py:625-626; ascend's manager is Mooncake's, ascend/conn.py:95): with SGLANG_CPP_PD_EARLY_KV=1 a NIXL prefill server is a startup error naming the
    switch and the backend; Mooncake, Mori, a decode server or the switch off are not."""
    from types import SimpleNamespace as NS

    from sglang_cpp.plugin.pd import kv as pd_kv

    monkeypatch.setenv("SGLANG_CPP_PD_EARLY_KV", "1")
    err = pd_kv.startup_error(NS(disaggregation_mode="prefill", disaggregation_transfer_backend="nixl"))
    assert "SGLANG_CPP_PD_EARLY_KV=1" in err and "--disaggregation-transfer-backend nixl" in err
    for mode, backend in (("prefill", "mooncake"), ("prefill", "ascend"), ("prefill", "mori"), ("decode", "nixl"),
                          ("null", "nixl")):
        assert pd_kv.startup_error(NS(disaggregation_mode=mode, disaggregation_transfer_backend=backend)) == ""
    monkeypatch.setenv("SGLANG_CPP_PD_EARLY_KV", "0")
    assert pd_kv.startup_error(NS(disaggregation_mode="prefill", disaggregation_transfer_backend="nixl")) == ""


def test_only_an_abort_the_relay_marked_stops_the_chunked_request():
    """An AbortReq marks the chunked request on every rank (SGLang's test, scheduler.py:5676-5678); a mark one
    rank set alone (run_batch's external-linker failure, scheduler.py:4928-4931) is not promoted by an
    unrelated AbortReq arriving meanwhile, so no stage stops the request alone."""
    chunked = SimpleNamespace(rid="long-1")
    sched = SimpleNamespace(chunked_req=chunked, _pending_chunked_abort_req=chunked)  # a local mark
    pd_ring.abort_requested(sched, SimpleNamespace(rid="other", abort_all=False))
    assert getattr(sched, "sglang_cpp_relayed_abort", None) is None
    pd_ring.abort_requested(sched, SimpleNamespace(rid="long", abort_all=False))  # SGLang's prefix match
    assert sched.sglang_cpp_relayed_abort is chunked
    sched2 = SimpleNamespace(chunked_req=chunked, _pending_chunked_abort_req=chunked)
    pd_ring.abort_requested(sched2, SimpleNamespace(rid="", abort_all=True))
    assert sched2.sglang_cpp_relayed_abort is chunked


def test_an_abort_with_an_empty_rid_is_matched_as_sglang_matches_it():
    """SGLang tests `chunked_req.rid.startswith(recv_req.rid)` (scheduler.py:5677), and a None rid becomes ""
    (io_struct.py:2295): an empty rid marks the chunked request on every rank, so the relay acts on it too;
    no AbortReq at all (a direct call) promotes nothing."""
    chunked = SimpleNamespace(rid="long-1")
    for rid in ("", None):
        sched = SimpleNamespace(chunked_req=chunked, _pending_chunked_abort_req=chunked)
        pd_ring.abort_requested(sched, SimpleNamespace(rid=rid, abort_all=False))
        assert sched.sglang_cpp_relayed_abort is chunked
    sched = SimpleNamespace(chunked_req=chunked, _pending_chunked_abort_req=chunked)
    pd_ring.abort_requested(sched, None)
    assert getattr(sched, "sglang_cpp_relayed_abort", None) is None
