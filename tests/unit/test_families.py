"""Issue 58 item 1: a model's family comes from its config's `architectures` (else `model_type`), and each family's
expert fields are read by their own names. Every figure here is hand arithmetic written in the test from the
public config.json values (weights: attention q/k/v/o or MLA's projections, gated FFNs of 3 matrices, routers,
embedding and LM head), checked against ModelSpec within 2%, and against the parameter counts the model cards
publish."""
from __future__ import annotations

import pytest

from sglang_cpp.whatif.specs import ModelSpec, model_of

MIXTRAL_8X7B = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
                "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
                "num_hidden_layers": 32, "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2,
                "max_position_embeddings": 32768, "sliding_window": None, "tie_word_embeddings": False}
QWEN25_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
             "intermediate_size": 18944, "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28,
             "vocab_size": 152064, "tie_word_embeddings": False, "max_position_embeddings": 32768,
             "use_sliding_window": False, "sliding_window": 131072}
LLAMA31_70B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
               "intermediate_size": 28672, "num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 80,
               "vocab_size": 128256, "max_position_embeddings": 131072}
LLAMA31_8B = {**LLAMA31_70B, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
              "num_hidden_layers": 32}
QWEN3_30B_A3B = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
                 "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768, "num_attention_heads": 32,
                 "num_key_value_heads": 4, "num_hidden_layers": 48, "vocab_size": 151936, "num_experts": 128,
                 "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
                 "tie_word_embeddings": False}
QWEN2_57B_A14B = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 3584,
                  "intermediate_size": 18944, "moe_intermediate_size": 2560, "shared_expert_intermediate_size": 20480,
                  "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 151936,
                  "num_experts": 64, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "tie_word_embeddings": False}
DEEPSEEK_V2_LITE = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 2048,
                    "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_attention_heads": 16,
                    "num_key_value_heads": 16, "num_hidden_layers": 27, "vocab_size": 102400, "kv_lora_rank": 512,
                    "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                    "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1,
                    "moe_layer_freq": 1, "tie_word_embeddings": False}
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
               "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_attention_heads": 128,
               "num_key_value_heads": 128, "num_hidden_layers": 61, "vocab_size": 129280, "kv_lora_rank": 512,
               "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
               "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
               "moe_layer_freq": 1, "tie_word_embeddings": False}


def gqa(H, nq, nkv, d=None):
    d = d or H // nq
    return 2 * H * nq * d + 2 * H * nkv * d  # q and o, k and v


def mla(H, nq, q_lora, kv_lora, nope, rope, v):
    q = H * nq * (nope + rope) if not q_lora else H * q_lora + q_lora * nq * (nope + rope)
    return q + H * (kv_lora + rope) + kv_lora * nq * (nope + v) + nq * v * H  # q, kv_a, kv_b, o


# (config, total weights, active non-embedding weights per token, published total in billions)
CASES = {
    "Mixtral-8x7B": (MIXTRAL_8X7B, 32 * (gqa(4096, 32, 8) + 8 * 3 * 4096 * 14336 + 4096 * 8) + 2 * 32000 * 4096,
                     32 * (gqa(4096, 32, 8) + 2 * 3 * 4096 * 14336 + 4096 * 8), 46.7),
    "Qwen2.5-7B": (QWEN25_7B, 28 * (gqa(3584, 28, 4) + 3 * 3584 * 18944) + 2 * 152064 * 3584,
                   28 * (gqa(3584, 28, 4) + 3 * 3584 * 18944), 7.61),
    "Llama-3.1-70B": (LLAMA31_70B, 80 * (gqa(8192, 64, 8) + 3 * 8192 * 28672) + 2 * 128256 * 8192,
                      80 * (gqa(8192, 64, 8) + 3 * 8192 * 28672), 70.6),
    "Llama-3.1-8B": (LLAMA31_8B, 32 * (gqa(4096, 32, 8) + 3 * 4096 * 14336) + 2 * 128256 * 4096,
                     32 * (gqa(4096, 32, 8) + 3 * 4096 * 14336), 8.03),
    "Qwen3-30B-A3B": (QWEN3_30B_A3B, 48 * (gqa(2048, 32, 4, 128) + 128 * 3 * 2048 * 768 + 2048 * 128)
                      + 2 * 151936 * 2048, 48 * (gqa(2048, 32, 4, 128) + 8 * 3 * 2048 * 768 + 2048 * 128), 30.5),
    "Qwen2-57B-A14B": (QWEN2_57B_A14B, 28 * (gqa(3584, 28, 4) + 64 * 3 * 3584 * 2560 + 3 * 3584 * 20480 + 3584 * 64)
                       + 2 * 151936 * 3584,
                       28 * (gqa(3584, 28, 4) + 8 * 3 * 3584 * 2560 + 3 * 3584 * 20480 + 3584 * 64), 57.4),
    "DeepSeek-V2-Lite": (DEEPSEEK_V2_LITE, mla(2048, 16, 0, 512, 128, 64, 128) * 27 + 3 * 2048 * 10944
                         + 26 * (64 * 3 * 2048 * 1408 + 2 * 3 * 2048 * 1408 + 2048 * 64) + 2 * 102400 * 2048,
                         mla(2048, 16, 0, 512, 128, 64, 128) * 27 + 3 * 2048 * 10944
                         + 26 * ((6 + 2) * 3 * 2048 * 1408 + 2048 * 64), 15.7),
    "DeepSeek-V3": (DEEPSEEK_V3, mla(7168, 128, 1536, 512, 128, 64, 128) * 61 + 3 * 3 * 7168 * 18432
                    + 58 * (256 * 3 * 7168 * 2048 + 3 * 7168 * 2048 + 7168 * 256) + 2 * 129280 * 7168,
                    mla(7168, 128, 1536, 512, 128, 64, 128) * 61 + 3 * 3 * 7168 * 18432
                    + 58 * ((8 + 1) * 3 * 7168 * 2048 + 7168 * 256), 671.0),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_family_is_priced_from_its_own_fields(name):
    cfg, total, active, published = CASES[name]
    spec = ModelSpec.from_hf_config(cfg, name=name)
    assert spec.total_params == pytest.approx(total, rel=0.02)
    assert spec.active_params == pytest.approx(active, rel=0.02)
    assert 2 * spec.active_params == pytest.approx(2 * active, rel=0.02)  # FLOPs per token, linear layers
    assert total / 1e9 == pytest.approx(published, rel=0.02)  # the hand arithmetic is the model card's count


def test_mixtral_weights_per_gpu_are_its_experts_not_a_dense_models():
    """The issue's case: Mixtral-8x7B at TP4 was said to need 4.7 GB per GPU (priced dense, its experts under
    num_local_experts ignored); its bf16 weights are 46.7B x 2 bytes / 4 = 23.4 GB per GPU."""
    spec = ModelSpec.from_hf_config(MIXTRAL_8X7B)
    assert spec.num_experts == 8 and spec.top_k == 2 and spec.moe_intermediate_size == 14336
    assert spec.total_params * spec.weight_bytes / 4 / 1e9 == pytest.approx(23.35, rel=0.01)


@pytest.mark.parametrize("cfg,said", [
    ({**LLAMA31_8B, "architectures": ["GPTBigCodeForCausalLM"], "model_type": "gpt_bigcode"},
     "architectures ['GPTBigCodeForCausalLM'] is not a family"),
    ({k: v for k, v in LLAMA31_8B.items() if k != "architectures"} | {"model_type": "falcon"},
     "model_type 'falcon' is not a family"),
    ({k: v for k, v in MIXTRAL_8X7B.items() if k not in ("architectures", "model_type")},
     "model_type None is not a family"),  # expert fields without a family: never priced dense
])
def test_an_unknown_family_is_refused_naming_it_and_the_supported_ones(cfg, said):
    with pytest.raises(ValueError, match="not a family the analytic model prices; supported: DeepseekV2ForCausalLM") as e:
        ModelSpec.from_hf_config(cfg)
    assert said in str(e.value)


def test_a_config_without_architectures_or_model_type_is_dense_only_without_expert_fields(tmp_path):
    import json

    dense = {k: v for k, v in LLAMA31_8B.items() if k not in ("architectures", "model_type")}
    (tmp_path / "config.json").write_text(json.dumps(dense))
    assert model_of(str(tmp_path), "--model-path").num_experts == 0


def test_a_config_that_is_not_an_object_is_one_line(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="holds a JSON list, not a HF config object"):
        model_of(str(tmp_path / "config.json"), "--model-path")
