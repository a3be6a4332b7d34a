"""Between the API and the planner: spec -> planner targets, plan -> status. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from llm_autopilot.api import lora as lora_spec
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec, MemoryBreakdown, PlanStatus, StageMemory
from llm_autopilot.catalog.gpus import GFD_PRODUCT, find_gpu, gpu_from_labels
from llm_autopilot.domain.gpu import GPUSpec
from llm_autopilot.domain.precision import KVCacheDtype, WeightFormat
from llm_autopilot.planner.memory import stage_breakdown
from llm_autopilot.planner.plan import DEFAULT_GPUS_PER_NODE, Plan, Targets
from llm_autopilot.planner.pools import GPUPool, group_pools


def variants(spec: LLMDeploymentSpec) -> dict[WeightFormat, str]:
    v = spec.model.variants
    if v is None:
        return {}
    named = {WeightFormat.FP8: v.fp8, WeightFormat.AWQ: v.awq, WeightFormat.GPTQ: v.gptq}
    return {fmt: model_id for fmt, model_id in named.items() if model_id}


def gpu_pools(spec: LLMDeploymentSpec, nodes: Iterable[tuple[Mapping[str, str], int]]) -> list[GPUPool]:
    """The pools the spec may use, from the GPU nodes' labels and allocatable GPUs: spec.gpu.nodeSelector
    filters them; a named product keeps its own pool (or one not seen on any node); ``memoryGiB`` describes a GPU
    no node names. Raises UnknownGPUError for an unknown product."""
    wanted = spec.gpu.node_selector or {}
    matching = [(labels, gpus) for labels, gpus in nodes if all(labels.get(k) == v for k, v in wanted.items())]
    found = [(gpu, labels[GFD_PRODUCT], gpus) for labels, gpus in matching if (gpu := gpu_from_labels(dict(labels)))]
    pools = group_pools(found)
    if spec.gpu.memory_gib is not None:
        return [GPUPool(GPUSpec.custom(spec.gpu.memory_gib, spec.gpu.compute_capability or "8.0"),
                        spec.gpu.max_gpus, (), 0)]
    if spec.gpu.product:
        gpu = find_gpu(spec.gpu.product)
        return [p for p in pools if p.gpu.name == gpu.name] or [
            GPUPool(gpu, spec.gpu.max_gpus, tuple(sorted({*gpu.gfd_products, spec.gpu.product})), 0)]
    return pools


def targets_for_pool(spec: LLMDeploymentSpec, pool: GPUPool,
                     adapter_configs: Mapping[str, lora_spec.AdapterConfig] | None = None) -> Targets:
    """Targets on a pool: its GPUs per node and its nodes when it was seen on nodes."""
    per_node, nodes = (pool.gpus_per_node, pool.nodes) if pool.nodes else (None, None)
    return targets(spec, gpus_per_node=per_node, max_nodes=nodes, adapter_configs=adapter_configs)


def targets(spec: LLMDeploymentSpec, *, gpus_per_node: int | None = None, max_nodes: int | None = None,
            max_gpus: int | None = None,
            adapter_configs: Mapping[str, lora_spec.AdapterConfig] | None = None) -> Targets:
    """Planner targets; ``gpus_per_node`` and ``max_nodes`` describe the pool (unknown: 8-GPU nodes, as many as
    spec.gpu.maxGPUs needs); ``max_gpus`` narrows spec.gpu.maxGPUs. ``adapter_configs`` (the LoRA adapters'
    configs, by adapter name, when read) give the default maxLoraRank."""
    s, v = spec.serving, spec.vllm
    return Targets(
        max_model_len=s.fixed_max_model_len,
        max_model_len_auto=s.auto_max_model_len,
        min_max_model_len=s.min_max_model_len,
        concurrency=s.expected_concurrency,
        allowed_weight_formats=tuple(dict.fromkeys(WeightFormat(q) for q in s.allowed_quantizations)),
        allowed_kv_cache_dtypes=tuple(dict.fromkeys(KVCacheDtype(k) for k in s.allowed_kv_cache_dtypes)),
        max_gpus=min(spec.gpu.max_gpus, max_gpus) if max_gpus else spec.gpu.max_gpus,
        gpus_per_node=gpus_per_node or DEFAULT_GPUS_PER_NODE,
        max_nodes=max_nodes,
        gpu_memory_utilization=v.gpu_memory_utilization,
        max_num_seqs=v.max_num_seqs,
        max_num_batched_tokens=v.max_num_batched_tokens,
        enforce_eager=v.enforce_eager,
        allow_cpu_offload=s.allow_cpu_offload,
        lora=lora_spec.lora_settings(spec, adapter_configs),
        lora_min_slots=lora_spec.pinned_adapters(spec),
        dtype=v.dtype or "auto",
    )


def _gib(value: float) -> float:
    return round(value / 2**30, 2)


def plan_status(plan: Plan, args: list[str], *, host_memory_gib: float = 0.0,
                replicas_that_fit: int | None = None) -> PlanStatus:
    c, e = plan.config, plan.estimate
    stages = [StageMemory(stage=s.stage, layers=s.layers, weights_gib=_gib(s.weights_bytes),
                          kv_cache_gib=_gib(s.kv_cache_bytes), kv_cache_tokens=s.kv_cache_tokens)
              for s in stage_breakdown(c)] if c.pipeline_parallel_size > 1 else []
    return PlanStatus(
        summary=plan.summary,
        served_model=plan.served_model_id,
        gpu_product=c.gpu.name,
        gpus=c.num_gpus,
        tensor_parallel_size=c.tensor_parallel_size,
        pipeline_parallel_size=c.pipeline_parallel_size,
        quantization=c.weights_label,
        kv_cache_dtype=str(c.kv_cache_dtype),
        max_model_len=c.max_model_len,
        max_num_seqs=c.max_num_seqs,
        max_num_batched_tokens=c.max_num_batched_tokens,
        gpu_memory_utilization=c.gpu_memory_utilization,
        enforce_eager=c.enforce_eager,
        vllm_version=str(c.vllm.version),
        nodes=c.nodes,
        cpu_offload_gib=c.cpu_offload_gib,
        host_memory_gib=round(host_memory_gib, 2),
        replicas_that_fit=replicas_that_fit,
        memory=MemoryBreakdown(
            gpu_total_gib=e.gib(e.total_bytes), budget_gib=e.gib(e.budget_bytes), weights_gib=e.gib(e.weights_bytes),
            activation_peak_gib=e.gib(e.activation_peak_bytes), non_torch_gib=e.gib(e.non_torch_bytes),
            cuda_graph_gib=e.gib(e.cuda_graph_bytes), kv_cache_gib=e.gib(e.kv_cache_bytes),
            kv_bytes_per_token=e.kv_bytes_per_token, kv_cache_tokens=e.kv_cache_tokens,
            lora_slots_gib=e.gib(e.lora_slots_bytes) if c.lora else None,
            lora_profile_gib=e.gib(e.lora_profile_bytes) if c.lora else None,
            max_concurrency=round(e.max_concurrency, 2), max_model_len_capacity=e.max_model_len_capacity,
        ),
        stages=stages,
        reasons=[str(r) for r in plan.reasons],
        warnings=list(plan.warnings),
        args=args,
        lora_adapters=[name for name, _ in c.lora.modules] if c.lora else [],
    )
