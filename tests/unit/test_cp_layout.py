"""Attention CP inside a stage (issue 30 item 1): every term of the analytic model's CP pricing by hand,
the layouts and launch line of `tune layout` with CP, and bad input. Hand figures come from the model
configs (llama3-8b: H 4096, 32 q heads, 8 KV heads of 128; deepseek-v3: H 7168, q_lora 1536, kv_lora 512,
rope 64, nope 128, v 128, 128 heads)."""
from __future__ import annotations

import json

import pytest

from sglang_cpp.cli import main as cli_main
from sglang_cpp.cli.tune.layout_cmd import LayoutConfig, launch_flags
from sglang_cpp.whatif.analytic import (DEVICES, MODELS, analytic_cost_model, kv_bytes_per_token, layer_comm_bytes,
                                        layer_comm_ms)
from sglang_cpp.whatif.layout import Layout, Ranked, layouts, stage_memory_gb
from sglang_cpp.whatif.roofline import roofline_stage

LLAMA8, DSV3, H20 = MODELS["llama3-8b"], MODELS["deepseek-v3"], DEVICES["H20"]
DS_REPLICATED = 7168 * 1536 + 7168 * (512 + 64)  # q_a and kv_a: ReplicatedLinear in SGLang's deepseek_v2.py
DS_SHARDED = 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168  # q_b, kv_b, o: split by heads


def test_attention_weights_per_rank_by_hand():
    # GQA: q and o split by heads; K/V split until each rank has one KV head, then replicated
    assert LLAMA8.attn_rank_params(4) == 2 * 4096 * 4096 / 4 + 2 * 4096 * 128 * 2 == LLAMA8.attn_params / 4
    assert LLAMA8.attn_rank_params(16) == 2 * 4096 * 4096 / 16 + 2 * 4096 * 128 * 1
    # MLA: the latent projections stay whole on every rank
    assert DSV3.attn_rank_params(1) == DS_REPLICATED + DS_SHARDED == DSV3.attn_params
    assert DSV3.attn_rank_params(8) == pytest.approx(DS_REPLICATED + DS_SHARDED / 8)


def test_cp_runs_the_replicated_projections_on_its_share_of_the_queries():
    """deepseek-v3, one layer (dense), TP8: CP8 (attention TP 1) runs q_a / kv_a on x/8 tokens, TP8 on all x;
    everything else per GPU is the same, so b differs by exactly 2 * 7/8 * replicated / (FLOP per ms)."""
    lin = 296e12 * H20.efficiency / 1e3  # fp8 checkpoint: fp8 GEMMs
    tp8 = analytic_cost_model(DSV3, H20, layers=1, tp=8)
    cp8 = analytic_cost_model(DSV3, H20, layers=1, tp=8, cp=8)
    assert tp8.b - cp8.b == pytest.approx(2 * DS_REPLICATED * 7 / 8 / lin)
    assert tp8.b == pytest.approx(2 * (DS_REPLICATED + DS_SHARDED / 8 + 3 * 7168 * 18432 / 8) / lin)
    assert cp8.e == tp8.e and cp8.f == tp8.f  # attention FLOPs per GPU: heads x queries is conserved
    # the MLA prefix rebuild (kv_b over all L latents) runs on every CP rank for its attention-TP heads
    assert tp8.g == pytest.approx(2 * 512 * 128 * 256 / 8 / lin)
    assert cp8.g == pytest.approx(8 * tp8.g)
    assert analytic_cost_model(DSV3, H20, layers=1, tp=8, cp=2).g == pytest.approx(2 * tp8.g)


def test_gqa_cp_removes_the_kv_head_replication_of_wide_tp():
    """llama3-8b at TP16 computes one KV head per rank (8 heads, 16 ranks: half of it replicated); CP2 runs
    attention on TP8, where each rank has exactly one head, on x/2 tokens."""
    lin = 148e12 * H20.efficiency / 1e3
    tp16 = analytic_cost_model(LLAMA8, H20, layers=1, tp=16)
    cp2 = analytic_cost_model(LLAMA8, H20, layers=1, tp=16, cp=2)
    ffn = 3 * 4096 * 14336 / 16
    assert tp16.b == pytest.approx(2 * (2 * 4096 * 4096 / 16 + 2 * 4096 * 128 + ffn) / lin)
    assert cp2.b == pytest.approx(2 * ((2 * 4096 * 4096 / 8 + 2 * 4096 * 128) / 2 + ffn) / lin)
    # no replication (TP4 over 8 KV heads): CP changes no FLOP
    assert analytic_cost_model(LLAMA8, H20, layers=1, tp=4, cp=2).b == pytest.approx(
        analytic_cost_model(LLAMA8, H20, layers=1, tp=4).b)


def test_layer_collectives_by_hand():
    h = 4096 * 2
    assert layer_comm_bytes(LLAMA8, 8) == [2 * 7 / 8 * h, 2 * 7 / 8 * h]  # TP: two all-reduces
    assert layer_comm_bytes(LLAMA8, 1) == []
    # CP2 on TP8 (attention TP 4): the chunk's K/V all-gathered (2 of the 8 KV heads per rank), the x/2 attention
    # outputs all-reduced over 4, the hidden states all-gathered over CP, the FFN's all-reduce over 8
    assert layer_comm_bytes(LLAMA8, 8, 2) == [1 / 2 * (2 * 2 * 128 * 2), 2 * 3 / 4 * h / 2, 1 / 2 * h, 2 * 7 / 8 * h]
    # CP8 (attention TP 1): no attention all-reduce; each rank's K/V is all 8 heads
    assert layer_comm_bytes(LLAMA8, 8, 8) == [7 / 8 * (2 * 8 * 128 * 2), 7 / 8 * h, 2 * 7 / 8 * h]
    # MLA: the latent (512 + 64 values per token) is what CP gathers
    assert layer_comm_bytes(DSV3, 8, 8)[0] == 7 / 8 * (512 + 64) * 2
    per_token, per_chunk = layer_comm_ms(LLAMA8, H20, 8, 2)
    assert per_token == pytest.approx(sum(layer_comm_bytes(LLAMA8, 8, 2)) / 450e9 * 1e3)
    assert per_chunk == pytest.approx(4 * 0.02)  # four collectives' latency against TP's two
    charged = analytic_cost_model(LLAMA8, H20, layers=3, tp=8, cp=2, tp_comm=True)
    plain = analytic_cost_model(LLAMA8, H20, layers=3, tp=8, cp=2)
    assert charged.b - plain.b == pytest.approx(3 * per_token) and charged.c0 - plain.c0 == pytest.approx(3 * per_chunk)


def test_roofline_reads_the_whole_prefix_on_every_cp_rank():
    """llama3-8b TP8 vs TP8 with CP2 (attention TP 4): each GPU holds 2 KV heads instead of 1 and reads the
    whole prefix once (g doubles), but once per 128-query tile of only x/2 queries (e unchanged)."""
    per_ms = 4000e9 * H20.mem_efficiency / 1e3
    assert kv_bytes_per_token(LLAMA8, 4) == 2 * kv_bytes_per_token(LLAMA8, 8) == 2 * 2 * 128 * 2
    tp = roofline_stage(LLAMA8, H20, layers=2, tp=8).rows[1]  # GEMM FLOPs with attention bytes
    cp = roofline_stage(LLAMA8, H20, layers=2, tp=8, cp=2).rows[1]
    assert tp.g == pytest.approx(2 * 512 / per_ms) and cp.g == pytest.approx(2 * tp.g)
    assert cp.e == pytest.approx(tp.e) == pytest.approx(2 * 512 / 128 / per_ms)


def test_memory_with_cp_by_hand():
    """llama3-8b, TP8 with CP2, one stage, 1000 tokens: attention TP 4 holds a quarter of the attention
    weights and 2 KV heads; the FFN is an eighth; the embedding and LM head are vocab-parallel over TP8."""
    layer = (41_943_040 / 4 + 176_160_768 / 8) * 2
    kv = 2 * 2 * 128 * 2 * 1000
    table = 128256 * 4096 * 2 / 8
    assert stage_memory_gb(LLAMA8, (32,), 8, 1000, cp=2) == pytest.approx([(32 * (layer + kv) + 2 * table) / 1e9])


def test_cp_layouts_divide_the_tp_group():
    got = {(lay.tp, lay.pp, lay.cp) for lay in layouts(32, 94, 8, (1,), (1, 2, 4, 8))}
    assert got == {(1, 32, 1), (2, 16, 1), (2, 16, 2), (4, 8, 1), (4, 8, 2), (4, 8, 4),
                   (8, 4, 1), (8, 4, 2), (8, 4, 4), (8, 4, 8)}
    assert Layout(8, 4, 1, 2).name == "TP8 (CP2) x PP4" and Layout(8, 4).name == "TP8 x PP4"


@pytest.mark.parametrize("tp,cp", [(8, 3), (4, 8), (8, 0)])
def test_a_cp_that_does_not_divide_tp_is_refused(tp, cp):
    with pytest.raises(ValueError, match="--attn-cp-size"):
        analytic_cost_model(LLAMA8, H20, layers=1, tp=tp, cp=cp)


def test_tune_layout_prices_cp_and_prints_sglangs_cp_flags(tmp_path, capsys):
    S = 131072
    out = tmp_path / "l.json"
    rc = cli_main(["tune", "layout", "--analytic", "deepseek-v3", "--gpu", "H20", "--gpus", "16",
                   "--input-lens", "32k,128k", "--virtual-stages", "1", "--cp-sizes", "1,8", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    names = {r["name"]: r for r in doc["layouts"]}
    assert {"TP8 x PP2", "TP8 (CP8) x PP2"} <= set(names) and names["TP8 (CP8) x PP2"]["attn_cp"] == 8
    assert names["TP8 (CP8) x PP2"]["infeasible"] is None and names["TP8 (CP8) x PP2"]["best"]["131072"]["ttft_ms"] > 0
    capsys.readouterr()
    cfg = LayoutConfig(analytic="deepseek-v3", device="H20")
    line = launch_flags(cfg, Ranked(Layout(8, 2, 1, 8), (31, 30), best={S: ("plan", 32768, 1.0)}), S, 61)
    assert line.endswith("--enable-dynamic-chunking --attn-cp-size 8 --enable-prefill-cp --cp-strategy zigzag")
    assert "--attn-cp-size" not in launch_flags(cfg, Ranked(Layout(8, 2), (31, 30), best={S: ("plan", 32768, 1.0)}), S, 61)
    rc = cli_main(["tune", "layout", "--analytic", "deepseek-v3", "--gpu", "H20", "--gpus", "16",
                   "--cp-sizes", "0"])
    assert rc == 2 and "--cp-sizes" in capsys.readouterr().err


def test_decode_step_by_hand():
    """llama3-8b on one H100, batch 1 over an empty context: the bf16 weights (32 layers of 41,943,040 +
    176,160,768 parameters) read at 0.8 of 3350 GB/s, plus the hidden states in and out and the KV written,
    the embedding row and the LM head's 128256 x 4096 read; attention over no prefix is one query. PP2 adds
    one hop: 20 us plus 8 KB over 450 GB/s. Doc B's 405B preset: 126 layers, hidden 16384, FFN 53248."""
    from sglang_cpp.whatif.layout import decode_ms

    h100 = DEVICES["H100"]
    per_ms = 3350e9 * 0.8 / 1e3
    weights = 32 * (41_943_040 + 176_160_768) * 2 / per_ms
    io = 32 * (4 * 4096 * 2 + 2 * 8 * 128 * 2) / per_ms + 4096 * 2 / 3350e9 * 1e3
    head = 4096 * 128256 * 2 / 3350e9 * 1e3
    attn = 32 * 32 * 256 / (989e12 * h100.efficiency / 1e3)  # a * x * (2L + x) at L = 0, x = 1
    assert decode_ms(LLAMA8, h100, 1, 1, 0) == pytest.approx(weights + io + head + attn, rel=1e-9)
    hop = 0.02 + 4096 * 2 / 450e9 * 1e3
    assert decode_ms(LLAMA8, h100, 1, 2, 0) == pytest.approx(weights + io + head + attn + hop, rel=1e-9)
    big = MODELS["llama3.1-405b"]
    assert 4.0e11 < big.total_params < 4.1e11  # "405B"
