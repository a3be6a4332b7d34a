"""Shell: the World one reconcile decides on, read before anything is decided -- the model's architecture from
its source, the GPU nodes, the optional CRDs, the live workload shapes and the LoRA adapters' configs;
desired/ decides on it, without I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec, SourceStatus
from llm_autopilot.controller.adapters import read_adapter_configs
from llm_autopilot.controller.inspect_step import AdapterInspections
from llm_autopilot.controller.kube import NodeGPUs, api_message
from llm_autopilot.controller.settings import OperatorSettings
from llm_autopilot.controller.sources import resolve_spec_source
from llm_autopilot.desired.vocabulary import WorkloadAsk
from llm_autopilot.desired.world import AdapterReading, GPUNode, SourceView, World
from llm_autopilot.domain.architecture import ModelArchitecture
from llm_autopilot.hub.client import HubClient, ModelFiles
from llm_autopilot.hub.resolve import ModelResolutionError
from llm_autopilot.render import groups, network_policy
from llm_autopilot.render.autoscaling import KEDA_CRD
from llm_autopilot.render.workload import Live, Shape


class WorldSource(Protocol):
    """The Kubernetes reads of the World (Kube, the watches' WatchedCluster; in-memory fakes in tests)."""

    def gpu_nodes(self) -> list[NodeGPUs]: ...

    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None: ...

    def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        """None when the Secret or key does not exist; raises ApiException otherwise."""
        ...


class SecretUnreadable(RuntimeError):
    """The Hub token Secret exists (or may) but could not be read, e.g. 403 without `get secrets`."""


def secret(kube: WorldSource, namespace: str, name: str, key: str, what: str) -> str:
    """A Secret's value the operator needs itself (the Hub token, S3 keys); raises with what to do."""
    try:
        value = kube.secret_value(namespace, name, key)
    except ApiException as exc:
        hint = ("; grant the operator `get` on secrets (the chart: rbac.readSecrets=true)"
                if exc.status == 403 else "")
        raise SecretUnreadable(f"cannot read Secret {name!r} (key {key!r}) for {what} in namespace "
                               f"{namespace}: {api_message(exc)}{hint}") from exc
    if value is None:
        raise ModelResolutionError(f"Secret {name!r} (key {key!r}) for {what} was not found in "
                                   f"namespace {namespace}")
    return value


def hub_token(spec: LLMDeploymentSpec, namespace: str, kube: WorldSource) -> str | None:
    ref = spec.model.hub_token_secret_ref
    if ref is None:
        return None
    return secret(kube, namespace, ref.name, ref.key, "the Hub token")


class LazyTokenHubClient(HubClient):
    """Reads the token Secret only when the Hub is really called: never for catalog or inline models."""

    def __init__(self, token: Callable[[], str | None], *, timeout: float) -> None:
        super().__init__(timeout=timeout)
        self._token_source = token
        self._timeout_seconds = timeout

    def fetch(self, repo_id: str, revision: str | None = None) -> ModelFiles:
        return HubClient(token=self._token_source(), timeout=self._timeout_seconds).fetch(repo_id, revision)


def read_model(spec: LLMDeploymentSpec, namespace: str, kube: WorldSource, settings: OperatorSettings,
               volume: ModelFiles | None = None) -> ModelArchitecture:
    """The model's architecture from its source (``volume``: what a pvc:// source's inspect Job read); raises
    ModelResolutionError (and its kinds) or SecretUnreadable."""
    return read_model_source(spec, namespace, kube, settings, volume)[0]


def read_model_source(spec: LLMDeploymentSpec, namespace: str, kube: WorldSource, settings: OperatorSettings,
                      volume: ModelFiles | None = None, recorded: SourceStatus | None = None,
                      ) -> tuple[ModelArchitecture, SourceStatus | None]:
    """:func:`read_model`, and what an s3:// source's reading leaves for status.source (``recorded``: the one
    kept there, so unchanged objects are not read again)."""
    return resolve_spec_source(
        spec, hub=LazyTokenHubClient(lambda: hub_token(spec, namespace, kube), timeout=settings.hub_timeout_seconds),
        secret=lambda name, key, what: secret(kube, namespace, name, key, what),
        timeout=settings.hub_timeout_seconds, volume=volume, recorded=recorded)


def read_live(kube: WorldSource, name: str, namespace: str, lws_available: bool,
              policy_left: bool = False) -> Live:
    """The shapes that exist: one GET each (a LeaderWorkerSet only where its CRD is installed); with
    ``policy_left`` (the operator renders no NetworkPolicy), whether one of the object's name is still there."""
    found: list[int] = []
    while kube.get("apps/v1", "StatefulSet", groups.group_name(name, len(found)), namespace) is not None:
        found.append(len(found))
    lws = lws_available and kube.get(groups.LWS_API_VERSION, "LeaderWorkerSet", name, namespace) is not None
    policy = policy_left and kube.get(network_policy.API_VERSION, network_policy.KIND, name, namespace) is not None
    return Live(lws_available=lws_available, deployment=kube.get("apps/v1", "Deployment", name, namespace) is not None,
                leader_worker_set=lws, groups=tuple(found), network_policy=policy)


def read_nodes(kube: WorldSource) -> tuple[GPUNode, ...]:
    return tuple(GPUNode(dict(n.labels), n.allocatable_gpus, n.allocatable_memory_gib) for n in kube.gpu_nodes())


def crd_installed(kube: WorldSource, name: str) -> bool:
    return kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name, "") is not None


def read_adapters(spec: LLMDeploymentSpec, namespace: str, kube: WorldSource, settings: OperatorSettings,
                  inspected: AdapterInspections | None = None) -> AdapterReading:
    """The LoRA adapters' adapter_config.json files (on every pass: the Hub client's cache answers an unchanged
    file with one HEAD request; an s3:// adapter's is one HEAD and one GET; a pvc:// adapter's is what its inspect
    Job read, ``inspected``); nothing to read without adapters."""
    return read_adapter_configs(spec, lambda: hub_token(spec, namespace, kube), timeout=settings.hub_timeout_seconds,
                                secret=lambda name, key, what: secret(kube, namespace, name, key, what),
                                inspected=inspected)


def read_world(spec: LLMDeploymentSpec, name: str, namespace: str, kube: WorldSource,
               settings: OperatorSettings, volume: ModelFiles | None = None,
               recorded: SourceStatus | None = None, adapters: AdapterInspections | None = None) -> World:
    """Everything one reconcile of namespace/name decides on, read once before deciding: the model first (its
    failure is the reconcile's answer; ``recorded``: status.source, an s3:// source's kept reading, which the
    World's ``source`` then carries), then the GPU nodes, the CRDs (KEDA's only when spec.autoscaling asks for it),
    the live shapes and the LoRA adapters' configs (``adapters``: what the pvc:// adapters' inspect Jobs read)."""
    (model, reading), nodes = read_model_source(spec, namespace, kube, settings, volume, recorded), read_nodes(kube)
    asked = (groups.LWS_CRD, *((KEDA_CRD,) if spec.autoscaling is not None else ()))
    crds = frozenset(c for c in asked if crd_installed(kube, c))
    live = read_live(kube, name, namespace, groups.LWS_CRD in crds, policy_left=settings.network_policy is None)
    return World(model, nodes, crds, live,
                 adapters=read_adapters(spec, namespace, kube, settings, adapters),
                 source=SourceView(reading) if reading is not None else None)


def workload_view(kube: WorldSource, asked: WorkloadAsk) -> dict[str, Any] | None:
    """The serving workload's status as a Deployment's: the Deployment itself, or the groups summarised."""
    name, namespace = asked.name, asked.namespace
    if asked.shape is Shape.DEPLOYMENT:
        return kube.get("apps/v1", "Deployment", name, namespace)
    if asked.shape is Shape.LEADER_WORKER_SET:
        return groups.lws_view(kube.get(groups.LWS_API_VERSION, "LeaderWorkerSet", name, namespace),
                               current_hash=asked.plan_hash)
    return groups.groups_view(
        [kube.get("apps/v1", "StatefulSet", groups.group_name(name, i), namespace)
         for i in range(asked.replicas)], current_hash=asked.plan_hash, size=asked.nodes)
