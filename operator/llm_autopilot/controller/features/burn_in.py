"""Burn-in's shell (spec.verification.burnIn): its reader -- the plan's pods as the burn-in sees them, with what the
operator's runs measured -- and its executors: a run started on a pod, the runs no longer needed dropped, a
readiness gate written. Its decision is desired/sections/burn_in.py's, its runs controller/burn_in_load.py's."""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from kubernetes.client.exceptions import ApiException

from llm_autopilot.controller.observed import burn_in_gate, containers_ready
from llm_autopilot.controller.pod_reads import PodSource, runs_plan
from llm_autopilot.desired.burn_in import BurnInAsk, BurnInGateWrite, BurnInKeep, BurnInReading, BurnInStart, PodBurnIn
from llm_autopilot.domain.burn_in import BurnInLoad, BurnInMeasurement
from llm_autopilot.render import groups
from llm_autopilot.render.kubernetes import CONTAINER, instance_selector

if TYPE_CHECKING:
    from llm_autopilot.controller.reconcile import Reconciler


class BurnIns(Protocol):
    """The burn-in runs the operator keeps (controller/burn_in_load.py's BurnInRunner)."""

    def result(self, uid: str) -> BurnInMeasurement | None: ...

    def running(self, uid: str) -> bool: ...


class BurnInRuns(BurnIns, Protocol):
    """The burn-in runs: read, started for an owner, and kept only while wanted."""

    def start(self, uid: str, address: str, load: BurnInLoad, owner: str = "") -> None: ...

    def keep(self, owner: str, uids: Collection[str]) -> None:
        """Drop the owner's runs other than ``uids``'s (controller/burn_in_load.py)."""
        ...


class _NoRuns:
    """No burn-in runner: nothing runs, nothing was measured."""

    def result(self, uid: str) -> BurnInMeasurement | None:
        return None

    def running(self, uid: str) -> bool:
        return False


_NO_RUNS = _NoRuns()


def read_burn_in(pods: PodSource, runs: BurnIns, namespace: str, name: str, plan_hash: str) -> BurnInReading:
    """The plan ``plan_hash``'s pods as the burn-in sees them (not those being deleted), sorted by name."""
    found = []
    for pod in pods.pods(namespace, instance_selector(name)):
        meta = pod.get("metadata") or {}
        if not runs_plan(pod, plan_hash) or meta.get("deletionTimestamp"):
            continue
        uid = str(meta.get("uid") or "")
        group, rank = groups.rank_of(meta.get("labels") or {}) or (None, None)
        found.append(PodBurnIn(pod=str(meta.get("name")), uid=uid,
                               ip=(pod.get("status") or {}).get("podIP") or None,
                               containers_ready=containers_ready(pod), gate=burn_in_gate(pod),
                               measurement=runs.result(uid) if uid else None, running=bool(uid) and runs.running(uid),
                               group=group, rank=rank, oom_killed_at=_oom_killed_at(pod)))
    return BurnInReading(plan_hash, tuple(sorted(found, key=lambda p: p.pod)))


def _oom_killed_at(pod: dict[str, Any]) -> datetime | None:
    """When the kubelet last recorded the vLLM container OOM-killed (None: never, or no readable time)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") != CONTAINER:
            continue
        for state in (cs.get("state") or {}, cs.get("lastState") or {}):
            terminated = state.get("terminated") or {}
            if terminated.get("reason") == "OOMKilled":
                try:
                    at = datetime.fromisoformat(str(terminated.get("finishedAt")))
                except ValueError:
                    return None
                return at if at.tzinfo is not None else at.replace(tzinfo=UTC)  # the kubelet's times are UTC
    return None


def _read(r: Reconciler, ask: BurnInAsk) -> BurnInReading:
    """The plan's pods' burn-in: their gates and what the operator's runs measured."""
    runs = r.burn_ins if r.burn_ins is not None else _NO_RUNS
    return read_burn_in(r.kube, runs, ask.namespace, ask.name, ask.plan_hash)


def _start(r: Reconciler, start: BurnInStart) -> None:
    """A burn-in run desired() started (none without a runner)."""
    if r.burn_ins is not None:
        r.burn_ins.start(start.uid, start.ip, start.load, owner=r.owner.uid)


def _keep(r: Reconciler, keep: BurnInKeep) -> None:
    """The burn-in runs desired() no longer needs, dropped."""
    if r.burn_ins is not None:
        r.burn_ins.keep(r.owner.uid, keep.uids)


def _write_gate(r: Reconciler, gate: BurnInGateWrite) -> None:
    """A readiness gate desired() judged (a pod that went meanwhile is no error: its replacement is judged on
    its own)."""
    try:
        r.kube.patch_pod_condition(r.owner.namespace, gate.pod, gate.condition)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return
    r.writes += 1


READERS: dict[type, Callable[[Reconciler, Any], object]] = {BurnInAsk: _read}
EXECUTORS: dict[type, Callable[[Reconciler, Any], None]] = {
    BurnInStart: _start, BurnInKeep: _keep, BurnInGateWrite: _write_gate,
}
