"""The layers kernels.py times: one TP rank's share of a decoder layer, in plain torch (random weights, shapes only).

Attention: GQA (Llama, Qwen3) or MLA as SGLang prefills it over a cached prefix on Hopper (DeepSeek-V3: the
prefix's K/V rebuilt from the latent cache by kv_b_proj at every chunk, then MHA with 192-dim q/k and 128-dim
v: a per-chunk cost that grows with the prefix, ROCm ATOM's gamma * L). MLP: dense SwiGLU, or MoE: a router,
top-k, the routed experts as one grouped GEMM (torch's `grouped_mm`, on Hopper in torch 2.11; a per-expert
loop where it does not run) and the shared experts as a dense MLP. TP splits heads and FFN widths (SGLang's
TP MoE splits each expert's intermediate size; no EP).
"""
from __future__ import annotations

from dataclasses import replace


def shard(spec, tp: int):
    """One TP rank's share of every layer of `spec` (its MoE layers: num_dense_layers 0)."""
    if tp < 1 or spec.num_heads % tp:
        raise ValueError(f"--tp {tp} must divide {spec.name}'s {spec.num_heads} attention heads")
    return replace(spec, num_heads=spec.num_heads // tp, num_kv_heads=max(1, spec.num_kv_heads // tp),
                   intermediate_size=max(1, spec.intermediate_size // tp),
                   moe_intermediate_size=spec.moe_intermediate_size // tp, num_dense_layers=0,
                   name=f"{spec.name} TP{tp} rank" if tp > 1 else spec.name)


def pick_grouped_mm(torch, device: str):
    """torch's grouped GEMM when it runs here on bf16 (2-D tokens x 3-D experts with offsets), else None."""
    fn = getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
    if fn is None:
        return None
    try:
        a = torch.randn(32, 64, device=device, dtype=torch.bfloat16)
        b = torch.randn(2, 64, 32, device=device, dtype=torch.bfloat16)
        out = fn(a, b, offs=torch.tensor([16, 32], device=device, dtype=torch.int32))
        return fn if tuple(out.shape) == (32, 32) else None
    except Exception:  # noqa: BLE001  (the loop is the fallback; which one ran is written to the results)
        return None


def make_layer(torch, spec, w, max_len: int, attn: dict) -> dict:
    """Weights and caches of one layer; `w(*shape)` draws a random bf16 tensor."""
    H, nq = spec.hidden_size, spec.num_heads
    lay = {}
    if spec.is_mla:
        qk, rope, rank = spec.qk_dim, spec.qk_rope_head_dim, spec.kv_lora_rank
        if spec.q_lora_rank:
            lay.update(q_a=w(H, spec.q_lora_rank), q_b=w(spec.q_lora_rank, nq * qk))
        else:
            lay["q"] = w(H, nq * qk)
        lay.update(kv_a=w(H, rank + rope), kv_b=w(rank, nq * (spec.qk_nope_head_dim + spec.v_head_dim)),
                   o=w(nq * spec.v_head_dim, H), latent=w(max_len, rank), rope=w(max_len, rope))
    else:
        kv, hd = attn["kv_heads"], spec.head_dim
        lay.update(qkv=w(H, (nq + 2 * kv) * hd), o=w(nq * hd, H), k=w(1, kv, max_len, hd), v=w(1, kv, max_len, hd))
    if spec.num_experts:
        E, inter = spec.num_experts, spec.moe_intermediate_size
        lay.update(router=w(H, E), gu_e=w(E, H, 2 * inter), down_e=w(E, inter, H))
        if spec.num_shared_experts:
            lay.update(gu=w(H, 2 * inter * spec.num_shared_experts), down=w(inter * spec.num_shared_experts, H))
    else:
        lay.update(gu=w(H, 2 * spec.intermediate_size), down=w(spec.intermediate_size, H))
    return lay


def attention(torch, spec, lay: dict, attn: dict, a, L: int, x: int, sdpa, linear: bool, fake_q, fake_o):
    """One layer's attention of x new tokens over L cached ones; the attention core through `sdpa(q, k, v)`
    (heads first). linear=False replaces the projections by same-shape tensors (`fake_q`, `fake_o`)."""
    nq = spec.num_heads
    if spec.is_mla:
        qk, nope, vd, rank = spec.qk_dim, spec.qk_nope_head_dim, spec.v_head_dim, spec.kv_lora_rank
        if linear:
            q = (a @ lay["q_a"]) @ lay["q_b"] if "q_a" in lay else a @ lay["q"]
            lat = a @ lay["kv_a"]
            lay["latent"][L:L + x], lay["rope"][L:L + x] = lat[:, :rank], lat[:, rank:]
            kv = (lay["latent"][:L + x] @ lay["kv_b"]).view(L + x, nq, nope + vd)  # the prefix rebuilt
        else:
            q, kv = fake_q(x, nq * qk), fake_q(L + x, nq * (nope + vd)).view(L + x, nq, nope + vd)
        k = torch.cat([kv[..., :nope], lay["rope"][:L + x, None, :].expand(L + x, nq, qk - nope)], dim=-1)
        v = kv[..., nope:]
        if attn.get("pad_v"):
            v = torch.nn.functional.pad(v, (0, qk - vd))
        o = sdpa(q.view(1, x, nq, qk).transpose(1, 2), k.transpose(0, 1)[None], v.transpose(0, 1)[None])
        o = o[..., :vd].transpose(1, 2).reshape(x, nq * vd)
    else:
        kv, hd = attn["kv_heads"], spec.head_dim
        qkv = a @ lay["qkv"] if linear else fake_q(x, (nq + 2 * kv) * hd)
        q, k, v = qkv.split([nq * hd, kv * hd, kv * hd], dim=1)
        lay["k"][0, :, L:L + x] = k.view(x, kv, hd).transpose(0, 1)
        lay["v"][0, :, L:L + x] = v.view(x, kv, hd).transpose(0, 1)
        o = sdpa(q.view(1, x, nq, hd).transpose(1, 2), lay["k"][:, :, :L + x], lay["v"][:, :, :L + x])
        o = o.transpose(1, 2).reshape(x, nq * hd)
    return o @ lay["o"] if linear else fake_o(x)


def mlp(torch, spec, lay: dict, a, grouped):
    """One layer's MLP: dense SwiGLU, or MoE (router, top-k, routed experts, shared experts)."""
    F = torch.nn.functional

    def swiglu(h, gu, down):
        gate, up = (h @ gu).chunk(2, dim=-1)
        return (F.silu(gate) * up) @ down

    if not spec.num_experts:
        return swiglu(a, lay["gu"], lay["down"])
    x, k, E = a.shape[0], spec.top_k, spec.num_experts
    prob, top = torch.softmax(a @ lay["router"], dim=-1).topk(k, dim=-1)
    flat = top.flatten()
    order = flat.argsort()
    tok = order // k  # the token of each (token, expert) pair, grouped by expert
    xs = a[tok]
    counts = torch.bincount(flat, minlength=E)
    if grouped is not None:
        offs = counts.cumsum(0).to(torch.int32)
        gate, up = grouped(xs, lay["gu_e"], offs=offs).chunk(2, dim=-1)
        ys = grouped(F.silu(gate) * up, lay["down_e"], offs=offs)
    else:  # one GEMM pair per expert that got tokens
        ys, at = torch.empty(xs.shape[0], spec.hidden_size, device=a.device, dtype=a.dtype), 0
        for e, n in enumerate(counts.tolist()):
            if n:
                ys[at:at + n] = swiglu(xs[at:at + n], lay["gu_e"][e], lay["down_e"][e])
                at += n
    out = torch.zeros_like(a).index_add_(0, tok, ys * prob.flatten()[order, None].to(ys.dtype))
    if spec.num_shared_experts:
        out = out + swiglu(a, lay["gu"], lay["down"])
    return out


__all__ = ["shard", "pick_grouped_mm", "make_layer", "attention", "mlp"]
