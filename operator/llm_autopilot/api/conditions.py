"""Kubernetes ``metav1.Condition`` bookkeeping. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from llm_autopilot.api.status import Condition, ConditionStatus

PLANNED = "Planned"
READY = "Ready"
DEGRADED = "Degraded"


def set_condition(
    conditions: Sequence[Condition],
    type_: str,
    status: bool | None,
    reason: str,
    message: str,
    *,
    generation: int | None,
    now: str,
) -> tuple[Condition, ...]:
    """``conditions`` with ``type_`` set (a new value; the conditions given are not changed); lastTransitionTime
    moves only when status changes."""
    text: ConditionStatus = "Unknown" if status is None else ("True" if status else "False")
    for i, c in enumerate(conditions):
        if c.type == type_:
            moved = {"last_transition_time": now} if c.status != text else {}
            changed = c.model_copy(update={"status": text, "reason": reason, "message": message,
                                           "observed_generation": generation, **moved})
            return (*conditions[:i], changed, *conditions[i + 1:])
    return (*conditions, Condition(type=type_, status=text, reason=reason, message=message,
                                   last_transition_time=now, observed_generation=generation))


def get_condition(conditions: Iterable[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def without_condition(conditions: Iterable[Condition], type_: str) -> tuple[Condition, ...]:
    return tuple(c for c in conditions if c.type != type_)


def conditions_status(conditions: Iterable[Condition]) -> list[dict[str, Any]]:
    """status.conditions as written: the fields each condition was given (a condition read back keeps its form,
    so an unchanged one patches nothing)."""
    return [c.model_dump(by_alias=True, exclude_unset=True) for c in conditions]


def deployment_ready(deployment: dict[str, Any] | None, replicas: int) -> tuple[bool | None, str, str]:
    """Ready condition (status, reason, message) from a Deployment's status."""
    if deployment is None:
        return False, "NoWorkload", "the vLLM Deployment does not exist yet"
    status = deployment.get("status") or {}
    spec_gen, seen_gen = deployment.get("metadata", {}).get("generation"), status.get("observedGeneration")
    available = int(status.get("availableReplicas") or 0)
    updated = int(status.get("updatedReplicas") or 0)
    if replicas == 0:
        return True, "ScaledToZero", "replicas is 0"
    # The ReplicaSet could not create a pod (Pod Security, a quota, an admission webhook...): say why, because
    # the replica counts alone only show "0/1" forever.
    failure = next((c for c in status.get("conditions") or []
                    if c.get("type") == "ReplicaFailure" and c.get("status") == "True"), None)
    if failure is not None:
        message = f"the ReplicaSet cannot create pods: {failure.get('message') or 'no reason given'}"
        return False, str(failure.get("reason") or "ReplicaFailure"), message[:1000]
    if seen_gen is not None and spec_gen is not None and seen_gen < spec_gen:
        return False, "Progressing", "the Deployment controller has not seen the latest spec yet"
    if updated < replicas:
        return False, "RollingOut", f"{updated}/{replicas} replicas run the current plan"
    if available < replicas:
        return False, "Unavailable", f"{available}/{replicas} replicas are available"
    return True, "Available", f"{available}/{replicas} replicas are available"
