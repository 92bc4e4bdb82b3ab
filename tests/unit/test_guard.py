"""Issue 56 item 2: the run-time guard (plugin/serving/guard.py) on batches shaped as SGLang 0.5.23's: the rows a
stage sends with its proxy, and the next stage's check before its forward. The server test is
tests/server/test_server_e2e.py::test_a_stage_that_cuts_another_chunk_fails_naming_the_request_both_stages_and_sizes."""
from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from sglang_cpp.plugin.serving import guard


class Mode:
    def __init__(self, prefill=True):
        self.prefill = prefill

    def is_extend_without_speculative(self):
        return self.prefill


def batch(rows, prefill=True):
    """rows: (rid, prompt_len, prefix, extend) as prepare_for_extend leaves prefix_lens / extend_lens."""
    reqs = [NS(rid=r, origin_input_ids=[0] * n) for r, n, _, _ in rows]
    return NS(reqs=reqs, prefix_lens=[p for *_, p, _ in rows], extend_lens=[x for *_, x in rows],
              forward_mode=Mode(prefill))


def test_a_prefill_batch_sends_its_prompt_rows_and_nothing_else_sends_any():
    b = batch([("a", 9000, 4096, 2048), ("b", 500, 0, 500), ("d", 100, 100, 1)])  # d: a decode row (mixed chunk)
    assert guard.rows_of(b) == [("a", 4096, 2048), ("b", 0, 500)]
    assert guard.rows_of(batch([("d", 100, 100, 1)], prefill=False)) is None  # decode or a speculative verify
    assert guard.rows_of(None) is None and guard.rows_of(NS(reqs=[], forward_mode=Mode())) is None
    out = {"hidden_states": 1, "__msg_type__": "proxy"}  # a graph backend may hand out this dict on every replay
    result = NS(pp_hidden_states_proxy_tensors=NS(tensors=out))
    guard.attach(result, guard.rows_of(b))
    assert result.pp_hidden_states_proxy_tensors.tensors[guard.KEY] == [("a", 4096, 2048), ("b", 0, 500)]
    assert guard.KEY not in out  # a new dict is sent: the model's own output dict keeps no entry
    quiet = NS(pp_hidden_states_proxy_tensors=NS(tensors={"hidden_states": 1}))
    guard.attach(quiet, None)
    assert guard.KEY not in quiet.pp_hidden_states_proxy_tensors.tensors


def test_the_next_stage_takes_the_rows_out_and_passes_when_it_cut_the_same():
    proxy = NS(tensors={"hidden_states": 1, guard.KEY: [["a", 4096, 2048]]})  # pickled tuples may come as lists
    guard.check(proxy, [("a", 4096, 2048)], pp_rank=1)
    assert proxy.tensors == {"hidden_states": 1}  # nothing downstream meets the entry
    guard.check(NS(tensors={"hidden_states": 1}), None, pp_rank=1)  # a decode batch: nothing sent, nothing cut


@pytest.mark.parametrize("sent,mine,needle", [
    ([("a", 4096, 2048)], [("a", 4096, 1984)],
     "request a: PP2 sent 2048 tokens after a prefix of 4096, PP3 cut 1984 tokens after a prefix of 4096"),
    ([("a", 0, 2048), ("b", 0, 512)], [("a", 0, 2048)], "request b: PP2 sent 512 tokens after a prefix of 0, "
                                                          "PP3 cut no chunk of it"),
    (None, [("c", 0, 64)], "request c: PP2 sent no chunk of it, PP3 cut 64 tokens after a prefix of 0"),
    ([("a", 0, 8), ("b", 0, 8)], [("b", 0, 8), ("a", 0, 8)], "the same chunks in another order"),
    # not the planner: the stages' prefix caches differ
    ([("a", 4096, 2048)], [("a", 2048, 4096)], "hold different cached prefixes for request a: PP2 sent 2048 tokens "
                                                "after a prefix of 4096, PP3 cut 4096 tokens after a prefix of 2048"),
])
def test_a_stage_that_cut_another_chunk_fails_with_one_line_naming_the_request_both_stages_and_sizes(sent, mine,
                                                                                                       needle):
    tensors = {"hidden_states": 1}
    if sent is not None:
        tensors[guard.KEY] = sent
    with pytest.raises(guard.StageMismatch) as exc:
        guard.check(NS(tensors=tensors), mine, pp_rank=3)
    assert needle in str(exc.value) and "\n" not in str(exc.value)
