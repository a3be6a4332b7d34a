"""Thin Kubernetes I/O: read nodes and objects, server-side apply, patch status. No decisions here."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError

from llm_autopilot.api import GROUP, PLURAL, VERSION
from llm_autopilot.render.kubernetes import INPUT_HASH, MANAGER, quantity_gib

GPU_RESOURCE = "nvidia.com/gpu"


def load_config() -> None:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()


@dataclass(frozen=True)
class NodeGPUs:
    labels: dict[str, str]
    allocatable_gpus: int
    allocatable_memory_gib: float = 0.0


class Kube:
    """One API client, shared by the handlers; counts its writes (for metrics and tests)."""

    def __init__(self, api_client: client.ApiClient | None = None) -> None:
        self.api = api_client or client.ApiClient()
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self._dynamic: DynamicClient | None = None
        self.writes = 0

    @property
    def dynamic(self) -> DynamicClient:
        if self._dynamic is None:
            self._dynamic = DynamicClient(self.api)
        return self._dynamic

    def gpu_nodes(self) -> list[NodeGPUs]:
        """Schedulable nodes that advertise NVIDIA GPUs."""
        nodes = self.core.list_node(label_selector="nvidia.com/gpu.product").items
        result = []
        for node in nodes:
            if node.spec and node.spec.unschedulable:
                continue
            allocatable = (node.status.allocatable or {}) if node.status else {}
            try:
                gpus = int(allocatable.get(GPU_RESOURCE, "0"))
            except ValueError:
                gpus = 0
            labels = node.metadata.labels if node.metadata else None
            memory = quantity_gib(str(allocatable.get("memory", "0")))
            result.append(NodeGPUs(dict(labels or {}), gpus, memory))
        return result

    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        resource = self.dynamic.resources.get(api_version=api_version, kind=kind)
        try:
            obj = resource.get(name=name, namespace=namespace)
        except NotFoundError:
            return None
        result: dict[str, Any] = obj.to_dict()
        return result

    def apply(self, obj: dict[str, Any]) -> bool:
        """Server-side apply unless the live object already has this input hash. True when it wrote."""
        meta = obj["metadata"]
        live = self.get(obj["apiVersion"], obj["kind"], meta["name"], meta["namespace"])
        wanted = meta.get("annotations", {}).get(INPUT_HASH)
        if live is not None and wanted and (live["metadata"].get("annotations") or {}).get(INPUT_HASH) == wanted:
            return False
        resource = self.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        resource.server_side_apply(body=obj, name=meta["name"], namespace=meta["namespace"],
                                   field_manager=MANAGER, force_conflicts=True)
        self.writes += 1
        return True

    def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        pods = self.core.list_namespaced_pod(namespace, label_selector=label_selector)
        result: list[dict[str, Any]] = self.api.sanitize_for_serialization(pods)["items"]
        return result

    def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        try:
            secret = self.core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        data = (secret.data or {}).get(key)
        return base64.b64decode(data).decode() if data else None

    def patch_llmd_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": status})
        self.writes += 1
