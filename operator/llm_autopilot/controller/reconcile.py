"""One reconcile of an LLMDeployment: resolve, find GPUs, plan, render, apply, report.

Decisions are the pure modules' (planner, renderer, conditions); this module sequences the I/O and
turns failures into conditions. It never writes the spec, and writes nothing when nothing changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from llm_autopilot.api import convert
from llm_autopilot.api.conditions import DEGRADED, PLANNED, READY, deployment_ready, set_condition
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.catalog.gpus import UnknownGPUError, find_gpu, gpu_from_labels
from llm_autopilot.controller.kube import Kube
from llm_autopilot.controller.settings import OperatorSettings
from llm_autopilot.domain.gpu import GPUSpec
from llm_autopilot.hub.client import HubClient
from llm_autopilot.hub.resolve import ModelResolutionError, resolve_model
from llm_autopilot.planner.plan import Infeasible, Plan, PlanRequest
from llm_autopilot.planner.pools import GPUPool, PoolChoice, choose_pool, group_pools
from llm_autopilot.render.kubernetes import Owner, WorkloadInputs, workload
from llm_autopilot.render.vllm_args import ServeOptions, render_vllm_args, unknown_flags
from llm_autopilot.vllm.versions import VersionError, VLLMVersion, behaviour_of


@dataclass
class Outcome:
    status: dict[str, Any] = field(default_factory=dict)  # only the keys that change
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    writes: int = 0
    retry: bool = False


def format_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "spec"
        parts.append(f"spec.{where}: {err['msg']}")
    return "; ".join(parts)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _hub_client(spec: LLMDeploymentSpec, namespace: str, kube: Kube, settings: OperatorSettings) -> HubClient:
    token = None
    ref = spec.model.hub_token_secret_ref
    if ref is not None:
        token = kube.secret_value(namespace, ref.name, ref.key)
        if token is None:
            raise ModelResolutionError(f"Secret {ref.name!r} (key {ref.key!r}) for the Hub token was not found in "
                                       f"namespace {namespace}")
    return HubClient(token=token, timeout=settings.hub_timeout_seconds)


def choose(spec: LLMDeploymentSpec, namespace: str, kube: Kube, settings: OperatorSettings) -> PoolChoice:
    """Resolve the model and the GPUs, then plan: on the named GPU, or on the best pool in the cluster."""
    override = spec.model.architecture
    model = resolve_model(
        spec.model.name, revision=spec.model.revision,
        override=override.as_hf_config() if override else None,
        override_checkpoint_bytes=override.weight_bytes if override else None,
        variants=convert.variants(spec), client=_hub_client(spec, namespace, kube, settings),
    )
    behaviour = behaviour_of(VLLMVersion.parse(spec.vllm.version or settings.default_vllm_version))
    wanted = spec.gpu.node_selector or {}
    nodes = [(gpu, n.labels["nvidia.com/gpu.product"], n.allocatable_gpus)
             for n in kube.gpu_nodes()
             if all(n.labels.get(k) == v for k, v in wanted.items()) and (gpu := gpu_from_labels(n.labels))]
    pools = group_pools(nodes)

    def request(gpu: GPUSpec, max_gpus: int | None) -> PlanRequest:
        return PlanRequest(model, gpu, behaviour, convert.targets(spec, max_gpus=max_gpus))

    if spec.gpu.memory_gib is not None:
        gpu = GPUSpec.custom(spec.gpu.memory_gib, spec.gpu.compute_capability or "8.0")
        pool = GPUPool(gpu, spec.gpu.max_gpus, (), 0)
        return choose_pool([pool], lambda p: request(p.gpu, None))
    if spec.gpu.product:
        gpu = find_gpu(spec.gpu.product)
        matching = [p for p in pools if p.gpu.name == gpu.name]
        if matching:
            return choose_pool(matching, lambda p: request(p.gpu, p.gpus_per_node))
        fallback = GPUPool(gpu, spec.gpu.max_gpus, tuple(sorted({*gpu.gfd_products, spec.gpu.product})), 0)
        return choose_pool([fallback], lambda p: request(p.gpu, None))
    return choose_pool(pools, lambda p: request(p.gpu, p.gpus_per_node))


def _changed(current: dict[str, Any], key: str, value: Any) -> bool:
    return bool(current.get(key) != value)


def reconcile(
    *, name: str, namespace: str, uid: str, generation: int | None, spec_body: dict[str, Any],
    status: dict[str, Any], kube: Kube, settings: OperatorSettings,
) -> Outcome:
    out = Outcome()
    stamp = now()
    conditions = list(status.get("conditions") or [])

    def fail(reason: str, message: str, *, retry: bool = False) -> Outcome:
        new = set_condition(conditions, PLANNED, False, reason, message, generation=generation, now=stamp)
        if _changed(status, "conditions", new):
            out.status["conditions"] = new
            out.events.append(("Warning", reason, message))
        if _changed(status, "observedGeneration", generation):
            out.status["observedGeneration"] = generation
        out.retry = retry
        return out

    try:
        spec = LLMDeploymentSpec.model_validate(spec_body)
    except ValidationError as exc:
        return fail("InvalidSpec", format_validation_error(exc))
    try:
        choice = choose(spec, namespace, kube, settings)
    except UnknownGPUError as exc:
        return fail("UnknownGPU", str(exc))
    except VersionError as exc:
        return fail("UnsupportedVLLMVersion", str(exc))
    except ModelResolutionError as exc:
        return fail("ModelUnresolved", str(exc), retry="cannot reach" in str(exc) or "error" in str(exc))
    if isinstance(choice.result, Infeasible) or choice.pool is None:
        message = choice.result.message if isinstance(choice.result, Infeasible) else "no GPU pool"
        return fail("Infeasible", message)
    plan: Plan = choice.result

    served_name = spec.model.served_model_name or spec.model.name.removeprefix("hf://")
    args = render_vllm_args(plan, ServeOptions(served_model_name=served_name, revision=spec.model.revision,
                                               extra_args=tuple(spec.vllm.extra_args)))
    version = str(plan.config.vllm.version)
    unknown = unknown_flags(args, version)
    plan_status = convert.plan_status(plan, args)
    if unknown:
        plan_status.warnings.append(f"vLLM {version} does not accept {', '.join(unknown)} (from extraArgs)")
    products = choice.pool.products or tuple(plan.config.gpu.gfd_products)
    inputs = WorkloadInputs(Owner(name, namespace, uid), spec, plan, tuple(args),
                            spec.vllm.image or settings.default_image, products)
    for obj in workload(inputs):
        out.writes += kube.apply(obj)

    plan_dict = plan_status.model_dump(by_alias=True, exclude_none=True)
    if _changed(status, "plan", plan_dict):
        out.status["plan"] = plan_dict
        out.events.append(("Normal", "Planned", f"{plan.summary}, {plan_status.quantization} weights, "
                                                f"{plan_status.kv_cache_dtype} KV, max_model_len "
                                                f"{plan_status.max_model_len}"))
    message = f"{plan.summary}: {plan_status.memory.kv_cache_gib} GiB KV cache per GPU, " \
              f"{plan_status.memory.max_concurrency}x concurrency at {plan_status.max_model_len} tokens"
    new = set_condition(conditions, PLANNED, True, "Planned", message, generation=generation, now=stamp)
    deployment = kube.get("apps/v1", "Deployment", name, namespace)
    ready, reason, ready_message = deployment_ready(deployment, spec.replicas)
    new = set_condition(new, READY, ready, reason, ready_message, generation=generation, now=stamp)
    if not any(c.get("type") == DEGRADED for c in new):
        new = set_condition(new, DEGRADED, False, "AsPlanned", "running the planned configuration",
                            generation=generation, now=stamp)
    if _changed(status, "conditions", new):
        out.status["conditions"] = new
    if _changed(status, "observedGeneration", generation):
        out.status["observedGeneration"] = generation
    for warning in plan_status.warnings:
        if warning not in ((status.get("plan") or {}).get("warnings") or []):
            out.events.append(("Warning", "PlanWarning", warning))
    return out

