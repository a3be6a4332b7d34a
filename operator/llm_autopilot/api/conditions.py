"""Kubernetes ``metav1.Condition`` bookkeeping. Pure."""

from __future__ import annotations

from typing import Any

PLANNED = "Planned"
READY = "Ready"
DEGRADED = "Degraded"


def set_condition(
    conditions: list[dict[str, Any]] | None,
    type_: str,
    status: bool | None,
    reason: str,
    message: str,
    *,
    generation: int | None,
    now: str,
) -> list[dict[str, Any]]:
    """A copy of ``conditions`` with ``type_`` set; lastTransitionTime moves only when status changes."""
    text = "Unknown" if status is None else ("True" if status else "False")
    result = [dict(c) for c in conditions or []]
    for c in result:
        if c.get("type") == type_:
            if c.get("status") != text:
                c["lastTransitionTime"] = now
            c.update(status=text, reason=reason, message=message, observedGeneration=generation)
            return result
    result.append({"type": type_, "status": text, "reason": reason, "message": message,
                   "lastTransitionTime": now, "observedGeneration": generation})
    return result


def get_condition(conditions: list[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)


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
