"""The forward hooks: each served forward timed over `ModelRunner.forward` alone (the window calibration times),
logged, and handed to online refinement when it may fit it; the plan that ran reported to the client; the
decision log flushed when a pass runs nothing."""
from __future__ import annotations

from ..pd import kv as pd_kv, ring as pd_ring
from .. import state
from ..decision_log import DecisionLog
from .steps import CLOCK
from ..timing import FORWARD, DeviceTimer


def Scheduler_get_next_batch_to_run(original, self, *args, **kwargs):
    """With SGLANG_CPP_EVEN_DECODES under PP: note which micro-batch slot is being scheduled (the index of
    its running batch in running_mbs), for the admission cap below."""
    if state.BATCH is not None and state.BATCH.cfg.even_decodes:
        running = kwargs.get("running_batch", args[0] if args else None)
        self.sglang_cpp_slot = next((i for i, b in enumerate(getattr(self, "running_mbs", ()))
                                     if b is running), None)
    plan = original(self, *args, **kwargs)
    # a pass with no batch to run (idle, or an empty micro-batch slot under PP): the decision log's buffered
    # lines go to its writer thread. SGLang 0.5.23 returns a NextBatchPlan here, never None (scheduler.py:3894)
    if state.LOG is not None and getattr(plan, "batch_to_run", plan) is None:
        state.LOG.flush()
    return plan


def Scheduler_on_idle(result, self, *args, **kwargs):
    """AFTER SGLang's idle housekeeping, which every event loop calls when a pass ran nothing (scheduler.py:5241;
    the PD loops never call get_next_batch_to_run): the forwards whose device events completed since the last
    batch (on a GPU the last forward before idle is still pending when run_batch returns, and no run_batch
    follows) and the decision log's buffered lines go to its writer."""
    if state.LOG is not None:
        _drain_pending(state.LOG, state.ONLINE)
        state.LOG.flush()
    return None


def draft_runners(sched, target) -> tuple:
    """The speculative draft model's runners on this stage (none without one, and on a PP stage that hosts no
    draft): SGLang's scheduler runs them inside `run_batch` after the target's forward (scheduler.py:1203-1208:
    model_worker = draft_worker; with PP, SGLang allows EAGLE on a PD prefill node or with SGLANG_ENABLE_PP_SPEC,
    and DSPARK on a PD prefill node, validation_hook.py:119-164), EAGLE v2's draft
    extend on `_draft_worker.draft_runner` (eagle_worker_v2.py:235, 1334-1344; the prefill path 1548-1602, its
    draft extend at 1062), the multi-layer workers' per-step runners. A chunk on that stage costs both forwards,
    so the served window holds both (issue 57 item 1). Not covered: a draft whose prefill KV is injected outside
    any ModelRunner.forward (DSPARK on a PD prefill node, dspark_worker_v2.py:873-880)."""
    worker = getattr(sched, "draft_worker", None)
    if worker is None:
        return ()
    found = []
    for holder in (worker, getattr(worker, "_draft_worker", None), getattr(worker, "draft_worker", None)):
        if holder is None:
            continue
        # multi-layer EAGLE: one runner per draft step (multi_layer_eagle_worker_v2.py:189-191)
        for r in (getattr(holder, "draft_runner", None), getattr(holder, "model_runner", None),
                  *(getattr(holder, "draft_runner_list", None) or ())):
            if r is not None and r is not target and not any(r is f for f in found):
                found.append(r)
    return tuple(found)


def ModelRunner_forward(original, self, *args, **kwargs):
    """AROUND the model runner's forward: the timed window of a served forward (timing.FORWARD, armed by the
    run_batch hook for the scheduler's own runner), the same window calibration times. Unarmed, a pass."""
    return FORWARD.run(self, original, self, *args, **kwargs)


def EPLBManager_rebalance(original, self):
    """AROUND EPLB's rebalance, a generator that `ModelRunner.forward` steps once per forward
    (`on_forward_pass_end`, model_runner.py:1897-1898; eplb_manager.py:83-94): each step marks the timed window
    it runs in (timing.FORWARD.mark), so a served forward that ran a rebalance step (a record dump, maybe an expert
    move) is logged `eplb_rebalance` and left out of online refinement. Startup forwards never step it (harness.no_expert_recording sets it aside)."""
    steps = original(self)

    def marked():
        while True:
            FORWARD.mark("eplb_rebalance")
            try:
                item = next(steps)
            except StopIteration as stop:
                return stop.value
            yield item

    return marked()


def Scheduler_run_batch(original, self, batch, *args, **kwargs):
    """The forward, timed and logged (`_run_batch`); on a PD prefill stage with SGLANG_CPP_PD_EARLY_KV, the
    requests whose last chunk it ran are remembered for the early KV send at the next pass (pd/kv.py)."""
    out = _run_batch(original, self, batch, *args, **kwargs)
    if pd_kv.STATE.on:
        pd_kv.ran(self, batch)
    return out


def _run_batch(original, self, batch, *args, **kwargs):
    """Record each prefill forward's time, so `sglang-cpp tune fit` can refit from a real run; with a
    decision log file, each decode forward's too (`decode_forward`: batch size and total context, what
    the serving simulator's decode cost is fitted on). On GPUs the time comes from CUDA events on the
    current stream, written once they complete (timing.py). Between two chunks of one request, the step's
    cost beyond the forward and the waits (`step`, steps.py) goes to online refinement as the per-chunk
    overhead."""
    log = state.LOG
    if log is None or not batch.reqs:
        return original(self, batch, *args, **kwargs)
    if not log.path and state.ONLINE is None:  # nothing to time or log: only what the client is told
        extend = batch.forward_mode.is_extend()
        prefix, ext = getattr(batch, "prefix_lens", None), getattr(batch, "extend_lens", None)
        out = original(self, batch, *args, **kwargs)
        if extend and prefix is not None and ext is not None:
            _report_plans(log, batch.reqs, prefix, ext)
        return out
    step = CLOCK.forward_start()
    if batch.forward_mode.is_extend():
        prefix = [int(v) for v in (getattr(batch, "prefix_lens", None) or [r.prefix_len for r in batch.reqs])]
        ext = [int(v) for v in (getattr(batch, "extend_lens", None) or [])]
        event, rec = "forward", {"rids": [r.rid for r in batch.reqs], "prefix": prefix, "chunk": ext}
        if int(getattr(batch, "hicache_consumer_index", -1)) >= 0:  # SGLang's own "a load is pending" (HiCache)
            rec["host_loaded"] = True  # this forward waits for host-tier KV loaded back, layer by layer
        if any(r and p for r, p in zip(getattr(batch, "encoder_swa_reset", None) or (), prefix)):
            rec["replay"] = True  # the worker replays the encoder window of a cached prefix first (tp_worker.py:
            # 639-651, encoder_swa_replay.py:128-142: rows with a prefix only): not what the chunk costs
        if pd_ring.LOOP.it:  # a PD prefill stage with PP > 1: the loop index, for the release lags
            rec["it"] = pd_ring.LOOP.it
    elif batch.forward_mode.is_decode() and log.path:  # seq_lens_sum is None after filter/merge_batch
        ctx = getattr(batch, "seq_lens_sum", None)
        event, rec = "decode_forward", {"batch_size": len(batch.reqs),
                                        "context": int(ctx if ctx is not None else sum(len(r.origin_input_ids) +
                                                                                       len(r.output_ids) for r in batch.reqs))}
    else:
        return original(self, batch, *args, **kwargs)
    timer = DeviceTimer(str(self.device))
    target = getattr(getattr(self, "tp_worker", None), "model_runner", None)
    # a prefill chunk's window holds the draft's extend; a decode step's stays the target's alone (the draft's
    # decode runs through its CUDA graph, outside ModelRunner.forward, when one fits, and eagerly otherwise: timed
    # it would be in some records and not others, and serving_sim's decode fit reads these)
    FORWARD.arm(target, timer, draft_runners(self, target) if event == "forward" else ())
    try:  # timed over ModelRunner.forward alone (ModelRunner_forward), the window calibration times
        out = original(self, batch, *args, **kwargs)
    finally:
        marks = FORWARD.marks
        ran = FORWARD.disarm()
    if "eplb_rebalance" in marks:
        rec["eplb_rebalance"] = True  # a rebalance step (its record dump, maybe an expert move) ran inside: not the chunk
    online = state.ONLINE
    done = event == "forward" and _report_plans(log, batch.reqs, prefix, ext)
    if ran:
        chunk = event == "forward" and len(ext) == 1 and ext[0] > 0 and prefix[0] < len(batch.reqs[0].origin_input_ids)
        if chunk and step is not None and step["rid"] == rec["rids"][0]:  # the same request's next chunk
            if online is not None:
                online.record_step(step["loop_ms"])
            if log.path:
                log.write("step", **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in step.items()})
        CLOCK.forward_end(rec["rids"][0] if chunk else None, None if timer.cuda else timer.elapsed_ms())
        state.PENDING.add(timer, {"event": event, **rec, "synchronous": True,
                             "timing": "cuda-event" if timer.cuda else "host"})
    _drain_pending(log, online)
    if not ran:  # no forward of the scheduler's own runner ran (nothing to time): logged untimed
        log.write(event, **rec, ms=None, timing="none")
    if done:  # a prompt ran its last chunk: its lines go to the writer before its first token reaches the client
        log.flush()
        if online is not None:
            online.prompt_done()
    return out


def _drain_pending(log, online) -> None:
    """The timed forwards whose events have completed: each to online refinement (if it may fit it) and to
    the decision log, in order."""
    for rec in state.PENDING.drain():
        sample = online_sample(rec)
        if online is not None and sample is not None:
            online.record(*sample)
        log.write(rec.pop("event"), **rec)


def online_sample(rec: dict) -> tuple | None:
    """(prefix, chunk, ms) of a logged forward that online refinement may fit, else None: one request's prefill
    chunk, not one that loaded host-tier KV back (HiCache's per-layer wait for the load sits inside the timed
    window, SGLang's `wait_until`; it is not what a chunk costs), nor one an EPLB rebalance step ran in."""
    if (rec.get("event") != "forward" or len(rec.get("chunk", ())) != 1 or rec["chunk"][0] <= 0
            or rec.get("host_loaded") or rec.get("replay") or rec.get("eplb_rebalance")):
        return None
    return rec["prefix"][0], rec["chunk"][0], rec["ms"]


_RAN: dict = {}  # rid -> [first prefix, chunks that ran], until the prompt's last chunk has run


def _report_plans(log: DecisionLog, reqs, prefix: list, ext: list) -> bool:
    """A request whose prompt's last chunk just ran carries its plan to the client: the chunks that ran,
    and the decided plan with its policy and predicted ms, as `meta_info["sglang_cpp_plan"]` (SGLang's
    per-request `customized_info`, which the tokenizer manager accumulates into meta_info). True when
    some request's prompt finished in this forward."""
    done = False
    for req, p, x in zip(reqs, prefix, ext):
        n = len(req.origin_input_ids)
        if p >= n:  # a decode token riding in a mixed batch
            continue
        ent = _RAN.setdefault(req.rid, [p, []])
        ent[1].append(int(x))
        if p + x >= n:
            del _RAN[req.rid]
            plan = {"ran_prefix": ent[0], "ran": ent[1], **log.finished.pop(req.rid, {})}
            info = req.customized_info if isinstance(req.customized_info, dict) else {}
            info["sglang_cpp_plan"] = [plan]
            req.customized_info = info
            done = True
    while len(_RAN) > 4096:  # aborted requests never reach their last chunk
        _RAN.pop(next(iter(_RAN)))
    return done
