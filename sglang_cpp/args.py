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


def positive_int(text) -> int:
    """A count >= 1 (--page-size, --tp-size, --pp-size)."""
    try:
        v = int(str(text).strip())
    except ValueError:
        raise ArgError(f"{text!r}: expected an integer >= 1") from None
    if v < 1:
        raise ArgError(f"{text!r}: must be an integer >= 1")
    return v


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


def alias(parser, new: str, *old: str) -> None:
    """Old spellings of flag `new` (SGLang's name where it has one), accepted for one release and hidden
    from --help: they parse into the same action."""
    action = parser._option_string_actions[new]
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
