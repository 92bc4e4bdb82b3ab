"""Analytic chunk cost model from a model config and a device: FLOPs / (peak * efficiency).

Why: a profile needs the target GPUs; a what-if (Qwen3-235B on 32 H20 at 1M tokens) or a layer
partition needs numbers before any hardware is booked. Per layer, a chunk of x new tokens over a
cached prefix of L tokens costs

    linear      2 * x * N_act                       (attention projections, dense FFN or router + top_k experts + shared)
    attention   n_q * (d_qk + d_v) * x * (2L + x)   (QK^T and PV, causal; = 2*2*n_q*d_h*x*(L + x/2) for GQA)
    MLA rebuild 2 * L * kv_lora * n_q * (d_nope + d_v)   (prefix latents re-projected by kv_b each chunk)
    absorbed MLA   n_q * (2 kv_lora + d_rope) * x * (2L + x)   (QK^T and PV over the latent: no rebuild,
                   a dearer attention; SGLang's method over a short prefix, `stage_models(attention_backend=)`)

so a stage's time is exactly c0 + g*L + b*x + a*x*(2L + x): the FA form of `CostModel`. Per GPU of a TP
group, everything is split by tp except what SGLang replicates (MLA's latent projections, KV heads past
num_kv_heads); attention CP inside the group (--attn-cp-size) splits the queries instead and changes
only the replicated parts and the collectives (`_layer_coefs`, `layer_comm_bytes`).
Sources: /work/shared/reference/anchors.md section 2.1 (FLOPs) and 2.2 (peaks and the TTFT bound).
"""
from __future__ import annotations

import math

import numpy as np

from ..core.costmodel import CostModel
from .specs import DEVICES, MODELS, DeviceSpec, ModelSpec, check_tp, device_of, model_of  # noqa: F401 (their home)


def _dtype(model: ModelSpec, dtype: str | None) -> str:
    return dtype or ("fp8" if model.weight_bytes == 1 else "bf16")


def check_tp_cp(tp, cp) -> int:
    """attn_tp = tp / cp: SGLang carves attention CP out of the TP group (--attn-cp-size divides --tp-size)."""
    if not isinstance(tp, (int, np.integer)) or tp < 1:
        raise ValueError(f"tp={tp!r} must be an integer >= 1")
    if not isinstance(cp, (int, np.integer)) or cp < 1 or tp % cp:
        raise ValueError(f"--attn-cp-size {cp!r} must be an integer >= 1 dividing --tp-size {tp} (SGLang carves "
                         "attention CP out of the TP group)")
    return tp // cp


def _layer_coefs(model: ModelSpec, device: DeviceSpec, tp: int, dtype: str | None, attn_dtype: str,
                 mla_prefix_rebuild: bool, mla_absorbed: bool = False, cp: int = 1) -> np.ndarray:
    """(num_layers, 3) array of per-layer (g, b, a) in ms of one GPU: t = g*L + b*x + a*x*(2L+x).
    mla_absorbed: MLA's absorbed kernel (attention over the latent, no prefix rebuild).

    cp: attention CP inside the TP group (SGLang 0.5.23 --attn-cp-size, zigzag queries). Each CP rank
    takes x/cp of the chunk's queries on an attention-TP group of tp/cp, so attention FLOPs per GPU are
    those of TP (heads x queries is conserved); what CP changes is what TP replicates: the replicated
    projections run on x/cp tokens instead of x, and the MLA prefix rebuild (kv_b over all L latents for
    the rank's heads) runs on every CP rank, over tp/cp heads' worth instead of tp's. FFN and MoE stay TP
    over all tp GPUs on all x tokens (the hidden states are all-gathered over CP first)."""
    attn_tp = check_tp_cp(tp, cp)
    lin = device.peak_tflops(_dtype(model, dtype)) * 1e12 * device.efficiency / 1e3  # FLOP per ms of one GPU
    att_eff = device.attn_efficiency if device.attn_efficiency is not None else device.efficiency
    att = device.peak_tflops(attn_dtype) * 1e12 * att_eff * tp / 1e3
    out = np.empty((model.num_layers, 3))
    absorbed = mla_absorbed and model.is_mla
    g = 2.0 * model.kv_b_params / attn_tp / lin if mla_prefix_rebuild and not absorbed else 0.0
    coef = model.num_heads * (2 * model.kv_lora_rank + model.qk_rope_head_dim) if absorbed else model.attn_coef
    attn = model.attn_rank_params(attn_tp) / cp
    for i in range(model.num_layers):
        out[i] = (g, 2.0 * (attn + model.ffn_params(i) / tp) / lin, coef / att)
    return out


def embedding_ms(model: ModelSpec, device: DeviceSpec, x=1):
    """Embedding gather: memory-bound, x rows of hidden_size bf16 values."""
    return np.asarray(x, dtype=float) * model.hidden_size * 2 / (device.mem_bw_gbps * 1e9) * 1e3


def lm_head_ms(model: ModelSpec, device: DeviceSpec, tp: int = 1) -> float:
    """Logits of the chunk's last token: the bf16 weight read (vocab-parallel over tp) dominates."""
    flops = 2.0 * model.hidden_size * model.vocab_size / (device.peak_bf16_tflops * 1e12 * device.efficiency * tp)
    read = model.hidden_size * model.vocab_size * 2 / (device.mem_bw_gbps * 1e9 * tp)
    return max(flops, read) * 1e3


def kv_bytes_per_token(model: ModelSpec, tp: int, kv_bytes: int = 2) -> float:
    """KV cache bytes one GPU holds per token and layer with attention TP of tp: K and V of its share of
    the KV heads (MLA: the compressed latent and the rope key, replicated on every TP rank)."""
    if model.is_mla:
        return float((model.kv_lora_rank + model.qk_rope_head_dim) * kv_bytes)
    return 2.0 * max(model.num_kv_heads / tp, 1.0) * model.head_dim * kv_bytes


def layer_comm_bytes(model: ModelSpec, tp: int, cp: int = 1) -> list[float]:
    """Bytes per chunk token that one GPU sends in each collective of one layer (ring algorithms, bf16).

    TP (cp = 1): an all-reduce after attention and one after the FFN, 2 (tp-1)/tp of the hidden states each.
    CP (attn_tp = tp/cp): the chunk's new K/V all-gathered over CP, (cp-1)/cp of a rank's KV per token
    (the prefix KV is already a full copy on every CP rank); an all-reduce of the x/cp attention outputs
    inside attn_tp (none at attn_tp = 1); the hidden states all-gathered over CP for the TP FFN, (cp-1)/cp;
    the FFN's all-reduce over tp as in TP."""
    attn_tp = check_tp_cp(tp, cp)
    h = model.hidden_size * 2.0
    ffn = [2.0 * (tp - 1) / tp * h] if tp > 1 else []
    if cp == 1:
        return ([2.0 * (tp - 1) / tp * h] if tp > 1 else []) + ffn
    out = [(cp - 1) / cp * kv_bytes_per_token(model, attn_tp)]
    if attn_tp > 1:
        out.append(2.0 * (attn_tp - 1) / attn_tp * h / cp)
    return out + [(cp - 1) / cp * h] + ffn


def layer_comm_ms(model: ModelSpec, device: DeviceSpec, tp: int, cp: int = 1) -> tuple[float, float]:
    """(ms per token, ms per chunk) of one layer's collectives (`layer_comm_bytes`) on the device's link:
    their bytes over the bus bandwidth, plus one latency each. Zero without a link figure."""
    sizes = layer_comm_bytes(model, tp, cp)
    if not sizes or device.link_gbps <= 0:
        return 0.0, 0.0
    return sum(sizes) / (device.link_gbps * 1e9) * 1e3, len(sizes) * device.link_latency_ms


def per_layer_costs(model: ModelSpec, device: DeviceSpec, L, x, *, tp: int = 1, dtype: str | None = None,
                    attn_dtype: str = "bf16", mla_prefix_rebuild: bool = True, cp: int = 1) -> np.ndarray:
    """ms of every layer for one chunk (x tokens over prefix L); dense and MoE layers differ."""
    c = _layer_coefs(model, device, tp, dtype, attn_dtype, mla_prefix_rebuild, cp=cp)
    return c[:, 0] * L + c[:, 1] * x + c[:, 2] * x * (2 * L + x)


def analytic_cost_model(model: ModelSpec, device: DeviceSpec, layers: int | None = None, tp: int = 1,
                        dtype: str | None = None, include_embedding: bool = False, include_lm_head: bool = False,
                        *, first_layer: int = 0, attn_dtype: str = "bf16",
                        mla_prefix_rebuild: bool = True, mla_absorbed: bool = False,
                        tp_comm: bool = False, cp: int = 1) -> CostModel:
    """CostModel (ms) of a stage holding `layers` layers from `first_layer` (None: the whole model).

    dtype: GEMM dtype (default: fp8 for fp8 checkpoints, else bf16); attention runs at attn_dtype,
    bf16 unless the KV cache is fp8 (anchors.md 2.2). tp_comm: charge each layer's collectives
    (`layer_comm_ms`), which a comparison of TP or CP degrees needs; at one layout a fitted efficiency
    absorbs them, so it is off by default. cp: attention CP inside the TP group (`_layer_coefs`)."""
    n = model.num_layers - first_layer if layers is None else layers
    if not (isinstance(n, (int, np.integer)) and n >= 1 and 0 <= first_layer and first_layer + n <= model.num_layers):
        raise ValueError(f"layers={layers!r} from first_layer={first_layer} must lie within the model's "
                         f"{model.num_layers} layers")
    g, b, a = _layer_coefs(model, device, tp, dtype, attn_dtype, mla_prefix_rebuild,
                           mla_absorbed, cp)[first_layer:first_layer + n].sum(0)
    c0 = lm_head_ms(model, device, tp) if include_lm_head else 0.0  # the per-chunk overhead: with_overheads
    if tp_comm:
        per_token, per_chunk = layer_comm_ms(model, device, tp, cp)
        b, c0 = b + n * per_token, c0 + n * per_chunk
    if include_embedding:
        b += float(embedding_ms(model, device, 1.0))
    meta = {"model": model.name, "device_name": device.name, "dtype": _dtype(model, dtype), "tp": tp,
            "backend": "analytic", "layers": int(n), "first_layer": int(first_layer),
            "efficiency": device.efficiency, **({"tp_comm": True} if tp_comm else {}), **({"cp": cp} if cp > 1 else {})}
    return CostModel.fa(a=float(a), b=float(b), c0=float(c0), g=float(g), meta=meta)


# -- physical limit (anchors.md section 2.2) ---------------------------------------------------
def prefill_flops(model: ModelSpec, prompt_len: int) -> tuple[float, float]:
    """(linear, attention) FLOPs of a one-shot causal prefill of prompt_len tokens, all layers.

    Linear = S * 2 * N_act; attention = S^2 * n_q * (d_qk + d_v) per layer (QK^T + PV, halved for
    causality). Embedding and the last token's LM head are negligible and left out, as in anchors.md 2.1."""
    S = float(prompt_len)
    return S * 2.0 * model.active_params, S * S * model.attn_coef * model.num_layers


def ideal_ttft_ms(model: ModelSpec, device: DeviceSpec, prompt_len: int, num_gpus: int,
                  dtype: str | None = None, attn_dtype: str = "bf16") -> float:
    """T_min = F_lin / (G * P_gemm) + F_attn / (G * P_attn), at dense peak (no efficiency factor)."""
    if prompt_len < 1 or num_gpus < 1:
        raise ValueError(f"prompt_len={prompt_len} and num_gpus={num_gpus} must be >= 1")
    lin, att = prefill_flops(model, prompt_len)
    g = num_gpus * 1e12
    return (lin / (g * device.peak_tflops(_dtype(model, dtype))) + att / (g * device.peak_tflops(attn_dtype))) * 1e3


def percent_of_limit(measured_ttft_ms: float, model: ModelSpec, device: DeviceSpec, prompt_len: int,
                     num_gpus: int | None = None, tp: int = 1, pp: int = 1, dtype: str | None = None,
                     attn_dtype: str = "bf16") -> float:
    """Percent of the physical limit: 100 * T_min / measured TTFT.

    T_min is the TTFT lower bound of /work/shared/reference/anchors.md section 2.2: the whole prompt's
    causal prefill FLOPs spread over all GPUs at dense peak, GEMMs at the checkpoint's dtype (fp8 for
    FP8 checkpoints), attention at bf16 unless attn_dtype='fp8'. E.g. Qwen3-235B-A22B-FP8 on 32 H20,
    128K: T_min = 6.17 s against SGLang's 10.54 s, i.e. 58.5%."""
    G = tp * pp if num_gpus is None else num_gpus
    if G != tp * pp:
        raise ValueError(f"num_gpus={num_gpus} but tp*pp={tp * pp}: one request's prefill runs on tp*pp GPUs")
    if not (measured_ttft_ms > 0 and math.isfinite(measured_ttft_ms)):
        raise ValueError(f"measured_ttft_ms={measured_ttft_ms!r} must be a finite number > 0")
    return 100.0 * ideal_ttft_ms(model, device, prompt_len, G, dtype, attn_dtype) / measured_ttft_ms


__all__ = ["ModelSpec", "DeviceSpec", "MODELS", "DEVICES", "model_of", "check_tp", "device_of", "analytic_cost_model", "per_layer_costs", "embedding_ms",
           "layer_comm_ms", "layer_comm_bytes", "kv_bytes_per_token", "check_tp_cp",
           "lm_head_ms", "prefill_flops", "ideal_ttft_ms", "percent_of_limit"]
