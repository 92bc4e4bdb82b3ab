"""A chunk plan is a value (like a torch.distributed.pipelining schedule): print it as an ASCII
per-stage timeline, dump it to JSON and load it back, and look up the next chunk in O(1)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property


def makespan_equal(t, pp_size: int) -> float:
    """sum(t) + (P-1) * max(t): the exact makespan of chunks taking t ms on each of P equal stages (a proportionate
    permutation flow shop). The one home of the formula; stages that differ: objective.makespan."""
    return float(sum(t) + (pp_size - 1) * max(t))


@dataclass(frozen=True)
class ChunkPlan:
    prompt_len: int
    prefix_len: int
    chunks: tuple
    pred_ms: tuple = ()
    pp_size: int = 1
    policy: str = "plan"
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "chunks", tuple(int(c) for c in self.chunks))
        object.__setattr__(self, "pred_ms", tuple(float(t) for t in self.pred_ms))
        if any(c < 1 for c in self.chunks):
            raise ValueError(f"chunk plan has a chunk < 1 token: {self.chunks}")
        if self.prefix_len + sum(self.chunks) != self.prompt_len:
            raise ValueError(f"chunk plan covers {self.prefix_len}+{sum(self.chunks)} tokens, "
                             f"not the prompt's {self.prompt_len}")
        if self.pred_ms and len(self.pred_ms) != len(self.chunks):
            raise ValueError("chunk plan: pred_ms must have one entry per chunk")

    # -- lookups ------------------------------------------------------------------------------
    @cached_property
    def starts(self) -> tuple:
        out, L = [], self.prefix_len
        for c in self.chunks:
            out.append(L)
            L += c
        return tuple(out)

    @cached_property
    def _by_start(self) -> dict:
        return {s: c for s, c in zip(self.starts, self.chunks)}

    def next_chunk(self, history_len: int) -> int | None:
        """O(1): the planned chunk starting at `history_len`, or None if it is not a boundary."""
        return self._by_start.get(history_len)

    def index_of(self, history_len: int) -> int | None:
        try:
            return self.starts.index(history_len)
        except ValueError:
            return None

    @property
    def ttft_ms(self) -> float:
        """Predicted TTFT: the makespan of its chunk times (`makespan_equal`; each a chunk's whole cost on a
        stage, its per-chunk overhead included)."""
        if not self.pred_ms:
            return float("nan")
        return makespan_equal(self.pred_ms, self.pp_size)

    # -- serialisation --------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": "sglang-cpp-plan", "prompt_len": self.prompt_len, "prefix_len": self.prefix_len,
                "chunks": list(self.chunks), "pred_ms": list(self.pred_ms),
                "pp_size": self.pp_size, "policy": self.policy,
                "ttft_ms": None if not self.pred_ms else round(self.ttft_ms, 4), "meta": dict(self.meta)}

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), allow_nan=False, **kw)  # a plan's times are finite (strict JSON)

    @classmethod
    def from_dict(cls, d: dict) -> "ChunkPlan":
        if d.get("format", "sglang-cpp-plan") != "sglang-cpp-plan":
            raise ValueError(f"not a chunk plan: format={d.get('format')!r}")
        try:  # a plan written with a separate per-chunk overhead ("overhead_ms") reads with it in each chunk's time
            o = float(d.get("overhead_ms", 0.0))
            return cls(prompt_len=int(d["prompt_len"]), prefix_len=int(d["prefix_len"]),
                       chunks=tuple(d["chunks"]), pred_ms=tuple(float(t) + o for t in d.get("pred_ms", ())),
                       pp_size=int(d.get("pp_size", 1)), policy=str(d.get("policy", "plan")),
                       meta=dict(d.get("meta", {})))
        except KeyError as exc:
            raise ValueError(f"chunk plan JSON lacks {exc}") from None

    @classmethod
    def from_json(cls, text: str) -> "ChunkPlan":
        return cls.from_dict(json.loads(text))

    # -- display ----------------------------------------------------------------------------
    def timeline(self, width: int = 72) -> str:
        """ASCII per-stage timeline of the proportionate flow shop this plan predicts."""
        P, K = self.pp_size, len(self.chunks)
        t = list(self.pred_ms or [float(c) for c in self.chunks])
        finish = [[0.0] * K for _ in range(P)]
        for s in range(P):
            for k in range(K):
                start = max(finish[s][k - 1] if k else 0.0, finish[s - 1][k] if s else 0.0)
                finish[s][k] = start + t[k]
        end = finish[-1][-1] or 1.0
        scale = width / end
        glyphs = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"  # a unique glyph per chunk up to 62
        label = lambda k: glyphs[k] if k < len(glyphs) else f"#{k}"  # noqa: E731  past 62: its index, still unique
        lines = [f"plan [{self.policy}] prompt={self.prompt_len} prefix={self.prefix_len} "
                 f"chunks={K} pp={P} predicted TTFT={self.ttft_ms:.1f} ms"]
        for s in range(P):
            row = [" "] * width
            for k in range(K):
                a = int((finish[s][k] - t[k]) * scale)
                b = max(a + 1, int(finish[s][k] * scale))
                for i in range(a, min(b, width)):
                    row[i] = glyphs[k] if k < len(glyphs) else "+"
            lines.append(f"stage {s:>2} |{''.join(row)}|")
        lines.append("chunk  " + " ".join(f"{label(k)}:{c}@{L}" for k, (c, L) in enumerate(zip(self.chunks, self.starts))))
        if K > len(glyphs):
            lines.append(f"(chunks #{len(glyphs)} on show as + in the bars)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.timeline()
