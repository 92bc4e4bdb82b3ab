"""Argument parsing shared by every subcommand: lengths with k/m suffixes (binary: 128k = 131072,
1m = 1048576) and comma-separated lists of them. One copy, so every length flag reads alike."""
from __future__ import annotations

import argparse
import math

_SUFFIX = {"k": 1024, "m": 1024 * 1024}


class ArgError(ValueError, argparse.ArgumentTypeError):
    """A ValueError for callers, an ArgumentTypeError for argparse (which then prints our message)."""


def parse_len(text) -> int:
    """Token count with an optional k/m suffix: '131072', '128k', '1m', '1.5k'."""
    if isinstance(text, int):
        return text
    s = str(text).strip().lower().replace("_", "")
    mult = _SUFFIX.get(s[-1:], 1)
    num = s[:-1] if mult > 1 else s
    try:
        v = float(num) * mult
    except ValueError:
        raise ArgError(f"length {text!r}: expected an integer, optionally with k or m (e.g. 128k, 1m)") from None
    if not math.isfinite(v) or v < 0 or v != int(v):
        raise ArgError(f"length {text!r} must be a whole number of tokens >= 0")
    return int(v)


def parse_chunk(text) -> int:
    """--chunked-prefill-size: a token count >= 1 (SGLang's -1, no chunking, and 0 plan nothing here)."""
    if str(text).strip() in ("-1", "0"):
        raise ArgError(f"{text!r}: give a chunk size >= 1 (SGLang's -1 turns chunking off, which leaves nothing "
                       "to plan)")
    v = parse_len(text)
    if v < 1:
        raise ArgError(f"{text!r}: give a chunk size >= 1")
    return v


def _number(text, conv, ok, want: str):
    """`text` as conv() gives it, when ok(value): else one ArgError saying what the flag wants."""
    try:
        v = conv(str(text).strip())
    except ValueError:
        raise ArgError(f"{text!r}: expected {want}") from None
    if not ok(v):
        raise ArgError(f"{text!r}: give {want}")
    return v


def positive_int(text) -> int:
    """A count >= 1 (--page-size, --tp-size, --pp-size)."""
    return _number(text, int, lambda v: v >= 1, "an integer >= 1")


def parse_prompt_len(text) -> int:
    """--input-len of one prompt: a token count >= 1 with an optional k/m suffix."""
    return _number(text, parse_len, lambda v: v >= 1, "a prompt length >= 1 (e.g. 8k, 128k)")


def parse_fraction(text) -> float:
    """--efficiency: a fraction of peak in (0, 1]."""
    return _number(text, float, lambda v: 0 < v <= 1, "a fraction of peak in (0, 1], e.g. 0.5")


def parse_sigma(text) -> float:
    """--sigma: upstream's smoothing factor in [0, 1] (SGLang's SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR)."""
    return _number(text, float, lambda v: 0 <= v <= 1, "a number in [0, 1], e.g. 0.75")


GEMM_DTYPES = {"auto": None, "bfloat16": "bf16", "float16": "bf16", "half": "bf16", "fp8": "fp8"}


def parse_dtype(text) -> str:
    """--dtype in SGLang's words: auto (the checkpoint's), bfloat16, float16 / half, or fp8 (`--quantization
    fp8`'s GEMMs). The old spelling bf16 is read as bfloat16 with one deprecation line."""
    t = str(text).strip().lower()
    if t == "bf16":
        import sys

        print("sglang-cpp: --dtype bf16 is deprecated; use bfloat16 (SGLang's name)", file=sys.stderr)
        return "bfloat16"
    if t not in GEMM_DTYPES:
        raise ArgError(f"{text!r}: give one of {', '.join(GEMM_DTYPES)} (SGLang's --dtype; fp8: --quantization fp8's "
                       "GEMMs)")
    return t


def parse_gemm_dtype(text):
    """--dtype of an analytic model (parse_dtype's words) as the analytic model's GEMM rate: bf16 (16-bit GEMMs,
    one rate), fp8, or None (the checkpoint's)."""
    return GEMM_DTYPES[parse_dtype(text)]


def parse_ints(text: str) -> tuple:
    """'256,512,1k' -> (256, 512, 1024)."""
    out = tuple(parse_len(t) for t in str(text).split(",") if t.strip())
    if not out:
        raise ArgError(f"{text!r}: give comma-separated sizes, e.g. 256,512,1k")
    return out


def parse_lens(text: str) -> tuple:
    """Comma-separated prompt lengths >= 1: '8k,16k'."""
    lens = parse_ints(text)
    if min(lens) < 1:
        raise ArgError(f"{text!r}: give comma-separated lengths >= 1, e.g. 8k,16k")
    return lens


class ModelSource(argparse.Action):
    """--analytic / --model-path (a preset, or the user's HF folder or config.json): keeps the spelling the user
    typed in `model_flag`, so an error names it."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, "model_flag", option_string or "--analytic")


def add_model_source(add, **kw) -> None:
    """`--analytic` / `--model-path` through `add` (a parser's or group's add_argument): one flag, one help,
    in every analytic command."""
    add("--analytic", "--model-path", action=ModelSource, metavar="MODEL", help="a model preset (e.g. "
        "qwen3-235b-a22b) or your own model: a local HF model folder or its config.json, read offline", **kw)


def _call_noting_old(self, parser, namespace, values, option_string=None):
    """The action's own __call__, after one stderr line when the user typed an old spelling."""
    if option_string in self._old_spellings:
        import sys

        print(f"{parser.prog}: {option_string} is deprecated; use {self._new_spelling}", file=sys.stderr)
    return type(self).__mro__[1].__call__(self, parser, namespace, values, option_string)


def alias(parser, new: str, *old: str) -> None:
    """Old spellings of flag `new` (SGLang's name where it has one), accepted for one release, hidden from
    --help: they parse into the same action (so a required flag given by its old name counts), which says in one
    stderr line that the spelling is deprecated and names the new one."""
    action = parser._option_string_actions[new]
    if not hasattr(action, "_old_spellings"):
        base = type(action)
        action.__class__ = type(base.__name__, (base,), {"__call__": _call_noting_old})
        action._old_spellings, action._new_spelling = set(), new
    action._old_spellings.update(old)
    for o in old:
        parser._option_string_actions[o] = action


def parse_floats(text: str) -> tuple:
    """'0.6,0.85' -> (0.6, 0.85)."""
    try:
        out = tuple(float(t) for t in str(text).split(",") if t.strip())
    except ValueError:
        out = ()
    if not out:
        raise ArgError(f"{text!r}: give comma-separated numbers, e.g. 0.6,0.85")
    return out


def progress_bar(desc: str, unit: str, disable: bool = False):
    """A wrapper that shows a tqdm bar on stderr over an iterable (the long commands' progress; --disable-tqdm,
    bench_serving's flag, turns it off), or None when disabled."""
    if disable:
        return None
    import sys

    from tqdm import tqdm

    return lambda items: tqdm(items, desc=desc, unit=unit, file=sys.stderr, leave=False)


# SGLang 0.5.23's --attention-backend choices (arg_groups/choices.py:69-99, ATTENTION_BACKEND_CHOICES; kept equal to it
# by tests/inproc/test_gpu_deployment_guards.py, which may import SGLang: the CLI does not)
ATTENTION_BACKENDS = ("triton", "torch_native", "flex_attention", "dsa", "nsa", "qsa", "dsv4", "compressed", "fa3", "fa4",
                      "flashinfer", "llada2_cfg_flashinfer", "flashmla", "trtllm_mla", "cutedsl_mla", "tokenspeed_mla",
                      "trtllm_mha", "hpc_ops", "minicpm_flashattn", "minicpm_flashinfer", "aiter", "wave", "intel_amx",
                      "ascend", "intel_xpu")


def parse_attention_backend(text: str) -> str:
    """One of SGLang's --attention-backend choices."""
    if text not in ATTENTION_BACKENDS:
        raise ArgError(f"{text!r} is not one of SGLang's attention backends: "
                                         f"{', '.join(ATTENTION_BACKENDS)}")
    return text

