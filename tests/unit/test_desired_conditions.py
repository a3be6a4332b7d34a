"""Every condition the reconcile writes, and each of its reasons, as a named-case table (the way
test_remediation_decide.py tables remediation's decision): the behaviour desired() must keep (issue #16).

Each case is one situation of the world -- spec, nodes, CRDs, the workload's state, pods, Prometheus -- and the
(status, reason) every condition it names must end with after the reconciles it runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from llm_autopilot.controller.kube import NodeGPUs
from llm_autopilot.render.autoscaling import KEDA_CRD
from tests.unit.fakes import L4, FakeCluster, FakePrometheus, Run, saturated

QWEN = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-h100-80gb"}, "serving": {"maxModelLen": 16384}}
PROM = "http://prometheus.test:9090"
SCALED = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4"}}


def _keda(cluster: FakeCluster) -> None:
    cluster.objects[("CustomResourceDefinition", KEDA_CRD)] = {"metadata": {"name": KEDA_CRD}}


def _four_l4(cluster: FakeCluster) -> None:
    cluster.nodes = [NodeGPUs(dict(L4), 1, 180.0) for _ in range(4)]


def _unavailable(run: Run) -> None:
    run.cluster.deployment()["status"]["availableReplicas"] = 0


def _rolling_out(run: Run) -> None:
    run.cluster.deployment()["status"]["updatedReplicas"] = 0


def _oom_killed(run: Run) -> None:
    run.cluster.crash(reason="OOMKilled", exit_code=137)


def _running(run: Run) -> None:
    run.cluster.running()


@dataclass(frozen=True)
class Case:
    spec: dict[str, Any]
    #: condition type -> (status, reason) after the reconciles
    expect: dict[str, tuple[str, str]]
    cluster: Callable[[FakeCluster], None] | None = None
    prometheus: FakePrometheus | None = None
    #: between the first reconcile and the second (None: one reconcile)
    then: Callable[[Run], None] | None = None
    #: condition types that must not be written
    absent: tuple[str, ...] = ()
    reject: dict[str, str] = field(default_factory=dict)


CASES: dict[str, Case] = {
    "planned and ready": Case(QWEN, {"Planned": ("True", "Planned"), "Ready": ("True", "Available"),
                                     "Degraded": ("False", "AsPlanned")}, absent=("ModelCached",)),
    "invalid spec": Case({"model": {"name": "Qwen/Qwen3-8B"}, "replicas": -1},
                         {"Planned": ("False", "InvalidSpec")}, absent=("Ready", "Degraded")),
    "unknown GPU": Case({"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-x9000"}},
                        {"Planned": ("False", "UnknownGPU")}),
    "unsupported vLLM version": Case({**QWEN, "vllm": {"version": "0.1.0"}},
                                     {"Planned": ("False", "UnsupportedVLLMVersion")}),
    "infeasible": Case({"model": {"name": "meta-llama/Llama-3.1-405B"}, "gpu": {"product": "nvidia-l4",
                                                                             "maxGPUs": 1}},
                       {"Planned": ("False", "Infeasible")}, absent=("Ready",)),
    # a pvc:// model outside the catalog is read from its volume by an inspect Job: first the claim must exist
    "pvc model whose claim is missing": Case(
        {"model": {"name": "acme/private", "source": "pvc://models/private"}, "gpu": {"product": "nvidia-h100-80gb"}},
        {"Planned": ("False", "SourceNotFound")}),
    "autoscaling without Prometheus": Case({**SCALED, "autoscaling": {"maxReplicas": 2}},
                                           {"Planned": ("False", "NoPrometheus")}, cluster=_four_l4),
    "autoscaling beyond the pool": Case({**SCALED, "autoscaling": {"maxReplicas": 5, "prometheusAddress": PROM}},
                                        {"Planned": ("False", "TooManyReplicas")},
                                        cluster=lambda c: (_four_l4(c), _keda(c))),
    "autoscaling without KEDA": Case({**SCALED, "autoscaling": {"maxReplicas": 2, "prometheusAddress": PROM}},
                                     {"Planned": ("False", "NoKEDA")}, cluster=_four_l4),
    "autoscaled and ready": Case({**SCALED, "autoscaling": {"maxReplicas": 2, "prometheusAddress": PROM}},
                                 {"Planned": ("True", "Planned"), "Ready": ("True", "Available")},
                                 cluster=lambda c: (_four_l4(c), _keda(c))),
    "apply rejected": Case(QWEN, {"Planned": ("False", "ApplyRejected")},
                           reject={"Deployment": "admission webhook denied the request"}),
    "unavailable": Case(QWEN, {"Ready": ("False", "Unavailable")}, then=_unavailable),
    "rolling out": Case(QWEN, {"Ready": ("False", "RollingOut")}, then=_rolling_out),
    "an OOM kill is remediated": Case({**QWEN, "remediation": {"cooldownSeconds": 0}},
                                      {"Degraded": ("False", "Remediated"), "Planned": ("True", "Planned")},
                                      then=_oom_killed),
    "metrics not configured": Case(QWEN, {"Planned": ("True", "Planned")}, absent=("MetricsAvailable",)),
    "Prometheus unreachable": Case(QWEN, {"MetricsAvailable": ("False", "PrometheusUnreachable")},
                                   prometheus=FakePrometheus(down=True), then=_running),
    "Prometheus refuses the query": Case(QWEN, {"MetricsAvailable": ("False", "QueryRejected")},
                                         prometheus=FakePrometheus(refuses="parse error"), then=_running),
    "Prometheus queried": Case(QWEN, {"MetricsAvailable": ("True", "Queried")},
                               prometheus=FakePrometheus(answer=saturated(usage=0.1, preemptions=0, waiting=0)),
                               then=_running),
    "model cache pending": Case({"model": {"name": "Qwen/Qwen3-8B", "cache": {"enabled": True}},
                                 "gpu": {"product": "nvidia-h100-80gb"}, "serving": {"maxModelLen": 16384}},
                                {"ModelCached": ("False", "Pending"), "Planned": ("True", "Planned")}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_condition(name: str) -> None:
    case = CASES[name]
    cluster = FakeCluster(reject=dict(case.reject))
    if case.cluster is not None:
        case.cluster(cluster)
    run = Run(case.spec, cluster=cluster, prometheus=case.prometheus)
    run.once()
    if case.then is not None:
        case.then(run)
        run.once()
    found = {c["type"]: (c["status"], c["reason"]) for c in run.status.get("conditions", [])}
    for type_, wanted in case.expect.items():
        assert found.get(type_) == wanted, (type_, found)
    for type_ in case.absent:
        assert type_ not in found, (type_, found)


def test_the_table_names_every_condition_the_reconcile_writes() -> None:
    named = {type_ for case in CASES.values() for type_ in case.expect}
    assert named == {"Planned", "Ready", "Degraded", "MetricsAvailable", "ModelCached"}
