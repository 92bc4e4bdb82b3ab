"""Arrival stamps: the offered load a queue-aware plan counts (core/load.py), the same on every PP stage.

How it travels, with nothing a stage reads from its own clock:
- PP0's leader of each request stream (world rank 0; under DP attention each DP group's PP0 attention leader,
  which pulls its own group's requests) stamps the requests it pulls from the tokenizer: an `ArrivalStamp`
  after each run of pulled items that brought new prompts, its monotonic clock in ms and each prompt's
  length (`stamp`). Limit: EPD's multimodal receiver may hold back a prompt waiting for its image data and
  let its stamp through (receiver.py), so that prompt counts as arrived early, on every rank alike.
- The stamp is a `BatchTokenizedGenerateReqInput` with an empty batch, so SGLang's request relay treats it
  as a work request: it reaches the pulling rank's TP (and DP group's attention TP) ranks and every later
  stage in the same iteration as the prompts it stamps (request_receiver.py `_broadcast_reqs_across_ranks`,
  `_split_work_and_control_reqs`; scheduler_pp_mixin.py relays the list as received). A control object would
  be broadcast from world rank 0 only, the wrong group's arrivals under DP attention.
- Every rank takes the stamps out before SGLang processes the list (`take`, from the process_input_requests
  hook) and feeds its sizer's ArrivalClock: each prompt's stamp, length and whether prefill work was ahead of
  it (`prefill_ahead`, and the prompts before it in the same pull), all replicated state at this loop index.
  The sizer advances the clock by each chunk's predicted ms once per chunk it decides (an admission SGLang
  refused and retries is not counted twice), so every stage reads the same estimate at the same decision.
"""
from __future__ import annotations

import logging
import time

from .. import state
from .admission import _inflight, prefill_rows

logger = logging.getLogger("sglang_cpp")


def __getattr__(name: str):
    """`ArrivalStamp`, built on first use (a stamp made here or unpickled from a peer): this module loads in
    every process, and sglang is imported lazily."""
    if name != "ArrivalStamp":
        raise AttributeError(name)
    from sglang.srt.managers.io_struct import BatchTokenizedGenerateReqInput

    class ArrivalStamp(BatchTokenizedGenerateReqInput, kw_only=True, tag="sglang_cpp.ArrivalStamp"):
        """When PP0's leader pulled `lens` new prompts (its monotonic clock, ms); an empty batch for SGLang."""

        t_ms: float = 0.0
        lens: tuple = ()

    ArrivalStamp.__module__, ArrivalStamp.__qualname__ = __name__, "ArrivalStamp"  # what pickle looks up
    globals()["ArrivalStamp"] = ArrivalStamp
    return ArrivalStamp


def _prompt_lens(r) -> list[int]:
    """Each new prompt's length in one pulled item, in its order (SGLang's health checks are not prompts)."""
    from sglang.srt.managers.io_struct import (BatchTokenizedEmbeddingReqInput, BatchTokenizedGenerateReqInput,
                                               TokenizedEmbeddingReqInput, TokenizedGenerateReqInput)
    from sglang.srt.managers.utils import is_health_check_generate_req

    subs = r if isinstance(r, (BatchTokenizedGenerateReqInput, BatchTokenizedEmbeddingReqInput)) else \
        (r,) if isinstance(r, (TokenizedGenerateReqInput, TokenizedEmbeddingReqInput)) else ()
    return [len(s.input_ids) for s in subs if getattr(s, "input_ids", None) and not is_health_check_generate_req(s)]


def stamp(reqs: list) -> None:
    """PP0's leader, on the list it pulled from the tokenizer: a stamp right after each run of items that brought
    prompts, so that whatever SGLang holds back from a point of the list (a PauseGenerationReqInput defers the
    rest, scheduler.py:2209-2215; the input blocker, scheduler_input_blocker.py:52-67) holds back the stamp with
    the prompts it counts."""
    t_ms, out, run = time.monotonic() * 1e3, [], []
    for r in reqs:
        lens = _prompt_lens(r)
        if not lens and run:
            out.append(__getattr__("ArrivalStamp")(batch=[], t_ms=t_ms, lens=tuple(run)))
            run = []
        out.append(r)
        run += lens
    if run:
        out.append(__getattr__("ArrivalStamp")(batch=[], t_ms=t_ms, lens=tuple(run)))
    if len(out) != len(reqs):
        reqs[:] = out


_WARNED: set = set()


def prefill_ahead(sched, pp_size: int) -> bool:
    """Prefill work ahead of a prompt arriving now, from state replicated on every rank at this loop index:
    prompts waiting (or, PD prefill, still bootstrapping: prefill.py:203), one being chunked, prefill batches
    in the pipe (PP's other micro-batch slots), or, without PP, the prefill batch that just ran (with overlap
    scheduling it may still be on the device). A state it cannot read counts as none, with one WARNING: every
    rank reads the same state, so every rank falls back alike."""
    try:
        boot = getattr(sched, "disagg_prefill_bootstrap_queue", None)
        if getattr(sched, "waiting_queue", None) or getattr(sched, "chunked_req", None) is not None \
                or (boot is not None and getattr(boot, "queue", None)):
            return True
        if pp_size > 1:
            return bool(_inflight(sched, pp_size))
        return bool(prefill_rows(getattr(sched, "last_batch", None)))
    except Exception as exc:  # noqa: BLE001  (the scheduler never stops on the load estimate's account)
        if type(exc).__name__ not in _WARNED:
            _WARNED.add(type(exc).__name__)
            logger.warning("[sglang-cpp] PP%d load estimate: cannot read what is ahead of an arrival (%s: %s); "
                           "counted as nothing ahead", state.PP_RANK, type(exc).__name__, exc)
        return False


def take(sched, reqs: list, clock, pp_size: int, log=None) -> list:
    """Every rank, before SGLang processes `reqs`: the stamps out, their arrivals into `clock` (or dropped when
    this rank plans no load), and the list SGLang should process."""
    cls = globals().get("ArrivalStamp")  # never built: no stamp came
    if cls is None or not any(isinstance(r, cls) for r in reqs):
        return reqs
    stamps = [r for r in reqs if isinstance(r, cls)]
    if clock is not None:
        busy = prefill_ahead(sched, pp_size)
        for s in stamps:
            for n in s.lens:
                clock.arrive(s.t_ms, n, busy)
                if log is not None and log.path:
                    log.write("arrival", t_ms=float(s.t_ms), prompt_len=int(n), busy=busy)
                busy = True  # the next prompt finds this one waiting
    return [r for r in reqs if not isinstance(r, cls)]


def stamping() -> bool:
    """This rank plans with a load estimate (the plan policy, queue-aware): its pulls are stamped."""
    return state.ACTIVE is not None and getattr(state.ACTIVE, "arrivals", None) is not None


__all__ = ["stamp", "stamping", "take"]
