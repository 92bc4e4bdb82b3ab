"""Where the commands that price chunks (`plan`, `simulate`, `simulate-serve`, `bench ttft`) get their stage
costs: one frozen dataclass, one `add_cost_source_args`, the defaults in the dataclass. A profile (measured,
or what a `tune` command wrote), coefficients, or the analytic model of a preset or the user's own
config.json on a GPU preset. A profile is checked against every flag the user gave for it (PP and TP size,
dtype): a profile measured elsewhere is wrong, not approximately right."""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, fields

from ..args import (GEMM_DTYPES, add_model_source, alias, parse_attention_backend, parse_dtype, parse_fraction,
                    positive_int)


@dataclass(frozen=True)
class CostSource:
    profile: str | None = None  # --profile (bench ttft: --simulate)
    coeffs: str | None = None  # --coeffs: upstream's A,B,C or the 2-D model's c0,g,b,d,e,f
    analytic: str | None = None  # --model-path / --analytic: a preset or the user's model, read offline
    model_flag: str = "--model-path"  # the spelling the user typed, for errors
    gpu: str | None = None  # --gpu: the GPU preset of the analytic model
    tp_size: int | None = None  # --tp-size; None: not given (1 for the analytic model, unchecked on a profile)
    dtype: str = "auto"  # --dtype in SGLang's words; auto: the checkpoint's (unchecked on a profile)
    efficiency: float | None = None  # --efficiency: fraction of peak (analytic; default the preset's)
    attention_backend: str | None = None  # --attention-backend: MLA's switches in L (analytic)
    layers_per_stage: str | None = None  # --layers-per-stage: N or N0,N1,... (analytic; default an even split)
    chunk_overhead_ms: float | None = None  # --chunk-overhead-ms; None: the GPU preset's (analytic), else 0

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CostSource:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})

    @property
    def kind(self) -> str | None:
        """'profile', 'analytic' or 'coeffs' (a profile wins, then the model: `bench ttft` takes --coeffs beside
        them as upstream's fit), or None when nothing was given."""
        return "profile" if self.profile else "analytic" if self.analytic else "coeffs" if self.coeffs else None

    def describe(self) -> str:
        if self.kind == "analytic":
            return f"analytic {self.analytic} on {self.gpu}, {self.efficiency_note()}"
        return {"profile": f"profile {self.profile}", "coeffs": f"coeffs {self.coeffs}"}.get(self.kind, "no cost source")

    def efficiency_used(self) -> tuple[float, str]:
        """(the analytic model's GEMM efficiency, where it came from): --efficiency (e.g. what `tune analytic`
        fitted), else the --gpu preset's default, the same in every command."""
        from ..whatif.analytic import device_of

        if self.efficiency is not None:
            return float(self.efficiency), "--efficiency"
        return float(device_of(self.gpu).efficiency), f"the {self.gpu} preset's default"

    def efficiency_note(self) -> str:
        e, where = self.efficiency_used()
        return (f"efficiency {e:g} of peak ({where}" + ("; `tune analytic` fits it on measured TTFTs)"
                                                         if where != "--efficiency" else ")"))

    def stage_costs(self, pp_size: int, overhead: bool = True) -> list:
        """One model per stage, each with its per-chunk overhead (for code that prices stages one by one);
        overhead=False: without `overhead_ms` (a command with no --chunk-overhead-ms; a profile's own stays)."""
        from ..core.costmodel import ChunkOverhead, PipelineCost
        from ..whatif.simulator import _stage_costs

        models, over = _stage_costs(self.cost(pp_size) if overhead else self._cost(pp_size), pp_size)
        return [m if o == ChunkOverhead() else PipelineCost((m,), (o,)) for m, o in zip(models, over)]

    def cost(self, pp_size: int):
        """The source's model, carrying the per-chunk overhead (`overhead_ms`, on top of any a served profile
        carries): one model that serves every stage (a one-stage profile, coefficients) or one per stage
        (per-stage profiles, the analytic stages)."""
        from ..core.costmodel import add_overhead

        return add_overhead(self._cost(pp_size), self.overhead_ms(), pp_size)

    def hidden_size(self) -> int:
        """The model's hidden size (the analytic model's), 0 when the source does not say."""
        if self.kind != "analytic":
            return 0
        from ..whatif.analytic import model_of

        return model_of(self.analytic, self.model_flag).hidden_size

    def _cost(self, pp_size: int):
        """The source's model as given, without `overhead_ms`."""
        from ..core.costmodel import PipelineCost
        from ..core.profile_io import load_cost, parse_coeffs

        if self.kind == "profile":
            return load_cost(self.profile, pp_size=pp_size, tp_size=self.tp_size,
                             dtype=None if self.dtype == "auto" else self.dtype, runs="the command line gives")
        if self.kind == "coeffs":
            return parse_coeffs(self.coeffs)
        if self.kind is None:
            raise ValueError("give a cost model: --profile JSON, --coeffs c0,g,b,d,e,f or --model-path (a preset or "
                             "your config.json)")
        return PipelineCost(tuple(self._analytic_stages(pp_size)))  # one per stage (a stage: its roofline rows' maximum)

    def measured_len(self) -> int | None:
        """The furthest prompt position a profile's samples measured (max L + x); None when the source has no
        samples (coefficients, the analytic model, a fitted profile), so nothing to be outside of."""
        if self.kind != "profile":
            return None
        from ..core.profile_io import load_profile

        samples = load_profile(self.profile)["samples"]
        return int(max(s["L"] + s["x"] for s in samples)) if samples else None

    def check_lengths(self, lens, flag: str = "--input-len") -> None:
        """Prompt lengths against the source: past a model config's context length (as SGLang derives it) is
        refused naming both, as SGLang refuses such a server, unless SGLang's own SGLANG_ALLOW_OVERWRITE_LONGER_
        CONTEXT_LEN is set (then one WARNING); past a profile's measured prompt positions, one WARNING (every
        policy is priced there by extrapolation). A preset is a shape, not a checkpoint: unchecked."""
        import os
        import sys

        n = max(int(v) for v in lens)
        if self.kind == "analytic":
            from ..whatif.analytic import MODELS, model_of

            ctx = 0 if self.analytic in MODELS else model_of(self.analytic, self.model_flag).max_context
            if ctx and n > ctx:
                said = (f"{flag} {n} is past the context length of {self.model_flag} {self.analytic} ({ctx} tokens, "
                        "from its config.json as SGLang derives it)")
                if os.environ.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "").lower() not in ("1", "true", "yes"):
                    raise ValueError(f"{said}; SGLang refuses to serve it: give at most {ctx}, or set "
                                     "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 as SGLang asks")
                print(f"WARNING: {said}; priced anyway (SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN)", file=sys.stderr,
                      flush=True)
        hi = self.measured_len()
        if hi is not None and n > hi:
            print(f"WARNING: {flag} {n} is past the profile's measured range (prompt positions up to {hi}, "
                  f"{self.profile}): every policy is priced beyond it by extrapolation; measure a longer profile",
                  file=sys.stderr, flush=True)

    def overhead_ms(self) -> float:
        """--chunk-overhead-ms, or its default: the GPU preset's fixed per-chunk cost for an analytic model (a
        profile measured it already, coefficients carry none: 0)."""
        given = self.chunk_overhead_ms
        if given is not None:
            if not (given >= 0 and math.isfinite(given)):
                raise ValueError(f"--chunk-overhead-ms={given} must be a finite number >= 0")
            return given
        if self.kind == "analytic":
            from ..whatif.analytic import device_of

            return device_of(self.gpu).chunk_overhead_ms
        return 0.0

    def _analytic_stages(self, P: int) -> list:
        from dataclasses import replace

        from ..whatif.analytic import check_tp, device_of, model_of
        from ..whatif.analytic_fit import stage_models

        model = model_of(self.analytic, self.model_flag)
        tp = self.tp_size or 1
        check_tp(model, tp)
        dev = device_of(self.gpu)
        if self.efficiency is not None:
            dev = replace(dev, efficiency=self.efficiency)
        lps = self.layers_per_stage
        try:
            parts = None if lps is None else ([int(v) for v in str(lps).split(",")] if "," in str(lps) else [int(lps)] * P)
        except ValueError:
            parts = [0]
        if parts is not None and (len(parts) != P or any(n < 1 for n in parts)):
            raise ValueError(f"--layers-per-stage {lps!r}: give one count >= 1, or {P} comma-separated counts")
        if parts is not None and sum(parts) != model.num_layers:
            raise ValueError(f"--layers-per-stage {lps!r} places {sum(parts)} layers over {P} stages, but "
                             f"{model.name} has {model.num_layers}: give {P} counts that sum to {model.num_layers} "
                             "(or leave it out for an even split)")
        models = stage_models(model, dev, tp, P, parts, dtype=GEMM_DTYPES[self.dtype],
                              attention_backend=self.attention_backend)
        return models


def add_cost_source_args(p, *, profile_flag: str = "--profile", required: bool = False, exclusive: bool = True,
                         overhead: bool = True) -> None:
    """The cost source's flags on `p` (a parser or a group), defaults from CostSource. `profile_flag`: the
    profile's spelling (`bench ttft`: --simulate); `exclusive`: one of profile / coefficients / model (`bench
    ttft` reads --coeffs beside a profile as upstream's fit); `overhead`: the command prices a per-chunk cost."""
    d = CostSource()
    src = p.add_mutually_exclusive_group(required=required) if exclusive else p
    src.add_argument(profile_flag, dest="profile", default=d.profile, metavar="PROFILE",
                     help="profile / cost-model JSON (`sglang-cpp profile`, a calibration, `tune chunk`, `tune "
                          "analytic`), checked against --pp-size and, when given, --tp-size and --dtype")
    src.add_argument("--coeffs", default=d.coeffs, help="A,B,C (upstream f(l)=A l^2+B l+C) or c0,g,b,d,e,f (2-D model)")
    add_model_source(src.add_argument, default=d.analytic)
    a = p.add_argument
    a("--gpu", default=d.gpu, help="GPU preset, required with --model-path (H100, H200, H20, B200, MI300X, ...; "
                                    "any case)")
    a("--tp-size", type=positive_int, default=d.tp_size,
      help="tensor parallel size (the analytic model's, default 1; a profile's is checked)")
    a("--dtype", type=parse_dtype, default=d.dtype, metavar="DTYPE",
      help="SGLang's --dtype: auto (the checkpoint's, the default), bfloat16, float16, fp8 (--quantization fp8's "
           "GEMMs); the analytic model's GEMM rate, a profile's is checked")
    a("--efficiency", type=parse_fraction, default=d.efficiency,
      help="fraction of peak reached (--model-path; e.g. what `tune analytic` fitted; default the preset's)")
    a("--attention-backend", default=d.attention_backend, type=parse_attention_backend, metavar="BACKEND",
      help="SGLang's prefill attention backend (--model-path): an MLA model's stages are then piecewise in L "
           "where SGLang switches method on it (e.g. fa3: 8192); default: no switch")
    a("--layers-per-stage", default=d.layers_per_stage, help="N or N0,N1,... (--model-path; default an even split)")
    if overhead:
        a("--chunk-overhead-ms", type=float, default=d.chunk_overhead_ms,
          help="fixed cost per chunk and stage: launch, scheduling, P2P setup (SGLANG_CPP_CHUNK_OVERHEAD_MS; "
               "default: the --gpu preset's with --model-path, else 0)")
    p.set_defaults(model_flag=d.model_flag, **({} if overhead else {"chunk_overhead_ms": None}))  # a group: its parser's


def alias_cost_source(parser: argparse.ArgumentParser, overhead: bool = True) -> None:
    """The old spellings of the cost source's flags (one deprecation line each)."""
    alias(parser, "--gpu", "--device")
    alias(parser, "--tp-size", "--tp")
    if overhead:
        alias(parser, "--chunk-overhead-ms", "--cpu-overhead-ms", "--overhead-ms")


__all__ = ["CostSource", "add_cost_source_args", "alias_cost_source"]
