"""sglang-cpp: cost-model-driven chunk planning for SGLang chunked pipeline parallelism.

The core (cost model, planner, partitioner, simulator) is pure numpy/scipy and imports
without torch or sglang. Everything that touches SGLang internals lives in sglang_cpp.plugin.
"""
from __future__ import annotations

__version__ = "0.1.0"
