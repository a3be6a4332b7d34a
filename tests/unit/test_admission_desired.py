"""The admission webhook's verdicts are desired()'s (issue #16, item 1): a refusal is the reconcile's Planned=False
with its own message, a cause that depends on the cluster is a warning, and the GPU nodes come from the node
watch's index, with one LIST while it is still filling. Named cases; the reconcile they are compared with runs on
an in-memory cluster with the same nodes."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import pytest

from llm_autopilot.api.lora import parse_adapter_config
from llm_autopilot.controller import handlers, runtime, world_reads
from llm_autopilot.controller.admission import AdmissionVerdict, NodeView, review
from llm_autopilot.controller.kube import NodeGPUs
from llm_autopilot.desired.world import AdapterReading, GPUNode
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION
from tests.unit.fakes import L4, FakeCluster, Run, operator_on

V = str(DEFAULT_VLLM_VERSION)
PROM = "http://prometheus.test:9090"
QWEN = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4"}, "serving": {"maxModelLen": 8192}}
ANY_GPU = {"model": {"name": "Qwen/Qwen3-8B"}, "serving": {"maxModelLen": 8192}}
LLAMA_405B = {"model": {"name": "meta-llama/Llama-3.1-405B"}, "gpu": {"maxGPUs": 1}}
LORA = {**QWEN, "lora": {"maxLoraRank": 16, "adapters": [{"name": "bot", "source": "hf://org/bot"}]}}
RANK_32 = AdapterReading(configs={"bot": parse_adapter_config({"r": 32})})
#: no maxLoraRank: the slots take the adapters' largest rank (512: 8 slots of it do not fit an L4, 8 of the
#: old default 16 would)
LORA_BY_RANK = {**QWEN, "lora": {"maxLoras": 8, "adapters": [{"name": "bot", "source": "hf://org/bot"}]}}
RANK_512 = AdapterReading(configs={"bot": parse_adapter_config({"r": 512})})


@dataclass(frozen=True)
class Case:
    spec: dict[str, Any]
    #: the Planned=False reason of the reconcile on the same cluster (None: it plans)
    reason: str | None
    #: refused at apply time (with the reconcile's message), else admitted (a cause of the cluster: its message
    #: as a warning)
    refused: bool
    #: 1-GPU L4 nodes in the node index and in the reconcile's cluster
    nodes: int = 1
    #: the LoRA adapters' configs as read (by the webhook within its budget, by the reconcile's gather)
    adapters: AdapterReading = field(default_factory=AdapterReading)
    #: the webhook's own note on a plan it admits (none: it says nothing)
    note: str | None = None


CASES = {
    # deterministic: the same spec never plans, whatever the cluster does
    "malformed spec": Case({**QWEN, "serving": {"maxModelLen": "long"}}, "InvalidSpec", refused=True),
    "unknown GPU product": Case({**QWEN, "gpu": {"product": "gtx-970"}}, "UnknownGPU", refused=True),
    "unsupported vLLM version": Case({**QWEN, "vllm": {"version": "0.1.0"}}, "UnsupportedVLLMVersion",
                                     refused=True),
    "an override the catalog model cannot take": Case(
        {**QWEN, "model": {"name": "Qwen/Qwen3-8B", "architecture": {"numKeyValueHeads": 5}}},
        "InvalidArchitecture", refused=True),
    "infeasible on the named GPU": Case({**LLAMA_405B, "gpu": {"product": "nvidia-l4", "maxGPUs": 1}}, "Infeasible",
                                        refused=True),
    "infeasible on the named GPU, no node of it yet": Case(
        {**LLAMA_405B, "gpu": {"product": "nvidia-h100-80gb", "maxGPUs": 1}}, "Infeasible", refused=True),
    "an adapter its config refuses": Case(LORA, "LoRAAdapterRefused", refused=True, adapters=RANK_32),
    "slots at the adapters' own rank do not fit": Case(LORA_BY_RANK, "Infeasible", refused=True, adapters=RANK_512),
    "more replicas than the indexed pool holds": Case(
        {**QWEN, "autoscaling": {"maxReplicas": 5, "prometheusAddress": PROM}}, "TooManyReplicas", refused=True,
        nodes=4),
    # the cluster's: more or other nodes may come, or the operator's settings change
    "no GPU node yet, none named": Case(ANY_GPU, "Infeasible", refused=False, nodes=0),
    "infeasible on the cluster's pools, none named": Case(LLAMA_405B, "Infeasible", refused=False, nodes=4),
    "more replicas than the cluster's pools hold, none named": Case(
        {**ANY_GPU, "autoscaling": {"maxReplicas": 5, "prometheusAddress": PROM}}, "TooManyReplicas", refused=False,
        nodes=4),
    "autoscaling without a Prometheus": Case({**QWEN, "autoscaling": {"maxReplicas": 2}}, "NoPrometheus",
                                             refused=False, nodes=4),
    # planned: admitted, nothing to say
    "a catalog model on its named GPU": Case(QWEN, None, refused=False),
    "a catalog model on the cluster's pool": Case(ANY_GPU, None, refused=False, note=(
        "spec.gpu.product is not set: planned on the cluster's GPU nodes as 1 x L4 (the pool with the least GPU "
        "memory that fits); name a product to pin it")),
}


def _nodes(count: int) -> list[NodeGPUs]:
    return [NodeGPUs(dict(L4), 1, 120.0) for _ in range(count)]


def _review(case: Case) -> AdmissionVerdict:
    return review(case.spec, V, name="x", nodes=lambda: [GPUNode(n.labels, n.allocatable_gpus) for n in
                                                          _nodes(case.nodes)],
                  adapters=lambda _: (case.adapters, []))


def _reconciled(case: Case) -> dict[str, Any]:
    """The Planned condition the reconcile writes for the spec on a cluster of the same nodes."""
    run = Run(case.spec, cluster=FakeCluster(nodes=_nodes(case.nodes)))
    with mock.patch.object(world_reads, "read_adapter_configs", lambda *a, **k: case.adapters):
        run.once()
    return run.condition("Planned")


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_admission_answers_with_the_reconciles_own_decision(case: Case) -> None:
    planned, verdict = _reconciled(case), _review(case)
    if case.reason is None:
        assert planned["status"] == "True", planned
        assert verdict.allowed and verdict.warnings == ([case.note] if case.note else []), verdict
        return
    assert (planned["status"], planned["reason"]) == ("False", case.reason), planned
    if case.refused:
        assert not verdict.allowed and verdict.message == planned["message"], verdict
    else:
        assert verdict.allowed and planned["message"] in verdict.warnings, verdict


def test_what_the_spec_alone_refuses_is_refused_for_a_model_the_webhook_does_not_read() -> None:
    """The version, the GPU product and the adapters are judged before the model: the same message for a model
    only the Hub describes as for a catalog one."""
    for wrong, reason in (({"gpu": {"product": "gtx-970"}}, "UnknownGPU"),
                          ({"vllm": {"version": "0.1.0"}}, "UnsupportedVLLMVersion")):
        catalog = _review(Case({**QWEN, **wrong}, reason, refused=True))
        hub = review({**QWEN, "model": {"name": "someorg/private-model"}, **wrong}, V)
        assert not hub.allowed and hub.message == catalog.message
    hub = {**LORA, "model": {"name": "someorg/private-model"}}
    catalog_message = _review(CASES["an adapter its config refuses"]).message
    verdict = review(hub, V, adapters=lambda _: (RANK_32, []))
    assert not verdict.allowed and verdict.message == catalog_message


def test_a_model_the_webhook_does_not_read_is_left_to_the_reconcile_with_a_warning() -> None:
    verdict = review({**QWEN, "model": {"name": "someorg/private-model"}}, V, nodes=lambda: pytest.fail("read"))
    assert verdict.allowed
    assert verdict.warnings == ["someorg/private-model is not in the built-in catalog: its config is fetched and "
                                "the plan checked when the operator reconciles it"]


def test_the_plans_choices_are_noted_from_the_first_round() -> None:
    """desired()'s first round asks for the workload (none exists yet): its plan is the verdict, with the notes."""
    verdict = review({**QWEN, "serving": {"maxModelLen": "auto"}}, V)
    assert verdict.allowed and len(verdict.warnings) == 1
    assert verdict.warnings[0].startswith("serving.maxModelLen auto: ") and verdict.warnings[0].endswith(" on 1 x L4")


def test_a_warning_of_the_cluster_keeps_the_plans_own_warnings_and_notes() -> None:
    """Planned=False for a cause of the cluster or the operator's settings (no Prometheus; more replicas than
    the nodes' pool holds, no GPU named) is admitted with a warning, and with what the plan says too, as for a
    spec that plans: the plan was chosen before that cause stopped the reconcile."""
    auto = {"maxModelLen": "auto", "expectedConcurrency": 64}
    planned = review({**QWEN, "serving": auto}, V, nodes=lambda: _gpus(4))
    assert planned.allowed and len(planned.warnings) == 2, planned  # too few sequences fit; the auto length
    no_prometheus = review({**QWEN, "serving": auto, "autoscaling": {"maxReplicas": 2}}, V, nodes=lambda: _gpus(4))
    assert no_prometheus.allowed and no_prometheus.warnings[0].startswith("spec.autoscaling needs a Prometheus")
    assert no_prometheus.warnings[1:] == planned.warnings, no_prometheus
    too_many = review({**ANY_GPU, "serving": auto, "autoscaling": {"maxReplicas": 5, "prometheusAddress": PROM}}, V,
                      nodes=lambda: _gpus(4))
    assert too_many.allowed and too_many.warnings[0].startswith("spec.autoscaling.maxReplicas 5 is more than")
    unnamed = "spec.gpu.product is not set: planned on the cluster's GPU nodes as 1 x L4"  # no GPU named: its note
    assert [w for w in too_many.warnings[1:] if not w.startswith(unnamed)] == planned.warnings, too_many
    assert any(w.startswith(unnamed) for w in too_many.warnings), too_many


# ---- the node index, while it fills ------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _gpus(count: int) -> list[GPUNode]:
    return [GPUNode(dict(L4), 1) for _ in range(count)]


@dataclass(frozen=True)
class Filling:
    #: (seconds since the start, nodes in the index, nodes a LIST would show then) per review, in order
    reviews: list[tuple[float, int, int | Exception]]
    #: the nodes each review plans on
    planned: list[int]
    lists: int
    filled: bool


FILLING = {
    "the index caught up before the first review": Filling([(0, 4, 4), (1, 4, 4)], [4, 4], lists=1, filled=True),
    "the index still filling plans on one LIST": Filling([(0, 1, 4), (0.5, 2, 4), (1, 3, 4), (2, 4, 4), (60, 4, 5)],
                                                         [4, 4, 4, 4, 4], lists=1, filled=True),
    "an empty cluster is filled at once": Filling([(0, 0, 0), (100, 0, 3)], [0, 0], lists=1, filled=True),
    "an index that stays behind is compared again a period later": Filling(
        [(0, 2, 4), (10, 2, 3), (31, 3, 3)], [4, 4, 3], lists=2, filled=True),
    "a LIST that fails leaves the index's view, tried again a period later": Filling(
        [(0, 1, RuntimeError("403")), (5, 2, 4), (31, 2, 4)], [1, 2, 4], lists=2, filled=False),
}


@pytest.mark.parametrize("case", FILLING.values(), ids=FILLING.keys())
def test_the_node_index_is_read_once_it_holds_what_a_list_showed(case: Filling) -> None:
    clock, answer = Clock(), {"nodes": 0}

    def list_nodes() -> list[GPUNode]:
        found = answer["nodes"]
        if isinstance(found, Exception):
            raise found
        return _gpus(found)

    view = NodeView(list_nodes, seconds=30.0, clock=clock)
    planned = []
    for at, indexed, listed in case.reviews:
        clock.now, answer["nodes"] = at, listed  # type: ignore[assignment]
        planned.append(len(view.nodes(_gpus(indexed))))
    assert (planned, view.lists, view.filled) == (case.planned, case.lists, case.filled)


def test_a_mass_create_lists_the_nodes_once() -> None:
    """1,000 reviews through the webhook's own path: the node index as Kopf hands it over, filling; one LIST."""
    cluster = FakeCluster(nodes=_nodes(4))
    lists: list[int] = []

    def list_nodes() -> list[GPUNode]:
        lists.append(1)
        return [GPUNode(n.labels, n.allocatable_gpus) for n in cluster.gpu_nodes()]

    operator = operator_on(cluster)
    operator.node_view = NodeView(list_nodes, seconds=3600.0)
    summaries = [asyncio.run(handlers.gpu_nodes(body=_node(f"n{i}")))[None] for i in range(4)]
    spec = {**QWEN, "autoscaling": {"maxReplicas": 3, "prometheusAddress": PROM}}
    user = {"username": "alice", "groups": []}
    verdicts = []
    for i in range(1000):
        index = {None: summaries[:min(4, 1 + i // 100)]}  # the watch's listing arrives while reviews come in
        _, refusal, _ = operator.review(spec, f"q{i}", user, "ns", index)
        verdicts.append(refusal)
    # 3 replicas fit on the 4 nodes: never refused on the 1, 2 or 3 the index held while it filled
    assert verdicts == [None] * 1000 and len(lists) == 1 and operator.node_view.filled


def test_concurrent_first_reviews_share_one_node_view(monkeypatch: pytest.MonkeyPatch) -> None:
    """The webhook's threads start a mass create together: the first reviews must all plan on the one view the
    process keeps (else each keeps its own, and makes its own LIST). The Operator makes it once, when Kopf's
    startup builds it, before any review."""
    made: list[NodeView] = []

    class Counted(NodeView):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(runtime, "NodeView", Counted)
    operator = operator_on(FakeCluster(nodes=_nodes(4)))
    together = threading.Barrier(2)
    seen: list[tuple[tuple[GPUNode, ...], NodeView]] = []

    def first_review() -> None:
        together.wait(timeout=10.0)
        seen.append((operator.review_nodes({None: []}), operator.node_view))  # the index still empty

    threads = [threading.Thread(target=first_review) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10.0)
    assert len(seen) == 2 and seen[0][1] is seen[1][1] is operator.node_view is made[0] and len(made) == 1, made
    assert seen[0][0] == seen[1][0] and len(seen[0][0]) == 4 and made[0].lists == 1


def _node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": dict(L4)}, "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": "1", "memory": "120Gi"}}}



def test_a_named_gpu_on_no_node_is_refused_with_the_planners_own_answer() -> None:
    """No pool of the cluster was tried (none has the GPU): the message is the plan's, with the spec's GPU count,
    not a pool the nodes do not have. On the nodes' pool it names the pool it tried."""
    spec = {"model": {"name": "meta-llama/Llama-3.1-405B"}, "gpu": {"product": "nvidia-h100-80gb", "maxGPUs": 4}}
    verdict = review(spec, V)
    assert not verdict.allowed
    assert verdict.message.startswith("meta-llama/Llama-3.1-405B (406B) does not fit on 4 x H100-80GB"), verdict
    h100 = {**L4, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"}
    on_nodes = review(spec, V, nodes=lambda: [(h100, 8)])
    assert on_nodes.message == f"does not fit on any GPU pool in the cluster: H100-80GB (8 per node): {verdict.message}"
