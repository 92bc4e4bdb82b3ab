"""PD disaggregation with PP prefill: the release ring, observed and shortened.

SGLang 0.5.23 frees a prefill request whose KV transfer is done on every stage through a two-pass ring:
the forward pass intersects each stage's finished transfers (`_pp_pd_get_prefill_transferred_ids`, index m),
and the list comes back around to every stage P-1 loop iterations later, where it is applied after that
iteration's batch was formed (shared/reference/pd-pp-ring.md section 1.2). Its KV, request slot and
metadata buffer are therefore reusable only P iterations after the transfer ended.

Fast release (SGLANG_CPP_PD_FAST_RING=1; off by default): PP0 already holds every stage's transfer status in SGLang's
`PPConsensusStore` (the bootstrap fix of 0.5.23). At index m it decides which requests are terminal
(Success or Failed) on every stage, with its attention TP (and CP) ranks MIN-combined, and that list rides
the forward-pass message every stage already receives at index m. Every stage then frees exactly that set
at index m, before batch m. The message pattern (the same sends and receives, same order, same tags) is
upstream's; only the list's content and the point where it is applied change. The list that comes back
around the ring at m+P-1 names requests already freed: a no-op. Off, with upstream's path unchanged,
under the staging buffer (its hold-back is rank-local, invisible to PP0) or attention CP > 1.

Observe only (with a decision log): each rank's loop index `it` (one forward-pass call per index), the
`transferred` lists, `release` (the requests a stage freed), `kv_chunk` (a KV send handed to the
transfer engine, `last` for the final chunk) and `kv_status` (a transfer status change, from the
transfer threads), so the lags are counted in loop iterations (benchmarks/pd_ring.py).
"""
from __future__ import annotations

import logging
import threading
import time

from ... import envs
from . import kv as pd_kv

logger = logging.getLogger("sglang_cpp")

TERMINAL = (0, 4)  # KVPoll.Failed, KVPoll.Success (sglang/srt/disaggregation/base/conn.py:123-128)
# Polls a stage makes for a decided request whose own poll is not terminal yet, 1 ms apart, before it fails:
# the transfer thread publishes Success (which PP0's store sees) before it drops the room's outstanding-chunk
# count (mooncake/conn.py:2810-2845), and the poll reports Transferring in between. A count, not a clock, so
# every TP rank of the stage (each poll is a collective over them) stops at the same poll.
WAIT_POLLS = 10000


class _Loop:
    """This process's loop index on a PD prefill stage: one `_pp_pd_get_prefill_transferred_ids` call per
    pass of the PP loop (scheduler_pp_mixin.py:280)."""

    def __init__(self):
        self.it = 0
        self.fast: bool | None = None  # decided at the first call, the same on every rank
        self.lock = threading.Lock()


LOOP = _Loop()


def _log(log):
    return log if log is not None and log.path else None


def fast_release_ok(sched) -> tuple[bool, str]:
    """(on, why not): the fast path needs PP > 1 prefill, no staging buffer and attention CP == 1."""
    return pd_kv.gate(sched, envs.PD_FAST_RING, "its hold-back is rank-local: PP0 cannot see it",
                      cp_note=" (dummy-CP ranks)")


def _local_polls(sched, queue) -> list:
    """This stage's own transfer states, MIN-combined over its attention TP and CP ranks (upstream's get_rids
    poll; a collective every TP rank of the stage runs at the same point)."""
    from sglang.srt.disaggregation.utils import poll_and_all_reduce_attn_cp_tp_group

    return [int(p) for p in poll_and_all_reduce_attn_cp_tp_group([r.disagg_kv_sender for r in queue],
                                                                   sched.attn_cp_cpu_group, sched.attn_tp_cpu_group)]


def _is_fake(req) -> bool:
    """A transfer that never reaches the consensus store (SGLang's warm-up and fake-backend requests)."""
    from sglang.srt.disaggregation.utils import _is_fake_transfer

    return bool(_is_fake_transfer(req))


def _decide_on_pp0(sched, queue, local: list) -> list:
    """PP0: the rids whose transfer is terminal on every stage, from the consensus store, MIN-combined over
    PP0's attention TP and CP ranks (each TP rank's store holds only its own column). A fake transfer (the
    warm-up) never writes the store: it goes by PP0's own poll, as upstream's forward pass does, and is
    freed where upstream frees it (`transferred_ids`)."""
    from sglang.srt.disaggregation.utils import _all_reduce_polls

    flags = []
    for req, mine in zip(queue, local):
        if _is_fake(req):
            flags.append(int(mine in TERMINAL))
            continue
        statuses = req.disagg_kv_sender.kv_mgr.request_status.collect(req.bootstrap_room)
        flags.append(int(all(s is not None and int(s) in TERMINAL for s in statuses)))
    flags = _all_reduce_polls(flags, sched.attn_tp_cpu_group)
    flags = _all_reduce_polls(flags, sched.attn_cp_cpu_group)
    return [req.rid for req, f in zip(queue, flags) if f]


def _check_terminal_here(sched, queue: list, polls: list, want: set) -> None:
    """Every stage frees what PP0 decided (`want`); a stage whose own transfer of one of them still runs would
    free KV the transfer engine is reading, or (keeping it) form different batches from the other stages.
    The store says it cannot happen; if it does, fail loudly."""
    bad = [(r.rid, p) for r, p in zip(queue, polls) if r.rid in want and p not in TERMINAL]
    missing = want - {r.rid for r in queue}
    if bad or missing:
        raise RuntimeError(
            f"sglang-cpp fast PD release: PP{sched.pp_group.rank_in_group} at loop index {LOOP.it} was told to free "
            f"{sorted(want)}, but after {WAIT_POLLS} polls its own transfers of {bad} are not finished and "
            f"{sorted(missing)} are not in its "
            "inflight queue; freeing would hand KV the transfer engine still reads to another request, keeping them "
            "would desynchronise the stages. Set SGLANG_CPP_PD_FAST_RING=0 and report this")


def _fast(sched) -> list:
    """The forward pass with PP0 deciding: returns the list to forward (the message upstream sends), having
    freed its real transfers on this stage now. Fake transfers keep upstream's semantics: the list carries
    those terminal on every stage so far (an intersection, as upstream's), and the return ring frees them
    P-1 iterations later."""
    queue = list(sched.disagg_prefill_inflight_queue)
    if sched.pp_group.is_first_rank:
        if not queue:
            return []
        polls = _local_polls(sched, queue)
        got = _decide_on_pp0(sched, queue, polls)
    else:
        got = list(sched._pp_recv_pyobj_from_prev_stage())  # the message upstream receives here
        polls = _local_polls(sched, queue) if got else []
    if not got:
        return []
    want = set(got)
    fake = {r.rid for r in queue if _is_fake(r)}
    real = want - fake
    for _ in range(WAIT_POLLS):  # the worker's bookkeeping after Success (WAIT_POLLS)
        if all(p in TERMINAL for r, p in zip(queue, polls) if r.rid in real):
            break
        time.sleep(0.001)
        polls = _local_polls(sched, queue)
    _check_terminal_here(sched, queue, polls, real)
    keep_fake = {r.rid for r, p in zip(queue, polls) if r.rid in want and r.rid in fake and p in TERMINAL}
    if real:
        sched.process_disagg_prefill_inflight_queue(sorted(real, key=got.index))
    return [rid for rid in got if rid in real or rid in keep_fake]


def transferred_ids(original, self, log=None):
    """AROUND the forward pass of SGLang's release consensus (scheduler_pp_mixin.py:614): counts the loop
    index, and with the fast path decides on PP0 and frees the decided set on every stage at this index."""
    LOOP.it += 1
    if pd_kv.decide(self):
        pd_kv.send_ran(self, LOOP.it, _log(log))  # the last chunks that ran in the previous pass
    if LOOP.fast is None:
        LOOP.fast, why = fast_release_ok(self)
        logger.info("[sglang-cpp] PD prefill release: %s", "fast (PP0 decides from the consensus store; every stage "
                    "frees at the same loop index, before its batch)" if LOOP.fast else f"upstream's ring ({why})")
    out = _fast(self) if LOOP.fast else original(self)
    log = _log(log)
    if log is not None and out:
        log.write("transferred", it=LOOP.it, rids=list(out), fast=bool(LOOP.fast))
    return out


def chunked_abort(sched, log=None) -> None:
    """Before `process_prefill_chunk`, every pass of a PD prefill loop: an abort that reached this stage's
    chunked request stops it here. SGLang 0.5.23's plain PP loop and its PP=1 PD loop do this at the top of
    their batch formation (`process_pending_chunked_abort`: scheduler.py:3897, disaggregation/prefill.py:654,
    before that path's `process_prefill_chunk`); its PD PP loop (scheduler_pp_mixin.py:217-300) never calls
    it, so an aborted long prompt ran every remaining chunk and held the pipe for the prompts behind it.
    `abort_request` marks the request on every stage at the same loop index (the AbortReq rides the request
    relay), so every stage stops it at the same index: no stage launches a chunk of it from there on, the
    chunks already launched drain through result processing (its `is_aborted` drop), and SGLang's own
    teardown runs once per stage (KV freed, the sender aborted, the metadata buffer returned). In the PP=1 PD
    loop SGLang has already run it by then, and this finds nothing pending."""
    req = getattr(sched, "_pending_chunked_abort_req", None)
    if req is None or req is not getattr(sched, "sglang_cpp_relayed_abort", None):
        return  # none, or one this rank set alone (run_batch's external-linker failure, scheduler.py:4928-4931)
    sched.sglang_cpp_relayed_abort = None
    running = sched.chunked_req is req
    done = len(getattr(req, "fill_ids", None) or ())
    if str(getattr(sched, "device", "")).startswith("cuda"):
        # under PP the scheduler stream is not the forward stream (scheduler.py:1995-2004) and the PP loops set
        # no WAR barrier: the request's chunks still on the device must finish before its slots are reused
        sched.schedule_stream.wait_stream(sched.forward_stream)
    sched.process_pending_chunked_abort()
    log = _log(log)
    if log is not None and running:
        log.write("chunked_abort", it=LOOP.it, rid=req.rid, computed=done)


def abort_requested(sched, recv_req) -> None:
    """After `abort_request`: the chunked request this AbortReq marked for abort, by SGLang's own test
    (scheduler.py:5676-5678: abort_all, or the chunked request's rid starts with the AbortReq's). The AbortReq
    rides the request relay, so every stage and TP rank marks the same request at the same loop index; only
    such a mark is acted on in `chunked_abort`, never one a rank set alone that was pending meanwhile."""
    chunked = getattr(sched, "chunked_req", None)
    if recv_req is None or chunked is None or getattr(sched, "_pending_chunked_abort_req", None) is not chunked:
        return
    # an empty rid matches every request there, as a None one does (io_struct.py:2295 makes it "")
    if getattr(recv_req, "abort_all", False) or chunked.rid.startswith(getattr(recv_req, "rid", None) or ""):
        sched.sglang_cpp_relayed_abort = chunked


def released(result, log=None) -> None:
    """Observe only: the requests this stage freed, at which loop index."""
    log = _log(log)
    if log is not None and result:
        log.write("release", it=LOOP.it, rids=[r.rid for r in result],
                  rooms=[int(getattr(r, "bootstrap_room", -1) or -1) for r in result], fake=[_is_fake(r) for r in result])
    return None


def kv_chunk(req, last_chunk: bool, log=None) -> None:
    """Observe only: a KV send handed to the transfer engine (the final chunk's from result processing)."""
    log = _log(log)
    if log is not None:
        log.write("kv_chunk", it=LOOP.it, room=int(getattr(req, "bootstrap_room", -1) or -1), rid=req.rid,
                  last=bool(last_chunk))
    return None


def kv_status(bootstrap_room, status, log=None) -> None:
    """Observe only: a transfer status change (the transfer threads call this)."""
    log = _log(log)
    if log is not None:
        log.write("kv_status", it=LOOP.it, room=int(bootstrap_room), status=int(status))
    return None


__all__ = ["transferred_ids", "chunked_abort", "abort_requested", "released", "kv_chunk", "kv_status", "fast_release_ok", "LOOP"]
