"""`sglang-cpp tune layout` (whatif/layout.py, cli/tune/layout_cmd.py) and the TP all-reduce term it prices:
layouts, memory by hand, feasibility with the reason, crossovers, the CLI and its errors."""
from __future__ import annotations

import json

import pytest

from sglang_cpp.cli import main as cli_main
from sglang_cpp.whatif.analytic import DEVICES, MODELS, analytic_cost_model, layer_comm_ms
from sglang_cpp.whatif.layout import Layout, Ranked, crossovers, layouts, rank_layouts, stage_memory_gb

LLAMA8 = MODELS["llama3-8b"]


def test_layouts_of_32_gpus_by_hand():
    got = {(lay.tp, lay.pp, lay.v) for lay in layouts(32, 94, 8, (1, 2, 4))}
    # TP 1, 2, 4, 8 (a node); PP the rest; V only while PP*V <= 94 layers
    assert got == {(1, 32, 1), (1, 32, 2), (2, 16, 1), (2, 16, 2), (2, 16, 4), (4, 8, 1), (4, 8, 2), (4, 8, 4),
                   (8, 4, 1), (8, 4, 2), (8, 4, 4)}
    assert {(lay.tp, lay.pp) for lay in layouts(6, 32, 8)} == {(1, 6), (2, 3)}  # TP must divide the GPUs
    with pytest.raises(ValueError, match="--gpus=0"):
        layouts(0, 32)


def test_stage_memory_by_hand():
    """llama3-8b, TP2, two stages of 16 layers, 1000 tokens of KV: a layer holds 41,943,040 attention and
    176,160,768 FFN parameters (bf16) and 2 x 4 KV heads x 128 x 2 bytes per token; the 128256 x 4096 bf16
    embedding sits on stage 0 and the LM head on stage 1, vocab-parallel."""
    layer = (41_943_040 + 176_160_768) * 2 / 2
    kv = 2 * 4 * 128 * 2 * 1000
    table = 128256 * 4096 * 2 / 2
    want = (16 * (layer + kv) + table) / 1e9
    assert stage_memory_gb(LLAMA8, (16, 16), 2, 1000) == pytest.approx([want, want])
    assert stage_memory_gb(LLAMA8, (32,), 1, 0) == pytest.approx([(32 * 2 * layer + 2 * 2 * table) / 1e9])


def test_the_tp_all_reduce_term_by_hand():
    """Two ring all-reduces per layer of x bf16 hidden states: 2 (tp-1)/tp of the bytes each over the link."""
    h20 = DEVICES["H20"]
    per_token, per_chunk = layer_comm_ms(LLAMA8, h20, 4)
    assert per_token == pytest.approx(2 * 2 * 3 / 4 * 4096 * 2 / 450e9 * 1e3)
    assert per_chunk == pytest.approx(2 * 0.02)
    assert layer_comm_ms(LLAMA8, h20, 1) == (0.0, 0.0)
    plain = analytic_cost_model(LLAMA8, h20, layers=8, tp=4)
    charged = analytic_cost_model(LLAMA8, h20, layers=8, tp=4, tp_comm=True)
    assert charged.b - plain.b == pytest.approx(8 * per_token) and charged.c0 - plain.c0 == pytest.approx(8 * per_chunk)
    assert (charged.e, charged.g) == (plain.e, plain.g)  # attention and the prefix terms are untouched


def test_a_layout_that_cannot_hold_the_weights_and_kv_is_listed_with_the_reason():
    """llama3-70b (about 141 GB of bf16 weights) on 2 H100 (80 GB, 0.88 usable): no split fits."""
    ranked = rank_layouts(MODELS["llama3-70b"], DEVICES["H100"], 2, [32768], virtual_stages=(1,))
    assert {r.layout for r in ranked} == {Layout(1, 2), Layout(2, 1)}
    assert all(r.reason and "70.4 GB (0.88 of 80 GB)" in r.reason for r in ranked), [r.reason for r in ranked]
    ranked = rank_layouts(MODELS["llama3-70b"], DEVICES["H100"], 8, [32768, 131072], virtual_stages=(1, 2))
    ok = [r for r in ranked if not r.reason]
    assert ok and all(max(stage_memory_gb(MODELS["llama3-70b"], r.parts, r.layout.tp, 131072)) <= 0.88 * 80 + 1e-9
                      for r in ok)
    assert all(set(r.best) == {32768, 131072} and r.best[131072][2] > r.best[32768][2] for r in ok)


def test_crossovers_name_the_lengths_where_the_winner_changes():
    a, b = Ranked(Layout(8, 4)), Ranked(Layout(4, 8))
    win = {32768: a, 131072: b, 1048576: b}
    assert crossovers(win) == [(32768, 131072, "TP8 x PP4", "TP4 x PP8")]
    assert crossovers({32768: a, 131072: a}) == []


def test_the_cli_ranks_writes_json_and_prints_the_winners_flags(tmp_path, capsys):
    out = tmp_path / "layout.json"
    rc = cli_main(["tune", "layout", "--analytic", "qwen3-235b-a22b-fp8", "--gpu", "H20", "--gpus", "32",
                   "--input-lens", "32k,128k", "--virtual-stages", "1,2", "--json", str(out), "--plot",
                   str(tmp_path / "layout.png")])
    text = capsys.readouterr().out
    assert rc == 0 and (tmp_path / "layout.png").stat().st_size > 0
    doc = json.loads(out.read_text())
    names = {d["name"] for d in doc["layouts"]}
    assert {"TP4 x PP8", "TP8 x PP4", "TP4 x PP8 x V2"} <= names
    for S in ("32768", "131072"):
        w = doc["winners"][S]
        assert f"**best**" in text and "python -m sglang.launch_server" in text
        ok = [d for d in doc["layouts"] if not d["infeasible"]]
        fastest = min(d["best"][S]["ttft_ms"] for d in ok)
        tied = [d for d in ok if d["best"][S]["ttft_ms"] <= fastest * 1.03]  # the model's 3% error
        best = min(tied, key=lambda d: (d["mem_gb"], d["best"][S]["ttft_ms"]))  # the least memory among ties
        assert best["name"] == w and (len(tied) == 1 or "least memory per GPU" in text)
        assert min(best["ttft_ms"][S].values()) == best["best"][S]["ttft_ms"]  # its best policy is its minimum


@pytest.mark.parametrize("argv,match", [
    (["--analytic", "nope", "--gpu", "H20", "--gpus", "8"], "--analytic 'nope'"),
    (["--analytic", "llama3-8b", "--gpu", "B300", "--gpus", "8"], "--gpu 'B300'"),
    (["--analytic", "llama3-70b", "--gpu", "H100", "--gpus", "1", "--input-lens", "32k"], "--gpus 1: no layout"),
    (["--analytic", "llama3-8b", "--gpu", "H100", "--gpus", "8", "--input-lens", "256k", "--context-length", "128k"],
     "above --context-length"),
])
def test_bad_input_is_one_line_and_exit_2(argv, match, capsys):
    assert cli_main(["tune", "layout", *argv]) == 2
    err = capsys.readouterr().err
    assert match in err


@pytest.mark.parametrize("cmd,argv", [
    ("layout", ["--model-path", "llama3-8b", "--gpus", "8"]),
    ("partition", ["--model-path", "llama3-8b", "--pp-size", "2"]),
])
def test_the_gpu_is_required_where_the_answer_depends_on_it(cmd, argv, capsys, tmp_path):
    """Issue 47 item 1: `tune layout` and `tune partition` on an analytic model assumed an H100 when --gpu was
    left out; now one line, exit 2, listing the presets. A profile (partition) needs no --gpu: it was measured
    on its own device."""
    assert cli_main(["tune", cmd, *argv]) == 2
    err = capsys.readouterr().err
    assert f"sglang-cpp tune {cmd}: error: an analytic model needs --gpu: one of " in err  # every command's line
    assert "B200" in err and "H20" in err and "MI300X" in err and len(err.strip().splitlines()) == 1
    if cmd == "partition":
        from sglang_cpp.core.profile_io import save_profile

        prof = tmp_path / "layers.json"
        save_profile(prof, samples=[{"L": 0, "x": x, "ms": 1.0, "layer_ms": [0.1 * x / 512] * 6, "embed_ms": 0.05,
                                     "head_ms": 0.3 * x / 512} for x in (512, 2048)], meta={"num_hidden_layers": 6})
        assert cli_main(["tune", "partition", "--profile", str(prof), "--pp-size", "2"]) == 0
        out = capsys.readouterr()
        assert "SGLANG_PP_LAYER_PARTITION=" in out.out and "--gpu" not in out.err


def test_differences_inside_the_models_error_are_ties_not_a_best_or_a_crossover():
    """Issue 47 item 8: layouts within TIE_BAND (3%, the analytic model's stated error) of the best are ties; a
    change of winner inside it is no crossover; one beyond it is."""
    from sglang_cpp.whatif.layout import TIE_BAND, ties

    a = Ranked(Layout(8, 4), best={32768: ("plan", 0, 1000.0), 131072: ("plan", 0, 10000.0)})
    b = Ranked(Layout(4, 8), best={32768: ("plan", 0, 1000.0 * (1 + TIE_BAND / 2)), 131072: ("plan", 0, 9999.0)})
    c = Ranked(Layout(2, 16), best={32768: ("plan", 0, 1000.0 * (1 + 2 * TIE_BAND)), 131072: ("plan", 0, 20000.0)})
    ranked = [a, b, c]
    assert ties(ranked, 32768) == [a, b] and ties(ranked, 131072) == [b, a]
    win = {32768: a, 131072: b}
    assert crossovers(win) == [(32768, 131072, "TP8 x PP4", "TP4 x PP8")]  # without the ranking: any change
    assert crossovers(win, ranked) == []  # b by 0.01% at 128K: a tie
    b.best[131072] = ("plan", 0, 10000.0 / (1 + 2 * TIE_BAND))  # b pulls ahead at 128K beyond the band ...
    assert ties(ranked, 131072) == [b] and crossovers(win, ranked) == []  # ... but ties a at 32K: b everywhere
    b.best[32768] = ("plan", 0, 1000.0 * (1 + 2 * TIE_BAND))  # and falls behind at 32K: a real crossover
    assert crossovers(win, ranked) == [(32768, 131072, "TP8 x PP4", "TP4 x PP8")]


def test_the_plot_wraps_a_launch_line_between_words_only():
    """Issue 58 item 4: the layout PNG broke `--pp-size` into `--pp-` / `size`; its lines now split between words."""
    from sglang_cpp.cli.tune.layout_cmd import wrap_flags

    line = ("SGLANG_PP_LAYER_PARTITION=24,23,23,24 python -m sglang.launch_server --model-path '<qwen3 checkpoint>' "
            "--tp-size 4 --pp-size 8 --chunked-prefill-size 32768 --enable-dynamic-chunking --attn-cp-size 2 "
            "--enable-prefill-cp --cp-strategy zigzag")
    for width in (30, 45, 60, 110):
        lines = wrap_flags(line, width).splitlines()
        assert " ".join(lines) == line and all(ln.split()[-1] in line.split() for ln in lines)
