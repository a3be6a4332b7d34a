"""Replicas that span nodes: one group of pods per replica, one pod per node (pipeline stage). Pure.

vLLM 0.33 runs one engine across nodes natively (``--nnodes``, ``--node-rank``, ``--master-addr``,
``--master-port``; ``--headless`` on every node but the first, which serves the API). Two renderings:

- **StatefulSets** (always available): per replica a StatefulSet of N pods with a headless Service of its own,
  ``podManagementPolicy: Parallel`` (a leader waits for its workers before it is ready, so pods cannot be started
  one by one) and ``publishNotReadyAddresses`` (workers reach the leader before it is ready). A pod's rank is its
  ordinal (the ``apps.kubernetes.io/pod-index`` label through the downward API); a small shell wrapper adds
  ``--headless`` to ranks above 0 (one template for every pod). Every pod's probes ask the leader's ``/health``,
  so a group is ready, and stays alive, as one unit.
- **A LeaderWorkerSet** (when its CRD is in the cluster): one object, ``replicas`` groups of ``size`` pods, with
  separate leader and worker templates, its own headless Service and ``LWS_LEADER_ADDRESS``/``LWS_WORKER_INDEX``;
  the default ``RecreateGroupOnPodRestart`` restarts a group as a unit.

On a deletion every pod of a group waits in its preStop hook while the pod leaves the endpoints
(spec.vllm.drainSeconds, domain/drain.py), and a worker then waits on until its leader has drained and stopped
(:func:`worker_pre_stop`).

Every pod carries the LLMDeployment's labels and the plan hash, so a worker's crash or OOM counts against the plan
like the leader's. Clients reach the leaders through the LLMDeployment's own Service. With a burn-in
(spec.verification.burnIn) every pod of a group carries its readiness gate (a StatefulSet has one template for
every rank): the load goes to the leader, and its verdict is written on every pod of the group, which is Ready
as one unit, as its probes already make it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from llm_autopilot.domain.drain import pre_stop_seconds
from llm_autopilot.render.kubernetes import (
    PLAN_HASH,
    Owner,
    WorkloadInputs,
    burn_in_gate,
    container,
    http_probes,
    labels,
    metadata,
    plan_hash,
    pod_spec,
    selector,
    with_hash,
)
from llm_autopilot.render.vllm_args import VLLM_PORT

GROUP_LABEL = "llm-autopilot.io/group"
#: set by the StatefulSet controller on every pod (GA in Kubernetes 1.32)
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_CRD = "leaderworkersets.leaderworkerset.x-k8s.io"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
#: the labels that give a group pod's group and rank (:func:`rank_of`), kept by the operator's pod watch
RANK_LABELS = (GROUP_LABEL, POD_INDEX_LABEL, LWS_GROUP_INDEX_LABEL, LWS_WORKER_INDEX_LABEL)
#: vLLM's default --master-port (ParallelConfig.master_port)
MASTER_PORT = 29501
NODE_RANK_ENV = "LLM_AUTOPILOT_NODE_RANK"
LEADER_ENV = "LLM_AUTOPILOT_LEADER_ADDRESS"
#: StatefulSet names leave room for the pods' ordinal and the controller-revision-hash label (63 characters)
_GROUP_NAME_MAX = 47

# The same template runs every rank: rank 0 serves the API, the others join it headless.
SERVE_SCRIPT = (
    f'rank="${{{NODE_RANK_ENV}:?no pod-index label}}"; '
    'if [ "$rank" = 0 ]; then exec vllm serve "$@" --node-rank 0; fi; '
    'exec vllm serve "$@" --node-rank "$rank" --headless'
)
# Every rank probes the leader's /health (the leader itself on loopback): the group is ready as one unit, and a
# worker whose leader is gone is restarted with it, as vLLM needs.
PROBE_SCRIPT = (
    f'if [ "${NODE_RANK_ENV}" = 0 ]; then h=127.0.0.1; else h="${LEADER_ENV}"; fi; '
    "exec python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=4)' "
    f'"http://$h:{VLLM_PORT}/health"'
)


#: how often a worker's preStop asks whether its leader still answers
_LEADER_POLL_SECONDS = 2


def _leader_answers(leader: str) -> str:
    return ("python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=4)' "
            f'"http://{leader}:{VLLM_PORT}/health" 2>/dev/null')


def worker_pre_stop(inputs: WorkloadInputs, *, leader: str, rank: str | None = None) -> list[str] | None:
    """A group pod's preStop: the leader's wait (the pod leaves the endpoints), then, on a worker, a wait while
    the leader still answers. A headless worker stops its part of the engine on SIGTERM (vLLM's run_headless
    raises SystemExit), so it must outlive the leader's drain or the requests in flight fail; the kubelet ends
    the wait at the grace period. ``leader`` and ``rank`` are shell expressions (the rank: None on a
    LeaderWorkerSet's worker template, which holds workers only). None: no drain."""
    seconds = pre_stop_seconds(inputs.spec.vllm.drain_seconds)
    if not seconds:
        return None
    wait = f"while {_leader_answers(leader)}; do sleep {_LEADER_POLL_SECONDS}; done"
    if rank is not None:
        wait = f'if [ "{rank}" != 0 ]; then {wait}; fi'
    return ["/bin/sh", "-c", f"sleep {seconds}; {wait}"]


def group_name(name: str, index: int) -> str:
    """``NAME-INDEX``, shortened with a hash of the name when the pods' names would be too long."""
    candidate = f"{name}-{index}"
    if len(candidate) <= _GROUP_NAME_MAX:
        return candidate
    digest = hashlib.sha256(name.encode()).hexdigest()[:6]
    keep = _GROUP_NAME_MAX - len(f"-{digest}-{index}")
    return f"{name[:keep].rstrip('-')}-{digest}-{index}"


def leader_selector(owner: Owner, *, leader_worker_set: bool) -> dict[str, str]:
    """The pods that serve the API: rank 0 of every group."""
    return {**selector(owner), (LWS_WORKER_INDEX_LABEL if leader_worker_set else POD_INDEX_LABEL): "0"}


def rank_of(pod_labels: Mapping[str, str]) -> tuple[str, int] | None:
    """A group pod's (group, rank) from the labels its controller sets -- a StatefulSet's group label and pod
    index, or a LeaderWorkerSet's group and worker index -- (None: not a pod of a group). The rank is the pod's
    pipeline stage (one stage per node)."""
    for group_label, rank_label in ((GROUP_LABEL, POD_INDEX_LABEL), (LWS_GROUP_INDEX_LABEL, LWS_WORKER_INDEX_LABEL)):
        group, rank = pod_labels.get(group_label), pod_labels.get(rank_label)
        if isinstance(group, str) and isinstance(rank, str) and rank.isdigit() and len(rank) <= 4:
            return group, int(rank)
    return None


def _exec_probes(startup_seconds: int) -> dict[str, Any]:
    http = http_probes(startup_seconds)
    command = {"exec": {"command": ["/bin/sh", "-c", PROBE_SCRIPT]}}
    return {kind: {**command, **{k: v for k, v in probe.items() if k != "httpGet"}} for kind, probe in http.items()}


def multinode_args(args: tuple[str, ...], nodes: int, master: str) -> list[str]:
    return [*args, "--nnodes", str(nodes), "--master-addr", master, "--master-port", str(MASTER_PORT)]


def headless_service(inputs: WorkloadInputs, index: int) -> dict[str, Any]:
    owner, name = inputs.owner, group_name(inputs.owner.name, index)
    return with_hash({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, name, {GROUP_LABEL: str(index)}),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,  # the workers must find the leader before it is ready
            "selector": {**selector(owner), GROUP_LABEL: str(index)},
            "ports": [{"name": "http", "port": VLLM_PORT, "targetPort": "http", "protocol": "TCP"},
                      {"name": "master", "port": MASTER_PORT, "targetPort": MASTER_PORT, "protocol": "TCP"}],
        },
    })


def statefulset(inputs: WorkloadInputs, index: int, *, replicas: int | None = None) -> dict[str, Any]:
    """Group ``index``: N pods, rank = ordinal. ``replicas=0`` parks a group no longer wanted (the operator
    deletes nothing; the garbage collector removes it with the LLMDeployment)."""
    owner, c = inputs.owner, inputs.plan.config
    name = group_name(owner.name, index)
    leader = f"{name}-0.{name}"
    rank = {"fieldRef": {"fieldPath": f"metadata.labels['{POD_INDEX_LABEL}']"}}
    env: list[dict[str, Any]] = [{"name": NODE_RANK_ENV, "valueFrom": rank}, {"name": LEADER_ENV, "value": leader}]
    vllm = container(inputs, command=["/bin/sh", "-c", SERVE_SCRIPT, "vllm-serve"],
                     args=multinode_args(inputs.args, c.nodes, leader), probes=_exec_probes(inputs.startup_seconds),
                     env=env, pre_stop=worker_pre_stop(inputs, leader=f"${LEADER_ENV}", rank=f"${NODE_RANK_ENV}"))
    pod_labels = {**labels(owner), GROUP_LABEL: str(index)}
    return with_hash({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(owner, name, {GROUP_LABEL: str(index)}),
        "spec": {
            "replicas": c.nodes if replicas is None else replicas,
            "serviceName": name,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {**selector(owner), GROUP_LABEL: str(index)}},
            "template": {
                "metadata": {"labels": pod_labels, "annotations": {PLAN_HASH: plan_hash(inputs)}},
                "spec": burn_in_gate(inputs, pod_spec(inputs, vllm)),
            },
        },
    })


def leader_worker_set(inputs: WorkloadInputs, *, replicas: int | None = None) -> dict[str, Any]:
    """Every group in one LeaderWorkerSet: ``replicas`` groups of ``nodes`` pods."""
    owner, c = inputs.owner, inputs.plan.config
    master = "$(LWS_LEADER_ADDRESS)"
    args = multinode_args(inputs.args, c.nodes, master)
    leader = container(inputs, command=["vllm", "serve"], args=[*args, "--node-rank", "0"],
                       probes=http_probes(inputs.startup_seconds))
    worker = container(inputs, command=["vllm", "serve"],
                       args=[*args, "--node-rank", "$(LWS_WORKER_INDEX)", "--headless"], probes={},
                       pre_stop=worker_pre_stop(inputs, leader="$LWS_LEADER_ADDRESS"))
    annotations = {PLAN_HASH: plan_hash(inputs)}
    return with_hash({
        "apiVersion": LWS_API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": metadata(owner),
        "spec": {
            "replicas": inputs.replica_count if replicas is None else replicas,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": c.nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {"metadata": {"labels": labels(owner), "annotations": annotations},
                                   "spec": burn_in_gate(inputs, pod_spec(inputs, leader))},
                "workerTemplate": {"metadata": {"labels": labels(owner), "annotations": annotations},
                                   "spec": burn_in_gate(inputs, pod_spec(inputs, worker))},
            },
        },
    })


def groups_view(groups: list[Mapping[str, Any] | None], *, current_hash: str, size: int) -> dict[str, Any]:
    """The groups (live StatefulSets, or a LeaderWorkerSet as one entry per group) summarised as a Deployment
    status, one replica per group: updated when every pod of the group runs the current plan, available when
    every pod is ready. The Ready condition and the rollout guard read groups as they read a Deployment."""
    updated = available = existing = 0
    observed = True
    every_template_current = bool(groups)
    for group in groups:
        if group is None:
            every_template_current = False
            continue
        template = ((group.get("spec") or {}).get("template") or {}).get("metadata") or {}
        if (template.get("annotations") or {}).get(PLAN_HASH) != current_hash:
            every_template_current = False
        status = group.get("status") or {}
        generation = (group.get("metadata") or {}).get("generation")
        seen = status.get("observedGeneration")
        group_observed = seen is None or generation is None or seen >= generation
        observed = observed and group_observed
        existing += 1 if int(status.get("replicas") or 0) > 0 else 0
        if group_observed and int(status.get("updatedReplicas") or 0) >= size:
            updated += 1
        if int(status.get("readyReplicas") or 0) >= size:
            available += 1
    return {
        "metadata": {"generation": 1},
        "spec": {"template": {"metadata": {"annotations": {PLAN_HASH: current_hash} if every_template_current
                                           else {}}}},
        "status": {"observedGeneration": 1 if observed else 0, "replicas": existing, "updatedReplicas": updated,
                   "availableReplicas": available, "readyReplicas": available},
    }


def lws_view(lws: Mapping[str, Any] | None, *, current_hash: str) -> dict[str, Any] | None:
    """A LeaderWorkerSet's status (it counts groups) as a Deployment status."""
    if lws is None:
        return None
    status = lws.get("status") or {}
    template = (((lws.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("leaderTemplate") or {})
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    generation = int((lws.get("metadata") or {}).get("generation") or 1)
    seen = status.get("observedGeneration")
    return {
        "metadata": {"generation": generation},
        "spec": {"template": {"metadata": {"annotations": {PLAN_HASH: current_hash}
                                           if annotations.get(PLAN_HASH) == current_hash else {}}}},
        "status": {"observedGeneration": generation if seen is None else int(seen),
                   "replicas": int(status.get("replicas") or 0),
                   "updatedReplicas": int(status.get("updatedReplicas") or 0),
                   "availableReplicas": int(status.get("readyReplicas") or 0),
                   "readyReplicas": int(status.get("readyReplicas") or 0)},
    }
