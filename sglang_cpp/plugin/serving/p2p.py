"""Batched (really asynchronous) receive of PP tensor dicts: `SGLANG_CPP_ASYNC_RECV=1`.

Upstream (SGLang 0.5.23, `GroupCoordinator.recv_tensor_dict`): receive the pickled metadata
(`recv_object`: an int64 size, then the bytes), then for each tensor `torch.empty` + `irecv(...).wait()`,
one after the other. Sends are async (`isend`, `P2PWork` handles committed later), receives are not
("fake async", SGLang issue #19582). On CPU/gloo this costs more than it looks: gloo's unbound-buffer
P2P is a rendezvous (gloo/transport/tcp/pair.cc: a send leaves only once the peer's NOTIFY_RECV_READY
arrived), so every serial `irecv().wait()` pays a notify round trip plus its transfer, with nothing
else in flight, and the sender's "async" send is blocked until the receiver gets there.

What this module does when the switch is on (`GroupCoordinator_recv_tensor_dict`, AROUND hook):
  1. receive the metadata exactly like upstream (`self.recv_object(src)`, same group, same tag);
  2. allocate every buffer and post ALL the `torch.distributed.irecv`s of the message at once, on the
     same group/src/tag upstream uses per tensor (cpu_group for CPU tensors, device_group otherwise),
     in metadata order. P2P matching is FIFO per (peer, group, tag) in gloo and NCCL, and the sender
     issued its sends in the same order, so the receive buffers are matched exactly as upstream's;
  3. keep every buffer referenced (`PendingRecv.buffers`, besides the returned dict) until its handle
     has been waited;
  4. wait:
     - "proxy" messages (`__msg_type__ == "proxy"`, the hidden_states/residual a stage forwards) with
       no attn-TP all-gather: the wait is DEFERRED to the forward. The dict is returned with the
       tensors still in flight and registered in `_PENDING`; the AROUND hook on
       `Scheduler._pp_launch_batch` (`Scheduler__pp_launch_batch`) waits every pending receive
       before `run_batch` reads them. The only consumer of a proxy dict is that forward
       (`_pp_recv_proxy_tensors` -> `PPProxyTensors(dict)` -> `_pp_launch_batch` -> `run_batch`;
       a proxy stashed in `_pp_tensor_dict_inbox` while an output was expected also ends there),
       so between the receive and the forward the transfer overlaps the rest of the iteration:
       with --pp-async-batch-depth > 0 that is the whole output exchange of the previous
       microbatch (`_pp_commit_send_output_work_and_preprocess_output_tensors`), and always
       `_pp_commit_proxy_send_work`. Receives posted later on the same channel (the next message's
       metadata) queue behind the pending ones (FIFO), so deferral cannot mis-match a message.
       On GPUs (NCCL, where wait() only orders streams) the wait is issued under the scheduler's
       `forward_stream_ctx`, i.e. it orders the stream `run_batch` runs on after the receives.
       Deferral is used only once the `_pp_launch_batch` hook is known to be installed
       (`HookRegistry._patched`); otherwise proxies are waited before returning (batched mode).
     - every other message ("output", untyped, ...): all handles are waited before returning, so
       the caller sees a complete dict (batched mode: one wait for the whole message instead of
       per-tensor round trips).
  The attn-TP "send-allgather" branch (all_gather_group with world_size > 1 and numel divisible
  by it) is handled exactly like upstream: the buffer's row `reshape(ag_size, -1)[ag_rank]` is
  received, and after ALL waits each such tensor is `all_gather_group.all_gather(slice, dim=0)`-ed
  and reshaped, in metadata order -- the same sequence of collectives as upstream on every attn-TP
  rank. Such messages are never deferred (the collective needs the data). With world_size == 1
  upstream's all_gather returns its input, so the full buffer is received directly (same values,
  same shape, contiguous).

Why the irecvs are not posted BEFORE the metadata arrives (the simulator's `recv_mode="batched"`
idealisation, the benchmark's "posted-early" mode): it cannot be made exactly correct without a
protocol change. The size tensor, the pickled metadata and (on CPU) the tensors share one gloo
channel, matched FIFO and by exact byte count: a pre-posted receive must know the next message's
metadata length and every tensor's shape. Proxy and output messages interleave on the channel in an
order the receiver does not know in advance, chunk sizes change every chunk (and decode batch sizes
every step), and a mismatched gloo receive raises while a mismatched NCCL receive is undefined /
hangs -- neither can be cancelled. Doing it exactly would need the sender to announce the next
layout (or fixed max-size buffers), or a dedicated receiver thread owning the PP channel; both are
deeper changes than an out-of-tree hook.

Mapping to sglang_cpp/whatif/simulator.py: `recv_mode="serial"` is upstream (switch off). With the switch on,
a proxy transfer still starts only when the receiving stage reaches `_pp_recv_proxy_tensors` for that
chunk (its metadata must be read first), i.e. after its previous forward: on CPU (synchronous
forwards) it cannot overlap the receiver's previous compute, so the simulator's "serial" timing
applies with a smaller per-message comm time (no per-tensor round trips) minus whatever the deferred
wait hides behind the output exchange. `recv_mode="batched"` (pre-posted, overlapping the receiver's
compute) is the upper bound measured by the benchmark's posted-early mode; on GPUs, where forwards
are launched asynchronously and NCCL waits do not block the CPU, the receive is posted while the
previous forward still runs, which is close to it.

Send side (unchanged): `send_tensor_dict(async_send=True)` returns `P2PWork(work, payload)` for the
size tensor, the pickled-metadata tensor (`torch.frombuffer` keeps the bytes object alive) and each
sent tensor (the send-allgather slice is a view that keeps the base storage alive). The scheduler
keeps those lists (`send_proxy_work`, `send_output_work`, `send_req_work`) until
`_pp_commit_comm_work` waits and clears them, so no send buffer is freed or reused while in flight.

The core (`post_tensor_dict_recvs`, `receive`) is plain torch.distributed (process groups, global
ranks); tests and benchmarks/p2p_overlap.py send and receive the baseline with SGLang's own
GroupCoordinator methods on a stand-in (`upstream_coordinator`).
"""
from __future__ import annotations

import logging
import time
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

logger = logging.getLogger("sglang_cpp")

LAUNCH_TARGET = "sglang.srt.managers.scheduler.Scheduler._pp_launch_batch"
DEFER_PROXY_WAIT = True  # defer proxy waits to the forward when the launch hook is installed
_LAUNCH_HOOKED: Optional[bool] = None  # cached HookRegistry check (None: not looked yet)
_PENDING: deque = deque()  # PendingRecv of deferred proxy messages, oldest first
STATS = {"messages": 0, "tensors": 0, "deferred": 0, "wait_s": 0.0}
_ANNOUNCED = False


@dataclass
class PendingRecv:
    """Posted receives of one message: the handles and the buffers they write into."""

    works: List[Any] = field(default_factory=list)
    buffers: List[torch.Tensor] = field(default_factory=list)  # kept alive until wait()

    def wait(self) -> None:
        t0 = time.perf_counter()
        for w in self.works:
            w.wait()
        STATS["wait_s"] += time.perf_counter() - t0
        self.works.clear()
        self.buffers.clear()

    @property
    def done(self) -> bool:
        return not self.works


@dataclass
class PostedDict:
    """A tensor dict whose receives are posted: `tensor_dict` holds the (possibly in-flight) buffers."""

    tensor_dict: Dict[str, Any]
    pending: PendingRecv
    gathers: List[Tuple[str, torch.Tensor, torch.Size]]  # (key, received slice, full shape)

    def finish(self, all_gather: Optional[Callable[..., torch.Tensor]] = None) -> Dict[str, Any]:
        """Wait every receive, then run the send-allgather all_gathers in metadata order."""
        self.pending.wait()
        for key, piece, shape in self.gathers:
            self.tensor_dict[key] = all_gather(piece, dim=0).reshape(shape)
        self.gathers = []
        return self.tensor_dict


def _is_meta(value: Any, meta_types: tuple) -> bool:
    return isinstance(value, meta_types)


# ---------------------------------------------------------------- receive core
def post_tensor_dict_recvs(metadata_list: Sequence, src: int, group, metadata_group=None,
                           all_gather_size: int = 1, all_gather_rank: int = 0,
                           meta_types: tuple | None = None) -> PostedDict:
    """Allocate the buffers of a received metadata list and post all their irecvs at once.

    `src` is a global rank; `group` carries device tensors, `metadata_group` CPU ones (upstream's
    device_group / cpu_group). Nothing is waited: call `.finish()` (or `.pending.wait()`)."""
    metadata_group = group if metadata_group is None else metadata_group
    meta_types = _sglang_meta_types() if meta_types is None else meta_types
    tensor_dict: Dict[str, Any] = {}
    pending = PendingRecv()
    gathers: List[Tuple[str, torch.Tensor, torch.Size]] = []
    for key, value in metadata_list:
        if not _is_meta(value, meta_types):
            tensor_dict[key] = value
            continue
        tensor = torch.empty(value.size, dtype=value.dtype, device=value.device)
        tensor_dict[key] = tensor
        if tensor.numel() == 0:
            continue  # upstream skips empty tensors (the sender does too)
        target = tensor
        if all_gather_size > 1 and tensor.numel() % all_gather_size == 0:
            target = tensor.reshape(all_gather_size, -1)[all_gather_rank]
            gathers.append((key, target, tensor.shape))
        comm_group = metadata_group if target.is_cpu else group
        pending.works.append(dist.irecv(target, src=src, group=comm_group))
        pending.buffers.append(tensor)
    STATS["messages"] += 1
    STATS["tensors"] += len(pending.works)
    return PostedDict(tensor_dict, pending, gathers)


def upstream_coordinator(group, rank_in_group: int, ranks: Sequence[int] = (0, 1)):
    """SGLang's own GroupCoordinator P2P methods (send_object, recv_object, send_tensor_dict,
    recv_tensor_dict) bound to a stand-in over a plain process group: the benchmark and the tests
    drive upstream's real wire protocol with it, with no SGLang parallel state to initialise."""
    import functools
    from types import SimpleNamespace

    from sglang.srt.distributed.parallel_state import GroupCoordinator

    gc = SimpleNamespace(world_size=len(ranks), rank_in_group=rank_in_group, ranks=list(ranks),
                         device_group=group, cpu_group=group)
    for name in ("send_object", "recv_object", "send_tensor_dict", "recv_tensor_dict"):
        setattr(gc, name, functools.partial(getattr(GroupCoordinator, name), gc))
    return gc


def wait_pending() -> None:
    """Wait every deferred receive (oldest first)."""
    while _PENDING:
        _PENDING.popleft().wait()


def _launch_hooked() -> bool:
    global _LAUNCH_HOOKED
    if not _LAUNCH_HOOKED:
        try:
            from sglang.srt.plugins.hook_registry import HookRegistry

            _LAUNCH_HOOKED = LAUNCH_TARGET in getattr(HookRegistry, "_patched", ())
        except Exception:  # noqa: BLE001 - no sglang / older registry: never defer
            _LAUNCH_HOOKED = False
    return bool(_LAUNCH_HOOKED)


def _should_defer(posted: PostedDict) -> bool:
    return (DEFER_PROXY_WAIT and not posted.gathers and not posted.pending.done
            and posted.tensor_dict.get("__msg_type__") == "proxy" and _launch_hooked())


def receive(posted: PostedDict, all_gather: Optional[Callable] = None) -> Dict[str, Any]:
    """Defer a proxy message's wait to the next forward, or wait now; return the dict."""
    if _should_defer(posted):
        _PENDING.append(posted.pending)
        STATS["deferred"] += 1
        return posted.tensor_dict
    return posted.finish(all_gather)


# ---------------------------------------------------------------- SGLang hooks
def _announce() -> None:
    global _ANNOUNCED
    if not _ANNOUNCED:
        _ANNOUNCED = True
        logger.info("[sglang-cpp] async PP recv on: all irecvs of a message posted at once; "
                    "proxy waits deferred to the forward: %s", DEFER_PROXY_WAIT and _launch_hooked())


def GroupCoordinator_recv_tensor_dict(original, self, *args, **kwargs):
    """AROUND GroupCoordinator.recv_tensor_dict(src=None, all_gather_group=None)."""
    from ... import envs

    if not envs.ASYNC_RECV.get():
        return original(self, *args, **kwargs)
    return _recv_tensor_dict_coordinator(self, *args, **kwargs)


def _sglang_meta_types() -> tuple:
    """The class upstream's isinstance check uses (tests without sglang replace this)."""
    from sglang.srt.distributed.parallel_state import TensorMetadata as SglMeta

    return (SglMeta,)


def _recv_tensor_dict_coordinator(self, src: Optional[int] = None, all_gather_group=None):
    if not dist.is_initialized() or self.world_size == 1:
        return None
    _announce()
    ag_size = 1 if all_gather_group is None else all_gather_group.world_size
    ag_rank = 0 if all_gather_group is None else all_gather_group.rank_in_group
    if src is None:
        src = (self.rank_in_group - 1) % self.world_size
    assert src < self.world_size, f"Invalid src rank ({src})"
    meta = self.recv_object(src=src)
    posted = post_tensor_dict_recvs(meta, self.ranks[src], self.device_group, self.cpu_group,
                                    ag_size, ag_rank, meta_types=_sglang_meta_types())
    out = receive(posted, None if all_gather_group is None else all_gather_group.all_gather)
    if STATS["messages"] in _REPORT_AT:  # the path is observable: a log line at 16, 256, 4096 messages
        logger.info("[sglang-cpp] async PP recv: %d messages, %d tensors, %d proxy waits deferred to the forward, "
                    "%.3f s waited", STATS["messages"], STATS["tensors"], STATS["deferred"], STATS["wait_s"])
    return out


_REPORT_AT = frozenset({16, 256, 4096})


def Scheduler__pp_launch_batch(original, self, mb_id, cur_batch, pp_proxy_tensors, *args, **kwargs):
    """AROUND Scheduler._pp_launch_batch: complete deferred proxy receives before the forward; the run-time
    guard (guard.py): a later stage checks the chunks it cuts against the rows the previous stage sent with
    the proxy, and every stage but the last sends its own rows on with its proxy."""
    from . import guard
    from .. import state

    if _PENDING:
        # GPU: the NCCL wait makes the forward stream (which runs run_batch) wait for the receives.
        # `forward_stream_ctx` is re-entered sequentially each iteration upstream too; CPU: a no-op.
        ctx = getattr(self, "forward_stream_ctx", None)
        with ctx if ctx is not None else nullcontext():
            wait_pending()
    if state.ACTIVE is None:  # the policy off (or no dynamic chunking): the plugin only observes
        return original(self, mb_id, cur_batch, pp_proxy_tensors, *args, **kwargs)
    rows = guard.rows_of(cur_batch)
    if pp_proxy_tensors is not None:  # every stage after the first
        guard.check(pp_proxy_tensors, rows, state.PP_RANK)
    out = original(self, mb_id, cur_batch, pp_proxy_tensors, *args, **kwargs)
    if not self.pp_group.is_last_rank:
        guard.attach(out[0], rows)
    return out
