"""`sglang-cpp bench serve`: a mixed-load stream against a running server, driven by SGLang's own
`python -m sglang.benchmark.serving` (what users run: its Poisson arrivals, its metrics, its output
file). Our part is only what it cannot do: a length mixture (short chats with a few long documents;
its `random` datasets draw one uniform range), written as its `custom` dataset, and the summary of
several runs side by side.

Prompts are random common words, one token each, so a prompt's length is what the mixture drew
(within a few tokens) and no two prompts share a prefix (no radix hit that one policy would get and
another not). Outputs run to their drawn length (bench_serving's ignore_eos default).
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..whatif.workload import LengthMix


@dataclass(frozen=True)
class ServeBenchConfig:
    """One workload; each field is a `bench serve` flag."""

    num_requests: int = 64
    request_rate: float = 0.5  # requests per second (Poisson)
    input_lens: str = "0.9:200-600,0.1:2k-8k"
    output_lens: str = "32-128"
    seed: int = 0
    context_length: int = 0  # a drawn input is cut to fit it with its output (0: the model's config)

    def __post_init__(self):
        if self.num_requests < 1:
            raise ValueError(f"--num-requests={self.num_requests} must be >= 1")
        if not self.request_rate > 0:
            raise ValueError(f"--request-rate={self.request_rate} must be > 0 (inf: all at once)")
        LengthMix.parse(self.input_lens, "--input-len")
        LengthMix.parse(self.output_lens, "--output-len")


def word_ids(tokenizer) -> list[int]:
    """Token ids of plain lowercase words with their leading space: a run of them re-tokenizes to itself."""
    out = []
    for tok, i in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
        if tok.startswith("\u0120") and tok[1:].isalpha() and tok[1:].islower() and 3 <= len(tok) - 1 <= 8:
            out.append(i)
    if len(out) < 1000:
        raise ValueError("the tokenizer has fewer than 1000 plain word tokens; use a BPE tokenizer (GPT-2 style)")
    return out


def write_dataset(cfg: ServeBenchConfig, tokenizer, path: str | Path) -> list[tuple[int, int]]:
    """bench_serving's custom JSONL: one conversation per request, the user turn `input_len` words, the
    assistant turn `output_len` words (its output length). Returns the (input, output) lengths. An input
    is cut so that input + output + CONTEXT_MARGIN fits --context-length: SGLang answers a longer one
    with an HTTP error that bench_serving counts as completed, with all its input tokens in the
    throughput and no output (an 8,162-token prompt did so in an earlier run)."""
    rng = np.random.default_rng(cfg.seed)
    ins = LengthMix.parse(cfg.input_lens, "--input-len").sample(rng, cfg.num_requests)
    outs = LengthMix.parse(cfg.output_lens, "--output-len").sample(rng, cfg.num_requests)
    if cfg.context_length:
        if cfg.context_length <= outs.max() + CONTEXT_MARGIN:
            raise ValueError(f"--context-length {cfg.context_length} leaves no room for outputs of up to "
                             f"{outs.max()} tokens; raise it or shorten --output-lens")
        ins = np.minimum(ins, cfg.context_length - outs - CONTEXT_MARGIN)
    words = np.array(word_ids(tokenizer))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for n, m in zip(ins.tolist(), outs.tolist()):
            prompt = tokenizer.decode(rng.choice(words, size=n).tolist())
            answer = tokenizer.decode(rng.choice(words, size=m).tolist())
            fh.write(json.dumps({"conversations": [{"content": prompt}, {"content": answer}]}) + "\n")
    return list(zip(ins.tolist(), outs.tolist()))


CONTEXT_MARGIN = 16  # tokens a prompt's words may re-tokenize to beyond the drawn count, plus BOS


def model_context_length(model_path: str) -> int:
    from transformers import AutoConfig

    return int(getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", 0) or 0)


def bench_serving_command(cfg: ServeBenchConfig, base_url: str, model_path: str, dataset: str,
                          output_file: str) -> list[str]:
    """The `python -m sglang.benchmark.serving` call (printed in every results file)."""
    return [sys.executable, "-m", "sglang.benchmark.serving", "--backend", "sglang", "--base-url", base_url,
            "--model", model_path, "--tokenizer", model_path, "--dataset-name", "custom", "--dataset-path",
            dataset, "--num-prompts", str(cfg.num_requests), "--request-rate", str(cfg.request_rate), "--seed",
            str(cfg.seed), "--output-file", output_file, "--output-details", "--disable-tqdm"]


def run_bench_serving(cfg: ServeBenchConfig, base_url: str, model_path: str, out_dir: str | Path,
                      label: str) -> dict:
    """Write the dataset, run bench_serving once, return its result record (the last line it appends)."""
    from transformers import AutoTokenizer

    out_dir = Path(out_dir)
    dataset = out_dir / "workload.jsonl"
    if not cfg.context_length:
        from dataclasses import replace

        cfg = replace(cfg, context_length=model_context_length(model_path))
    write_dataset(cfg, AutoTokenizer.from_pretrained(model_path), dataset)
    out = out_dir / f"bench_serving-{label}.jsonl"
    out.unlink(missing_ok=True)
    cmd = bench_serving_command(cfg, base_url, model_path, str(dataset), str(out))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode or not out.exists():
        raise RuntimeError(f"sglang.benchmark.serving failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    rec = json.loads(out.read_text().strip().splitlines()[-1])
    rec["label"], rec["command"] = label, " ".join(cmd)
    check_answered(rec, out)
    return rec


def check_answered(rec: dict, where) -> None:
    """Every request got output: bench_serving counts a request the server refused as completed."""
    empty = [i for i, n in enumerate(rec.get("output_lens") or []) if not n]
    if empty:
        i = empty[0]
        raise RuntimeError(f"{where}: {len(empty)} request(s) got no output (the first: #{i}, "
                           f"{rec['input_lens'][i]} input tokens; error {rec['errors'][i]!r}); the server refused "
                           "them (see its log), so their input tokens would count in the throughput unserved")


COLUMNS = (("throughput (tok/s)", "total_throughput", 1.0), ("output tok/s", "output_throughput", 1.0),
           ("TTFT mean (ms)", "mean_ttft_ms", 1.0), ("TTFT p99 (ms)", "p99_ttft_ms", 1.0),
           ("TPOT mean (ms)", "mean_tpot_ms", 1.0), ("TPOT p99 (ms)", "p99_tpot_ms", 1.0),
           ("ITL p99 (ms)", "p99_itl_ms", 1.0), ("E2E mean (s)", "mean_e2e_latency_ms", 1e-3))


def summary_table(records: list[dict], base: str | None = None) -> str:
    """One row per run; throughput relative to the `base` run's (the first by default)."""
    ref = next((r for r in records if r["label"] == base), records[0]) if records else None
    head = "| run | completed | " + " | ".join(c for c, _, _ in COLUMNS) + f" | vs {ref['label'] if ref else '-'} |"
    lines = [head, "|---|---:|" + "---:|" * (len(COLUMNS) + 1)]
    for r in records:
        vals = " | ".join(f"{r[k] * s:.1f}" for _, k, s in COLUMNS)
        lines.append(f"| {r['label']} | {r['completed']} | {vals} | {r['total_throughput'] / ref['total_throughput']:.3f} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class SLO:
    """A latency target a request meets or not: TTFT <= ttft_s and TPOT <= tpot_ms (`--slos 30:500`)."""

    ttft_s: float
    tpot_ms: float

    @classmethod
    def parse_list(cls, text: str) -> list["SLO"]:
        out = []
        for item in filter(None, (t.strip() for t in text.split(","))):
            try:
                ttft, tpot = (float(v) for v in item.split(":"))
            except ValueError:
                raise ValueError(f"--slos {text!r}: write each SLO as TTFT_S:TPOT_MS, e.g. 30:500,60:1000") from None
            if not (ttft > 0 and tpot > 0):
                raise ValueError(f"--slos {text!r}: {item!r} needs a TTFT and a TPOT above 0")
            out.append(cls(ttft, tpot))
        return out

    def __str__(self) -> str:
        return f"TTFT <= {self.ttft_s:g} s and TPOT <= {self.tpot_ms:g} ms"


def goodput(rec: dict, slo: SLO) -> tuple[int, int]:
    """(requests that met `slo`, requests sent) in one bench_serving --output-details record. A request's
    TPOT is its time after the first token over its output tokens after the first (bench_serving's own
    definition); a request that failed or got no output meets no SLO. Throttles trade throughput for
    latency, so their claim is judged here rather than in tok/s."""
    errs = rec.get("errors") or []
    met = 0
    for i, (ttft, itl, n) in enumerate(zip(rec["ttfts"], rec["itls"], rec["output_lens"])):
        if not n or (i < len(errs) and errs[i]):
            continue
        tpot_ms = 1e3 * sum(itl) / (n - 1) if n > 1 else 0.0
        met += ttft <= slo.ttft_s and tpot_ms <= slo.tpot_ms
    return met, len(rec["ttfts"])


def same_outputs(a: dict, b: dict) -> tuple[int, int]:
    """(requests whose generated text is equal, requests compared) between two --output-details runs,
    matched by prompt length and position (bench_serving shuffles with its seed, the same in both)."""
    ga, gb = a.get("generated_texts") or [], b.get("generated_texts") or []
    n = min(len(ga), len(gb))
    return sum(x == y for x, y in zip(ga[:n], gb[:n])), n


def plot_runs(records: list[dict], path: str | Path) -> Path:
    """Throughput, TTFT and TPOT per run side by side (bars, measured)."""
    from ..files import pyplot, save_figure

    fig, axes = pyplot().subplots(1, 3, figsize=(10, 3.2))
    labels = [r["label"] for r in records]
    for ax, (title, key, scale) in zip(axes, (("throughput (tok/s)", "total_throughput", 1.0),
                                              ("TTFT mean (s)", "mean_ttft_ms", 1e-3),
                                              ("TPOT p99 (ms)", "p99_tpot_ms", 1.0))):
        ax.bar(labels, [r[key] * scale for r in records], color=["0.6", "tab:orange", "tab:blue"][:len(records)])
        ax.set_title(title)
    fig.suptitle("mixed load on the CPU PP=2 server (measured)")
    return save_figure(fig, path)


__all__ = ["SLO", "ServeBenchConfig", "check_answered", "goodput", "model_context_length", "plot_runs", "write_dataset", "bench_serving_command", "run_bench_serving", "summary_table",
           "same_outputs", "word_ids"]
