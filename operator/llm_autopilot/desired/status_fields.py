"""The status's fields, each with the type a section decides it as: ``Draft.put(PLAN, plan_status)`` takes only a
PlanStatus, so no section writes a dict through a string key, and the Draft keeps the status as decided typed
(an LLMDeploymentStatus) beside its written form. Pure; below the vocabulary."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from llm_autopilot.api.conditions import conditions_status
from llm_autopilot.api.status import (
    Condition,
    KVCalibrationStatus,
    LLMDeploymentStatus,
    LoRASourceStatus,
    LoRAStatus,
    PlanStatus,
    ReleaseVerification,
    SourceStatus,
    VerificationStatus,
)
from llm_autopilot.api.v1alpha1 import CacheStatus, CompileCacheStatus
from llm_autopilot.remediation.state import RemediationState

T = TypeVar("T")


def _wire(value: Any) -> Any:
    """A decided value as the status holds it: camelCase, JSON types, no nulls (a null is an absent field)."""
    if isinstance(value, BaseModel):
        return value.model_dump(by_alias=True, exclude_none=True, mode="json")
    if isinstance(value, tuple | list):
        return [_wire(v) for v in value]
    return value


@dataclass(frozen=True)
class StatusField(Generic[T]):
    """One field of LLMDeploymentStatus, typed: ``Draft.put`` takes only its type, so no section writes a dict
    through a string key. ``name``: the model's field; ``wire``: how its value is written."""

    name: str
    wire: Callable[[T], Any] = _wire

    @property
    def key(self) -> str:
        alias = LLMDeploymentStatus.model_fields[self.name].alias
        return alias or self.name


#: the central sections' fields; an after-plan feature declares its own beside its words (desired/burn_in.py)
PLAN = StatusField[PlanStatus]("plan")
REPLICAS = StatusField[int]("replicas")
READY_REPLICAS = StatusField[int]("ready_replicas")
SELECTOR = StatusField[str]("selector")
SOURCE = StatusField[SourceStatus]("source")
LORA_SOURCES = StatusField[list[LoRASourceStatus]]("lora_sources")
CACHE = StatusField[CacheStatus]("cache")
COMPILE_CACHE = StatusField[CompileCacheStatus]("compile_cache")
VERIFICATION = StatusField[VerificationStatus]("verification")
RELEASES = StatusField[tuple[ReleaseVerification, ...]]("releases")
KV_CALIBRATION = StatusField[KVCalibrationStatus]("kv_calibration")
LORA = StatusField[LoRAStatus]("lora")
CONDITIONS = StatusField[list[Condition]]("conditions", conditions_status)
OBSERVED_GENERATION = StatusField[int]("observed_generation")
#: written as remediation/state.py writes it (the step recorded first is the same document)
REMEDIATION = StatusField[RemediationState]("remediation", RemediationState.to_status)
