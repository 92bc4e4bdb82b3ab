"""Batched PP receive (sglang_cpp/plugin/serving/p2p.py) over 2 gloo processes: SGLang's own
GroupCoordinator.send_tensor_dict sends, and the receiver checks upstream's recv_tensor_dict (the
baseline), the batched core, deferred proxy waits (interleaved with later messages on the same
channel), the send-allgather slicing, and the GroupCoordinator hook. Every received dict must equal
what was sent."""
from __future__ import annotations

import os
import socket
import sys
from datetime import timedelta
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from sglang_cpp.plugin.serving import p2p  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _messages() -> list[dict]:
    g = torch.Generator().manual_seed(0)

    def r(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype)

    return [
        {"hidden_states": r(37, 64, dtype=torch.bfloat16), "residual": r(37, 64, dtype=torch.bfloat16),
         "__msg_type__": "proxy"},
        {"next_token_ids": torch.randint(0, 50000, (5,), generator=g), "logprobs": r(5, 3),
         "mask": r(7) > 0, "empty": r(0, 4), "scalar": torch.tensor(3.25, dtype=torch.float64),
         "half": r(3, 2, 2, dtype=torch.float16), "note": {"a": 1, "b": [1, 2]}, "__msg_type__": "output"},
        {"hidden_states": r(1024, 576, dtype=torch.bfloat16), "residual": r(1024, 576, dtype=torch.bfloat16),
         "__msg_type__": "proxy"},
        {"__msg_type__": "output", "__skip__": True},
        {"hidden_states": r(9, 16), "odd": r(3, 3), "__msg_type__": "default"},
    ]


def _assert_same(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for k, v in want.items():
        if isinstance(v, torch.Tensor):
            assert isinstance(got[k], torch.Tensor), k
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
            assert torch.equal(got[k], v), k
        else:
            assert got[k] == v, k


AG = 2  # pretend attn-TP size for the send-allgather case; this pair is attn-TP rank 1


def _worker(rank: int, port: int) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    grp = dist.group.WORLD
    msgs = _messages()
    try:
        if rank == 0:
            _sender(grp, msgs)
        else:
            _receiver(grp, msgs)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _sender(grp, msgs) -> None:
    gc, works = p2p.upstream_coordinator(grp, 0), []

    def send(m, ag=None):
        works.extend(gc.send_tensor_dict(m, dst=1, all_gather_group=ag, async_send=True))

    for m in msgs:  # upstream's receive, then the batched core
        send(m)
    for m in msgs:
        send(m)
    send(msgs[0]); send(msgs[1]); send(msgs[2])  # deferred proxy, output, deferred proxy
    send(msgs[1]); send(msgs[4])  # plain sends, received by upstream's and the batched receive
    rank1_of_ag = SimpleNamespace(world_size=AG, rank_in_group=1)
    send(msgs[1], rank1_of_ag); send(msgs[4], rank1_of_ag)  # send-allgather rows (rank 1 of AG)
    for m in msgs[:3]:  # through the GroupCoordinator hook
        send(m)
    for w in works:  # payloads stay referenced until here (upstream's P2PWork)
        w.work.wait()


def _receiver(grp, msgs) -> None:
    gc = p2p.upstream_coordinator(grp, 1)

    def batched(**kw):
        return p2p.post_tensor_dict_recvs(gc.recv_object(0), 0, grp, grp, **kw)

    for m in msgs:
        _assert_same(gc.recv_tensor_dict(src=0), m)
    for m in msgs:
        got = batched().finish()
        _assert_same(got, m)
        got_ptrs = [v.data_ptr() for v in got.values() if isinstance(v, torch.Tensor)]
        assert len(set(p for p in got_ptrs if p)) == len([p for p in got_ptrs if p])  # distinct buffers

    # Deferred proxies: the output message between them is received while the first proxy's
    # tensors may still be in flight; FIFO matching must keep every buffer in its place.
    p2p._LAUNCH_HOOKED = True
    p2p._PENDING.clear()
    a = p2p.receive(batched())
    assert len(p2p._PENDING) == 1 and a["__msg_type__"] == "proxy"
    _assert_same(p2p.receive(batched()), msgs[1])
    assert len(p2p._PENDING) == 1  # outputs are never deferred
    c = p2p.receive(batched())
    assert len(p2p._PENDING) == 2

    def launch(_self, mb_id, cur_batch, proxy, *rest):
        assert not p2p._PENDING, "forward ran before the deferred receives completed"
        _assert_same(proxy, msgs[0])
        return "ran"

    last = SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True))  # SGLang's _pp_launch_batch arguments:
    assert p2p.Scheduler__pp_launch_batch(launch, last, 0, None, a, [None], None) == "ran"  # no batch rows here
    _assert_same(c, msgs[2])

    _assert_same(gc.recv_tensor_dict(src=0), msgs[1])  # plain sends (AG size 1 path)
    _assert_same(batched().finish(), msgs[4])
    # send-allgather: this rank receives row 1 of each divisible tensor; all_gather must rebuild it.
    for want in (msgs[1], msgs[4]):
        def fake_all_gather(piece, dim=0, _want=want):
            full = next(v for v in _want.values() if isinstance(v, torch.Tensor) and v.numel() == 2 * piece.numel()
                        and torch.equal(v.reshape(AG, -1)[1], piece))
            assert piece.data_ptr() != full.data_ptr()
            return torch.cat([full.reshape(AG, -1)[0], piece], dim=dim)

        posted = batched(all_gather_size=AG, all_gather_rank=1)
        assert not p2p._should_defer(posted)
        got = p2p.receive(posted, fake_all_gather)
        _assert_same(got, want)

    # The GroupCoordinator hook, on upstream's coordinator methods.
    os.environ["SGLANG_CPP_ASYNC_RECV"] = "1"
    tp1 = SimpleNamespace(world_size=1, rank_in_group=0, all_gather=lambda t, dim=0: t)

    def never(*a, **k):
        raise AssertionError("original called with SGLANG_CPP_ASYNC_RECV=1")

    got = [p2p.GroupCoordinator_recv_tensor_dict(never, gc, all_gather_group=tp1) for _ in range(3)]
    assert len(p2p._PENDING) == 2  # the two proxies
    p2p.wait_pending()
    for g, m in zip(got, msgs[:3]):
        _assert_same(g, m)


def test_switch_off_calls_original(monkeypatch):
    monkeypatch.delenv("SGLANG_CPP_ASYNC_RECV", raising=False)
    assert p2p.GroupCoordinator_recv_tensor_dict(lambda self, *a, **k: ("orig", a, k), "gc", 1,
                                                 all_gather_group=None) == ("orig", (1,), {"all_gather_group": None})
    monkeypatch.setenv("SGLANG_CPP_ASYNC_RECV", "0")
    assert p2p.GroupCoordinator_recv_tensor_dict(lambda self, *a, **k: "orig", "gc") == "orig"
    # the launch hook calls the original with SGLang's arguments (and, on a stage with no prefill batch and no
    # proxy, checks and attaches nothing)
    last = SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True))
    assert p2p.Scheduler__pp_launch_batch(lambda self, *a: a, last, 0, None, None, "md", "q") == (0, None, None,
                                                                                               "md", "q")


def test_gathered_or_unhooked_proxies_are_not_deferred(monkeypatch):
    t = torch.zeros(4)
    proxy = p2p.PostedDict({"__msg_type__": "proxy", "h": t}, p2p.PendingRecv(works=[object()], buffers=[t]), [])
    monkeypatch.setattr(p2p, "_LAUNCH_HOOKED", True)
    assert p2p._should_defer(proxy)
    proxy.gathers = [("h", t[2:], t.shape)]
    assert not p2p._should_defer(proxy)  # the all_gather needs the data now
    proxy.gathers = []
    monkeypatch.setattr(p2p, "DEFER_PROXY_WAIT", False)
    assert not p2p._should_defer(proxy)
    monkeypatch.setattr(p2p, "DEFER_PROXY_WAIT", True)
    registry = SimpleNamespace(HookRegistry=SimpleNamespace(_patched=set()))  # no sglang import
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", registry)
    monkeypatch.setattr(p2p, "_LAUNCH_HOOKED", None)
    assert not p2p._should_defer(proxy)  # launch hook not installed: wait before returning
    registry.HookRegistry._patched.add(p2p.LAUNCH_TARGET)
    assert p2p._should_defer(proxy)


def test_hooks_registered():
    from sglang_cpp.plugin import TARGETS, hooks

    fn, kind = TARGETS["sglang.srt.distributed.parallel_state.GroupCoordinator.recv_tensor_dict"]
    assert kind == "AROUND" and getattr(hooks, fn) is p2p.GroupCoordinator_recv_tensor_dict
    fn, kind = TARGETS["sglang.srt.managers.scheduler.Scheduler._pp_launch_batch"]
    assert kind == "AROUND" and getattr(hooks, fn) is p2p.Scheduler__pp_launch_batch


def test_two_process_gloo_roundtrip():
    mp.spawn(_worker, args=(_free_port(),), nprocs=2, join=True)
