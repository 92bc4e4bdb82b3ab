"""Prefix-aware extend attention for SGLang's `torch_native` backend (CPU).

SGLang 0.5.23's `TorchNativeAttnBackend._run_sdpa_forward_extend` pads each request's x new queries
to a query of L+x rows and runs causal SDPA over (L+x) x (L+x): a chunk after a prefix of L costs
~(L+x)^2, where a GPU kernel costs x*(2L+x). Chunking then multiplies attention work and the CPU
testbed no longer has the cost structure of a GPU deployment.

Here the x queries attend the L prefix keys without a mask and the chunk's own x keys causally, and
the two partial results merge by their log-sum-exp. Exact (same softmax), no redundant query, and
the kernel keeps its causal block skipping. Paths this does not reproduce exactly (sliding window,
encoder/cross attention, non-causal, q/v head dims that differ, non-CPU tensors) go to the original.
`SGLANG_CPP_FAST_EXTEND=0` restores upstream's code everywhere.
"""
from __future__ import annotations

import logging

import torch
from torch.nn.functional import scaled_dot_product_attention

from ... import envs

logger = logging.getLogger("sglang_cpp")
_ANNOUNCED = False
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _flash_with_lse(q, k, v, causal: bool, scale):
    """(out [1,H,x,D], lse [1,H,x] in fp32) from PyTorch's CPU flash kernel (GQA handled natively)."""
    out, lse = _FLASH_CPU(q, k, v, 0.0, causal, scale=scale)
    return out, lse.float()


def prefix_extend_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len: int,
                            scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    """Causal attention of x new queries over L cached + x own keys.

    q: [H, x, D]; k, v: [Hk, L+x, D] (the prefix's keys first). Returns [H, x, D]."""
    L = int(prefix_len)
    q4, k4, v4 = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    if L == 0:  # no prefix: the query is the whole sequence, which is what upstream runs too
        return scaled_dot_product_attention(q4, k4, v4, is_causal=True, scale=scale, enable_gqa=enable_gqa)[0]
    o_pre, lse_pre = _flash_with_lse(q4, k4[:, :, :L], v4[:, :, :L], False, scale)
    o_own, lse_own = _flash_with_lse(q4, k4[:, :, L:], v4[:, :, L:], True, scale)
    m = torch.maximum(lse_pre, lse_own)
    w_pre, w_own = torch.exp(lse_pre - m).unsqueeze(-1), torch.exp(lse_own - m).unsqueeze(-1)
    out = (o_pre.float() * w_pre + o_own.float() * w_own) / (w_pre + w_own)
    return out[0].to(q.dtype)


def _handles(query, v_cache, encoder_lens, causal, is_cross_attn, sliding_window_size) -> bool:
    return (_FLASH_CPU is not None and query.device.type == "cpu" and causal and not is_cross_attn
            and encoder_lens is None and (sliding_window_size is None or sliding_window_size <= -1)
            and query.shape[-1] == v_cache.shape[-1] and envs.FAST_EXTEND.get())


def TorchNativeAttnBackend__run_sdpa_forward_extend(
        original, self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
        extend_prefix_lens, extend_seq_lens, encoder_lens=None, scaling=None, enable_gqa=False, causal=False,
        is_cross_attn=False, sliding_window_size=None):
    """AROUND TorchNativeAttnBackend._run_sdpa_forward_extend: same per-request loop, no redundant query."""
    if not _handles(query, v_cache, encoder_lens, causal, is_cross_attn, sliding_window_size):
        return original(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                        extend_prefix_lens, extend_seq_lens, encoder_lens, scaling=scaling, enable_gqa=enable_gqa,
                        causal=causal, is_cross_attn=is_cross_attn, sliding_window_size=sliding_window_size)
    global _ANNOUNCED
    if not _ANNOUNCED:
        _ANNOUNCED = True
        logger.info("[sglang-cpp] prefix-aware extend attention on (torch_native; SGLANG_CPP_FAST_EXTEND=0 turns it off)")
    q_all = query.movedim(0, query.dim() - 2)  # [H, tokens, D]
    start_q = 0
    for i in range(seq_lens.shape[0]):
        x, L, n = int(extend_seq_lens[i]), int(extend_prefix_lens[i]), int(seq_lens[i])
        if x == 0:  # nothing to attend for (upstream's slice is empty; the flash kernel dies on 0 keys)
            continue
        tokens = req_to_token[req_pool_indices[i], :n]
        k = k_cache[tokens].movedim(0, 1)
        v = v_cache[tokens].movedim(0, 1)
        q = q_all[:, start_q:start_q + x, :].contiguous()  # the kernels run faster on a dense query
        if k.dtype != q.dtype:  # e.g. an fp8 KV cache; upstream casts the same way
            k, v = k.to(q.dtype), v.to(q.dtype)
        output[start_q:start_q + x] = prefix_extend_attention(q, k, v, L, scaling, enable_gqa).movedim(1, 0)
        start_q += x
    return output
