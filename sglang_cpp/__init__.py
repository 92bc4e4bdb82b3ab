"""sglang-cpp: cost-model-driven chunk planning for SGLang chunked pipeline parallelism.

Five wings, each importing only the wings below it (docs/architecture.md): core (cost model, planners,
partitioner, policies; pure numpy/scipy, no torch or sglang), whatif (simulators, analytic model), bench
(clients, launcher, runner), plugin (everything that touches SGLang internals; imports core only) and
cli. The modules at this level (envs, args, files, machine) are the support all of them share.
"""
from __future__ import annotations

__version__ = "0.1.0"
