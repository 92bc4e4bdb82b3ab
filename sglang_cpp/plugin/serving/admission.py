"""The admission hooks: the scheduler forming a prefill batch, the PrefillAdder sizing each request's first
chunk from its plan (after the device prefix and any HiCache host hit), a continuing chunk keeping its
size, the batch policies' caps; and the queue view every stage shares when it plans (what is in the pipe
ahead, what waits behind)."""
from __future__ import annotations

import functools
import logging

from .. import state
from . import guard
from .batch import slot_loads

logger = logging.getLogger("sglang_cpp")


def Scheduler__get_new_batch_prefill_raw(original, self, *args, **kwargs):
    """Expose the scheduler forming this prefill batch to the PrefillAdder hooks below (its waiting
    queue and KV pool are the batch policy's inputs)."""
    state.FORMING = self
    try:
        return original(self, *args, **kwargs)
    finally:
        state.FORMING = None


def Scheduler_get_num_allocatable_reqs(original, self, running_bs, *args, **kwargs):
    """SGLANG_CPP_EVEN_DECODES: gLLM's even decode split (eq. 4), as admission: the slot being scheduled
    takes new requests only up to its even share of all running and waiting ones (batch.py `slot_loads`)."""
    res = original(self, running_bs, *args, **kwargs)
    slot = getattr(self, "sglang_cpp_slot", None)
    if state.BATCH is None or slot is None:
        return res
    return min(res, state.BATCH.admit_cap(slot_loads(self, slot, running_bs), slot, len(self.waiting_queue)))


_SKIPPED: set = set()  # waiting requests already named in a WARNING (once each)


def _inflight(sched, pp_size: int) -> list:
    """The prefill batches issued in the last pp_size - 1 loop iterations (SGLang's other micro-batch slots,
    oldest first; with pp_async_batch_depth the older slots have left the pipe), each folded into one job
    (prefix of its longest chunk, all its new prompt tokens): one forward per batch. Decode rows (a mixed
    batch's running decodes, DP attention's 1-token extends) are left out. The slot being scheduled is the
    one whose running batch the loop made current (`running_batch is running_mbs[mb_id]`, set before the
    batch is formed in event_loop_pp and event_loop_pp_disagg_prefill alike)."""
    mbs, running = getattr(sched, "mbs", None) or [], getattr(sched, "running_mbs", None) or []
    slot = next((i for i, b in enumerate(running) if b is sched.running_batch), None)
    if slot is None or len(mbs) != len(running):
        return []
    out = []
    for k in range(max(1, len(mbs) - (pp_size - 1)), len(mbs)):
        rows = prefill_rows(mbs[(slot + k) % len(mbs)])
        if rows:
            out.append((max(rows, key=lambda px: px[1])[0], sum(x for _, x in rows)))
    return out


def prefill_rows(b) -> list:
    """(prefix, new prompt tokens) of each prompt row of a prefill batch, [] for any other batch: the rows the
    run-time guard compares (guard.rows_of, one filter for both; a speculative verify batch is no prefill)."""
    return [(p, x) for _, p, x in guard.rows_of(b) or ()]


def _queue_view(sched, rid: str, pp_size: int):
    """What every stage shares when it plans request `rid` at this loop index (core/queue_plan.py): the
    prefill batches still in the pipe ahead of it (`_inflight`) and the requests waiting behind it in the
    scheduler's order (`waiting_queue`, sorted by calc_priority before the adder runs; the requests after
    `rid` when it is still there, at its first chunk), up to MAX_WAITING, each with the prefix SGLang last
    matched for it (under FCFS, SGLang 0.5.23 matches a waiting request only when it is admitted, so a new
    arrival counts as uncached until then: the same on every rank). A waiting request that cannot be planned
    (longer than the context) is left out with one WARNING naming it."""
    from itertools import islice

    from ...core.queue_plan import MAX_WAITING, QueueView

    queue = getattr(sched, "waiting_queue", None) or []
    chunked = getattr(sched, "chunked_req", None)
    start = 0
    if chunked is None or chunked.rid != rid:  # a first chunk: the request is still in the queue
        start = next((i + 1 for i, r in enumerate(queue) if r.rid == rid), 0)
    waiting, ids = [], []
    ctx = int(sched.model_config.context_len)
    for req in islice(queue, start, None):
        if len(waiting) >= MAX_WAITING:
            break
        n = len(req.origin_input_ids) + len(getattr(req, "output_ids", None) or ())  # a retracted one re-prefills
        p = min(int(req.prefix_len or 0) + int(getattr(req, "host_hit_length", 0) or 0), max(n - 1, 0))
        if not 1 <= n <= ctx:
            if req.rid not in _SKIPPED:
                _SKIPPED.add(req.rid)
                logger.warning("[sglang-cpp] PP%d queue-aware plan leaves out waiting request rid=%s: its %d-token "
                               "prompt is outside [1, the context length %d]", state.PP_RANK, req.rid, n, ctx)
            continue
        waiting.append((n, p))
        ids.append(req.rid)
    while len(_SKIPPED) > 4096:
        _SKIPPED.pop()
    return QueueView(tuple(_inflight(sched, pp_size)), tuple(waiting), tuple(ids))


def _waiting_tokens(sched) -> int:
    """gLLM's #WP: prompt tokens not yet prefilled, over the waiting queue and the chunked request
    (replicated state: the same on every rank)."""
    total = sum(len(r.origin_input_ids) for r in sched.waiting_queue)
    req = sched.chunked_req
    if req is not None:
        total += max(len(req.full_untruncated_fill_ids) - req.prefix_len, 0)
    return total


def PrefillAdder_init(result, self, *args, **kwargs):
    """A continuing planned chunk keeps its size: upstream's __init__ took the mixed-chunk decode tokens
    out of rem_chunk_tokens (the plan's predict() became its chunk budget), they go back up to the
    forward's --max-prefill-tokens room (rem_input_tokens). With a batch
    policy, cap this micro-batch's prefill tokens at its budget (gllm) or start its ms budget."""
    bound = _adder_signature().bind(self, *args, **kwargs)
    mixed = int(bound.arguments.get("num_mixed_decode_tokens") or 0)
    sched, policy = state.FORMING, state.BATCH
    if sched is None:
        return None
    if state.ACTIVE is not None and sched.chunked_req is not None and mixed and self.rem_chunk_tokens is not None:
        # the planned next chunk is the request's own tokens, within the forward's room (first_chunk_limit)
        self.rem_chunk_tokens = max(min(self.rem_chunk_tokens + mixed, self.rem_input_tokens), 1)
    if policy is None:
        return None
    free = sched.token_to_kv_pool_allocator.available_size() + sched.tree_cache.evictable_size()
    cap = policy.start_batch(_waiting_tokens(sched), int(sched.max_total_num_tokens) - int(free),
                             pending=sched.chunked_req is not None, page=max(1, int(self.page_size)))
    if cap is not None and policy.cfg.policy == "gllm":
        self.rem_input_tokens = min(self.rem_input_tokens, cap)
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens = min(self.rem_chunk_tokens, cap)
    return None


def _time_limit(adder, req, prefix: int) -> bool:
    """The time policy: cap rem_chunk_tokens at the tokens of `req` that fit the ms left. False when the
    budget is spent and the batch already holds work (the request waits for the next micro-batch)."""
    policy = state.BATCH
    if policy is None or policy.ms_left is None or adder.rem_chunk_tokens is None:
        return True
    if policy.ms_left <= 0 and adder.can_run_list:
        return False
    remaining = len(req.full_untruncated_fill_ids) - prefix
    if remaining <= 0:
        return True
    page = max(1, int(adder.page_size))
    x = policy.chunk_for(req.rid, prefix, remaining, page)
    adder.rem_chunk_tokens = min(adder.rem_chunk_tokens, x if x < remaining else -(-remaining // page) * page)
    return True


def PrefillAdder_add_chunked_req(original, self, req, *args, **kwargs):
    """The time policy sizes the continuing chunk of a chunked request too (over its own prefix)."""
    _time_limit(self, req, req.prefix_len)
    return original(self, req, *args, **kwargs)


@functools.cache
def _adder_signature():
    import inspect

    from sglang.srt.managers.schedule_policy import PrefillAdder

    return inspect.signature(inspect.unwrap(PrefillAdder.__init__))


def first_chunk_limit(chunk: int | None, remaining: int, static_limit: int, page_size: int,
                      room: int | None = None) -> int:
    """rem_chunk_tokens for a request's first chunk. A planned cut keeps its size; a chunk that ends the
    prompt is rounded up to a page (SGLang compares the page-ceiled length with the limit, so the bare
    remainder would leave a sub-page pass). `room` is what the forward has left under
    --max-prefill-tokens once --enable-mixed-chunk's decode tokens are in (the adder's rem_input_tokens):
    the cut never exceeds it, but is otherwise not shrunk by the decodes (deducting them from a
    2-token final piece under 2 decodes made a 0-token extend, fatal in the forward)."""
    if chunk is None:
        return static_limit
    cap = chunk if room is None else max(min(chunk, room), 1)
    if chunk < remaining:
        return cap
    page = max(1, page_size)
    ceiled = -(-remaining // page) * page
    return max(static_limit, ceiled if room is None else max(min(ceiled, room), 1))


def PrefillAdder_add_one_req(original, self, req, *args, **kwargs):
    """Size a request's first chunk from its plan (upstream always uses the static C here). The plan
    starts where SGLang's admission does: after the device prefix and any HiCache host hit. The time
    batch policy then caps it at what fits the micro-batch's ms left."""
    from sglang.srt.managers.schedule_policy import AddReqResult

    sizer = state.ACTIVE
    has_chunked = kwargs.get("has_chunked_req", args[0] if args else False)
    host_hit = int(getattr(req, "host_hit_length", 0) or 0)
    prefix = req.prefix_len + host_hit
    if host_hit and state.LOG is not None:  # HiCache: this prefix is loaded back from the host tier
        state.LOG.write("host_hit", rid=req.rid, device_prefix=int(req.prefix_len), host_hit=host_hit)
    if not (sizer is None or self.rem_chunk_tokens is None or self.can_run_list or has_chunked):
        prompt_len = len(req.full_untruncated_fill_ids)
        remaining = prompt_len - prefix
        if remaining > 0:
            chunk = sizer.decide(req.rid, prompt_len, prefix, first=True)
            self.rem_chunk_tokens = first_chunk_limit(chunk, remaining, self.rem_chunk_tokens, self.page_size,
                                                      self.rem_input_tokens)
    if not _time_limit(self, req, prefix):
        return AddReqResult.OTHER
    return original(self, req, *args, **kwargs)
