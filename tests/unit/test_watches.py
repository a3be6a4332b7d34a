"""The watches behind the reconcile (controller/observed.py, controller/informers.py): summaries and their digests,
the cluster view one handler call reads, and the wiring."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
import kubernetes
import pytest
from kopf._core.intents.stoppers import DaemonStopper  # Kopf's own timer stop flag (no public constructor)

from llm_autopilot.controller import handlers
from llm_autopilot.controller import reconcile as reconciling
from llm_autopilot.controller.kube import Kube
from llm_autopilot.controller.observed import (
    Summary,
    Watched,
    WatchedCluster,
    child_entry,
    child_summary,
    current_pods,
    llmd_summary,
    node_entry,
    node_summary,
    operator_watches,
    pod_entry,
    pod_summary,
)
from llm_autopilot.controller.quiet import QuietMemory, Seen
from llm_autopilot.controller.runtime import Operator, OwnerTriggers
from llm_autopilot.controller.settings import OperatorSettings
from llm_autopilot.render import groups
from llm_autopilot.render.kubernetes import INPUT_HASH, OWNER_LABEL, PLAN_HASH
from tests.unit.fakes import NAME, NAMESPACE, FakeCluster, Run, operator_on

NODE = {"metadata": {"name": "gpu-h100-0", "resourceVersion": "10",
                     "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"}},
        "spec": {}, "status": {"allocatable": {"nvidia.com/gpu": "8", "memory": "1843Gi"},
                               "conditions": [{"type": "Ready", "lastHeartbeatTime": "2026-12-01T12:00:00Z"}]}}
DEPLOYMENT = {"metadata": {"name": "x", "namespace": "ns", "generation": 2, "resourceVersion": "5",
                           "labels": {OWNER_LABEL: "x"}, "annotations": {INPUT_HASH: "h1"}},
              "spec": {"replicas": 1, "template": {"metadata": {"annotations": {PLAN_HASH: "p1"}},
                                                   "spec": {"containers": [{"args": ["a" * 1000]}]}}},
              "status": {"observedGeneration": 2, "updatedReplicas": 1, "availableReplicas": 1}}
POD = {"metadata": {"name": "x-1", "namespace": "ns", "resourceVersion": "7", "annotations": {PLAN_HASH: "p1"},
                    "labels": {OWNER_LABEL: "x", "app.kubernetes.io/instance": "x"}},
       "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                  "containerStatuses": [{"name": "vllm", "restartCount": 0, "ready": True,
                                         "state": {"running": {"startedAt": "2026-12-01T12:00:00Z"}}}]}}


def changed(body: dict[str, Any], change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    new = copy.deepcopy(body)
    change(new)
    return new


def _set(path: list[Any], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        node: Any = body
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value
    return change


@pytest.mark.parametrize(("summary", "body", "change"), [
    (node_summary, NODE, _set(["metadata", "labels", "nvidia.com/gpu.product"], "NVIDIA-A100-SXM4-40GB")),
    (node_summary, NODE, _set(["status", "allocatable", "nvidia.com/gpu"], "4")),
    (child_summary, DEPLOYMENT, _set(["metadata", "annotations", INPUT_HASH], "h2")),
    (child_summary, DEPLOYMENT, _set(["status", "availableReplicas"], 0)),
    (child_summary, DEPLOYMENT, _set(["metadata", "generation"], 3)),
    (pod_summary, POD, _set(["status", "containerStatuses", 0, "restartCount"], 1)),
    (pod_summary, POD, _set(["status", "conditions", 0, "status"], "False")),
    (pod_summary, POD, _set(["metadata", "annotations", PLAN_HASH], "p2")),
])
def test_a_change_the_reconcile_reads_changes_the_digest(summary: Any, body: dict[str, Any],
                                                         change: Callable[[dict[str, Any]], None]) -> None:
    assert summary(changed(body, change)).digest != summary(body).digest


@pytest.mark.parametrize(("summary", "body", "change"), [
    (node_summary, NODE, _set(["metadata", "resourceVersion"], "11")),
    (node_summary, NODE, _set(["status", "conditions", 0, "lastHeartbeatTime"], "2026-12-01T12:20:00Z")),
    (child_summary, DEPLOYMENT, _set(["metadata", "resourceVersion"], "6")),
    (child_summary, DEPLOYMENT, _set(["metadata", "managedFields"], [{"manager": "kube-controller-manager"}])),
    (pod_summary, POD, _set(["metadata", "resourceVersion"], "8")),
])
def test_what_the_reconcile_does_not_read_leaves_the_digest_alone(summary: Any, body: dict[str, Any],
                                                                  change: Callable[[dict[str, Any]], None]) -> None:
    assert summary(changed(body, change)).digest == summary(body).digest


def test_the_summaries_keep_the_shape_the_reconcile_reads() -> None:
    deployment = child_summary(DEPLOYMENT).body
    assert deployment["spec"]["template"]["metadata"]["annotations"][PLAN_HASH] == "p1"
    assert deployment["status"]["availableReplicas"] == 1 and "containers" not in str(deployment)  # trimmed
    node = node_summary(NODE)
    assert node is not None and node.body["gpus"] == 8 and node.body["memoryGiB"] == 1843.0
    assert node_summary(changed(NODE, _set(["spec", "unschedulable"], True))) is None  # cordoned
    pod = pod_summary(POD).body
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0 and pod["status"]["ready"] == "True"
    assert "labels" not in pod["metadata"]  # a Deployment's pod: no label kept
    # a group pod keeps the labels that give its group and rank (verification per stage, the leader's burn-in)
    group_pod = changed(POD, _set(["metadata", "labels"], {
        "app.kubernetes.io/instance": "x", "llm-autopilot.io/group": "0", "apps.kubernetes.io/pod-index": "1",
        "controller-revision-hash": "x-0-5d8f"}))
    kept = pod_summary(group_pod).body["metadata"]["labels"]
    assert kept == {"llm-autopilot.io/group": "0", "apps.kubernetes.io/pod-index": "1"}
    assert groups.rank_of(kept) == ("0", 1)


class _Index(dict[Any, list[Summary]]):
    """A Kopf index: key -> a store (an iterable of the objects' values)."""


class _Kube(Kube):
    def __init__(self) -> None:  # no API client
        self.reads: list[tuple[str, str]] = []
        self.writes = 0
        self.applied: list[str] = []
        self.live: dict[tuple[str, str], dict[str, Any]] = {}

    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        self.reads.append((kind, name))
        return copy.deepcopy(self.live.get((kind, name)))

    def _server_side_apply(self, obj: dict[str, Any], *, dry_run: bool) -> None:
        if not dry_run:
            self.applied.append(obj["kind"])
            self.live[(obj["kind"], obj["metadata"]["name"])] = copy.deepcopy(obj)


def _watched(**stores: Any) -> Watched:
    empty: dict[str, Any] = {"nodes": _Index(), "deployments": _Index(), "services": _Index(),
                             "disruption_budgets": _Index(), "pods": _Index()}
    return Watched(**{**empty, **stores})


def _object(kind: str, input_hash: str, name: str = "x", owned: bool = True) -> dict[str, Any]:
    labels = {OWNER_LABEL: "x"} if owned else {}
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": "ns", "labels": labels,
                                                          "annotations": {INPUT_HASH: input_hash}}}


def test_the_watched_cluster_reads_from_the_indexes_and_writes_only_what_changed() -> None:
    kube = _Kube()
    deployments = _Index({("ns", "x"): [child_summary(DEPLOYMENT)]})
    services = _Index({("ns", "x"): [child_summary(_object("Service", "s1"))]})
    cluster = WatchedCluster(kube, _watched(deployments=deployments, services=services,
                                            nodes=_Index({None: [node_summary(NODE)]}),
                                            pods=_Index({("ns", "x"): [pod_summary(POD)]})))
    assert cluster.get("apps/v1", "Deployment", "x", "ns")["status"]["availableReplicas"] == 1  # type: ignore[index]
    assert cluster.get("policy/v1", "PodDisruptionBudget", "x", "ns") is None  # not in its index: absent
    assert [n.allocatable_gpus for n in cluster.gpu_nodes()] == [8]
    assert [p["metadata"]["name"] for p in cluster.pods("ns", "app.kubernetes.io/instance=x")] == ["x-1"]
    assert kube.reads == []  # all from memory
    written = cluster.apply_all([_object("Deployment", "h1"), _object("Service", "s1"),
                                 _object("PodDisruptionBudget", "b1")])
    assert written == 1 and kube.applied == ["PodDisruptionBudget"]
    assert kube.reads == []  # staleness judged by the watch: no GET before writing
    cluster.get("policy/v1", "PodDisruptionBudget", "x", "ns")
    assert kube.reads == [("PodDisruptionBudget", "x")]  # just written: read fresh, not from the index
    with pytest.raises(ValueError, match="instance"):
        cluster.pods("ns", "app=x")


def test_the_optional_crds_are_answered_from_their_watch() -> None:
    kube = _Kube()
    cluster = WatchedCluster(kube, _watched(crds=_Index({"scaledobjects.keda.sh": [True]})))
    assert cluster.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", "scaledobjects.keda.sh", "") is not None
    assert cluster.get("apiextensions.k8s.io/v1", "CustomResourceDefinition",
                       "leaderworkersets.leaderworkerset.x-k8s.io", "") is None
    assert kube.reads == []  # from memory
    cluster.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", "other.example.com", "")
    assert kube.reads == [("CustomResourceDefinition", "other.example.com")]  # not watched: asked


def test_children_the_watches_do_not_hold_are_read_before_writing() -> None:
    """A group's StatefulSet (no index) and a parked Deployment (the owner label dropped, so out of the index):
    an unchanged one is not written again on every full reconcile."""
    kube = _Kube()
    cluster = WatchedCluster(kube, _watched())
    group, parked = _object("StatefulSet", "g1", name="x-0"), _object("Deployment", "d0", owned=False)
    kube.live = {("StatefulSet", "x-0"): group, ("Deployment", "x"): parked}
    assert cluster.apply_all([group, parked]) == 0
    assert kube.reads == [("StatefulSet", "x-0"), ("Deployment", "x")] and kube.applied == []
    assert cluster.apply_all([_object("StatefulSet", "g2", name="x-0")]) == 1 and kube.applied == ["StatefulSet"]


def test_the_digest_of_an_object_covers_nodes_children_and_pods() -> None:
    base = {"nodes": _Index({None: [node_summary(NODE)]}),
            "deployments": _Index({("ns", "x"): [child_summary(DEPLOYMENT)]}),
            "pods": _Index({("ns", "x"): [pod_summary(POD)]})}
    first = _watched(**base).digest_of("ns", "x")
    assert _watched(**base).digest_of("ns", "x") == first
    assert _watched(**{**base, "pods": _Index()}).digest_of("ns", "x") != first
    assert _watched(**{**base, "deployments": _Index()}).digest_of("ns", "x") != first
    assert _watched(**{**base, "nodes": _Index()}).digest_of("ns", "x") != first
    assert _watched(**base).digest_of("ns", "y") != first  # another object: its own children
    assert current_pods([pod_summary(POD)], "p1") == ["x-1"] and current_pods([pod_summary(POD)], "p2") == []


# --- the wiring ----------------------------------------------------------------------------------------------

def _indexers() -> dict[str, Any]:
    return {h.id: h for h in kopf.get_default_registry()._indexing.get_all_handlers()}


def test_kopf_indexes_only_the_gpu_nodes_and_the_operators_watches_are_filtered_by_the_api_server(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Kopf's index-readiness wait costs O(N^2) in the indexed objects: only the few GPU nodes (the webhook's
    view) stay a Kopf index; the children, pods and nodes the reconciles read are the operator's own watches."""
    kube = _Kube()
    # configure() connects (not here) and starts the Operator's watches (recorded here)
    monkeypatch.setattr(Operator, "connect", classmethod(
        lambda cls, ours, peering=False: cls(ours, kube, peering=peering)))
    started: list[Kube] = []
    monkeypatch.setattr(Operator, "start", lambda self: started.append(self.kube))
    found = _indexers()
    assert set(found) == {"gpu_nodes"}
    assert found["gpu_nodes"].selector.any_name == "nodes" and "nvidia.com/gpu.product" in found["gpu_nodes"].labels
    settings = kopf.OperatorSettings()
    memo = kopf.Memo(settings=OperatorSettings(namespaces=("ns-a",)))  # as `llm-autopilot operator` hands them
    handlers.configure(settings=settings, logger=handlers.logger, memo=memo)
    assert started == [kube] and memo.operator.peering is not settings.peering.standalone
    assert memo.operator.settings.namespaces == ("ns-a",)
    assert settings.watching.label_selectors[("v1", "nodes")] == "nvidia.com/gpu.product"
    kube.api = kubernetes.client.ApiClient()  # no request is made
    watches = operator_watches(kube, ("ns-a", "ns-b"))
    for name in ("deployments", "services", "disruption_budgets", "pods"):
        assert [(i.namespace, i.label_selector) for i in watches[name]] == [("ns-a", OWNER_LABEL),
                                                                             ("ns-b", OWNER_LABEL)]
    assert [(i.namespace, i.label_selector) for i in watches["nodes"]] == [(None, "nvidia.com/gpu.product")]
    assert sorted(i.field_selector for i in watches["crds"]) == [
        "metadata.name=leaderworkersets.leaderworkerset.x-k8s.io", "metadata.name=scaledobjects.keda.sh"]
    (everywhere,) = operator_watches(kube, ("e2e-op-*",))["pods"]
    assert everywhere.namespace is None and everywhere.accept_namespace is not None
    assert everywhere.accept_namespace("e2e-op-1") and not everywhere.accept_namespace("other")


def test_entries_summarise_and_drop_cordoned_nodes() -> None:
    assert asyncio.run(handlers.gpu_nodes(body=NODE))[None].body["gpus"] == 8
    assert asyncio.run(handlers.gpu_nodes(body=changed(NODE, _set(["spec", "unschedulable"], True)))) == {}
    assert node_entry(NODE)[None].body["gpus"] == 8
    assert list(pod_entry(POD)) == [("ns", "x")]
    assert list(child_entry(DEPLOYMENT)) == [("ns", "x")]
    assert child_entry(changed(DEPLOYMENT, _set(["metadata", "labels"], {}))) == {}  # not the operator's


class _ParentReads(FakeCluster):
    parent_reads: int = 0

    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        self.parent_reads += kind == "LLMDeployment"
        return super().get(api_version, kind, name, namespace)


def test_the_deployment_watch_reads_nothing_while_the_reconciles_inputs_are_unchanged() -> None:
    """The watch triggers the owner's reconcile; when the watches show what its last full pass read (the quiet
    resync's fingerprint), it neither reads the LLMDeployment nor writes."""
    cluster = _ParentReads()
    operator = operator_on(cluster)
    memory = operator.quiet = QuietMemory()
    run = Run({"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-h100-80gb"}}, cluster=cluster)
    run.once()
    cluster.llmd = {"metadata": {"name": NAME, "namespace": NAMESPACE, "uid": "uid", "generation": 1,
                                 "resourceVersion": "7"}, "spec": run.spec, "status": run.status}
    operator.llmdeployments = {(NAMESPACE, NAME): llmd_summary(cluster.llmd)}
    watched = _watched(deployments=_Index({(NAMESPACE, NAME): [child_summary(cluster.deployment())]}))
    key = reconciling.quiet_key(generation=1, resource_version="7", spec_body={}, status={},
                                observed=watched.digest_of(NAMESPACE, NAME), settings=operator.settings)
    memory.remember("uid", Seen(fingerprint=key, metrics="", due=datetime.now(UTC) + timedelta(hours=1),
                                settled=True, plan_hash=None, namespace=NAMESPACE))
    operator.owner_changed(NAMESPACE, NAME, watched)
    assert cluster.parent_reads == 0 and cluster.status_patches == []
    changed_deployment = changed(cluster.deployment(), _set(["status", "availableReplicas"], 0))
    watched.deployments[(NAMESPACE, NAME)] = [child_summary(changed_deployment)]  # the watch saw the change
    indexed = operator.llmdeployments[(NAMESPACE, NAME)].body
    assert not operator.quiet_for(indexed, watched, NAMESPACE, NAME)
    assert operator.quiet_for(indexed, _watched(deployments=_Index({(NAMESPACE, NAME): [
        child_summary(cluster.deployment())]})), NAMESPACE, NAME)


def test_the_deployment_watch_reconciles_its_owner_and_writes_what_the_reconcile_says() -> None:
    """Without the quiet memory's say-so the owner is read (after a conflict, again) and reconciled; Ready is the
    reconcile's (the watch has no condition of its own)."""
    cluster = _ParentReads()
    operator = operator_on(cluster)
    run = Run({"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-h100-80gb"}}, cluster=cluster)
    run.once()
    cluster.llmd = {"metadata": {"name": NAME, "namespace": NAMESPACE, "uid": "uid", "generation": 1,
                                 "resourceVersion": "7"}, "spec": run.spec, "status": run.status}
    operator.llmdeployments = {(NAMESPACE, NAME): llmd_summary(cluster.llmd)}
    operator.owner_changed(NAMESPACE, NAME)
    assert cluster.parent_reads == 1 and cluster.status_patches == []  # Ready unchanged: nothing written
    cluster.deployment()["status"]["availableReplicas"] = 0
    cluster.conflicts = 1  # the resourceVersion read is stale: the write is refused, then read again
    operator.owner_changed(NAMESPACE, NAME)
    assert cluster.parent_reads == 3 and len(cluster.status_patches) == 1
    ready = next(c for c in cluster.status_patches[0]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Unavailable")
    run.once()  # the reconcile on its own says the same
    assert (ready["status"], ready["reason"], ready["message"]) == tuple(
        run.condition("Ready")[k] for k in ("status", "reason", "message"))


def test_the_deployment_watch_leaves_a_generation_to_its_first_reconcile() -> None:
    """Until the reconcile of a new generation has reported (observedGeneration), the watch triggers nothing: that
    reconcile is in flight and reads the Deployment itself."""
    cluster = _ParentReads()
    operator = operator_on(cluster)
    run = Run({"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-h100-80gb"}}, cluster=cluster)
    run.once()
    cluster.llmd = {"metadata": {"name": NAME, "namespace": NAMESPACE, "uid": "uid", "generation": 2,
                                 "resourceVersion": "7"}, "spec": run.spec, "status": run.status}
    cluster.deployment()["status"]["availableReplicas"] = 0
    operator.owner_changed(NAMESPACE, NAME)
    assert cluster.parent_reads == 1 and cluster.status_patches == []


def test_a_standby_replica_triggers_nothing() -> None:
    """With peering, Kopf stops the timers of a replica it pauses but not the operator's own watches: their
    triggers act only while this replica's resyncs run."""
    cluster = _ParentReads()
    operator = operator_on(cluster)
    operator.peering = True
    operator.last_resync = time.monotonic() - 3 * operator.settings.resync_seconds
    operator.owner_changed(NAMESPACE, NAME)
    assert cluster.parent_reads == 0  # paused: nothing read
    operator.last_resync = time.monotonic()  # its resyncs run: the active replica
    operator.owner_changed(NAMESPACE, NAME)
    assert cluster.parent_reads == 1
    operator.peering = False
    operator.last_resync = 0.0  # standalone: always the one
    operator.owner_changed(NAMESPACE, NAME)
    assert cluster.parent_reads == 2


def test_a_replica_that_never_resynced_is_a_standby_even_on_a_fresh_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """time.monotonic() counts from the node's boot: on a node up for less than two resync intervals (a new node,
    or any node with a long interval) a replica on which no resync has ever run is still a standby."""
    cluster = _ParentReads()
    operator = operator_on(cluster)  # its resync record as a start leaves it: none ran
    operator.peering = True
    monkeypatch.setattr(time, "monotonic", lambda: 5.0)  # the node booted 5 s ago
    operator.owner_changed(NAMESPACE, NAME)
    assert cluster.parent_reads == 0


def test_a_replica_kopf_pauses_stops_triggering_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """With peering, Kopf stops every timer of a replica it pauses (another one took over) with the reason
    OPERATOR_PAUSING: from then on its Deployment triggers act no more, not only two resync intervals later (two
    replicas reconciling at once, during a rolling upgrade two operator versions)."""
    cluster = _ParentReads()
    operator = operator_on(cluster)  # a fresh start: no resync ran, no stop flag
    operator.peering = True
    stopper = DaemonStopper()  # as Kopf hands it to the timer
    body = kopf.Body({"metadata": {"namespace": NAMESPACE, "name": NAME, "uid": "uid"}, "spec": {}})
    with monkeypatch.context() as m:
        def not_listed(namespace: str) -> Any:
            raise kopf.TemporaryError("not listed yet")
        m.setattr(operator, "watched", not_listed)
        with pytest.raises(kopf.TemporaryError):  # the resync ran (and retries later): this replica is active
            handlers.resync(body=body, patch=kopf.Patch(), memo=kopf.Memo(operator=operator),
                            stopped=stopper.sync_waiter)
    operator.owner_changed(NAMESPACE, NAME)
    assert cluster.parent_reads == 1

    async def pause() -> None:  # as Kopf's daemon killer does when the peering pauses this replica
        stopper.set(reason=kopf.DaemonStoppingReason.OPERATOR_PAUSING)

    asyncio.run(pause())
    operator.owner_changed(NAMESPACE, NAME)
    assert cluster.parent_reads == 1  # paused: nothing read, nothing written


def test_deployment_changes_queue_their_owner_once_until_its_turn() -> None:
    """The Deployment watch's events: a deletion (the resync re-creates it) and an object without the owner label
    trigger nothing; events of one owner that arrive before its turn are one reconcile."""
    handled: list[tuple[str, str]] = []
    triggers = OwnerTriggers(lambda ns, name: handled.append((ns, name)), workers=1)
    for _ in range(3):
        triggers.deployment_changed("MODIFIED", DEPLOYMENT)
    triggers.deployment_changed("DELETED", DEPLOYMENT)
    triggers.deployment_changed("MODIFIED", changed(DEPLOYMENT, _set(["metadata", "labels"], {})))
    triggers.deployment_changed("ADDED", changed(DEPLOYMENT, _set(["metadata", "labels", OWNER_LABEL], "y")))
    triggers.start()
    deadline = time.monotonic() + 10
    while len(handled) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    triggers.stop()
    assert handled == [("ns", "x"), ("ns", "y")]
