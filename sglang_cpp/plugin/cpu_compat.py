"""CPU-only compatibility hooks for SGLang 0.5.23 PD disaggregation (Mooncake over TCP) and HiCache.

Every hook is a no-op when CUDA is available: it changes behaviour only on a torch build/host without
CUDA, where the code paths it bypasses cannot run at all. See docs/compatibility.md for the evidence.

Targets (registered with the other hooks, from `sglang_cpp/plugin/__init__.py` TARGETS):

* ``sglang.srt.disaggregation.mooncake.conn.MooncakeKVSender.__init__`` (AFTER):
  ``MooncakeKVSender.supports_host_tensor_indices = True`` makes ``_send_kv_chunk``
  (sglang/srt/disaggregation/prefill.py:1746-1761) copy the page indices into a *pinned* host
  tensor and record a ``torch.cuda.Event`` so the D2H copy overlaps scheduling. On CPU the
  ``torch.empty(..., pin_memory=True)`` raises "pin_memory=True requires a CUDA or other
  accelerator backend" and the prefill scheduler dies on the first KV send. The indices already
  live on the host there, and no stream exists to order against, so the shim sets the *instance*
  attribute to False: SGLang then takes its own generic branch (``kv_to_page_indices`` -> numpy,
  no event), the same one every non-Mooncake backend uses.

* ``sglang.srt.mem_cache.pool_host.common.alloc_with_host_register`` (AROUND):
  HiCache host pools (and the PD decode side's default ``--disaggregation-decode-retraction-backup``
  host pool) allocate with ``pin_memory=True`` and then ``cudaHostRegister`` the buffer
  (pool_host/common.py:349 -> :147 ``torch.cuda.cudart()``), which raises "Torch not compiled with
  CUDA enabled". Page-locking host memory only matters for DMA by a GPU; with no GPU the shim
  allocates the same buffer unpinned.
"""
from __future__ import annotations

import functools


@functools.cache
def cuda_absent() -> bool:
    import torch

    return not torch.cuda.is_available()


def MooncakeKVSender_init_cpu(result, self, *args, **kwargs):
    """AFTER MooncakeKVSender.__init__: on a CUDA-less host, use SGLang's host (numpy) index path."""
    if cuda_absent():
        self.supports_host_tensor_indices = False
    return None


def alloc_with_host_register_cpu(original_fn, *args, **kwargs):
    """AROUND alloc_with_host_register: on a CUDA-less host, never pin/cudaHostRegister."""
    if cuda_absent():
        if "pin_memory" in kwargs:
            kwargs["pin_memory"] = False
        elif len(args) >= 4:  # (dims, dtype, device, pin_memory, allocator, ...)
            args = args[:3] + (False,) + args[4:]
    return original_fn(*args, **kwargs)
