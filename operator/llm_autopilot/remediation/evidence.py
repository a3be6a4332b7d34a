"""Failure evidence from pod statuses (what the kubelet wrote) and previous logs, and overrides -> planner
targets. Pure: the shell reads the pods and the log, these functions decide what they say.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from llm_autopilot.domain.knobs import KNOBS
from llm_autopilot.domain.precision import KVCacheDtype
from llm_autopilot.planner.plan import Targets
from llm_autopilot.remediation.classify import TERMINATION_MESSAGE, Classification, classify_termination
from llm_autopilot.remediation.ladder import Overrides
from llm_autopilot.remediation.text import clean_line

#: what the shell asks the API server for: the previous container's last lines. limitBytes counts from the
#: start of the tail window, so the lines must fit in it with room to spare (512 bytes a line) or the end of
#: the log -- where vLLM's error is -- would be cut off.
LOG_TAIL_LINES = 500
LOG_LIMIT_BYTES = 256 * 1024


@dataclass(frozen=True)
class Termination:
    """One termination of the vLLM container, as the kubelet recorded it in the pod status."""

    pod: str
    restart_count: int
    reason: str | None
    exit_code: int | None
    message: str | None
    finished_at: str

    @property
    def key(self) -> str:
        """Identifies this failure, so a restarted operator never acts on it (or reads its log) twice."""
        return f"{self.pod}/{self.restart_count}/{self.finished_at}"

    @property
    def needs_log(self) -> bool:
        """An error exit whose cause the log may hold; an OOM kill or a clean exit says all in the status."""
        return self.reason != "OOMKilled" and self.exit_code not in (None, 0)


@dataclass(frozen=True)
class LogRead:
    """What reading the previous container's log gave: its text, or why it could not be read."""

    text: str | None = None
    unavailable: str | None = None


@dataclass(frozen=True)
class Crash:
    classification: Classification
    key: str
    pod: str
    observed_at: str


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def latest_termination(pods: list[dict[str, Any]], *, container: str, plan_hash: str,
                       plan_hash_annotation: str) -> Termination | None:
    """The newest termination of ``container`` in pods running the current plan."""
    found: list[Termination] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (meta.get("annotations") or {}).get(plan_hash_annotation) != plan_hash:
            continue  # an older plan's pod: its failure is not about what runs now
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if cs.get("name") != container:
                continue
            terminated = (cs.get("lastState") or {}).get("terminated") or (cs.get("state") or {}).get("terminated")
            if not terminated:
                continue
            message = terminated.get("message")
            found.append(Termination(
                pod=str(meta.get("name")), restart_count=_int(cs.get("restartCount")) or 0,
                reason=terminated.get("reason"), exit_code=_int(terminated.get("exitCode")),
                message=message if isinstance(message, str) else None,
                finished_at=str(terminated.get("finishedAt") or terminated.get("startedAt") or "")))
    return max(found, key=lambda t: t.finished_at) if found else None


def log_source(tail_lines: int = LOG_TAIL_LINES) -> str:
    return f"previous container log (pods/log?previous=true, last {tail_lines} lines)"


def classify_crash(t: Termination, log: LogRead | None = None) -> Crash:
    """Classify on the previous log when it was read, else on the termination message (saying why).

    The termination message is the log's own tail, so the log normally says more; should the log miss a memory
    failure the message shows (another container instance's log, a cut-off read), the message counts.
    """
    if log is not None and log.text is not None and not log.text.strip():
        log = LogRead(unavailable="the previous log is empty")
    if log is not None and log.text is not None:
        c = classify_termination(t.reason, t.exit_code, log.text, source=log_source())
        if not c.signal.is_memory and t.message:
            from_message = classify_termination(t.reason, t.exit_code, t.message, source=(
                f"{TERMINATION_MESSAGE}; the previous log showed no memory failure"))
            c = from_message if from_message.signal.is_memory else c
    else:
        if not t.needs_log:
            source = "pod status (lastState.terminated)" + ("" if not t.message else f" and {TERMINATION_MESSAGE}")
        else:
            source = TERMINATION_MESSAGE + (f"; previous log unavailable: {clean_line(log.unavailable, 160)}"
                                            if log is not None and log.unavailable else "")
        c = classify_termination(t.reason, t.exit_code, t.message, source=source)
    evidence = {**c.evidence, "pod": t.pod, "restartCount": str(t.restart_count), "finishedAt": t.finished_at}
    return Crash(dataclasses.replace(c, evidence=evidence), t.key, t.pod, t.finished_at)


def latest_crash(pods: list[dict[str, Any]], *, container: str, plan_hash: str,
                 plan_hash_annotation: str) -> Crash | None:
    """The newest termination of the current plan, classified on its termination message alone."""
    t = latest_termination(pods, container=container, plan_hash=plan_hash, plan_hash_annotation=plan_hash_annotation)
    return classify_crash(t) if t is not None else None


def rollout_complete(deployment: dict[str, Any] | None, *, plan_hash: str, plan_hash_annotation: str,
                     replicas: int) -> bool:
    """The Deployment runs the current plan: its template has it, the controller saw it, every replica updated."""
    if deployment is None:
        return False
    template = ((deployment.get("spec") or {}).get("template") or {}).get("metadata") or {}
    if (template.get("annotations") or {}).get(plan_hash_annotation) != plan_hash:
        return False
    status = deployment.get("status") or {}
    generation = _int((deployment.get("metadata") or {}).get("generation")) or 0
    return (_int(status.get("updatedReplicas")) or 0) >= replicas and (
        _int(status.get("observedGeneration")) or 0) >= generation


def apply_overrides(targets: Targets, o: Overrides, *, floor_max_model_len: int) -> Targets:
    """Planner targets with remediation's overrides on top (they only ever make the plan safer).

    A capped max_model_len never takes the planner's minimum below ``floor_max_model_len``: whatever a log
    said, the service keeps the context the spec asked to keep.
    """
    changes: dict[str, Any] = {}
    if o.max_model_len is not None:
        desired = max(min(targets.max_model_len or o.max_model_len, o.max_model_len), floor_max_model_len)
        changes["max_model_len"] = desired
        changes["min_max_model_len"] = max(min(targets.min_max_model_len or desired, desired),
                                           min(floor_max_model_len, desired))
    for knob in KNOBS:  # the knobs that set a planner target as they are (the table says which)
        value = getattr(o, knob.field)
        if knob.target is not None and value is not None and value is not False:
            changes[knob.target] = value
    if o.fp8_kv_cache:
        changes["allowed_kv_cache_dtypes"] = (KVCacheDtype.FP8,)
    if o.max_loras is not None and targets.lora is not None:
        changes["lora"] = dataclasses.replace(targets.lora, max_loras=max(o.max_loras, targets.lora_min_slots, 1))
    return dataclasses.replace(targets, **changes)
