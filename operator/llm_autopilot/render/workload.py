"""Which objects serve a plan: a Deployment, or groups across nodes (StatefulSets or a LeaderWorkerSet), the
clients' Service, the PodDisruptionBudget, KEDA's ScaledObject and, when the operator renders them, the
NetworkPolicy. Pure.

The operator deletes nothing (owner references garbage-collect everything with the LLMDeployment), so a shape a
plan no longer uses -- the Deployment after a switch to groups, groups beyond the replica count after a scale-in,
StatefulSets after the LeaderWorkerSet CRD appeared -- is kept at zero pods, and taken up again when needed. The
one exception is a NetworkPolicy left from when the operator rendered them (``Live.network_policy``): the
reconcile deletes it (desired/sections/network_policy.py), since a policy no longer rendered would go on cutting
clients.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from llm_autopilot.render import groups
from llm_autopilot.render.autoscaling import scaled_object
from llm_autopilot.render.kubernetes import (
    INPUT_HASH,
    OWNER_LABEL,
    WorkloadInputs,
    deployment,
    pod_disruption_budget,
    selector,
    service,
    with_hash,
)
from llm_autopilot.render.network_policy import NetworkPolicySettings, network_policy


@dataclass(frozen=True)
class Live:
    """What already exists of the shapes a plan can take (read once per reconcile): the operator deletes
    nothing, so a shape no longer used is kept at zero pods."""

    lws_available: bool = False
    deployment: bool = False
    leader_worker_set: bool = False
    #: indexes of the replica groups' StatefulSets that exist
    groups: tuple[int, ...] = ()
    #: a NetworkPolicy of the object's name exists (read only while the operator renders none)
    network_policy: bool = False


def _parked_deployment(inputs: WorkloadInputs) -> dict[str, Any]:
    """A Deployment no longer used: no pods, and without the owner label, so the readiness watch ignores it."""
    obj = deployment(inputs, replicas=0)
    obj["metadata"]["labels"].pop(OWNER_LABEL, None)
    obj["metadata"]["annotations"].pop(INPUT_HASH, None)
    return with_hash(obj)


class Shape(StrEnum):
    """What runs the replicas."""

    DEPLOYMENT = "Deployment"
    STATEFULSETS = "StatefulSets"
    LEADER_WORKER_SET = "LeaderWorkerSet"


@dataclass(frozen=True)
class Workload:
    objects: list[dict[str, Any]]
    #: the pods that serve the API (the scale subresource's selector): every pod, or the groups' leaders
    serving: dict[str, str]
    shape: Shape


def children(inputs: WorkloadInputs, live: Live, network: NetworkPolicySettings | None = None) -> Workload:
    """The objects that serve this plan, with unused shapes at zero pods; with ``network`` (the chart's
    networkPolicy switch on), the NetworkPolicy over its pods."""
    owner, config = inputs.owner, inputs.plan.config
    objects: list[dict[str, Any]]
    parked: list[dict[str, Any]] = []
    if config.nodes == 1:
        shape, serving = Shape.DEPLOYMENT, selector(owner)
        objects = [deployment(inputs)]
        parked += [groups.statefulset(inputs, i, replicas=0) for i in live.groups]
        if live.leader_worker_set:
            parked.append(groups.leader_worker_set(inputs, replicas=0))
    elif live.lws_available:
        shape, serving = Shape.LEADER_WORKER_SET, groups.leader_selector(owner, leader_worker_set=True)
        objects = [groups.leader_worker_set(inputs)]
        parked += [groups.statefulset(inputs, i, replicas=0) for i in live.groups]
    else:
        shape, serving = Shape.STATEFULSETS, groups.leader_selector(owner, leader_worker_set=False)
        wanted = inputs.replica_count
        objects = []
        for i in range(wanted):
            objects += [groups.headless_service(inputs, i), groups.statefulset(inputs, i)]
        parked += [groups.statefulset(inputs, i, replicas=0) for i in live.groups if i >= wanted]
        if live.leader_worker_set:
            parked.append(groups.leader_worker_set(inputs, replicas=0))
    if config.nodes > 1 and live.deployment:
        parked.append(_parked_deployment(inputs))
    objects += [service(inputs, serving), pod_disruption_budget(inputs)]
    policy = inputs.spec.autoscaling
    if policy is not None and inputs.prometheus_address:
        objects.append(scaled_object(owner, policy, inputs.prometheus_address))
    if network is not None:
        objects.append(network_policy(owner, inputs.spec, network))
    return Workload(objects + parked, serving, shape)
