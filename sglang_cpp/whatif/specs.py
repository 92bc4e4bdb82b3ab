"""What the analytic model prices: a model's shape (`ModelSpec`: presets, or the user's HF config.json) and a
device's peaks, bandwidths and links (`DeviceSpec`: presets with their datasheet figures); the flag-facing
lookups (`model_of`, `device_of`, `check_tp`) that turn --analytic / --model-path / --gpu / --tp-size into them
or into one line naming the flag. The time model itself is whatif/analytic.py."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np


@dataclass(frozen=True)
class ModelSpec:
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # dense FFN
    vocab_size: int
    num_experts: int = 0  # 0: dense model
    top_k: int = 0
    moe_intermediate_size: int = 0
    num_dense_layers: int = 0  # the first k layers are dense (DeepSeek first_k_dense_replace)
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0  # each shared expert's FFN size (Qwen2-MoE's); 0: moe_intermediate_size
    kv_lora_rank: int = 0  # > 0: MLA attention
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    weight_bytes: int = 2  # 2 bf16, 1 fp8
    tie_word_embeddings: bool = False
    name: str = "custom"
    max_context: int = field(default=0, compare=False)  # a config's context length as SGLang derives it; 0: unknown

    def __post_init__(self):
        for k in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size"):
            if not isinstance(getattr(self, k), (int, np.integer)) or getattr(self, k) < 1:
                raise ValueError(f"ModelSpec.{k}={getattr(self, k)!r} must be an integer >= 1")
        if self.num_experts:
            if not (1 <= self.top_k <= self.num_experts) or self.moe_intermediate_size < 1:
                raise ValueError(f"ModelSpec {self.name}: MoE needs 1 <= top_k <= num_experts and "
                                 f"moe_intermediate_size >= 1 (got top_k={self.top_k}, "
                                 f"moe_intermediate_size={self.moe_intermediate_size})")
        if not 0 <= self.num_dense_layers <= self.num_layers:
            raise ValueError(f"ModelSpec.num_dense_layers={self.num_dense_layers} must be in [0, num_layers]")
        if (self.num_dense_layers or not self.num_experts) and self.intermediate_size < 1:
            raise ValueError(f"ModelSpec {self.name}: dense layers need intermediate_size >= 1")
        if self.kv_lora_rank and min(self.qk_rope_head_dim, self.qk_nope_head_dim, self.v_head_dim) < 1:
            raise ValueError(f"ModelSpec {self.name}: MLA needs qk_rope_head_dim, qk_nope_head_dim, v_head_dim >= 1")
        if self.weight_bytes not in (1, 2, 4):
            raise ValueError(f"ModelSpec.weight_bytes={self.weight_bytes!r}: use 1 (fp8), 2 (bf16) or 4 (fp32)")

    # -- structure ------------------------------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def is_moe_layer(self, i: int) -> bool:
        return self.num_experts > 0 and i >= self.num_dense_layers

    @property
    def qk_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def v_dim(self) -> int:
        return self.v_head_dim if self.is_mla else self.head_dim

    @property
    def attn_params(self) -> int:
        """Attention projection weights of one layer (MLA: q_a, q_b, kv_a, kv_b, o): one rank's share at
        attention TP 1, an exact integer."""
        return int(self.attn_rank_params(1))

    def attn_rank_params(self, attn_tp: int = 1) -> float:
        """Attention projection weights one rank of an attention-TP group of attn_tp applies to each of its
        tokens: the head-sharded parts / attn_tp plus what SGLang replicates on every rank. MLA: q_a and
        kv_a (the latent projections, ReplicatedLinear in deepseek_v2.py). GQA: each rank computes at least
        one KV head, so K/V projections stop shrinking past attn_tp = num_kv_heads. Equals attn_params / attn_tp
        where nothing is replicated."""
        H, nq = self.hidden_size, self.num_heads
        if not self.is_mla:
            return 2 * H * nq * self.head_dim / attn_tp + 2 * H * self.head_dim * max(self.num_kv_heads / attn_tp, 1.0)
        if self.q_lora_rank:
            q = H * self.q_lora_rank + self.q_lora_rank * nq * self.qk_dim / attn_tp
        else:
            q = H * nq * self.qk_dim / attn_tp
        return q + H * (self.kv_lora_rank + self.qk_rope_head_dim) + (self.kv_b_params + nq * self.v_dim * H) / attn_tp

    @property
    def kv_b_params(self) -> int:
        return self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim) if self.is_mla else 0

    def ffn_params(self, i: int, active: bool = True) -> int:
        if not self.is_moe_layer(i):
            return 3 * self.hidden_size * self.intermediate_size
        return int(self.moe_params(self.top_k if active else self.num_experts))

    def moe_params(self, routed: float) -> float:
        """One MoE layer's FFN weights with `routed` routed experts: the router, those experts and every shared
        expert (gated, 3 matrices each, at its own size)."""
        H = self.hidden_size
        shared = self.shared_expert_intermediate_size or self.moe_intermediate_size
        return H * self.num_experts + routed * 3 * H * self.moe_intermediate_size + \
            self.num_shared_experts * 3 * H * shared

    def layer_params(self, i: int, active: bool = True) -> int:
        return self.attn_params + self.ffn_params(i, active)

    @property
    def active_params(self) -> int:
        """Non-embedding weights one token touches (N_act of anchors.md 2.1)."""
        return sum(self.layer_params(i) for i in range(self.num_layers))

    @property
    def total_params(self) -> int:
        emb = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return emb + sum(self.layer_params(i, active=False) for i in range(self.num_layers))

    @property
    def attn_coef(self) -> int:
        """Attention-core FLOPs of one layer per unit of x*(2L+x): n_q * (d_qk + d_v)."""
        return self.num_heads * (self.qk_dim + self.v_dim)

    # -- HF config --------------------------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, cfg: dict, name: str | None = None) -> "ModelSpec":
        """From a HF config.json dict, by its family (`architectures`, else `model_type`: FAMILIES): the dense
        fields every family shares, then that family's MoE fields (Mixtral's num_local_experts and expert-sized
        intermediate_size, Qwen-MoE's num_experts and shared expert, DeepSeek's routed and shared experts and
        dense first layers) and MLA's. An architecture it does not know is refused by name: a model priced as
        dense because its expert count sits under another key is wrong by its whole expert weights."""
        if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):
            cfg = cfg["text_config"]
        try:
            H, nq = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
            kw = dict(num_layers=int(cfg["num_hidden_layers"]), hidden_size=H, num_heads=nq,
                      num_kv_heads=int(cfg.get("num_key_value_heads") or nq),
                      head_dim=int(cfg.get("head_dim") or H // nq),
                      intermediate_size=int(cfg.get("intermediate_size") or 0), vocab_size=int(cfg["vocab_size"]),
                      tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                      name=name or str(cfg.get("_name_or_path") or cfg.get("model_type") or "hf"))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"HF config: missing or bad key {exc}; need num_hidden_layers, hidden_size, "
                             "num_attention_heads, vocab_size") from None
        family = family_of(cfg)
        try:
            kw.update(_MOE[family](cfg))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"HF config ({family} family): missing or bad key {exc} among its expert fields") from None
        if cfg.get("kv_lora_rank"):
            kw.update(kv_lora_rank=int(cfg["kv_lora_rank"]), q_lora_rank=int(cfg.get("q_lora_rank") or 0),
                      qk_rope_head_dim=int(cfg["qk_rope_head_dim"]), qk_nope_head_dim=int(cfg["qk_nope_head_dim"]),
                      v_head_dim=int(cfg["v_head_dim"]))
            kw["head_dim"] = kw["qk_rope_head_dim"] + kw["qk_nope_head_dim"]
        q = cfg.get("quantization_config") or {}
        if str(q.get("quant_method", "")).lower() == "fp8" or str(cfg.get("torch_dtype", "")).startswith("float8"):
            kw["weight_bytes"] = 1
        return cls(**kw, max_context=context_length(cfg))


CONTEXT_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")


def context_length(cfg: dict) -> int:
    """The context length SGLang derives from a HF config (utils/hf_transformers/common.py:667-693,
    get_context_length): the first of its keys, times rope_scaling's factor unless the scaling names
    original_max_position_embeddings or is llama3's; 0 where the config has none of the keys (SGLang assumes
    2048; a hand-written config is not refused on that guess)."""
    rope = cfg.get("rope_scaling") or {}
    factor = rope.get("factor", 1) if isinstance(rope, dict) else 1
    if not isinstance(rope, dict) or "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
        factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        if cfg.get(key) is not None:
            return int(float(factor or 1) * int(cfg[key]))
    return 0


def _dense(cfg: dict) -> dict:
    return {}


def _leading_dense(cfg: dict, dense: int = 0) -> int:
    """The leading block of dense layers (Qwen-MoE's mlp_only_layers, DeepSeek's first_k_dense_replace); MoE on
    every k-th layer is refused by name."""
    if int(cfg.get("decoder_sparse_step", 1)) != 1 or int(cfg.get("moe_layer_freq", 1)) != 1:
        raise ValueError("HF config: MoE on every k-th layer (decoder_sparse_step / moe_layer_freq != 1) is not "
                         "modelled; only 'first k layers dense' is")
    mlp_only = sorted(cfg.get("mlp_only_layers") or [])
    if mlp_only and mlp_only != list(range(len(mlp_only))):
        raise ValueError(f"HF config: mlp_only_layers={mlp_only} are not the first k layers; only a leading block "
                         "of dense layers is modelled")
    return max(dense, len(mlp_only))


def _qwen_moe(cfg: dict) -> dict:
    """Qwen2-MoE / Qwen3-MoE: num_experts of moe_intermediate_size; Qwen2-MoE adds one shared expert of
    shared_expert_intermediate_size."""
    shared = int(cfg.get("shared_expert_intermediate_size") or 0)
    return dict(num_experts=int(cfg["num_experts"]), top_k=int(cfg["num_experts_per_tok"]),
                moe_intermediate_size=int(cfg["moe_intermediate_size"]), num_dense_layers=_leading_dense(cfg),
                num_shared_experts=1 if shared else 0, shared_expert_intermediate_size=shared)


def _mixtral(cfg: dict) -> dict:
    """Mixtral: num_local_experts experts of intermediate_size each, every layer; no dense FFN."""
    return dict(num_experts=int(cfg["num_local_experts"]), top_k=int(cfg["num_experts_per_tok"]),
                moe_intermediate_size=int(cfg["intermediate_size"]))


def _deepseek(cfg: dict) -> dict:
    """DeepSeek-V2 / V3: n_routed_experts and n_shared_experts of moe_intermediate_size, the first
    first_k_dense_replace layers dense (intermediate_size)."""
    if not cfg.get("n_routed_experts"):
        return {}
    return dict(num_experts=int(cfg["n_routed_experts"]), top_k=int(cfg["num_experts_per_tok"]),
                moe_intermediate_size=int(cfg["moe_intermediate_size"]),
                num_dense_layers=_leading_dense(cfg, int(cfg.get("first_k_dense_replace") or 0)),
                num_shared_experts=int(cfg.get("n_shared_experts") or 0))


_MOE = {"dense": _dense, "qwen_moe": _qwen_moe, "mixtral": _mixtral, "deepseek": _deepseek}
# HF architectures (config.json `architectures`) and model types the analytic model prices, by family
FAMILIES = {
    "LlamaForCausalLM": "dense", "MistralForCausalLM": "dense", "Qwen2ForCausalLM": "dense",
    "Qwen3ForCausalLM": "dense", "Qwen2MoeForCausalLM": "qwen_moe", "Qwen3MoeForCausalLM": "qwen_moe",
    "MixtralForCausalLM": "mixtral", "DeepseekV2ForCausalLM": "deepseek", "DeepseekV3ForCausalLM": "deepseek",
}
MODEL_TYPES = {"llama": "dense", "mistral": "dense", "qwen2": "dense", "qwen3": "dense", "qwen2_moe": "qwen_moe",
               "qwen3_moe": "qwen_moe", "mixtral": "mixtral", "deepseek_v2": "deepseek", "deepseek_v3": "deepseek"}


_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")


def family_of(cfg: dict) -> str:
    """The family of a HF config: its first known `architectures` entry, else its `model_type` (a config with
    neither and no expert field: dense); ValueError naming what it says and the families supported."""
    archs = cfg.get("architectures") or []
    for a in archs if isinstance(archs, list) else [archs]:
        if a in FAMILIES:
            return FAMILIES[a]
    if not archs and cfg.get("model_type") in MODEL_TYPES:
        return MODEL_TYPES[cfg["model_type"]]
    if not archs and not cfg.get("model_type") and not any(cfg.get(k) for k in _EXPERT_KEYS):
        return "dense"  # a hand-written config of the dense fields alone
    said = f"architectures {archs}" if archs else f"model_type {cfg.get('model_type')!r}"
    raise ValueError(f"HF config: {said} is not a family the analytic model prices; supported: "
                     f"{', '.join(sorted(FAMILIES))} (model types {', '.join(sorted(MODEL_TYPES))}). Give a "
                     "profile measured on the model instead (`sglang-cpp profile`)")


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    peak_bf16_tflops: float
    peak_fp8_tflops: float
    mem_bw_gbps: float
    efficiency: float = 0.5  # fraction of peak reached by GEMMs
    attn_efficiency: float | None = None  # attention kernels; None: same as efficiency
    mem_efficiency: float = 0.8  # fraction of the HBM bandwidth reached by streaming reads (roofline.py)
    chunk_overhead_ms: float = 0.0  # fixed cost per chunk and stage: launch, scheduler, P2P sync
    mem_gb: float = 0.0  # HBM per device (GB); 0: unknown (`tune layout` then needs --mem-gb)
    link_gbps: float = 0.0  # all-reduce bus bandwidth inside a node (GB/s, NCCL's busbw); 0: TP traffic free
    link_latency_ms: float = 0.0  # per all-reduce

    def __post_init__(self):
        if not (self.peak_bf16_tflops > 0 and self.mem_bw_gbps > 0 and self.peak_fp8_tflops >= 0):
            raise ValueError(f"DeviceSpec {self.name}: peaks and bandwidth must be > 0 (fp8 peak may be 0)")
        for k in ("mem_gb", "link_gbps", "link_latency_ms"):
            if not (getattr(self, k) >= 0 and math.isfinite(getattr(self, k))):
                raise ValueError(f"DeviceSpec.{k}={getattr(self, k)!r} must be a finite number >= 0")
        if not (self.chunk_overhead_ms >= 0 and math.isfinite(self.chunk_overhead_ms)):
            raise ValueError(f"DeviceSpec.chunk_overhead_ms={self.chunk_overhead_ms!r} must be a finite number >= 0")
        for k in ("efficiency", "attn_efficiency", "mem_efficiency"):
            v = getattr(self, k)
            if v is not None and not 0 < v <= 1:
                raise ValueError(f"DeviceSpec.{k}={v!r} must be in (0, 1]")

    def peak_tflops(self, dtype: str) -> float:
        if dtype == "bf16":
            return self.peak_bf16_tflops
        if dtype == "fp8":
            if self.peak_fp8_tflops <= 0:
                raise ValueError(f"device {self.name} has no FP8 tensor cores: give --dtype bfloat16 (or auto for a "
                                 "bf16 checkpoint)")
            return self.peak_fp8_tflops
        raise ValueError(f"dtype={dtype!r}: use 'bf16' or 'fp8'")


MODELS = {
    "qwen3-235b-a22b": ModelSpec(94, 4096, 64, 4, 128, 12288, 151936, num_experts=128, top_k=8,
                                 moe_intermediate_size=1536, name="qwen3-235b-a22b"),
    "deepseek-v3": ModelSpec(61, 7168, 128, 128, 192, 18432, 129280, num_experts=256, top_k=8,
                             moe_intermediate_size=2048, num_dense_layers=3, num_shared_experts=1,
                             kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128,
                             v_head_dim=128, weight_bytes=1, name="deepseek-v3"),
    "llama3-8b": ModelSpec(32, 4096, 32, 8, 128, 14336, 128256, name="llama3-8b"),
    "llama3-70b": ModelSpec(80, 8192, 64, 8, 128, 28672, 128256, name="llama3-70b"),
    "llama3.1-405b": ModelSpec(126, 16384, 128, 8, 128, 53248, 128256, name="llama3.1-405b"),
    "qwen2.5-32b": ModelSpec(64, 5120, 40, 8, 128, 27648, 152064, name="qwen2.5-32b"),
    "smollm2-135m": ModelSpec(30, 576, 9, 3, 64, 1536, 49152, tie_word_embeddings=True, name="smollm2-135m"),
}
MODELS["qwen3-235b-a22b-fp8"] = replace(MODELS["qwen3-235b-a22b"], weight_bytes=1, name="qwen3-235b-a22b-fp8")


def device_of(name: str | None, flag: str = "--gpu") -> "DeviceSpec":
    """The device preset `name`, matched case-insensitively (h20, H20); none given, or an unknown one, is one
    line listing the presets: an analytic figure depends on the device, so none is assumed."""
    if name:
        found = {k.lower(): v for k, v in DEVICES.items()}.get(str(name).lower())
        if found is not None:
            return found
    raise ValueError(f"{flag} {name!r}: choose one of {', '.join(sorted(DEVICES))}" if name else
                     f"an analytic model needs {flag}: one of {', '.join(sorted(DEVICES))}")


def check_tp(model: ModelSpec, tp: int, flag: str = "--tp-size") -> None:
    """SGLang shards attention heads over TP: the query heads must divide evenly, and the KV heads either
    divide or are replicated (tp a multiple of them). Otherwise one line naming the flag and the sizes that work."""
    q, kv = model.num_heads, model.num_kv_heads
    if tp >= 1 and q % tp == 0 and (kv % tp == 0 or tp % kv == 0):
        return
    ok = [t for t in range(1, q + 1) if q % t == 0 and (kv % t == 0 or t % kv == 0)]
    raise ValueError(f"{flag} {tp}: {model.name} has {q} attention heads and {kv} KV heads, which TP {tp} cannot "
                     f"shard; use one of {', '.join(map(str, ok[:12]))}")


def model_of(source: str, flag: str = "--analytic") -> ModelSpec:
    """The analytic model of `source`: a preset name (MODELS), or the user's own model, a local HF model
    folder (its config.json) or a config.json file, read offline (`ModelSpec.from_hf_config`: dense, GQA,
    MoE and MLA fields). A config the model cannot price (sliding-window attention) is refused by name."""
    import json
    from pathlib import Path

    if source in MODELS:
        return MODELS[source]
    p = Path(str(source)).expanduser()
    path = p / "config.json" if p.is_dir() else p
    if p.is_dir() and not path.is_file():
        raise ValueError(f"{flag} {source!r}: the folder has no config.json; give a HF model folder, its "
                         f"config.json, or a preset ({', '.join(sorted(MODELS))})")
    if not path.is_file():
        raise ValueError(f"{flag} {source!r}: neither a preset ({', '.join(sorted(MODELS))}) nor a local HF model "
                         "folder or config.json")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{flag} {source!r}: {path} is not readable JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{flag} {source!r}: {path} holds a JSON {type(cfg).__name__}, not a HF config object")
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    window = text.get("sliding_window")
    if window and text.get("use_sliding_window", True) and int(window) < int(text.get("max_position_embeddings") or 1 << 62):
        raise ValueError(f"{flag} {source!r}: {path} sets sliding_window={window}; the analytic model prices full "
                         "attention over the whole prefix only (give a profile measured on the model instead)")
    try:
        return ModelSpec.from_hf_config(cfg, name=(p.name if p.is_dir() else path.parent.name) or path.stem)
    except ValueError as exc:
        raise ValueError(f"{flag} {source!r}: {path}: {exc}") from None

# GPUs: 2 ms per chunk and stage, the inter-stage sync SiPipe measures (1.4-2.6 ms, seeds digest section 7).
# Links: NCCL all-reduce bus bandwidth inside one node, about half the bidirectional NVLink figure (900 GB/s
# on H20/H100/H200, 600 on A100, 1800 on B200; MI300X's Infinity Fabric 896); L20 has no NVLink (PCIe Gen4);
# ~20 us per all-reduce.
_GPU_CHUNK_MS = 2.0
_NV = dict(chunk_overhead_ms=_GPU_CHUNK_MS, link_latency_ms=0.02)
DEVICES = {
    "H20": DeviceSpec("H20", 148.0, 296.0, 4000.0, mem_gb=96.0, link_gbps=450.0, **_NV),
    "H100": DeviceSpec("H100", 989.0, 1979.0, 3350.0, mem_gb=80.0, link_gbps=450.0, **_NV),
    "H200": DeviceSpec("H200", 989.0, 1979.0, 4800.0, mem_gb=141.0, link_gbps=450.0, **_NV),
    "A100": DeviceSpec("A100", 312.0, 0.0, 2039.0, mem_gb=80.0, link_gbps=240.0, **_NV),
    "L20": DeviceSpec("L20", 119.5, 239.0, 864.0, mem_gb=48.0, link_gbps=20.0, **_NV),  # TD-Pipe's Table 1
    # NVIDIA DGX B200 datasheet, per GPU (one eighth of the system): 2.25 PFLOPS dense BF16 (4.5 sparse), 4.5
    # PFLOPS dense FP8, 180 GB HBM3e at 8 TB/s, NVLink 5 at 1.8 TB/s bidirectional
    "B200": DeviceSpec("B200", 2250.0, 4500.0, 8000.0, mem_gb=180.0, link_gbps=900.0, **_NV),
    # AMD Instinct MI300X datasheet: 1307.4 TFLOPS dense BF16, 2614.9 dense FP8, 192 GB HBM3 at 5.3 TB/s, 7
    # Infinity Fabric links of 128 GB/s bidirectional each (896 GB/s)
    "MI300X": DeviceSpec("MI300X", 1307.4, 2614.9, 5300.0, mem_gb=192.0, link_gbps=448.0, **_NV),
    "cpu-2core": DeviceSpec("cpu-2core", 0.2, 0.0, 20.0),
}


__all__ = ["ModelSpec", "DeviceSpec", "MODELS", "DEVICES", "model_of", "device_of", "check_tp", "context_length"]
