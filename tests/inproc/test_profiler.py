"""`sglang-cpp profile`: grid, hf backend on the tiny random Llama, server backend on a fake server."""
from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


from sglang_cpp.cli import main as cli_main
from sglang_cpp.core.costmodel import META_KEYS
from sglang_cpp.core.profile_io import load_cost, load_profile
from sglang_cpp.profiler.grid import ProfileConfig, default_chunks, make_grid

from conftest import TINY  # under SGLANG_CPP_CACHE_DIR; the `tiny` fixture builds it when missing

needs_tiny = pytest.mark.usefixtures("tiny")
# --threads 1: two torch threads spin-wait badly when the 2-core host is busy
HF = ["--backend", "hf", "--model", str(TINY), "--device", "cpu", "--threads", "1", "--quiet"]


def main(argv):
    """`sglang-cpp profile ARGV`, through the CLI's one error handler."""
    return cli_main(["profile", *argv])


# --- grid ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("max_len,chunks,n,align", [(2048, None, 6, 64), (1024, [64, 256], 4, 64),
                                                    (32768, None, 6, 64), (5000, [100, 1000], 5, 16),
                                                    (1024, [1024], 3, 64)])
def test_make_grid_properties(max_len, chunks, n, align):
    grid = make_grid(max_len, chunks=chunks, num_prefixes=n, align=align)
    assert grid == make_grid(max_len, chunks=chunks, num_prefixes=n, align=align)  # deterministic
    assert grid == sorted(set(grid))
    xs = sorted({x for _, x in grid})
    assert xs == (sorted(chunks) if chunks else default_chunks(max_len, align))
    for L, x in grid:
        assert L >= 0 and x > 0 and L + x <= max_len
        assert L % align == 0
        if chunks is None:
            assert x % align == 0
    for x in xs:  # every chunk size spans the whole context: from L=0 to the last aligned fit
        Ls = [L for L, xx in grid if xx == x]
        assert min(Ls) == 0 and max(Ls) == (max_len - x) // align * align
    if chunks is None:
        assert xs[0] == max_len // 16 // align * align and xs[-1] == max_len // 2 // align * align
        assert len({L for L, _ in grid}) >= 3  # enough prefixes to fit the 2-D model


def test_make_grid_rejects_bad_input():
    with pytest.raises(ValueError, match="--chunks"):
        make_grid(1024, chunks=[2048])
    with pytest.raises(ValueError, match="--num-prefixes"):
        make_grid(1024, num_prefixes=0)
    with pytest.raises(ValueError, match="--max-len"):
        make_grid(32, align=64)


def test_config_errors_name_the_flag():
    with pytest.raises(ValueError, match="--model"):
        ProfileConfig(backend="hf")
    with pytest.raises(ValueError, match="--base-url"):
        ProfileConfig(backend="server")
    with pytest.raises(ValueError, match="--repeats"):
        ProfileConfig(model="m", repeats=0)


# --- hf backend ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def full_profile(tmp_path_factory):
    out = tmp_path_factory.mktemp("prof") / "tiny.json"
    rc = main(HF + ["--max-len", "1024", "--chunks", "64,256", "--num-prefixes", "4", "--repeats", "3",
                    "--warmup", "1", "--fit", "--out", str(out)])
    assert rc == 0
    return out


@needs_tiny
def test_hf_profile_json_and_breakdown(full_profile):
    doc = load_profile(full_profile)
    raw = json.loads(full_profile.read_text())["samples"]
    assert {(s["L"], s["x"]) for s in raw} == set(make_grid(1024, chunks=[64, 256], num_prefixes=4))
    assert set(META_KEYS) <= set(doc["meta"])
    m = doc["meta"]
    assert m["backend"] == "hf" and m["tp"] == 1 and m["pp"] == 1 and m["dtype"] == "float32"
    assert m["torch_version"] and m["layers_loaded"] == 4 and m["stage_layers"] == 4
    for s in raw:
        assert len(s["layer_ms"]) == 4
        assert all(t > 0 for t in s["layer_ms"]) and s["embed_ms"] > 0 and s["head_ms"] > 0 and s["ms"] > 0
        assert math.isclose(s["ms"], sum(s["layer_ms"]), rel_tol=1e-9)  # all layers, no embed/head
        assert s["wall_ms"] > 0
    assert len(doc["samples"]) == len(raw) and all(s["ms"] > 0 for s in doc["samples"])


@needs_tiny
def test_hf_fit_stored(full_profile):
    doc = json.loads(full_profile.read_text())
    assert len(doc["stages"]) == 1 and "r2" in doc["stages"][0]["fit"]
    cost = load_cost(full_profile)
    assert cost.time(512, 256) > 0 and cost.time(768, 256) >= cost.time(0, 256)


@needs_tiny
def test_hf_layer_subset_scaled_to_stage(tmp_path):
    out = tmp_path / "k2.json"
    rc = main(HF + ["--max-len", "512", "--chunks", "128", "--num-prefixes", "3", "--repeats", "1",
                    "--warmup", "0", "--layers", "2", "--stage-layers", "4", "--include-head", "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["meta"]["layers_loaded"] == 2 and doc["meta"]["num_hidden_layers"] == 4
    assert doc["meta"]["stage_layers"] == 4
    for s in doc["samples"]:
        assert len(s["layer_ms"]) == 2 and all(t > 0 for t in s["layer_ms"])
        expected = sum(s["layer_ms"]) / 2 * 4 + s["head_ms"]  # mean loaded layer x 4, plus the head
        assert math.isclose(s["ms"], expected, rel_tol=1e-9)
        assert s["ms"] > sum(s["layer_ms"]) + s["head_ms"]


@needs_tiny
def test_hf_layers_beyond_model_rejected(tmp_path, capsys):
    rc = main(HF + ["--max-len", "256", "--layers", "5", "--out", str(tmp_path / "x.json")])
    assert rc == 2 and "--layers 5" in capsys.readouterr().err


@needs_tiny
def test_crop_reuse_matches_fresh_prefill(tiny):
    """The reused (cropped) prefix cache must give the same next-chunk output as a fresh prefill (the `tiny`
    fixture builds the model, so this test runs alone or first too)."""
    import torch

    from sglang_cpp.profiler.hf import _crop_to, _new_cache, load_model

    model, _ = load_model(ProfileConfig(model=tiny, device="cpu"), "cpu")
    g = torch.Generator().manual_seed(0)
    prefix, a, b = (torch.randint(0, 49152, (1, n), generator=g) for n in (96, 32, 32))
    with torch.inference_mode():
        cache = _new_cache(model.config)
        model(input_ids=prefix, past_key_values=cache, use_cache=True)
        model(input_ids=a, past_key_values=cache, use_cache=True)
        assert _crop_to(cache, 96) and cache.get_seq_length() == 96
        reused = model(input_ids=b, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        fresh_cache = _new_cache(model.config)
        model(input_ids=prefix, past_key_values=fresh_cache, use_cache=True)
        fresh = model(input_ids=b, past_key_values=fresh_cache, use_cache=True, logits_to_keep=1).logits
    torch.testing.assert_close(reused, fresh, rtol=1e-4, atol=1e-4)


# --- server backend -----------------------------------------------------------------------------

def test_server_unreachable_names_url(tmp_path, capsys):
    rc = cli_main(["profile", "--backend", "server", "--base-url", "http://127.0.0.1:9", "--max-len", "1024",
               "--request-timeout", "5", "--quiet", "--out", str(tmp_path / "s.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "http://127.0.0.1:9" in err and "--base-url" in err
    assert not (tmp_path / "s.json").exists()


class _FakeSGLang(BaseHTTPRequestHandler):
    """Radix-cache stand-in: cached_tokens = longest prefix seen before; prefill 0.01 ms/new token."""

    radix = True
    seen: list = []
    flushes = 0

    def log_message(self, *a):
        pass

    def _json(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/server_info":
            self._json({"tp_size": 2, "pp_size": 2, "page_size": 16, "device": "cuda", "dtype": "bfloat16",
                        "version": "9.9.9", "chunked_prefill_size": 4096, "context_length": 1024})
        elif self.path == "/model_info":
            self._json({"model_path": "/models/Fake-7B"})
        else:
            self.send_error(404)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)) or 0)
        if self.path == "/flush_cache":
            type(self).seen = []
            type(self).flushes += 1
            return self._json({})
        req = json.loads(body)
        ids = req["input_ids"]
        hit = 0
        if self.radix:
            for old in self.seen:
                n = 0
                while n < min(len(old), len(ids)) and old[n] == ids[n]:
                    n += 1
                hit = max(hit, n)
        self.seen.append(ids)
        meta = {"cached_tokens": hit, "prompt_tokens": len(ids), "forward_entry_time": 1000.0,
                "prefill_finished_time": 1000.0 + (len(ids) - hit) * 1e-5}
        out = {"text": "a", "meta_info": meta}
        if not req.get("stream"):
            return self._json(out)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b"data: " + json.dumps(out).encode() + b"\n\ndata: [DONE]\n\n")


@pytest.fixture
def fake_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _FakeSGLang)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    _FakeSGLang.radix, _FakeSGLang.seen, _FakeSGLang.flushes = True, [], 0
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_server_backend_against_fake_server(fake_server, tmp_path):
    out = tmp_path / "srv.json"
    rc = main(["--backend", "server", "--base-url", fake_server, "--chunks", "128,256",
               "--num-prefixes", "4", "--repeats", "2", "--quiet", "--fit", "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    grid = make_grid(1024, chunks=[128, 256], num_prefixes=4)  # max-len from the server's context_length
    assert [(s["L"], s["x"]) for s in doc["samples"]] == grid
    for s in doc["samples"]:
        assert s["backend"] == "server" and s["scope"] == "all" and s["L"] <= s["cached_tokens"] <= s["L"] + 1
        assert math.isclose(s["ms"], s["x"] * 0.01, rel_tol=0.02)  # server prefill span, x new tokens only
    m = doc["meta"]
    assert (m["model"], m["tp"], m["pp"], m["page_size"], m["sglang_version"], m["stage"]) == \
        ("/models/Fake-7B", 2, 2, 16, "9.9.9", "all")
    assert m["timing"] == ["server_meta"] and _FakeSGLang.flushes == len(grid)
    assert len(doc["stages"]) == 1  # --fit stored the model
    assert math.isclose(load_cost(out).time(512, 256), 2.56, rel_tol=0.05)


def test_server_backend_warns_without_radix_cache(fake_server, tmp_path):
    _FakeSGLang.radix = False
    with pytest.warns(UserWarning, match="radix cache"):
        rc = main(["--backend", "server", "--base-url", fake_server, "--chunks", "256",
                   "--num-prefixes", "3", "--repeats", "1", "--warmup", "0", "--quiet",
                   "--out", str(tmp_path / "nr.json")])
    assert rc == 0
