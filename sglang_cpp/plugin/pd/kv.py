"""PD disaggregation with PP prefill: the last chunk's KV leaves at the pass after its forward.

SGLang 0.5.23 hands a middle chunk's KV to the transfer engine at the next pass of the PP loop
(`process_prefill_chunk`), but the last chunk's only when that batch's result comes back
(`process_batch_result_disagg_prefill`, P + d - 1 passes after the launch, d = --pp-async-batch-depth):
the final send carries the first output token (the metadata buffer) that decode needs, and a stage other
than the last learns that token only from the ring.

Early send (SGLANG_CPP_PD_EARLY_KV): at the pass after the last chunk ran, each stage hands that chunk's
pages to the transfer engine as a non-final send, the call upstream makes for a middle chunk. It keeps the
prompt's last page back, so the final send at result time carries one page, the state and the metadata;
the sender counts pages (`curr_idx == num_kv_indices`, disaggregation/common/conn.py) and still marks that
send as the last. On a GPU the send waits for the forward's completion event (the transfer worker
synchronizes on `_early_send_wait_event`, as for upstream's early send of a cached prefix). No message
between stages changes, nor the first-token hand-off.

What it saves: the last chunk's KV transfer time, which now overlaps the ring's P + d - 2 passes instead of
following them. Decode still needs every stage's final send (with the first token), so the ring's wait
itself stays; results/pd_ring.md measures both.

Off (upstream's path unchanged) under the staging buffer (its non-final sends must end on its grid),
overlap scheduling (upstream defers middle sends there), attention CP > 1, and for a request still
bootstrapping, aborted, or whose transfer already concluded.
"""
from __future__ import annotations

import logging

from ... import envs

logger = logging.getLogger("sglang_cpp")


class _State:
    def __init__(self):
        self.on: bool | None = None  # decided at the first PD prefill pass, the same on every rank
        self.ran: list = []  # (req, completion event or None) whose last chunk ran in this pass


STATE = _State()


def gate(sched, var, staging: str, overlap: str = "", cp_note: str = "") -> tuple[bool, str]:
    """(on, why not) for a PD prefill switch (this one and pd_ring's fast release): its variable, then the
    server settings it cannot run under, each with the reason. Every input is a server argument or the
    environment: the same on every rank."""
    if not var.get():
        return False, f"{var.name}=0"
    if getattr(sched, "enable_staging", False):
        return False, f"the staging buffer is on ({staging})"
    if overlap and getattr(sched, "enable_overlap", False):
        return False, f"overlap scheduling is on ({overlap})"
    cp = getattr(getattr(sched, "attn_cp_cpu_group", None), "size", lambda: 1)()
    if cp > 1:
        return False, f"attention CP is {cp}{cp_note}"
    return True, ""


def early_kv_ok(sched) -> tuple[bool, str]:
    return gate(sched, envs.PD_EARLY_KV, "its non-final sends must end on its grid",
                overlap="upstream defers middle-chunk sends to result processing")


# Transfer backends whose workers wait on the forward's event before reading the KV an early send names
# (SGLang 0.5.23: mooncake/conn.py:2532-2538; ascend's manager is Mooncake's, ascend/conn.py:95;
# mori/conn.py:625-626); NIXL's add_transfer_request takes the event and drops it (nixl/conn.py:3261-3305), so
# an early send there could ship KV the forward has not written yet. `fake` reads no KV.
EVENT_BACKENDS = ("mooncake", "ascend", "mori", "fake")


def startup_error(disagg) -> str:
    """'' or why SGLANG_CPP_PD_EARLY_KV cannot run on this server's transfer backend (`disagg`: SGLang's
    runtime_context.get_disagg(), the same on every rank): a startup error, not a silent fallback."""
    def name(v) -> str:  # plain strings in 0.5.23's config bag (arg_groups/fields/disagg.py); an enum's value
        return str(getattr(v, "value", v) or "").lower()

    mode = name(getattr(disagg, "disaggregation_mode", "null")) or "null"
    backend = name(getattr(disagg, "disaggregation_transfer_backend", ""))
    if not envs.PD_EARLY_KV.get() or mode != "prefill" or backend in EVENT_BACKENDS:
        return ""
    return (f"SGLANG_CPP_PD_EARLY_KV=1 cannot run with --disaggregation-transfer-backend {backend}: its transfer "
            "worker does not wait on the forward's event before reading the KV (only "
            f"{', '.join(EVENT_BACKENDS[:3])} do), so the last chunk's KV could leave before the forward wrote it. "
            "Unset SGLANG_CPP_PD_EARLY_KV, or use --disaggregation-transfer-backend mooncake")


def decide(sched) -> bool:
    """Once, at the first pass of the PD prefill loop (pd_ring.transferred_ids calls it)."""
    if STATE.on is None:
        STATE.on, why = early_kv_ok(sched)
        logger.info("[sglang-cpp] PD prefill last-chunk KV: %s", "sent at the pass after its forward (the last page "
                    "and the metadata at result time)" if STATE.on else f"sent at result time, as upstream ({why})")
    return STATE.on


def ran(sched, batch) -> None:
    """After a prefill forward on a PD prefill stage: remember the requests whose last chunk it was."""
    if not STATE.on or batch is None or not batch.forward_mode.is_extend():
        return
    event = None
    if sched.device != "cpu":  # an accelerator: the forward may still run when the send is queued
        event = sched.device_module.Event()
        event.record(sched.forward_stream)
    for req in batch.reqs:
        end = getattr(req, "extend_end", None)
        if end is not None and end >= len(req.origin_input_ids) and not req.pending_bootstrap:
            STATE.ran.append((req, event))


def early_end(start: int, total: int, page: int) -> int:
    """The end of the early send: every whole page of the prompt but its last one (0 when nothing beyond
    `start` is left to send early). The final send then holds at least one page, so the sender's page count
    marks it, not this one, as the last."""
    end = ((total - 1) // page) * page
    return end if end > start else 0


def send_ran(sched, it: int, log=None) -> None:
    """At the next pass (loop index `it`): hand each remembered request's pages to the transfer engine, as a
    non-final send."""
    if not STATE.ran:
        return
    from sglang.srt.disaggregation.utils import is_aborted

    todo, STATE.ran = STATE.ran, []
    page = int(sched.token_to_kv_pool_allocator.page_size)
    for req, event in todo:
        sender = getattr(req, "disagg_kv_sender", None)
        if sender is None or req.pending_bootstrap or is_aborted(req) or getattr(sender, "conclude_state", None) is not None:
            continue
        end = early_end(int(req.start_send_idx), len(req.origin_input_ids), page)
        if not end:
            continue
        if event is not None:
            sender._early_send_wait_event = event
        sched.send_kv_chunk(req, last_chunk=False, end_idx=end)
        if log is not None and log.path:
            log.write("kv_early", it=it, rid=req.rid, room=int(getattr(req, "bootstrap_room", -1) or -1), end=end,
                      total=len(req.origin_input_ids))


__all__ = ["STATE", "decide", "early_end", "early_kv_ok", "gate", "ran", "send_ran"]
