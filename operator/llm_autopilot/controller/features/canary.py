"""The canary's shell (spec.rollout.canary): its reader -- the ``<name>-canary`` Deployment and its newest pod --
and its executor: the canary deleted once no longer wanted. Its decision is desired/canary.py's."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from llm_autopilot.controller.observed import containers_ready
from llm_autopilot.controller.pod_reads import PodSource
from llm_autopilot.desired.canary import CanaryAsk, CanaryDelete, CanaryPod, CanaryReading
from llm_autopilot.render.canary import CANARY_LABEL, canary_name
from llm_autopilot.render.kubernetes import CONTAINER, instance_selector

if TYPE_CHECKING:
    from llm_autopilot.controller.reconcile import Reconciler


def canary_pod(pods: PodSource, namespace: str, name: str, now: datetime) -> CanaryPod | None:
    """The canary's newest pod not being deleted (None: none): of the object's pods (the pod watch is indexed by
    the instance label alone), the one with the canary label."""
    found = [p for p in pods.pods(namespace, instance_selector(name))
             if ((p.get("metadata") or {}).get("labels") or {}).get(CANARY_LABEL) == "true"
             and not (p.get("metadata") or {}).get("deletionTimestamp")]
    if not found:
        return None
    pod = max(found, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))
    meta = pod.get("metadata") or {}
    vllm: dict[str, Any] = next((cs for cs in (pod.get("status") or {}).get("containerStatuses") or []
                                 if cs.get("name") == CONTAINER), {})
    return CanaryPod(name=str(meta.get("name")), ready=containers_ready(pod),
                     age_seconds=_age(meta.get("creationTimestamp"), now),
                     restarts=int(vllm.get("restartCount") or 0),
                     waiting_reason=((vllm.get("state") or {}).get("waiting") or {}).get("reason"))


def _age(created: Any, now: datetime) -> float:
    """Seconds since ``created`` (an RFC 3339 time; 0 when unreadable: a pod is not failed for a missing time)."""
    try:
        at = created if isinstance(created, datetime) else datetime.fromisoformat(str(created))
    except ValueError:
        return 0.0
    at = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    return max(0.0, (now - at).total_seconds())


def _read(r: Reconciler, ask: CanaryAsk) -> CanaryReading:
    """The canary's Deployment (only one this LLMDeployment owns) and its newest pod, and the fleet's pod template
    as it runs. Both Deployments whole from the API server (the watches keep summaries): asked only while a release
    change is judged."""
    fleet = r.kube.get_whole("apps/v1", "Deployment", ask.name, ask.namespace)
    template = ((fleet or {}).get("spec") or {}).get("template")
    live = r.kube.get_whole("apps/v1", "Deployment", canary_name(ask.name), ask.namespace)
    meta = (live or {}).get("metadata") or {}
    owned = any(ref.get("uid") == r.owner.uid and ref.get("controller") for ref in meta.get("ownerReferences") or [])
    if live is None or not owned or not meta.get("uid"):
        return CanaryReading(None, fleet_template=template)
    return CanaryReading(str(meta["uid"]), canary_pod(r.kube, ask.namespace, ask.name, r.now),
                         fleet_template=template)


def _delete(r: Reconciler, delete: CanaryDelete) -> None:
    """The canary no longer wanted (one made again meanwhile is left alone: the uid's precondition)."""
    if r.kube.delete("apps/v1", "Deployment", delete.name, r.owner.namespace, uid=delete.uid):
        r.writes += 1


READERS: dict[type, Callable[[Reconciler, Any], object]] = {CanaryAsk: _read}
EXECUTORS: dict[type, Callable[[Reconciler, Any], None]] = {CanaryDelete: _delete}
