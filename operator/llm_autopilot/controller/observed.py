"""What the operator's watches show: GPU nodes, its children and their pods, as small summaries.

Instead of a LIST of nodes and pods and a GET of every child in each reconcile, the operator keeps one watch per
kind (filtered on the server to GPU nodes and to the operator's own objects; controller/informers.py) and
keeps a summary of every object under a key (the entries below). A reconcile reads the summaries from memory,
and the quiet resync compares their digests. A handler waits until every watch holds its first full listing,
so a reconcile right after a (re)start sees the whole cluster, not an empty one (which would look like missing
children).

The summaries keep the API's shape (the reconcile and the remediation code read them as they read the
objects), trimmed to the fields those read, each with a digest of its content.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llm_autopilot.catalog.gpus import GFD_PRODUCT
from llm_autopilot.controller.informers import (
    ChangeHandler,
    Informer,
    Informers,
    Watches,
    namespaced,
    rest_source,
    watch_scope,
)
from llm_autopilot.controller.kube import Kube, NodeGPUs
from llm_autopilot.domain.burn_in import BURN_IN_GATE
from llm_autopilot.render.autoscaling import KEDA_CRD
from llm_autopilot.render.canary import CANARY_LABEL
from llm_autopilot.render.groups import LWS_CRD, RANK_LABELS
from llm_autopilot.render.kubernetes import (
    CONTAINER,
    GPU_RESOURCE,
    INPUT_HASH,
    INSTANCE_LABEL,
    OWNER_LABEL,
    PLAN_HASH,
    VLLM_VERSION,
    quantity_gib,
)

#: the server-side label selectors of the watches (Kopf's settings.watching.label_selectors)
NODE_SELECTOR = GFD_PRODUCT
OWNED_SELECTOR = OWNER_LABEL
#: the children the watches hold (with the owner label)
WATCHED_CHILDREN = ("Deployment", "Service", "PodDisruptionBudget")
#: what a digest says for an object the watch does not show
ABSENT = "-"


def digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Summary:
    """An object as the reconcile reads it (the API's shape, trimmed), and a digest of that."""

    body: dict[str, Any]
    digest: str

    @classmethod
    def of(cls, body: dict[str, Any]) -> Summary:
        return cls(body, digest(body))


def _meta(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body.get("metadata") or {}


def _annotation(body: Mapping[str, Any], key: str) -> str | None:
    value = (_meta(body).get("annotations") or {}).get(key)
    return value if isinstance(value, str) else None


def node_gpus(body: Mapping[str, Any]) -> NodeGPUs | None:
    """A schedulable node's GPU Feature Discovery labels and allocatable GPUs and memory (None: cordoned)."""
    if (body.get("spec") or {}).get("unschedulable"):
        return None
    allocatable = (body.get("status") or {}).get("allocatable") or {}
    try:
        gpus = int(allocatable.get(GPU_RESOURCE, "0"))
    except (TypeError, ValueError):
        gpus = 0
    labels = {str(k): str(v) for k, v in (_meta(body).get("labels") or {}).items()}
    return NodeGPUs(labels, gpus, quantity_gib(str(allocatable.get("memory", "0"))))


def node_summary(body: Mapping[str, Any]) -> Summary | None:
    node = node_gpus(body)
    if node is None:
        return None
    return Summary.of({"metadata": {"name": _meta(body).get("name"), "labels": node.labels},
                       "gpus": node.allocatable_gpus, "memoryGiB": node.allocatable_memory_gib})


def child_summary(body: Mapping[str, Any]) -> Summary:
    """A Deployment, Service or PodDisruptionBudget: its input hash; a Deployment also its template's plan
    hash, generation and status (readiness, the rollout), and the release it runs (its vLLM version annotation and
    its vLLM container's image: whether a release change needs a canary, desired/sections/canary.py)."""
    meta = _meta(body)
    trimmed: dict[str, Any] = {"metadata": {"name": meta.get("name"), "generation": meta.get("generation"),
                                            "annotations": {INPUT_HASH: _annotation(body, INPUT_HASH)}}}
    template = ((body.get("spec") or {}).get("template") or {})
    if template:
        if (version := _annotation(body, VLLM_VERSION)) is not None:
            trimmed["metadata"]["annotations"][VLLM_VERSION] = version
        images = [{"name": c.get("name"), "image": c.get("image")}
                  for c in (template.get("spec") or {}).get("containers") or [] if c.get("name") == CONTAINER]
        trimmed["spec"] = {"replicas": (body.get("spec") or {}).get("replicas"),
                           "template": {"metadata": {"annotations": {PLAN_HASH: _annotation(template, PLAN_HASH)}},
                                        **({"spec": {"containers": images}} if images else {})}}
        trimmed["status"] = copy.deepcopy(dict(body.get("status") or {}))
    return Summary.of(trimmed)


def pod_summary(body: Mapping[str, Any]) -> Summary:
    """A vLLM pod: its plan hash, phase, readiness and container states (crash evidence)."""
    meta, status = _meta(body), body.get("status") or {}
    containers = [{key: copy.deepcopy(cs.get(key)) for key in ("name", "restartCount", "ready", "state", "lastState")
                   if cs.get(key) is not None} for cs in status.get("containerStatuses") or []]
    ready_conditions = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    ready = [c.get("status") for c in ready_conditions]
    # since when it is Ready (the condition's own time): a remediation step's recovery (remediation/recovery.py)
    since = ready_conditions[0].get("lastTransitionTime") if ready == ["True"] else None
    gate = [c.get("status") for c in status.get("conditions") or [] if c.get("type") == BURN_IN_GATE]
    # a group pod's group and rank (render/groups.py rank_of): its stage for verification, its leader for the
    # burn-in; none on a Deployment's pod
    # and a release canary's pod its canary label (render/canary.py; with its creation time: its start is judged
    # by its age)
    kept = {k: str(v) for k, v in (meta.get("labels") or {}).items() if k in RANK_LABELS or k == CANARY_LABEL}
    return Summary.of({
        "metadata": {"name": meta.get("name"), "uid": meta.get("uid"),
                     "annotations": {PLAN_HASH: _annotation(body, PLAN_HASH)},
                     **({"labels": kept} if kept else {}),
                     **({"creationTimestamp": meta["creationTimestamp"]} if meta.get("creationTimestamp") else {}),
                     **({"deletionTimestamp": meta["deletionTimestamp"]} if meta.get("deletionTimestamp") else {})},
        "status": {"phase": status.get("phase"), "ready": ready[0] if ready else None,
                   **({"readySince": since} if since else {}), "containerStatuses": containers,
                   "podIP": status.get("podIP"),  # where controller/lora_runtime.py reaches its vLLM
                   **({"burnIn": gate[0]} if gate else {})},  # the burn-in's readiness gate (desired/burn_in.py)
    })


def burn_in_gate(pod: Mapping[str, Any]) -> bool | None:
    """The pod's burn-in gate condition (None: not written): from its conditions or the pod watch's summary."""
    status = pod.get("status") or {}
    found = status.get("burnIn")
    if found is None:
        found = next((c.get("status") for c in status.get("conditions") or [] if c.get("type") == BURN_IN_GATE), None)
    return None if found is None else found == "True"


def containers_ready(pod: Mapping[str, Any]) -> bool:
    """Every container of the pod is ready (what its readiness gate waits beside)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and all(cs.get("ready") is True for cs in statuses)


def llmd_summary(body: Mapping[str, Any]) -> Summary:
    """What the Deployment watch needs of an LLMDeployment to decide whether to trigger its reconcile: its
    identity, generation and resourceVersion (the quiet resync's fingerprint of the object)."""
    meta = _meta(body)
    return Summary.of({
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid"),
                     "generation": meta.get("generation"), "resourceVersion": meta.get("resourceVersion")},
    })


def owner_key(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, LLMDeployment name) of an object the operator made, from its owner label."""
    owner = (_meta(body).get("labels") or {}).get(OWNER_LABEL)
    namespace = _meta(body).get("namespace")
    return (str(namespace), str(owner)) if owner and namespace else None


# ---- where each watch keeps an object: {key: summary} (nothing: not kept) ------------------------------------

def node_entry(body: Mapping[str, Any]) -> dict[Hashable, Summary]:
    """A schedulable GPU node, all under one key (None); a cordoned node is not kept."""
    summary = node_summary(body)
    return {None: summary} if summary is not None else {}


def child_entry(body: Mapping[str, Any]) -> dict[Hashable, Summary]:
    """A child the operator made (the owner label), under (namespace, its own name)."""
    key = owner_key(body)
    return {(key[0], str(_meta(body).get("name"))): child_summary(body)} if key is not None else {}


def pod_entry(body: Mapping[str, Any]) -> dict[Hashable, Summary]:
    """A vLLM pod, under (namespace, its LLMDeployment's name: the instance label)."""
    meta = _meta(body)
    instance = (meta.get("labels") or {}).get(INSTANCE_LABEL)
    namespace = meta.get("namespace")
    return {(str(namespace), str(instance)): pod_summary(body)} if namespace and instance else {}


def crd_entry(body: Mapping[str, Any]) -> dict[Hashable, bool]:
    """A CustomResourceDefinition, by its name: that it is installed."""
    return {str(_meta(body).get("name")): True}


#: the optional CRDs a reconcile asks about (LeaderWorkerSet, KEDA's ScaledObject)
WATCHED_CRDS = (LWS_CRD, KEDA_CRD)


def operator_watches(kube: Kube, namespaces: Sequence[str], *,
                     on_deployment: ChangeHandler | None = None) -> Watches:
    """The watches the reconciles read (not started): GPU nodes, the optional CRDs, and the operator's
    Deployments, Services, PodDisruptionBudgets and pods in the watched namespaces (Kopf's patterns; none: all).
    ``on_deployment`` is told of every change of a Deployment (not of the listings)."""
    names, accept = watch_scope(namespaces)

    def owned(kind: str, prefix: str, plural: str, entry: Callable[[Mapping[str, Any]], dict[Hashable, Summary]],
              on_change: ChangeHandler | None = None) -> Informers:
        source = rest_source(kube.api, kind, f"{prefix}/{plural}", f"{prefix}/namespaces/{{namespace}}/{plural}")
        return namespaced(source, entry, names, label_selector=OWNED_SELECTOR, accept_namespace=accept,
                          on_change=on_change)

    crds = rest_source(kube.api, "CustomResourceDefinition", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
    return Watches(
        nodes=Informers([Informer(rest_source(kube.api, "Node", "/api/v1/nodes"), node_entry,
                                  label_selector=NODE_SELECTOR)]),
        crds=Informers([Informer(crds, crd_entry, field_selector=f"metadata.name={name}") for name in WATCHED_CRDS]),
        deployments=owned("Deployment", "/apis/apps/v1", "deployments", child_entry, on_deployment),
        services=owned("Service", "/api/v1", "services", child_entry),
        disruption_budgets=owned("PodDisruptionBudget", "/apis/policy/v1", "poddisruptionbudgets", child_entry),
        pods=owned("Pod", "/api/v1", "pods", pod_entry),
    )


def _values(index: Any, key: Any) -> list[Summary]:
    """The summaries a watch holds under ``key``."""
    store = index.get(key) if index is not None else None
    return list(store) if store is not None else []


@dataclass(frozen=True)
class Watched:
    """The watches one handler call reads (controller/informers.py; anything whose ``get(key)`` gives the values
    kept under the key, such as a Kopf index in the tests)."""

    nodes: Any
    deployments: Any
    services: Any
    disruption_budgets: Any
    pods: Any
    #: the optional CRDs installed (WATCHED_CRDS, by name; None: not watched, asked of the API server)
    crds: Any = None

    def children(self, namespace: str, name: str) -> dict[str, Summary | None]:
        found: dict[str, Summary | None] = {}
        for kind, index in zip(WATCHED_CHILDREN, (self.deployments, self.services, self.disruption_budgets),
                               strict=True):
            summaries = _values(index, (namespace, name))
            found[kind] = summaries[0] if summaries else None
        return found

    def pods_of(self, namespace: str, name: str) -> list[Summary]:
        return sorted(_values(self.pods, (namespace, name)), key=lambda s: str(s.body["metadata"]["name"]))

    def node_summaries(self) -> list[Summary]:
        return sorted(_values(self.nodes, None), key=lambda s: s.digest)

    def digest_of(self, namespace: str, name: str) -> str:
        """Everything the watches show that one reconcile of namespace/name reads: the GPU nodes (the pools),
        its Deployment, Service and PodDisruptionBudget, and its pods."""
        parts = [s.digest for s in self.node_summaries()]
        parts += [s.digest if s is not None else ABSENT for s in self.children(namespace, name).values()]
        parts += [s.digest for s in self.pods_of(namespace, name)]
        return digest(parts)


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Whether a pod is Ready: from its conditions (a pod as the API server gives it) or from the pod watch's
    summary above (``status.ready``)."""
    status = pod.get("status") or {}
    return status.get("ready") == "True" or any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


class WatchedCluster:
    """The Kubernetes calls of one handler call: reads from the watches, writes through ``kube``; an object
    this call wrote is read from the API server again (its watch event may not have arrived yet)."""

    def __init__(self, kube: Kube, watched: Watched) -> None:
        self.kube = kube
        self.watched = watched
        self._written: set[tuple[str, str, str]] = set()

    def gpu_nodes(self) -> list[NodeGPUs]:
        return [NodeGPUs(dict(s.body["metadata"]["labels"]), int(s.body["gpus"]), float(s.body["memoryGiB"]))
                for s in self.watched.node_summaries()]

    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        if kind == "CustomResourceDefinition" and name in WATCHED_CRDS and self.watched.crds is not None:
            return {"metadata": {"name": name}} if _values(self.watched.crds, name) else None
        children = self.watched.children(namespace, name)
        if kind in children and (kind, namespace, name) not in self._written:
            found = children[kind]
            return copy.deepcopy(found.body) if found is not None else None
        return self.kube.get(api_version, kind, name, namespace)

    def get_whole(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        """The object from the API server, whole: the watches keep only summaries of the children."""
        return self.kube.get(api_version, kind, name, namespace)

    def _stale(self, obj: dict[str, Any]) -> bool:
        """Whether the object must be written. The watches hold the Deployment, Service and PodDisruptionBudget
        that carry the owner label: shown with this input hash, fresh; shown otherwise or absent, stale. What
        they do not hold (a group's StatefulSet, a LeaderWorkerSet, a ScaledObject, a parked Deployment, which
        has lost the owner label) is read from the API server, so an unchanged one is not written again."""
        meta = obj["metadata"]
        if obj["kind"] not in WATCHED_CHILDREN or OWNER_LABEL not in (meta.get("labels") or {}):
            return self.kube.stale(obj)
        live = self.watched.children(meta["namespace"], meta["name"]).get(obj["kind"])
        wanted = (meta.get("annotations") or {}).get(INPUT_HASH)
        return not (wanted and live is not None and live.body["metadata"]["annotations"].get(INPUT_HASH) == wanted)

    def apply_all(self, objects: list[dict[str, Any]], before_write: Callable[[], None] | None = None) -> int:
        """As Kube.apply_all, judging staleness by the watch instead of a GET per object. Should the watch lag
        behind a write, the object is applied again as it is, which the API server takes as a no-op (no new
        resourceVersion)."""
        written = self.kube.apply_changed(objects, stale=self._stale, before_write=before_write)
        self._written |= {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]) for o in written}
        return len(written)

    def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        key, _, instance = label_selector.partition("=")
        if key != INSTANCE_LABEL or not instance or "," in instance:
            raise ValueError(f"the pod watch is indexed by {INSTANCE_LABEL}=NAME only, not {label_selector!r}")
        return [copy.deepcopy(s.body) for s in self.watched.pods_of(namespace, instance)]

    def previous_log(self, namespace: str, pod: str, container: str, *, tail_lines: int, limit_bytes: int) -> str:
        return self.kube.previous_log(namespace, pod, container, tail_lines=tail_lines, limit_bytes=limit_bytes)

    def delete(self, api_version: str, kind: str, name: str, namespace: str, *, uid: str) -> bool:
        self._written.add((kind, namespace, name))
        return self.kube.delete(api_version, kind, name, namespace, uid=uid)

    def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        return self.kube.secret_value(namespace, name, key)

    def patch_llmd_status(self, namespace: str, name: str, status: dict[str, Any],
                          resource_version: str | None = None) -> None:
        self.kube.patch_llmd_status(namespace, name, status, resource_version=resource_version)

    def patch_pod_condition(self, namespace: str, pod: str, condition: dict[str, Any]) -> None:
        self.kube.patch_pod_condition(namespace, pod, condition)

    def current_log(self, namespace: str, pod: str, container: str, *, tail_lines: int, limit_bytes: int) -> str:
        return self.kube.current_log(namespace, pod, container, tail_lines=tail_lines, limit_bytes=limit_bytes)

    def start_log(self, namespace: str, pod: str, container: str, *, limit_bytes: int) -> str:
        return self.kube.start_log(namespace, pod, container, limit_bytes=limit_bytes)

    def job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        """The pods of a model cache's download Job: from the API server (the pod watch holds vLLM's only)."""
        return self.kube.job_pods(namespace, job)


def current_pods(pods: Iterable[Summary], plan_hash: str | None) -> list[str]:
    """Names of the pods that run the plan with ``plan_hash``."""
    return [str(s.body["metadata"]["name"]) for s in pods
            if plan_hash and s.body["metadata"]["annotations"].get(PLAN_HASH) == plan_hash]

