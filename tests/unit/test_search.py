"""The planner's search: fewest GPUs, then quality, then length; explanations when nothing fits."""

from __future__ import annotations

import pytest

from llm_autopilot.domain.gpu import GPUSpec
from llm_autopilot.domain.precision import KVCacheDtype, WeightFormat
from llm_autopilot.planner.memory import estimate
from llm_autopilot.planner.plan import Infeasible, Plan, PlanRequest, PlanResult, Targets
from llm_autopilot.planner.search import plan, weight_options
from llm_autopilot.vllm.versions import VLLMBehaviour, VLLMVersion, behaviour_of
from tests.conftest import gpu, model

W, K = WeightFormat, KVCacheDtype


def run(vllm: VLLMBehaviour, model_id: str, gpu_name: str, **targets: object) -> PlanResult:
    return plan(PlanRequest(model(model_id), gpu(gpu_name), vllm, Targets(**targets)))  # type: ignore[arg-type]


def ok(result: PlanResult) -> Plan:
    assert isinstance(result, Plan), getattr(result, "message", "")
    return result


def test_small_model_fits_one_gpu_at_full_context(vllm033: VLLMBehaviour) -> None:
    p = ok(run(vllm033, "Qwen/Qwen3-8B", "h100"))
    assert p.config.num_gpus == 1 and p.config.max_model_len == 40960
    assert p.config.weight_format is W.NONE and p.config.kv_cache_dtype is K.AUTO


def test_llama70b_on_h100_needs_four_gpus_for_a_long_context(vllm033: VLLMBehaviour) -> None:
    p = ok(run(vllm033, "meta-llama/Llama-3.1-70B-Instruct", "nvidia-h100-80gb"))
    assert p.config.tensor_parallel_size == 4
    assert p.reasons[0].field == "tensorParallelSize" and "2 x H100-80GB does not fit" in p.reasons[0].why


def test_fewest_gpus_beats_quality(vllm033: VLLMBehaviour) -> None:
    p = ok(run(vllm033, "Qwen/Qwen3-32B", "l4", max_model_len=8192, allowed_weight_formats=(W.NONE, W.FP8, W.AWQ)))
    bf16_on_more = ok(run(vllm033, "Qwen/Qwen3-32B", "l4", max_model_len=8192))
    assert p.config.num_gpus < bf16_on_more.config.num_gpus
    assert p.config.weight_format is not W.NONE


def test_quality_beats_length_among_equal_gpu_counts(vllm033: VLLMBehaviour) -> None:
    # bf16 fits on one L4 with a shorter context; fp8 would give a longer one: bf16 wins.
    p = ok(run(vllm033, "Qwen/Qwen3-8B", "l4", max_model_len=32768, min_max_model_len=8192,
               allowed_weight_formats=(W.NONE, W.FP8)))
    assert p.config.num_gpus == 1 and p.config.weight_format is W.NONE
    assert 8192 <= p.config.max_model_len < 32768


def test_pre_quantized_variant_preferred_over_online_fp8(vllm033: VLLMBehaviour) -> None:
    options = weight_options(PlanRequest(model("Qwen/Qwen3-32B"), gpu("h100"), vllm033), (W.NONE, W.FP8, W.AWQ))
    assert [o.weight_format for o in options] == [W.NONE, W.FP8, W.AWQ]
    assert options[1].served_model_id == "Qwen/Qwen3-32B-FP8"


def test_online_fp8_when_no_variant(vllm033: VLLMBehaviour) -> None:
    p = ok(run(vllm033, "Qwen/Qwen3-14B", "l4", max_model_len=8192, max_gpus=1, allowed_weight_formats=(W.FP8,)))
    assert p.config.online_fp8 and p.served_model_id == "Qwen/Qwen3-14B"


def test_awq_needs_a_variant(vllm033: VLLMBehaviour) -> None:
    options = weight_options(PlanRequest(model("Qwen/Qwen3-14B"), gpu("h100"), vllm033), (W.AWQ,))
    assert [o.weight_format for o in options] == [W.NONE]


def test_gpu_without_fp8_support_never_gets_fp8(vllm033: VLLMBehaviour) -> None:
    options = weight_options(PlanRequest(model("Qwen/Qwen3-32B"), gpu("t4"), vllm033), (W.FP8, W.AWQ))
    assert W.FP8 not in [o.weight_format for o in options]


def test_fp8_kv_used_when_it_avoids_more_gpus(vllm033: VLLMBehaviour) -> None:
    p = ok(run(vllm033, "Qwen/Qwen3-8B", "l4", max_model_len=32768, min_max_model_len=32768,
               allowed_kv_cache_dtypes=(K.AUTO, K.FP8)))
    assert p.config.num_gpus == 1 and p.config.kv_cache_dtype is K.FP8
    assert any(r.field == "kvCacheDtype" and "fp8" in r.value for r in p.reasons)


def test_concurrency_target_shortens_the_context_or_adds_gpus(vllm033: VLLMBehaviour) -> None:
    alone = ok(run(vllm033, "Qwen/Qwen3-30B-A3B", "a100-40gb"))
    busy = ok(run(vllm033, "Qwen/Qwen3-30B-A3B", "a100-40gb", concurrency=16))
    assert busy.estimate.max_concurrency >= 16
    assert (busy.config.max_model_len, -busy.config.num_gpus) < (alone.config.max_model_len, -alone.config.num_gpus)


def test_unreachable_concurrency_still_plans_with_a_warning(vllm033: VLLMBehaviour) -> None:
    p = ok(run(vllm033, "Qwen/Qwen3-8B", "l4", max_model_len=16384, min_max_model_len=16384, concurrency=500,
               max_gpus=1))
    assert p.warnings and "expected concurrency 500" in p.warnings[0]


def test_concurrency_sets_max_num_seqs(vllm033: VLLMBehaviour) -> None:
    assert ok(run(vllm033, "Qwen/Qwen3-8B", "h100", concurrency=8)).config.max_num_seqs == 16
    assert ok(run(vllm033, "Qwen/Qwen3-8B", "h100", concurrency=100)).config.max_num_seqs == 200
    assert ok(run(vllm033, "Qwen/Qwen3-8B", "h100")).config.max_num_seqs == 1024


def test_pinned_settings_are_respected(vllm033: VLLMBehaviour) -> None:
    p = ok(run(vllm033, "Qwen/Qwen3-8B", "h100", gpu_memory_utilization=0.8, max_num_seqs=64,
               max_num_batched_tokens=4096, enforce_eager=True))
    c = p.config
    assert (c.gpu_memory_utilization, c.max_num_seqs, c.max_num_batched_tokens, c.enforce_eager) == (
        0.8, 64, 4096, True)
    assert c.gpu_memory_utilization == pytest.approx(p.estimate.budget_bytes / gpu("h100").total_bytes)


def test_every_choice_has_a_reason(vllm033: VLLMBehaviour) -> None:
    p = ok(run(vllm033, "meta-llama/Llama-3.1-70B-Instruct", "h100", max_model_len=32768))
    fields = [r.field for r in p.reasons]
    for needed in ("tensorParallelSize", "weights", "kvCacheDtype", "maxModelLen", "gpuMemoryUtilization",
                   "maxNumSeqs", "maxNumBatchedTokens", "enforceEager"):
        assert needed in fields
    assert all(r.why and "\n" not in r.why for r in p.reasons)


def test_plan_leaves_headroom(vllm033: VLLMBehaviour) -> None:
    p = ok(run(vllm033, "Qwen/Qwen3-8B", "l4", max_model_len=40960, min_max_model_len=1024))
    assert p.estimate.max_model_len_capacity > p.config.max_model_len
    assert p.config.max_model_len % 256 == 0


def test_405b_on_four_h100_explains_the_smallest_change(vllm033: VLLMBehaviour) -> None:
    r = run(vllm033, "meta-llama/Llama-3.1-405B", "nvidia-h100-80gb", max_gpus=4)
    assert isinstance(r, Infeasible)
    assert "needs at least 8 x H100-80GB with fp8 weights" in r.message
    assert "maxGPUs is 4" in r.message and "allowedQuantizations" in r.message


def test_more_gpus_suggested_when_quantization_is_already_allowed(vllm033: VLLMBehaviour) -> None:
    r = run(vllm033, "meta-llama/Llama-3.1-70B-Instruct", "l40s", max_gpus=1, max_model_len=8192)
    assert isinstance(r, Infeasible)
    assert "needs at least 4 x L40S with bf16 weights (maxGPUs is 1)" in r.message
    # and the cheaper alternative that relaxes quality
    assert "or needs at least 2 x L40S with fp8 weights" in r.message


def test_shorter_minimum_suggested_when_only_length_is_the_problem(vllm033: VLLMBehaviour) -> None:
    r = run(vllm033, "Qwen/Qwen3-8B", "l4", max_gpus=1, max_model_len=40960, min_max_model_len=40960)
    assert isinstance(r, Infeasible)
    assert "lower minMaxModelLen to" in r.message


def test_nothing_fits_anywhere(vllm033: VLLMBehaviour) -> None:
    r = plan(PlanRequest(model("deepseek-ai/DeepSeek-V3"), GPUSpec.custom(16, "9.0"), vllm033, Targets()))
    assert isinstance(r, Infeasible) and "does not fit on up to 8" in r.message


@pytest.mark.parametrize(("targets", "needle"), [
    ({"max_model_len": 10**6}, "exceeds"),
    ({"min_max_model_len": 10**6}, "minMaxModelLen 1000000 exceeds"),
    ({"max_model_len": 4096, "min_max_model_len": 8192}, "larger than maxModelLen"),
    ({"max_gpus": 0}, "maxGPUs"),
    ({"gpu_memory_utilization": 1.2}, "gpuMemoryUtilization"),
])
def test_invalid_targets(vllm033: VLLMBehaviour, targets: dict[str, object], needle: str) -> None:
    r = run(vllm033, "Qwen/Qwen3-8B", "h100", **targets)
    assert isinstance(r, Infeasible) and needle in r.message


def test_plan_estimate_is_the_estimate_of_its_config(vllm033: VLLMBehaviour) -> None:
    p = ok(run(vllm033, "google/gemma-3-27b-it", "a100-80gb", max_model_len=32768))
    assert estimate(p.config) == p.estimate and p.estimate.fits


def test_checkpoint_format_the_gpu_cannot_run(vllm033: VLLMBehaviour) -> None:
    r = run(vllm033, "openai/gpt-oss-20b", "t4")  # MXFP4 needs compute capability 8.0
    assert isinstance(r, Infeasible) and "cannot run on T4" in r.message


def test_fp8_kv_only_where_the_version_cannot(vllm033: VLLMBehaviour) -> None:
    r = run(behaviour_of(VLLMVersion(0, 10, 2)), "Qwen/Qwen3-8B", "a100-80gb", allowed_kv_cache_dtypes=(K.FP8,))
    assert isinstance(r, Infeasible) and "cannot keep an fp8 KV cache on A100-80GB" in r.message
