from __future__ import annotations

import json

import numpy as np
import pytest

from sglang_cpp.core.costmodel import CostModel, PipelineCost, fit_cost_model
from sglang_cpp.core.profile_io import cost_from_profile, load_cost, load_profile, parse_coeffs, save_profile

TRUE = dict(c0=12.0, g=0.004, b=0.35, d=3e-7, e=6e-7, f=3e-7)


def grid(model, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    L, x = np.meshgrid([0, 2048, 8192, 16384, 32768, 65536], [512, 2048, 4096, 8192])
    L, x = L.ravel().astype(float), x.ravel().astype(float)
    y = model.time(L, x) * (1 + rng.normal(0, noise, L.size))
    return L, x, y


def test_fit_recovers_known_coefficients_within_2pct():
    truth = CostModel(**TRUE)
    m = fit_cost_model(*grid(truth), form="full")
    for k, v in TRUE.items():
        assert getattr(m, k) == pytest.approx(v, rel=0.02), k
    assert m.fit["r2"] > 0.999 and m.fit["median_rel_err"] < 0.01
    assert "holdout" in m.fit and m.fit["holdout"]["median_rel_err"] < 0.02


def test_noisy_fit_predicts_within_noise():
    """With 1% noise single coefficients trade off (d, e, f), but predictions stay within 3%."""
    truth = CostModel(**TRUE)
    m = fit_cost_model(*grid(truth, noise=0.01, seed=3), form="full")
    L, x, _ = grid(truth)
    rel = np.abs(m.time(L, x) / truth.time(L, x) - 1)
    assert rel.max() < 0.03 and m.fit["r2"] > 0.99
    # extrapolation to 4x the profiled prefix stays within 10% (the point of a physical form)
    assert float(m.time(262144, 4096)) == pytest.approx(float(truth.time(262144, 4096)), rel=0.1)


def test_fa_form_is_special_case():
    truth = CostModel.fa(a=2e-7, b=0.1, c0=5.0, g=0.001)
    assert truth.is_fa_form and truth.time(1000, 100) == pytest.approx(5 + 1 + 10 + 2e-7 * 100 * 2100)
    m = fit_cost_model(*grid(truth), form="fa")
    assert m.is_fa_form and m.f == pytest.approx(2e-7, rel=0.02) and m.g == pytest.approx(0.001, rel=0.02)


def test_robust_to_outlier():
    truth = CostModel(**TRUE)
    L, x, y = grid(truth)
    y[3] *= 8  # a cold run
    m = fit_cost_model(L, x, y)
    assert m.f == pytest.approx(TRUE["f"], rel=0.1) and m.e == pytest.approx(TRUE["e"], rel=0.05)


def test_one_d_upstream_samples_fit_fa_form():
    l = np.linspace(128, 15360, 40)
    y = 2e-6 * l * l + 0.05 * l + 20
    m = fit_cost_model(np.zeros_like(l), l, y)
    assert m.fit["one_d"] and m.is_fa_form and m.g == 0
    assert m.f == pytest.approx(2e-6, rel=0.02) and m.b == pytest.approx(0.05, rel=0.02)


def test_max_chunk_for_inverts_time():
    m = CostModel(**TRUE)
    for L in (0, 5000, 100000):
        for T in (50.0, 500.0, 5000.0):
            x = m.max_chunk_for(L, T)
            if x > 0:
                assert float(m.time(L, x)) == pytest.approx(T, rel=1e-9)
            else:
                assert float(m.time(L, 0)) >= T


def test_pipeline_is_max_over_stages():
    a, b = CostModel.fa(a=1e-6, b=0.1), CostModel(c0=50, b=0.05, d=1e-7, f=1e-7)
    p = PipelineCost((a, b))
    for L, x in [(0, 100), (100000, 4096), (5000, 16384)]:
        assert p.time(L, x) == max(a.time(L, x), b.time(L, x))
        assert p.max_chunk_for(L, 800) == min(a.max_chunk_for(L, 800), b.max_chunk_for(L, 800))


def test_profile_json_round_trip(tmp_path):
    truth = CostModel(**TRUE)
    L, x, y = grid(truth)
    samples = [{"L": float(a), "x": float(b), "ms": float(c), "stage": s} for s in (0, 1)
               for a, b, c in zip(L, x, y)]
    meta = {"model": "m", "device_name": "d", "dtype": "bf16", "tp": 1, "pp": 2, "page_size": 1,
            "sglang_version": "0.5.23", "torch_version": "2.13.0", "date": "2026-11-22"}
    cost = cost_from_profile({"samples": samples, "meta": meta})
    assert isinstance(cost, PipelineCost) and len(cost.stages) == 2
    p = save_profile(tmp_path / "p.json", samples=samples, meta=meta, cost=cost)
    doc = load_profile(p)
    assert doc["meta"] == meta and len(doc["samples"]) == len(samples)
    again = load_cost(p)
    assert [m.coeffs for m in again.stages] == [m.coeffs for m in cost.stages]


@pytest.mark.parametrize("content,match", [
    ("{not json", "not readable JSON"),
    ('{"format": "other"}', "format"),
    ('{"samples": [[1, 2, 3, 4]]}', "sample 0"),
    ('{"samples": []}', "neither samples nor"),
    ('{"samples": [[0, 100, 5], [0, 200, 9]]}', "cannot fit"),
    ('{"samples": [[0, 100, -5], [0, 200, 9]]}', "invalid"),
])
def test_bad_profiles_are_named(tmp_path, content, match):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(ValueError, match=match) as exc:
        load_cost(p)
    assert str(p) in str(exc.value)


def test_upstream_only_profile_loads_but_is_no_2d_model(tmp_path):
    """{'upstream': {a, b, c}} is what policy quadratic reads; policy plan needs samples or stages."""
    from sglang_cpp.core.profile_io import load_profile

    p = tmp_path / "up.json"
    p.write_text('{"format": "sglang-cpp-profile", "samples": [], "upstream": {"a": 1e-3, "b": 11, "c": 220}}')
    assert load_profile(p)["upstream"]["a"] == 1e-3
    with pytest.raises(ValueError, match="SGLANG_CPP_POLICY=quadratic") as exc:
        load_cost(p)
    assert str(p) in str(exc.value)


def test_missing_profile_and_bad_coeffs(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_cost(tmp_path / "nope.json")
    with pytest.raises(ValueError, match="give 3 values"):
        parse_coeffs("1,2")
    with pytest.raises(ValueError, match=">= 0"):
        CostModel(c0=-1, b=1)
    assert parse_coeffs("1e-6,0.05,20").is_fa_form
    assert json.loads(json.dumps(CostModel(**TRUE).to_dict()))["coeffs"]["f"] == TRUE["f"]


def test_whole_pipeline_profile_charges_each_stage_its_share(tmp_path):
    """`profile --backend server` times a chunk through all P stages (scope 'all'); a reader that copied
    it to every stage would charge each stage the whole pipeline's time (P times too slow)."""
    from sglang_cpp.core.costmodel import CostModel
    from sglang_cpp.core.profile_io import load_cost, save_profile

    whole = CostModel(c0=40.0, b=0.2, e=2e-5, f=1e-5)  # what the server measured, all stages together
    samples = [{"L": L, "x": x, "ms": float(whole.time(L, x)), "stage": 0, "scope": "all"}
               for L in (0, 2048, 4096, 8192) for x in (256, 512, 1024, 2048)]
    p = save_profile(tmp_path / "server.json", samples=samples, meta={"pp": 4})
    stage = load_cost(p)
    for L, x in ((0, 512), (6000, 1024), (8192, 2048)):
        assert stage.time(L, x) == pytest.approx(whole.time(L, x) / 4, rel=0.02)
    assert stage.meta["scope"] == "stage"


def test_one_profile_check_for_every_command_names_the_file_the_field_and_the_flag(tmp_path, capsys):
    """Issue 47 item 2: a profile measured at PP2 (two per-stage models) is refused by plan, simulate and bench ttft
    at --pp-size 4 with the same line (the file, what it holds, the flag); a one-stage model serves any PP size;
    the plugin's check is the same function (model, --tp-size, --dtype)."""
    from sglang_cpp.cli import main as cli_main
    from sglang_cpp.core.costmodel import CostModel, PipelineCost
    from sglang_cpp.core.profile_io import check_profile, load_profile, save_profile

    m = CostModel(c0=1.0, b=0.01, e=2e-6, f=1e-6)
    two = save_profile(tmp_path / "pp2.json", cost=PipelineCost((m, m)), meta={"pp": 2, "tp": 8, "dtype": "bfloat16",
                                                                              "model": "/models/Qwen3-8B"})
    one = save_profile(tmp_path / "pp1.json", cost=m)
    runs = (["plan", "--profile", str(two), "--input-len", "32k", "--pp-size", "4"],
            ["simulate", "--profile", str(two), "--input-len", "32k", "--pp-size", "4"],
            ["bench", "ttft", "--simulate", str(two), "--input-len", "32k", "--pp-size", "4", "--num-requests", "1"])
    for argv in runs:
        assert cli_main(argv) == 2
        err = capsys.readouterr().err
        assert f"profile {two} has 2 per-stage models but --pp-size is 4" in err and "give --pp-size 2" in err, err
    for argv in runs:
        assert cli_main([a if a != str(two) else str(one) for a in argv]) == 0
        capsys.readouterr()
    doc = load_profile(two)
    for kw, needle in ((dict(tp_size=4), "measured with tp=8 but this server runs --tp-size 4"),
                       (dict(dtype="float32"), "measured with dtype=bfloat16 but this server runs --dtype float32"),
                       (dict(model="Llama-3-8B"), "measured on model Qwen3-8B but this server serves Llama-3-8B")):
        with pytest.raises(ValueError, match=needle):
            check_profile(doc, "SGLANG_CPP_PROFILE=x", **kw)
    check_profile(doc, "x", pp_size=2, tp_size=8, dtype="torch.bfloat16", model="/elsewhere/Qwen3-8B/")


def test_a_pipeline_prices_on_its_undominated_rows_bit_for_bit():
    """`PipelineCost.time` takes the maximum over the rows no other row dominates (equal stages price as one):
    the same floats as the maximum over every row, for equal stages, dominated ones and rows that cross."""
    from sglang_cpp.core.costmodel import _rows_at

    rng = np.random.default_rng(5)
    base = [CostModel.fa(a=1e-6, b=0.05, c0=20.0), CostModel.fa(a=1.3e-6, b=0.04, c0=25.0),
            CostModel(c0=3.0, g=1e-4, b=0.02, d=1e-9, e=2e-6, f=1e-6)]
    stages = tuple(base[i] for i in rng.integers(0, 3, size=12)) + (CostModel.fa(a=0.5e-6, b=0.01, c0=1.0),)
    cost = PipelineCost(stages, tuple(float(o) for o in rng.choice([0.0, 2.0, 5.0], size=len(stages))))
    L, x = rng.integers(0, 1 << 20, size=500).astype(float), rng.integers(1, 32768, size=500).astype(float)
    assert np.array_equal(cost.time(L, x), _rows_at(cost._coefs, L, x).max(axis=0))
    assert len(cost._pace) < len(cost._coefs)  # duplicates and the dominated stage dropped
