"""CPU-only compatibility hooks for SGLang 0.5.23 PD disaggregation (Mooncake over TCP) and HiCache.

Every hook is a no-op when CUDA is available: it changes behaviour only on a torch build/host without
CUDA, where the code paths it bypasses cannot run at all. See docs/compatibility.md for the evidence.

Targets (registered with the other hooks, from `sglang_cpp/plugin/targets.py` TARGETS):

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

* ``sglang.srt.mem_cache.pool_host.mha.MHATokenToKVPoolHost.__init__`` (AFTER): binds the pure-torch
  kvcacheio ops (kvcacheio_cpu.py) into ``pool_host/mha.py``, which imports them only on CUDA/HIP
  (:60-73) or XPU (:75); on CPU the first backup died with ``NameError: transfer_kv_all_layer_lf_pf``.
  Only names the module lacks are bound, so a CUDA/XPU build keeps its kernels. It also sets the pool's
  ``pin_memory = False``: the L3 prefetch's ``get_dummy_flat_data_page`` (pool_host/mha.py:727) asks
  for pinned pages and failed with "pin_memory=True requires a CUDA or other accelerator backend".

* ``sglang.srt.mem_cache.pool_host.mha.MHATokenToKVPoolHost.backup_from_device_all_layer`` (AROUND):
  the all-layer kernels of the `kernel` io backend read device *pointer tables*; on CPU the
  layer_first and page_first backups run the torch ops on the pool's own tensor lists instead.

* ``sglang.srt.mem_cache.l2_transfer.L2TransferEngine.__init__`` (AFTER): ``torch.cpu.Stream`` has no
  ``synchronize``, which the transfer's error path calls (l2_transfer.py:123) and so masked the real
  error. CPU copies are synchronous, so the engine's streams get a no-op ``synchronize``/``query``.
"""
from __future__ import annotations

import functools


def cpu_server() -> bool:
    """The server runs with --device cpu. Not `torch.cuda.is_available()`: NPU, XPU and MUSA hosts have no
    CUDA either, and must keep SGLang's own paths. Before SGLang has published its
    server args (a helper process, a unit test), a host without CUDA or another accelerator counts as CPU."""
    try:
        from sglang.srt.runtime_context import get_server_args

        device = getattr(get_server_args(), "device", None)
    except (AttributeError, ValueError, ImportError):
        device = None
    if device:
        return str(device).startswith("cpu")
    return _no_accelerator()


@functools.cache
def _no_accelerator() -> bool:
    import torch

    acc = getattr(torch, "accelerator", None)
    return not (acc.is_available() if acc is not None else torch.cuda.is_available())


def MooncakeKVSender_init_cpu(result, self, *args, **kwargs):
    """AFTER MooncakeKVSender.__init__: on a CPU server, use SGLang's host (numpy) index path."""
    if cpu_server():
        self.supports_host_tensor_indices = False
    return None


def alloc_with_host_register_cpu(original_fn, *args, **kwargs):
    """AROUND alloc_with_host_register: on a CPU server, never pin/cudaHostRegister."""
    if cpu_server():
        if "pin_memory" in kwargs:
            kwargs["pin_memory"] = False
        elif len(args) >= 4:  # (dims, dtype, device, pin_memory, allocator, ...)
            args = args[:3] + (False,) + args[4:]
    return original_fn(*args, **kwargs)


def MHATokenToKVPoolHost_init_cpu(result, self, *args, **kwargs):
    """AFTER MHATokenToKVPoolHost.__init__: on a CPU server, give pool_host/mha.py the torch ops it
    would have imported from sgl_kernel.kvcacheio (only those it lacks), and mark the pool unpinned: its
    buffers are plain host memory already (alloc_with_host_register_cpu), and the L3 prefetch's
    get_dummy_flat_data_page would otherwise ask torch for pinned pages ("pin_memory=True requires a
    CUDA or other accelerator backend")."""
    if cpu_server():
        import sys

        from . import kvcacheio_cpu

        mod = sys.modules["sglang.srt.mem_cache.pool_host.mha"]  # the module whose methods call the ops
        for name in kvcacheio_cpu.OPS:
            if name not in vars(mod):
                setattr(mod, name, getattr(kvcacheio_cpu, name))
        self.pin_memory = False
    return None


def MHATokenToKVPoolHost_backup_from_device_all_layer(original_fn, self, device_pool, host_indices, device_indices,
                                                      io_backend, *args, **kwargs):
    """AROUND backup_from_device_all_layer: on a CPU server the `kernel` backend's all-layer copies
    of the layer_first and page_first layouts use tensor lists, not device pointer tables."""
    if not cpu_server() or io_backend != "kernel" or self.layout not in ("layer_first", "page_first"):
        return original_fn(self, device_pool, host_indices, device_indices, io_backend, *args, **kwargs)
    from . import kvcacheio_cpu as io

    if self.layout == "layer_first":
        io.transfer_kv_all_layer(self.device_k_buffers, self.k_data_refs, self.device_v_buffers, self.v_data_refs,
                                 device_indices, host_indices)
    else:
        io.transfer_kv_all_layer_lf_pf(self.device_k_buffers, self.k_buffer, self.device_v_buffers, self.v_buffer,
                                       device_indices, host_indices)
    return None


class _SyncStream:
    """A CPU stream: work runs when issued, so waiting on it has nothing to wait for."""

    def __init__(self, base):
        self._base = base

    def __getattr__(self, name):
        return getattr(self._base, name)

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


def L2TransferEngine_init_cpu(result, self, *args, **kwargs):
    """AFTER L2TransferEngine.__init__: on a CPU server, streams with a no-op synchronize."""
    if cpu_server():
        for name in ("device_to_host_stream", "host_to_device_stream"):
            stream = getattr(self, name, None)
            if stream is not None and not hasattr(stream, "synchronize"):
                setattr(self, name, _SyncStream(stream))
    return None


def TorchNativeAttnBackend_init_cpu(result, self, *args, **kwargs):
    """AFTER ``TorchNativeAttnBackend.__init__``, CPU only: DP attention pads a batch to its DP peers' size
    (``ForwardBatch._pad_inputs_to_size``, forward_batch_info.py:2014) and asks the attention backend on CPU
    for ``get_cpu_graph_seq_len_fill_value``, which only the intel_amx backend defines (1), so torch_native
    died with AttributeError at the first DP forward. The instance gets the same value."""
    if cpu_server() and not hasattr(self, "get_cpu_graph_seq_len_fill_value"):
        self.get_cpu_graph_seq_len_fill_value = lambda: 1
