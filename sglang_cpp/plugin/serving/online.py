"""Online refinement while serving (SGLANG_CPP_ONLINE, on by default): each stage's logged prefill forwards
refine its cost model, and every rank switches to a refined model at the same point of the request stream.

How the pieces travel, with no collective that one rank could skip:
- samples: each stage's leader (its lowest world rank) sends its single-request forwards to world rank 0
  with non-blocking point-to-point sends on a gloo group of its own (made at startup by every rank);
  world rank 0 polls for them once per scheduler step.
- the fit: world rank 0 only (sglang_cpp.core.refine.Refiner), on a background thread, so the scheduler never
  waits for it; a refit is accepted only if it predicts held-back forwards better than the model in force.
  It starts at most once per prompt that finished on world rank 0: a plan is made once per request, so a
  refit in the middle of a prompt changes nothing sooner, and its thread would hold the GIL against the
  scheduler's own loop for every chunk (2-3 ms of plugin time per step on PP0 while it did).
- the switch: world rank 0 puts the accepted coefficients (a ModelUpdate) into the request list it pulls
  from the tokenizer. That list reaches every TP rank and every later stage in the same scheduler
  iteration it would anyway, and each rank applies the update before it processes the requests that came
  with it. A plan is made once per request, so every stage plans every request on the same model.
- DP attention with local control broadcast (`enable_dp_attention_local_control_broadcast`, forced by
  SGLANG_RUST_SERVER, DWDP and elastic EP; an elastic-EP joiner likewise): control messages stay inside each
  DP group (request_receiver.py:181-191), so world rank 0's update would reach DP group 0 only. World rank 0
  then also sends it to every other DP group's PP0 leader (`relays`), which puts it into the list it pulls
  for its own group: each group switches at one point of its own request stream, on every stage of it.
"""
from __future__ import annotations

import logging
import pickle
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from ...core.costmodel import model_from_dict

logger = logging.getLogger("sglang_cpp")
TAG = 26026  # the sample messages' tag on the side group
UPDATE_TAG = 26027  # world rank 0's model updates to the other DP groups' leaders (local control broadcast)
SEND_EVERY_S = 0.2  # a stage leader ships its samples at most this often (a forward is milliseconds or more)
MAX_SENDS = 64  # sends kept alive before the oldest is waited for


@dataclass
class ModelUpdate:
    """Rides in the request stream from world rank 0; every rank applies it where it meets it."""

    version: int
    model: dict  # PipelineCost.to_dict(): the served model (forward fits, each stage's per-chunk overhead beside)
    overheads: list  # each stage's per-chunk overhead in it (ms per chunk; the per-token part stays the probe's)
    covered: int  # the longest L + x the refined model has seen
    notes: list = field(default_factory=list)
    error: float = 0.0  # its held-back error (Refiner.error): the smallest predicted gain that moves a plan
    measured: list | None = None  # per stage, the chunk-size regimes served forwards measured (Refiner.measured)
    received: list | None = None  # per stage, [received ms at x = 0, ms per token] also charged (the probe's)


class Online:
    def __init__(self, cost, calibration: list[dict], *, rank: int, leaders: list[int],
                 pp_rank: int, log, group=None, dist=None, refine_cfg=None, relays: tuple = ()):
        self.rank, self.leaders, self.pp_rank, self.log = rank, list(leaders), pp_rank, log
        self.relays = tuple(r for r in relays if r != 0)  # the other DP groups' PP0 leaders (local control)
        self.injects = rank == 0 or rank in self.relays  # puts updates into the requests it pulls
        self.group, self.dist = group, dist
        self.is_leader = rank == leaders[pp_rank]
        self.outbox: list = []
        self._backlog: list = []  # samples that came in while the refit thread had the refiner
        self._sends: deque = deque()  # (works, tensors) of recent sends, kept alive until surely delivered
        self._last_send = 0.0
        self._recvs: dict = {}  # source rank -> (work, header tensor)
        self.refiner = None
        self._thread: threading.Thread | None = None
        self._pending: ModelUpdate | None = None
        self._lock = threading.Lock()
        self._due = False  # a prompt finished since the last fit started: the next may start
        if rank == 0:
            from ...core.refine import Refiner

            self.refiner = Refiner(cost, calibration, refine_cfg)  # cost: forward models, overheads beside
            self.covered = max((d["L"] + d["x"] for d in calibration), default=0)
            for src in sorted(set(leaders) - {0}):
                self._post_recv(src)
        elif rank in self.relays:
            self._post_recv(0, UPDATE_TAG)

    # -- every stage leader ------------------------------------------------------------------
    def record(self, L: int, x: int, ms: float) -> None:
        """One single-request prefill forward of this stage (leaders only; cheap: an append)."""
        if self.is_leader:
            self.outbox.append((self.pp_rank, int(L), int(x), float(ms)))

    def record_step(self, loop_ms: float) -> None:
        """One serving step's cost beyond its forward and its waits (steps.py), the per-chunk overhead."""
        if self.is_leader:
            self.outbox.append((self.pp_rank, None, None, float(loop_ms)))

    def prompt_done(self) -> None:
        """A prompt ran its last chunk on this rank (world rank 0: the next refit may start)."""
        self._due = True

    def pump(self) -> None:
        """Once per scheduler step: leaders ship their samples, world rank 0 takes them in and refits."""
        if self.rank == 0:
            self._take(self.outbox)
            self.outbox = []
            self._poll()
            self._maybe_fit()
        else:
            if self.is_leader and self.outbox and time.monotonic() - self._last_send >= SEND_EVERY_S:
                self._send(self.outbox)
                self.outbox = []
            if self.injects:
                self._poll()

    def _send(self, obj, dst: int = 0, tag: int = TAG) -> None:
        """Header (the payload's size) then payload, both non-blocking. gloo's send works never report
        completion without a wait(), so the oldest are waited for only once MAX_SENDS newer ones went out:
        by then the receiver, which drains every scheduler step, has long received them."""
        import torch

        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        head = torch.tensor([data.numel()], dtype=torch.int64)
        works = [self.dist.isend(t, dst=dst, group=self.group, tag=tag) for t in (head, data)]
        self._sends.append((works, (head, data)))
        self._last_send = time.monotonic()
        while len(self._sends) > MAX_SENDS:
            for w in self._sends.popleft()[0]:
                w.wait()

    def _post_recv(self, src: int, tag: int = TAG) -> None:
        import torch

        head = torch.full((1,), -1, dtype=torch.int64)  # -1 until a header lands: gloo's is_completed() is no help
        self._recvs[src, tag] = (self.dist.irecv(head, src=src, group=self.group, tag=tag), head)

    def _poll(self) -> None:
        import torch

        for (src, tag), (work, head) in list(self._recvs.items()):
            if int(head[0]) < 0:
                continue
            work.wait()  # landed: returns at once
            data = torch.empty(int(head[0]), dtype=torch.uint8)
            self.dist.recv(data, src=src, group=self.group, tag=tag)  # sent right after its header
            got = pickle.loads(data.numpy().tobytes())
            if tag == UPDATE_TAG:  # a DP group's leader: world rank 0's update, for its own group's stream
                with self._lock:
                    self._pending = got
            else:
                self._take(got)
            self._post_recv(src, tag)

    # -- world rank 0 ------------------------------------------------------------------------
    def _take(self, samples: list) -> None:
        self._backlog.extend(samples)
        if self._thread is not None and self._thread.is_alive():
            return  # the refit thread reads the refiner: hand it the samples once it is done
        samples, self._backlog = self._backlog, []
        for stage, L, x, ms in samples:
            if L is None:
                self.refiner.add_step(stage, ms)
                continue
            self.covered = max(self.covered, L + x)
            if self.refiner.add(stage, L, x, ms):
                logger.warning("[sglang-cpp] PP%d forwards drift from the cost model: measured / predicted outside "
                               "+-%.0f%% for %d forwards in a row (once per stage); the online refit follows them",
                               stage, 100 * self.refiner.cfg.drift_band, self.refiner.cfg.drift_run)
                self.log.write("drift", stage=stage, L=L, x=x, ms=ms)

    def _maybe_fit(self) -> None:
        if not self._due or self._thread is not None and self._thread.is_alive():
            return
        if not any(st.new >= self.refiner.cfg.min_new and st.held or st.new_steps >= self.refiner.cfg.min_new
                   for st in self.refiner.stages):
            return
        self._due = False
        self._thread = threading.Thread(target=self._fit, name="sglang-cpp-refit", daemon=True)
        self._thread.start()

    def _fit(self) -> None:
        t0, before = time.perf_counter(), self.refiner.version
        notes = self.refiner.refit()
        ms = 1e3 * (time.perf_counter() - t0)  # its cost, in the log
        for n in notes:
            logger.info("[sglang-cpp] online %s (refit thread: %.1f ms)", n, ms)
        if self.refiner.version != before:
            with self._lock:
                self._pending = ModelUpdate(self.refiner.version, self.refiner.model.to_dict(),
                                            [st.overhead.ms for st in self.refiner.stages], self.covered, notes,
                                            self.refiner.error, self.refiner.measured,
                                            [[st.overhead.received_ms, st.overhead.per_token_ms]
                                             for st in self.refiner.stages])

    def take_update(self) -> ModelUpdate | None:
        """The accepted model not yet sent (world rank 0, or a DP group's leader under local control
        broadcast, when it pulls requests): world rank 0 also sends it on to those leaders."""
        with self._lock:
            upd, self._pending = self._pending, None
        if upd is not None and self.rank == 0:
            for dst in self.relays:
                self._send(upd, dst, UPDATE_TAG)
        return upd


def apply(update: ModelUpdate, sizer, batch, log) -> None:
    """Every rank, at the same point of the request stream: plan new requests on the refined model."""
    cost = model_from_dict(update.model, f"online model v{update.version}")
    sizer.set_model(cost, update.error, update.measured)
    sizer.calibrated_len = max(sizer.calibrated_len, int(update.covered))
    if batch is not None:
        batch.cost = cost
    log.write("refit", version=update.version, cost=update.model, overheads_ms=update.overheads,
              received=update.received,
              covered=update.covered, notes=update.notes, error=round(update.error, 5), measured=update.measured)


def side_group(dist, world_size: int):
    """A gloo group of every rank for the samples' point-to-point sends (created by every rank at once)."""
    return dist.new_group(ranks=list(range(world_size)), backend="gloo")


__all__ = ["ModelUpdate", "Online", "apply", "side_group"]
