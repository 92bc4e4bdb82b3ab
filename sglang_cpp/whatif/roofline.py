"""Roofline stage cost: every chunk pays the slower of its FLOPs and its bytes, for the linear layers and
for attention separately.

Why: FLOPs alone charge a 128-token chunk of an MoE model almost nothing, yet it still reads every
expert it touches (top-k of E over 128 tokens touches nearly all of them), and the planner then picks
thousands of tiny chunks. Per stage and chunk (x new tokens over a prefix of L):

    linear     max(2 x N_act / (peak eff),  weights(x) + activations(x)) / (bw eff_mem))
    attention  max(n_q (d_qk + d_v) x (2L + x) / (peak eff),  KV reads / (bw eff_mem))

with weights(x) the touched experts (expected distinct experts of top-k routing) plus the dense
weights, and KV reads = the prefix once plus once more per 128-query tile (FlashAttention's KV loop;
an upper bound that ignores L2 reuse). max(A, B) + max(C, D) = max(A+C, A+D, B+C, B+D), so a stage
is exactly the maximum of four polynomial rows (a `PipelineCost`), which the planner solves in
closed form like any other stage. The fixed per-chunk cost (launch, scheduler, P2P) is
--chunk-overhead-ms, whose default for an analytic device is its preset's `chunk_overhead_ms`.
"""
from __future__ import annotations

from ..core.costmodel import CostModel, PipelineCost
from .analytic import (DeviceSpec, ModelSpec, analytic_cost_model, check_tp_cp, embedding_ms, kv_bytes_per_token,
                       layer_comm_ms)

Q_TILE = 128  # query rows per FlashAttention tile: the prefix KV is read once per tile
MIN_CHUNK_TOKENS = 64  # SGLang's alignment: no chunk but the last is smaller


def expected_experts(num_experts: int, top_k: int, x: float) -> float:
    """Expected number of distinct experts that x tokens route to (each picks top_k of num_experts,
    uniformly): E * (1 - (1 - k/E)^x). Qwen3-235B (k=8 of 128): 98.4% of experts at 64 tokens."""
    if num_experts <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** max(x, 1.0))


def weight_bytes(model: ModelSpec, first_layer: int, layers: int, tp: int, x_ref: float, cp: int = 1) -> float:
    """Bytes of weights one GPU reads for a chunk of x_ref tokens: its attention-TP rank's attention weights
    (shards plus what is replicated, `ModelSpec.attn_rank_params`), and a TP shard of the dense FFN or of
    the router, the shared experts and the expected distinct routed experts."""
    total = 0.0
    attn = model.attn_rank_params(check_tp_cp(tp, cp))
    for i in range(first_layer, first_layer + layers):
        if model.is_moe_layer(i):
            ffn = model.moe_params(expected_experts(model.num_experts, model.top_k, x_ref))
        else:
            ffn = model.ffn_params(i)
        total += (attn + ffn / tp) * model.weight_bytes
    return total


def roofline_stage(model: ModelSpec, device: DeviceSpec, layers: int | None = None, tp: int = 1,
                   dtype: str | None = None, *, first_layer: int = 0, include_embedding: bool = False,
                   include_lm_head: bool = False, attn_dtype: str = "bf16",
                   x_ref: float = MIN_CHUNK_TOKENS, mla_absorbed: bool = False, tp_comm: bool = False,
                   cp: int = 1) -> PipelineCost:
    """One stage's time as the maximum of its four roofline rows (ms). Experts are charged at the
    expected count of an x_ref-token chunk, so chunks above x_ref (all but a short last one) are
    charged at most 1.6% too much on Qwen3-235B, never too little. cp: attention CP inside the TP group;
    each GPU holds the whole prefix's KV of its attention-TP rank and reads it once per tile of its x/cp
    queries."""
    comp = analytic_cost_model(model, device, layers, tp, dtype, include_embedding, include_lm_head,
                               first_layer=first_layer, attn_dtype=attn_dtype, mla_absorbed=mla_absorbed, cp=cp)
    n = int(comp.meta["layers"])
    per_ms = device.mem_bw_gbps * 1e9 * device.mem_efficiency / 1e3  # bytes per ms
    kv = kv_bytes_per_token(model, tp // cp, 1 if attn_dtype == "fp8" else 2)
    act = 4.0 * model.hidden_size * 2  # bf16 hidden states in and out of attention and the FFN
    base = comp.c0  # the LM head of the last stage (already the slower of its FLOPs and its weight read)
    lin_c = dict(g=comp.g, b=comp.b)  # GEMMs (+ MLA's prefix rebuild, linear in L)
    emb = float(embedding_ms(model, device, 1.0)) if include_embedding else 0.0  # a gather: bytes only
    lin_m = dict(g=0.0, b=n * (act + kv) / per_ms + emb)
    w = weight_bytes(model, first_layer, n, tp, x_ref, cp) / per_ms
    att_c = dict(e=comp.e, f=comp.f)
    att_m = dict(g=n * kv / per_ms, e=n * kv / Q_TILE / cp / per_ms, f=0.0)
    meta = {**comp.meta, "roofline": True, "mem_efficiency": device.mem_efficiency, **({"tp_comm": True} if tp_comm else {})}
    per_token, per_chunk = layer_comm_ms(model, device, tp, cp) if tp_comm else (0.0, 0.0)  # serial with both bounds
    rows = []
    for lin, c_lin in ((lin_c, 0.0), (lin_m, w)):
        for att in (att_c, att_m):
            rows.append(CostModel(c0=base + c_lin + n * per_chunk, g=lin.get("g", 0.0) + att.get("g", 0.0),
                                  b=lin["b"] + n * per_token, e=att["e"], f=att["f"], meta=meta))
    return PipelineCost(tuple(rows))


__all__ = ["roofline_stage", "expected_experts", "kv_bytes_per_token", "weight_bytes", "Q_TILE"]
