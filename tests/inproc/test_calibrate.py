"""The calibration design (which shapes get measured), without a server."""
from __future__ import annotations

import pytest

from types import SimpleNamespace

from sglang_cpp.core.calib_grid import calibration_grid, calibration_levels, level_grids


@pytest.mark.parametrize("M,cap,lo", [(1024, 0, 0), (2048, 0, 0), (8128, 16384, 0), (8192, 1024, 0),
                                       (32768, 16384, 0), (131072, 12288, 128), (1048576, 16384, 0), (8192, 1000, 100)])
def test_grid_varies_prefix_and_chunk_independently(M, cap, lo):
    """Issue 26: at every sampled prefix, at least 3 chunk sizes from the planner's smallest to its largest
    that fit; prefixes log-spaced from 0 to 7M/8; nothing beyond the target or the plan's largest chunk."""
    pts = calibration_grid(M, 64, cap, lo)
    by_L: dict = {}
    for L, x in pts:
        by_L.setdefault(L, []).append(x)
    smallest = max(64, -(-lo // 64) * 64)
    largest = cap // 64 * 64 if cap else M
    assert all(L + x <= M and x % 64 == 0 and L % 64 == 0 for L, x in pts)
    assert max(x for _, x in pts) == min(largest, M // 64 * 64)
    assert sorted(by_L)[0] == 0 and max(by_L) >= 7 * M // 8 - 64 and len(by_L) >= 5
    ratios = [b / a for a, b in zip(sorted(by_L)[1:], sorted(by_L)[2:])]
    assert all(r <= 2.1 for r in ratios)  # log-spaced or closer: no gap of more than 2x in L (aligned down)
    for L, xs in by_L.items():
        room = min(largest, M - L) // 64 * 64
        assert min(xs) == smallest and max(xs) == room
        assert len(set(xs)) == 3 or room < 3 * smallest  # 3 sizes wherever 3 fit


def test_level_grids_measure_nothing_twice_and_each_level_is_complete():
    grids = level_grids(32768, 64, 16384)
    assert [lv for lv, _ in grids] == calibration_levels(32768)
    seen = [p for _, pts in grids for p in pts]
    assert len(seen) == len(set(seen))
    done: set = set()
    for lv, pts in grids:  # a budget that stops after this level still has this level's whole grid
        done |= set(pts)
        assert set(calibration_grid(lv, 64, 16384)) <= done


def test_proxies_are_views_of_one_buffer_set_refilled_before_every_forward():
    """Issue 27 item 7: one buffer set, grown only for a longer chunk, sliced per forward, and fresh seeded
    values each time (a model that wrote its proxies in place left the next forward garbage)."""
    import torch

    from sglang_cpp.plugin.startup.harness import proxy_views

    made = []

    def alloc(m):
        made.append(m)
        return {"hidden_states": torch.zeros(m, 8), "residual": torch.zeros(m, 8),
                "topk_indices": torch.zeros(m, 2, dtype=torch.int32)}

    cache: dict = {}
    a = proxy_views(cache, 256, seed=256, alloc=alloc)
    ref = a["hidden_states"].clone()
    a["hidden_states"].mul_(0).add_(1e30)  # the model wrote into it
    b = proxy_views(cache, 256, seed=256, alloc=alloc)
    assert torch.equal(b["hidden_states"], ref)  # refilled: the same seeded values again
    small = proxy_views(cache, 64, seed=64, alloc=alloc)
    assert small["residual"].shape == (64, 8) and small["residual"].data_ptr() == b["residual"].data_ptr()
    proxy_views(cache, 1024, seed=1024, alloc=alloc)
    assert made == [256, 1024] and cache["tokens"] == 1024  # grown once, never one set per size
    assert not proxy_views(cache, 64, seed=64, alloc=alloc)["topk_indices"].any()  # integer proxies stay zero


def test_top_chunk_follows_the_plan_on_the_model_so_far_not_the_memory_cap():
    """Issue 26: a level after the first samples, at each prefix L, chunks up to the largest chunk that the
    plan for that level's length (on the model fitted so far) still runs at or past L, rounded up onto the
    alignment grid (64 * 2^k), within [4 units, cap]: big early chunks are sampled where they run, over
    short prefixes."""
    import numpy as np

    from sglang_cpp.core.costmodel import CostModel, PipelineCost
    from sglang_cpp.core.planner import PlanConfig, plan_equal_time
    from sglang_cpp.core.calib_grid import calibration_grid, cap_at, top_chunk

    pc = PlanConfig(pp_size=2, align=64, max_chunk=16384)
    cpu = CostModel(c0=2.0, b=0.05, e=2e-6, f=3e-6)  # torch_native-like: the x^2 term punishes big chunks
    stages = PipelineCost((cpu, cpu))
    chunks = plan_equal_time(32768, stages, pc).chunks
    ends = np.cumsum(chunks)
    tops = top_chunk(stages, 32768, pc, 16384)
    assert chunks[0] > chunks[-1] and [e for e, _ in tops] == sorted(e for e, _ in tops)
    for L in (0, 4096, 16384, 30000):
        biggest = max(c for c, e in zip(chunks, ends) if e > L)  # by hand: the chunks still running at L
        top = cap_at(tops, L)
        assert biggest <= top < 2 * biggest and (top // 64) & (top // 64 - 1) == 0, (L, biggest, top)
    assert cap_at(tops, 0) > cap_at(tops, 30000)  # late prefixes sample smaller chunks
    grid = calibration_grid(32768, 64, tops)
    assert max(x for L, x in grid if L >= 28672) <= cap_at(tops, 28672) < max(x for L, x in grid if L == 0)
    assert cap_at(5000, 123) == 5000 and cap_at(0, 9) == 0 and cap_at([[10, 256], [20, 128]], 25) == 128
    # a model whose chunks cost mostly their fixed part wants the biggest chunks: the top stays at the cap
    heavy = CostModel(c0=5000.0, b=0.01)
    assert cap_at(top_chunk(PipelineCost((heavy, heavy)), 32768, pc, 16384), 0) == 16384
    assert cap_at(top_chunk(PipelineCost((heavy, heavy)), 32768, PlanConfig(pp_size=2, align=64), 0), 0) >= 16384
    # never fewer than 4 alignment units: three distinct sizes per prefix
    tiny = CostModel(c0=0.0, b=0.01, f=1.0)
    assert top_chunk(PipelineCost((tiny, tiny)), 4096, pc, 16384)[-1][1] == 256


def test_calibration_target_is_the_context_clamped_to_every_bound():
    from sglang_cpp.plugin.startup.profiles import calibration_target

    assert calibration_target(0, 8192, 8196, 10**6) == (8128, "the context length - 1")
    assert calibration_target(0, 65536, 65540, 40000) == (38720, "the smallest stage's KV pool (40000 tokens) "
                                                                 "less 1250")
    assert calibration_target(0, 131072, 32769, 10**7)[1] == "the request table's max context"
    assert calibration_target(4096, 8192, 8196, 10**6) == (4096, "SGLANG_CPP_CALIB_MAX_LEN")
    # README's old advice, "set it to your longest prompt", no longer aborts a stage: the pool bounds it
    assert calibration_target(10**6, 10**6 + 1, 10**6 + 5, 200000)[0] == 193728


def test_random_prefix_fills_exactly_the_given_slots():
    import torch

    from sglang_cpp.plugin.startup.calibrate import fill_random

    pool = SimpleNamespace(k_buffer=[torch.zeros(20, 2, 4) for _ in range(2)],
                           v_buffer=[torch.zeros(20, 2, 4, dtype=torch.bfloat16) for _ in range(2)],
                           kv_buffer=[torch.zeros(20, 8, dtype=torch.uint8)])  # fp8 kept as bytes
    loc = torch.tensor([3, 4, 9])
    assert fill_random(pool, loc, seed=1) == 4
    for buf in pool.k_buffer + pool.v_buffer:
        assert (buf[loc].float().abs().sum(dim=(1, 2)) > 0).all() and buf[loc].float().std() > 0.5
        assert buf[[0, 1, 2, 5, 10, 19]].abs().sum() == 0
    assert pool.kv_buffer[0].sum() == 0  # integer storage left as it is
    again = SimpleNamespace(k_buffer=[torch.zeros(20, 2, 4)])
    fill_random(again, loc, seed=1)
    assert torch.equal(again.k_buffer[0], pool.k_buffer[0])  # seeded: the same on every rank of a stage
    big = SimpleNamespace(k_buffer=[torch.zeros(10000, 1, 2)])
    fill_random(big, torch.arange(5000, 10000), seed=0)  # more slots than one random block: tiled
    assert big.k_buffer[0][:5000].abs().sum() == 0 and (big.k_buffer[0][5000:].abs().sum(dim=(1, 2)) > 0).all()


def test_levels_quadruple_to_the_target():
    assert calibration_levels(8192) == [2048, 8192]
    assert calibration_levels(6016) == [1472, 6016]  # 6016/4 = 1504, kept a multiple of 64
    assert calibration_levels(4096) == [1024, 4096]
    assert calibration_levels(131072) == [2048, 8192, 32768, 131072]
    assert calibration_levels(1024) == [1024] and calibration_levels(512) == [512]


def test_eta_scales_the_last_level_by_the_observed_growth():
    from sglang_cpp.core.calib_grid import _eta_s

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
    from sglang_cpp.core.profile_io import save_profile
    from sglang_cpp.plugin.startup.profiles import cache_path, covered_len, find_cached

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


def test_proxies_are_random_and_the_same_on_every_rank():
    import torch

    from sglang_cpp.plugin.startup.harness import _random_proxies

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
    from sglang_cpp.plugin.startup.profiles import cache_path

    base = {**_meta(), "page_size": 1, "kv_cache_dtype": "auto", "quantization": "None",
            "moe_runner_backend": "auto", "fast_extend": True, "sglang_version": "0.5.23", "torch_version": "2.13.0"}
    assert cache_path({**base, field: other}, 8192) != cache_path(base, 8192)
    assert cache_path(dict(base), 8192) == cache_path(base, 8192)


def test_rank0_source_profile_cache_or_calibrate(tmp_path, monkeypatch):
    """What world rank 0 sends every rank: the profile's content, the cached calibration's, or the target."""
    from types import SimpleNamespace

    from sglang_cpp.core.profile_io import save_profile
    from sglang_cpp.plugin.startup.profiles import cache_path, resolve_source

    monkeypatch.setenv("SGLANG_CPP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SGLANG_CPP_PROFILE", raising=False)
    monkeypatch.setenv("SGLANG_CPP_CALIB_MAX_LEN", "4096")
    cfg = SimpleNamespace(pp_size=2, context_len=65536)
    meta = {**_meta(), "num_layers": 4, "hidden_size": 256}
    src = resolve_source(meta, cfg)
    assert src["kind"] == "calibrate" and src["max_len"] == 4096
    from sglang_cpp.plugin.startup.profiles import _rank0_source  # a calibration: rank 0's grid switches go with it
    mla = {**meta, "kernel_switches": [8192], "chunk_switches": [], "regime_names": ["mha", "absorbed"]}
    assert _rank0_source(mla, cfg, 0, 0, {})["switches"] == {"kernel_switches": [8192], "chunk_switches": [],
                                                             "regime_names": ["mha", "absorbed"]}
    assert _rank0_source(meta, cfg, 0, 0, {})["switches"] == {}  # no switches: no keys (the cache key unchanged)
    samples = [{"L": L, "x": x, "ms": 1.0 + L / 100 + x / 50, "stage": s} for s in (0, 1)
               for L in (0, 512, 1024, 2048) for x in (512, 1024, 2048)]
    save_profile(cache_path(meta, 4096), samples=samples, meta={**meta, "max_len": 4096})
    src = resolve_source(meta, cfg)
    assert src["kind"] == "cache" and len(src["doc"]["samples"]) == len(samples)
    # issue 26: rank 0 fits and sends coefficients; the samples never leave it, and no other rank refits
    from sglang_cpp.core.costmodel import model_from_dict
    from sglang_cpp.core.profile_io import cost_from_profile
    from sglang_cpp.plugin.startup.profiles import _rank0_source

    kept: dict = {}
    sent = _rank0_source(meta, cfg, 0, 0, kept)
    assert sent["doc"] is None and sent["covered"] == 4096 and kept["samples"] == samples
    got, ref = model_from_dict(sent["model"]), cost_from_profile(src["doc"])
    assert [m.coeffs for m in got.stages] == [m.coeffs for m in ref.stages]
    bad = tmp_path / "bad.json"
    bad.write_text("{oops")
    monkeypatch.setenv("SGLANG_CPP_PROFILE", str(bad))
    with pytest.raises(ValueError, match=f"SGLANG_CPP_PROFILE={bad}"):
        resolve_source(meta, cfg)


def test_per_device_file_name_is_one_rule():
    """`tune chunk`'s profile and the calibration cache share the naming (files.device_file_name): the cache
    adds its layers/key/maxlen fields after the same five."""
    from sglang_cpp.files import device_file_name
    from sglang_cpp.plugin.startup.profiles import cache_path

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
    from sglang_cpp.plugin.startup.profiles import device_name

    isa = cpu_isa().replace(" ", "_").replace("(", "").replace(")", "")
    assert isa and isa.split("_")[0] in device_name("cpu")


# -- issue 25: the per-chunk overhead of the pipelined startup probe -------------------------------------
def test_overhead_is_the_median_of_what_a_step_costs_beyond_its_forward_and_its_waits():
    from sglang_cpp.plugin.startup.overhead import decide_overheads, stage_overhead

    steps = [(40.0, 30.0, 6.0), (41.0, 30.5, 8.0), (39.0, 30.0, 5.5)]  # step, forward, blocked (ms)
    assert stage_overhead(steps) == pytest.approx(3.5)  # medians of 4.0, 2.5, 3.5
    got = [{"stage": 1, "steps": [(10.0, 9.0, 0.0)]}, {"stage": 0, "steps": steps},
           {"stage": 1, "steps": [(10.0, 7.0, 0.5)]}]  # two TP ranks on stage 1: the slower one counts
    assert [o.ms for o in decide_overheads(got)] == [pytest.approx(3.5), pytest.approx(2.5)]


def test_the_received_hidden_states_give_the_receiving_stage_a_term_in_x():
    """Issue 45 item 6: a hop's receive timed alone at two sizes; a line through the two medians is the
    receiving stage's ms at x = 0 (added to its step median) and ms per token; the slowest TP rank's of each;
    PP0 receives nothing. A pair that falls with x (noise) gives no term in x, never a negative one."""
    from sglang_cpp.core.costmodel import ChunkOverhead, CostModel, PipelineCost, with_overheads
    from sglang_cpp.plugin.startup.overhead import decide_overheads, transfer_line, transfer_medians, transfer_sizes

    assert transfer_line({128: [1.0, 0.9, 5.0], 2048: [2.9, 3.0, 3.1]}) == (pytest.approx(1 - 128 / 960),
                                                                           pytest.approx(1 / 960))
    assert transfer_line({128: [2.0], 2048: [1.5]}) == (2.0, 0.0) and transfer_line({}) == (0.0, 0.0)
    assert transfer_line({128: [0.5]}) == (0.5, 0.0)
    steps = [(10.0, 7.0, 1.0)]  # 2 ms beyond forward and waits
    got = [{"stage": 0, "steps": steps, "transfer": {}},
           {"stage": 1, "steps": steps, "transfer": {128: [1.0], 2048: [3.0]}},  # TP0: 0.8667 + 1/960 per token
           {"stage": 1, "steps": steps, "transfer": {128: [1.0], 2048: [4.0]}}]  # TP1: 0.8 + 1/640 per token
    over = decide_overheads(got)
    assert over[0] == ChunkOverhead(2.0, 0.0, 0.0)
    assert over[1].ms == 2.0 and over[1].received_ms == pytest.approx(1.0 - 128 / 960)  # apart: online keeps it
    assert over[1].per_token_ms == pytest.approx(1 / 640) and over[1].per_chunk_ms == pytest.approx(3.0 - 128 / 960)
    assert transfer_medians(got) == [[], [[128, 1.0], [2048, 4.0]]]
    base = CostModel(c0=1.0, b=0.01, e=2e-6, f=1e-6)
    served = with_overheads(PipelineCost((base, base)), over, 2)  # each stage's overhead beside its model
    assert served.stages == (base, base) and served.overheads == tuple(over)
    assert served.charged[1].c0 == pytest.approx(1.0 + over[1].per_chunk_ms)
    assert served.charged[1].b == pytest.approx(0.01 + 1 / 640) and served.charged[0].b == 0.01
    assert float(served.stage_times(0, 4096)[1] - base.time(0, 4096)) == pytest.approx(over[1].per_chunk_ms + 4096 / 640)
    # the probe's own size and 16 times it, at most 4096 and the plans' largest chunk; one size if too close
    assert transfer_sizes(64, 16384) == (128, 2048) and transfer_sizes(256, 16384) == (512, 4096)
    assert transfer_sizes(64, 1000) == (128, 960) and transfer_sizes(64, 256) == (128,)


@pytest.mark.parametrize("steps", [[(10.0, 12.0, 0.0)], []])
def test_a_negative_or_missing_overhead_fails_naming_the_stage(steps):
    from sglang_cpp.plugin.startup.overhead import decide_overheads

    with pytest.raises(RuntimeError, match=r"measured on PP1 is .*SGLANG_CPP_OVERHEAD_PROBE=0"):
        decide_overheads([{"stage": 0, "steps": [(5.0, 4.0, 0.0)]}, {"stage": 1, "steps": steps}])


def test_overhead_probe_setting_is_validated(monkeypatch):
    from sglang_cpp import envs

    monkeypatch.setenv("SGLANG_CPP_OVERHEAD_PROBE", "-1")
    with pytest.raises(ValueError, match="SGLANG_CPP_OVERHEAD_PROBE='-1' is invalid"):
        envs.OVERHEAD_PROBE.get()
    monkeypatch.setenv("SGLANG_CPP_OVERHEAD_PROBE", "0")
    assert envs.OVERHEAD_PROBE.get() == 0
