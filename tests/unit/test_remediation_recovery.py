"""Each remediation step's recovery (remediation/recovery.py, through decide()), case by case: when the first pod
of the step's plan was Ready, whether the model served all along, and what is never recorded (or observed) twice."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
import pytest
from prometheus_client import REGISTRY

from llm_autopilot.api.v1alpha1 import RemediationEvent
from llm_autopilot.controller.observed import pod_summary
from llm_autopilot.remediation.decide import Decision, Evidence, Probe, decide
from llm_autopilot.remediation.ladder import Overrides
from llm_autopilot.remediation.recovery import PodReadiness, pod_readiness
from llm_autopilot.remediation.state import Author, Limits, RemediationState
from llm_autopilot.render.kubernetes import PLAN_HASH
from tests.unit.fakes import NAME, NAMESPACE, FakeCluster, Run, operator_on
from tests.unit.test_remediation import running
from tests.unit.test_remediation_decide import OOM, policy
from tests.unit.test_remediation_shell import QWEN_H100

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
#: when the step was taken (the history entry's time), with the sub-second part a real clock has
STEP = NOW - timedelta(minutes=5) + timedelta(microseconds=500_000)
OLD, NEW, LATER = "plan-old", "plan-new", "plan-later"


def step(at: datetime = STEP, plan: str | None = NEW, rung: int = 1, **fields: Any) -> RemediationEvent:
    return RemediationEvent(time=at, rung=rung, signal="KVSaturation", action="max_num_seqs 256 -> 128",
                            plan_hash=plan, **fields)


def ready(plan: str, after_step: float | None, *, terminating: bool = False) -> PodReadiness:
    """A pod of ``plan`` Ready since ``after_step`` seconds after the step (negative: before it; None: not Ready),
    its time in whole seconds as the API server writes it."""
    since = None if after_step is None else (STEP + timedelta(seconds=after_step)).replace(microsecond=0)
    return PodReadiness(plan, since, terminating)


@dataclass(frozen=True)
class Case:
    history: tuple[RemediationEvent, ...]
    pods: tuple[PodReadiness, ...]
    plan_in_force: str = NEW
    # expected, of the first entry
    recovered_seconds: float | None = None
    served_throughout: bool | None = None
    superseded: bool | None = None
    events: tuple[str, ...] = ()
    observed: tuple[tuple[str, float, bool], ...] = field(default=())


CASES = {
    "recovered with a surge: the old plan's pod served until the new one was Ready": Case(
        (step(),), (ready(OLD, -3600), ready(NEW, 48.5)), recovered_seconds=48.5, served_throughout=True,
        events=("Recovered",), observed=(("KVSaturation", 48.5, True),)),
    "recovered after downtime: a look saw no Ready pod": Case(
        (step(served_throughout=False),), (ready(NEW, 90.5),), recovered_seconds=90.5, served_throughout=False,
        events=("Recovered",), observed=(("KVSaturation", 90.5, False),)),
    "waiting, and no pod Ready now (the old one terminating): down, no figure yet": Case(
        (step(),), (ready(OLD, -3600, terminating=True), ready(NEW, None)), served_throughout=False),
    "waiting, the old plan's pod still serving: nothing recorded yet": Case(
        (step(),), (ready(OLD, -3600), ready(NEW, None))),
    "a pod of the OLD plan becoming Ready after the step does not count": Case(
        (step(),), (ready(OLD, 30),)),
    "a pod of the new plan Ready before the step (same plan, another replica) does not count": Case(
        (step(),), (ready(NEW, -60),)),
    "superseded by a later step before recovery: no figure": Case(
        (step(), step(at=STEP + timedelta(minutes=2), plan=LATER, rung=2)), (ready(OLD, -3600),),
        plan_in_force=LATER, superseded=True),
    "its plan's pod Ready only after the later step: still superseded, never guessed": Case(
        (step(), step(at=STEP + timedelta(minutes=2), plan=LATER, rung=2)), (ready(NEW, 150),),
        plan_in_force=LATER, superseded=True),
    "Ready before the later step, seen only after it: recovered": Case(
        (step(), step(at=STEP + timedelta(minutes=2), plan=LATER, rung=2)), (ready(NEW, 60.5),),
        plan_in_force=LATER, recovered_seconds=60.5, served_throughout=True, events=("Recovered",),
        observed=(("KVSaturation", 60.5, True),)),
    "superseded by a spec change (another plan in force): no figure": Case(
        (step(),), (ready(OLD, -3600),), plan_in_force=LATER, superseded=True),
    "restart: the status as read already holds recoveredSeconds, nothing recorded again": Case(
        (step(recovered_seconds=48.5, served_throughout=True),), (ready(OLD, -3600), ready(NEW, 48.5)),
        recovered_seconds=48.5, served_throughout=True),
    "a relax, and a step recorded before recovery was tracked (no planHash), are not tracked": Case(
        (step(plan=None),), (ready(NEW, 48),)),
}


def run(case: Case) -> Decision:
    state = RemediationState(history=case.history)  # rung 0: nothing to relax, so only recovery speaks
    return decide(Evidence(plan_id=case.plan_in_force, pods=case.pods), state, policy(), running(), now=NOW,
                  probe=lambda _o: Probe(True, plan_hash=LATER))


@pytest.mark.parametrize("name", list(CASES))
def test_recovery(name: str) -> None:
    case = CASES[name]
    d = run(case)
    first = d.state.history[0]
    assert (first.recovered_seconds, first.served_throughout, first.superseded) == (
        case.recovered_seconds, case.served_throughout, case.superseded)
    assert tuple(e.reason for e in d.events) == case.events
    assert tuple((r.signal, r.seconds, r.served_throughout) for r in d.recoveries) == case.observed
    assert not d.changed and d.state.applied == () and d.state.rung == 0
    if case.events:
        assert f"Ready {case.recovered_seconds:.0f} s after the step" in d.events[0].message
        assert ("served throughout" in d.events[0].message) is case.served_throughout
    again = decide(Evidence(plan_id=case.plan_in_force, pods=case.pods), d.state, policy(), running(),
                   now=NOW + timedelta(seconds=30), probe=lambda _o: Probe(True))
    assert not again.recoveries and not again.events and again.state.history == d.state.history  # once


@pytest.mark.parametrize(("pods", "served"), [
    ((ready(OLD, None),), False),  # the crashed pod was the only one: the model is down at the step
    ((ready(OLD, None), PodReadiness("plan-old", NOW - timedelta(hours=1))), None),  # another replica serves
])
def test_a_step_records_its_plan_and_whether_the_model_serves_as_it_is_taken(
        pods: tuple[PodReadiness, ...], served: bool | None) -> None:
    d = decide(Evidence(crash=OOM.crash, plan_id=OLD, pods=pods), RemediationState(), policy(), running(), now=NOW,
               probe=lambda _o: Probe(True, plan_hash=NEW))
    entry = d.state.history[-1]
    assert d.changed and (entry.plan_hash, entry.served_throughout, entry.recovered_seconds) == (NEW, served, None)
    assert [e.reason for e in d.events] == ["Remediated"] and not d.recoveries


def test_pod_readiness_reads_the_api_servers_pod_and_the_watch_summary() -> None:
    api = {"metadata": {"annotations": {PLAN_HASH: NEW}}, "status": {"conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T11:56:03Z"}]}}
    summary = {"metadata": {"annotations": {PLAN_HASH: NEW}, "deletionTimestamp": "2026-12-01T11:59:00Z"},
               "status": {"ready": "True", "readySince": "2026-12-01T11:56:03Z"}}
    since = datetime(2026, 12, 1, 11, 56, 3, tzinfo=UTC)
    assert pod_readiness(api, PLAN_HASH) == PodReadiness(NEW, since)
    assert pod_readiness(summary, PLAN_HASH) == PodReadiness(NEW, since, terminating=True)
    assert not pod_readiness(summary, PLAN_HASH).serving
    not_ready = {"metadata": {}, "status": {"conditions": [{"type": "Ready", "status": "False",
                                                            "lastTransitionTime": "2026-12-01T11:56:03Z"}]}}
    assert pod_readiness(not_ready, PLAN_HASH) == PodReadiness(None, None)
    no_time = {"metadata": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert pod_readiness(no_time, PLAN_HASH).ready_since is None  # no time to record: never guessed
    # the operator reads its pod watch's summaries: they keep the Ready condition's time
    assert pod_readiness(pod_summary(api).body, PLAN_HASH) == PodReadiness(NEW, since)
    assert pod_readiness(pod_summary(not_ready).body, PLAN_HASH) == PodReadiness(None, None)


LIMITS = Limits(max_steps=3, spec_replicas=1, max_replicas=None, max_gpus=8, node_memory_gib=0,
                floor_max_model_len=4096, floor_max_num_seqs=1, floor_max_num_batched_tokens=512,
                floor_gpu_memory_utilization=0.5)


def test_an_old_history_without_the_new_fields_still_verifies_and_a_new_one_keeps_its_chain() -> None:
    author = Author("uid", 1)
    state = RemediationState().with_step(Overrides(max_num_seqs=128), STEP, step(recovered_seconds=48.5,
                                                                                  served_throughout=True))
    recorded = state.attested(author).to_status()
    old = {**recorded, "history": [{k: v for k, v in e.items() if k not in
                                    ("planHash", "recoveredSeconds", "servedThroughout", "superseded")}
                                   for e in recorded["history"]]}
    for raw in (old, recorded):
        read, repairs, dropped = RemediationState.read_attributed(raw, LIMITS, NOW, author)
        assert (repairs, dropped, read.rung, read.overrides) == ((), (), 1, Overrides(max_num_seqs=128))
        assert read.applied[0].attestation == recorded["applied"][0]["attestation"]  # the digest is unchanged
    assert old["history"][0] == {k: v for k, v in recorded["history"][0].items()
                                 if k not in ("planHash", "recoveredSeconds", "servedThroughout")}


# --- the shell: the histogram is observed once per step, a restarted operator observes nothing again ------------

def observed(signal: str, served: str) -> float:
    value = REGISTRY.get_sample_value("llm_autopilot_step_recovery_seconds_count",
                                      {"signal": signal, "served_throughout": served})
    return value or 0.0


def test_the_recovery_is_recorded_once_and_the_histogram_observed_once_with_the_status_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the Deployment watch's reconcile (operator.owner_changed): a status write refused with a 409 is
    decided again and observed only once it is written; a restarted operator reads the figure and observes nothing."""
    monkeypatch.setattr(kopf, "event", lambda *_, **__: None)  # Events need Kopf's running context
    cluster = FakeCluster()
    run = Run(QWEN_H100, cluster=cluster)
    run.once()
    old = cluster.plan_hash()
    cluster.crash(reason="OOMKilled", exit_code=137)  # the only pod: not Ready
    run.once()
    (entry,) = run.remediation["history"]
    new = cluster.plan_hash()
    assert entry["planHash"] == new != old and entry["servedThroughout"] is False and "recoveredSeconds" not in entry
    taken = datetime.fromisoformat(entry["time"])
    since = taken + timedelta(seconds=75)
    cluster.pod_list = [
        {"metadata": {"name": "x-1", "annotations": {PLAN_HASH: old}}, "status": {"conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": (taken + timedelta(seconds=5)).isoformat()}]}},
        {"metadata": {"name": "x-2", "annotations": {PLAN_HASH: new}}, "status": {"conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": since.isoformat()}]}}]
    cluster.llmd = {"metadata": {"name": NAME, "uid": "uid", "generation": 1, "resourceVersion": "7"},
                    "spec": QWEN_H100, "status": run.status}
    before, patches = observed("OOMKilled", "false"), len(cluster.status_patches)
    cluster.conflicts = 1  # the first write is refused: nothing observed for it
    operator_on(cluster).owner_changed(NAMESPACE, NAME)
    (entry,) = cluster.llmd["status"]["remediation"]["history"]
    assert (entry["recoveredSeconds"], entry["servedThroughout"]) == (75.0, False)
    assert observed("OOMKilled", "false") == before + 1 and len(cluster.status_patches) == patches + 1
    for _ in range(2):  # later looks, and a restarted operator (a new process: nothing remembered)
        operator_on(cluster).owner_changed(NAMESPACE, NAME)
    assert observed("OOMKilled", "false") == before + 1 and len(cluster.status_patches) == patches + 1
    again = Run(QWEN_H100, cluster=cluster, status=cluster.llmd["status"]).once()
    assert not again.recoveries and "Recovered" not in [reason for _, reason, _ in again.events]
