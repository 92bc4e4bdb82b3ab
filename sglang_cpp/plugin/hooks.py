"""SGLang hooks, each named after the SGLang symbol it wraps (`Class_method`), so that an SGLang upgrade
touches the plugin folder only. This module is the namespace `register()` reads TARGETS' names from: the
hooks live in the sub-wings by when they run (startup/, serving/, pd/, compat/)
and the request relay and PD observers here. sglang is imported lazily: this module loads in every process."""
from __future__ import annotations

from .pd import ring as pd_ring
from . import state
from .serving import arrivals, steps
from .serving.admission import (  # noqa: F401 (hooks)
    PrefillAdder_add_chunked_req,
    PrefillAdder_add_one_req,
    PrefillAdder_init,
    Scheduler__get_new_batch_prefill_raw,
    Scheduler_get_num_allocatable_reqs,
    first_chunk_limit,
)
from .compat.attention import TorchNativeAttnBackend__run_sdpa_forward_extend  # noqa: F401 (hook)
from .compat.cpu import (  # noqa: F401 (hooks)
    L2TransferEngine_init_cpu,
    MHATokenToKVPoolHost_backup_from_device_all_layer,
    MHATokenToKVPoolHost_init_cpu,
    MooncakeKVSender_init_cpu,
    TorchNativeAttnBackend_init_cpu,
    alloc_with_host_register_cpu,
)
from .serving.forwards import (  # noqa: F401 (hooks)
    EPLBManager_rebalance,
    ModelRunner_forward,
    Scheduler_get_next_batch_to_run,
    Scheduler_on_idle,
    Scheduler_run_batch,
)
from .compat.hicache_file import HiCacheFile_init  # noqa: F401 (hook)
from .serving.p2p import GroupCoordinator_recv_tensor_dict, Scheduler__pp_launch_batch  # noqa: F401 (hooks)
from .startup.install import (  # noqa: F401 (hooks)
    DynamicChunkSizer_profile_and_fit,
    Scheduler_maybe_init_dynamic_chunk_sizer,
    get_pp_indices,
)
from .serving.steps import CLOCK, Scheduler__pp_commit_comm_work, Scheduler__pp_recv_typed_dict  # noqa: F401 (hooks)


def SchedulerRequestReceiver__pull_raw_reqs(original, self, *args, **kwargs):
    """AROUND the request pull, every scheduler step on every rank: online refinement moves its samples to
    world rank 0, which puts an accepted model into the requests it pulls from the tokenizer (online.py).
    On a later stage the pull is a blocking receive from the previous stage: a wait on a peer (serving/steps.py)."""
    if state.PP_RANK:
        t0 = steps.clock()
        try:
            out = original(self, *args, **kwargs)
        finally:
            CLOCK.blocked += steps.clock() - t0
    else:
        out = original(self, *args, **kwargs)
    online = state.ONLINE
    if online is not None:
        online.pump()
        if online.injects and isinstance(out, list):
            upd = online.take_update()
            if upd is not None:
                out.append(upd)
    if not state.PP_RANK and isinstance(out, list) and out and arrivals.stamping():
        arrivals.stamp(out)  # PP0's leader pulled these from the tokenizer: their arrival stamp (arrivals.py)
    return out


def Scheduler_process_input_requests(original, self, recv_reqs, *args, **kwargs):
    """AROUND: a refined cost model that came with these requests is applied, and their arrival stamps feed
    the load estimate, before they are processed, on every rank alike; SGLang never sees either. The list
    itself, which later stages receive, keeps both."""
    from .serving.online import ModelUpdate, apply

    if recv_reqs and any(isinstance(r, ModelUpdate) for r in recv_reqs):
        for r in recv_reqs:
            if isinstance(r, ModelUpdate) and state.ACTIVE is not None:
                apply(r, state.ACTIVE, state.BATCH, state.LOG)
        recv_reqs = [r for r in recv_reqs if not isinstance(r, ModelUpdate)]
    if recv_reqs:
        sizer = state.ACTIVE
        pp_size = int(getattr(getattr(sizer, "cfg", None), "pp_size", 1) or 1)
        recv_reqs = arrivals.take(self, recv_reqs, getattr(sizer, "arrivals", None), pp_size, state.LOG)
    return original(self, recv_reqs, *args, **kwargs)


def MooncakeKVSender_send(result, self, kv_indices, *args, **kwargs):
    """Observe only: one `kv_send` event per KV transfer a prefill rank hands to Mooncake (with a
    decision log file), so a test or a user can count transfers per request (one per chunk)."""
    log = state.LOG
    if log is not None and log.path:
        log.write("kv_send", room=int(getattr(self, "bootstrap_room", -1)), pages=int(len(kv_indices)))
    return None


def Scheduler__pp_pd_get_prefill_transferred_ids(original, self):
    """PD prefill, PP > 1: the release ring's forward pass, once per loop index (plugin/pd/ring.py: the
    index count and, with SGLANG_CPP_PD_FAST_RING, the fast release)."""
    return pd_ring.transferred_ids(original, self, state.LOG)


def Scheduler_process_prefill_chunk(original, self, *args, **kwargs):
    """AROUND, every pass of a PD prefill loop: an abort pending on the chunked request stops it first, at one
    loop index on every stage (pd_ring.chunked_abort; SGLang's PD PP loop never did)."""
    pd_ring.chunked_abort(self, state.LOG)
    return original(self, *args, **kwargs)


def Scheduler_abort_request(result, self, recv_req=None, *args, **kwargs):
    """AFTER: note the chunked request an AbortReq from the request relay marked (pd_ring.abort_requested)."""
    pd_ring.abort_requested(self, recv_req if recv_req is not None else kwargs.get("recv_req"))
    return None


def Scheduler_process_disagg_prefill_inflight_queue(result, self, *args, **kwargs):
    """Observe only: a `release` event, the requests this stage freed (pd/ring.py)."""
    pd_ring.released(result, state.LOG)
    return None


def Scheduler_send_kv_chunk(result, self, req, last_chunk: bool = False, *args, **kwargs):
    """Observe only: a `kv_chunk` event per KV send handed to the transfer engine (pd/ring.py)."""
    pd_ring.kv_chunk(req, last_chunk, state.LOG)
    return None


def CommonKVManager_update_status(result, self, bootstrap_room, status, *args, **kwargs):
    """Observe only: a `kv_status` event per transfer status change (pd/ring.py)."""
    pd_ring.kv_status(bootstrap_room, status, state.LOG)
    return None
