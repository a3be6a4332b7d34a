"""The quiet resync (controller/quiet.py, reconcile.resync): skipped when nothing the reconcile reads changed,
full when anything did, including the clock of remediation's guards."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY

from llm_autopilot.api.v1alpha1 import RemediationPolicy
from llm_autopilot.controller import reconcile as reconciling
from llm_autopilot.controller.gather import Gatherer
from llm_autopilot.controller.metrics import SaturationRounds
from llm_autopilot.controller.observed import digest
from llm_autopilot.controller.quiet import QuietMemory, next_due, unsettled
from llm_autopilot.controller.reconcile import Outcome
from llm_autopilot.controller.settings import OperatorSettings
from llm_autopilot.remediation.classify import Classification, Signal
from llm_autopilot.remediation.decide import Evidence
from llm_autopilot.remediation.evidence import Crash
from llm_autopilot.remediation.state import RemediationState
from llm_autopilot.render.kubernetes import PLAN_HASH
from tests.unit.fakes import NAME, NAMESPACE, FakeCluster, merge_patch

SPEC = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-h100-80gb"},
        "serving": {"maxModelLen": 16384, "minMaxModelLen": 4096}, "remediation": {"cooldownSeconds": 0}}
START = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


class CountingCluster(FakeCluster):
    """FakeCluster that counts every call a reconcile makes."""

    calls: int = 0

    def gpu_nodes(self) -> Any:
        self.calls += 1
        return super().gpu_nodes()

    def get(self, *args: Any) -> Any:
        self.calls += 1
        return super().get(*args)

    def pods(self, *args: Any) -> Any:
        self.calls += 1
        return super().pods(*args)

    def apply_all(self, objects: Any, before_write: Any = None) -> int:
        self.calls += 1
        return super().apply_all(objects, before_write)


@dataclass
class PerPodPrometheus:
    """Answers the batched (per pod) queries: a saturated pod answers every query, the others nothing."""

    saturated: set[str] = field(default_factory=set)
    queries: list[str] = field(default_factory=list)
    where: str = "Prometheus at http://prometheus.test"

    def vector(self, query: str) -> dict[tuple[str, str], float]:
        self.queries.append(query)
        value = 0.97 if "kv_cache_usage_perc" in query or "gpu_cache" in query else 8.0
        return {(NAMESPACE, pod): value for pod in self.saturated}


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    c = Clock()
    monkeypatch.setattr(reconciling, "_utcnow", c)
    yield c


@dataclass
class Object:
    """One LLMDeployment resynced through the front gate, its status carried over as the API server would,
    with a resourceVersion that moves on every status write (as the watch shows it)."""

    spec: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(SPEC))
    cluster: CountingCluster = field(default_factory=CountingCluster)
    prometheus: PerPodPrometheus | None = None
    status: dict[str, Any] = field(default_factory=dict)
    version: int = 1
    memory: QuietMemory = field(default_factory=QuietMemory)
    settings: OperatorSettings = field(default_factory=OperatorSettings)

    def __post_init__(self) -> None:
        saturation = SaturationRounds(self.prometheus, round_seconds=0) if self.prometheus else None
        self.gatherer = Gatherer(self.cluster, saturation=saturation)

    def observed(self) -> str:
        nodes = [(n.labels, n.allocatable_gpus) for n in self.cluster.nodes]
        return digest([nodes, sorted(self.cluster.objects.items(), key=str), self.cluster.pod_list])

    def current_pods(self, plan_hash: str) -> list[str]:
        return [p["metadata"]["name"] for p in self.cluster.pod_list
                if p["metadata"].get("annotations", {}).get(PLAN_HASH) == plan_hash]

    def resync(self) -> Outcome:
        calls_before = self.cluster.calls
        patches = len(self.cluster.status_patches)
        out = reconciling.resync(
            name=NAME, namespace=NAMESPACE, uid="uid", generation=1, resource_version=str(self.version),
            spec_body=self.spec, status=copy.deepcopy(self.status), observed=self.observed(),
            current_pods=self.current_pods, kube=self.cluster, settings=self.settings, gatherer=self.gatherer,
            memory=self.memory)
        for patch in self.cluster.status_patches[patches:]:  # a step, recorded before its children
            self.status = merge_patch(self.status, patch)
            self.version += 1
        if out.status:
            self.status = merge_patch(self.status, out.status)
            self.version += 1
        if not out.full:
            assert self.cluster.calls == calls_before, "a quiet resync called the cluster"
        return out


def plans() -> float:
    return sum(REGISTRY.get_sample_value("llm_autopilot_plans_total", {"outcome": o}) or 0.0
               for o in ("feasible", "infeasible"))


def settle(obj: Object) -> None:
    """Resync until a resync writes nothing (the first ones report the plan and Ready)."""
    for _ in range(5):
        if obj.resync().status == {}:
            return
    raise AssertionError(f"never settled: {obj.status}")


def test_a_resync_that_finds_nothing_changed_plans_renders_and_reads_nothing(clock: Clock) -> None:
    obj = Object()
    settle(obj)
    before = plans()
    for _ in range(5):
        out = obj.resync()
        assert not out.full and out.status == {} and out.events == [] and out.writes == 0
    assert plans() == before  # no planning at all


@pytest.mark.parametrize("change", ["spec or status (resourceVersion)", "a node", "the Deployment", "a pod",
                                    "the Service deleted"])
def test_any_change_the_reconcile_reads_makes_the_next_resync_full(clock: Clock, change: str) -> None:
    obj = Object()
    settle(obj)
    assert not obj.resync().full
    if change.startswith("spec"):
        obj.version += 1
    elif change == "a node":
        obj.cluster.nodes[1].labels["nvidia.com/gpu.memory"] = "24000"
    elif change == "the Deployment":
        obj.cluster.deployment()["status"]["availableReplicas"] = 0
    elif change == "a pod":
        obj.cluster.running()
    else:
        del obj.cluster.objects[("Service", NAME)]
    out = obj.resync()
    assert out.full
    if change == "the Service deleted":
        assert out.writes == 1 and ("Service", NAME) in obj.cluster.objects  # restored
    settle(obj)
    assert not obj.resync().full


def test_a_new_crash_is_noticed_and_acted_on(clock: Clock) -> None:
    obj = Object()
    settle(obj)
    obj.cluster.running()
    settle(obj)
    assert not obj.resync().full
    obj.cluster.crash(reason="OOMKilled", exit_code=137)
    out = obj.resync()
    assert out.full and obj.status["remediation"]["rung"] == 1
    assert any(reason == "Remediated" for _, reason, _ in out.events)


def test_a_signal_the_guards_hold_back_is_looked_at_on_every_resync(clock: Clock) -> None:
    """A crash during the cooldown is not acted on yet: the resyncs stay full until the cooldown ends."""
    obj = Object()
    obj.spec["remediation"] = {"cooldownSeconds": 300}
    settle(obj)
    obj.cluster.crash(reason="OOMKilled", exit_code=137)
    obj.resync()
    assert obj.status["remediation"]["rung"] == 1
    step = obj.cluster.plan_hash()
    obj.cluster.crash(reason="OOMKilled", exit_code=137, restarts=2, finished_at="2026-12-01T12:00:30Z")
    assert obj.cluster.plan_hash() == step
    for _ in range(3):
        clock.now += timedelta(seconds=60)
        assert obj.resync().full  # held back by the cooldown, still looked at
        assert obj.status["remediation"]["rung"] == 1
    clock.now += timedelta(seconds=200)
    obj.resync()
    assert obj.status["remediation"]["rung"] == 2


def test_the_stable_window_relaxes_through_quiet_resyncs(clock: Clock) -> None:
    """A rung is undone after the stable window although nothing else changes: the clock makes it due."""
    obj = Object()
    obj.spec["remediation"] = {"cooldownSeconds": 0, "stableWindowSeconds": 600}
    settle(obj)
    obj.cluster.crash(reason="OOMKilled", exit_code=137)
    obj.resync()
    assert obj.status["remediation"]["rung"] == 1
    obj.cluster.running()
    settle(obj)
    quiet = 0
    for _ in range(9):  # 9 minutes, calm
        clock.now += timedelta(seconds=60)
        quiet += not obj.resync().full
    assert quiet >= 8 and obj.status["remediation"]["rung"] == 1
    clock.now += timedelta(seconds=61)
    out = obj.resync()
    assert out.full and obj.status["remediation"]["rung"] == 0
    assert any(reason == "Relaxed" for _, reason, _ in out.events)


def test_every_object_is_reconciled_in_full_now_and_then(clock: Clock) -> None:
    obj = Object(settings=OperatorSettings(full_check_seconds=300))
    settle(obj)
    assert not obj.resync().full
    clock.now += timedelta(seconds=299)
    assert not obj.resync().full
    clock.now += timedelta(seconds=2)
    assert obj.resync().full


def test_kv_saturation_is_asked_each_round_and_a_signal_makes_the_resync_full(clock: Clock) -> None:
    prometheus = PerPodPrometheus()
    obj = Object(prometheus=prometheus)
    obj.spec["remediation"] = {"cooldownSeconds": 0, "kvSaturationWindowSeconds": 60}
    obj.spec["serving"]["allowedKVCacheDtypes"] = ["auto", "fp8"]
    settle(obj)
    obj.cluster.running("x-1")
    settle(obj)
    asked = len(prometheus.queries)
    assert not obj.resync().full
    assert len(prometheus.queries) > asked  # the quiet resync asked (batched) about the current pods
    prometheus.saturated = {"x-1"}
    out = obj.resync()
    assert out.full and obj.status["remediation"]["rung"] == 1
    assert obj.status["remediation"]["history"][-1]["signal"] == "KVSaturation"


def test_unsettled_failures_are_retried_every_resync(clock: Clock) -> None:
    obj = Object()
    obj.cluster.reject["Service"] = "Internal error occurred: failed to allocate a serviceIP: range is full"
    out = obj.resync()
    planned = next(c for c in obj.status["conditions"] if c["type"] == "Planned")
    assert (planned["status"], planned["reason"]) == ("False", "ApplyRejected")
    assert "range is full" in planned["message"] and not out.settled
    assert obj.resync().full
    del obj.cluster.reject["Service"]  # the range has room again
    obj.resync()
    assert next(c for c in obj.status["conditions"] if c["type"] == "Planned")["status"] == "True"


def test_deterministic_failures_stay_quiet(clock: Clock) -> None:
    obj = Object()
    obj.spec["gpu"] = {"product": "nvidia-h100-80gb", "maxGPUs": 1}
    obj.spec["model"] = {"name": "meta-llama/Llama-3.1-405B"}
    obj.spec["serving"] = {"maxModelLen": 8192}
    settle(obj)
    assert next(c for c in obj.status["conditions"] if c["type"] == "Planned")["reason"] == "Infeasible"
    assert not obj.resync().full


# --- next_due --------------------------------------------------------------------------------------------

def _state(**fields: Any) -> RemediationState:
    return RemediationState.model_validate(fields)


def test_next_due_is_the_earliest_time_the_clock_could_change_the_decision() -> None:
    policy = RemediationPolicy.model_validate({"cooldownSeconds": 600, "stableWindowSeconds": 3600,
                                               "kvSaturationWindowSeconds": 300})
    assert next_due(_state(), policy, START, 900) == START + timedelta(seconds=900)
    stepped = _state(rung=1, lastStepTime=START - timedelta(seconds=100), applied=[{"maxNumSeqs": 64}])
    assert next_due(stepped, policy, START, 900) == START + timedelta(seconds=200)  # the KV window's end
    later = START + timedelta(seconds=250)
    assert next_due(stepped, policy, later, 900) == START + timedelta(seconds=500)  # the cooldown's end
    calm = _state(rung=1, lastStepTime=START - timedelta(hours=2), lastSignalTime=START - timedelta(minutes=50),
                  relaxBackoff=2, applied=[{"maxNumSeqs": 64}])
    assert next_due(calm, policy, START, 10**6) == START - timedelta(minutes=50) + timedelta(seconds=7200)
    disabled = RemediationPolicy.model_validate({"enabled": False, "stableWindowSeconds": 3600})
    assert next_due(calm, disabled, START, 900) == START + timedelta(seconds=900)


def test_a_crash_not_yet_acted_on_or_a_saturation_signal_is_unsettled() -> None:
    crash = Crash(Classification(Signal.HOST_OOM, "OOMKilled"), "x-1/1/t", "x-1", "t")
    assert not unsettled(Evidence(), _state())
    assert unsettled(Evidence(crash=crash), _state())
    assert not unsettled(Evidence(crash=crash), _state(lastEvidence="x-1/1/t"))  # acted on, or reported
    assert unsettled(Evidence(saturation=Classification(Signal.KV_SATURATION, "saturated")),
                     _state(lastEvidence="x-1/1/t"))
