"""Kernel switches: where a stage's attention changes method with the prefix L (read from SGLang 0.5.23)
or with the chunk size x (the CPU testbed's flash kernel).

Why: one polynomial across a switch fits neither side, so the calibration samples both sides
and the cost model is piecewise in L (core/regimes.py). SGLang's DeepSeek MLA picks its prefill method
per batch in `deepseek_common/attention_backend_handler.py`:

- L = 0: plain MHA on every backend (no prefix to read).
- triton, and every backend without a handler of its own (torch_native on CPU): absorbed MLA once L > 0.
- flashinfer / fa3 / flashmla / fa4 / intel_xpu (`_handle_attention_backend`): absorbed MLA for
  0 < L < SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD (8192), then MHA over the prefix rebuilt from its latent
  cache: in one shot while the batch's tokens fit SGLANG_MAX_KV_CHUNK_CAPACITY (128K) on fa3 / flashinfer /
  flashmla, in KV chunks past it and always on fa4 / intel_xpu. `--disable-chunked-prefix-cache` keeps
  absorbed MLA for every L > 0; deterministic inference, CP and a ragged-disabled flashinfer keep it for
  every L (core/regimes.mla_switches has the whole table, tested against the handler itself).
- trtllm_mla: chunked-KV MHA for every extend (no switch) unless the chunked prefix cache is disabled.
- aiter: MHA, in KV chunks past the capacity.
A chunk is priced by the prefix it starts at; the capacity switch really depends on L + x, which this
places at L (a chunk that crosses it is priced one regime early).

In x: on CPU the plugin's extend attention (plugin/compat/attention.py) runs PyTorch's CPU flash kernel with the
chunk's x queries, and that kernel widens its query block at 192 and 768 queries
(`aten/src/ATen/native/cpu/FlashAttentionKernel.cpp`), each block streaming every prefix key: a short
chunk pays 1.25-1.7x per query over a long prefix (`results/flash_split.md`). GPU paths have no switch here.
"""
from __future__ import annotations

import logging
import math

from ... import envs
from ...core.regimes import CPU_FLASH_SWITCHES, captured_everywhere, mla_switches

logger = logging.getLogger("sglang_cpp")


def server_switches(sched) -> tuple:
    """(bounds, names) for this server's model and prefill attention backend; () for non-MLA models."""
    from sglang.srt.configs.model_config import AttentionArch

    if getattr(sched.model_config, "attention_arch", None) != AttentionArch.MLA:
        return (), ()
    from sglang.srt.environ import envs as sgl_envs
    from sglang.srt.runtime_context import attention_backends, get_schedule

    # the runner stamps the pair it resolved; the config's pair otherwise (runtime_context.attention_backends)
    runner = getattr(getattr(sched, "tp_worker", None), "model_runner", None)
    backend = str(getattr(runner, "prefill_attention_backend_str", None) or attention_backends()[0] or "")
    out = mla_switches(backend, int(sgl_envs.SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD.get()),
                       int(sgl_envs.SGLANG_MAX_KV_CHUNK_CAPACITY.get()),
                       not bool(get_schedule().disable_chunked_prefix_cache),  # after the model runner's gate
                       captured_prefill=_captured_everywhere(sched, runner), **_dispatch_predicates(sched))
    logger.info("[sglang-cpp] MLA prefill on %s switches attention method at prefixes %s (%s): the cost model "
                "is fitted per regime", backend or "the default backend", list(out[0]), ", ".join(out[1]))
    return out


_WARNED: set = set()


def _warn_once(key, msg: str, *args) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        logger.warning(msg, *args)


def captured_prefill(runner) -> tuple | None:
    """(the largest captured chunk, the context limit or None, the captured token buckets, the backend) of a model
    runner's prefill CUDA graph runner (model_runner.py:1201 and 1685 set it, 2036-2060 replay it); None without
    one or with the eager runner. Read on every rank at startup, whatever the model: what it means for MLA's
    dispatch is _captured_everywhere's business."""
    graphs = getattr(runner, "prefill_cuda_graph_runner", None)
    if graphs is None or type(graphs).__name__ == "EagerRunner" or not getattr(graphs, "max_num_tokens", None):
        return None
    limits = [int(v) for v in (getattr(graphs, "max_context_size", None), getattr(graphs, "max_seq_len", None))
              if v is not None]
    buckets = tuple(sorted(int(b) for b in (getattr(graphs, "capture_num_tokens", None) or ())))
    return (int(graphs.max_num_tokens), (min(limits) if limits else None), buckets,
            str(getattr(graphs, "prefill_backend_name", "")))


CAPTURED: list | None = None  # every rank's captured_prefill, gathered at startup (startup.install); None: this rank's alone


def _captured_everywhere(sched, runner) -> bool:
    """Whether every planned chunk runs in the captured prefill graph on every rank, where SGLang's MLA dispatch
    takes absorbed MLA at every prefix (attention_backend_handler.py:109-112): tc_piecewise or breakable graphs,
    inside whose replay the dispatch reads its context (a full graph: one WARNING, priced eager). SGLang 0.5.23's
    config parser refuses tc_piecewise (cuda_graph_config.py:183-186, 238-242): its branches here are for a
    runner that still reports it. Not for tc_piecewise graphs under DP attention (the extending rank votes
    against replay, dp_attn.py:569-574); breakable graphs replay there as without DP, idle ranks padding a
    dummy extend (the DP padding runs before the graph check, model_runner.py:2013-2019 against 2040, and gives
    every rank the common bucket, forward_batch_info.py:1794-1809, so `_has_inactive_dp_rank` sees no idle rank), unless a server setting makes every decoding peer vote no (_dp_decode_peers_veto; a peer
    decoding fewer requests than half the smallest bucket votes no too: one WARNING says so), or LoRA. Nor under
    context parallelism the graph did not capture (model_runner.py:287-294), nor when the stages' graphs differ.
    Some chunks but not all: one WARNING naming both limits (the eager chunks follow the regimes in L; the
    captured ones are priced as if eager)."""
    caps = CAPTURED if CAPTURED is not None else [captured_prefill(runner)]
    if any(c is None for c in caps):
        return False
    if len(set(caps)) > 1:
        _warn_once("differ", "[sglang-cpp] MLA prefill: the stages capture different prefill graphs (%s); every chunk "
                   "is priced as eager", sorted(set(caps), key=str))
        return False
    cap = caps[0]
    if cap[3] == "full":  # the method is fixed at capture, on a synthetic prefix (prefill_cuda_graph_runner.py:
        # 557-561, 1127-1160), not pinned by the replay context the dispatch reads (tc_piecewise, breakable)
        _warn_once("full", "[sglang-cpp] MLA prefill: the full prefill CUDA graph fixes the attention method at "
                   "capture (chunks of up to %d tokens); the cost model prices them as eager, approximately. "
                   "Breakable or tc_piecewise prefill graphs are priced exactly when they hold every planned chunk",
                   cap[0])
        return False
    if cap[3] not in ("tc_piecewise", "breakable"):  # cuda_graph_config.py:40-47
        return False
    from sglang.srt.layers.cp.utils import get_cp_strategy
    from sglang.srt.runtime_context import get_parallel, max_prefill_buffer_tokens

    graphs = getattr(runner, "prefill_cuda_graph_runner", None)
    dp = bool(getattr(get_parallel(), "attn_dp_enabled", False))
    if dp and cap[3] == "tc_piecewise":
        # under DP attention the extending rank votes against tc_piecewise replay (dp_attn.py:569-574, 402-403); breakable
        # graphs replay as without DP: idle ranks vote for them and run a padded dummy extend
        # (dp_attn.py:400, forward_batch_info.py:1795-1872), so the chunk's own rank replays it too
        return False
    # (0.5.23 already gives DP attention with LoRA the eager runner, cuda_graph_setup.py:541-549: the `dp` half
    # holds for a runner that would not)
    if bool(getattr(graphs, "enable_lora", False)) and (dp or not getattr(graphs, "_capture_lora", False)):
        # LoRA replays need static LoRA metadata: under DP attention every rank with a batch votes no
        # (dp_attn.py:469), and without a LoRA-captured graph the replay check refuses (prefill_cuda_graph_runner.py:
        # 1370-1374, 1460-1466)
        _warn_once("lora", "[sglang-cpp] MLA prefill with --enable-lora: the prefill graph does not replay LoRA "
                   "batches here, so chunks are priced as eager")
        return False
    if dp:
        veto = _dp_decode_peers_veto(sched)
        if veto:
            _warn_once("dp-veto", "[sglang-cpp] MLA prefill under DP attention: the breakable prefill graph replays "
                       "only when every DP rank votes for it, and a rank decoding meanwhile votes no here (%s; "
                       "managers/scheduler_components/dp_attn.py:411-436), so chunks are priced as eager", veto)
            return False
    if get_cp_strategy() is not None and not bool(getattr(graphs, "enable_cp_bcg_capture", False)):
        return False
    largest, context = int(max_prefill_buffer_tokens()), int(getattr(sched.model_config, "context_len", 0) or 0)
    align = math.lcm(64, int(getattr(sched, "page_size", 1) or 1))  # the plan's smallest chunk at least
    if captured_everywhere(cap[0], cap[1], largest, context, cap[2], smallest_chunk=align):
        if dp:
            _warn_once("dp-small-decode", "[sglang-cpp] MLA prefill under DP attention: chunks are priced as replaying "
                       "the breakable prefill graph, which holds while every other DP rank is idle or decodes at least "
                       "%d requests; a smaller decode batch pads more than 2x to the smallest captured bucket (%d "
                       "tokens) and votes no (dp_attn.py:437-481, prefill_cuda_graph_runner.py:1417-1420), and that "
                       "step's chunk runs eager", -(-cap[2][0] // 2) if cap[2] else 1, cap[2][0] if cap[2] else 0)
        return True
    _warn_once(cap, "[sglang-cpp] MLA prefill: chunks of up to %d tokens%s replay the captured prefill CUDA graph "
               "(absorbed MLA at every prefix) where their padding allows, larger ones run eager (the attention "
               "method switches with the prefix); the cost model prices every chunk as eager, so planned chunks of "
               "up to %d tokens are priced off. To price them exactly, capture buckets up to the prefill ceiling "
               "(%d tokens%s), each at most twice the one below, or run prefill eager", cap[0],
               f" over contexts of up to {cap[1]}" if cap[1] is not None else "", cap[0], largest,
               f", contexts up to {context}" if cap[1] is not None else "")
    return False


def _dp_decode_peers_veto(sched) -> str:
    """Why a decoding DP peer would vote against the breakable prefill graph on this server, '' if it need not.
    The vote is a minimum over DP ranks (dp_attn.py:292); a decode batch votes for replay only as its 1-token
    extend view, which these server-wide settings rule out (dp_attn.py:411-436). Per-request reasons (logprobs,
    grammar, beams on a peer) cannot be known at startup; those chunks run eager while priced captured."""
    from sglang.srt.layers.moe.utils import get_moe_a2a_backend
    from sglang.srt.mem_cache.kv_cache_builder import uses_ssm_state
    from sglang.srt.runtime_context import get_exec, get_memory

    spec = getattr(sched, "spec_algorithm", None)
    if spec is not None and not spec.is_none():
        return f"speculative decoding ({getattr(spec, 'name', spec)})"
    a2a = get_moe_a2a_backend()
    if not a2a.is_none():
        return f"the MoE all-to-all backend {getattr(a2a, 'value', a2a)}"
    if bool(getattr(get_exec().overlap, "enable_two_batch_overlap", False)):
        return "two-batch overlap"
    if bool(getattr(get_memory(), "enable_hisparse", False)):
        return "HiSparse"
    from sglang.srt.layers.cp.utils import get_cp_strategy

    if get_cp_strategy() is not None:
        return "context parallelism"
    if uses_ssm_state(sched.model_config):
        return "a model with recurrent state"
    return ""


def _dispatch_predicates(sched) -> dict:
    """What SGLang 0.5.23's MLA dispatch reads besides the backend (attention_backend_handler.py): deterministic
    inference (fa3, fa4, triton: MLA everywhere), `flashinfer_mla_disable_ragged` or a model without rope dims
    (forward_mla.py:141-144; flashinfer, flashmla), prefill context parallelism configured for MLA
    (layers/cp/utils.py:138-140; it may still decline a short chunk, priced here as CP), and SM100/110 for fa4.
    Captured prefill graphs: _captured_everywhere."""
    from sglang.srt.runtime_context import get_exec, get_platform

    ex = get_exec()
    hf = getattr(sched.model_config, "hf_config", None)
    try:
        from sglang.srt.layers.cp.utils import is_mla_cp_enabled

        cp = bool(is_mla_cp_enabled())
    except Exception:  # noqa: BLE001  (no CP support built: none configured)
        cp = False
    return {"deterministic": bool(getattr(getattr(ex, "deterministic", None), "enable_deterministic_inference", False)),
            "disable_ragged": bool(getattr(getattr(ex, "kernel", None), "flashinfer_mla_disable_ragged", False))
            or getattr(hf, "qk_rope_head_dim", None) == 0,
            "cp": cp, "sm100": bool(getattr(get_platform(), "is_sm100_or_sm110", False))}


def server_chunk_switches(sched) -> tuple:
    """The chunk sizes where this server's extend attention switches kernel blocking: the CPU flash kernel's
    (CPU_FLASH_SWITCHES) when the plugin's prefix-aware extend attention runs it; () everywhere else."""
    from ..compat.attention import _FLASH_CPU

    backend = str(getattr(getattr(sched, "server_args", None), "attention_backend", None) or "")
    if str(sched.device) != "cpu" or backend != "torch_native" or not envs.FAST_EXTEND.get() or _FLASH_CPU is None:
        return ()
    logger.info("[sglang-cpp] the CPU flash kernel widens its query block at chunks of %s tokens: the cost model "
                "fits one prefix-attention coefficient per chunk-size regime", list(CPU_FLASH_SWITCHES))
    return CPU_FLASH_SWITCHES


__all__ = ["server_switches", "server_chunk_switches"]
