"""The model cache in a reconcile: create the PVC and the download Job once, read how far the download is.

The PVC and the Job are applied only while they do not exist: a Job's pod template and most of a PVC's spec
are immutable, and a shared cache is never changed under the LLMDeployments that use it. Progress comes from
the Job's status and its pod (the last progress line of its log, the summary in its termination message),
which the operator may read already (pods list, pods/log get).
"""

from __future__ import annotations

from typing import Any, Protocol

from llm_autopilot.api.v1alpha1 import CachedAdapter, CacheStatus, LLMDeploymentSpec
from llm_autopilot.controller.kube import LogUnavailable
from llm_autopilot.desired.intent import cache_condition
from llm_autopilot.render import cache, lora_volumes
from llm_autopilot.render.kubernetes import with_hash

_LOG_LINES = 20
_LOG_BYTES = 16 * 1024


class CacheCluster(Protocol):
    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None: ...

    def job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]: ...

    def current_log(self, namespace: str, pod: str, container: str, *, tail_lines: int, limit_bytes: int) -> str:
        ...


def _termination_message(pod: dict[str, Any]) -> str:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        for state in ((status.get("state") or {}).get("terminated"), (status.get("lastState") or {}).get("terminated")):
            if state and state.get("message"):
                return str(state["message"])
    return ""


def _earlier_try(pod: dict[str, Any]) -> str:
    """The termination message of the try before the current one (a container restarted in place,
    ``restartPolicy: OnFailure``): kept once the Job succeeds, so a retried download still says why it retried."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        earlier = (status.get("lastState") or {}).get("terminated") or {}
        if earlier.get("message") and int(earlier.get("exitCode") or 0) != 0:
            return str(earlier["message"])
    return ""


def observe(kube: CacheCluster, inputs: cache.CacheInputs,
            previous: CacheStatus | None = None) -> tuple[list[dict[str, Any]], CacheStatus]:
    """The cache objects to create (those missing) and the download's status: the model's, and each s3:// LoRA
    adapter's (its own Job into the same PVC)."""
    namespace, claim = inputs.namespace, inputs.claim
    objects: list[dict[str, Any]] = []
    if kube.get("v1", "PersistentVolumeClaim", claim, namespace) is None:
        pvc = cache.pvc(inputs)
        if pvc is None:  # spec.model.cache.existingClaim: no Job can fill a claim that does not exist
            return [], CacheStatus(claim_name=claim, state="Failed",
                                   message=f"PersistentVolumeClaim {claim!r} (spec.model.cache.existingClaim) does not "
                                           f"exist in namespace {namespace}")
        objects.append(with_hash(pvc))
    jobs, status = _observe_model(kube, inputs, previous)
    status = status.model_copy(update={"folder": cache.model_folder(inputs.spec)})
    objects += jobs
    jobs, adapters = _observe_adapters(kube, inputs)
    return objects + jobs, status.model_copy(update={"adapters": adapters or None})


def _observe_adapters(kube: CacheCluster, inputs: cache.CacheInputs) -> tuple[list[dict[str, Any]],
                                                                               list[CachedAdapter]]:
    """Each s3:// adapter's download Job (created while missing) and its state, from the Job (and, while it has
    not succeeded, its newest pod's termination message: fetch's error line)."""
    objects: list[dict[str, Any]] = []
    found = []
    for adapter, job in lora_volumes.download_jobs(inputs):
        name = job["metadata"]["name"]
        base = CachedAdapter(name=adapter.name, source=adapter.location.uri,
                             folder=lora_volumes.cache_folder(inputs.spec, adapter), job_name=name, state="Pending")
        live = kube.get("batch/v1", "Job", name, inputs.namespace)
        if live is None:
            objects.append(with_hash(job))
            found.append(base)
            continue
        message = ""
        if not int((live.get("status") or {}).get("succeeded") or 0):
            pods = sorted(kube.job_pods(inputs.namespace, name),
                          key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))
            message = _termination_message(pods[-1]) if pods else ""
        seen = cache.cache_status(inputs.claim, live, "", message)
        found.append(base.model_copy(update={"state": seen.state, "message": seen.message[:500]}))
    return objects, found


def _observe_model(kube: CacheCluster, inputs: cache.CacheInputs,
                   previous: CacheStatus | None = None) -> tuple[list[dict[str, Any]], CacheStatus]:
    """The model's cache objects to create and its download's status.

    The pod of a finished Job is read once for its summary (the bytes): a status that already says Complete
    with its bytes is kept, so a cached deployment's resync reads no log.
    """
    namespace, claim = inputs.namespace, inputs.claim
    job = cache.job(inputs)
    job_name = job["metadata"]["name"]
    objects: list[dict[str, Any]] = []
    live = kube.get("batch/v1", "Job", job_name, namespace)
    if live is None:
        objects.append(with_hash(job))
        return objects, CacheStatus(claim_name=claim, state="Pending")
    succeeded = int((live.get("status") or {}).get("succeeded") or 0) > 0
    if (succeeded and previous is not None and previous.state == "Complete" and previous.total_bytes
            and previous.claim_name == claim and previous.folder == cache.model_folder(inputs.spec)):
        return objects, previous.model_copy(update={"adapters": None})
    log = message = earlier = ""
    pods = sorted(kube.job_pods(namespace, job_name),
                  key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))
    if pods:
        newest = pods[-1]
        message = _termination_message(newest)
        earlier = _earlier_try(newest)
        if not (succeeded and cache.has_summary(message)):  # a kubelet without termination files: the log says it
            try:
                log = kube.current_log(namespace, str(newest["metadata"]["name"]), "fetch",
                                       tail_lines=_LOG_LINES, limit_bytes=_LOG_BYTES)
            except LogUnavailable:
                log = ""
    return objects, cache.cache_status(claim, live, log, message, earlier_try=earlier)


def condition(status: CacheStatus) -> tuple[bool, str, str]:
    """ModelCached: (status, reason, message); desired/intent.py's cache_condition."""
    return cache_condition(status)


def enabled(spec: LLMDeploymentSpec) -> bool:
    return cache.enabled(spec)
