"""Admission: reject malformed or infeasible LLMDeployments at `kubectl apply` (owned extraArgs among them).

Uses the same models and planner as the reconciler, and the same model resolution without the Hub
(catalog, with any inline override merged on top). Models that need the Hub are not fetched here (a
webhook must answer within seconds): they are admitted with a warning and checked at reconcile time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from llm_autopilot.api import convert
from llm_autopilot.api.errors import validation_message
from llm_autopilot.api.kubernetes_rules import object_name_problem
from llm_autopilot.api.sources import PVCSource, S3Source, Source
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.catalog.gpus import UnknownGPUError, find_gpu
from llm_autopilot.desired.refusals import max_replicas_problem
from llm_autopilot.domain.gpu import GPUSpec
from llm_autopilot.hub.resolve import ModelResolutionError, resolve_offline
from llm_autopilot.planner.plan import Infeasible, Plan, PlanRequest
from llm_autopilot.planner.search import plan
from llm_autopilot.render.vllm_args import unknown_flags
from llm_autopilot.vllm.versions import VersionError, VLLMVersion, behaviour_of


@dataclass
class Verdict:
    allowed: bool
    message: str = ""
    warnings: list[str] = field(default_factory=list)


#: the GPU nodes' (labels, allocatable GPUs), read when the answer needs them (None: not known)
NodeSource = Callable[[], Iterable[tuple[Mapping[str, str], int]]]
#: the LoRA adapters' verdict (controller/adapters.py::admission_check): (refusal or None, warnings)
AdapterSource = Callable[[LLMDeploymentSpec], tuple[str | None, list[str]]]


def review(spec_body: dict[str, Any], default_vllm_version: str, *, name: str | None = None,
           nodes: NodeSource | None = None, adapters: AdapterSource | None = None) -> Verdict:
    """The webhook's answer for an LLMDeployment named ``name`` (the name is checked when given). With ``nodes``,
    a named GPU product is planned on its pool as the reconciler will, and spec.autoscaling.maxReplicas is
    checked against the replicas the pool holds. With ``adapters``, the LoRA adapters' configs are checked."""
    if name is not None and (problem := object_name_problem(name)) is not None:
        return Verdict(False, f"metadata.name: {problem}")
    try:
        spec = LLMDeploymentSpec.model_validate(spec_body)
    except ValidationError as exc:
        return Verdict(False, validation_message(exc))
    version = spec.vllm.version or default_vllm_version
    try:
        behaviour = behaviour_of(VLLMVersion.parse(version))
        unknown = unknown_flags(spec.vllm.extra_args, version)
    except VersionError as exc:
        return Verdict(False, f"spec.vllm.version: {exc}")
    if unknown:
        return Verdict(False, f"spec.vllm.extraArgs: vLLM {version} does not accept {', '.join(unknown)}")
    refused, warnings = adapters(spec) if adapters is not None and spec.lora is not None else (None, [])
    if refused is not None:
        return Verdict(False, refused)
    try:
        gpu = (GPUSpec.custom(spec.gpu.memory_gib, spec.gpu.compute_capability or "8.0")
               if spec.gpu.memory_gib is not None else find_gpu(spec.gpu.product) if spec.gpu.product else None)
    except UnknownGPUError as exc:
        return Verdict(False, f"spec.gpu.product: {exc}")
    if spec.gpu.memory_gib is not None and not spec.gpu.node_selector:
        warnings.append("spec.gpu.memoryGiB names no GPU product, so the pods may land on any node with "
                        "nvidia.com/gpu; set spec.gpu.nodeSelector to pin them to the GPUs you described")
    override = spec.model.architecture
    where = spec.model.location
    try:
        model = resolve_offline(spec.model.hub_repo or spec.model.name, revision=spec.model.revision,
                                override=override.as_hf_config() if override else None,
                                override_checkpoint_bytes=override.weight_bytes if override else None,
                                variants=convert.variants(spec), use_catalog=not isinstance(where, S3Source))
    except ModelResolutionError as exc:
        return Verdict(False, f"spec.model.architecture: {exc}")
    if model is None:
        warnings.append(_fetched_later(spec.model.name, where))
        return Verdict(True, warnings=warnings)
    if gpu is None:
        warnings.append("spec.gpu.product is not set: the operator plans on the cluster's GPU nodes")
        return Verdict(True, warnings=warnings)
    pools = convert.gpu_pools(spec, nodes()) if nodes is not None else []
    pool = pools[0] if pools and pools[0].nodes else None
    targets = convert.targets_for_pool(spec, pool) if pool is not None else convert.targets(spec)
    result = plan(PlanRequest(model, gpu, behaviour, targets))
    if isinstance(result, Infeasible):
        return Verdict(False, result.message)
    if spec.autoscaling is not None and pool is not None:
        refusal = max_replicas_problem(spec.autoscaling.max_replicas, result, pool)  # the reconcile's message
        if refusal is not None:
            return Verdict(False, refusal)
    warnings += list(result.warnings)
    warnings += _plan_notes(spec, result)
    return Verdict(True, warnings=warnings)


def _plan_notes(spec: LLMDeploymentSpec, result: Plan) -> list[str]:
    """What the apply-time answer is, where the spec left it to the planner."""
    notes = []
    if spec.serving.auto_max_model_len:
        notes.append(f"serving.maxModelLen auto: {result.config.max_model_len} on {result.summary}")
    if result.config.nodes > 1:
        notes.append(f"each replica spans {result.config.nodes} nodes ({result.summary}, tensor parallel "
                     f"{result.config.tensor_parallel_size} within a node, one pipeline stage per node)")
    return notes


def _fetched_later(name: str, where: Source) -> str:
    if isinstance(where, PVCSource):
        return (f"{name} is not in the built-in catalog: its config.json is read from {where.uri} by a short inspect "
                "Job when the operator reconciles it, and the plan checked then")
    if isinstance(where, S3Source):
        return (f"{name}: its config.json and safetensors index are read from {where.uri} and the plan checked "
                "when the operator reconciles it")
    return (f"{name} is not in the built-in catalog: its config is fetched and the plan checked when the "
            "operator reconciles it")
