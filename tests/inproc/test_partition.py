from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_cpp.core.partition import (ENV_NAME, Partition, default_partition, format_partition,
                                  gain_over_default, parse_partition, partition_layers,
                                  stage_times_for)


def brute_force(costs, P, embed=0.0, head=0.0):
    """Min bottleneck over every composition of len(costs) into P positive parts."""
    N = len(costs)
    best = float("inf")
    for cuts in itertools.combinations(range(1, N), P - 1):
        parts = [b - a for a, b in zip((0,) + cuts, cuts + (N,))]
        best = min(best, max(stage_times_for(parts, costs, embed, head)))
    return best


# --- SGLang's default rule, expected values written by hand -------------------------------

@pytest.mark.parametrize("N,P,expected", [
    (30, 4, (7, 7, 8, 8)),
    (61, 8, (7, 7, 7, 8, 8, 8, 8, 8)),
    (32, 4, (8, 8, 8, 8)),
    (10, 3, (3, 3, 4)),
    (28, 3, (9, 9, 10)),
    (5, 5, (1, 1, 1, 1, 1)),
    (7, 1, (7,)),
    (80, 6, (13, 13, 13, 13, 14, 14)),
])
def test_default_and_uniform_costs_match_sglang(N, P, expected):
    assert default_partition(N, P) == expected
    assert partition_layers([1.0] * N, P).parts == expected
    assert partition_layers([0.37] * N, P).parts == expected  # float sums must still tie
    assert partition_layers([0.0] * N, P).parts == expected   # no information -> default


@pytest.mark.parametrize("N,P", [(94, 8), (61, 4), (30, 2), (80, 6), (7, 7), (64, 8), (95, 16)])
def test_default_is_sglangs_own_get_pp_indices(N, P, monkeypatch):
    """The one default split (simulator, analytic, partitioner, tuner) against SGLang 0.5.23's function."""
    from sglang.srt.distributed.utils import get_pp_indices

    monkeypatch.delenv(ENV_NAME, raising=False)
    want = tuple(e - s for s, e in (get_pp_indices(N, r, P) for r in range(P)))
    assert default_partition(N, P) == want


@given(st.integers(1, 80), st.integers(1, 8))
def test_uniform_costs_always_match_default(N, P):
    if N >= P:
        assert partition_layers([2.5] * N, P).parts == default_partition(N, P)


# --- hand-computed small cases --------------------------------------------------------------

def test_heavy_last_layer_gets_its_own_stage():
    p = partition_layers([1, 1, 1, 10], 2)
    assert p.parts == (3, 1) and p.stage_times == (3.0, 10.0) and p.bottleneck == 10.0


def test_embedding_and_head_weights_shift_layers():
    costs = [1.0] * 8
    assert partition_layers(costs, 2).parts == (4, 4)
    assert partition_layers(costs, 2, head_cost=2.0).parts == (5, 3)    # 5 | 3+2
    assert partition_layers(costs, 2, embed_cost=2.0).parts == (3, 5)   # 2+3 | 5
    # last stage >= 1+3 = 4 is the bottleneck; the rest balance to times (2,3,3), extras late
    p = partition_layers(costs, 4, embed_cost=1.0, head_cost=3.0)
    assert p.parts == (1, 3, 3, 1) and p.stage_times == (2.0, 3.0, 3.0, 4.0)


def test_forbidden_cut_forces_other_split():
    costs = [1.0] * 6
    assert partition_layers(costs, 2).parts == (3, 3)
    p = partition_layers(costs, 2, forbidden_cuts=[3])
    assert p.parts == (2, 4) and p.bottleneck == 4.0  # tie (2,4)/(4,2): later rank gets more


def test_memory_limit_forces_split():
    costs = [1.0, 1.0, 1.0, 1.0]
    mem = [1.0, 1.0, 1.0, 5.0]
    assert partition_layers(costs, 2).parts == (2, 2)
    p = partition_layers(costs, 2, layer_mem=mem, mem_limit=5.5)  # (2,2) needs 1+5 = 6
    assert p.parts == (3, 1) and p.bottleneck == 3.0
    # head memory on the last stage: last layer + head no longer fit with anything else
    p = partition_layers([1.0] * 4, 2, layer_mem=[1.0] * 4, mem_limit=3.0, head_mem=2.0)
    assert p.parts == (3, 1)


def test_partition_value_and_env():
    p = partition_layers([1.0] * 30, 4)
    assert isinstance(p, Partition)
    assert p.env == "SGLANG_PP_LAYER_PARTITION=7,7,8,8"
    assert p.as_string() == format_partition(p.parts) == "7,7,8,8"
    assert p.layer_ranges == ((0, 7), (7, 14), (14, 22), (22, 30))
    with pytest.raises(Exception):
        p.parts = (1,)  # frozen


def test_gain_over_default():
    assert gain_over_default([1.0] * 30, 4) == pytest.approx(1.0)
    # 8 equal layers on 2 stages, head costs 4 layers: default 4 | 4+4 = 8, best 6 | 2+4 = 6
    assert gain_over_default([1.0] * 8, 2, head_cost=4.0) == pytest.approx(8 / 6)


# --- infeasible splits ---------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,needle", [
    (dict(layer_costs=[1.0] * 3, pp_size=4), "cannot split 3 layers into 4 stages"),
    (dict(layer_costs=[1.0] * 4, pp_size=3, forbidden_cuts=[1, 2]), "forbidden_cuts leave 1"),
    (dict(layer_costs=[1.0] * 4, pp_size=2, forbidden_cuts=[4]), "not between two layers"),
    (dict(layer_costs=[1.0] * 4, pp_size=2, layer_mem=[1.0] * 4, mem_limit=1.5),
     "mem_limit=1.5"),
    (dict(layer_costs=[1.0] * 4, pp_size=2, layer_mem=[1.0] * 3, mem_limit=9.0),
     "layer_mem has 3 entries"),
    (dict(layer_costs=[1.0, -1.0], pp_size=1), "finite costs >= 0"),
])
def test_infeasible_raises_clear_error(kwargs, needle):
    with pytest.raises(ValueError, match=needle) as err:
        partition_layers(**kwargs)
    assert any(w in str(err.value) for w in ("raise", "use", "lower", "cuts are", "layers", ">="))


# --- properties against brute force ----------------------------------------------------------

cost = st.one_of(st.integers(0, 6).map(float), st.floats(0, 100, allow_nan=False))


@settings(max_examples=300, deadline=None)
@given(st.lists(cost, min_size=1, max_size=9), st.integers(1, 4), cost, cost)
def test_optimal_matches_brute_force(costs, P, embed, head):
    if len(costs) < P:
        return
    p = partition_layers(costs, P, embed_cost=embed, head_cost=head)
    assert sum(p.parts) == len(costs) and len(p.parts) == P and min(p.parts) >= 1
    assert p.bottleneck == pytest.approx(brute_force(costs, P, embed, head), rel=1e-9, abs=1e-12)
    assert p.stage_times == stage_times_for(p.parts, costs, embed, head)
    default = max(stage_times_for(default_partition(len(costs), P), costs, embed, head))
    assert p.bottleneck <= default * (1 + 1e-9) + 1e-12


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 4).map(float), min_size=1, max_size=9), st.integers(1, 4),
       st.integers(0, 3).map(float), st.integers(0, 3).map(float))
def test_tie_break_contract(costs, P, embed, head):
    """Exact ties (integer costs): min bottleneck, then min sum of squared stage times, then
    more layers on later ranks."""
    N = len(costs)
    if N < P or not (any(costs) or embed or head):
        return
    cands = []
    for cuts in itertools.combinations(range(1, N), P - 1):
        parts = tuple(b - a for a, b in zip((0,) + cuts, cuts + (N,)))
        t = stage_times_for(parts, costs, embed, head)
        cands.append((max(t), sum(x * x for x in t), tuple(-x for x in reversed(parts)), parts))
    assert partition_layers(costs, P, embed_cost=embed, head_cost=head).parts == min(cands)[3]


def test_parse_partition_pp_size_above_layers():
    with pytest.raises(ValueError, match="--pp-size 3 exceeds 2 layers"):
        parse_partition("1,1,1", 2, 3)


# --- parse_partition ------------------------------------------------------------------------

def test_parse_partition_ok():
    assert parse_partition("7,7,8,8", 30, 4) == (7, 7, 8, 8)
    assert parse_partition(" 15 , 15 ", 30, 2) == (15, 15)
    assert parse_partition(format_partition((3, 4)), 7, 2) == (3, 4)


@pytest.mark.parametrize("text,N,P,needle", [
    ("10,10,10", 30, 2, "has 3 entries but --pp-size is 2"),
    ("15,14", 30, 2, "sums to 29 but the model has 30 layers"),
    ("15,x", 30, 2, "entry 'x' is not an integer"),
    ("15,1.5", 30, 2, "entry '1.5' is not an integer"),
    ("30,0", 30, 2, "stage 1 gets 0 layers; every stage needs >= 1"),
    ("31,-1", 30, 2, "stage 1 gets -1 layers"),
    ("", 30, 2, "is empty"),
    ("15,,15", 30, 2, "entry '' is not an integer"),
])
def test_parse_partition_errors(text, N, P, needle):
    with pytest.raises(ValueError) as err:
        parse_partition(text, N, P)
    msg = str(err.value)
    assert needle in msg and "SGLANG_PP_LAYER_PARTITION" in msg
    assert "SGLANG_PP_LAYER_PARTITION=15,15" in msg  # the fix: a valid value to copy


def test_tune_partition_writes_its_result_as_json(tmp_path, capsys):
    """Issue 47 item 5: --json on the tune commands; the partition written is the one printed, in SGLang's form."""
    import json

    from sglang_cpp.cli import main as cli_main

    out = tmp_path / "part.json"
    assert cli_main(["tune", "partition", "--analytic", "deepseek-v3", "--gpu", "H20", "--tp-size", "8", "--pp-size",
                     "4", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert sum(doc["partition"]) == 61 and len(doc["partition"]) == 4 and doc["env"] in text
    assert doc["env"] == "SGLANG_PP_LAYER_PARTITION=" + ",".join(map(str, doc["partition"]))
    assert max(doc["stage_ms"]) <= max(doc["default_stage_ms"]) and doc["gain"] >= 1.0
