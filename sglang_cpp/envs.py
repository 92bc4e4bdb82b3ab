"""Typed registry of the SGLANG_CPP_* environment variables.

One place that names every knob, its type, default and meaning, so that a typo or a bad
value fails with a message that names the variable (nano-vllm / sglang.srt.environ style).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    name: str
    parse: Callable[[str], T]
    default: T
    help: str
    choices: tuple = ()
    node_local: bool = False  # may differ between nodes (a path on that node); all others must agree
    old_names: tuple = ()  # earlier spellings, still read for one release

    def lookup(self, environ=None) -> tuple[str, str]:
        """(the name it was set under, its raw value); ('', '') when unset."""
        environ = os.environ if environ is None else environ
        for name in (self.name, *self.old_names):
            if environ.get(name):
                return name, environ[name]
        return "", ""

    def get(self) -> T:
        name, raw = self.lookup()
        if not raw:
            return self.default
        try:
            value = self.parse(raw)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name}={raw!r} is invalid: {exc}. {self.help}") from None
        return self.check(value, name, raw)

    def check(self, value: T, name: str = "", raw=None) -> T:
        """`value` when it is one of the choices (or there are none); else a ValueError naming the
        variable, the value and the choices. One check for a value read here and one a caller was given."""
        if self.choices and value not in self.choices:
            raise ValueError(f"{name or self.name}={value if raw is None else raw!r} is not one of "
                             f"{', '.join(map(str, self.choices))}. {self.help}")
        return value

    def is_set(self) -> bool:
        return bool(self.lookup()[1])


def _bool(raw: str) -> bool:
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected one of 1/0/true/false/yes/no/on/off")


POLICY = EnvVar("SGLANG_CPP_POLICY", str, "plan",
                "Chunk policy: plan (sglang-cpp planner), quadratic (upstream-exact), off (upstream untouched).",
                ("plan", "quadratic", "off"))
PROFILE = EnvVar("SGLANG_CPP_PROFILE", str, "",
                 "Path to a cost-model/profile JSON written by `sglang-cpp tune`; skips startup calibration.")
CACHE_DIR = EnvVar("SGLANG_CPP_CACHE_DIR", str, os.path.expanduser("~/.cache/sglang-cpp"),
                   "Where calibrations (calibration/model=...,pp=...,tp=...,device_name=...,dtype=...,layers=...,"
                   "key=<digest>,maxlen=N.json; the digest covers every setting that changes forward time), the "
                   "served models (served/) and built test models are cached (per node; world rank 0's is used).",
                   node_local=True)
CALIB_MAX_LEN = EnvVar("SGLANG_CPP_CALIB_MAX_LEN", int, 0,
                       "Largest prefix+chunk the startup calibration measures (0: the context length); clamped "
                       "to the request table's context and the smallest stage's KV pool, with an INFO line.")
CALIB_PREFIX = EnvVar("SGLANG_CPP_CALIB_PREFIX", str, "random",
                      "How a calibration sample gets its prefix of L tokens: random (KV slots filled with random "
                      "values, one forward of the chunk per sample) or computed (the prefix run through the model "
                      "first; the equivalence check of results/calibration_grid.md).", ("random", "computed"))
CALIB_BUDGET_S = EnvVar("SGLANG_CPP_CALIB_BUDGET_S", float, 300.0,
                        "Startup calibration time budget in seconds (0: none): it measures the grids of lengths 4x "
                        "apart up to the max (none below 1024) and stops early, with a WARNING, when the next level "
                        "would overrun it; a cut-short calibration is cached under the length it reached.")
CALIB_REPEATS = EnvVar("SGLANG_CPP_CALIB_REPEATS", int, 0,
                       "Timed repeats per calibration point, minimum kept; above 1 every shape is warmed first "
                       "(0: 2 on GPUs, 1 on CPU).")
CHUNK_OVERHEAD_MS = EnvVar("SGLANG_CPP_CHUNK_OVERHEAD_MS", float, 0.0,
                           "Per-chunk overhead (ms) the planner adds to each chunk on top of the measured one "
                           "(SGLANG_CPP_OVERHEAD_PROBE) (the flag --chunk-overhead-ms; old name SGLANG_CPP_P2P_MS).",
                           old_names=("SGLANG_CPP_P2P_MS",))
def _count(raw: str) -> int:
    v = int(raw)
    if v < 0:
        raise ValueError("expected a whole number >= 0")
    return v


OVERHEAD_PROBE = EnvVar("SGLANG_CPP_OVERHEAD_PROBE", _count, 8,
                        "Chunks of the startup pipelined run that measures each stage's per-chunk overhead beyond "
                        "its forward (P2P, batch set-up; the received hidden states timed at two chunk sizes give it "
                        "a term per token), charged on top of the calibration (0: off; then only "
                        "SGLANG_CPP_CHUNK_OVERHEAD_MS is charged). World rank 0 writes the served model to "
                        "SGLANG_CPP_CACHE_DIR/served/: `sglang-cpp plan --profile` on it gives the server's chunks.")
MIN_CHUNK = EnvVar("SGLANG_CPP_MIN_CHUNK", int, 0,
                   "Smallest non-final chunk the planner may use (0: one alignment unit; the cost model and "
                   "the per-chunk overhead decide).")
MAX_CHUNK = EnvVar("SGLANG_CPP_MAX_CHUNK", int, 0,
                   "Largest chunk the planner may use (0: SGLang's prefill-buffer ceiling, max(C, "
                   "--max-prefill-tokens, 1.25 C) with dynamic chunking on PP).")
PLANNER = EnvVar("SGLANG_CPP_PLANNER", str, "equal-time", "Planner: equal-time or dp.", ("equal-time", "dp"))
QUEUE_AWARE = EnvVar("SGLANG_CPP_QUEUE_AWARE", _bool, True,
                     "Plan each prompt with the chunks in flight ahead of it and the prompts waiting behind it "
                     "(core/queue_plan.py), replanning its remaining chunks when the waiting queue changes; 0: "
                     "every prompt planned as if alone in an empty pipeline.")
DECISION_LOG = EnvVar("SGLANG_CPP_DECISION_LOG", str, "",
                      "JSONL file each scheduler appends its chunk decisions and measured forward times to "
                      "({rank}: world rank, {pp_rank}, {tp_rank}): decision, batch, forward (timed over "
                      "ModelRunner.forward alone, on CUDA events on GPUs), decode_forward, host_hit, kv_send, "
                      "refit, plan_kept / plan_moved, plan (each plan made: a prompt's first, then one per replan), "
                      "queue_plan, arrival (each prompt's relayed stamp) and the PD ring's events; written on a "
                      "thread of "
                      "its own, never on the scheduler's.", node_local=True)
ASYNC_RECV = EnvVar("SGLANG_CPP_ASYNC_RECV", _bool, False,
                    "Post all PP proxy irecvs of a message at once and wait only before the forward. Gains only "
                    "where a receive blocks the CPU (gloo); on NCCL the receives are already asynchronous, and "
                    "with TP > 1 the send-allgather proxies are never deferred: keep it off on GPUs.")
BATCH_POLICY = EnvVar("SGLANG_CPP_BATCH_POLICY", str, "sglang",
                      "Prefill budget per PP micro-batch under mixed load: sglang (SGLang's own), gllm (gLLM Token "
                      "Throttling, tokens), time (ours: the same predicted ms per micro-batch, chunks sized by "
                      "t(L, x)); gllm and time need --enable-mixed-chunk.", ("sglang", "gllm", "time"))
EVEN_DECODES = EnvVar("SGLANG_CPP_EVEN_DECODES", _bool, False,
                      "With SGLANG_CPP_BATCH_POLICY=gllm or time: gLLM's even decode split (eq. 4) as admission, "
                      "each PP micro-batch slot admits new requests only up to its even share of the running and "
                      "waiting ones. Off by default: no gain shown on the CPU mixed-load benchmark "
                      "(results/serving_real-even-decodes.md).")

ONLINE = EnvVar("SGLANG_CPP_ONLINE", _bool, True,
                "Refine each stage's cost model from its logged prefill forwards while serving (world rank 0 fits "
                "on a background thread and keeps a refit only if it predicts held-back forwards better; every "
                "rank switches at the same point of the request stream; a prompt length seen before keeps its "
                "chunks unless the refined model predicts the new plan faster by more than its held-back error, "
                "core/hysteresis.py; 0: the startup model throughout).")
CALIB_DEADLINE_S = EnvVar("SGLANG_CPP_CALIB_DEADLINE_S", float, 600.0,
                          "Seconds a rank may go without progress (a forward that ends, a gather every rank reached) "
                          "in the startup calibration and overhead probe before it ends the server with the reason "
                          "(a rank that failed inside a forward leaves its peers in a collective with no timeout); "
                          "0: no deadline.")
TRANSFER_TIMEOUT_S = EnvVar("SGLANG_CPP_TRANSFER_TIMEOUT_S", float, 60.0,
                            "Seconds the overhead probe waits for one hidden-state send or receive to complete on the "
                            "device before it names the transfer and fails (a peer that failed after this rank queued "
                            "its side leaves the stream waiting forever); every rank then fails at the next gather. "
                            "0: wait without a bound (the startup deadline still applies).")
CALIB_FAULT_RANK = EnvVar("SGLANG_CPP_CALIB_FAULT_RANK", int, -1,
                          "Fault injection for tests: the startup calibration raises on this PP rank (-1: never).")
CALIB_FAULT_TP_RANK = EnvVar("SGLANG_CPP_CALIB_FAULT_TP_RANK", int, -1,
                             "Fault injection for tests: with SGLANG_CPP_CALIB_FAULT_RANK, only this TP rank of the "
                             "stage fails (-1: every TP rank of it).")
CALIB_FAULT_IN = EnvVar("SGLANG_CPP_CALIB_FAULT_IN", str, "level",
                        "Fault injection for tests: where the fault is raised, level (before the level's forwards, "
                        "sent to every rank at the level's gather) or forward (inside the model's forward, before "
                        "the stage's last layer, while the TP peers are in its collectives).", ("level", "forward"))
CUT_FAULT_RANK = EnvVar("SGLANG_CPP_CUT_FAULT_RANK", int, -1,
                        "Fault injection for tests: this PP rank cuts every planned chunk that is longer than one "
                        "alignment unit one unit short, so the run-time guard (plugin/serving/guard.py) sees a stage "
                        "cut another chunk than the stage before it (-1: never).")
FAST_EXTEND = EnvVar("SGLANG_CPP_FAST_EXTEND", _bool, True,
                     "torch_native backend: attend only a chunk's new queries over its cached prefix (0: upstream's "
                     "redundant (L+x)^2 query).")
PD_FAST_RING = EnvVar("SGLANG_CPP_PD_FAST_RING", _bool, False,
                      "PD prefill with PP > 1: free a request whose KV transfer is done on every stage at one loop "
                      "index on every stage, decided by PP0 from SGLang's consensus store, instead of after the "
                      "two-pass release ring (P-1 iterations later; plugin/pd/ring.py). Off under the staging "
                      "buffer or attention CP > 1.")

PD_EARLY_KV = EnvVar("SGLANG_CPP_PD_EARLY_KV", _bool, False,
                     "PD prefill with PP > 1: hand the last chunk's KV to the transfer engine at the pass after its "
                     "forward, as upstream does for a middle chunk, keeping one page and the first-token metadata "
                     "for the final send at result time (plugin/pd/kv.py). Off under the staging buffer, overlap "
                     "scheduling or attention CP > 1.")

ALL = (POLICY, PROFILE, CACHE_DIR, CALIB_MAX_LEN, CALIB_PREFIX, CALIB_BUDGET_S, CALIB_REPEATS, CHUNK_OVERHEAD_MS, OVERHEAD_PROBE, MIN_CHUNK, MAX_CHUNK, PLANNER, QUEUE_AWARE,
       DECISION_LOG, ASYNC_RECV, FAST_EXTEND, BATCH_POLICY, EVEN_DECODES, ONLINE, CALIB_DEADLINE_S,
       TRANSFER_TIMEOUT_S, CALIB_FAULT_RANK, CALIB_FAULT_TP_RANK, CALIB_FAULT_IN, CUT_FAULT_RANK, PD_FAST_RING, PD_EARLY_KV)


# read by the plugin, but SGLang's own: listed beside ours in docs/env.md
UPSTREAM = (("SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR", "0.75",
             "Upstream's sigma, validated in [0, 1] at startup (used by the quadratic policy)."),)


def markdown_table() -> str:
    """docs/env.md's table, from this registry (tests/inproc/test_sizer.py keeps the file equal to it)."""
    def default(v: EnvVar) -> str:
        d = v.default
        if isinstance(d, bool):
            return "`1`" if d else "`0`"
        if d == "" or d is None:
            return "unset"
        if isinstance(d, str) and d.startswith(os.path.expanduser("~")):
            return "`~" + d[len(os.path.expanduser("~")):] + "`"
        return f"`{d}`"

    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for v in ALL:
        name = " / ".join(f"`{n}`" for n in (v.name, *v.old_names))
        help_ = v.help + (f" Choices: {', '.join(map(str, v.choices))}." if v.choices else "")
        rows.append(f"| {name} | {default(v)} | {help_.replace('|', '/')} |")
    rows += [f"| `{n}` | `{d}` | {h} |" for n, d, h in UPSTREAM]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # python -m sglang_cpp.envs > the table of docs/env.md
    print(markdown_table(), end="")
