"""Arrival stamps: the offered load a queue-aware plan counts (core/load.py), the same on every PP stage.

How it travels, with nothing a stage reads from its own clock:
- PP0's leader of each request stream (world rank 0; under DP attention each DP group's PP0 attention leader,
  which pulls its own group's requests) stamps the requests it pulls from the tokenizer: one `ArrivalStamp`
  per pull that brought new prompts, its monotonic clock in ms and each prompt's length, appended to the
  pulled list (`stamp`).
- The stamp is a `BatchTokenizedGenerateReqInput` with an empty batch, so SGLang's request relay treats it
  as a work request: it reaches the pulling rank's TP (and DP group's attention TP) ranks and every later
  stage in the same iteration as the prompts it stamps (request_receiver.py `_broadcast_reqs_across_ranks`,
  `_split_work_and_control_reqs`; scheduler_pp_mixin.py relays the list as received). A control object would
  be broadcast from world rank 0 only, the wrong group's arrivals under DP attention.
- Every rank takes the stamps out before SGLang processes the list (`take`, from the process_input_requests
  hook) and feeds its sizer's ArrivalClock: each prompt's stamp, length and whether prefill work was ahead of
  it (the waiting queue, the chunked request, prefill batches in the pipe, and the prompts before it in the
  same pull), all replicated state at this loop index. The sizer advances the clock by each decided chunk's
  predicted ms, so every stage reads the same estimate at the same decision.
"""
from __future__ import annotations

import time

from .. import state
from .admission import _inflight


def __getattr__(name: str):
    """`ArrivalStamp`, built on first use (a stamp made here or unpickled from a peer): this module loads in
    every process, and sglang is imported lazily."""
    if name != "ArrivalStamp":
        raise AttributeError(name)
    from sglang.srt.managers.io_struct import BatchTokenizedGenerateReqInput

    class ArrivalStamp(BatchTokenizedGenerateReqInput, kw_only=True):
        """When PP0's leader pulled `lens` new prompts (its monotonic clock, ms); an empty batch for SGLang."""

        t_ms: float = 0.0
        lens: tuple = ()

    ArrivalStamp.__module__, ArrivalStamp.__qualname__ = __name__, "ArrivalStamp"  # what pickle looks up
    globals()["ArrivalStamp"] = ArrivalStamp
    return ArrivalStamp


def _prompt_lens(reqs) -> list[int]:
    """Each new prompt's length in a pulled list, in its order (SGLang's health checks are not prompts)."""
    from sglang.srt.managers.io_struct import (BatchTokenizedEmbeddingReqInput, BatchTokenizedGenerateReqInput,
                                               TokenizedEmbeddingReqInput, TokenizedGenerateReqInput)
    from sglang.srt.managers.utils import is_health_check_generate_req

    out = []
    for r in reqs:
        subs = r if isinstance(r, (BatchTokenizedGenerateReqInput, BatchTokenizedEmbeddingReqInput)) else \
            (r,) if isinstance(r, (TokenizedGenerateReqInput, TokenizedEmbeddingReqInput)) else ()
        for s in subs:
            ids = getattr(s, "input_ids", None)
            if ids and not is_health_check_generate_req(s):
                out.append(len(ids))
    return out


def stamp(reqs: list) -> None:
    """PP0's leader, on the list it pulled from the tokenizer: one stamp for the prompts that came in it."""
    lens = _prompt_lens(reqs)
    if lens:
        reqs.append(__getattr__("ArrivalStamp")(batch=[], t_ms=time.monotonic() * 1e3, lens=tuple(lens)))


def take(sched, reqs: list, clock, pp_size: int, log=None) -> list:
    """Every rank, before SGLang processes `reqs`: the stamps out, their arrivals into `clock` (or dropped when
    this rank plans no load), and the list SGLang should process."""
    cls = globals().get("ArrivalStamp")  # never built: no stamp came
    if cls is None or not any(isinstance(r, cls) for r in reqs):
        return reqs
    stamps = [r for r in reqs if isinstance(r, cls)]
    if clock is not None:
        busy = bool(getattr(sched, "waiting_queue", None)) or getattr(sched, "chunked_req", None) is not None \
            or bool(_inflight(sched, pp_size))
        for s in stamps:
            for n in s.lens:
                clock.arrive(s.t_ms, n, busy)
                if log is not None and log.path:
                    log.write("arrival", t_ms=round(float(s.t_ms), 3), prompt_len=int(n), busy=busy)
                busy = True  # the next prompt finds this one waiting
    return [r for r in reqs if not isinstance(r, cls)]


def stamping() -> bool:
    """This rank plans with a load estimate (the plan policy, queue-aware): its pulls are stamped."""
    return state.ACTIVE is not None and getattr(state.ACTIVE, "arrivals", None) is not None


__all__ = ["stamp", "stamping", "take"]
