"""One mapping from server settings to planner settings (issue 25): the plugin's SizerConfig, `plan`,
`simulate`, `bench ttft`, the policy dispatch and `tune` give the same chunks for the same settings, and
the chunk ceiling is SGLang's own prefill-buffer ceiling."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from sglang_cpp.cli import main
from sglang_cpp.core.costmodel import CostModel
from sglang_cpp.core.planner import prefill_buffer_tokens

COEFFS = "4.0,0.0,0.05,0.0,2e-6,1e-6"  # FA-shaped: the plan cuts many chunks of different sizes
COST = CostModel(*(float(v) for v in COEFFS.split(",")))
N, PP, C, MPT = 32768, 4, 8192, 16384  # the old C/4 floor (2048) would bind: the plan wants < 1.3K


@pytest.mark.parametrize("C_,mpt,pp,dyn", [(8192, 16384, 2, True), (32768, 16384, 4, True), (18432, 16384, 8, True),
                                           (8192, 16384, 1, False), (4096, 8192, 2, False)])
def test_the_ceiling_is_sglangs_own(C_, mpt, pp, dyn):
    """`prefill_buffer_tokens` (for the tools that run no server) equals SGLang 0.5.23's
    `max_prefill_buffer_tokens` on the same server arguments."""
    from sglang.srt.arg_groups.overrides import max_prefill_buffer_tokens
    from sglang.srt.server_args import ServerArgs

    sa = ServerArgs(model_path="m", chunked_prefill_size=C_, max_prefill_tokens=mpt, pp_size=pp,
                    enable_dynamic_chunking=dyn)
    assert prefill_buffer_tokens(C_, mpt, pp, dynamic=dyn) == max_prefill_buffer_tokens(sa)


def _plugin_chunks() -> list[int]:
    """What a PP stage's scheduler runs: the sizer, asked chunk by chunk as SGLang asks it."""
    from sglang.srt.arg_groups.overrides import max_prefill_buffer_tokens
    from sglang.srt.server_args import ServerArgs

    from sglang_cpp.plugin.serving.sizer import CppChunkSizer, SizerConfig

    ceiling = max_prefill_buffer_tokens(ServerArgs(model_path="m", chunked_prefill_size=C, max_prefill_tokens=MPT,
                                                   pp_size=PP, enable_dynamic_chunking=True))
    cfg = SizerConfig(policy="plan", pp_size=PP, pp_rank=1, chunk_size=C, max_prefill_tokens=MPT, page_size=1,
                      context_len=1 << 20, buffer_tokens=ceiling)
    sizer = CppChunkSizer(cfg, cost=COST, current_req=lambda: ("r", N))
    out, L = [sizer.decide("r", N, 0, first=True)], 0
    L += out[-1]
    while L < N:
        out.append(sizer.predict(L))
        L += out[-1]
    return out


def test_every_path_gives_the_plugins_chunks(tmp_path, capsys):
    want = _plugin_chunks()
    assert len(set(want[:-1])) > 3 and len(want) > 8  # a plan that could differ

    from sglang_cpp.core.policy import chunks_for

    assert chunks_for("plan", N, COST, PP, C, max_prefill=MPT) == want

    common = ["--coeffs", COEFFS, "--pp-size", str(PP), "--chunked-prefill-size", str(C)]
    assert main(["plan", *common, "--input-len", str(N), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["chunks"] == want

    assert main(["simulate", *common, "--input-len", str(N), "--policy", "plan", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["chunks"] == want

    out = tmp_path / "ttft.jsonl"
    assert main(["bench", "ttft", *common, "--input-lens", str(N), "--policy", "plan", "--num-requests", "1",
                 "--output-jsonl", str(out)]) == 0
    (rec,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert rec["chunk_plan"]["chunks"] == want

    from sglang_cpp.tuning.recommend import plan_options

    cfg = SimpleNamespace(align=64, max_prefill_tokens=MPT, pp_size=PP, page_size=1, ctx=1 << 20, chunk_overhead_ms=0.0,
                          input_lens=[N])
    (opt,) = plan_options(cfg, [COST], [COST] * PP, lambda ch: 0.0, C, ())
    assert opt.chunks[N] == want


def test_the_overrides_reach_every_path(capsys):
    """SGLANG_CPP_MIN_CHUNK / MAX_CHUNK are the planner's only bounds besides memory: --min-chunk and
    --max-chunk on `plan` give the plugin's chunks under the same overrides."""
    from sglang_cpp.plugin.serving.sizer import CppChunkSizer, SizerConfig

    cfg = SizerConfig(policy="plan", pp_size=PP, pp_rank=0, chunk_size=C, max_prefill_tokens=MPT, page_size=1,
                      context_len=1 << 20, min_chunk=1024, max_chunk=4096)
    plan = CppChunkSizer(cfg, cost=COST).plan_for("r", N, 0)
    assert min(plan.chunks[:-1]) >= 1024 and max(plan.chunks) <= 4096
    assert main(["plan", "--coeffs", COEFFS, "--pp-size", str(PP), "--chunked-prefill-size", str(C), "--input-len",
                 str(N), "--min-chunk", "1024", "--max-chunk", "4096", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["chunks"] == list(plan.chunks)
