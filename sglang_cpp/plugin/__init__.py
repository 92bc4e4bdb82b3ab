"""sglang-cpp's SGLang plugin (entry point group `sglang.srt.plugins`).

SGLang calls `register()` in every process before it builds a Scheduler. The hooks are AROUND/AFTER
hooks on the SGLang symbols in TARGETS; with SGLANG_CPP_POLICY=off they only observe (the two P2P hooks pass
through unless SGLANG_CPP_ASYNC_RECV=1).
"""
from __future__ import annotations

from .targets import INTERNALS, STEP_PATH, TARGETS, unapplied  # noqa: F401 (the plugin's surface)


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from . import hooks
    from .serving.steps import timed

    for target, (fn, kind) in TARGETS.items():
        hook = getattr(hooks, fn)
        HookRegistry.register(target, timed(hook, kind) if fn in STEP_PATH else hook, getattr(HookType, kind))
