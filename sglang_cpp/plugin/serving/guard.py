"""The run-time guard: every stage after the first checks, before its forward, that it cuts the chunks the
stage before it cut (issue 56 item 2).

Why: every stage plans each chunk itself; the planner's arithmetic is the same to the bit on every node by
construction (core/detmath.py, no BLAS), but if a stage ever cut another chunk, it would run the previous
stage's hidden states of x tokens as a batch of x' tokens: a shape error deep in the forward, or garbage.

How: the stage that forwards a prefill batch adds its rows, (request id, prefix, new tokens) per prompt row,
to the proxy dict it sends on (`attach`, a non-tensor entry: SGLang's `send_tensor_dict` pickles it with the
metadata, as it does `__msg_type__`, parallel_state.py `_split_tensor_dict`). The next stage takes it out
before its own forward and compares it with its batch (`check`); a difference fails that stage with one line
naming the request, both stages and both sizes (or, where the prefixes differ, saying the stages' caches
diverged, which no plan does). A batch that is no prefill (decode, a speculative verify) sends no rows; a
stage whose batch has prefill rows where the previous stage sent none fails the same way. Only with the
plugin's sizer installed (SGLANG_CPP_POLICY plan or quadratic): with the policy off the plugin observes only.
Limit: SGLang answers the exception by killing the failing node's process tree; on a multi-node server the
other nodes' ranks wait in their collectives until SGLang's scheduler watchdog ends them (300 s by default)
or a peer's closed socket does.
"""
from __future__ import annotations

KEY = "__sglang_cpp_rows__"


class StageMismatch(RuntimeError):
    """Two PP stages cut different chunks for one micro-batch."""


def rows_of(batch) -> list | None:
    """(rid, prefix, new prompt tokens) of each prompt row of a prefill batch; None for any other batch (decode,
    a speculative verify, idle). The same filter as the queue view's chunks in flight (admission.prefill_rows)."""
    mode = getattr(batch, "forward_mode", None)
    if batch is None or not getattr(batch, "reqs", None) or mode is None or not mode.is_extend_without_speculative():
        return None
    prefix, ext = getattr(batch, "prefix_lens", None), getattr(batch, "extend_lens", None)
    if not isinstance(prefix, list) or not isinstance(ext, list):
        return None
    return [(str(r.rid), int(p), int(x)) for r, p, x in zip(batch.reqs, prefix, ext)
            if int(x) > 0 and int(p) < len(r.origin_input_ids)]


def attach(result, rows: list | None) -> None:
    """The forwarding stage: its batch's rows ride in the proxy dict it sends to the next stage (a new dict: a
    graph backend may hand out one cached output dict on every replay, which must not keep the entry)."""
    proxy = getattr(result, "pp_hidden_states_proxy_tensors", None)
    tensors = getattr(proxy, "tensors", None)
    if rows is not None and isinstance(tensors, dict):
        proxy.tensors = {**tensors, KEY: rows}


def check(proxy, rows: list | None, pp_rank: int) -> None:
    """The receiving stage, before its forward: the rows the previous stage sent (taken out of `proxy`, so that
    nothing downstream meets a non-tensor it does not know) against its own batch's `rows`."""
    tensors = getattr(proxy, "tensors", None)
    sent = tensors.pop(KEY, None) if isinstance(tensors, dict) else None
    if sent is None and not rows:
        return
    sent = [tuple(r) for r in (sent or [])]
    mine = list(rows or [])
    if sent == mine:
        return
    theirs = {r[0]: r for r in sent}
    ours = {r[0]: r for r in mine}
    for rid in list(dict.fromkeys([r[0] for r in mine] + [r[0] for r in sent])):
        a, b = theirs.get(rid), ours.get(rid)
        if a == b:
            continue
        if a is not None and b is not None and a[1] != b[1]:  # not the planner: the stages' caches differ
            fail(f"[sglang-cpp] PP stages hold different cached prefixes for request {rid}: PP{pp_rank - 1} sent "
                 f"{_desc(a)}, PP{pp_rank} cut {_desc(b)}; their prefix caches or retractions diverged")
        fail(f"[sglang-cpp] PP stages cut different chunks for request {rid}: PP{pp_rank - 1} sent {_desc(a)}, "
             f"PP{pp_rank} cut {_desc(b)}; every stage must plan alike (see the startup agreement check and the "
             "decision logs of both stages)")
    fail(f"[sglang-cpp] PP stages cut the same chunks in another order: PP{pp_rank - 1} sent {sent}, "
         f"PP{pp_rank} cut {mine}")


def fail(msg: str) -> None:
    """Log the line and get the decision log onto disk before raising: SGLang answers a scheduler exception by
    killing the process tree (scheduler.py's SIGQUIT to its parent), racing the log's writer thread."""
    import logging

    from .. import state
    from ..decision_log import _WRITER

    logging.getLogger("sglang_cpp").error(msg)
    log = state.LOG
    if log is not None and log.path:
        log.write("stage_mismatch", message=msg)
        log.flush()
        _WRITER.drain(2.0)
    raise StageMismatch(msg)


def _desc(row) -> str:
    return "no chunk of it" if row is None else f"{row[2]} tokens after a prefix of {row[1]}"


__all__ = ["KEY", "StageMismatch", "attach", "check", "fail", "rows_of"]
