"""The planner across nodes (tensor parallel within a node, pipeline parallel across nodes), maxModelLen auto and
CPU offload as the last resort."""

from __future__ import annotations

import dataclasses

import pytest

from llm_autopilot.domain.architecture import ModelArchitecture
from llm_autopilot.domain.precision import GIB, KVCacheDtype, WeightFormat
from llm_autopilot.planner.memory import estimate, stage_breakdown
from llm_autopilot.planner.plan import Infeasible, Plan, PlanRequest, PlanResult, Targets
from llm_autopilot.planner.pools import GPUPool, replicas_that_fit
from llm_autopilot.planner.search import plan
from llm_autopilot.planner.weights import stage_partition, stage_weight_bytes, weight_bytes_per_gpu
from llm_autopilot.vllm.versions import VLLMBehaviour
from tests.conftest import gpu, model

W = WeightFormat


def run(vllm: VLLMBehaviour, m: ModelArchitecture, gpu_name: str, **targets: object) -> PlanResult:
    return plan(PlanRequest(m, gpu(gpu_name), vllm, Targets(**targets)))  # type: ignore[arg-type]


def ok(result: PlanResult) -> Plan:
    assert isinstance(result, Plan), getattr(result, "message", "")
    return result


def deepseek_v3_bf16() -> ModelArchitecture:
    """DeepSeek-V3's architecture with bf16 weights (the published checkpoint is FP8): a bf16 re-export."""
    published = model("deepseek-ai/DeepSeek-V3")
    return dataclasses.replace(published, model_id="example/DeepSeek-V3-bf16", quantization=None,
                               checkpoint_bytes=None, variants={})


@pytest.mark.parametrize(("layers", "stages", "expected"), [
    (126, 2, (63, 63)), (61, 2, (31, 30)), (61, 3, (20, 21, 20)), (61, 4, (15, 15, 16, 15)), (80, 3, (27, 27, 26)),
])
def test_stage_partition_is_vllms(layers: int, stages: int, expected: tuple[int, ...]) -> None:
    # vllm/distributed/utils.py::get_pp_indices: the remainder goes to the stages before the last, backwards
    assert stage_partition(layers, stages) == expected
    assert sum(expected) == layers


def test_llama_405b_bf16_spans_two_h100_nodes(vllm033: VLLMBehaviour) -> None:
    p = ok(run(vllm033, model("meta-llama/Llama-3.1-405B"), "nvidia-h100-80gb", max_gpus=16))
    c = p.config
    assert (c.tensor_parallel_size, c.pipeline_parallel_size, c.nodes, c.gpus_per_pod) == (8, 2, 2, 8)
    assert c.weight_format is W.NONE and p.summary == "16 x H100-80GB (2 nodes)"
    reasons = {r.field: r for r in p.reasons}
    assert "within a node" in reasons["tensorParallelSize"].why
    pipeline = reasons["pipelineParallelSize"]
    assert pipeline.value == "2" and "63 + 63 layers" in pipeline.why
    assert "8 x H100-80GB does not fit" in pipeline.why and "weights need" in pipeline.why
    # one node really does not hold it, and half the weights per GPU is what two stages give
    one_node = weight_bytes_per_gpu(c.model, W.NONE, 8)
    assert one_node > estimate(c).budget_bytes > p.estimate.weights_bytes
    assert p.estimate.weights_bytes == pytest.approx(one_node / 2, rel=0.01)


def test_the_breakdown_is_per_stage_and_the_plan_is_the_smallest_stage(vllm033: VLLMBehaviour) -> None:
    p = ok(run(vllm033, deepseek_v3_bf16(), "nvidia-h100-80gb", max_gpus=32))
    c = p.config
    assert c.nodes == 3 and c.tensor_parallel_size == 8  # 1.3 TB of bf16 weights: 2 nodes hold 1.1 TiB
    stages = stage_breakdown(c)
    assert [s.layers for s in stages] == [20, 21, 20]
    # the first stage holds the three dense layers and the embedding, the last the LM head
    assert stages[0].weights_bytes != stages[2].weights_bytes
    assert max(s.weights_bytes for s in stages) == pytest.approx(p.estimate.weights_bytes)
    # vLLM gives every stage the block count of the stage with the fewest (get_kv_cache_configs)
    assert min(s.kv_cache_tokens for s in stages) == stages[1].kv_cache_tokens
    assert stages[1].kv_cache_tokens == pytest.approx(p.estimate.kv_cache_tokens, rel=0.02)


def test_deepseek_v3_fp8_as_published_needs_two_nodes(vllm033: VLLMBehaviour) -> None:
    p = ok(run(vllm033, model("deepseek-ai/DeepSeek-V3"), "nvidia-h100-80gb", max_gpus=16))
    assert (p.config.nodes, p.config.tensor_parallel_size) == (2, 8)
    assert p.config.weight_format is W.FP8


def test_max_nodes_bounds_the_stages(vllm033: VLLMBehaviour) -> None:
    r = run(vllm033, model("meta-llama/Llama-3.1-405B"), "nvidia-h100-80gb", max_gpus=16, max_nodes=1)
    assert isinstance(r, Infeasible)


def test_fewest_gpus_still_wins_over_quality_across_nodes(vllm033: VLLMBehaviour) -> None:
    # fp8 fits on one node: fewer GPUs than bf16 on two
    p = ok(run(vllm033, model("meta-llama/Llama-3.1-405B"), "nvidia-h100-80gb", max_gpus=16,
               allowed_weight_formats=(W.NONE, W.FP8)))
    assert (p.config.nodes, p.config.num_gpus, p.config.weight_format) == (1, 8, W.FP8)


def test_small_nodes_split_tensor_parallel_at_the_node(vllm033: VLLMBehaviour) -> None:
    r = run(vllm033, model("meta-llama/Llama-3.1-70B-Instruct"), "nvidia-l4", max_gpus=8, gpus_per_node=4,
            max_model_len=8192)
    assert isinstance(r, Infeasible) and "needs at least 8 x L4 (2 nodes) with fp8 weights" in r.message
    p = ok(run(vllm033, model("meta-llama/Llama-3.1-70B-Instruct"), "nvidia-l4", max_gpus=8, gpus_per_node=4,
               max_model_len=8192, allowed_weight_formats=(W.NONE, W.FP8)))
    assert (p.config.tensor_parallel_size, p.config.nodes, p.config.weight_format) == (4, 2, W.FP8)


@pytest.mark.parametrize(("tp", "nodes", "pool", "fits"), [
    (1, 1, GPUPool(gpu("nvidia-l4"), 1, ("NVIDIA-L4",), 4), 4),
    (2, 1, GPUPool(gpu("nvidia-h100-80gb"), 8, ("H100",), 2), 8),
    (8, 2, GPUPool(gpu("nvidia-h100-80gb"), 8, ("H100",), 2), 1),
    (8, 2, GPUPool(gpu("nvidia-h100-80gb"), 8, ("H100",), 5), 2),
    (8, 1, GPUPool(gpu("nvidia-h100-80gb"), 4, ("H100",), 4), 0),
])
def test_replicas_that_fit_a_pool(vllm033: VLLMBehaviour, tp: int, nodes: int, pool: GPUPool, fits: int) -> None:
    p = ok(run(vllm033, model("Qwen/Qwen3-0.6B"), "nvidia-l4", max_gpus=16, min_gpus=tp * nodes,
               gpus_per_node=tp))
    assert (p.config.tensor_parallel_size, p.config.nodes) == (tp, nodes)
    assert replicas_that_fit(p.config, pool) == fits


# --- maxModelLen: auto ---------------------------------------------------------------------------------------


def test_auto_is_the_longest_that_fits_and_says_so(vllm033: VLLMBehaviour) -> None:
    auto = ok(run(vllm033, model("Qwen/Qwen3-8B"), "nvidia-l4", max_gpus=1, max_model_len_auto=True))
    length = auto.config.max_model_len
    assert 8192 <= length < 40960 and length % 256 == 0
    reason = next(r for r in auto.reasons if r.field == "maxModelLen")
    assert reason.why.startswith("auto: the longest that fits") and "model maximum 40960" in reason.why
    # longer does not fit with the headroom: the next step up is refused by the planner
    longer = run(vllm033, model("Qwen/Qwen3-8B"), "nvidia-l4", max_gpus=1, max_model_len=length + 256,
                 min_max_model_len=length + 256)
    assert isinstance(longer, Infeasible)
    # and it never lands on the cache's own capacity (vLLM's auto does): headroom stays
    assert length < auto.estimate.max_model_len_capacity


def test_auto_respects_the_minimum(vllm033: VLLMBehaviour) -> None:
    r = run(vllm033, model("Qwen/Qwen3-8B"), "nvidia-l4", max_gpus=1, max_model_len_auto=True,
            min_max_model_len=40960)
    assert isinstance(r, Infeasible) and "maxModelLen >= 40960" in r.message


def test_auto_takes_the_full_context_when_it_fits(vllm033: VLLMBehaviour) -> None:
    p = ok(run(vllm033, model("Qwen/Qwen3-8B"), "nvidia-h100-80gb", max_model_len_auto=True))
    assert p.config.max_model_len == 40960
    assert next(r for r in p.reasons if r.field == "maxModelLen").why == "auto: the model's full context fits"


# --- CPU offload --------------------------------------------------------------------------------------------


def test_offload_is_only_the_last_resort(vllm033: VLLMBehaviour) -> None:
    fits = ok(run(vllm033, model("Qwen/Qwen3-8B"), "nvidia-l4", max_gpus=1, max_model_len=8192,
                  allow_cpu_offload=True))
    assert fits.config.cpu_offload_gib == 0 and not fits.warnings


def test_offload_makes_a_too_large_model_fit_and_says_it_is_slow(vllm033: VLLMBehaviour) -> None:
    targets = {"max_gpus": 1, "max_model_len": 8192}
    assert isinstance(run(vllm033, model("Qwen/Qwen3-14B"), "nvidia-l4", **targets), Infeasible)
    p = ok(run(vllm033, model("Qwen/Qwen3-14B"), "nvidia-l4", allow_cpu_offload=True, **targets))
    offload = p.config.cpu_offload_gib
    assert offload >= 1 and offload == int(offload)
    reason = next(r for r in p.reasons if r.field == "cpuOffloadGB")
    assert reason.value == f"{offload:g}" and reason.why.startswith("SLOW") and "PCIe" in reason.why
    assert any(w.startswith("SLOW") for w in p.warnings)
    # the fewest whole GiB: one less does not fit
    full = weight_bytes_per_gpu(p.config.model, W.NONE, 1)
    assert p.estimate.weights_bytes == pytest.approx(full - offload * GIB)
    less = estimate(dataclasses.replace(p.config, cpu_offload_gib=offload - 1))
    assert not less.fits or less.kv_cache_bytes < p.estimate.kv_cache_bytes


def test_offload_prefers_the_widest_layout(vllm033: VLLMBehaviour) -> None:
    p = ok(run(vllm033, model("Qwen/Qwen3-32B"), "nvidia-l4", max_gpus=2, max_model_len=8192,
               allow_cpu_offload=True))
    assert p.config.num_gpus == 2 and p.config.cpu_offload_gib > 0


def test_offload_cannot_rescue_a_kv_cache_that_never_fits(vllm033: VLLMBehaviour) -> None:
    # every weight offloaded still leaves too little for one sequence of the model's full context per GPU
    r = run(vllm033, model("Qwen/Qwen3-0.6B"), "nvidia-t4", max_gpus=1, allow_cpu_offload=True,
            max_model_len=40960, min_max_model_len=40960, allowed_kv_cache_dtypes=(KVCacheDtype.AUTO,),
            gpu_memory_utilization=0.05)
    assert isinstance(r, Infeasible)


def test_stage_weights_add_up_to_the_model(vllm033: VLLMBehaviour) -> None:
    m = model("meta-llama/Llama-3.1-405B")
    one = stage_weight_bytes(m, W.NONE, 8, 1)
    four = stage_weight_bytes(m, W.NONE, 8, 4)
    assert one == pytest.approx((weight_bytes_per_gpu(m, W.NONE, 8),))
    assert sum(four) == pytest.approx(one[0], rel=1e-9)
