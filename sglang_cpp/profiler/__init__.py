"""`sglang-cpp profile`: measure the chunk time t(L, x) (hf in-process or a live SGLang server).

Heavy imports (torch, transformers, requests) stay inside the backends so importing the grid is cheap.
"""
from __future__ import annotations

from .grid import ProfileConfig, default_chunks, make_grid

__all__ = ["ProfileConfig", "make_grid", "default_chunks"]
