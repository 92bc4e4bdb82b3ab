"""The calibration design (which shapes get measured), without a server."""
from __future__ import annotations

import pytest

from sglang_cpp.plugin.calibrate import calibration_levels, calibration_schedule


@pytest.mark.parametrize("M", [1024, 2048, 4096, 8192, 8128, 131072])
def test_schedule_covers_prefixes_and_chunk_sizes(M):
    sched = calibration_schedule(M)
    points = []
    for seq in sched:
        assert sum(seq) <= M
        L = 0
        for x in seq:
            points.append((L, x))
            L += x
    Ls, xs = {p[0] for p in points}, {p[1] for p in points}
    assert len(xs) >= 3 and len(Ls) >= 5  # enough to identify all six cost terms
    assert max(L + x for L, x in points) == M
    assert len({x for x in xs if x % 64 == 0}) >= 3
    # small chunks after a long prefix: what a plan runs late in a long prompt
    assert any(L >= 3 * M // 4 and x <= max(64, M // 16) for L, x in points)


def test_levels_quadruple_to_the_target():
    assert calibration_levels(8192) == [2048, 8192]
    assert calibration_levels(6016) == [1472, 6016]  # 6016/4 = 1504, kept a multiple of 64
    assert calibration_levels(4096) == [1024, 4096]
    assert calibration_levels(131072) == [2048, 8192, 32768, 131072]
    assert calibration_levels(1024) == [1024] and calibration_levels(512) == [512]


def test_eta_scales_the_last_level_by_the_observed_growth():
    from sglang_cpp.plugin.calibrate import _eta_s

    levels = [1024, 2048, 4096, 8192]
    assert _eta_s(levels, 1, [10.0]) == pytest.approx(30 + 90 + 270)  # no growth seen yet: 3x per doubling
    assert _eta_s(levels, 2, [10.0, 25.0]) == pytest.approx(62.5 + 156.25)  # 2.5x seen
    assert _eta_s(levels, 2, [10.0, 100.0]) == pytest.approx(400 + 1600)  # clamped to quadratic (4x)
    assert _eta_s(levels, 4, [1, 2, 4, 8]) == 0.0
    # levels 4x apart: 9x the time seen over two doublings is 3x per doubling
    assert _eta_s([2048, 8192, 32768], 2, [10.0, 90.0]) == pytest.approx(810)
    # a last level that is not a doubling: 4096 -> 6000 is 2^0.551 times the length, so 2^0.551 times the time
    assert _eta_s([1024, 2048, 4096, 6000], 3, [1, 2, 4]) == pytest.approx(4 * 2 ** 0.5507, rel=1e-3)


def _meta(model="m"):
    return {"model": model, "pp": 2, "tp": 1, "device_name": "cpu_x", "dtype": "float32",
            "attention_backend": "torch_native", "layer_partition": ""}


def test_cache_cut_short_is_found_only_for_the_same_request(tmp_path, monkeypatch):
    """A calibration cut by the budget is stored under the length it reached, and a later start with the
    same target and budget reuses it (recalibrating would stop at the same place); others do not."""
    from sglang_cpp.costmodel import save_profile
    from sglang_cpp.plugin.profiles import cache_path, covered_len, find_cached

    monkeypatch.setenv("SGLANG_CPP_CACHE_DIR", str(tmp_path))
    samples = [{"L": L, "x": x, "ms": 1.0 + L / 100 + x / 50, "stage": 0} for L in (0, 512, 1024, 1536)
               for x in (256, 512)]
    short = cache_path(_meta(), 2048)
    save_profile(short, samples=samples, meta={**_meta(), "max_len": 2048, "requested_max_len": 8128,
                                               "budget_s": 300.0})
    assert "maxlen=2048" in short.name
    assert find_cached(_meta(), 8128, 300.0) == short
    assert find_cached(_meta(), 8128, 600.0) is None  # a larger budget may get further: calibrate
    assert find_cached(_meta(), 4096, 300.0) is None
    assert find_cached(_meta("other"), 8128, 300.0) is None
    assert covered_len({"samples": samples}) == 2048
    full = cache_path(_meta(), 8128)
    save_profile(full, samples=samples, meta={**_meta(), "max_len": 8128})
    assert find_cached(_meta(), 8128, 300.0) == full  # the complete one wins


@pytest.mark.parametrize("M,cap", [(4096, 1024), (8192, 1000), (16384, 4096), (2048, 4096)])
def test_no_calibration_chunk_exceeds_the_plans_largest(M, cap):
    """SGLang sizes its prefill workspaces for --max-prefill-tokens, not for M/2."""
    free = calibration_schedule(M)
    capped = calibration_schedule(M, max_chunk=cap)
    assert [sum(s) for s in capped] == [sum(s) for s in free]  # same prefixes walked, to the same length
    assert max(x for s in capped for x in s) <= cap
    assert all(x % 64 == 0 for s in capped for x in s[:-1])
    if cap >= M // 2:
        assert capped == free


def test_dp_attention_fields_match_upstreams_profiler():
    from sglang_cpp.plugin.calibrate import dp_global_num_tokens

    assert dp_global_num_tokens(512, 4, 2) == [0, 0, 512, 0]
    assert dp_global_num_tokens(64, 1, 0) == [64]


def test_proxies_are_random_and_the_same_on_every_rank():
    import torch

    from sglang_cpp.plugin.calibrate import _random_proxies

    def make():
        return {"hidden_states": torch.zeros(8, 4), "residual": torch.zeros(8, 4),
                "topk_indices": torch.zeros(8, 2, dtype=torch.int32)}
    a, b = _random_proxies(make(), seed=8), _random_proxies(make(), seed=8)
    assert a["hidden_states"].abs().sum() > 0 and a["residual"].std() > 0.5
    assert torch.equal(a["hidden_states"], b["hidden_states"])
    assert not torch.equal(a["hidden_states"], _random_proxies(make(), seed=9)["hidden_states"])
    assert a["topk_indices"].abs().sum() == 0  # integer buffers are left alone


@pytest.mark.parametrize("field,other", [("kv_cache_dtype", "fp8_e4m3"), ("quantization", "fp8"),
                                         ("page_size", 16), ("attention_backend", "auto:FlashInferAttnBackend"),
                                         ("moe_runner_backend", "triton"), ("sglang_version", "0.5.24"),
                                         ("torch_version", "2.14.0"), ("fast_extend", False)])
def test_every_timing_relevant_setting_keys_the_cache(field, other):
    from sglang_cpp.plugin.profiles import cache_path

    base = {**_meta(), "page_size": 1, "kv_cache_dtype": "auto", "quantization": "None",
            "moe_runner_backend": "auto", "fast_extend": True, "sglang_version": "0.5.23", "torch_version": "2.13.0"}
    assert cache_path({**base, field: other}, 8192) != cache_path(base, 8192)
    assert cache_path(dict(base), 8192) == cache_path(base, 8192)


def test_rank0_source_profile_cache_or_calibrate(tmp_path, monkeypatch):
    """What world rank 0 sends every rank: the profile's content, the cached calibration's, or the target."""
    from types import SimpleNamespace

    from sglang_cpp.costmodel import save_profile
    from sglang_cpp.plugin.profiles import cache_path, resolve_source

    monkeypatch.setenv("SGLANG_CPP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SGLANG_CPP_PROFILE", raising=False)
    monkeypatch.setenv("SGLANG_CPP_CALIB_MAX_LEN", "4096")
    cfg = SimpleNamespace(pp_size=2, context_len=65536)
    meta = {**_meta(), "num_layers": 4, "hidden_size": 256}
    src = resolve_source(meta, cfg)
    assert src["kind"] == "calibrate" and src["max_len"] == 4096
    samples = [{"L": L, "x": x, "ms": 1.0 + L / 100 + x / 50, "stage": s} for s in (0, 1)
               for L in (0, 512, 1024, 2048) for x in (512, 1024, 2048)]
    save_profile(cache_path(meta, 4096), samples=samples, meta={**meta, "max_len": 4096})
    src = resolve_source(meta, cfg)
    assert src["kind"] == "cache" and len(src["doc"]["samples"]) == len(samples)
    bad = tmp_path / "bad.json"
    bad.write_text("{oops")
    monkeypatch.setenv("SGLANG_CPP_PROFILE", str(bad))
    with pytest.raises(ValueError, match=f"SGLANG_CPP_PROFILE={bad}"):
        resolve_source(meta, cfg)


def test_per_device_file_name_is_one_rule():
    """`tune chunk`'s profile and the calibration cache share the naming (files.device_file_name): the cache
    adds its layers/key/maxlen fields after the same five."""
    from sglang_cpp.files import device_file_name
    from sglang_cpp.plugin.profiles import cache_path

    assert device_file_name("/models/Qwen3-8B/", 4, 2, "NVIDIA H20", "bfloat16") == \
        "model=Qwen3-8B,pp=4,tp=2,device_name=NVIDIA_H20,dtype=bfloat16.json"
    name = cache_path(_meta(), 2048).name
    assert name.startswith(device_file_name(_meta()["model"], 2, _meta()["tp"], _meta()["device_name"],
                                            _meta()["dtype"])[:-len(".json")] + ",layers=")
    assert name.endswith(",maxlen=2048.json")


def test_cpu_calibration_file_names_the_isa():
    """Hosts of one CPU model differ (AVX2 only, or AVX-512 with bf16, ~45x apart on bf16 GEMMs): a
    calibration measured on one must not load on the other, so the device name carries the ISA."""
    from sglang_cpp.machine import cpu_isa
    from sglang_cpp.plugin.profiles import device_name

    isa = cpu_isa().replace(" ", "_").replace("(", "").replace(")", "")
    assert isa and isa.split("_")[0] in device_name("cpu")


# -- issue 25: the per-chunk overhead of the pipelined startup probe -------------------------------------
def test_overhead_is_the_median_of_what_a_step_costs_beyond_its_forward_and_its_waits():
    from sglang_cpp.plugin.overhead import decide_overheads, stage_overhead

    steps = [(40.0, 30.0, 6.0), (41.0, 30.5, 8.0), (39.0, 30.0, 5.5)]  # step, forward, blocked (ms)
    assert stage_overhead(steps) == pytest.approx(3.5)  # medians of 4.0, 2.5, 3.5
    got = [{"stage": 1, "steps": [(10.0, 9.0, 0.0)]}, {"stage": 0, "steps": steps},
           {"stage": 1, "steps": [(10.0, 7.0, 0.5)]}]  # two TP ranks on stage 1: the slower one counts
    assert decide_overheads(got) == [pytest.approx(3.5), pytest.approx(2.5)]


@pytest.mark.parametrize("steps", [[(10.0, 12.0, 0.0)], []])
def test_a_negative_or_missing_overhead_fails_naming_the_stage(steps):
    from sglang_cpp.plugin.overhead import decide_overheads

    with pytest.raises(RuntimeError, match=r"measured on PP1 is .*SGLANG_CPP_OVERHEAD_PROBE=0"):
        decide_overheads([{"stage": 0, "steps": [(5.0, 4.0, 0.0)]}, {"stage": 1, "steps": steps}])


def test_overhead_probe_setting_is_validated(monkeypatch):
    from sglang_cpp import envs

    monkeypatch.setenv("SGLANG_CPP_OVERHEAD_PROBE", "-1")
    with pytest.raises(ValueError, match="SGLANG_CPP_OVERHEAD_PROBE='-1' is invalid"):
        envs.OVERHEAD_PROBE.get()
    monkeypatch.setenv("SGLANG_CPP_OVERHEAD_PROBE", "0")
    assert envs.OVERHEAD_PROBE.get() == 0
