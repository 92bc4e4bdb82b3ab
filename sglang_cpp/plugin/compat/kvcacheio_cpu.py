"""Pure-torch stand-ins for the `sgl_kernel.kvcacheio` ops SGLang 0.5.23's MHA host pool calls, for
hosts with no CUDA/HIP/XPU build (pool_host/mha.py imports them only there, so on CPU the first
device->host backup dies with `NameError: transfer_kv_all_layer_lf_pf`).

Why this is enough: each op is an index gather and scatter of whole token rows between the device
pool (one [tokens, heads, dim] tensor per layer) and the host pool (layer_first [layer, tokens, ...],
page_first [tokens, layer, ...], page_first_direct [pages, layer, page, ...]). On a CPU the copy is
synchronous, so no stream or event orders anything. As in the CUDA kernels, a pair with a negative
source or destination index is skipped.

The all-layer kernels take device pointer tables, which plain torch cannot dereference; here they
take the tensor lists instead, and the pool method that calls them is wrapped one level up
(`compat.cpu.MHATokenToKVPoolHost_backup_from_device_all_layer`). Keyword names follow sgl_kernel's.
"""
from __future__ import annotations

import torch


def _pairs(src_indices: torch.Tensor, dst_indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s, d = src_indices.reshape(-1).long(), dst_indices.reshape(-1).long()
    if s.numel() != d.numel():
        raise ValueError(f"kvcacheio: {s.numel()} source and {d.numel()} destination indices; give one per token")
    keep = (s >= 0) & (d >= 0)
    if not bool(keep.all()):
        s, d = s[keep], d[keep]
    return s, d


def transfer_kv_per_layer(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, item_size=0, **_):
    """One layer, token-first on both sides: dst[d] = src[s]."""
    s, d = _pairs(src_indices, dst_indices)
    dst_k[d] = src_k[s]
    dst_v[d] = src_v[s]


def transfer_kv_per_layer_pf_lf(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, layer_id, item_size=0,
                                src_layout_dim=0, **_):
    """Host page_first [tokens, layer, ...] to one device layer: dst[d] = src[s, layer]."""
    s, d = _pairs(src_indices, dst_indices)
    dst_k[d] = src_k[s, layer_id]
    dst_v[d] = src_v[s, layer_id]


def transfer_kv_all_layer(src_k_layers, dst_k_layers, src_v_layers, dst_v_layers, src_indices, dst_indices,
                          item_size=0, num_layers=None, **_):
    """Every layer, token-first tensors on both sides (lists, one per layer)."""
    s, d = _pairs(src_indices, dst_indices)
    for layers in ((src_k_layers, dst_k_layers), (src_v_layers, dst_v_layers)):
        for src, dst in zip(*layers):
            dst[d] = src[s]


def transfer_kv_all_layer_lf_pf(src_k_layers, dst_k, src_v_layers, dst_v, src_indices, dst_indices, item_size=0,
                                dst_layout_dim=0, num_layers=None, **_):
    """Device layers (a list) into host page_first [tokens, layer, ...]: dst[d, l] = src_l[s]."""
    s, d = _pairs(src_indices, dst_indices)
    for src_layers, dst in ((src_k_layers, dst_k), (src_v_layers, dst_v)):
        dst[d] = torch.stack([src[s] for src in src_layers], dim=1)


def transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size=1, **_):
    """Pairs of token-first tensors (K layers, then V layers): dst[d] = src[s]."""
    s, d = _pairs(src_indices, dst_indices)
    for src, dst in zip(src_layers, dst_layers):
        dst[d] = src[s]


def transfer_kv_per_layer_direct_pf_lf(src_ptrs, dst_ptrs, src_indices, dst_indices, layer_id, page_size, **_):
    """Host page_first_direct [pages, layer, page, ...] (K, V) to one device layer (K, V)."""
    s, d = _pairs(src_indices, dst_indices)
    for src, dst in zip(src_ptrs, dst_ptrs):
        dst[d] = src[s // page_size, layer_id, s % page_size]


def transfer_kv_all_layer_direct_lf_pf(src_ptrs, dst_ptrs, src_indices, dst_indices, page_size, **_):
    """Device layers (K layers, then V layers) into host page_first_direct [pages, layer, page, ...]."""
    s, d = _pairs(src_indices, dst_indices)
    n = len(src_ptrs) // 2
    for half, dst in enumerate(dst_ptrs):
        dst[d // page_size, :, d % page_size] = torch.stack([src[s] for src in src_ptrs[half * n:(half + 1) * n]],
                                                            dim=1)


OPS = ("transfer_kv_per_layer", "transfer_kv_per_layer_pf_lf", "transfer_kv_all_layer", "transfer_kv_all_layer_lf_pf",
       "transfer_kv_direct", "transfer_kv_per_layer_direct_pf_lf", "transfer_kv_all_layer_direct_lf_pf")

__all__ = list(OPS)
