"""Admission: reject malformed or infeasible LLMDeployments at `kubectl apply`, warn on risky extraArgs.

Uses the same models and planner as the reconciler, and the same model resolution without the Hub
(catalog, with any inline override merged on top). Models that need the Hub are not fetched here (a
webhook must answer within seconds): they are admitted with a warning and checked at reconcile time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from llm_autopilot.api import convert
from llm_autopilot.api.errors import validation_message
from llm_autopilot.api.kubernetes_rules import object_name_problem
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.catalog.gpus import UnknownGPUError, find_gpu
from llm_autopilot.domain.gpu import GPUSpec
from llm_autopilot.hub.resolve import ModelResolutionError, resolve_offline
from llm_autopilot.planner.plan import Infeasible, PlanRequest
from llm_autopilot.planner.search import plan
from llm_autopilot.render.vllm_args import conflicting_extra_args, unknown_flags
from llm_autopilot.vllm.versions import VersionError, VLLMVersion, behaviour_of


@dataclass
class Verdict:
    allowed: bool
    message: str = ""
    warnings: list[str] = field(default_factory=list)


def review(spec_body: dict[str, Any], default_vllm_version: str, *, name: str | None = None) -> Verdict:
    """The webhook's answer for an LLMDeployment named ``name`` (the name is checked when given)."""
    if name is not None and (problem := object_name_problem(name)) is not None:
        return Verdict(False, f"metadata.name: {problem}")
    try:
        spec = LLMDeploymentSpec.model_validate(spec_body)
    except ValidationError as exc:
        return Verdict(False, validation_message(exc))
    warnings = []
    conflicts = conflicting_extra_args(spec.vllm.extra_args)
    if conflicts:
        warnings.append(f"extraArgs set {', '.join(conflicts)}, which the planner decides; they override the plan "
                        "and can make vLLM run out of memory")
    version = spec.vllm.version or default_vllm_version
    try:
        behaviour = behaviour_of(VLLMVersion.parse(version))
        unknown = unknown_flags(spec.vllm.extra_args, version)
    except VersionError as exc:
        return Verdict(False, f"spec.vllm.version: {exc}")
    if unknown:
        return Verdict(False, f"spec.vllm.extraArgs: vLLM {version} does not accept {', '.join(unknown)}")
    try:
        gpu = (GPUSpec.custom(spec.gpu.memory_gib, spec.gpu.compute_capability or "8.0")
               if spec.gpu.memory_gib is not None else find_gpu(spec.gpu.product) if spec.gpu.product else None)
    except UnknownGPUError as exc:
        return Verdict(False, f"spec.gpu.product: {exc}")
    if spec.gpu.memory_gib is not None and not spec.gpu.node_selector:
        warnings.append("spec.gpu.memoryGiB names no GPU product, so the pods may land on any node with "
                        "nvidia.com/gpu; set spec.gpu.nodeSelector to pin them to the GPUs you described")
    override = spec.model.architecture
    try:
        model = resolve_offline(spec.model.name, revision=spec.model.revision,
                                override=override.as_hf_config() if override else None,
                                override_checkpoint_bytes=override.weight_bytes if override else None,
                                variants=convert.variants(spec))
    except ModelResolutionError as exc:
        return Verdict(False, f"spec.model.architecture: {exc}")
    if model is None:
        warnings.append(f"{spec.model.name} is not in the built-in catalog: its config is fetched and the plan "
                        "checked when the operator reconciles it")
        return Verdict(True, warnings=warnings)
    if gpu is None:
        warnings.append("spec.gpu.product is not set: the operator plans on the cluster's GPU nodes")
        return Verdict(True, warnings=warnings)
    result = plan(PlanRequest(model, gpu, behaviour, convert.targets(spec)))
    if isinstance(result, Infeasible):
        return Verdict(False, result.message)
    warnings += list(result.warnings)
    return Verdict(True, warnings=warnings)
