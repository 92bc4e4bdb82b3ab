"""One spelling per concept on the command line (issue 28): prompt lengths are --input-len everywhere (one
length or a list), the serving simulator's P2P time per micro-batch is --p2p-latency-ms; the old
spellings parse into the same arguments for one release, hidden from --help."""
from __future__ import annotations

import argparse
import json

import pytest


def _parser(family: str) -> argparse.ArgumentParser:
    from sglang_cpp.cli import simulate_serve
    from sglang_cpp.cli import bench as bench_cli
    from sglang_cpp.cli import tune as tune_cli

    p = argparse.ArgumentParser(prog="t")
    {"bench": bench_cli.add_args, "tune": tune_cli.add_args, "simulate-serve": simulate_serve.add_args}[family](p)
    return p


CASES = [
    ("bench", ["ttft", "--input-len", "8k,16k"], ["ttft", "--input-lens", "8k,16k"]),
    ("bench", ["ttft", "--input-len", "8k"], ["ttft", "--input-lens", "8k"]),
    ("bench", ["compare", "--input-len", "16k"], ["compare", "--input-lens", "16k"]),
    ("bench", ["serve", "--base-url", "u", "--model-path", "m", "--input-len", "1:200-600", "--output-len", "8-16"],
     ["serve", "--base-url", "u", "--model-path", "m", "--input-lens", "1:200-600", "--output-lens", "8-16"]),
    ("simulate-serve", ["--coeffs", "1,2,3", "--pp-size", "2", "--input-len", "200-2k", "--output-len", "8-16",
                        "--p2p-latency-ms", "0.5"],
     ["--coeffs", "1,2,3", "--pp-size", "2", "--input-lens", "200-2k", "--output-lens", "8-16", "--p2p-ms", "0.5"]),
    ("tune", ["chunk", "p.json", "--pp-size", "2", "--input-len", "8k,32k", "--chunk-overhead-ms", "1"],
     ["chunk", "p.json", "--pp-size", "2", "--input-lens", "8k,32k", "--p2p-ms", "1"]),
    ("tune", ["sweep", "--input-len", "8000"], ["sweep", "--input-lens", "8000"]),
    ("tune", ["analytic", "--analytic", "m", "--gpu", "H20", "--measured", "8,128k,55.5", "--input-len", "128k"],
     ["analytic", "--analytic", "m", "--gpu", "H20", "--measured", "8,128k,55.5", "--input-lens", "128k"]),
]


@pytest.mark.parametrize("family,new,old", CASES)
def test_the_old_spelling_parses_alike(family, new, old):
    p = _parser(family)
    assert vars(p.parse_args(new)) == vars(p.parse_args(old))


def test_old_spellings_are_hidden_and_the_p2p_time_has_its_own_name():
    ss = _parser("simulate-serve")
    text = ss.format_help()
    assert "--input-len MIX" in text and "--p2p-latency-ms" in text
    assert not any(old in text for old in ("--input-lens", "--output-lens", "--p2p-ms"))
    assert ss.parse_args(["--coeffs", "1,2,3", "--pp-size", "2", "--p2p-latency-ms", "0.5"]).p2p_latency_ms == 0.5
    bench = _parser("bench")
    ttft = bench._subparsers._group_actions[0].choices["ttft"]
    assert "--input-len LEN[,LEN...]" in ttft.format_help() and "--input-lens" not in ttft.format_help()
    assert bench.parse_args(["ttft", "--input-len", "8k"]).input_lens == (8192,)


def test_an_old_spelling_says_once_that_it_is_deprecated_and_a_required_flag_given_so_counts(capsys):
    """Issue 47 item 3: `--prompt-len` (simulate's old --input-len, a required flag) parses as before, with one
    stderr line naming the new spelling; the new spelling prints none."""
    import json

    from sglang_cpp.cli import main as cli_main

    base = ["simulate", "--analytic", "llama3-8b", "--gpu", "H100", "--pp-size", "2", "--json"]
    assert cli_main(base + ["--prompt-len", "8k"]) == 0
    old = capsys.readouterr()
    assert old.err.count("deprecated") == 1 and "--prompt-len is deprecated; use --input-len" in old.err
    assert cli_main(base + ["--input-len", "8k"]) == 0
    new = capsys.readouterr()
    assert "deprecated" not in new.err and json.loads(new.out) == json.loads(old.out)


@pytest.mark.parametrize("argv,needle", [
    (["plan", "--coeffs", "1,2,3", "--pp-size", "2", "--input-len", "0"],
     "argument --input-len: '0': give a prompt length >= 1"),
    (["plan", "--coeffs", "1,2,3", "--pp-size", "2", "--input-len", "8k", "--sigma", "2"],
     "argument --sigma: '2': give a number in [0, 1]"),
    (["simulate", "--analytic", "llama3-8b", "--gpu", "H100", "--pp-size", "2", "--input-len", "8k",
      "--efficiency", "2"], "argument --efficiency: '2': give a fraction of peak in (0, 1]"),
    (["tune", "layout", "--analytic", "llama3-8b", "--gpu", "H100", "--gpus", "8", "--input-len", "8k",
      "--efficiency", "0"], "argument --efficiency: '0': give a fraction of peak in (0, 1]"),
])
def test_bad_values_name_the_flag_the_user_typed_not_an_internal(argv, needle, capsys):
    """Issue 47 item 3: errors named prompt_len, DeviceSpec.efficiency; now one line naming the flag, exit 2."""
    from sglang_cpp.cli import main as cli_main

    with pytest.raises(SystemExit) as stop:  # argparse's own exit for a value its type refuses
        cli_main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "prompt_len" not in err and "DeviceSpec" not in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [
    ["tune", "layout", "--analytic", "llama3-8b", "--gpu", "H100", "--gpus", "4", "--input-len", "8k"],
    ["simulate-serve", "--analytic", "llama3-8b", "--gpu", "H100", "--pp-size", "2", "--num-prompts", "8",
     "--input-len", "200-2k", "--output-len", "8-16"],
], ids=["tune-layout", "simulate-serve"])
def test_long_commands_show_progress_on_stderr_unless_disabled(argv, capsys):
    """Issue 47 item 5: the commands that run for tens of seconds at their README sizes show a tqdm bar on stderr
    (stdout stays the result), and --disable-tqdm (bench_serving's flag) turns it off."""
    from sglang_cpp.cli import main as cli_main

    assert cli_main(argv) == 0
    on = capsys.readouterr()
    assert cli_main(argv + ["--disable-tqdm"]) == 0
    off = capsys.readouterr()
    assert argv[0] in on.err and "%|" in on.err and "%|" not in off.err and on.out == off.out


def test_the_analytic_dtype_speaks_sglangs_vocabulary(capsys):
    """Issue 47 item 3: one dtype vocabulary, SGLang's: --dtype auto / bfloat16 / float16 / fp8 (the old bf16 with a
    deprecation line); the same prediction for bfloat16, bf16 and auto on a bf16 checkpoint, a faster one for fp8;
    anything else one line naming the flag."""
    import json

    from sglang_cpp.cli import main as cli_main

    base = ["simulate", "--analytic", "llama3-8b", "--gpu", "H100", "--pp-size", "2", "--input-len", "32k", "--json"]
    ttft = {}
    for d in ("bfloat16", "bf16", "auto", "float16", "fp8"):
        assert cli_main(base + ["--dtype", d]) == 0
        got = capsys.readouterr()
        ttft[d] = json.loads(got.out)["ttft_ms"]
        assert ("deprecated" in got.err) == (d == "bf16")
    assert ttft["bfloat16"] == ttft["bf16"] == ttft["auto"] == ttft["float16"] > ttft["fp8"]
    with pytest.raises(SystemExit):
        cli_main(base + ["--dtype", "int4"])
    assert "argument --dtype: 'int4': give one of auto, bfloat16, float16, half, fp8" in capsys.readouterr().err


def test_a_chunk_size_sglang_would_refuse_for_its_page_size_is_refused_naming_both_flags(capsys):
    """Issue 47 item 3: --page-size 100 with --chunked-prefill-size 8192 planned a chunk SGLang's own startup check
    refuses (arg_groups/validation_hook.py:243-246); now one line naming both flags, exit 2; a multiple plans."""
    from sglang_cpp.cli import main as cli_main

    base = ["plan", "--policy", "quadratic", "--coeffs", "2e-7,0.04,5", "--input-len", "32k", "--pp-size", "2"]
    assert cli_main(base + ["--chunked-prefill-size", "8192", "--page-size", "100"]) == 2
    err = capsys.readouterr().err
    assert "--chunked-prefill-size 8192 is not divisible by --page-size 100" in err and "Traceback" not in err
    assert cli_main(base + ["--chunked-prefill-size", "8000", "--page-size", "100", "--json"]) == 0
    import json

    chunks = json.loads(capsys.readouterr().out)["chunks"]
    assert sum(chunks) == 32768 and all(c % 100 == 0 for c in chunks[:-1])  # only the prompt's last chunk is a rest


TUNE_JSON = {  # each offline tune command, as README runs it, small; sweep needs a server (its option is checked)
    "fit": ["examples/profiles/h200-llama3-8b-2layers.profile.json"],
    "chunk": ["examples/profiles/h200-llama3-8b-2layers.profile.json", "--pp-size", "4", "--input-len", "32k"],
    "partition": ["--analytic", "llama3-8b", "--gpu", "H100", "--pp-size", "2"],
    "analytic": ["--analytic", "qwen3-235b-a22b-fp8", "--gpu", "H20", "--tp-size", "4", "--measured", "1,128k,55.5",
                 "--pp-size", "8", "--input-len", "128k"],
    "layout": ["--analytic", "llama3-8b", "--gpu", "H100", "--gpus", "8", "--input-len", "32k"],
}


def test_every_tune_command_writes_json_on_request(tmp_path, monkeypatch, capsys):
    """Issue 47 item 5: `--json OUT.json` on every tune command (fit, chunk, partition, analytic, layout, sweep):
    each offline one is run here and writes strict JSON (an object) at that path; sweep, which needs a server,
    takes the same path option."""
    from pathlib import Path

    from sglang_cpp.cli import main as cli_main
    from sglang_cpp.cli.tune import COMMANDS

    root = Path(__file__).resolve().parents[2]
    tune = _parser("tune")._subparsers._group_actions[0].choices
    assert set(tune) == set(COMMANDS) == set(TUNE_JSON) | {"sweep"}
    assert all(tune[n]._option_string_actions["--json"].nargs is None for n in tune)  # a path, not a switch
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SGLANG_CPP_CACHE_DIR", str(tmp_path / "cache"))  # tune chunk's tuned file
    for name, argv in TUNE_JSON.items():
        out = tmp_path / f"{name}.json"
        argv = [str(root / a) if a.startswith("examples/") else a for a in argv]
        assert cli_main(["tune", name, *argv, "--json", str(out)]) == 0, capsys.readouterr().err[-2000:]
        doc = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"tune {name} wrote {c}"))
        assert isinstance(doc, dict) and doc, name


@pytest.mark.parametrize("argv,needle", [
    (["simulate", "--analytic", "llama3-8b", "--gpu", "H100", "--pp-size", "2", "--input-len", "8k",
      "--attention-backend", "bogus"], "argument --attention-backend: 'bogus' is not one of SGLang's attention backends"),
    (["plan", "--coeffs", "1,2,3", "--pp-size", "0", "--input-len", "8k"], "argument --pp-size: '0'"),
])
def test_issue_58_bad_flag_values_are_one_line_naming_the_flag(argv, needle, capsys):
    from sglang_cpp.cli import main as cli_main

    with pytest.raises(SystemExit) as stop:
        cli_main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and needle in err and "Traceback" not in err


@pytest.mark.parametrize("argv,needle", [
    (["plan", "--coeffs", "2,0,0.01,0,1e-6,1e-7", "--pp-size", "4", "--input-len", "64k", "--min-chunk", "16k",
      "--max-chunk", "4k"], "--min-chunk 16384 is above --max-chunk 4096"),
    (["simulate", "--analytic", "llama3-8b", "--gpu", "A100", "--dtype", "fp8", "--pp-size", "2", "--input-len", "8k"],
     "give --dtype bfloat16"),
])
def test_issue_58_bad_combinations_are_one_line_and_exit_2(argv, needle, capsys):
    from sglang_cpp.cli import main as cli_main

    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and "dtype='bf16'" not in err


def test_issue_58_every_plan_length_flag_takes_k_and_m(capsys):
    """README says every length flag takes k/m suffixes: plan's --min-chunk, --max-chunk, --align and
    --max-prefill-tokens refused '16k' before."""
    import json

    from sglang_cpp.cli import main as cli_main

    base = ["plan", "--coeffs", "2,0,0.01,0,1e-6,1e-7", "--pp-size", "4", "--input-len", "64k", "--json"]
    assert cli_main(base + ["--min-chunk", "1k", "--max-chunk", "4k", "--align", "128", "--max-prefill-tokens", "8k"]) == 0
    short = json.loads(capsys.readouterr().out)["chunks"]
    assert cli_main(base + ["--min-chunk", "1024", "--max-chunk", "4096", "--align", "128",
                            "--max-prefill-tokens", "8192"]) == 0
    assert json.loads(capsys.readouterr().out)["chunks"] == short and max(short) <= 4096


def test_a_folder_without_config_json_is_named_so(tmp_path, capsys):
    from sglang_cpp.cli import main as cli_main

    assert cli_main(["simulate", "--model-path", str(tmp_path), "--gpu", "H100", "--pp-size", "2",
                     "--input-len", "8k"]) == 2
    assert "the folder has no config.json" in capsys.readouterr().err


def test_issue_58_the_exact_dp_on_the_command_line_finishes_in_seconds_or_is_refused(capsys):
    """`plan --method dp` at 128K ran over 10 minutes with no output: past DP_CLI_UNITS aligned units it is one line
    naming the limit and the fixes; at 8K (128 units) it plans."""
    import json

    from sglang_cpp.cli import main as cli_main

    base = ["plan", "--coeffs", "2,0,0.01,0,1e-6,1e-7", "--pp-size", "4", "--method", "dp", "--json"]
    assert cli_main(base + ["--input-len", "128k"]) == 2
    err = capsys.readouterr().err
    assert "--method dp: 131072 tokens at --align 64 are 2048 aligned units" in err and "--align >= 683" in err
    assert cli_main(base + ["--input-len", "8k"]) == 0
    assert sum(json.loads(capsys.readouterr().out)["chunks"]) == 8192


def test_issue_58_every_analytic_output_says_its_efficiency_and_where_it_came_from(capsys):
    """simulate and bench ttft on the same analytic model print the efficiency they used and its source, and with
    the same flags give the same TTFT (one default: the --gpu preset's)."""
    import json

    from sglang_cpp.cli import main as cli_main

    model = ["--analytic", "qwen3-235b-a22b-fp8", "--gpu", "H20", "--tp-size", "4", "--pp-size", "8"]
    assert cli_main(["simulate", *model, "--input-len", "128k", "--policy", "fixed", "--chunked-prefill-size",
                     "8k", "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert (sim["efficiency"], sim["efficiency_source"]) == (0.5, "the H20 preset's default")
    assert cli_main(["bench", "ttft", *model, "--input-len", "128k", "--num-prompts", "1", "--policy", "fixed:8k"]) == 0
    out = capsys.readouterr().out
    assert "efficiency 0.5 of peak (the H20 preset's default" in out
    row = out.split("SIMULATED TTFT per input length")[1].splitlines()[3]
    assert float(row.split("|")[5]) == pytest.approx(sim["ttft_ms"], rel=1e-4)  # its median TTFT (ms), one default
    assert cli_main(["simulate", *model, "--input-len", "128k", "--efficiency", "0.889"]) == 0
    assert "efficiency 0.889 of peak (--efficiency)" in capsys.readouterr().out


def test_issue_58_every_flag_of_every_command_says_what_it_is():
    """Help text on every flag of every subcommand (an old spelling hidden from --help aside), and no metavar in an
    old name (PROMPT_LEN, CHUNK_SIZE, NUM_REQUESTS, PP_SIZE: argparse's dest, not today's flag)."""
    import importlib

    from sglang_cpp.cli import SUBCOMMANDS

    bare, old = [], []

    def walk(p, path):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    walk(sp, path + [name])
            elif not isinstance(a, argparse._HelpAction) and a.help != argparse.SUPPRESS:
                if not a.help:
                    bare.append(" ".join(path + a.option_strings))
                if a.option_strings and a.metavar is None and a.nargs != 0 and a.dest.upper() in (
                        "PROMPT_LEN", "CHUNK_SIZE", "NUM_REQUESTS", "PP_SIZE", "CHUNK_SIZES"):
                    old.append(" ".join(path + a.option_strings))

    for name, (mod, add, _run, _help) in SUBCOMMANDS.items():
        p = argparse.ArgumentParser()
        getattr(importlib.import_module(mod), add)(p)
        walk(p, [name])
    assert bare == [] and old == []


def test_plan_profile_checks_a_served_profiles_cap_as_the_server_does(tmp_path, capsys):
    """One check of a profile's measured_chunk (core.profile_io.profile_cap) for `plan --profile` and the server:
    a cap that is not a token count is one line naming the file, not a plan the server would refuse."""
    import json

    from sglang_cpp.cli import main as cli_main

    prof = tmp_path / "served.json"
    prof.write_text(json.dumps({"format": "sglang-cpp-profile", "samples": [], "meta": {"measured_chunk": "4k"},
                                "coeffs": {"c0": 2.0, "b": 0.02, "e": 1e-5, "f": 1e-6}}))
    assert cli_main(["plan", "--profile", str(prof), "--input-len", "8k", "--pp-size", "2"]) == 2
    assert f"--profile {prof}: meta.measured_chunk='4k' must be a whole number" in capsys.readouterr().err
    prof.write_text(prof.read_text().replace('"4k"', "1024"))
    assert cli_main(["plan", "--profile", str(prof), "--input-len", "8k", "--pp-size", "2", "--json"]) == 0
    assert max(json.loads(capsys.readouterr().out)["chunks"]) <= 1024


def test_a_json_path_that_is_a_folder_is_one_line_naming_it(tmp_path, capsys):
    """Issue 58 item 5: `--json <a folder>` gave an errno naming a temp file."""
    from sglang_cpp.cli import main as cli_main

    assert cli_main(["tune", "layout", "--analytic", "llama3-8b", "--gpu", "H100", "--gpus", "8", "--input-len", "8k",
                     "--json", str(tmp_path), "--disable-tqdm"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path} is a folder: give a file name for the JSON" in err and ".tmp" not in err


def test_issue_58_the_ttft_plot_is_on_log_axes(tmp_path, monkeypatch):
    """The what-if plot's linear millisecond axis flattened 128K-256K beside 1M: both axes are logarithmic."""
    from sglang_cpp.bench import ttft
    from sglang_cpp import files

    seen = {}
    monkeypatch.setattr(files, "save_figure", lambda fig, path: seen.setdefault("fig", fig) and path)
    recs = [{"policy": p, "random_input_len": n, "median_ttft_ms": ms, "p90_ttft_ms": ms * 1.1, "simulated": True}
            for p, k in (("plan", 1.0), ("fixed", 1.3)) for n, ms in ((131072, 8e3 * k), (262144, 3e4 * k),
                                                                       (1048576, 4e5 * k))]
    ttft.plot_ttft(recs, tmp_path / "w.png")
    (ax,) = seen["fig"].axes
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log" and len(ax.get_lines()) >= 2
