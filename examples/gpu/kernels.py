"""What a lent GPU without SGLang can still tell: t(L, x) of a Llama-shaped decoder stack in plain torch.

Why: the lent GPU machines have torch with CUDA but no SGLang (nothing can be installed there, and SGLang's
CUDA wheels are far over what a call can carry), so the server-based steps of check.py cannot run. The
kernels underneath are the same family SGLang runs on Hopper: cuBLAS GEMMs and a FlashAttention-style
kernel that attends x queries over L + x keys. Timing them answers what the CPU host cannot:
  - is t(L, x) FlashAttention-shaped on a real GPU (d L^2 ~ 0, e = 2f), and does the fitted model predict
    held-out (L, x);
  - the small-chunk regime (issue 25 item 5): how far GEMM and attention efficiency fall below their
    large-chunk values at small x, against the analytic model's one constant efficiency;
  - the eager per-chunk fixed cost (c0) of one forward, without scheduling or P2P.

Each forward is timed on CUDA events by the plugin's own DeviceTimer (torch's events passed in: no SGLang).
No RoPE, no sampling, random weights: GEMM and attention shapes only. `python examples/gpu/kernels.py
--device cpu --max-len 2048` runs the same code on a CPU at toy sizes (a smoke run, not a measurement).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]  # the checkout (the GPU machine cannot pip install)

from sglang_cpp.machine import source_commit  # noqa: E402
from sglang_cpp.plugin.timing import DeviceTimer  # noqa: E402  (pure python: no SGLang import)
from sglang_cpp.whatif.analytic import MODELS, ModelSpec  # noqa: E402


@dataclass(frozen=True)
class KernelsConfig:
    max_len: int = 131072  # L + x of the longest forward
    chunks: tuple = (512, 1024, 2048, 4096, 8192, 16384)
    prefixes: tuple = (0, 16384, 32768, 65536, 98304, 114688)
    # the small-chunk sweep, with the blog's fixed 6K and DCK's 18K first chunk among the sizes
    small: tuple = (64, 128, 256, 512, 1024, 2048, 4096, 6144, 8192, 12288, 16384, 18432)
    small_prefixes: tuple = (0, 65536)
    repeats: int = 5
    warmup: int = 1


SHAPES = {  # name: (model, layers timed per forward, TP); check-llama is the random-init model check.py serves
    "check-llama": (ModelSpec(8, 2048, 16, 4, 128, 5632, 32000, name="check-llama"), 8, 1),
    "llama3-8b": (MODELS["llama3-8b"], 2, 1),  # production-sized GEMMs; 2 layers keep the run short
    # the blog's models as one TP rank runs a stage's layers (issue 44 item 3): MoE layers of Qwen3-235B-A22B
    # at TP4 (128 experts, top-8, FlashAttention GQA), MLA + MoE layers of DeepSeek-V3 at TP8 (the prefix's K/V
    # rebuilt from the latent cache every chunk); 2 layers each, bf16 (DeepSeek's fp8 GEMMs are not timed)
    "qwen3-235b-a22b-tp4": (MODELS["qwen3-235b-a22b"], 2, 4),
    "deepseek-v3-tp8": (MODELS["deepseek-v3"], 2, 8),
}


def pick_attention(torch, device: str, spec: ModelSpec) -> dict:
    """The first (backend, GQA) that runs a lower-right causal chunk-over-prefix attention; never the math
    backend, which would materialise x * (L + x) scores and is not what a serving engine runs. MLA: 192-dim
    q/k and 128-dim v, v zero-padded to 192 where the kernel wants one head size."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    errors = []
    qk, vd = spec.qk_dim, spec.v_dim
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION"):
        for gqa, pad in ((True, False), (False, False), (False, True)):
            if (gqa and spec.is_mla) or (pad and not spec.is_mla):
                continue
            kv = spec.num_kv_heads if gqa else spec.num_heads
            q = torch.randn(1, spec.num_heads, 64, qk, device=device, dtype=torch.bfloat16)
            k = torch.randn(1, kv, 192, qk, device=device, dtype=torch.bfloat16)
            v = torch.randn(1, kv, 192, qk if pad else vd, device=device, dtype=torch.bfloat16)
            try:
                with sdpa_kernel([getattr(SDPBackend, name)]):
                    out = torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, attn_mask=causal_lower_right(64, 192), **({"enable_gqa": True} if gqa else {}))
                assert out.shape[:3] == q.shape[:3]
                return {"backend": name, "gqa": gqa, "kv_heads": kv, **({"pad_v": True} if pad else {})}
            except Exception as exc:  # the next (backend, gqa): the chosen one is written to the results
                errors.append(f"{name} gqa={gqa} pad_v={pad}: {type(exc).__name__}: {str(exc)[:120]}")
    raise RuntimeError("no fused attention kernel runs a lower-right causal mask here: " + " | ".join(errors))


class Stack:
    """`layers` decoder layers of `spec` (one TP rank's share) with a KV cache of max_len tokens (random:
    only shapes matter); the layers themselves are kernels_layers.py's."""

    def __init__(self, torch, spec: ModelSpec, layers: int, max_len: int, most: int, device: str, attn: dict):
        import kernels_layers as kl

        self.t, self.spec, self.attn, self.kl = torch, spec, attn, kl
        g = torch.Generator(device=device).manual_seed(0)

        def w(*shape):
            return (torch.randn(*shape, generator=g, device=device, dtype=torch.bfloat16) * 0.02)

        self.w = [kl.make_layer(torch, spec, w, max_len, attn) for _ in range(layers)]
        self.grouped = kl.pick_grouped_mm(torch, device) if spec.num_experts else None
        self.h = w(most, spec.hidden_size)
        self.fake = w(max_len * 4, 1)  # the linear-free pass reads its projections' outputs from here

    def fake_t(self, *shape):
        n = 1
        for d in shape:
            n *= d
        if n > self.fake.numel():
            self.fake = self.t.zeros(n, 1, device=self.fake.device, dtype=self.fake.dtype)
        return self.fake.view(-1)[:n].view(*shape)

    def forward(self, L: int, x: int, linear: bool = True, attention: bool = True):
        """One chunk of x tokens over a prefix of L: every layer's norms, projections, attention and MLP.
        linear=False or attention=False leaves that part out (its output replaced by a same-shape tensor)."""
        t, s = self.t, self.spec
        F = t.nn.functional
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(x, L + x)
        gqa = {"enable_gqa": True} if self.attn["gqa"] and self.attn["kv_heads"] != s.num_heads else {}

        def sdpa(q, k, v):
            if not attention:
                return self.fake_t(*q.shape[:3], v.shape[-1])
            with sdpa_kernel([getattr(SDPBackend, self.attn["backend"])]):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **gqa)

        h = self.h[:x]
        for lay in self.w:
            a = F.rms_norm(h, (s.hidden_size,))
            h = h + self.kl.attention(t, s, lay, self.attn, a, L, x, sdpa, linear, self.fake_t,
                                      lambda n: self.h[:n])
            if linear:
                h = h + self.kl.mlp(t, s, lay, F.rms_norm(h, (s.hidden_size,)), self.grouped)
        return h


def time_ms(torch, device: str, fn, repeats: int, warmup: int) -> list[float]:
    events = (lambda: torch.cuda.Event(enable_timing=True)) if device.startswith("cuda") else None
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    out = []
    for _ in range(repeats):
        timer = DeviceTimer(device, event_factory=events)
        timer.start()
        fn()
        timer.stop()
        out.append(timer.wait_ms())
    return out


def measure_shape(torch, name: str, cfg: KernelsConfig, device: str, progress=print, shape=None) -> dict:
    """Every (L, x) of the grid (whole forwards, for the fit) and of the small-chunk sweep (also GEMMs alone
    and attention alone). shape: (ModelSpec, layers), default SHAPES[name]."""
    import kernels_layers as kl

    spec, layers, *tp = shape or SHAPES[name]
    tp = tp[0] if tp else 1
    spec = kl.shard(spec, tp)
    attn = pick_attention(torch, device, spec)
    stack = Stack(torch, spec, layers, cfg.max_len, max(cfg.chunks + cfg.small), device, attn)
    moe = None if not spec.num_experts else ("grouped_mm" if stack.grouped is not None else "per-expert loop")
    rows = []
    grid = sorted({(L, x, "grid") for L in cfg.prefixes for x in cfg.chunks if L + x <= cfg.max_len}
                  | {(L, x, "small") for L in cfg.small_prefixes for x in cfg.small if L + x <= cfg.max_len})
    for L, x, kind in grid:
        row = {"L": L, "x": x, "kind": kind}
        parts = (("ms", {}), ("linear_ms", {"attention": False}), ("attention_ms", {"linear": False}))
        for part, kw in parts if kind == "small" else parts[:1]:  # the fit needs whole forwards only
            times = time_ms(torch, device, lambda: stack.forward(L, x, **kw), cfg.repeats, cfg.warmup)
            row[part] = statistics.median(times)
            if part == "ms":
                row["spread"] = (min(times), max(times))
        rows.append(row)
        progress(f"[gpu-kernels] {name} {kind} L={L} x={x}: {row['ms']:.3f} ms"
                 + (f" (linear {row['linear_ms']:.3f}, attention {row['attention_ms']:.3f})" if kind == "small" else ""),
                 flush=True)
    stack = None  # its weights and KV back to the allocator before the next shape (the closures above are done)
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return {"shape": name, "spec": asdict(spec), "layers": layers, "tp": tp, "attention": attn,
            **({"moe_kernel": moe} if moe else {}), "samples": rows}


def env_info(torch, device: str) -> dict:
    import datetime as dt
    import platform

    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "device": device}
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, sms=p.multi_processor_count, mem_gb=round(p.total_memory / 2**30, 1))
    else:
        info["gpu"] = "none (CPU smoke run)"
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = KernelsConfig()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {sorted(SHAPES)}")
    ap.add_argument("--max-len", type=int, default=d.max_len)
    ap.add_argument("--repeats", type=int, default=d.repeats)
    ap.add_argument("--out", default=str(ROOT / "results" / "gpu_kernels.json"))
    a = ap.parse_args(argv)
    import torch

    if a.max_len < d.max_len:  # a smoke run: the grid scaled down to fit max_len
        s = a.max_len / d.max_len
        cfg = replace(d, max_len=a.max_len, repeats=a.repeats, warmup=1,
                      chunks=tuple(sorted({max(16, int(c * s)) for c in d.chunks})),
                      prefixes=tuple(sorted({int(p * s) for p in d.prefixes})),
                      small=tuple(c for c in d.small if c <= a.max_len // 2), small_prefixes=(0, a.max_len // 2))
    else:
        cfg = replace(d, repeats=a.repeats)
    doc = new_doc(torch, cfg, a.device,
                  " ".join(["python examples/gpu/kernels.py", *(argv if argv is not None else sys.argv[1:])]))
    measure(torch, doc, a.shapes.split(","), cfg, a.device, Path(a.out))
    return 0


def new_doc(torch, cfg: KernelsConfig, device: str, command: str) -> dict:
    return {"format": "sglang-cpp-gpu-kernels", "env": env_info(torch, device), "config": asdict(cfg),
            "commit": source_commit(), "command": command, "shapes": []}


def measure(torch, doc: dict, shapes, cfg: KernelsConfig, device: str, out: Path) -> dict:
    for name in shapes:
        doc["shapes"].append(measure_shape(torch, name, cfg, device))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")  # after every shape: nothing lost on a timeout
    print(f"[gpu-kernels] wrote {out}", flush=True)
    return doc


if __name__ == "__main__":
    raise SystemExit(main())
