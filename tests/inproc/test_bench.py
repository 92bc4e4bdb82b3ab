"""bench: metrics vs numpy, the console block, JSONL keys, the simulated mode end to end, and the
client's error handling against a tiny fake HTTP server (no SGLang server is started here)."""
from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from sglang_cpp.bench import experiment
from sglang_cpp.bench import ttft as bench
from sglang_cpp.bench.client import ServerError
from sglang_cpp.bench.server import free_port
from sglang_cpp.cli import main

BENCH_KEYS = {"mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p90_ttft_ms", "p95_ttft_ms", "p99_ttft_ms",
              "input_throughput", "request_throughput", "completed", "total_input_tokens", "ttfts", "errors",
              "random_input_len", "duration", "max_concurrency", "input_lens"}
OUR_KEYS = {"policy", "chunk_plan", "versions", "machine", "date", "simulated"}


# -- metrics and the block -----------------------------------------------------------------------
def test_summarize_matches_numpy():
    rng = np.random.default_rng(3)
    ttfts = list(rng.uniform(0.1, 2.0, size=23))
    errors = [""] * 23
    errors[5] = errors[17] = "boom"
    rec = bench.summarize(ttfts, errors, 4096, 12.5, e2e_s=[t + 0.01 for t in ttfts])
    ok = np.array([t for i, t in enumerate(ttfts) if i not in (5, 17)]) * 1000
    assert rec["completed"] == 21 and rec["failed"] == 2 and rec["num_prompts"] == 23
    assert rec["mean_ttft_ms"] == pytest.approx(ok.mean())
    assert rec["median_ttft_ms"] == pytest.approx(np.median(ok))
    assert rec["std_ttft_ms"] == pytest.approx(ok.std())
    for q in (90, 95, 99):
        assert rec[f"p{q}_ttft_ms"] == pytest.approx(np.percentile(ok, q))
    assert rec["total_input_tokens"] == 21 * 4096
    assert rec["input_throughput"] == pytest.approx(21 * 4096 / 12.5)
    assert rec["ttfts"][5] == 0.0 and rec["errors"][5] == "boom" and rec["errors"][0] == ""
    assert rec["median_e2e_latency_ms"] == pytest.approx(np.median(ok + 10))


def test_summarize_all_failed_has_no_percentiles():
    rec = bench.summarize([0.0, 0.0], ["a", "b"], 100, 1.0)
    assert rec["completed"] == 0 and rec["median_ttft_ms"] is None and rec["p99_ttft_ms"] is None
    assert "n/a" in bench.format_block({**rec, "backend": "x"})


def test_format_block_layout():
    rec = {**bench.summarize([0.5, 1.0, 1.5], ["", "", ""], 8192, 3.0), "backend": "sglang-native",
           "policy": "fixed C=1024", "max_concurrency": 1}
    lines = bench.format_block(rec).splitlines()
    assert lines[0] == "{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")
    assert lines[-1] == "=" * 50
    text = "\n".join(lines)
    assert "{:<40} {:<10}".format("Successful requests:", 3) in text
    assert "{:<40} {:<10.2f}".format("Median TTFT (ms):", 1000.0) in text
    assert "{:<40} {:<10.2f}".format("P90 TTFT (ms):", np.percentile([500, 1000, 1500], 90)) in text
    assert "{:<40} {:<10.2f}".format("Input token throughput (tok/s):", 3 * 8192 / 3.0) in text
    assert "SIMULATED" not in text
    assert "SIMULATED" in bench.format_block({**rec, "simulated": True})


def test_input_ids_distinct_and_shared_prefix():
    a, b = bench.make_input_ids(512, 0, 7), bench.make_input_ids(512, 1, 7)
    assert len(a) == 512 and a[:16] != b[:16]
    s0, s1 = bench.make_input_ids(512, 0, 7, 128), bench.make_input_ids(512, 1, 7, 128)
    assert s0[:128] == s1[:128] and s0[128:144] != s1[128:144] and len(s0) == 512
    assert bench.make_input_ids(1024, 0, 7, 128)[:128] != s0[:128]  # not shared across lengths


def test_context_limit_layouts():
    assert bench.context_limit({"context_len": 8192}) == (8192, "context_len")
    assert bench.context_limit({"context_length": None, "model_config": {"context_len": 4096}})[0] == 4096
    assert bench.context_limit({"internal_states": [{"max_req_input_len": 8191}]})[0] == 8192
    assert bench.context_limit({"version": "x"}) == (None, "")
    with pytest.raises(ValueError, match="leaves no room"):
        bench.check_context({"context_len": 1024}, (1024,))
    with pytest.raises(ValueError, match="max_req_input_len 2047 .*KV pool of 2048"):
        bench.check_context({"context_length": 17000, "max_req_input_len": 2047, "max_total_num_tokens": 2048},
                            (4096,))
    assert bench.check_context({"context_length": 17000, "max_req_input_len": 16999}, (16384,)) == 17000


# -- simulated mode --------------------------------------------------------------------------------
def _profile(tmp_path):
    stage = {"coeffs": {"c0": 2.0, "g": 0.0, "b": 0.05, "d": 0.0, "e": 2e-5, "f": 1e-5}}
    p = tmp_path / "profile.json"
    p.write_text(json.dumps({"format": "sglang-cpp-profile", "meta": {}, "stages": [stage, stage]}))
    return p


def _sim(tmp_path, capsys, policy, *extra):
    out = tmp_path / f"{policy}{len(list(tmp_path.glob('*.jsonl')))}.jsonl"  # a fresh file per call
    rc = main(["bench", "ttft", "--simulate", str(_profile(tmp_path)), "--input-lens", "4k,16k,64k",
               "--num-requests", "3", "--pp-size", "2", "--chunk-size", "2048", "--policy", policy,
               "--output-jsonl", str(out), "--detail", *extra])
    text = capsys.readouterr().out
    assert rc == 0
    return text, [json.loads(line) for line in out.read_text().splitlines()]


def test_simulate_end_to_end(tmp_path, capsys):
    png = tmp_path / "ttft.png"
    text, plan = _sim(tmp_path, capsys, "plan", "--plot", str(png))
    assert text.count("Serving Benchmark Result (SIMULATED)") == 3 and "SIMULATED: " in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for r in plan:
        assert BENCH_KEYS | OUR_KEYS <= set(r) and r["simulated"] is True and r["completed"] == 3
        assert sum(r["chunk_plan"]["chunks"]) == r["random_input_len"]
    med = [r["median_ttft_ms"] for r in plan]
    assert med == sorted(med) and med[0] < med[-1]
    _, fixed = _sim(tmp_path, capsys, "fixed")
    _, quad = _sim(tmp_path, capsys, "quadratic")
    for p, f, q in zip(plan, fixed, quad):
        assert p["median_ttft_ms"] <= f["median_ttft_ms"] * (1 + 1e-9)
        assert q["chunk_plan"]["chunks"][0] == 2048  # upstream's first chunk is the base C
    # concurrency: later requests queue behind earlier ones, so the mean TTFT grows
    _, conc = _sim(tmp_path, capsys, "plan", "--max-concurrency", "3")
    assert conc[0]["mean_ttft_ms"] > plan[0]["mean_ttft_ms"]


def test_simulate_coeffs_and_analytic(tmp_path, capsys):
    assert main(["bench", "ttft", "--coeffs", "1e-5,0.05,2", "--input-lens", "8k", "--policy", "quadratic",
                 "--chunk-size", "2048", "--num-requests", "1", "--detail"]) == 0
    assert main(["bench", "ttft", "--analytic", "llama3-8b", "--gpu", "H100", "--pp-size", "4",
                 "--input-lens", "1m", "--num-requests", "1", "--detail"]) == 0
    out = capsys.readouterr().out
    assert out.count("(SIMULATED)") == 2 and "1048576" in out


def test_simulate_and_base_url_conflict(capsys):
    assert main(["bench", "ttft", "--coeffs", "1e-5,0.05,2", "--input-lens", "8k",
                 "--base-url", "http://127.0.0.1:1"]) == 2
    assert "--base-url cannot be combined" in capsys.readouterr().err
    assert main(["bench", "ttft", "--coeffs", "1e-5,0.05,2", "--input-lens", "8k", "--shared-prefix", "1k"]) == 2
    assert "--shared-prefix is not simulated" in capsys.readouterr().err
    assert main(["bench", "ttft", "--analytic", "nope", "--input-lens", "8k"]) == 2
    assert "--analytic 'nope'" in capsys.readouterr().err


# -- the fake server ------------------------------------------------------------------------------------
class Fake:
    def __init__(self, info, fail_on=(), meta=None):
        self.info, self.fail_on, self.meta, self.n = info, set(fail_on), meta or {}, 0
        self.lens, self.ids, self.lock = [], [], threading.Lock()
        fake = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body: bytes, ctype="application/json"):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/get_server_info":
                    return self._send(200, json.dumps(fake.info).encode())
                self._send(200 if self.path == "/health" else 404, b"{}")

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.n += 1
                    k = fake.n
                    fake.lens.append(len(req["input_ids"]))
                    fake.ids.append(tuple(req["input_ids"]))
                chunks = [{"text": "", "meta_info": {}}]
                if k in fake.fail_on:
                    chunks.append({"error": {"message": "scheduler died"}})
                else:
                    chunks.append({"text": "a", "output_ids": [1], "meta_info": fake.meta})
                body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks[1:]) + "data: [DONE]\n\n"
                self._send(200, body.encode(), "text/event-stream")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake():
    made = []

    def make(**kw):
        made.append(Fake(**kw))
        return made[-1]

    yield make
    for f in made:
        f.close()


def test_context_length_error(fake, capsys):
    f = fake(info={"context_length": 8192, "version": "0.5.23"})
    rc = main(["bench", "ttft", "--base-url", f.url, "--input-lens", "4k,16k"])
    err = capsys.readouterr().err
    assert rc == 2 and f.n == 0
    assert "--input-len 16384 exceeds the server's context length 8192" in err and "--context-length" in err


def test_unreachable_server_names_url(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["bench", "ttft", "--base-url", url, "--input-lens", "1k"]) == 2
    err = capsys.readouterr().err
    assert url in err and "unreachable" in err
    with pytest.raises(ServerError, match="127.0.0.1"):
        bench.run_ttft(url, bench.BenchConfig((1024,)))


def test_midrun_failure_keeps_other_results(fake, tmp_path, capsys):
    f = fake(info={"model_config": {"context_len": 8192}, "version": "0.5.23"}, fail_on={2},
             meta={"sglang_cpp_plan": {"chunks": [256, 256]}})
    out = tmp_path / "r.jsonl"
    rc = main(["bench", "ttft", "--base-url", f.url, "--input-lens", "512,1k", "--num-requests", "3",
               "--warmup", "0", "--output-jsonl", str(out), "--policy-label", "plan", "--plot",
               str(tmp_path / "p.png"), "--detail"])
    captured = capsys.readouterr()
    assert rc == 1 and "1 request(s) failed" in captured.err
    assert captured.out.count("Serving Benchmark Result") == 2
    r512, r1k = (json.loads(line) for line in out.read_text().splitlines())
    assert BENCH_KEYS | OUR_KEYS <= set(r512)
    assert r512["completed"] == 2 and r512["failed"] == 1 and "scheduler died" in r512["errors"][1]
    assert r512["ttfts"][0] > 0 and r512["ttfts"][2] > 0 and r512["ttfts"][1] == 0.0
    assert r1k["completed"] == 3 and r1k["simulated"] is False and r1k["policy"] == "plan"
    assert r1k["versions"]["server"] == "0.5.23" and r1k["chunk_plan"][0] == {"chunks": [256, 256]}
    assert f.lens == [512] * 3 + [1024] * 3


def test_concurrency_and_warmup(fake):
    f = fake(info={"context_len": 4096})
    recs = bench.run_ttft(f.url, bench.BenchConfig((256,), num_requests=4, warmup=2, max_concurrency=3),
                          log=lambda m: None)
    assert f.n == 6 and recs[0]["completed"] == 4 and recs[0]["chunk_plan"] is None
    assert not bench.any_failed(recs)


# -- compare orchestration, with a fake launcher --------------------------------------------------
def test_compare_table_failures_and_resume(fake, tmp_path):
    f = fake(info={"context_len": 8192, "version": "0.5.23"})
    launches = []

    @contextlib.contextmanager
    def launch(spec, timeout, log_dir):
        launches.append(spec)
        if spec.chunk_size == 1024 and not spec.dynamic and spec.pp_size == 2:
            raise ServerError("server process exited with code 1 before becoming healthy")
        yield SimpleNamespace(base_url=f.url, log_path=tmp_path / "log", log=lambda: "")

    (tmp_path / "model").mkdir()
    cfg = experiment.ExperimentConfig(model=str(tmp_path / "model"), input_lens=(256, 512), num_requests=1,
                                      warmup=0, fixed_chunks=(128, 1024), results=str(tmp_path / "res" / "compare.md"),
                                      profile=str(_profile(tmp_path)))
    assert experiment.experiment(cfg, launch=launch, log=lambda m: None, command="sglang-cpp bench compare") == 1
    kinds = [(s.pp_size, s.dynamic, s.env["SGLANG_CPP_POLICY"], s.chunk_size) for s in launches]
    # plan first (its calibration feeds the emulated upstream fit), then upstream's algorithm, then PP=1
    assert kinds == [(2, False, "off", 128), (2, False, "off", 1024), (2, True, "plan", 128),
                     (2, True, "quadratic", 128), (1, False, "off", 128)]
    assert launches[3].env["SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR"] == "0.75"
    assert launches[2].env["SGLANG_CPP_PROFILE"].endswith("profile.json") and launches[4].cores == "0"
    up = json.loads(Path(launches[3].env["SGLANG_CPP_PROFILE"]).read_text())["upstream"]
    from sglang_cpp.core.profile_io import load_cost
    from sglang_cpp.core.upstream import UpstreamPredictor, profile_lengths

    cost = load_cost(_profile(tmp_path))
    lens = profile_lengths(128, 8192)
    assert len(lens) == 128 and lens[0] == 160  # 1.25 * C, downwards, as upstream profiles
    ref = UpstreamPredictor.fit(lens, [float(cost.time(0.0, n)) for n in lens], chunk_size=128, context_len=8192)
    assert (up["a"], up["b"], up["c"]) == pytest.approx((ref.a, ref.b, ref.c))
    md = (tmp_path / "res" / "compare.md").read_text()
    assert "server failed: ServerError" in md and "fixed C=128 **(best)**" in md
    assert md.count("| sglang-cpp plan (C=128) |") == 2 and "| PP=1 on 1 core (fixed C=128) |" in md
    assert "sglang-cpp bench compare" in md and "## Failed servers" in md
    rows = [line for line in md.splitlines() if line.startswith("| upstream dynamic")]
    assert rows and all(" 1.000 |" in r for r in rows)  # its own ratio vs upstream dynamic
    assert (tmp_path / "res" / "compare.jsonl").exists()
    launches.clear()  # resume: only the failed server is retried
    assert experiment.experiment(cfg, launch=launch, log=lambda m: None) == 1
    assert [(s.chunk_size, s.dynamic) for s in launches] == [(1024, False)]


def test_compare_uses_the_calibration_the_plan_server_reports(fake, tmp_path):
    """Without --profile, the simulator check and the emulated upstream fit read the file named in the plan
    server's log, not the newest file in the cache (another server may have written one since)."""
    f = fake(info={"context_len": 8192, "version": "0.5.23"})
    reported = _profile(tmp_path)
    decoy = tmp_path / "cache" / "calibration" / "model=model,pp=2,newer.json"
    decoy.parent.mkdir(parents=True)
    decoy.write_text("{not json")  # newest, and unusable: reading it would fail the check

    @contextlib.contextmanager
    def launch(spec, timeout, log_dir):
        text = f"[sglang-cpp] saved calibration to {reported}\n" if spec.env["SGLANG_CPP_POLICY"] == "plan" else ""
        yield SimpleNamespace(base_url=f.url, log_path=tmp_path / "log", log=lambda: text)

    (tmp_path / "model").mkdir(exist_ok=True)
    cfg = experiment.ExperimentConfig(model=str(tmp_path / "model"), input_lens=(256,), num_requests=1, warmup=0,
                                      fixed_chunks=(128,), results=str(tmp_path / "res" / "compare.md"))
    assert experiment.experiment(cfg, launch=launch, log=lambda m: None) == 0
    md = (tmp_path / "res" / "compare.md").read_text()
    assert f"simulator cost model: `{reported}`" in md and "unusable" not in md


def test_tuning_free_mode_interleaves_rounds_and_reports_the_chunks_that_ran(fake, tmp_path):
    """bench compare --plan-chunks: no sweep, fixed and plan alternate inside every round, each plan
    request's chunks come from meta_info into the records and the table; a failed start fails the run and
    is retried alone on resume."""
    ran = [192, 192, 128]
    plain = fake(info={"context_len": 8192, "version": "0.5.23"})
    planned = fake(info={"context_len": 8192, "version": "0.5.23"},
                   meta={"sglang_cpp_plan": {"ran": ran, "ran_prefix": 0, "policy": "plan"}})
    launches, fail = [], {"on": 3}

    @contextlib.contextmanager
    def launch(spec, timeout, log_dir):
        launches.append(spec)
        if len(launches) == fail["on"]:
            raise ServerError("server process exited with code 1 before becoming healthy")
        is_plan = spec.env["SGLANG_CPP_POLICY"] == "plan"
        dec = spec.env["SGLANG_CPP_DECISION_LOG"]  # the steps each stage logs (a partial last line, as a kill leaves)
        for rank, (loop, plugin) in enumerate(((3.0, 0.2), (2.0, 0.1))):
            Path(dec.replace("{rank}", str(rank))).parent.mkdir(parents=True, exist_ok=True)
            # the measured request's forwards at (prefix, chunk), by the served model 11.969 / 12.706 / 9.547 ms
            # (below), run 1.2 / 1.1 / 0.9x that on PP0 and 1x on PP1; a warm-up request that never reaches the
            # length and a two-request batch are not priced
            fw = [("m", 0, 192, 11.969), ("m", 192, 192, 12.706), ("m", 384, 128, 9.547), ("w", 0, 100, 50.0)]
            q = (1.2, 1.1, 0.9, 1.0) if rank == 0 else (1.0,) * 4
            forwards = [{"event": "forward", "pp_rank": rank, "rids": [rid], "prefix": [pre], "chunk": [x],
                         "ms": ms * k} for (rid, pre, x, ms), k in zip(fw, q)]
            forwards.append({"event": "forward", "pp_rank": rank, "rids": ["m", "w"], "prefix": [0, 0],
                             "chunk": [64, 64], "ms": 99.0})
            Path(dec.replace("{rank}", str(rank))).write_text("".join(json.dumps(
                {"event": "step", "pp_rank": rank, "rid": "a", "gap_ms": 44.0 + i, "forward_ms": 40.0, "blocked_ms": 1.0,
                 "loop_ms": loop + i, "plugin_ms": plugin}) + "\n" for i in range(3))
                + "".join(json.dumps(f) + "\n" for f in forwards) + '{"event": "step", "pp_r')
        yield SimpleNamespace(base_url=(planned if is_plan else plain).url, log_path=tmp_path / "log",
                              log=lambda: "")

    (tmp_path / "model").mkdir()
    cfg = experiment.ExperimentConfig(model=str(tmp_path / "model"), input_lens=(512,), num_requests=2, warmup=0,
                                      fixed_chunks=(128, 256), plan_chunks=(128, 1024, 4096), rounds=2,
                                      results=str(tmp_path / "res" / "tf.md"), profile=str(_profile(tmp_path)),
                                      json=str(tmp_path / "res" / "tf.json"))
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "tf.jsonl").write_text('{"stale": "an earlier run"}\n')  # a new run does not append to it
    assert experiment.experiment(cfg, launch=launch, log=lambda m: None) == 1  # the third start failed
    one_round = [("off", 128), ("plan", 128), ("off", 256), ("plan", 1024), ("plan", 4096)]
    assert [(s.env["SGLANG_CPP_POLICY"], s.chunk_size) for s in launches] == one_round * 2
    assert all(s.dynamic == (s.env["SGLANG_CPP_POLICY"] == "plan") and s.pp_size == 2 for s in launches)
    md = (tmp_path / "res" / "tf.md").read_text()
    assert "## Failed servers" in md and "exited with code 1" in md
    launches.clear()  # resume: only the failed start runs again
    fail["on"] = 0
    assert experiment.experiment(cfg, launch=launch, log=lambda m: None) == 0
    assert [(s.env["SGLANG_CPP_POLICY"], s.chunk_size) for s in launches] == [("off", 256)]
    md = (tmp_path / "res" / "tf.md").read_text()
    assert "Failed servers" not in md
    row = next(ln for ln in md.splitlines() if ln.startswith("| fixed C=128 |"))
    assert len(row.split("|")[2].split(" / ")) == 4  # 2 rounds x 2 measured requests
    doc = json.loads((tmp_path / "res" / "tf.json").read_text())  # --json: each configuration's TTFTs, every round
    by = {r["config"]: r for r in doc["rows"]}
    assert doc["rounds"] == 2 and len(by["fixed C=128"]["ttfts_s"]) == 4 and by["fixed C=128"]["chunks_ran"] is None
    assert by["sglang-cpp plan (C=1024)"]["chunks_ran"] == [ran] * 4
    # the served model's makespan of 4 chunks of 128 on two equal stages, by hand: sum + max = 45.77 ms
    assert row.split("|")[6].strip() == "0.05"
    assert f"- C=128: {ran} (the same in all 4 requests: yes)" in md
    assert md.count("median <= 1.01x the best fixed") == 3 and "plan medians across C within 3%" in md
    assert "| fixed C | median (s) | / plan |" in md and "upstream dynamic" not in md
    # per chunk step and stage: forward, loop beyond forward and waits (median of 3, 4, 5 and of 2, 3, 4), plugin
    assert "| fixed C=128 | 12 | 40.0 | 4.00 | 0.200 | 40.0 | 3.00 | 0.100 |" in md
    assert "| sglang-cpp plan (C=4096) | 12 |" in md
    # per forward, over 2 starts x 3 forwards x 2 stages: PP0's median of 1.2, 1.1, 0.9 (each start's too), PP1's 1
    assert "| fixed C=128 | 12 | 128-192 | 1.100 (1.100-1.100) | 1.000 (1.000-1.000) |" in md
    assert md.count(" | 12 | 128-192 | 1.100 (1.100-1.100) | 1.000 (1.000-1.000) |") == 5
    recs = [json.loads(x) for x in (tmp_path / "res" / "tf.jsonl").read_text().splitlines()]
    assert len(recs) == 10 and all("stale" not in r for r in recs)  # 5 configurations x 2 rounds, resumed once
    assert [r["chunk_plan"][0]["ran"] for r in recs if r["policy"].startswith("sglang-cpp plan")] == [ran] * 6
    # the drift table: every start in the order it ran, each request's TTFT over the served model's makespan of
    # its chunks, by hand: 4 x 128 is 45.77 ms (above); 2 x 256 is 15.455 + 16.766 + 16.766 = 48.988 ms; the
    # plan's 192, 192, 128 is 11.969 + 12.706 + 9.547 + 12.706 = 46.927 ms
    lines = md.splitlines()
    head = lines.index("| start | config | round | chunks per request | measured / predicted per request | median |")
    drift = [ln.split(" | ") for ln in lines[head + 2:lines.index("", head)]]
    labels = ["fixed C=128", "sglang-cpp plan (C=128)", "fixed C=256", "sglang-cpp plan (C=1024)",
              "sglang-cpp plan (C=4096)"]
    assert [(d[1], d[2]) for d in drift] == [(lab, str(i)) for i in (0, 1) for lab in labels]
    assert all(d[3] == ("3 / 3" if "plan" in d[1] else "4 / 4" if "128" in d[1] else "2 / 2") for d in drift)
    pred = {"fixed C=128": 0.0457699, "fixed C=256": 0.0489875, "plan": 0.0469274}
    for lab in labels:
        got = [float(x) for d in drift if d[1] == lab for x in d[4].split(" / ")]
        want = [t / pred["plan" if "plan" in lab else lab] for r in recs if r["policy"] == lab for t in r["ttfts"]]
        assert sorted(got) == pytest.approx(sorted(want), abs=6e-4) and len(got) == 4  # (jsonl: resumed last)


def test_simulator_check_beyond_8k_when_the_model_context_suffices(tmp_path):
    """The 32K compare on a 64K-context model (no --context-length needed, so cfg.ctx is None) must still
    get the simulator's prediction for every row: the prediction takes no 8192-token context from nowhere."""
    from sglang_cpp.core.costmodel import CostModel
    from sglang_cpp.bench.experiment import ExperimentConfig, Run
    from sglang_cpp.bench.report import predict_ttft
    from sglang_cpp.core.planner import fixed_split
    from sglang_cpp.whatif.simulator import simulate

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 65536}))
    cfg = ExperimentConfig(model=str(model), input_lens=(32768,), results=str(tmp_path / "c.md"))
    assert cfg.ctx is None
    m = CostModel.fa(a=1e-5, b=0.05, c0=2.0)
    for kind in ("fixed", "plan", "pp1"):
        ms = predict_ttft(cfg, Run(kind, 1024, (32768,)), 32768, [m, m])
        assert ms > 0
    assert predict_ttft(cfg, Run("fixed", 1024, (32768,)), 32768, [m, m]) == pytest.approx(
        simulate(fixed_split(32768, 1024), [m, m], 2).ttft_ms)


# -- bench serve (bench/serve.py) ------------------------------------------------------------------------
def test_serve_workload_prompts_have_the_drawn_lengths_and_share_no_prefix(smollm2, tmp_path):
    """The custom dataset bench_serving reads: each prompt re-tokenizes to the length the mixture drew
    (random one-token words), outputs likewise, and no two prompts open with the same 8 tokens."""
    from transformers import AutoTokenizer

    from sglang_cpp.bench.serve import ServeBenchConfig, write_dataset

    tok = AutoTokenizer.from_pretrained(smollm2)
    cfg = ServeBenchConfig(num_requests=40, input_lens="0.8:200-600,0.2:2k-4k", output_lens="32-128", seed=3)
    drawn = write_dataset(cfg, tok, tmp_path / "w.jsonl")
    rows = [json.loads(line)["conversations"] for line in open(tmp_path / "w.jsonl")]
    assert len(rows) == 40 and sum(n >= 2000 for n, _ in drawn) >= 3  # the mixture's long ones are there
    got = [(len(tok.encode(u["content"])), len(tok.encode(a["content"]))) for u, a in rows]
    assert all(abs(g - n) <= 2 and abs(h - m) <= 2 for (g, h), (n, m) in zip(got, drawn)), (got, drawn)
    assert len({tuple(tok.encode(u["content"])[:8]) for u, _ in rows}) == 40


def test_serve_summary_is_relative_to_the_first_run_and_compares_outputs():
    from sglang_cpp.bench.serve import same_outputs, summary_table

    keys = ("output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "p99_itl_ms",
            "mean_e2e_latency_ms")
    a = {"label": "sglang", "completed": 64, "total_throughput": 200.0, **dict.fromkeys(keys, 1.0),
         "generated_texts": ["x", "y", "z"]}
    b = {**a, "label": "time", "total_throughput": 250.0, "generated_texts": ["x", "y", "w"]}
    table = summary_table([a, b])
    assert "| vs sglang |" in table.splitlines()[0] and table.splitlines()[-1].endswith("| 1.250 |")
    assert same_outputs(a, b) == (2, 3)


def test_goodput_counts_requests_meeting_both_slos_and_bad_slos_are_named():
    """Four requests: one meets both SLOs, one is late to its first token, one decodes too slowly
    (3 tokens after the first in 0.9 s: 300 ms each), one failed; at a looser SLO three meet it."""
    from sglang_cpp.bench.serve import SLO, goodput

    rec = {"ttfts": [1.0, 5.0, 1.0, 0.5], "itls": [[0.1, 0.1, 0.1], [0.1], [0.3, 0.3, 0.3], []],
           "output_lens": [4, 2, 4, 0], "errors": ["", "", "", "HTTP 500"]}
    tight, loose = SLO.parse_list("2:200, 10:400")
    assert (tight.ttft_s, tight.tpot_ms, loose.ttft_s, loose.tpot_ms) == (2.0, 200.0, 10.0, 400.0)
    assert goodput(rec, tight) == (1, 4) and goodput(rec, loose) == (3, 4)
    assert str(tight) == "TTFT <= 2 s and TPOT <= 200 ms"
    for bad in ("2", "2:x", "0:100", "2:-1"):
        with pytest.raises(ValueError, match="--slos"):
            SLO.parse_list(bad)


def test_serve_workload_fits_the_context_length_and_a_refused_request_is_loud(smollm2, tmp_path):
    """A 2K-4K prompt with up to 128 output tokens at --context-length 3000 is cut to 3000 - 16 - output
    tokens (the rest are drawn as before); a run where the server answered a request with nothing fails."""
    from transformers import AutoTokenizer

    from sglang_cpp.bench.serve import ServeBenchConfig, check_answered, write_dataset

    tok = AutoTokenizer.from_pretrained(smollm2)
    free = write_dataset(ServeBenchConfig(num_requests=40, input_lens="0.8:200-600,0.2:2k-4k", seed=3), tok,
                         tmp_path / "a.jsonl")
    cut = write_dataset(ServeBenchConfig(num_requests=40, input_lens="0.8:200-600,0.2:2k-4k", seed=3,
                                         context_length=3000), tok, tmp_path / "b.jsonl")
    assert [m for _, m in cut] == [m for _, m in free]
    assert [n for n, _ in cut] == [min(n, 3000 - 16 - m) for n, m in free]
    assert any(n > 3000 - 16 - m for n, m in free)  # some prompt was cut
    with pytest.raises(ValueError, match="--context-length 100 leaves no room"):
        write_dataset(ServeBenchConfig(num_requests=4, context_length=100), tok, tmp_path / "c.jsonl")
    rec = {"output_lens": [40, 0, 12], "input_lens": [300, 8162, 500], "errors": ["", "", ""]}
    with pytest.raises(RuntimeError, match="1 request.s. got no output .the first: #1, 8162 input tokens"):
        check_answered(rec, "run.jsonl")
    check_answered({**rec, "output_lens": [40, 3, 12]}, "run.jsonl")  # all answered: no error


def test_a_server_whose_port_was_taken_is_started_again_on_another(tmp_path, monkeypatch):
    """CI once saw uvicorn fail to bind the picked port ("address already in use") while the server lived on
    and waited 12 min on its own warm-up. launched() now stops such a server at once and starts it again on
    a new port; the ports come from below the kernel's ephemeral range."""
    import subprocess
    import sys

    from sglang_cpp.bench import server

    lo, hi = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = {server.free_port() for _ in range(20)}
    assert all(p in server.PORTS and p < lo for p in ports) and len(ports) > 1
    taken = "print(\"ERROR: [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): address " \
            "already in use\", flush=True); import time; time.sleep(600)"
    healthy = ("import http.server as h\nclass H(h.BaseHTTPRequestHandler):\n def do_GET(self):\n"
               "  self.send_response(200); self.end_headers()\nh.HTTPServer(('127.0.0.1', {port}), H).serve_forever()")
    started = []

    def start(spec, log_dir=None):
        port = server.free_port()
        code = (taken if not started else healthy).format(port=port)
        log = tmp_path / f"server-{port}.log"
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        started.append(server.RunningServer(spec, port, proc, log))
        return started[-1]

    monkeypatch.setattr(server, "start", start)
    with server.launched(server.ServerSpec("unused"), timeout=60) as srv:  # without the retry: 60 s, then an error
        assert srv is started[1] and srv.proc.poll() is None
        assert started[0].proc.poll() is not None  # the one whose port was taken is stopped
    assert srv.proc.poll() is not None and len(started) == 2


@pytest.mark.parametrize("ratio,mine,theirs,want", [
    (0.999, [17.40, 17.87, 19.24], [17.85, 17.89, 18.51], "tie (the spreads overlap)"),  # better, inside noise
    (1.045, [18.69, 18.29, 18.80], [17.85, 17.89, 18.51], "tie (the spreads overlap)"),  # worse, inside noise
    (0.900, [16.0, 16.1, 16.2], [17.85, 17.89, 18.51], "met"),
    (1.005, [17.0, 17.1, 17.2], [16.9, 16.95, 16.99], "met"),  # apart and within the limit
    (1.060, [19.0, 19.2, 19.4], [17.85, 17.89, 18.51], "MISSED"),
])
def test_one_verdict_rule_a_tie_is_never_met(ratio, mine, theirs, want):
    """Issue 46 item 8: results inside the other row's spread read 'tie', whichever way they point; only rows
    apart are met or missed."""
    from sglang_cpp.bench.report import verdict

    assert verdict(ratio, 1.01, mine, theirs) == want


def test_bench_ttft_speaks_bench_serving_and_a_rerun_sends_new_prompts(fake, tmp_path, capsys):
    """Issue 47 item 4: bench_serving's flag names (--num-prompts, --warmup-requests, --output-file) and record
    keys (request_rate, output_throughput, p99_e2e_latency_ms); without --seed each run draws its own (printed and
    recorded), so a rerun on the same server misses its radix cache; --seed N sends the same prompts again."""
    f = fake(info={"context_len": 8192})
    out = tmp_path / "r.jsonl"
    argv = ["bench", "ttft", "--base-url", f.url, "--input-len", "256", "--num-prompts", "2", "--warmup-requests", "0",
            "--output-file", str(out)]
    assert main(argv) == 0 and main(argv) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 2 and recs[0]["seed"] != recs[1]["seed"] and f.n == 4
    assert set(f.ids[:2]).isdisjoint(f.ids[2:])  # the second run's prompts are new
    for r in recs:
        assert r["request_rate"] is None and r["output_throughput"] > 0 and r["p99_e2e_latency_ms"] >= 0
    assert main(argv + ["--seed", str(recs[0]["seed"])]) == 0
    assert f.ids[4:] == f.ids[:2]  # the first run's prompts, again
    err = capsys.readouterr().err
    assert "deprecated" not in err
