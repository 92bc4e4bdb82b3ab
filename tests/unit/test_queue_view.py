"""The queue-aware plan's view of a scheduler (plugin/admission._queue_view), on fakes shaped as SGLang 0.5.23's
state (plugin/targets.STATE_READS names the lines): the other micro-batch slots' prefill batches in flight,
the waiting requests behind, and what is left out."""
from __future__ import annotations

import logging
from types import SimpleNamespace as NS

from sglang_cpp.plugin.serving.admission import _inflight, _queue_view


class Mode:
    """SGLang's ForwardMode predicates: TARGET_VERIFY is an extend to `is_extend`, not without speculation."""

    def __init__(self, extend: bool, verify: bool = False):
        self.extend, self.verify = extend, verify

    def is_extend(self) -> bool:
        return self.extend or self.verify

    def is_extend_without_speculative(self) -> bool:
        return self.is_extend() and not self.verify


def req(rid, n, prefix=0, out=0, host=0):
    return NS(rid=rid, origin_input_ids=[1] * n, output_ids=[2] * out, prefix_len=prefix, host_hit_length=host)


def batch(rows, extend=True, verify=False):
    """rows: (req, prefix, extend) as prepare_for_extend leaves prefix_lens / extend_lens (lists)."""
    return NS(reqs=[r for r, _, _ in rows], prefix_lens=[p for _, p, _ in rows], extend_lens=[x for *_, x in rows],
              forward_mode=Mode(extend and not verify, verify))


def sched(mbs, slot, waiting=(), chunked=None, ctx=100000):
    running = [NS(name=f"running{i}") for i in range(len(mbs))]  # distinct objects, as init_pp_loop_state
    return NS(mbs=list(mbs), running_mbs=running, running_batch=running[slot], waiting_queue=list(waiting),
              chunked_req=chunked, model_config=NS(context_len=ctx))


def test_chunks_in_flight_are_the_other_slots_batches_oldest_first_one_job_per_batch():
    a, b, d = req("a", 9000), req("b", 500), req("d", 100)
    mbs = [batch([(a, 0, 4096)]),                               # slot 0: issued 3 iterations ago
           None,                                                 # slot 1: being scheduled now (stale)
           batch([(a, 4096, 2048), (b, 0, 500), (d, 100, 1)]),  # slot 2: a's chunk, b whole, d's decode row
           batch([(d, 101, 1)], extend=False)]                   # slot 3: a decode batch
    s = sched(mbs, slot=1)
    # PP4, no async depth: the three other slots, oldest first (2, 3, 0); the decode batch and row left out,
    # a's chunk and b folded into one forward at the prefix of its longest chunk
    assert _inflight(s, 4) == [(4096, 2548), (0, 4096)]
    # PP3 with pp_async_batch_depth 1 (4 slots): only the newest pp_size - 1 = 2 other slots are still in the
    # pipe, slots 3 and 0 (the decode batch, then a's first chunk); slot 2's batch has left it
    assert _inflight(s, 3) == [(0, 4096)]
    # speculative decoding under PP: a running batch is the prefill batch object, its prefix and extend lengths
    # left as they were, in TARGET_VERIFY mode (scheduler.py:3958): a verify step, not prefill in flight
    s.mbs[0] = batch([(a, 0, 4096)], verify=True)
    assert _inflight(s, 4) == [(4096, 2548)]


def test_no_slot_no_chunks_in_flight():
    s = sched([batch([(req("a", 900), 0, 512)]), None], slot=0)
    s.running_batch = NS()  # not one of running_mbs: outside a PP loop slot
    assert _inflight(s, 2) == []


def test_the_waiting_requests_behind_a_first_chunk_and_behind_a_continuing_one(caplog):
    w = [req("x", 3000), req("cur", 8000), req("y", 2000, prefix=512, host=256), req("z", 700, out=20)]
    s = sched([None, None], slot=0, waiting=w)
    v = _queue_view(s, "cur", 2)  # a first chunk: "cur" is still in the queue, the ones after it wait behind
    assert v.waiting == ((2000, 768), (720, 0)) and v.ids == ("y", "z")  # a retracted one re-prefills its output
    s = sched([None, None], slot=0, waiting=w, chunked=req("c", 9000))
    v = _queue_view(s, "c", 2)  # a continuing chunk: the chunked request is not in the queue, all of it waits
    assert v.ids == ("x", "cur", "y", "z")
    with caplog.at_level(logging.WARNING, logger="sglang_cpp"):
        s = sched([None, None], slot=0, waiting=[req("huge", 5000), req("ok", 100)], ctx=4096)
        v = _queue_view(s, "other", 2)
        _queue_view(s, "other", 2)
    assert v.ids == ("ok",)
    assert sum("rid=huge" in r.message for r in caplog.records) == 1  # named once


def test_at_most_sixteen_waiting_requests_are_in_view():
    s = sched([None, None], slot=0, waiting=[req(f"r{i}", 1000) for i in range(40)])
    assert len(_queue_view(s, "nope", 2).waiting) == 16
