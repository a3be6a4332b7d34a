"""Pure parts of the operator: admission review, conditions, GPU pools, settings, spec conversion."""

from __future__ import annotations

import pytest

from llm_autopilot.api.conditions import conditions_status, deployment_ready, get_condition, set_condition
from llm_autopilot.api.convert import plan_status, targets, variants
from llm_autopilot.api.status import Condition
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec, LLMDeploymentStatus
from llm_autopilot.catalog.gpus import gpu_from_labels
from llm_autopilot.controller.admission import review
from llm_autopilot.controller.settings import OperatorSettings
from llm_autopilot.domain.precision import KVCacheDtype, WeightFormat
from llm_autopilot.planner.plan import Plan, PlanRequest
from llm_autopilot.planner.pools import GPUPool, choose_pool, group_pools
from llm_autopilot.planner.search import plan
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION, behaviour_of
from tests.conftest import gpu, model

V = str(DEFAULT_VLLM_VERSION)


def test_review_rejects_infeasible_with_the_planners_explanation() -> None:
    verdict = review({"model": {"name": "meta-llama/Llama-3.1-405B"},
                      "gpu": {"product": "nvidia-h100-80gb", "maxGPUs": 4}}, V)
    assert not verdict.allowed and "needs at least 8 x H100-80GB with fp8 weights" in verdict.message


def test_review_rejects_malformed_specs_naming_the_field() -> None:
    verdict = review({"model": {"name": "Qwen/Qwen3-8B"}, "serving": {"maxModelLen": "long"}}, V)
    assert not verdict.allowed and "spec.serving.maxModelLen" in verdict.message
    assert not review({"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "gtx-970"}}, V).allowed
    assert "vllm.version" in review({"model": {"name": "Qwen/Qwen3-8B"}, "vllm": {"version": "0.5.0"}}, V).message


def test_review_refuses_arguments_that_fight_the_planner() -> None:
    verdict = review({"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "h100"},
                      "vllm": {"extraArgs": ["--max-model-len", "4096", "--enable-prefix-caching"]}}, V)
    assert not verdict.allowed and verdict.message.startswith("spec.vllm.extraArgs[0]: --max-model-len is owned")
    assert "spec.serving.maxModelLen" in verdict.message


def test_review_rejects_flags_the_version_does_not_know() -> None:
    verdict = review({"model": {"name": "Qwen/Qwen3-8B"}, "vllm": {"extraArgs": ["--swap-space", "4"]}}, V)
    assert not verdict.allowed and "--swap-space" in verdict.message


def test_review_admits_unknown_models_with_a_warning() -> None:
    verdict = review({"model": {"name": "someorg/private-model"}, "gpu": {"product": "l4"}}, V)
    assert verdict.allowed and "not in the built-in catalog" in verdict.warnings[0]


def test_review_checks_inline_architectures() -> None:
    arch = {"hiddenSize": 8192, "numHiddenLayers": 80, "numAttentionHeads": 64, "numKeyValueHeads": 8,
            "intermediateSize": 28672, "vocabSize": 128256, "maxPositionEmbeddings": 131072}
    verdict = review({"model": {"name": "someorg/llama-like", "architecture": arch},
                      "gpu": {"product": "l4", "maxGPUs": 1}}, V)
    assert not verdict.allowed and "does not fit on 1 x L4" in verdict.message


def test_conditions_keep_transition_time_while_status_holds() -> None:
    first = set_condition((), "Ready", False, "Unavailable", "0/1", generation=1, now="t1")
    same = set_condition(first, "Ready", False, "Unavailable", "still 0/1", generation=2, now="t2")
    flipped = set_condition(same, "Ready", True, "Available", "1/1", generation=2, now="t3")
    assert [c.last_transition_time for c in (*first, *same, *flipped)] == ["t1", "t1", "t3"]
    assert first[0].message == "0/1", "a new value: the conditions given are not changed"
    assert (same[0].message, same[0].observed_generation) == ("still 0/1", 2)
    assert len(flipped) == 1


def test_a_condition_read_back_unchanged_is_written_in_the_form_it_was_read() -> None:
    read = Condition.model_validate({"type": "Ready", "status": "True", "reason": "Available"})
    assert conditions_status([read]) == [{"type": "Ready", "status": "True", "reason": "Available"}]
    moved = set_condition((read,), "Ready", False, "Unavailable", "0/1", generation=3, now="t4")
    assert conditions_status(moved) == [{"type": "Ready", "status": "False", "reason": "Unavailable",
                                         "message": "0/1", "lastTransitionTime": "t4", "observedGeneration": 3}]
    assert get_condition(moved, "Planned") is None
    assert len(moved) == 1


@pytest.mark.parametrize(("status", "replicas", "expected"), [
    (None, 1, (False, "NoWorkload")),
    ({"availableReplicas": 1, "updatedReplicas": 1, "observedGeneration": 2}, 1, (True, "Available")),
    ({"availableReplicas": 1, "updatedReplicas": 0, "observedGeneration": 2}, 1, (False, "RollingOut")),
    ({"availableReplicas": 1, "updatedReplicas": 2, "observedGeneration": 2}, 2, (False, "Unavailable")),
    ({"availableReplicas": 1, "updatedReplicas": 1, "observedGeneration": 1}, 1, (False, "Progressing")),
    ({}, 0, (True, "ScaledToZero")),
])
def test_readiness_from_the_deployment(status: dict[str, int] | None, replicas: int,
                                       expected: tuple[bool, str]) -> None:
    dep = None if status is None else {"metadata": {"generation": 2}, "status": status}
    assert deployment_ready(dep, replicas)[:2] == expected


def test_readiness_names_why_the_replicaset_cannot_create_pods() -> None:
    """What the Deployment controller copies from the ReplicaSet when pod creation is refused."""
    refused = {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
               "message": 'pods "qwen3-8b-5d8f" is forbidden: exceeded quota: no-pods, requested: pods=1'}
    status = {"observedGeneration": 2, "updatedReplicas": 0, "availableReplicas": 0,
              "conditions": [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetCreated"}, refused]}
    ready, reason, message = deployment_ready({"metadata": {"generation": 2}, "status": status}, 1)
    assert (ready, reason) == (False, "FailedCreate")
    assert message == ('the ReplicaSet cannot create pods: pods "qwen3-8b-5d8f" is forbidden: exceeded quota: '
                       "no-pods, requested: pods=1")
    resolved = {**status, "conditions": [{**refused, "status": "False"}], "updatedReplicas": 1, "availableReplicas": 1}
    assert deployment_ready({"metadata": {"generation": 2}, "status": resolved}, 1)[:2] == (True, "Available")
    assert deployment_ready({"metadata": {"generation": 2}, "status": status}, 0)[:2] == (True, "ScaledToZero")


def test_gpu_from_gfd_labels() -> None:
    assert gpu_from_labels({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}) == gpu("h100")
    unknown = gpu_from_labels({"nvidia.com/gpu.product": "NVIDIA-X9", "nvidia.com/gpu.memory": "49152",
                               "nvidia.com/gpu.compute.major": "9", "nvidia.com/gpu.compute.minor": "0"})
    assert unknown is not None and 47 < unknown.total_gib < 48 and str(unknown.compute_capability) == "9.0"
    assert gpu_from_labels({"nvidia.com/gpu.product": "NVIDIA-X9"}) is None
    assert gpu_from_labels({}) is None


def test_pools_group_nodes_and_choose_the_least_gpu_memory() -> None:
    pools = group_pools([(gpu("l4"), "NVIDIA-L4", 1), (gpu("l4"), "NVIDIA-L4", 1),
                         (gpu("h100"), "NVIDIA-H100-80GB-HBM3", 8), (gpu("a100-40gb"), "NVIDIA-A100-SXM4-40GB", 8),
                         (gpu("t4"), "Tesla-T4", 0)])
    assert [(p.gpu.name, p.gpus_per_node, p.nodes) for p in pools] == [
        ("nvidia-l4", 1, 2), ("nvidia-a100-40gb", 8, 1), ("nvidia-h100-80gb", 8, 1)]
    vllm = behaviour_of(DEFAULT_VLLM_VERSION)

    def request(pool: GPUPool, model_id: str) -> PlanRequest:
        spec = LLMDeploymentSpec.model_validate({"model": {"name": model_id}, "serving": {"maxModelLen": 16384}})
        return PlanRequest(model(model_id), pool.gpu, vllm, targets(spec, max_gpus=pool.gpus_per_node))

    small = choose_pool(pools, lambda p: request(p, "Qwen/Qwen3-4B"))
    assert small.pool is not None and small.pool.gpu.name == "nvidia-l4"
    big = choose_pool(pools, lambda p: request(p, "meta-llama/Llama-3.1-70B-Instruct"))
    assert big.pool is not None and big.pool.gpu.name in ("nvidia-a100-40gb", "nvidia-h100-80gb")
    assert isinstance(big.result, Plan)
    none = choose_pool([], lambda p: request(p, "Qwen/Qwen3-4B"))
    assert none.pool is None and "no schedulable nodes" in none.result.message  # type: ignore[union-attr]


def test_spec_conversion() -> None:
    spec = LLMDeploymentSpec.model_validate({
        "model": {"name": "Qwen/Qwen3-32B", "variants": {"awq": "Qwen/Qwen3-32B-AWQ"}},
        "gpu": {"maxGPUs": 8}, "serving": {"allowedQuantizations": ["none", "awq", "awq"],
                                          "allowedKVCacheDtypes": ["fp8"]},
        "vllm": {"gpuMemoryUtilization": 0.85, "enforceEager": True}})
    t = targets(spec, max_gpus=4)
    assert t.max_gpus == 4 and t.allowed_weight_formats == (WeightFormat.NONE, WeightFormat.AWQ)
    assert t.allowed_kv_cache_dtypes == (KVCacheDtype.FP8,) and t.gpu_memory_utilization == 0.85 and t.enforce_eager
    assert variants(spec) == {WeightFormat.AWQ: "Qwen/Qwen3-32B-AWQ"}


def test_plan_status_round_trips_through_the_status_model() -> None:
    result = plan(PlanRequest(model("Qwen/Qwen3-8B"), gpu("l4"), behaviour_of(DEFAULT_VLLM_VERSION)))
    assert isinstance(result, Plan)
    status = plan_status(result, ["Qwen/Qwen3-8B"]).model_dump(by_alias=True)
    parsed = LLMDeploymentStatus.model_validate({"plan": status})
    assert parsed.plan is not None and parsed.plan.summary == "1 x L4" and status["memory"]["kvCacheGiB"] > 0


def test_settings_from_environment() -> None:
    s = OperatorSettings.from_env({"LLM_AUTOPILOT_NAMESPACES": "a, b", "LLM_AUTOPILOT_WEBHOOK": "true",
                                   "LLM_AUTOPILOT_RESYNC_SECONDS": "5", "LLM_AUTOPILOT_PROMETHEUS_URL": "http://p"})
    assert s.namespaces == ("a", "b") and s.webhook_enabled and s.resync_seconds == 5
    assert s.prometheus_url == "http://p"
    assert OperatorSettings.from_env({}).default_image.endswith(V)
    assert OperatorSettings.from_env({}).webhook_cert_check_seconds == 60
    assert OperatorSettings.from_env({}).peering_lifetime_seconds == 60
    assert OperatorSettings.from_env({"LLM_AUTOPILOT_PEERING_LIFETIME_SECONDS": "20"}).peering_lifetime_seconds == 20
    assert OperatorSettings.from_env({"LLM_AUTOPILOT_WEBHOOK_CERT_CHECK_SECONDS": "5"}).webhook_cert_check_seconds == 5
