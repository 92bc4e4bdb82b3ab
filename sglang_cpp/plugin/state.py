"""The plugin's per-process state: set once by the startup hook (startup/install.py), read by every other hook. One
scheduler per process, so module attributes are the whole store (tests set them with monkeypatch)."""
from __future__ import annotations

from .timing import LazyTimes

ACTIVE = None  # sizer.CppChunkSizer: the plan policy's sizer in place of upstream's
LOG = None  # decision_log.DecisionLog: the decision log (also only what the client is told)
BATCH = None  # batch.BatchPolicy: SGLANG_CPP_BATCH_POLICY other than sglang
ONLINE = None  # online.Online: SGLANG_CPP_ONLINE with the plan policy
PP_RANK = 0  # this process's PP stage
FORMING = None  # the Scheduler forming a prefill batch (set around _get_new_batch_prefill_raw)
PENDING = LazyTimes()  # timed forwards whose device events have not completed yet
