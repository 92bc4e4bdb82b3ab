"""Which server settings key the calibration cache: SGLang's own grouping of its arguments, not a hand list.

SGLang 0.5.23 declares every ServerArgs field in one namespace (`arg_groups/fields`, `ServerArgs._NS_BY_FIELD`).
A namespace whose fields shape the forward (kernels, MoE, graphs, communication, parallel layout, model,
speculative decoding) keys the cache whole, less the named fields that cannot change a forward's time
(ports, paths, timeouts, loaders). The other namespaces (scheduling, memory, serving, logging, ...) key
nothing but their named exceptions. A field SGLang adds to a keyed namespace keys the cache at once (at
worst a needless recalibration); a namespace SGLang adds fails tests/inproc/test_gpu_deployment_guards.py until it is
placed here. The old hand list missed EP size, the all-to-all backend, DeepEP's mode,
DP attention, attention CP, the prefill backend, two-batch overlap, prefill graphs, nnodes and more.
"""
from __future__ import annotations

import json
import os

KEYED = {  # namespace -> fields in it that do NOT change a forward's time
    "model": ("model_path", "load_format", "model_loader_extra_config", "trust_remote_code", "context_length",
              "revision", "download_dir", "model_checksum", "delete_ckpt_after_loading", "decrypted_config_file",
              "decrypted_draft_config_file", "checkpoint_engine_wait_weights_before_ready", "startup_weight_load_mode",
              "custom_weight_loader", "weight_loader_disable_mmap", "weight_loader_prefetch_checkpoints",
              "weight_loader_prefetch_num_threads", "weight_loader_drop_cache_after_load", "weight_cache_mode",
              "weight_cache_socket", "weight_cache_timeout", "modelopt_checkpoint_restore_path",
              "modelopt_checkpoint_save_path", "modelopt_export_path", "modelexpress_config", "engine_info_bootstrap_port",
              "remote_instance_weight_loader_seed_instance_ip",
              "remote_instance_weight_loader_seed_instance_service_port",
              "remote_instance_weight_loader_send_weights_group_ports", "remote_instance_weight_loader_backend",
              "remote_instance_weight_loader_start_seed_via_transfer_engine"),
    "parallel": ("nccl_port", "dist_timeout", "dist_init_addr", "gated_launch_port", "node_rank", "enable_p2p_check",
                 "ep_join_rank_offset", "load_balance_method"),
    "spec": ("spec_trace_dir", "speculative_dspark_sps_table_path", "speculative_dspark_confidence_sts_path",
             "speculative_ngram_external_corpus_path"),
    "exec.features": ("watermark_key", "watermark_key_b", "disable_outlines_disk_cache"),
    "exec.kernel": ("grammar_backend",),
    "exec.mamba": (),
    "exec.graph": ("enable_profile_cuda_graph", "debug_cuda_graph", "enable_torch_compile_debug_mode"),
    "exec.comm": ("enable_layerwise_nvtx_marker", "pre_warm_nccl"),
    "exec.moe": ("expert_distribution_recorder_buffer_size", "expert_balancedness_report_mode", "mooncake_ib_device",
                 "elastic_ep_scale_timeout", "kt_weight_path"),
    "exec.overlap": (),
    "exec.offload": ("ple_offload_dir",),
    "exec.dllm": (),
    "exec.deterministic": (),
}
UNKEYED = {  # namespace -> fields in it that DO change a forward's time
    "device": ("device",),
    "schedule": ("page_size", "disable_chunked_prefix_cache"),
    "memory": ("enable_page_major_kv_layout",),
    "disagg": ("disaggregation_mode", "encoder_only", "language_only", "language_model_only"),
    "lora": (), "mm": (), "serving": (), "observability": (),
}
ENV = ("SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD", "SGLANG_MAX_KV_CHUNK_CAPACITY", "SGLANG_FLASHINFER_PREFILL_SPLIT_TILE_SIZE")
LIBRARIES = ("flashinfer-python", "sgl-kernel", "deep-gemm", "deep-ep", "triton")


def keyed_fields(ns_by_field: dict) -> list[str]:
    """The ServerArgs fields that key the cache, given SGLang's field -> namespace map; ValueError naming a
    namespace this module does not place (an SGLang upgrade), so nothing is silently left out."""
    unknown = sorted({ns for ns in ns_by_field.values() if ns not in KEYED and ns not in UNKEYED})
    if unknown:
        raise ValueError(f"sglang-cpp: SGLang's server-argument namespaces {unknown} are not placed in "
                         "plugin/startup/cache_key.py (KEYED or UNKEYED): place them, so that the calibration cache key "
                         "stays complete")
    return sorted(f for f, ns in ns_by_field.items()
                  if (ns in KEYED and f not in KEYED[ns]) or (ns in UNKEYED and f in UNKEYED[ns]))


def timing_args(server_args, ns_by_field: dict | None = None) -> dict:
    """{field: its value as JSON} for every keyed field, plus the timing environment and library versions."""
    if ns_by_field is None:
        ns_by_field = type(server_args)._NS_BY_FIELD
    out = {f: json.dumps(getattr(server_args, f, None), default=str, sort_keys=True) for f in keyed_fields(ns_by_field)}
    out.update({f"env:{k}": os.environ.get(k, "") for k in ENV})
    out.update({f"lib:{k}": _version(k) for k in LIBRARIES})
    return out


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


__all__ = ["ENV", "KEYED", "LIBRARIES", "UNKEYED", "keyed_fields", "timing_args"]
