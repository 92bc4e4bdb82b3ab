"""Issue 54 item 3: the arrival stamps that carry the offered load to every PP stage (plugin/serving/arrivals.py)
with SGLang 0.5.23's own request types and relay split, in process. The server test is
tests/server/test_server_e2e.py::test_a_poisson_stream_is_planned_with_one_load_estimate_on_both_stages."""
from __future__ import annotations

import pickle
import subprocess
import sys
from types import SimpleNamespace


def _req(rid: str, n: int):
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput

    return TokenizedGenerateReqInput(rid=rid, input_text="", input_ids=list(range(n)), input_embeds=None,
                                     mm_inputs=None, token_type_ids=None, sampling_params=None,
                                     return_logprob=False, logprob_start_len=-1, top_logprobs_num=0,
                                     token_ids_logprob=None, stream=False)


def test_each_run_of_pulled_prompts_gets_a_stamp_right_after_it_naming_each_prompts_length():
    """A stamp follows each run of items that brought prompts, so whatever SGLang holds back from a point of
    the list (a pause defers the rest) holds back the stamp with its prompts; health checks are no prompts."""
    from sglang.srt.managers.io_struct import AbortReq, BatchTokenizedGenerateReqInput, PauseGenerationReqInput

    from sglang_cpp.plugin.serving import arrivals

    a, abort, hc = _req("a", 7), AbortReq(rid="x"), _req("HEALTH_CHECK_1", 1)
    bt, pause, c = BatchTokenizedGenerateReqInput(batch=[_req("b", 3), _req("c", 5)]), PauseGenerationReqInput(), \
        _req("d", 11)
    pulled = [a, abort, hc, bt, pause, c]
    arrivals.stamp(pulled)
    kinds = [type(r).__name__ for r in pulled]
    assert kinds == ["TokenizedGenerateReqInput", "ArrivalStamp", "AbortReq", "TokenizedGenerateReqInput",
                     "BatchTokenizedGenerateReqInput", "ArrivalStamp", "PauseGenerationReqInput",
                     "TokenizedGenerateReqInput", "ArrivalStamp"]
    s1, s2, s3 = (r for r in pulled if type(r).__name__ == "ArrivalStamp")
    assert (s1.lens, s2.lens, s3.lens) == ((7,), (3, 5), (11,)) and s1.t_ms == s2.t_ms == s3.t_ms > 0
    assert isinstance(s1, BatchTokenizedGenerateReqInput) and list(s1) == []  # an empty batch for SGLang
    quiet = [AbortReq(rid="y"), _req("HEALTH_CHECK_2", 1)]
    arrivals.stamp(quiet)
    assert len(quiet) == 2  # no prompt came: no stamp


def test_a_stamp_unpickles_in_a_fresh_process_as_a_work_request_of_sglangs_relay_split():
    """A later stage or another TP rank unpickles the stamp before anything built its class there (the
    module's lazy __getattr__), and SGLang's DP-attention split keeps it with the work requests (broadcast
    within the puller's own attention group), not with world rank 0's control requests."""
    from sglang_cpp.plugin.serving import arrivals

    blob = pickle.dumps([arrivals.ArrivalStamp(batch=[], t_ms=12.5, lens=(100, 200))])
    code = ("import pickle, sys\n"
            "from sglang.srt.managers.scheduler_components.request_receiver import SchedulerRequestReceiver\n"
            "reqs = pickle.loads(sys.stdin.buffer.read())\n"
            "work, control = SchedulerRequestReceiver._split_work_and_control_reqs(None, reqs)\n"
            "print(type(reqs[0]).__module__, type(reqs[0]).__name__, reqs[0].t_ms, list(reqs[0].lens),"
            " len(work), len(control))\n")
    out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, timeout=300, check=True)
    assert out.stdout.decode().split() == ["sglang_cpp.plugin.serving.arrivals", "ArrivalStamp", "12.5",
                                           "[100,", "200]", "1", "0"]


class _Log:
    path = "x"

    def __init__(self):
        self.events = []

    def write(self, event, **rec):
        self.events.append((event, rec))


def test_every_rank_takes_the_stamps_out_and_feeds_its_clock_with_what_was_ahead_of_each_prompt():
    from sglang_cpp.core.load import ArrivalClock, Load
    from sglang_cpp.plugin.serving import arrivals

    S = arrivals.ArrivalStamp
    a, b = _req("a", 10), _req("b", 30)
    idle = SimpleNamespace(waiting_queue=[], chunked_req=None, mbs=[], running_mbs=[], running_batch=None)
    clock, log = ArrivalClock(), _Log()
    got = arrivals.take(idle, [a, S(batch=[], t_ms=1000.0, lens=(10, 30)), b], clock, 2, log)
    assert got == [a, b]  # what SGLang processes: the prompts, in their order
    # the first found the pipe empty, the second found the first waiting
    assert clock.recent == [(1000.0, 10, False), (1000.0, 30, True)]
    assert [r for _, r in log.events] == [{"t_ms": 1000.0, "prompt_len": 10, "busy": False},
                                          {"t_ms": 1000.0, "prompt_len": 30, "busy": True}]
    # a prompt waiting, or one being chunked, is prefill work ahead of the next arrival
    for sched in (SimpleNamespace(waiting_queue=[a], chunked_req=None, mbs=[], running_mbs=[], running_batch=None),
                  SimpleNamespace(waiting_queue=[], chunked_req=a, mbs=[], running_mbs=[], running_batch=None)):
        c = ArrivalClock()
        arrivals.take(sched, [S(batch=[], t_ms=5.0, lens=(4,))], c, 2)
        assert c.recent == [(5.0, 4, True)]
    # PD prefill: a prompt still bootstrapping (prefill.py:203); without PP, the prefill batch that just ran
    ext = SimpleNamespace(is_extend_without_speculative=lambda: True)
    ran = SimpleNamespace(reqs=[SimpleNamespace(rid="r", origin_input_ids=[0] * 900)], prefix_lens=[0], extend_lens=[512],
                          forward_mode=ext)
    for sched, pp, want in ((SimpleNamespace(waiting_queue=[], chunked_req=None,
                                             disagg_prefill_bootstrap_queue=SimpleNamespace(queue=[a])), 2, True),
                            (SimpleNamespace(waiting_queue=[], chunked_req=None, last_batch=ran), 1, True),
                            (SimpleNamespace(waiting_queue=[], chunked_req=None, last_batch=None), 1, False)):
        assert arrivals.prefill_ahead(sched, pp) is want
    clock.issue(250.0)
    assert clock.load() == Load(n=2, span_ms=250.0, mean_len=20, busy=1)
    # a rank that plans no load still hides the stamp from SGLang; a list without one is passed as it is
    assert arrivals.take(idle, [S(batch=[], t_ms=1.0, lens=(1,)), a], None, 2) == [a]
    plain = [a, b]
    assert arrivals.take(idle, plain, clock, 2) is plain


def test_a_scheduler_state_the_estimate_cannot_read_counts_as_nothing_ahead_with_one_warning(caplog):
    """The load estimate never stops a scheduler: a state it cannot read (here a prefill batch without a
    forward mode's predicates) is nothing ahead, named once; every rank reads the same state alike."""
    from sglang_cpp.plugin.serving import arrivals

    odd = SimpleNamespace(waiting_queue=[], chunked_req=None,
                          last_batch=SimpleNamespace(reqs=[1], forward_mode=object()))
    with caplog.at_level("WARNING", logger="sglang_cpp"):
        assert arrivals.prefill_ahead(odd, 1) is False
        assert arrivals.prefill_ahead(odd, 1) is False
    assert len([r for r in caplog.records if "load estimate" in r.getMessage()]) == 1
