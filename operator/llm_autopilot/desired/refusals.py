"""Why a planned spec cannot be honoured as written, in the words both the admission webhook and the reconcile
use (one message each, one place). Pure."""

from __future__ import annotations

from collections.abc import Mapping

from llm_autopilot.api.lora import AdapterConfig, lora_refusal
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.catalog.gpus import UnknownGPUError, find_gpu
from llm_autopilot.planner.plan import Plan
from llm_autopilot.planner.pools import GPUPool, replicas_that_fit
from llm_autopilot.render.autoscaling import KEDA_CRD
from llm_autopilot.vllm.versions import VersionError, VLLMVersion, behaviour_of


def spec_refusal(spec: LLMDeploymentSpec, adapter_configs: Mapping[str, AdapterConfig],
                 default_vllm_version: str) -> tuple[str, str] | None:
    """(reason, message) when the spec cannot be served whatever the model and the cluster turn out to be: a vLLM
    version the operator does not support, a GPU product it does not know, LoRA adapters whose configs (as read)
    refuse them. Decided before the model, so that the webhook says it for a model it cannot read either."""
    try:
        behaviour_of(VLLMVersion.parse(spec.vllm.version or default_vllm_version))
    except VersionError as exc:
        return "UnsupportedVLLMVersion", f"spec.vllm.version: {exc}"
    if spec.gpu.product and spec.gpu.memory_gib is None:
        try:
            find_gpu(spec.gpu.product)
        except UnknownGPUError as exc:
            return "UnknownGPU", f"spec.gpu.product: {exc}"
    refused = lora_refusal(spec, adapter_configs)
    return ("LoRAAdapterRefused", refused) if refused is not None else None


def max_replicas_problem(max_replicas: int, plan: Plan, pool: GPUPool) -> str | None:
    """Why ``max_replicas`` replicas of ``plan`` do not fit in ``pool`` at once (None: they do, or the pool's
    nodes are not known)."""
    if not pool.nodes:
        return None
    fit = replicas_that_fit(plan.config, pool)
    if max_replicas <= fit:
        return None
    return (f"spec.autoscaling.maxReplicas {max_replicas} is more than the GPU pool holds: {fit} replicas of "
            f"{plan.summary} fit on its {pool.nodes} node(s) of {pool.gpus_per_node} x {pool.gpu.display_name}; "
            f"set maxReplicas to {fit} or fewer")


def autoscaling_problem(spec: LLMDeploymentSpec, plan: Plan, pool: GPUPool, *, prometheus_url: str | None,
                        crds: frozenset[str]) -> tuple[str, str] | None:
    """(reason, message) when spec.autoscaling cannot be honoured: more replicas than the GPU pool holds (every
    replica count KEDA may choose must fit; first, as the spec's own mistake), no Prometheus for KEDA, or no KEDA."""
    policy = spec.autoscaling
    if policy is None:
        return None
    message = max_replicas_problem(policy.max_replicas, plan, pool)
    if message:
        return ("TooManyReplicas", message)
    if not (policy.prometheus_address or prometheus_url):
        return ("NoPrometheus", "spec.autoscaling needs a Prometheus for KEDA to query: set "
                "spec.autoscaling.prometheusAddress, or LLM_AUTOPILOT_PROMETHEUS_URL for the operator")
    if KEDA_CRD not in crds:
        return ("NoKEDA", f"spec.autoscaling needs KEDA, whose ScaledObject CRD ({KEDA_CRD}) is not "
                          "installed; install KEDA, or remove spec.autoscaling")
    return None
