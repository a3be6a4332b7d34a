"""Each remediation step's recovery: how long from the step until a pod of its plan was Ready, and whether the
model served all along. Pure: the shell reads the pods (remediation/evidence.py's ``pod_readiness`` says what a
pod shows), this module decides what the history records.

- From: the step's recorded ``time``, when the operator acted on the evidence (the evidence's own times, such as
  a crash's ``finishedAt``, stay in ``evidence``; a signal held back by the cooldown counts from the step).
- To: the Ready condition's ``lastTransitionTime`` of the first pod of the step's plan (its plan hash) that became
  Ready at or after the step, as the pod says it, never the moment the operator happened to look. Recorded once:
  an entry with ``recoveredSeconds`` (or ``superseded``) is never looked at again, so a restarted operator records
  nothing twice.
- Superseded: a later entry (a step or a relax) or a plan in force other than the step's (the spec changed)
  before a pod of its plan was Ready: marked ``superseded``, with no figure.
- ``servedThroughout``: false as soon as a look (a reconcile, the step's own included) finds no pod Ready and not
  terminating; true at recovery when no look did. What happens between two looks is not seen.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from llm_autopilot.api.v1alpha1 import RemediationEvent


@dataclass(frozen=True)
class PodReadiness:
    """One pod of the LLMDeployment as its status says: its plan and since when it has been Ready (None: not)."""

    plan_hash: str | None
    ready_since: datetime | None = None
    #: Ready but being deleted: no Service routes to it
    terminating: bool = False
    #: the pod's name, when its vLLM container started (its current run) and how often it restarted: a start's
    #: length for the startup probe (desired/startup_probe.py)
    pod: str = ""
    started_at: datetime | None = None
    restarts: int = 0

    @property
    def serving(self) -> bool:
        return self.ready_since is not None and not self.terminating


def _time(value: Any) -> datetime | None:
    """An RFC 3339 time as the API server writes it (whole seconds, ``Z``); None when it is not one."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed.astimezone(UTC) if parsed.tzinfo is not None else None


def pod_readiness(pod: Mapping[str, Any], plan_hash_annotation: str, container: str = "") -> PodReadiness:
    """What a pod says of its readiness: from its conditions (a pod as the API server gives it) or from the pod
    watch's summary (``status.ready`` and ``status.readySince``, controller/observed.py). A Ready pod whose
    condition has no readable time is not counted as Ready (its time is what a recovery records). ``container``:
    the one whose running state's ``startedAt`` and ``restartCount`` are read."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    plan = (meta.get("annotations") or {}).get(plan_hash_annotation)
    ready = [c for c in status.get("conditions") or [] if isinstance(c, Mapping) and c.get("type") == "Ready"]
    if ready:
        is_ready, since = ready[0].get("status") == "True", ready[0].get("lastTransitionTime")
    else:
        is_ready, since = status.get("ready") == "True", status.get("readySince")
    runs = [cs for cs in status.get("containerStatuses") or [] if isinstance(cs, Mapping)
            and cs.get("name") == container]
    started = ((runs[0].get("state") or {}).get("running") or {}).get("startedAt") if runs else None
    restarts = runs[0].get("restartCount") if runs else 0
    return PodReadiness(plan if isinstance(plan, str) else None, _time(since) if is_ready else None,
                        terminating=bool(meta.get("deletionTimestamp")), pod=str(meta.get("name") or ""),
                        started_at=_time(started),
                        restarts=restarts if isinstance(restarts, int) and not isinstance(restarts, bool) else 0)


@dataclass(frozen=True)
class Recovery:
    """A step that recovered in this pass: for its Event and ``llm_autopilot_step_recovery_seconds``."""

    rung: int
    signal: str
    action: str
    seconds: float
    served_throughout: bool

    @property
    def message(self) -> str:
        served = ("the model served throughout (a Ready pod at every look)" if self.served_throughout
                  else "the model had no Ready pod during the step")
        return (f"rung {self.rung} ({self.action}): the first pod of the new plan was Ready {self.seconds:.0f} s "
                f"after the step; {served}")


def _pending(entry: RemediationEvent) -> bool:
    return entry.plan_hash is not None and entry.recovered_seconds is None and not entry.superseded


def _recovered_at(entry: RemediationEvent, pods: tuple[PodReadiness, ...], before: datetime | None) -> datetime | None:
    """When the first pod of the entry's plan became Ready after the step (and before ``before``, the time it was
    superseded), as its Ready condition says; None: none has."""
    # the condition's time has whole seconds: a pod Ready in the step's own second counts
    step = entry.time.replace(microsecond=0)
    times = [p.ready_since for p in pods if p.plan_hash == entry.plan_hash and p.ready_since is not None
             and p.ready_since >= step and (before is None or p.ready_since < before)]
    return min(times) if times else None


def track(history: tuple[RemediationEvent, ...], pods: tuple[PodReadiness, ...],
          plan_in_force: str | None) -> tuple[tuple[RemediationEvent, ...], tuple[Recovery, ...]]:
    """The history with each pending step's recovery decided from the pods as read now, and the steps that
    recovered in this pass. ``plan_in_force``: the plan the workload is to run now (None: not known, or just
    changed by the entry this pass added)."""
    serving = any(p.serving for p in pods)
    entries, recovered = list(history), []
    for i, entry in enumerate(entries):
        if not _pending(entry):
            continue
        later = entries[i + 1].time if i + 1 < len(entries) else None
        at = _recovered_at(entry, pods, later)
        if at is not None:
            seconds = round(max((at - entry.time).total_seconds(), 0.0), 1)
            served = entry.served_throughout is not False
            entries[i] = entry.model_copy(update={"recovered_seconds": seconds, "served_throughout": served})
            recovered.append(Recovery(entry.rung, entry.signal, entry.action, seconds, served))
        elif later is not None or (plan_in_force is not None and plan_in_force != entry.plan_hash):
            entries[i] = entry.model_copy(update={"superseded": True})
        elif not serving and entry.served_throughout is None:
            entries[i] = entry.model_copy(update={"served_throughout": False})
    return tuple(entries), tuple(recovered)
