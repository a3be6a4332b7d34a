"""The reconcile's desired state, decided without I/O from what one gather step read (issue #16, item 1)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.controller import handlers
from llm_autopilot.controller.admission import review
from llm_autopilot.controller.gather import read_world
from llm_autopilot.controller.kube import NodeGPUs
from llm_autopilot.controller.reconcile import reconcile
from llm_autopilot.controller.settings import OperatorSettings
from llm_autopilot.desired.world import GPUNode, World
from llm_autopilot.render import groups
from llm_autopilot.render.autoscaling import KEDA_CRD
from llm_autopilot.render.workload import Live
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION
from tests.unit.fakes import L4, NAME, NAMESPACE, FakeCluster, Run, operator_on

QWEN_L4 = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4"}, "serving": {"maxModelLen": 8192}}


def test_the_reconcilers_clock_is_injected() -> None:
    """Every time the pass writes is the one it was given (conditions' lastTransitionTime, remediation's)."""
    at = datetime(2031, 5, 17, 8, 30, tzinfo=UTC)
    out = reconcile(name=NAME, namespace=NAMESPACE, uid="uid", generation=1, spec_body=QWEN_L4, status={},
                    kube=FakeCluster(), settings=OperatorSettings(), now=at)
    times = {c["lastTransitionTime"] for c in out.status["conditions"]}
    assert times == {"2031-05-17T08:30:00Z"}


@dataclass
class _Reads(FakeCluster):
    reads: list[tuple[str, str]] = field(default_factory=list)

    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        self.reads.append((kind, name))
        return super().get(api_version, kind, name, namespace)


def test_one_gather_step_reads_the_world_before_anything_is_decided() -> None:
    """The model, the GPU nodes, the CRDs (KEDA's only when spec.autoscaling needs it) and the live shapes."""
    cluster = _Reads()
    cluster.objects[("CustomResourceDefinition", KEDA_CRD)] = {"metadata": {"name": KEDA_CRD}}
    cluster.objects[("StatefulSet", groups.group_name(NAME, 0))] = {"metadata": {}}
    spec = LLMDeploymentSpec.model_validate(QWEN_L4)
    world = read_world(spec, NAME, NAMESPACE, cluster, OperatorSettings())
    assert world.model.max_position_embeddings > 0
    assert [n.gpus for n in world.nodes] == [8, 1]
    assert world.crds == frozenset() and ("CustomResourceDefinition", KEDA_CRD) not in cluster.reads
    assert world.live.groups == (0,) and not world.live.deployment
    scaled = LLMDeploymentSpec.model_validate({**QWEN_L4, "autoscaling": {"maxReplicas": 2}})
    assert read_world(scaled, NAME, NAMESPACE, cluster, OperatorSettings()).crds == frozenset({KEDA_CRD})
    # a Deployment counts as a shape to park only beside a multi-node plan
    live = World(world.model, live=Live(deployment=True))
    assert live.live_for(multi_node=True).deployment and not live.live_for(multi_node=False).deployment


def test_admission_and_the_reconcile_refuse_too_many_replicas_with_one_message() -> None:
    nodes = [NodeGPUs(dict(L4), 1, 180.0) for _ in range(4)]
    cluster = FakeCluster(nodes=nodes)
    cluster.objects[("CustomResourceDefinition", KEDA_CRD)] = {"metadata": {"name": KEDA_CRD}}
    spec = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4"},
            "autoscaling": {"maxReplicas": 5, "prometheusAddress": "http://prometheus.test:9090"}}
    run = Run(spec, cluster=cluster)
    run.once()
    planned = run.condition("Planned")
    assert planned["reason"] == "TooManyReplicas"
    verdict = review(spec, str(DEFAULT_VLLM_VERSION), nodes=lambda: [(n.labels, n.allocatable_gpus) for n in nodes])
    assert not verdict.allowed and verdict.message == planned["message"]
    # the webhook reads the nodes from the node index; while it holds fewer than one LIST showed (Kopf still
    # listing them), that LIST's (test_admission_desired.py tables when)
    operator = operator_on(cluster)
    summaries = [asyncio.run(handlers.gpu_nodes(body=_node(f"n{i}")))[None] for i in range(4)]
    assert operator.review_nodes({None: summaries[:2]}) == tuple(GPUNode(L4, 1, 180.0) for _ in range(4))
    assert not operator.node_view.filled
    assert operator.review_nodes({None: summaries}) == tuple(GPUNode(L4, 1, 180.0) for _ in range(4))
    assert operator.node_view.filled and operator.node_view.lists == 1


def _node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": dict(L4)}, "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": "1", "memory": "180Gi"}}}
