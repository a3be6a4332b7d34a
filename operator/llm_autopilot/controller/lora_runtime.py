"""Shell: make each Ready vLLM pod serve the spec's LoRA adapters, and say where each one is served.

desired/lora_sync.py decides (runtime or rollout, what to load and unload on a pod, the status); this module
reads each Ready pod's ``/v1/models`` and, when updates are runtime, calls vLLM's ``/v1/load_lora_adapter`` and
``/v1/unload_lora_adapter`` on it, then reads ``/v1/models`` again: the status is what the pods answered, not
what was asked. With rollout updates it only reads. Idempotent: a pod that serves the spec's adapters gets no
call; a restarted pod (which serves none) gets them all again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from llm_autopilot.controller.observed import pod_ready
from llm_autopilot.desired import lora_sync
from llm_autopilot.desired.lora_sync import Action, PodView, Served, Updates
from llm_autopilot.domain import egress
from llm_autopilot.remediation.text import clean_line
from llm_autopilot.render.vllm_args import VLLM_PORT

__all__ = ["ReadyPod", "VLLMAdapters", "ready_pods", "sync_pods"]

logger = logging.getLogger(__name__)
#: a read of /v1/models; a load downloads the adapter from the Hub and loads it into the engine
READ_SECONDS = 10.0
LOAD_SECONDS = 120.0
#: a pod the operator cannot reach costs this much per reconcile, not the read's whole timeout
CONNECT_SECONDS = 3.0


class CallFailed(RuntimeError):
    """vLLM did not do what was asked: its answer (or why there was none), in one line."""


class VLLMAdapters:
    """vLLM's model list and its runtime LoRA calls on one server (``base``: ``http://ip:port``)."""

    def __init__(self, base: str, *, transport: httpx.BaseTransport | None = None) -> None:
        self.client = httpx.Client(base_url=base, transport=transport,
                                   timeout=httpx.Timeout(READ_SECONDS, connect=CONNECT_SECONDS))

    def __enter__(self) -> VLLMAdapters:
        return self

    def __exit__(self, *_: object) -> None:
        self.client.close()

    def served(self) -> tuple[Served, ...]:
        try:
            response = self.client.get("/v1/models")
            response.raise_for_status()
            served = lora_sync.served_adapters(response.json())
        except (httpx.HTTPError, ValueError) as exc:
            raise CallFailed(f"/v1/models: {clean_line(str(exc), 200)}") from exc
        if served is None:
            raise CallFailed("/v1/models: not an OpenAI model list")
        return served

    def apply(self, action: Action) -> None:
        if action.kind == "load":
            path, body = "/v1/load_lora_adapter", {"lora_name": action.name, "lora_path": action.path,
                                                   "load_inplace": action.inplace}
        else:
            path, body = "/v1/unload_lora_adapter", {"lora_name": action.name}
        try:
            response = self.client.post(path, json=body, timeout=LOAD_SECONDS)
        except httpx.HTTPError as exc:
            raise CallFailed(f"{path}: {clean_line(str(exc), 200)}") from exc
        if response.status_code == 404 and "lora" not in response.text.lower():  # FastAPI's own "Not Found"
            raise CallFailed(f"{path}: 404: the server has no runtime LoRA API (VLLM_ALLOW_RUNTIME_LORA_UPDATING)")
        if response.status_code != 200:
            raise CallFailed(f"{path}: {response.status_code}: {clean_line(_message(response), 300)}")


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text
    error = body.get("error") if isinstance(body, dict) else None
    return str(error.get("message") if isinstance(error, dict) else body)


@dataclass(frozen=True)
class ReadyPod:
    name: str
    address: str


def ready_pods(pods: Sequence[Mapping[str, Any]]) -> list[ReadyPod]:
    """The pods that serve (Ready, not being deleted, with an IP), by name."""
    found = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if pod_ready(pod) and not meta.get("deletionTimestamp") and status.get("podIP") and meta.get("name"):
            found.append(ReadyPod(str(meta["name"]), str(status["podIP"])))
    return sorted(found, key=lambda p: p.name)


Client = Any  # a factory: (base URL) -> VLLMAdapters


def sync_pods(updates: Updates, want: Sequence[Served], pods: Sequence[ReadyPod], *,
              client: Client | None = None, port: int = VLLM_PORT) -> tuple[list[PodView], list[tuple[str, str, str]]]:
    """Each pod's view after the sync, and the events (type, reason, message) of the calls made."""
    views, events = [], []
    client = client or VLLMAdapters
    for pod in pods:
        refused = egress.pod_address_problem(pod.address)
        if refused is not None:  # a pod IP, in-cluster by design, but never loopback or the metadata service
            views.append(PodView(pod.name, None, unreadable=refused))
            continue
        host = f"[{pod.address}]" if ":" in pod.address else pod.address
        with client(f"http://{host}:{port}") as vllm:
            try:
                served = vllm.served()
            except CallFailed as exc:
                views.append(PodView(pod.name, None, unreadable=str(exc)))
                continue
            todo = lora_sync.actions(want, served) if updates.runtime else ()
            errors: dict[str, str] = {}
            for action in todo:
                try:
                    vllm.apply(action)
                except CallFailed as exc:
                    errors[action.name] = str(exc)
                    events.append(("Warning", "LoRAAdapterFailed", f"{action.kind} {action.name} on {pod.name}: "
                                                                   f"{exc}"))
                    continue
                verb = "Loaded" if action.kind == "load" else "Unloaded"
                events.append(("Normal", f"LoRAAdapter{verb}", f"{verb.lower()} {action.name} on {pod.name} at "
                                                               "runtime (no restart)"))
            if todo:
                try:
                    served = vllm.served()
                except CallFailed as exc:
                    views.append(PodView(pod.name, None, errors, unreadable=str(exc)))
                    continue
            views.append(PodView(pod.name, served, errors))
    return views, events
