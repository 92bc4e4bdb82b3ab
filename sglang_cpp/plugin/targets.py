"""The whole SGLang surface of the plugin: the symbols it hooks (TARGETS), the ones it calls (INTERNALS),
the hooks on the scheduler's per-step path (STEP_PATH), and the startup check that SGLang applied them all."""
from __future__ import annotations

SCHED = "sglang.srt.managers.scheduler.Scheduler"
MHA_HOST = "sglang.srt.mem_cache.pool_host.mha.MHATokenToKVPoolHost"
TARGETS = {
    f"{SCHED}.maybe_init_dynamic_chunk_sizer": ("Scheduler_maybe_init_dynamic_chunk_sizer", "AROUND"),
    "sglang.srt.managers.schedule_policy.PrefillAdder.__init__": ("PrefillAdder_init", "AFTER"),
    "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req": ("PrefillAdder_add_one_req", "AROUND"),
    # SGLANG_CPP_BATCH_POLICY: each micro-batch's prefill budget (plugin/serving/batch.py)
    f"{SCHED}._get_new_batch_prefill_raw": ("Scheduler__get_new_batch_prefill_raw", "AROUND"),
    "sglang.srt.managers.schedule_policy.PrefillAdder.add_chunked_req": ("PrefillAdder_add_chunked_req", "AROUND"),
    # ... and its even decode split, as admission per micro-batch slot
    f"{SCHED}.get_next_batch_to_run": ("Scheduler_get_next_batch_to_run", "AROUND"),
    f"{SCHED}.get_num_allocatable_reqs": ("Scheduler_get_num_allocatable_reqs", "AROUND"),
    # an idle pass of any event loop (PD loops included): the decision log's buffered lines go to its writer
    f"{SCHED}.on_idle": ("Scheduler_on_idle", "AFTER"),
    f"{SCHED}.run_batch": ("Scheduler_run_batch", "AROUND"),
    # the timed window of a served forward, the one calibration times (plugin/timing.py: ForwardWindow)
    "sglang.srt.model_executor.model_runner.ModelRunner.forward": ("ModelRunner_forward", "AROUND"),
    # an EPLB rebalance step inside a served forward's timed window marks it: kept out of online refits
    "sglang.srt.eplb.eplb_manager.EPLBManager.rebalance": ("EPLBManager_rebalance", "AROUND"),
    # SGLANG_CPP_ONLINE: samples to world rank 0, and its refined model through the request stream (online.py)
    "sglang.srt.managers.scheduler_components.request_receiver.SchedulerRequestReceiver._pull_raw_reqs":
        ("SchedulerRequestReceiver__pull_raw_reqs", "AROUND"),
    f"{SCHED}.process_input_requests": ("Scheduler_process_input_requests", "AROUND"),
    # a bad SGLANG_PP_LAYER_PARTITION named with its fix, at model build
    "sglang.srt.distributed.get_pp_indices": ("get_pp_indices", "AROUND"),
    "sglang.srt.managers.scheduler_components.dynamic_chunk_sizer.DynamicChunkSizer.profile_and_fit":
        ("DynamicChunkSizer_profile_and_fit", "AFTER"),
    # SGLANG_CPP_ASYNC_RECV: batched PP receives; proxy waits deferred to the forward (plugin/serving/p2p.py)
    "sglang.srt.distributed.parallel_state.GroupCoordinator.recv_tensor_dict":
        ("GroupCoordinator_recv_tensor_dict", "AROUND"),
    f"{SCHED}._pp_launch_batch": ("Scheduler__pp_launch_batch", "AROUND"),
    # the waits on a peer in SGLang's PP loop, so a serving step's overhead excludes them (plugin/serving/steps.py)
    f"{SCHED}._pp_recv_typed_dict": ("Scheduler__pp_recv_typed_dict", "AROUND"),
    f"{SCHED}._pp_commit_comm_work": ("Scheduler__pp_commit_comm_work", "AROUND"),
    # torch_native extend attention without the redundant (L+x)^2 query (plugin/compat/attention.py)
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend._run_sdpa_forward_extend":
        ("TorchNativeAttnBackend__run_sdpa_forward_extend", "AROUND"),
    # CPU-only compatibility for PD disaggregation over Mooncake TCP (no-ops where CUDA exists;
    # plugin/compat/cpu.py and docs/compatibility.md say why)
    "sglang.srt.disaggregation.mooncake.conn.MooncakeKVSender.__init__": ("MooncakeKVSender_init_cpu", "AFTER"),
    # observe only: a `kv_send` decision-log event per KV transfer of a PD prefill rank
    "sglang.srt.disaggregation.mooncake.conn.MooncakeKVSender.send": ("MooncakeKVSender_send", "AFTER"),
    # PD prefill with PP > 1: the release ring's forward pass (loop index; SGLANG_CPP_PD_FAST_RING frees there)
    # and, observe only, releases, KV sends and transfer statuses per loop index (plugin/pd/ring.py)
    f"{SCHED}._pp_pd_get_prefill_transferred_ids": ("Scheduler__pp_pd_get_prefill_transferred_ids", "AROUND"),
    f"{SCHED}.process_disagg_prefill_inflight_queue": ("Scheduler_process_disagg_prefill_inflight_queue", "AFTER"),
    # ... and an abort of the chunked request stops it at one loop index on every stage (SGLang's PD PP loop,
    # scheduler_pp_mixin.py:217-300, never calls process_pending_chunked_abort; pd_ring.chunked_abort)
    f"{SCHED}.process_prefill_chunk": ("Scheduler_process_prefill_chunk", "AROUND"),
    f"{SCHED}.abort_request": ("Scheduler_abort_request", "AFTER"),
    f"{SCHED}.send_kv_chunk": ("Scheduler_send_kv_chunk", "AFTER"),
    "sglang.srt.disaggregation.common.conn.CommonKVManager.update_status": ("CommonKVManager_update_status", "AFTER"),
    "sglang.srt.mem_cache.pool_host.common.alloc_with_host_register": ("alloc_with_host_register_cpu", "AROUND"),
    # CPU-only: DP attention's padding asks torch_native for a method only intel_amx defines
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.__init__":
        ("TorchNativeAttnBackend_init_cpu", "AFTER"),
    # CPU-only HiCache L2: torch KV copies between the device and host pools, synchronous streams
    f"{MHA_HOST}.__init__": ("MHATokenToKVPoolHost_init_cpu", "AFTER"),
    f"{MHA_HOST}.backup_from_device_all_layer": ("MHATokenToKVPoolHost_backup_from_device_all_layer", "AROUND"),
    "sglang.srt.mem_cache.l2_transfer.L2TransferEngine.__init__": ("L2TransferEngine_init_cpu", "AFTER"),
    # HiCache L3 file backend: PP stages race to create its directory (plugin/compat/hicache_file.py)
    "sglang.srt.mem_cache.hicache_storage.HiCacheFile.__init__": ("HiCacheFile_init", "AROUND"),
}


# Every other SGLang internal the plugin calls (tests/inproc/test_import_graph.py keeps this list equal to the
# plugin's imports): with TARGETS, the whole surface an SGLang upgrade can break, all in this folder.
INTERNALS = (
    "sglang",  # sglang.__version__: the calibration cache key and the unapplied-hooks error
    "sglang.srt.mem_cache.pool_host.mha",  # compat.cpu: the module whose host-pool methods call the KV copy ops
    "sglang.srt.configs.model_config.AttentionArch",  # plugin/startup/switches.py: MLA's kernel switches in L
    "sglang.srt.environ.envs",
    "sglang.srt.disaggregation.utils._all_reduce_polls",  # pd_ring: PP0's fast-release flags over its TP/CP ranks
    "sglang.srt.disaggregation.utils._is_fake_transfer",  # pd_ring: warm-up transfers never write the store
    "sglang.srt.disaggregation.utils.poll_and_all_reduce_attn_cp_tp_group",  # pd_ring: each stage's own polls
    "sglang.srt.disaggregation.utils.is_aborted",  # pd_kv: no early KV send for an aborted request
    "sglang.srt.runtime_context.attention_backends",
    "sglang.srt.runtime_context.get_schedule",
    "sglang.srt.distributed.parallel_state.GroupCoordinator",
    "sglang.srt.distributed.parallel_state.TensorMetadata",
    "sglang.srt.distributed.parallel_state.get_pp_group",
    "sglang.srt.layers.cp.utils.get_cp_strategy",  # switches._captured_everywhere: CP the prefill graph lacks
    "sglang.srt.layers.moe.utils.get_moe_a2a_backend",  # switches._dp_decode_peers_veto: a DP peer's graph vote
    "sglang.srt.mem_cache.kv_cache_builder.uses_ssm_state",  # ... the same vote (dp_attn.py:411-436)
    "sglang.srt.runtime_context.get_memory",  # ... the same vote: HiSparse
    "sglang.srt.eplb.expert_distribution._ExpertDistributionRecorderNoop",
    "sglang.srt.eplb.expert_distribution.get_global_expert_distribution_recorder",
    "sglang.srt.eplb.expert_distribution.set_global_expert_distribution_recorder",
    "sglang.srt.layers.dp_attention.get_is_extend_in_batch",
    "sglang.srt.layers.dp_attention.set_is_extend_in_batch",
    "sglang.srt.managers.schedule_batch.Req",
    # serving/arrivals.py: the arrival stamp rides as an empty BatchTokenizedGenerateReqInput (a work request in
    # request_receiver.py:310-337's split, relayed by scheduler_pp_mixin.py:139-147), the prompts it counts
    "sglang.srt.managers.io_struct.BatchTokenizedGenerateReqInput",
    "sglang.srt.managers.io_struct.BatchTokenizedEmbeddingReqInput",
    "sglang.srt.managers.io_struct.TokenizedGenerateReqInput",
    "sglang.srt.managers.io_struct.TokenizedEmbeddingReqInput",
    "sglang.srt.managers.utils.is_health_check_generate_req",
    "sglang.srt.managers.scheduler.Scheduler",  # startup._settled_align: its truncation-alignment setters
    "sglang.srt.managers.scheduler_components.dp_attn.prepare_mlp_sync_batch_raw",
    "sglang.srt.managers.schedule_batch.ScheduleBatch",
    "sglang.srt.managers.schedule_policy.AddReqResult",
    "sglang.srt.managers.schedule_policy.PrefillAdder",
    "sglang.srt.managers.schedule_policy.mamba_prefill_chunk_grid",
    "sglang.srt.mem_cache.common.checkpoint_kv_cache",
    "sglang.srt.mem_cache.common.release_kv_cache",
    "sglang.srt.model_executor.cuda_graph_config.cuda_graph_fully_disabled",
    "sglang.srt.model_executor.forward_batch_info.ForwardBatch",
    "sglang.srt.model_executor.forward_batch_info.PPProxyTensors",
    "sglang.srt.model_executor.runner_utils.buffers.allocate_pp_proxy_tensors",
    "sglang.srt.plugins.hook_registry.HookRegistry",
    "sglang.srt.plugins.hook_registry.HookType",
    "sglang.srt.runtime_context.get_disagg",  # pd_kv.startup_error: the PD mode and transfer backend
    "sglang.srt.runtime_context.get_exec",  # startup._relays_updates (elastic-EP joiner), switches (MLA dispatch)
    "sglang.srt.runtime_context.get_platform",  # switches._dispatch_predicates: fa4's SM100/110 test
    "sglang.srt.layers.cp.utils.is_mla_cp_enabled",  # switches._dispatch_predicates: MLA prefill CP
    "sglang.srt.runtime_context.get_parallel",
    "sglang.srt.runtime_context.get_server_args",
    "sglang.srt.runtime_context.max_prefill_buffer_tokens",
    "sglang.srt.sampling.sampling_params.SamplingParams",
    "sglang.srt.utils.common.get_device_module",
    "sglang.srt.utils.common.require_mlp_sync",
    "sglang.srt.utils.common.require_mlp_tp_gather",
)


# Scheduler state the plugin reads without calling anything (SGLang 0.5.23 lines), so an upgrade that moves it
# is found here. The queue-aware plan's view (admission._queue_view):
STATE_READS = {
    "Scheduler.mbs, Scheduler.running_mbs, Scheduler.running_batch": "managers/scheduler_pp_mixin.py:561-570 "
        "(init_pp_loop_state: pp_size + pp_async_batch_depth slots, distinct running batches), 131-153 and "
        "256-290 (event_loop_pp, event_loop_pp_disagg_prefill: running_batch = running_mbs[mb_id] before the "
        "batch is formed; slot mb_id's batch is replaced at its turn, the other slots hold the batches of the "
        "last iterations, results not processed yet, 196-204)",
    "Scheduler.waiting_queue order": "managers/scheduler.py:4128-4147 (calc_priority sorts it, then the dynamic "
        "chunk sizer's predict runs), 4204-4270 (add_one_req in that order); the same on every stage "
        "(requests relayed at the same index, scheduler_pp_mixin.py:138-147)",
    "Req.prefix_len, Req.host_hit_length": "mem_cache/common.py:244-251 (match_kv_cache). calc_priority runs it "
        "on waiting requests only for cache-aware policies (schedule_policy.py:223-243; "
        "supports_fast_match_prefix is False in 0.5.23), so under FCFS a waiting request's prefix is 0 until "
        "it is admitted: stale, but the same on every rank. The plugin never matches one itself (that moves "
        "the radix cache's LRU order)",
    "Scheduler._pending_chunked_abort_req, schedule_stream, forward_stream": "managers/scheduler.py:5675-5678 "
        "(abort_request marks the chunked request), 4928-4931 (run_batch marks one on this rank alone), "
        "3778-3828 (process_pending_chunked_abort), 1995-2004 (PP: a scheduler stream apart from the forward "
        "stream); pd_ring.chunked_abort",
    "Scheduler.tp_worker.model_runner, ModelRunner.forward": "managers/scheduler.py:1029-1033 (tp_worker), "
        "4614-4760 (run_batch calls model_worker.forward_batch_generation; PP forces the overlap schedule off, "
        "arg_groups/overrides.py:1622-1627, and launches it inside forward_stream_ctx, scheduler_pp_mixin.py:1644, "
        "so the events are recorded on the forward stream), managers/tp_worker.py:622-680 and 755-787 "
        "(ForwardBatch.init_new, then model_runner.forward on every stage; sampling after it on the last); "
        "timing.FORWARD times ModelRunner.forward alone, as harness.forward does",
    "Scheduler.draft_worker, EAGLEWorkerV2._draft_worker.draft_runner, draft_runner_list": "managers/scheduler.py:"
        "1037-1064 (draft_worker: None without speculative decoding and on PP stages that host no draft), 1203-1208 "
        "(model_worker = draft_worker), speculative/eagle_worker_v2.py:235 (draft_runner), 1334-1344 (_draft_worker "
        "on the last PP rank), 1548-1602 and 1062 (a prefill batch: the target's extend, then the draft's on "
        "draft_runner), arg_groups/validation_hook.py:119-164 (with PP: EAGLE on a PD prefill node or with "
        "SGLANG_ENABLE_PP_SPEC, DSPARK on a PD prefill node), "
        "multi_layer_eagle_worker_v2.py:189-191 (one runner per step); forwards.draft_runners arms the window with "
        "them, so a served chunk on that stage is timed with the draft's extend",
    "get_parallel(): attn_dp_enabled, attn_tp_rank, attn_cp_rank, enable_dp_attention_local_control_broadcast; "
    "get_exec().moe.is_ep_scale_joiner": "managers/scheduler_components/request_receiver.py:112-125 (PP0's "
        "attention TP/CP rank 0 pulls each DP group's requests), 167-200 (under local control broadcast, or as an "
        "elastic-EP joiner, control messages are broadcast inside the DP group only); startup._relays_updates, "
        "online.Online.relays",
    "Scheduler.init_deterministic_inference_config, init_dsa_kpool_truncation_align, "
    "init_mamba_truncation_align": "managers/scheduler.py:657 (the sizer) before 698-700 (these three set "
        "truncation_align_size), 1745-1800 (they read truncation_align_size and model_config only); "
        "startup._settled_align runs them on a stand-in at startup",
    "ModelRunner.eplb_manager._main_generator": "model_executor/model_runner.py:1897-1898 (every forward steps "
        "it), eplb/eplb_manager.py:72-94 (a rebalance every --eplb-rebalance-num-iterations steps); "
        "harness.no_expert_recording sets it aside for startup forwards",
    "ScheduleBatch.hicache_consumer_index": "managers/scheduler.py:4349-4355 (set at a prefill batch's build from "
        "the cache controller's start_loading, -1 when no load is queued), 4652 (SGLang's own `load_pending = "
        "index >= 0`), tp_worker.py:637 (the forward waits on it); hooks marks such forwards host_loaded",
    "Scheduler.attn_tp_group; GroupCoordinator.send_tensor_dict / recv_tensor_dict(all_gather_group)":
        "managers/scheduler.py:1247 (attn_tp_group), scheduler_pp_mixin.py:851-876 and 928-937 (the PP "
        "loop sends the proxy tensors split over attention TP and receives them before the stage's forward), "
        "distributed/parallel_state.py:1783-1900 (the split and the all-gather); overhead.time_transfers times "
        "each hop's receive alone that way, at two chunk sizes, each after a status gather of every rank over "
        "the world CPU group (consensus.all_gather: a barrier that also says who failed)",
    "ModelRunner.prefill_cuda_graph_runner: max_num_tokens, max_context_size, max_seq_len, prefill_backend_name, "
    "capture_num_tokens, enable_cp_bcg_capture":
        "model_executor/model_runner.py:1201, 1685 (set), 2036-2060 (a chunk replays it when can_run_graph), "
        "runner/prefill_cuda_graph_runner.py:348-387 (the bounds), 1325-1421 (can_replay_locally: tokens and "
        "context), models/deepseek_common/attention_backend_handler.py:109-112 (tc_piecewise / breakable replay "
        "pins absorbed MLA), 1423-1497 (the DP vote, idle DP ranks, the backend's own check), 158 and 1417-1420 "
        "(padding at most 2x), managers/scheduler_components/dp_attn.py:384-443, model_runner.py:287-294 (CP); "
        "switches._captured_everywhere, gathered from every rank at startup (startup.install); under DP attention "
        "dp_attn.py:400 and 569-574, 402-403 (idle ranks vote for replay; the extending rank votes no on tc_piecewise), "
        "forward_batch_info.py:1795-1872 (the padded dummy extend), 292 (the vote is a minimum over DP ranks) and "
        "411-436 (a decoding peer votes yes only as a convertible 1-token extend: no speculative decoding, MoE "
        "all-to-all backend none, no two-batch overlap, HiSparse or recurrent state; switches._dp_decode_peers_veto)",
    "Scheduler.spec_algorithm; PrefillCudaGraphRunner.enable_lora, _capture_lora": "managers/scheduler.py:509-511 "
        "(get_spec()'s algorithm, the one the model runner holds), model_executor/runner/prefill_cuda_graph_runner.py:"
        "341, 510, 538 (set), 1370-1374 and 1460-1466 (LoRA batches replay only a LoRA-captured graph), "
        "managers/scheduler_components/dp_attn.py:419, 469 (the DP graph vote); switches._dp_decode_peers_veto and "
        "the LoRA check in switches._captured_everywhere",
    "ScheduleBatch.prefix_lens, extend_lens, forward_mode": "managers/schedule_batch.py:2756-2780, 2885 "
        "(prepare_for_extend; lists, untouched by filter_batch / merge_batch, 3834, 3922); mixed decode rows "
        "(3358-3359) and DP attention's 1-token extends (3367-3397) have prefix >= the prompt and are left out",
}


# The hooks on the scheduler's per-step path: their own time is the plugin's cost per step (plugin/serving/steps.py).
# Not timed: start-up, compute that replaces SGLang's (attention, KV copies) and the waits themselves.
STEP_PATH = frozenset({
    "PrefillAdder_init", "PrefillAdder_add_one_req", "Scheduler__get_new_batch_prefill_raw",
    "PrefillAdder_add_chunked_req", "Scheduler_get_next_batch_to_run", "Scheduler_get_num_allocatable_reqs",
    "Scheduler_run_batch", "SchedulerRequestReceiver__pull_raw_reqs", "Scheduler_process_input_requests",
    "GroupCoordinator_recv_tensor_dict", "Scheduler__pp_launch_batch", "MooncakeKVSender_send",
    "Scheduler_process_prefill_chunk",
})


def unapplied(patched=None) -> str:
    """'' when SGLang's HookRegistry applied every TARGET; else the error that names the missing ones. The
    registry logs and skips a target it cannot resolve, so after an SGLang upgrade upstream's sizer would
    silently stay in charge."""
    if patched is None:
        from sglang.srt.plugins.hook_registry import HookRegistry

        patched = HookRegistry._patched
    missing = [t for t in TARGETS if t not in patched]
    if not missing:
        return ""
    import sglang

    version = getattr(sglang, "__version__", "unknown")
    return (f"sglang-cpp: SGLang {version} did not apply {len(missing)} of the plugin's hooks: {', '.join(missing)}. "
            "sglang-cpp is written against SGLang 0.5.23: install that version (pip install sglang==0.5.23 --no-deps), "
            "or an sglang-cpp made for yours")
