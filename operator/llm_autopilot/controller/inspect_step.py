"""A pvc:// source in a reconcile: read config.json and the weights' size from the volume, with an inspect Job.

Needed only when neither the catalog nor spec.model.architecture describes the model. The claim must exist
(else ``SourceNotFound``, and no Job); then one Job per (source, claim uid) runs ``llm-autopilot
inspect-volume`` (render/inspect.py), and its pod's termination message is parsed strictly
(api/inspection.py). While it runs, ``InspectingSource``; when it fails or reports garbage, ``SourceUnreadable``
naming the claim and the path. Nothing but the Job is applied before the volume was read. The result is kept
in ``status.source`` (with the claim's uid), so a volume is inspected once, and again when the source or the
claim changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import ValidationError

from llm_autopilot.api.inspection import InspectionFailure, ReportError, parse_adapter_report, parse_report
from llm_autopilot.api.lora import AdapterConfig
from llm_autopilot.api.sources import PVCSource
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec, LoRASourceStatus, SourceStatus
from llm_autopilot.desired.intent import INSPECTING
from llm_autopilot.hub.client import ModelFiles
from llm_autopilot.hub.resolve import ModelResolutionError, resolve_offline
from llm_autopilot.render import inspect
from llm_autopilot.render.kubernetes import Owner, with_hash

NOT_FOUND, UNREADABLE = "SourceNotFound", "SourceUnreadable"
#: seconds between reconciles: while the Job runs, and after a failure (a claim may be created, a Job expires)
POLL_SECONDS = 3.0
RETRY_SECONDS = 30.0


__all__ = ["INSPECTING", "NOT_FOUND", "UNREADABLE", "AdapterInspections", "Inspection", "needed", "observe",
           "observe_adapters", "observe_spec"]


class InspectCluster(Protocol):
    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None: ...

    def job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class Inspection:
    """What the reconcile does with the source: plan on ``files``, or report ``failure`` (reason, message)."""

    status: SourceStatus | None
    files: ModelFiles | None = None
    objects: list[dict[str, Any]] = field(default_factory=list)
    failure: tuple[str, str] | None = None
    retry_delay: float = RETRY_SECONDS


def needed(spec: LLMDeploymentSpec) -> PVCSource | None:
    """The pvc:// source to inspect: one the catalog and spec.model.architecture do not describe (an invalid
    override is the resolver's to report)."""
    where = spec.model.location
    if not isinstance(where, PVCSource):
        return None
    override = spec.model.architecture
    try:
        known = resolve_offline(spec.model.name, override=override.as_hf_config() if override else None,
                                override_checkpoint_bytes=override.weight_bytes if override else None)
    except ModelResolutionError:
        return None
    return None if known is not None else where


def observe_spec(kube: InspectCluster, owner: Owner, spec: LLMDeploymentSpec, image: str,
                 recorded_raw: Any) -> Inspection | None:
    """The inspection of the spec's source, or None when none is needed."""
    source = needed(spec)
    return observe(kube, owner, spec, source, image, recorded_raw) if source is not None else None


def recorded_source(raw: Any) -> SourceStatus | None:
    """status.source as the operator wrote it; None for anything else."""
    try:
        return SourceStatus.model_validate(raw) if isinstance(raw, dict) else None
    except ValidationError:
        return None  # a status written by hand is inspected again, never trusted


def _container_status(pod: dict[str, Any]) -> dict[str, Any]:
    return next((s for s in (pod.get("status") or {}).get("containerStatuses") or []
                 if s.get("name") == inspect.CONTAINER), {})


def _termination_message(pod: dict[str, Any]) -> str:
    terminated = (_container_status(pod).get("state") or {}).get("terminated") or {}
    return str(terminated.get("message") or "")


def _waiting(pod: dict[str, Any] | None) -> str:
    """Why the Job's pod is not running yet (an unbound claim, an unschedulable pod), if it says."""
    if pod is None:
        return ""
    waiting = (_container_status(pod).get("state") or {}).get("waiting") or {}
    if waiting.get("message"):
        return f"{waiting.get('reason', 'Waiting')}: {waiting['message']}"
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"{condition.get('reason', 'Unschedulable')}: {condition.get('message', '')}"
    return ""


def _finished(job: dict[str, Any]) -> str | None:
    """'Complete', 'Failed' (with the Job's reason) or None while it runs."""
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in ("Complete", "Failed"):
            return str(condition["type"]) if condition["type"] == "Complete" else \
                f"Failed ({condition.get('reason') or 'no reason'}: {condition.get('message') or ''})".strip()
    if int(status.get("succeeded") or 0):
        return "Complete"
    return None


def _newest_pod(kube: InspectCluster, namespace: str, job: str) -> dict[str, Any] | None:
    """The Job's newest pod (None: it has none yet)."""
    pods = sorted(kube.job_pods(namespace, job),
                  key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))
    return pods[-1] if pods else None


def _again(job: str, namespace: str) -> str:
    return (f"it is inspected again {inspect.TTL_SECONDS} s after Job {job} finished (at once after "
            f"`kubectl delete job {job} -n {namespace}`)")


def _report_problem(job: str, finished: str, exc: ReportError) -> str:
    return f"Job {job} {finished}: {exc}" if finished != "Complete" else f"Job {job}: {exc}"


def _clip(text: str, limit: int = 600) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def observe(kube: InspectCluster, owner: Owner, spec: LLMDeploymentSpec, source: PVCSource, image: str,
            recorded_raw: Any) -> Inspection:
    namespace, where = owner.namespace, f"{source.uri} (claim {source.claim!r}, path {inspect.folder(source)!r})"
    claim = kube.get("v1", "PersistentVolumeClaim", source.claim, namespace)
    if claim is None:
        return Inspection(None, failure=(NOT_FOUND, (
            f"PersistentVolumeClaim {source.claim!r} of spec.model.source {source.uri} does not exist in namespace "
            f"{namespace}: create it with the model's folder ({source.path or 'its root'}) on it, or correct "
            "spec.model.source; nothing is deployed until the operator has read config.json there")))
    claim_uid = str((claim.get("metadata") or {}).get("uid") or "")
    recorded = recorded_source(recorded_raw)
    if (recorded is not None and recorded.uri == source.uri and recorded.claim_uid == claim_uid
            and recorded.state == "Inspected" and recorded.config is not None):
        return Inspection(recorded, files=ModelFiles(dict(recorded.config), recorded.checkpoint_bytes))
    name = inspect.job_name(owner, source, claim_uid)
    base = SourceStatus(uri=source.uri, claim_uid=claim_uid, state="Inspecting", job_name=name)
    live = kube.get("batch/v1", "Job", name, namespace)
    if live is None:
        return Inspection(base, objects=[with_hash(inspect.job(owner, spec, source, claim_uid, image))],
                          failure=(INSPECTING, f"reading config.json from {where} with Job {name}; nothing is "
                                               "deployed before it is read"), retry_delay=POLL_SECONDS)
    newest = _newest_pod(kube, namespace, name)
    finished = _finished(live)
    if finished is None:
        waiting = _waiting(newest)
        return Inspection(base, failure=(INSPECTING, f"reading config.json from {where} with Job {name}"
                                                     + (f"; its pod: {_clip(waiting, 300)}" if waiting else "")),
                          retry_delay=POLL_SECONDS)
    again = _again(name, namespace)
    message = _termination_message(newest) if newest is not None else ""
    try:
        report = parse_report(message)
    except ReportError as exc:
        problem = _report_problem(name, finished, exc)
        return _failed(base, f"cannot read {where}: {_clip(problem)}; {again}")
    if isinstance(report, InspectionFailure):
        return _failed(base, f"{where}: {_clip(report.error)}; fix the volume or spec.model.source: {again}")
    if finished != "Complete":
        return _failed(base, f"cannot read {where}: Job {name} {finished} with a successful report; "
                             f"{again}")
    status = base.model_copy(update={"state": "Inspected", "config": report.config,
                                     "checkpoint_bytes": report.checkpoint_bytes,
                                     "weight_files": report.weight_files, "files": report.files})
    return Inspection(status, files=ModelFiles(dict(report.config), report.checkpoint_bytes))


def _failed(base: SourceStatus, message: str) -> Inspection:
    return Inspection(base.model_copy(update={"state": "Failed", "message": message}),
                      failure=(UNREADABLE, message))


# --- pvc:// LoRA adapters: their adapter_config.json, read by the same kind of Job -------------------------

@dataclass(frozen=True)
class AdapterInspections:
    """The pvc:// adapters' inspections: the configs read (by adapter name), status.loraSources, the inspect Jobs
    to apply, and while one is not read yet (or cannot be), the failure (reason, message) that stops the plan."""

    configs: dict[str, AdapterConfig]
    statuses: tuple[LoRASourceStatus, ...]
    objects: tuple[dict[str, Any], ...] = ()
    failure: tuple[str, str] | None = None
    retry_delay: float = RETRY_SECONDS


def recorded_adapters(raw: Any) -> dict[str, LoRASourceStatus]:
    """status.loraSources as the operator wrote it, by adapter name; an entry of another shape is read again."""
    found = {}
    for item in raw if isinstance(raw, list) else []:
        try:
            entry = LoRASourceStatus.model_validate(item)
        except ValidationError:
            continue
        found[entry.name] = entry
    return found


def observe_adapters(kube: InspectCluster, owner: Owner, spec: LLMDeploymentSpec, image: str,
                     recorded_raw: Any) -> AdapterInspections | None:
    """Each pvc:// adapter's adapter_config.json as its inspect Job read it (once per source and claim uid:
    kept in status.loraSources); None without pvc:// adapters."""
    adapters = [(i, a) for i, a in enumerate(spec.lora.adapters if spec.lora else [])
                if isinstance(a.location, PVCSource)]
    if not adapters:
        return None
    recorded = recorded_adapters(recorded_raw)
    configs: dict[str, AdapterConfig] = {}
    statuses: list[LoRASourceStatus] = []
    objects: list[dict[str, Any]] = []
    failures: list[tuple[str, str]] = []
    for i, adapter in adapters:
        found = _observe_adapter(kube, owner, spec, i, adapter.name, image, recorded.get(adapter.name))
        if found.status is not None:
            statuses.append(found.status)
        if found.config is not None:
            configs[adapter.name] = found.config
        objects += found.objects
        if found.failure is not None:
            failures.append(found.failure)
    failure = None
    if failures:  # a claim or a folder to fix says more than a Job still running
        worst = [f for f in failures if f[0] != INSPECTING] or failures
        failure = (worst[0][0], "; ".join(message for _, message in worst))
    delay = POLL_SECONDS if failure is not None and failure[0] == INSPECTING else RETRY_SECONDS
    return AdapterInspections(configs, tuple(statuses), tuple(objects), failure, delay)


@dataclass(frozen=True)
class _AdapterFound:
    status: LoRASourceStatus | None
    config: AdapterConfig | None = None
    objects: tuple[dict[str, Any], ...] = ()
    failure: tuple[str, str] | None = None


def _observe_adapter(kube: InspectCluster, owner: Owner, spec: LLMDeploymentSpec, index: int, name: str,
                     image: str, recorded: LoRASourceStatus | None) -> _AdapterFound:
    adapter = spec.lora.adapters[index] if spec.lora else None
    assert adapter is not None and isinstance(adapter.location, PVCSource)
    source, namespace = adapter.location, owner.namespace
    field_ = f"spec.lora.adapters[{index}] ({name})"
    where = f"{source.uri} (claim {source.claim!r}, path {inspect.folder(source)!r})"
    claim = kube.get("v1", "PersistentVolumeClaim", source.claim, namespace)
    if claim is None:
        return _AdapterFound(None, failure=(NOT_FOUND, (
            f"{field_}: PersistentVolumeClaim {source.claim!r} of {source.uri} does not exist in namespace "
            f"{namespace} (the pods mount claims of their own namespace only): create it there with the adapter's "
            f"folder ({source.path or 'its root'}) on it, or correct the source; nothing is deployed until the "
            "operator has read its adapter_config.json")))
    claim_uid = str((claim.get("metadata") or {}).get("uid") or "")
    if (recorded is not None and recorded.uri == source.uri and recorded.claim_uid == claim_uid
            and recorded.state == "Inspected"):
        return _AdapterFound(recorded, config=AdapterConfig(recorded.rank, recorded.base_model))
    job_name = inspect.adapter_job_name(owner, source, claim_uid)
    base = LoRASourceStatus(name=name, uri=source.uri, claim_uid=claim_uid, state="Inspecting", job_name=job_name)
    live = kube.get("batch/v1", "Job", job_name, namespace)
    if live is None:
        job = with_hash(inspect.adapter_job(owner, spec, name, source, claim_uid, image))
        return _AdapterFound(base, objects=(job,), failure=(INSPECTING, (
            f"{field_}: reading adapter_config.json from {where} with Job {job_name}; nothing is deployed before "
            "it is read")))
    newest = _newest_pod(kube, namespace, job_name)
    finished = _finished(live)
    if finished is None:
        waiting = _waiting(newest)
        return _AdapterFound(base, failure=(INSPECTING, f"{field_}: reading adapter_config.json from {where} with "
                                            f"Job {job_name}" + (f"; its pod: {_clip(waiting, 300)}" if waiting
                                                                 else "")))
    again = _again(job_name, namespace)
    message = _termination_message(newest) if newest is not None else ""
    try:
        report = parse_adapter_report(message)
    except ReportError as exc:
        problem = _report_problem(job_name, finished, exc)
        return _adapter_failed(base, f"{field_}: cannot read {where}: {_clip(problem)}; {again}")
    if isinstance(report, InspectionFailure):
        return _adapter_failed(base, f"{field_}: {where}: {_clip(report.error)}; fix the volume or the adapter's "
                                     f"source: {again}")
    if finished != "Complete":
        return _adapter_failed(base, f"{field_}: cannot read {where}: Job {job_name} {finished} with a successful "
                                     f"report; {again}")
    status = base.model_copy(update={"state": "Inspected", "rank": report.rank,
                                     "base_model": (report.base_model or "")[:256] or None})
    return _AdapterFound(status, config=AdapterConfig(status.rank, status.base_model))


def _adapter_failed(base: LoRASourceStatus, message: str) -> _AdapterFound:
    return _AdapterFound(base.model_copy(update={"state": "Failed", "message": message[:1000]}),
                         failure=(UNREADABLE, message))
