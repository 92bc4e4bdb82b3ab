"""The startup harness: one timed forward of a synthetic request through SGLang's own extend path, as the
scheduler would run it (DP attention's MLP sync, EPLB's recorder set aside), with the previous stage's hidden
states as proxies. Calibration, the overhead probe and coverage all time their forwards here, over
`ModelRunner.forward` alone, the window serving times (timing.FORWARD)."""
from __future__ import annotations

import logging
from array import array
from contextlib import contextmanager

import numpy as np

logger = logging.getLogger("sglang_cpp")


def _no_idle_batch():
    raise RuntimeError("sglang-cpp calibration: SGLang asked for an idle batch beside a calibration extend")


def prepare_mlp_sync(batch, runner) -> bool:
    """SGLang's own MLP-sync preparation of a batch, run as the scheduler runs it on every batch it forwards
    (`SchedulerDPAttnAdapter.maybe_prepare_mlp_sync_batch`, which does not exist yet when the sizer is built,
    srt/managers/scheduler.py:657 against :721). Under DP attention (or a gathered MLP buffer) it all-gathers
    every DP rank's token count and sets `is_extend_in_batch` (left False, DeepEP's `auto`
    mode took its low-latency path, sized for 128 tokens per rank), the TBO split and the global forward mode.
    A collective over the TP group: every rank runs the same calibration forward at the same moment, so every
    DP rank reports the chunk: t(L, x) is measured with all DP ranks prefilling x tokens at once. Returns
    whether it ran."""
    from sglang.srt.utils.common import require_mlp_sync

    if not require_mlp_sync():
        return False
    from sglang.srt.managers.scheduler_components.dp_attn import prepare_mlp_sync_batch_raw
    from sglang.srt.model_executor.cuda_graph_config import cuda_graph_fully_disabled
    from sglang.srt.runtime_context import get_parallel, get_schedule
    from sglang.srt.utils.common import require_mlp_tp_gather

    prepare_mlp_sync_batch_raw(batch, model_runner=runner, get_idle_batch=_no_idle_batch,
                               disable_cuda_graph=cuda_graph_fully_disabled(),
                               require_mlp_tp_gather=require_mlp_tp_gather(),
                               disable_overlap_schedule=get_schedule().disable_overlap_schedule,
                               offload_tags=set(), dwdp=get_parallel().dwdp_size > 1)
    return True


@contextmanager
def no_expert_recording(runner=None):
    """Calibration forwards stay out of EPLB (`--enable-eplb`, `--expert-distribution-recorder-mode`): a no-op
    recorder is SGLang's global one meanwhile (their seeded random proxies route tokens nothing like served
    prompts do), and the rebalance counter does not advance. `ModelRunner.forward` still calls
    `eplb_manager.on_forward_pass_end()` (model_executor/model_runner.py:1897-1898), which steps a generator
    that rebalances every --eplb-rebalance-num-iterations forwards (eplb/eplb_manager.py:72-94); startup's
    hundreds of forwards would fire a rebalance on the no-op recorder (which raises) or bring the first real
    one early. The generator is set aside and restored, where it was."""
    import itertools

    from sglang.srt.eplb.expert_distribution import (_ExpertDistributionRecorderNoop,
                                                     get_global_expert_distribution_recorder,
                                                     set_global_expert_distribution_recorder)

    prev = get_global_expert_distribution_recorder()
    mgr = getattr(runner, "eplb_manager", None)
    counter = getattr(mgr, "_main_generator", None)
    held = itertools.repeat(None)  # next() is a no-op
    set_global_expert_distribution_recorder(_ExpertDistributionRecorderNoop())
    if counter is not None:
        mgr._main_generator = held
    try:
        yield
    finally:
        set_global_expert_distribution_recorder(prev)
        if counter is not None and mgr._main_generator is held:  # a reset meanwhile (ElasticEP) stands
            mgr._main_generator = counter


def _random_proxies(tensors: dict, seed: int) -> dict:
    """Non-first stages see real hidden states, not zeros: with zeros every token routes to the same
    MoE experts. Seeded, so every rank of a stage gets the same values."""
    import torch

    gens: dict = {}
    for t in tensors.values():
        if t.is_floating_point():  # drawn where the tensor lives: no host tensor of its size per forward
            gen = gens.get(t.device) or gens.setdefault(t.device, torch.Generator(device=t.device).manual_seed(seed))
            t.normal_(generator=gen)  # in place: no temporary of the tensor's size per forward
    return tensors


def proxy_views(cache: dict, n: int, seed: int, alloc) -> dict:
    """n-token views into one proxy buffer set (every proxy tensor is token-major), grown only when a longer
    chunk comes (the smaller set freed first), refilled with seeded random values before every forward:
    the model may write its proxies in place (SGLang's own dummy PP forward clones them), and one set per
    chunk size held ~0.5 GB per 16K size at hidden 7168 on top of SGLang's activation reserve. `alloc(m)`
    allocates a set for m tokens."""
    if cache.get("tokens", 0) < n:
        cache.clear()
        cache["buffers"], cache["tokens"] = alloc(n), n
    return _random_proxies({k: v[:n] for k, v in cache["buffers"].items()}, seed)


def _forward_timed(sched, req, proxy_cache: dict) -> float:
    """One forward of `req`'s current extend [prefix_len, extend_end) with random proxies; ms
    (device events on GPUs, see timing.py)."""
    return forward(sched, req, proxy_cache)[0]


STARTUP_FORWARDS = {"count": 0, "largest": 0}  # every startup forward of this rank (the harness below)


def forward(sched, req, proxy_cache: dict, proxies: dict | None = None) -> tuple:
    """(ms, ModelRunnerOutput) of one forward of `req`'s current extend, on `proxies` (the previous
    stage's, as received) or on seeded random ones: the startup harness of calibration, coverage and the
    overhead probe. Timed over `ModelRunner.forward` alone, the window serving times (timing.py)."""
    import torch
    from sglang.srt.layers.dp_attention import set_is_extend_in_batch
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, PPProxyTensors
    from sglang.srt.model_executor.runner_utils.buffers import allocate_pp_proxy_tensors

    from ..timing import DeviceTimer

    runner = sched.tp_worker.model_runner
    cfg = runner.model_config
    n = req.extend_end - req.prefix_len
    STARTUP_FORWARDS["count"] += 1  # what the startup log reports: no forward above the prefill-buffer ceiling
    STARTUP_FORWARDS["largest"] = max(STARTUP_FORWARDS["largest"], int(n))
    batch = ScheduleBatch.init_new([req], sched.req_to_token_pool, sched.token_to_kv_pool_allocator,
                                   sched.tree_cache, sched.model_config, False, sched.spec_algorithm)
    def alloc(m: int) -> dict:
        with torch.device(sched.device):
            return allocate_pp_proxy_tensors(
                max_num_tokens=m, max_hidden_tokens=m, hidden_size=cfg.hidden_size, dtype=cfg.dtype,
                hc_hidden_size=getattr(cfg, "hc_hidden_size", None),
                pp_proxy_topk_size=runner.get_pp_proxy_topk_size(),
                pp_proxy_residual_num_blocks=runner.get_pp_proxy_residual_num_blocks())

    first = bool(getattr(getattr(sched, "pp_group", None), "is_first_rank", False))
    if proxies is None and not first:  # the first stage gets none while serving: none here either
        proxies = proxy_views(proxy_cache, n, seed=n, alloc=alloc)
    batch.prepare_for_extend()
    if batch.input_ids is None and batch.prefill_input_ids_cpu is not None:
        batch.input_ids = batch.prefill_input_ids_cpu.to(sched.device, non_blocking=True)
        batch.prefill_input_ids_cpu = None
    synced = prepare_mlp_sync(batch, runner)
    fb = ForwardBatch.init_new(batch, runner, return_hidden_states_before_norm=False)
    set_is_extend_in_batch(batch.forward_mode.is_extend())
    pp = None if proxies is None else PPProxyTensors(proxies)
    timer = DeviceTimer(str(sched.device))
    timer.sync()  # the set-up above is done: the window holds the forward alone, as serving's (timing.py)
    with no_expert_recording(runner):
        timer.start()
        out = runner.forward(forward_batch=fb, pp_proxy_tensors=pp)
        timer.stop()
    if synced and not _said_dp:
        _say_dp(batch)
    return timer.wait_ms(), out


_said_dp = False  # this rank logged the DP state its first synced forward saw


def _say_dp(batch) -> None:
    """Once per rank: what SGLang's own forward saw of the DP state (read back from its forward context), so
    a deployment's log shows that calibration forwards run as extends of every DP rank's chunk."""
    global _said_dp
    from sglang.srt.layers.dp_attention import get_is_extend_in_batch

    _said_dp = True
    logger.info("[sglang-cpp] calibration forwards under DP attention: SGLang's forward saw is_extend_in_batch=%s, "
                "global_num_tokens=%s", get_is_extend_in_batch(), list(batch.global_num_tokens or []))


def synthetic_req(sched, rng, n_tokens: int, rid: str):
    """A request of random ids walked through the real chunked-prefill lifecycle (match, lock, then
    extend / checkpoint per chunk); the same on every stage for the same rng."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    ids = array("q", rng.integers(10, 10000, size=n_tokens, dtype=np.int64).tobytes())
    req = Req(rid=rid, origin_input_text="", origin_input_ids=ids,
              sampling_params=SamplingParams(temperature=0, max_new_tokens=1))
    req.skip_radix_cache_insert = True  # checkpoints keep the KV on the request, not the tree
    req.logprob_start_len = -1  # as the scheduler sets it for a request without logprobs (scheduler.py:3271)
    req.init_next_round_input(sched.tree_cache)
    req.lock = sched.tree_cache.lock(req.last_node)
    return req


def _empty_cache(device: str) -> None:
    """Hand the calibration's activations back to the allocator before serving (no-op on CPU)."""
    if device != "cpu":
        from sglang.srt.utils.common import get_device_module

        get_device_module().empty_cache()
