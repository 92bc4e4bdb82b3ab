"""The decision log: one JSON line per event a stage decides or measures (SGLANG_CPP_DECISION_LOG), per-
decision lines at DEBUG and one INFO line per request, from one rank per request stream (every stage plans alike).

Why buffered: with a log path set, the scheduler writes a line on its hot path (every forward, decode
step, micro-batch budget and admission cap). A server's log (`buffer_lines` > 0) keeps those lines in
memory and hands them over in one piece: when the buffer is full, when any other event is written (startup,
decisions, refits: what tools wait for), when a request's prompt has run its last chunk, when a scheduling
pass plans no batch (idle, or an empty micro-batch slot under PP), and at exit. So a line a reader looks
for after a request is on disk, and a busy server hands over one piece per `buffer_lines` forwards.

Why a writer thread: a server's log (`buffer_lines` > 0) is written and flushed on one daemon thread per
process (`_WRITER`), in the order the pieces were handed over, never on the scheduler's thread (nor, for `kv_status`, on a KV
transfer thread holding the log's lock). At exit the thread is drained. The reader is files.read_events.
"""
from __future__ import annotations

import atexit
import json
import logging
import queue
import threading
import time
import weakref
from collections import OrderedDict

logger = logging.getLogger("sglang_cpp")

# the events written on the scheduler's hot path: these wait in the buffer, every other event flushes it
HOT = frozenset({"forward", "decode_forward", "step", "batch", "batch_chunk", "admit_cap"})
_BUFFERED: "weakref.WeakSet[DecisionLog]" = weakref.WeakSet()


class _Writer:
    """The one thread that writes every decision log of this process, piece by piece, in order."""

    def __init__(self):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = None
        self._start = threading.Lock()

    def put(self, log: "DecisionLog", lines: str) -> None:
        if self._thread is None:
            with self._start:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="sglang-cpp-decision-log", daemon=True)
                    self._thread.start()
        self._q.put((log, lines))

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until every piece handed over so far is written (True), at most `timeout` seconds."""
        if self._thread is None:
            return True
        done = threading.Event()
        self._q.put((None, done))
        return done.wait(timeout)

    def _run(self) -> None:
        while True:
            log, lines = self._q.get()
            try:
                if log is None:
                    lines.set()
                else:
                    log._write_file(lines)
            except Exception as exc:  # noqa: BLE001  the thread outlives any one bad piece
                logger.warning("[sglang-cpp] decision log writer: %s: %s", type(exc).__name__, exc)


_WRITER = _Writer()


@atexit.register
def _flush_all() -> None:
    for log in list(_BUFFERED):
        log.flush()
    _WRITER.drain()


class DecisionLog:
    """An optional JSONL file (SGLANG_CPP_DECISION_LOG; `{rank}` expands to the world rank, `{pp_rank}`
    and `{tp_rank}` to this process's). With `buffer_lines`, hot-path events are buffered (module doc)."""

    def __init__(self, pp_rank: int, path: str = "", tp_rank: int = 0, rank: int | None = None,
                 max_open: int = 4096, buffer_lines: int = 0, speaks: bool | None = None):
        self.pp_rank = pp_rank
        rank = pp_rank if rank is None else rank
        # the console lines (one per request, the extrapolation warning): one rank per request stream, world rank 0
        # by default (the server: each DP group's leader on the first stage, install.py)
        self.speaks = rank == 0 if speaks is None else bool(speaks)
        self.path = (path.replace("{rank}", str(rank)).replace("{pp_rank}", str(pp_rank))
                     .replace("{tp_rank}", str(tp_rank))) if path else ""
        self._lock = threading.Lock()
        self._open: OrderedDict[str, list] = OrderedDict()  # rid -> [first prefix, chunks], until the last
        self._max_open = max_open
        self.finished: OrderedDict[str, dict] = OrderedDict()  # rid -> its whole plan, until it has run
        self._fh = None
        self._buf: list[str] = []
        self.buffer_lines = buffer_lines
        if buffer_lines and self.path:
            _BUFFERED.add(self)

    def write(self, event: str, **rec) -> None:
        rec = {"event": event, "pp_rank": self.pp_rank, "t": round(time.time(), 6), **rec}
        if event == "decision":
            self._summarise(rec)
        if self.path:
            line = json.dumps(rec) + "\n"
            with self._lock:
                self._buf.append(line)
                if event not in HOT or len(self._buf) >= self.buffer_lines:
                    self._flush_locked()

    def flush(self) -> None:
        """Hand the buffered lines over now (a request's end, an idle pass, exit)."""
        if self._buf:
            with self._lock:
                self._flush_locked()

    def _flush_locked(self) -> None:
        lines, self._buf = "".join(self._buf), []
        if lines and self.path:
            if self.buffer_lines:  # a server's log: written off the scheduler's thread
                _WRITER.put(self, lines)
            else:  # tools and tests: line by line, on the caller's thread
                self._write_file(lines)

    def _write_file(self, lines: str) -> None:
        """A server's log: on the writer thread; a tool's: on its caller's."""
        if not self.path:
            return
        try:
            if self._fh is None:  # opened once: no open() per line on the scheduler's path
                self._fh = open(self.path, "a")
            self._fh.write(lines)
            self._fh.flush()
        except OSError as exc:  # a full disk or a vanished folder must not take the server down
            logger.warning("[sglang-cpp] PP%d decision log %s: %s; no more lines are written to it",
                           self.pp_rank, self.path, exc.strerror or exc)
            self.path, self._fh = "", None

    def probe(self) -> str:
        """'' when this rank can append to its log file; else the error, naming the file and the fix (the
        rank agreement fails every rank with it, at startup, not at the first write on one node)."""
        if not self.path:
            return ""
        try:
            with open(self.path, "a"):
                pass
        except OSError as exc:
            return (f"SGLANG_CPP_DECISION_LOG: cannot write {self.path} ({exc.strerror or exc}); create its folder on "
                    "every node, or point the variable at a writable path")
        return ""

    def _summarise(self, rec: dict) -> None:
        logger.debug("[sglang-cpp] PP%d decision rid=%s prefix=%d chunk=%d predicted_ms=%.1f (%s)",
                     self.pp_rank, rec["rid"], rec["prefix"], rec["chunk"], rec.get("predicted_ms") or 0.0,
                     rec.get("policy"))
        ent = self._open.setdefault(rec["rid"], [rec["prefix"], [], 0.0])
        ent[1].append(rec["chunk"])
        ent[2] += rec.get("predicted_ms") or 0.0
        while len(self._open) > self._max_open:  # aborted requests never reach their last chunk
            self._open.popitem(last=False)
        if rec["prefix"] + rec["chunk"] >= rec["prompt_len"]:
            self._open.pop(rec["rid"], None)
            self.finished[rec["rid"]] = {"policy": rec.get("policy"), "prefix": ent[0], "chunks": list(ent[1]),
                                         "predicted_ms": round(ent[2], 3),
                                         **({"load": rec["load"]} if rec.get("load") is not None else {}),
                                         **({"plans": rec["plans"]} if rec.get("plans") is not None else {})}
            while len(self.finished) > self._max_open:
                self.finished.popitem(last=False)
            if self.speaks:  # every stage plans alike: one rank says it (the files keep every rank's lines)
                logger.info("[sglang-cpp] PP%d request rid=%s prompt=%d prefix=%d chunks=%s predicted_ms=%.1f (%s)",
                            self.pp_rank, rec["rid"], rec["prompt_len"], ent[0], ent[1], ent[2], rec.get("policy"))


__all__ = ["DecisionLog", "HOT"]
