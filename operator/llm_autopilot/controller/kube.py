"""Thin Kubernetes I/O: read nodes and objects, server-side apply, patch status. No decisions here."""

from __future__ import annotations

import base64
import codecs
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ConflictError, NotFoundError

from llm_autopilot.api import GROUP, PLURAL, VERSION
from llm_autopilot.render.kubernetes import GPU_RESOURCE, INPUT_HASH, MANAGER, quantity_gib

#: (connect, read) seconds for a previous-log read: a kubelet that is gone must not hold a handler thread
LOG_TIMEOUT = (3.0, 10.0)
_MESSAGE_LIMIT = 500


class LogUnavailable(RuntimeError):
    """The previous container's log could not be read; the message says why (evidence falls back)."""


class ApplyRejected(RuntimeError):
    """The API server refused an object (validation, admission, quota); nothing was written."""


def api_message(exc: ApiException) -> str:
    """The API server's own message (a Status object's ``message``), else the HTTP status and reason."""
    body = getattr(exc, "body", None)
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    if isinstance(body, str) and body:
        try:
            message = json.loads(body).get("message")
        except (ValueError, AttributeError):
            message = None
        if isinstance(message, str) and message:
            return message[:_MESSAGE_LIMIT]
    return f"{exc.status} {exc.reason}"[:_MESSAGE_LIMIT]


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


#: the calibration store's reads and writes wait no longer than this (a reconcile waits on the read)
CONFIG_MAP_SECONDS = 10


class WriteConflict(RuntimeError):
    """The object changed since it was read (409), or was created meanwhile: nothing was written."""


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

    def get_whole(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        """As ``get``: this client always reads the whole object from the API server."""
        return self.get(api_version, kind, name, namespace)

    def delete(self, api_version: str, kind: str, name: str, namespace: str, *, uid: str) -> bool:
        """Delete the object if it still is the one with this uid (a precondition: one made again meanwhile is
        left alone); False when it was gone or replaced."""
        resource = self.dynamic.resources.get(api_version=api_version, kind=kind)
        try:
            resource.delete(name=name, namespace=namespace, body={"preconditions": {"uid": uid}})
        except (NotFoundError, ConflictError):
            return False
        self.writes += 1
        return True

    def stale(self, obj: dict[str, Any]) -> bool:
        """Whether the live object lacks this input hash (so it must be written)."""
        meta = obj["metadata"]
        live = self.get(obj["apiVersion"], obj["kind"], meta["name"], meta["namespace"])
        wanted = meta.get("annotations", {}).get(INPUT_HASH)
        have = (live["metadata"].get("annotations") or {}).get(INPUT_HASH) if live is not None else None
        return not (wanted and have == wanted)

    def _server_side_apply(self, obj: dict[str, Any], *, dry_run: bool) -> None:
        meta = obj["metadata"]
        resource = self.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        resource.server_side_apply(body=obj, name=meta["name"], namespace=meta["namespace"], field_manager=MANAGER,
                                   force_conflicts=True, **({"dry_run": "All"} if dry_run else {}))

    def apply_all(self, objects: list[dict[str, Any]], before_write: Callable[[], None] | None = None) -> int:
        """Server-side apply every object whose live copy lacks its input hash; the number written.

        Every write is first tried as a server-side dry run, so one rejected object stops the whole set before
        anything is written (no Deployment on GPUs whose Service the API server refuses). ``before_write`` runs
        once the dry runs passed and before the first write (the reconcile records a remediation step and a new
        calibration choice there).
        """
        return len(self.apply_changed(objects, before_write=before_write))

    def apply_changed(self, objects: list[dict[str, Any]],
                      stale: Callable[[dict[str, Any]], bool] | None = None,
                      before_write: Callable[[], None] | None = None) -> list[dict[str, Any]]:
        """apply_all, returning the objects written; ``stale(obj)`` says which to write (default: a GET of each
        finds the live copy without the input hash)."""
        changed = [obj for obj in objects if (stale or self.stale)(obj)]
        for obj in changed:
            try:
                self._server_side_apply(obj, dry_run=True)
            except ApiException as exc:
                raise ApplyRejected(f"{obj['kind']} {obj['metadata']['name']}: {api_message(exc)}") from exc
        if before_write is not None:
            before_write()
        for obj in changed:
            try:
                self._server_side_apply(obj, dry_run=False)
            except ApiException as exc:  # accepted dry, refused for real (a race): say so, the next pass retries
                raise ApplyRejected(f"{obj['kind']} {obj['metadata']['name']}: {api_message(exc)}") from exc
            self.writes += 1
        return changed

    def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        pods = self.core.list_namespaced_pod(namespace, label_selector=label_selector)
        result: list[dict[str, Any]] = self.api.sanitize_for_serialization(pods)["items"]
        return result

    def job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        """The pods a Job created (the model cache's download)."""
        return self.pods(namespace, f"job-name={job}")

    def previous_log(self, namespace: str, pod: str, container: str, *, tail_lines: int, limit_bytes: int) -> str:
        """The previous (terminated) container's log tail, through the API server; raises LogUnavailable."""
        return self._log(namespace, pod, container, tail_lines=tail_lines, limit_bytes=limit_bytes, previous=True)

    def current_log(self, namespace: str, pod: str, container: str, *, tail_lines: int, limit_bytes: int) -> str:
        """The running (or last) container's log tail (the cache download's progress); raises LogUnavailable."""
        return self._log(namespace, pod, container, tail_lines=tail_lines, limit_bytes=limit_bytes, previous=False)

    def start_log(self, namespace: str, pod: str, container: str, *, limit_bytes: int) -> str:
        """The first ``limit_bytes`` of the running container's log (vLLM's start-up lines: without tailLines,
        limitBytes counts from the log's start); raises LogUnavailable."""
        return self._log(namespace, pod, container, tail_lines=None, limit_bytes=limit_bytes, previous=False)

    def _log(self, namespace: str, pod: str, container: str, *, tail_lines: int | None, limit_bytes: int,
             previous: bool) -> str:
        try:
            response: Any = self.core.read_namespaced_pod_log(  # the raw urllib3 response: bytes, not JSON
                pod, namespace, container=container, previous=previous, tail_lines=tail_lines,
                limit_bytes=limit_bytes,
                _preload_content=False, _request_timeout=LOG_TIMEOUT)
            data: bytes = response.data
        except ApiException as exc:  # 403 without pods/log, 404/400 no previous container, 5xx kubelet gone
            raise LogUnavailable(f"{exc.status} {exc.reason}: {api_message(exc)}") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:  # timeouts, connection errors
            raise LogUnavailable(f"{type(exc).__name__}: {exc}") from exc
        # not final: a character cut off by limitBytes is dropped, not turned into a replacement character
        text: str = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(data[:limit_bytes], final=False)
        return text

    def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        try:
            secret = self.core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        data = (secret.data or {}).get(key)
        return base64.b64decode(data).decode() if data else None

    def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found = self.core.read_namespaced_config_map(name, namespace, _request_timeout=CONFIG_MAP_SECONDS)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        result: dict[str, Any] = self.api.sanitize_for_serialization(found)
        return result

    def write_config_map(self, namespace: str, name: str, data: dict[str, str], *, resource_version: str | None,
                         labels: dict[str, str], annotations: dict[str, str]) -> None:
        """Create the ConfigMap (no ``resource_version``) or replace it at that version; WriteConflict when it
        changed (or appeared) since it was read."""
        body = client.V1ConfigMap(api_version="v1", kind="ConfigMap", data=data, metadata=client.V1ObjectMeta(
            name=name, namespace=namespace, labels=labels, annotations=annotations or None,
            resource_version=resource_version))
        try:
            if resource_version is None:
                self.core.create_namespaced_config_map(namespace, body, _request_timeout=CONFIG_MAP_SECONDS)
            else:
                self.core.replace_namespaced_config_map(name, namespace, body, _request_timeout=CONFIG_MAP_SECONDS)
        except ApiException as exc:
            if exc.status == 409:
                raise WriteConflict(api_message(exc)) from exc
            raise
        self.writes += 1

    def patch_pod_condition(self, namespace: str, pod: str, condition: dict[str, Any]) -> None:
        """One condition of a pod's status, strategic-merged by type (the kubelet's conditions stay)."""
        self.core.patch_namespaced_pod_status(pod, namespace, {"status": {"conditions": [condition]}},
                                              _content_type="application/strategic-merge-patch+json")
        self.writes += 1

    def patch_llmd_status(self, namespace: str, name: str, status: dict[str, Any],
                          resource_version: str | None = None) -> None:
        """Merge-patch the status; with ``resource_version`` the API server refuses (409) if it changed since."""
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, body)
        self.writes += 1
