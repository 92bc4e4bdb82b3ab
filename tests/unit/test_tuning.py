"""`sglang-cpp tune`: fit, chunk, partition and sweep, end to end through the CLI (no server)."""
from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import pytest

import sglang_cpp
from sglang_cpp.cli import main
from sglang_cpp.core.costmodel import COEFS, CostModel, PipelineCost
from sglang_cpp.core.profile_io import load_cost, load_profile, save_profile
from sglang_cpp.core.partition import parse_partition

STAGE0 = CostModel(c0=5.0, g=0.002, b=0.05, d=1e-7, e=3e-6, f=1.5e-6)
STAGE1 = CostModel(c0=8.0, g=0.001, b=0.06, d=2e-7, e=2e-6, f=1.0e-6)
META = {"model": "/models/Qwen3-8B", "device_name": "NVIDIA H100 80GB HBM3", "dtype": "bfloat16", "tp": 1}
GRID = [(L, x) for L in (0, 1024, 2048, 4096, 8192, 16384) for x in (256, 512, 1024, 2048, 4096)]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_profile(path: Path, models=(STAGE0,), meta=META, **extra) -> Path:
    """Noise-free samples of known per-stage models."""
    samples = [{"L": L, "x": x, "ms": float(m.time(L, x)), "stage": s}
               for s, m in enumerate(models) for L, x in GRID]
    save_profile(path, samples=samples, meta=meta, extra=extra or None)
    return path


def tune(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["tune", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


# -- fit ------------------------------------------------------------------------------------------
def test_fit_recovers_coefficients_per_stage_and_plots(tmp_path, capsys):
    prof = write_profile(tmp_path / "p.json", (STAGE0, STAGE1))
    rc, out, err = tune(capsys, "fit", prof, "--plot", tmp_path / "fit.png", "--json", tmp_path / "fitted.json")
    assert rc == 0, err
    assert "stage 0" in out and "stage 1" in out and "R^2=" in out and "held-out" in out
    fitted = load_cost(tmp_path / "fitted.json")
    assert isinstance(fitted, PipelineCost) and len(fitted.stages) == 2
    for got, want in zip(fitted.stages, (STAGE0, STAGE1)):
        for k in COEFS:
            assert getattr(got, k) == pytest.approx(getattr(want, k), rel=0.02), k
    assert (tmp_path / "fit.png").read_bytes()[:8] == PNG_MAGIC
    doc = load_profile(tmp_path / "fitted.json")
    assert len(doc["residuals"]) == 2 * len(GRID)


def test_fit_from_decision_log(tmp_path, capsys):
    lines = []
    for rank, m in enumerate((STAGE0, STAGE1)):
        for L, x in GRID:
            lines.append({"event": "forward", "pp_rank": rank, "rids": ["r"], "prefix": [L], "chunk": [x],
                          "ms": float(m.time(L, x))})
        lines.append({"event": "forward", "pp_rank": rank, "rids": ["a", "b"], "prefix": [0, 0], "chunk": [5, 7],
                      "ms": 1e6})  # batched: not one (L, x) point, must be skipped
        lines.append({"event": "decision", "pp_rank": rank, "rid": "r", "prefix": 0, "chunk": 64})
    log = tmp_path / "cpp.jsonl"
    log.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    rc, out, err = tune(capsys, "fit", "--from-log", log, "--out", tmp_path / "f.json")
    assert rc == 0, err
    fitted = load_cost(tmp_path / "f.json")
    for got, want in zip(fitted.stages, (STAGE0, STAGE1)):
        assert got.time(20000, 3000) == pytest.approx(want.time(20000, 3000), rel=0.01)

    log.write_text(log.read_text() + '{"event": "forward", "pp_r\n')
    rc, _, err = tune(capsys, "fit", "--from-log", log)
    assert rc == 2 and "line" in err and "not JSON" in err


@pytest.mark.parametrize("content,expect", [
    (None, "does not exist"),
    ("{not json", "not readable JSON"),
    (json.dumps({"samples": [{"L": 0, "x": 512, "ms": 10.0}, {"L": 0, "x": 1024, "ms": -3.0}]}), "sample 1"),
    (json.dumps({"samples": [{"L": 0, "x": 512, "ms": None}]}), "bad samples"),
    (json.dumps({"format": "something-else", "samples": []}), "format"),
])
def test_bad_profile_is_rejected_with_a_clear_error(tmp_path, capsys, content, expect):
    prof = tmp_path / "bad.json"
    if content is not None:
        prof.write_text(content)
    for argv in (("fit", prof), ("chunk", prof, "--pp-size", 2, "--input-lens", "8k")):
        rc, _, err = tune(capsys, *argv)
        assert rc == 2
        assert "error:" in err and str(prof) in err and expect in err, err


def test_profile_with_other_stage_count_is_rejected(tmp_path, capsys):
    prof = write_profile(tmp_path / "p3.json", (STAGE0, STAGE1, STAGE0))
    rc, _, err = tune(capsys, "chunk", prof, "--pp-size", 2, "--input-lens", "8k", "--out-dir", tmp_path)
    assert rc == 2 and "3 per-stage models but --pp-size is 2" in err


# -- chunk ------------------------------------------------------------------------------------------
def test_chunk_writes_a_plugin_loadable_profile_with_recommendations(tmp_path, capsys):
    prof = write_profile(tmp_path / "p.json")
    rc, out, err = tune(capsys, "chunk", prof, "--pp-size", 2, "--input-lens", "8k,32k", "--out-dir", tmp_path / "o",
                        "--json", tmp_path / "rec.json")
    assert rc == 0, err
    name = "model=Qwen3-8B,pp=2,tp=1,device_name=NVIDIA_H100_80GB_HBM3,dtype=bfloat16.json"
    said = json.loads((tmp_path / "rec.json").read_text())  # --json: the recommendations and where the file went
    assert said["tuned_profile"] == str(tmp_path / "o" / name) and said["launch"]["plan"] in out
    assert said["plan"] == load_profile(tmp_path / "o" / name)["recommendations"]["plan"]
    path = tmp_path / "o" / name
    assert path.is_file(), list((tmp_path / "o").iterdir())
    cost = load_cost(path)  # what the plugin does with SGLANG_CPP_PROFILE
    assert cost.time(4096, 1024) == pytest.approx(STAGE0.time(4096, 1024), rel=0.01)
    doc = load_profile(path)
    from sglang_cpp.plugin.startup.profiles import check_matches
    from sglang_cpp.core.upstream import UpstreamPredictor

    check_matches(doc, {"hidden_size": 1, "num_layers": 1}, "SGLANG_CPP_PROFILE", 2)
    UpstreamPredictor(**doc["upstream"], chunk_size=4096, context_len=1 << 20)  # the quadratic policy's input
    rec = doc["recommendations"]
    assert doc["samples"] and doc["residuals"] and doc["versions"]["sglang-cpp"] == sglang_cpp.__version__
    fixed_rows = [r for r in rec["table"] if r["label"].startswith("fixed")]
    worst_fixed = {L: max(r["ttft_ms"][L] for r in fixed_rows) for L in ("8192", "32768")}
    for L in ("8192", "32768"):
        plan, fixed = rec["plan"]["ttft_ms"][L], rec["fixed"]["ttft_ms"][L]
        assert plan <= fixed * (1 + 1e-9) <= worst_fixed[L] * (1 + 1e-9)
        assert plan <= rec["upstream"]["ttft_ms"][L] * (1 + 1e-9)
        assert rec["upstream"]["ttft_ms"][L] > 0
    assert rec["plan"]["score"] <= rec["upstream"]["score"] <= rec["upstream_default_sigma"]["score"] + 1e-12
    # the printed commands are the ones to run
    assert f"SGLANG_CPP_PROFILE={path.resolve()}" in out and "SGLANG_CPP_POLICY=plan" in out
    assert re.search(r"SGLANG_CPP_POLICY=off SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR=[0-9.]+ python -m "
                     r"sglang.launch_server .*--pp-size 2 --chunked-prefill-size \d+ --enable-dynamic-chunking", out)
    assert f"--chunked-prefill-size {rec['fixed']['settings']['chunked_prefill_size']}" in out
    # the written file is itself a valid input for the next round
    rc, _, err = tune(capsys, "chunk", path, "--pp-size", 2, "--input-lens", "8k", "--out-dir", tmp_path / "o2")
    assert rc == 0, err


def test_chunk_when_upstream_fit_fails(tmp_path, capsys, monkeypatch):
    from sglang_cpp.core import upstream

    def fail(*_a, **_k):
        raise ValueError("upstream fit: quadratic coefficient a=-1e-09 is not positive")

    monkeypatch.setattr(upstream, "emulated_fit", fail)
    rc, out, err = tune(capsys, "chunk", write_profile(tmp_path / "p.json"), "--pp-size", 2, "--input-lens", "8k",
                        "--out-dir", tmp_path, "--chunk-sizes", "1k,2k,4k")
    assert rc == 0, err
    assert "upstream fit fails" in out and "SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR" not in out
    doc = load_profile(next(tmp_path.glob("model=*.json")))
    assert "upstream" not in doc and doc["recommendations"]["upstream"] is None
    assert sorted(doc["recommendations"]["upstream_failed"]) == ["1024", "2048", "4096"]


# -- partition --------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,layers,pp", [
    (("--analytic", "qwen3-235b-a22b", "--gpu", "H20", "--tp", 4, "--prefix-len", "64k", "--chunked-prefill-size", "8k"), 94, 8),
    (("--analytic", "smollm2-135m", "--gpu", "cpu-2core"), 30, 4),
    (("--analytic", "deepseek-v3", "--gpu", "H20", "--tp", 8, "--mem-limit-gb", 30), 61, 4),
])
def test_partition_analytic_prints_a_valid_partition(capsys, argv, layers, pp):
    rc, out, err = tune(capsys, "partition", *argv, "--pp-size", pp)
    assert rc == 0, err
    value = re.search(r"^SGLANG_PP_LAYER_PARTITION=([0-9,]+)$", out, re.M).group(1)
    parts = parse_partition(value, layers, pp)
    assert sum(parts) == layers and len(parts) == pp
    gain = float(re.search(r"gain ([0-9.]+)x", out).group(1))
    assert gain >= 1.0


def test_partition_from_profile_layer_breakdown(tmp_path, capsys):
    samples = [{"L": 0, "x": x, "ms": 1.0, "layer_ms": [0.1 * x / 512] * 6, "embed_ms": 0.05, "head_ms": 0.3 * x / 512}
               for x in (512, 2048)]
    prof = tmp_path / "layers.json"
    save_profile(prof, samples=samples, meta={"num_hidden_layers": 12})
    rc, out, err = tune(capsys, "partition", "--profile", prof, "--pp-size", 3)
    assert rc == 0, err
    assert "x=2048" in out and "layers 6..11" in out  # largest shape; unmeasured layers filled in
    value = re.search(r"^SGLANG_PP_LAYER_PARTITION=([0-9,]+)$", out, re.M).group(1)
    parts = parse_partition(value, 12, 3)
    assert parts[-1] < 4  # the last stage also runs lm_head: it gets fewer layers than the default 4
    rc, _, err = tune(capsys, "partition", "--profile", write_profile(tmp_path / "p.json"), "--pp-size", 2)
    assert rc == 2 and "layer_ms" in err


# -- sweep (fake launcher and bench) --------------------------------------------------------------
FAKE_TTFT = {("fixed", 1024): 70.0, ("fixed", 2048): 50.0, ("fixed", 4096): 31.0, ("fixed", 8192): 26.0,
             ("dynamic", 4096): 40.0, ("dynamic", 8000): 27.0, ("plan", 8192): 24.0, ("plan", 2048): 35.0}


def test_sweep_with_fake_launcher(tmp_path, capsys, monkeypatch):
    """`tune sweep` is the runner's sweep preset: fixed chunks, then the plan at C*, then upstream's algorithm
    at 2*C* per sigma (one server when 2*C* covers the input), with a failure reported, not raised."""
    from sglang_cpp.bench import experiment, server
    from sglang_cpp.bench import ttft as bench

    launched_specs = []

    @contextlib.contextmanager
    def fake_launched(spec, timeout=None, log_dir=None):
        launched_specs.append(spec)
        if spec.chunk_size == 1024 and not spec.dynamic:
            raise RuntimeError("server died during start-up")
        yield type("Srv", (), {"base_url": f"fake://{len(launched_specs) - 1}", "log": lambda self: ""})()

    def run_with(table):
        def fake_run_ttft(base_url, cfg, log=None):
            spec = launched_specs[int(base_url.rsplit("/", 1)[1])]
            kind = spec.env["SGLANG_CPP_POLICY"] == "plan" and "plan" or spec.dynamic and "dynamic" or "fixed"
            assert kind != "dynamic" or spec.env["SGLANG_CPP_POLICY"] == "quadratic"
            s = table[kind, spec.chunk_size] + float(spec.env.get("SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR", 0))
            n = cfg.num_requests
            return [bench.summarize([s] * n, [""] * n, cfg.input_lens[0], s * n)]
        return fake_run_ttft

    monkeypatch.setattr(server, "launched", fake_launched)
    monkeypatch.setattr(experiment, "run_ttft", run_with(FAKE_TTFT))
    (tmp_path / "model").mkdir()
    png, md = tmp_path / "sweep.png", tmp_path / "res" / "sweep.md"
    prof = write_profile(tmp_path / "p.json", models=(STAGE0, STAGE1), meta={**META, "pp": 2})
    rc, out, err = tune(capsys, "sweep", "--model-path", tmp_path / "model", "--plot", png, "--results", md,
                        "--profile", prof, "--json", tmp_path / "sweep.json")
    assert rc == 1, err  # one server failed: reported, not fatal
    doc = json.loads((tmp_path / "sweep.json").read_text())  # --json: the same rows, strict JSON
    assert doc["best_fixed_chunk"] == {"8000": 8192} and doc["machine"]["isa"] and doc["command"].startswith("sglang-cpp")
    by = {r["config"]: r for r in doc["rows"]}
    assert by["fixed C=1024"]["status"] == "failed" and "server died" in by["fixed C=1024"]["reason"]
    assert by["sglang-cpp plan (C=8192)"]["median_ttft_ms"] == 24000.0
    assert by["sglang-cpp plan (C=8192)"]["ttfts_s"] == [24.0] and by["fixed C=8192"]["predicted_ttft_ms"] > 0
    assert by["upstream dynamic (sigma=0.6, C=8000)"]["sigma"] == 0.6
    text = md.read_text()
    assert text in out and "| fixed C=1024 | 1024 | 8000 | — | — | server failed: RuntimeError" in text
    rows = {r.split(" | ")[0].lstrip("| "): r for r in text.splitlines() if r.startswith("| ")}
    for name, ms in (("fixed C=2048", 50000.0), ("fixed C=4096", 31000.0), ("fixed C=8192 **(best)**", 26000.0),
                     ("sglang-cpp plan (C=8192)", 24000.0), ("upstream dynamic (sigma=0.6, C=8000)", 27600.0)):
        assert f" | {ms:.1f} | " in rows[name], rows[name]
    assert "same server as sigma=0.6" in rows["upstream dynamic (sigma=0.85, C=8000)"]
    assert png.read_bytes()[:8] == PNG_MAGIC
    # 4 fixed + plan + 1 dynamic (base 2*8192 clamped to the 8000-token input: one chunk, sigma unused)
    assert len(launched_specs) == 6
    assert all(s.env["SGLANG_CPP_POLICY"] == "off" and not s.dynamic for s in launched_specs[:4])
    plan, dyn = launched_specs[4], launched_specs[5]
    assert plan.env["SGLANG_CPP_POLICY"] == "plan" and plan.chunk_size == 8192 and plan.dynamic
    assert plan.env["SGLANG_CPP_PROFILE"] == str(prof.resolve())
    # upstream's algorithm on the fit its own profiling would get from the same cost model
    assert dyn.env["SGLANG_CPP_POLICY"] == "quadratic" and dyn.chunk_size == 8000 and dyn.dynamic
    from sglang_cpp.core.upstream import UpstreamPredictor, profile_lengths

    lens = profile_lengths(8000, 8192)
    cost = load_cost(prof)
    ref = UpstreamPredictor.fit(lens, [float(cost.time(0, n)) for n in lens], chunk_size=8000, context_len=8192)
    up = json.loads(Path(dyn.env["SGLANG_CPP_PROFILE"]).read_text())["upstream"]
    assert (up["a"], up["b"], up["c"]) == pytest.approx((ref.a, ref.b, ref.c))

    # a shorter best fixed chunk: base 2*C* < input, so every sigma gets its own server
    FAKE = {**FAKE_TTFT, ("fixed", 2048): 20.0}
    launched_specs.clear()
    monkeypatch.setattr(experiment, "run_ttft", run_with(FAKE))
    rc, out, err = tune(capsys, "sweep", "--model-path", tmp_path / "model", "--fixed-chunks", "2048,4096",
                        "--no-plan", "--profile", prof, "--results", md, "--fresh")
    assert rc == 0, err
    assert [s.chunk_size for s in launched_specs if s.dynamic] == [4096, 4096]
    assert "| fixed C=2048 **(best)** | 2048 | 8000 | 20000.0 |" in md.read_text()


def test_chunk_on_a_whole_pipeline_server_profile_charges_each_stage_half(tmp_path, capsys):
    """`profile --backend server` on a PP=2 server measured both stages together (scope 'all'): `tune
    chunk` must model each stage as half of it, not copy the whole-pipeline time to both stages."""
    samples = [{"L": L, "x": x, "ms": float(STAGE0.time(L, x)), "stage": 0, "scope": "all"} for L, x in GRID]
    prof = save_profile(tmp_path / "server.json", samples=samples, meta={**META, "pp": 2, "stage": "all"})
    rc, out, err = tune(capsys, "chunk", prof, "--pp-size", 2, "--input-lens", "8k", "--out-dir", tmp_path / "o")
    assert rc == 0, err
    (written,) = (tmp_path / "o").glob("*.json")
    cost = load_cost(written)  # one model: the plugin and the simulator use it for every stage
    for st in getattr(cost, "stages", None) or (cost,):
        assert st.time(4096, 1024) == pytest.approx(STAGE0.time(4096, 1024) / 2, rel=0.01)
    assert all(abs(r["rel_err"]) < 0.01 for r in load_profile(written)["residuals"])


def test_chunk_writes_where_the_plugin_looks_by_default(tmp_path, capsys, monkeypatch):
    """Issue 47 item 6: without --out-dir, `tune chunk` writes its per-device file into SGLANG_CPP_CACHE_DIR/tuned,
    under the name the plugin builds from a server's model, PP and TP size, device and dtype."""
    from sglang_cpp.plugin.startup.profiles import tuned_path

    monkeypatch.setenv("SGLANG_CPP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    prof = write_profile(tmp_path / "p.json")
    rc, _, err = tune(capsys, "chunk", prof, "--pp-size", 2, "--input-lens", "8k")
    assert rc == 0, err
    server = {"model": "/models/Qwen3-8B", "pp": 2, "tp": 1, "device_name": "NVIDIA_H100_80GB_HBM3", "dtype": "bfloat16"}
    assert tuned_path(server).is_file() and [p.name for p in tmp_path.iterdir() if p.suffix == ".json"] == ["p.json"]


def test_the_plugin_calibrates_past_a_tuned_file_that_does_not_fit_and_names_near_misses(tmp_path, monkeypatch,
                                                                                         caplog):
    """Issue 47 item 6: a tuned file for this server's name but measured at another TP size is not used (one
    WARNING naming it and what to do; the server calibrates, never dies for a file the user did not name); a file
    for this model, PP and TP under another device name (a remote server's 'cuda') gets one INFO line saying how to
    name it for this server."""
    from types import SimpleNamespace

    from sglang_cpp.core.costmodel import CostModel
    from sglang_cpp.core.profile_io import save_profile
    from sglang_cpp.files import device_file_name
    from sglang_cpp.plugin.startup.profiles import resolve_source, tuned_path

    monkeypatch.setenv("SGLANG_CPP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SGLANG_CPP_PROFILE", raising=False)
    meta = {"model": "Qwen3-8B", "pp": 2, "tp": 1, "device_name": "NVIDIA_H100_80GB_HBM3", "dtype": "bfloat16",
            "hidden_size": 4096, "num_layers": 36, "layer_partition": ""}
    cfg = SimpleNamespace(pp_size=2, context_len=32768)
    m = CostModel(c0=1.0, b=0.01, e=2e-6, f=1e-6)
    save_profile(tmp_path / "tuned" / device_file_name("Qwen3-8B", 2, 1, "cuda", "auto"), cost=m)
    with caplog.at_level("INFO", logger="sglang_cpp"):
        assert resolve_source(meta, cfg)["kind"] == "calibrate"
    assert "--device-name NVIDIA_H100_80GB_HBM3 --dtype bfloat16" in caplog.text and "device_name=cuda" in caplog.text
    save_profile(tuned_path(meta), cost=m, meta={"tp": 8})
    caplog.clear()
    with caplog.at_level("INFO", logger="sglang_cpp"):
        assert resolve_source(meta, cfg)["kind"] == "calibrate"
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "measured with tp=8 but this server runs --tp-size 1" in warned[0]
    assert f"Remove {tuned_path(meta)}" in warned[0]
    doc = json.loads(tuned_path(meta).read_text())
    tuned_path(meta).write_text(json.dumps(doc | {"meta": ["tp", 8]}))  # hand-edited: meta no longer an object
    caplog.clear()
    with caplog.at_level("INFO", logger="sglang_cpp"):
        assert resolve_source(meta, cfg)["kind"] == "calibrate"  # a WARNING, not an AttributeError stopping it
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "meta is list, expected an object" in warned[0]
    tuned_path(meta).write_text(json.dumps(doc | {"meta": {"hidden_size": [4096]}}))  # a field of the wrong type
    caplog.clear()
    with caplog.at_level("INFO", logger="sglang_cpp"):
        assert resolve_source(meta, cfg)["kind"] == "calibrate"  # a WARNING, not a TypeError on rank 0 alone
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "a field of the wrong type (TypeError" in warned[0]
    save_profile(tuned_path(meta), cost=m, meta={"tp": 1})
    assert resolve_source(meta, cfg)["kind"] == "profile"  # the right file is used
    monkeypatch.setenv("SGLANG_CPP_PROFILE", str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="SGLANG_CPP_PROFILE="):  # a file the user named still stops the server
        resolve_source(meta, cfg)


def test_a_server_profile_is_named_as_the_plugin_names_its_server(tmp_path):
    """A local server's 'cuda' / 'cpu' becomes the plugin's device name, and its dtype 'auto' the model's own."""
    import json

    from sglang_cpp.machine import device_name
    from sglang_cpp.profiler.server import _device_name, _dtype

    assert _device_name("cpu", "http://127.0.0.1:30000") == device_name("cpu")
    assert _device_name("cuda", "http://10.0.0.5:30000") == "cuda"  # remote: its word (tune chunk --device-name)
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    assert _dtype("auto", {"model_path": str(tmp_path)}, {}) == "bfloat16" and _dtype("half", {}, {}) == "float16"
    assert _dtype("auto", {"model_path": str(tmp_path / "nowhere")}, {}) == "auto"
    # as SGLang resolves auto (model_config.py:2285-2325): `dtype` before `torch_dtype`; float32 runs in 16 bits
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float16", "torch_dtype": "bfloat16"}))
    assert _dtype("auto", {"model_path": str(tmp_path)}, {}) == "float16"
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float32", "model_type": "llama"}))
    assert _dtype("auto", {"model_path": str(tmp_path)}, {}) == "float16"
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float32", "model_type": "gemma2"}))
    assert _dtype("auto", {"model_path": str(tmp_path)}, {}) == "bfloat16"


def test_tune_chunk_names_and_labels_the_file_for_the_server_it_is_given(tmp_path, capsys, monkeypatch):
    """--device-name and --dtype name the file for a server whose profile came with other names (a remote
    server's 'cuda' and 'auto') and label its meta the same, so the plugin's check accepts what its name matched."""
    from sglang_cpp.core.profile_io import check_profile, load_profile
    from sglang_cpp.plugin.startup.profiles import tuned_path

    monkeypatch.setenv("SGLANG_CPP_CACHE_DIR", str(tmp_path / "cache"))
    prof = write_profile(tmp_path / "p.json")
    doc = json.loads(prof.read_text())
    doc["meta"].update(device_name="cuda", dtype="auto")
    prof.write_text(json.dumps(doc))
    rc, _, err = tune(capsys, "chunk", prof, "--pp-size", 2, "--input-lens", "8k", "--device-name", "NVIDIA_H200",
                      "--dtype", "bfloat16")
    assert rc == 0, err
    server = {"model": "Qwen3-8B", "pp": 2, "tp": 1, "device_name": "NVIDIA_H200", "dtype": "bfloat16"}
    written = load_profile(tuned_path(server))
    check_profile(written, "tuned", pp_size=2, tp_size=1, dtype="bfloat16", model="Qwen3-8B")
    assert written["meta"]["device_name"] == "NVIDIA_H200"


def test_a_profile_tuned_under_other_key_settings_is_not_applied_and_the_warning_names_the_field(tmp_path, monkeypatch,
                                                                                                   caplog):
    """Issue 57 item 2: a tuned file or SGLANG_CPP_PROFILE is matched on every field of the calibration cache's
    key it holds (layer partition, attention backend, KV-cache dtype, quantization, page size, versions, the MLA
    switches), not on the file name's five: a mismatch is one WARNING naming the field and both values, then this
    server's calibration. Fields a profile cannot know (an HF profile's page size, a backend left on auto, a
    remote 'cuda') are not compared. A profile's measured_chunk is its cap."""
    from types import SimpleNamespace

    from sglang_cpp.core.costmodel import CostModel
    from sglang_cpp.core.profile_io import save_profile
    from sglang_cpp.plugin.startup.profiles import key_mismatches, resolve_source, tuned_path

    monkeypatch.setenv("SGLANG_CPP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SGLANG_CPP_PROFILE", raising=False)
    meta = {"model": "DeepSeek-V3", "pp": 4, "tp": 8, "device_name": "NVIDIA_H200", "dtype": "bfloat16",
            "layer_partition": "", "attention_backend": "fa3:FlashAttentionBackend", "kv_cache_dtype": "auto",
            "quantization": "fp8", "page_size": 64, "sglang_version": "0.5.23", "torch_version": "2.14.1",
            "kernel_switches": [2048], "server_args": {"enable_dp_attention": "false", "ep_size": "8"}}
    cfg = SimpleNamespace(pp_size=4, context_len=131072)
    m = CostModel(c0=1.0, b=0.01, e=2e-6, f=1e-6)
    same = {k: meta[k] for k in ("layer_partition", "quantization", "page_size", "sglang_version", "kernel_switches",
                                 "server_args")}
    for field, value, said in (("layer_partition", "15,16,15,15", "layer_partition='15,16,15,15' there, '' here"),
                               ("attention_backend", "flashinfer", "attention_backend='flashinfer' there"),
                               ("kernel_switches", [4096], "kernel_switches=[4096] there, [2048] here"),
                               ("server_args", {"enable_dp_attention": "true"}, "server_args.enable_dp_attention=true "
                                                                               "there, false here")):
        save_profile(tuned_path(meta), cost=m, meta={**same, "attention_backend": "fa3", field: value})
        caplog.clear()
        with caplog.at_level("INFO", logger="sglang_cpp"):
            assert resolve_source(meta, cfg)["kind"] == "calibrate"
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warned) == 1 and said in warned[0] and f"remove {tuned_path(meta)}" in warned[0], warned
    save_profile(tuned_path(meta), cost=m, meta={**same, "attention_backend": "fa3", "measured_chunk": 4096})
    got = resolve_source(meta, cfg)
    assert got["kind"] == "profile" and got["cap"] == 4096  # every key field agrees: applied, with its cap
    # SGLANG_CPP_PROFILE under another KV-cache dtype: the same WARNING and a calibration, not a dead server
    prof = tmp_path / "p.json"
    save_profile(prof, cost=m, meta={**same, "kv_cache_dtype": "fp8_e4m3"})
    monkeypatch.setenv("SGLANG_CPP_PROFILE", str(prof))
    caplog.clear()
    with caplog.at_level("INFO", logger="sglang_cpp"):
        assert resolve_source(meta, cfg)["kind"] == "calibrate"
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "kv_cache_dtype='fp8_e4m3' there, 'auto' here" in warned[0]
    assert "unset SGLANG_CPP_PROFILE" in warned[0]
    # what a profile cannot know is not compared: an HF profile's page size, a backend left on auto on either
    # side, a remote 'cuda'; a path by its last component
    assert key_mismatches({"page_size": 1, "attention_backend": None, "device_name": "cuda"}, meta) == []
    assert key_mismatches({"page_size": 1, "base_url": "http://h:30000"}, meta) == ["page_size=1 there, 64 here"]
    assert key_mismatches({"attention_backend": "flashinfer"}, {"attention_backend": "None:FlashInferAttnBackend"}) == []
    assert key_mismatches({"server_args": {"speculative_draft_model_path": '"/data/m/EAGLE3"'}},
                          {"server_args": {"speculative_draft_model_path": '"/mnt/ckpt/EAGLE3"'}}) == []
    assert key_mismatches({"regime_names": ["a"]}, {"regime_names": ["a", "b"]}) == []  # a calibration keeps what it reached
    # the backend SGLang resolved, where both name it: auto here and flashinfer there is a match when both resolved
    # to the same class, and two autos that resolved to different classes are not
    assert key_mismatches({"attention_backend": "flashinfer:FlashInferAttnBackend",
                           "server_args": {"attention_backend": '"flashinfer"'}},
                          {"attention_backend": "None:FlashInferAttnBackend",
                           "server_args": {"attention_backend": "null"}}) == []
    assert key_mismatches({"attention_backend": "None:TritonAttnBackend"},
                          {"attention_backend": "None:FlashInferAttnBackend"}) == [
        "attention_backend='None:TritonAttnBackend' there, 'None:FlashInferAttnBackend' here"]
    assert key_mismatches({"server_args": {"speculative_draft_model_path": '"orgA/EAGLE3"'}},  # a hub id stays whole
                          {"server_args": {"speculative_draft_model_path": '"orgB/EAGLE3"'}}) != []
    # a measured_chunk that is not a token count: the tuned file is not applied; SGLANG_CPP_PROFILE fails naming it
    monkeypatch.delenv("SGLANG_CPP_PROFILE")
    save_profile(tuned_path(meta), cost=m, meta={**same, "attention_backend": "fa3", "measured_chunk": "4k"})
    caplog.clear()
    with caplog.at_level("INFO", logger="sglang_cpp"):
        assert resolve_source(meta, cfg)["kind"] == "calibrate"
    assert "meta.measured_chunk='4k' must be a whole number of tokens >= 1" in caplog.text
    save_profile(tmp_path / "p2.json", cost=m, meta={**same, "attention_backend": "fa3", "measured_chunk": -1})
    monkeypatch.setenv("SGLANG_CPP_PROFILE", str(tmp_path / "p2.json"))
    with pytest.raises(ValueError, match=r"SGLANG_CPP_PROFILE=.*meta.measured_chunk=-1 must be a whole number"):
        resolve_source(meta, cfg)


def test_a_profile_cap_below_the_smallest_chunk_is_not_applied_and_said(caplog):
    """Review finding: a served profile's measured_chunk below this server's smallest chunk (alignment or
    SGLANG_CPP_MIN_CHUNK) would leave no chunk size between the bounds (PlanConfig refuses lo > hi on every rank):
    it is not applied, with one WARNING naming the profile; a cap at or above it is kept as it is."""
    from sglang_cpp.plugin.startup.profiles import cap_for

    with caplog.at_level("WARNING", logger="sglang_cpp"):
        assert cap_for(100, 128, "SGLANG_CPP_PROFILE=/p.json") == 0
        assert cap_for(128, 128, "SGLANG_CPP_PROFILE=/p.json") == 128 and cap_for(0, 128, "x") == 0
    (line,) = [r.getMessage() for r in caplog.records]
    assert "SGLANG_CPP_PROFILE=/p.json: measured_chunk=100 is below this server's smallest chunk (128 tokens" in line
