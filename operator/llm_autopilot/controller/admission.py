"""Admission: reject malformed or infeasible LLMDeployments at `kubectl apply`, warn on risky extraArgs.

Uses the same models and planner as the reconciler. Models outside the catalog are not fetched here
(a webhook must answer within seconds): they are admitted with a warning and checked at reconcile time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from llm_autopilot.api import convert
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.catalog.gpus import UnknownGPUError, find_gpu
from llm_autopilot.catalog.hf_config import ModelConfigError, parse_hf_config
from llm_autopilot.catalog.models import find_catalog_model
from llm_autopilot.controller.reconcile import format_validation_error
from llm_autopilot.domain.architecture import ModelArchitecture
from llm_autopilot.domain.gpu import GPUSpec
from llm_autopilot.planner.plan import Infeasible, PlanRequest
from llm_autopilot.planner.search import plan
from llm_autopilot.render.vllm_args import conflicting_extra_args, unknown_flags
from llm_autopilot.vllm.versions import VersionError, VLLMVersion, behaviour_of


@dataclass
class Verdict:
    allowed: bool
    message: str = ""
    warnings: list[str] = field(default_factory=list)


def _known_model(spec: LLMDeploymentSpec) -> ModelArchitecture | None:
    override = spec.model.architecture
    model_id = spec.model.name.removeprefix("hf://")
    base = find_catalog_model(model_id) if spec.model.revision is None else None
    if override is None:
        return base
    if base is not None:
        return None  # an override on a catalog model: checked at reconcile time against the merged config
    try:
        return parse_hf_config(override.as_hf_config(), model_id)
    except ModelConfigError:
        return None


def review(spec_body: dict[str, Any], default_vllm_version: str) -> Verdict:
    try:
        spec = LLMDeploymentSpec.model_validate(spec_body)
    except ValidationError as exc:
        return Verdict(False, format_validation_error(exc))
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
    model = _known_model(spec)
    if model is None:
        warnings.append(f"{spec.model.name} is not in the built-in catalog: its config is fetched and the plan "
                        "checked when the operator reconciles it")
        return Verdict(True, warnings=warnings)
    if gpu is None:
        warnings.append("spec.gpu.product is not set: the operator plans on the cluster's GPU nodes")
        return Verdict(True, warnings=warnings)
    model = ModelArchitecture(**{**model.__dict__, "variants": {**model.variants, **convert.variants(spec)}})
    result = plan(PlanRequest(model, gpu, behaviour, convert.targets(spec)))
    if isinstance(result, Infeasible):
        return Verdict(False, result.message)
    warnings += list(result.warnings)
    return Verdict(True, warnings=warnings)
