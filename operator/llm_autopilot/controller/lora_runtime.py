"""Shell: read what each Ready vLLM pod serves, make the LoRA load and unload calls desired() decided, and keep
vLLM's answers to them.

desired/lora_sync.py and desired/lora_calls.py decide (runtime or rollout, the calls each pod needs, the status);
this module reads each Ready pod's ``/v1/models`` (controller/features/lora.py's reader, before desired()) and
calls vLLM's ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` on it (its executor, after the apply).
The answers are kept in the operator's memory (LoRAAnswers) for the next pass, which reads the pods again: the
status is what the pods serve, not what was asked. Idempotent: a pod that serves the spec's adapters gets no
call; a restarted pod (which serves none) gets them all again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from llm_autopilot.controller.observed import pod_ready
from llm_autopilot.desired import lora_sync
from llm_autopilot.desired.lora_calls import LoRAPodCalls
from llm_autopilot.desired.lora_sync import Action, Answer, PodView, Served
from llm_autopilot.domain import egress
from llm_autopilot.remediation.text import clean_line
from llm_autopilot.render.vllm_args import VLLM_PORT

__all__ = ["LoRAAnswers", "ReadyPod", "VLLMAdapters", "call_pod", "read_pods", "ready_pods"]

logger = logging.getLogger(__name__)
#: a read of /v1/models; a load downloads the adapter from the Hub and loads it into the engine
READ_SECONDS = 10.0
LOAD_SECONDS = 120.0
#: a pod the operator cannot reach costs this much per reconcile, not the read's whole timeout
CONNECT_SECONDS = 3.0


class CallFailed(RuntimeError):
    """vLLM did not do what was asked: its answer (or why there was none), in one line; ``refused``: vLLM
    answered (an HTTP error of its own), not a call that got no answer."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


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
            raise CallFailed(f"{path}: 404: the server has no runtime LoRA API (VLLM_ALLOW_RUNTIME_LORA_UPDATING)",
                             refused=True)
        if response.status_code != 200:
            raise CallFailed(f"{path}: {response.status_code}: {clean_line(_message(response), 300)}", refused=True)


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
    uid: str = ""


def ready_pods(pods: Sequence[Mapping[str, Any]]) -> list[ReadyPod]:
    """The pods that serve (Ready, not being deleted, with an IP), by name."""
    found = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if pod_ready(pod) and not meta.get("deletionTimestamp") and status.get("podIP") and meta.get("name"):
            found.append(ReadyPod(str(meta["name"]), str(status["podIP"]), str(meta.get("uid") or "")))
    return sorted(found, key=lambda p: p.name)


class LoRAAnswers:
    """vLLM's answers to the operator's load and unload calls, per LLMDeployment and pod uid, keyed by adapter and
    source: the newest answer of each. In memory only (the Operator owns one): after a restart it is empty, so the
    next pass calls again and hears a refusal again. A pod's answers go when a pass no longer reads it Ready
    (LoRAKeep), an object's when it is deleted."""

    def __init__(self) -> None:
        self._answers: dict[str, dict[str, dict[tuple[str, str, str], Answer]]] = {}
        self._lock = threading.Lock()

    def of(self, owner: str, uid: str) -> tuple[Answer, ...]:
        with self._lock:
            return tuple((self._answers.get(owner) or {}).get(uid, {}).values())

    def record(self, owner: str, uid: str, answer: Answer) -> None:
        with self._lock:
            self._answers.setdefault(owner, {}).setdefault(uid, {})[answer.kind, answer.name, answer.source] = answer

    def keep(self, owner: str, uids: Collection[str]) -> None:
        """Drop the owner's answers of the pods other than ``uids``."""
        with self._lock:
            kept = {uid: answers for uid, answers in (self._answers.get(owner) or {}).items() if uid in uids}
            if kept:
                self._answers[owner] = kept
            else:
                self._answers.pop(owner, None)

    def forget_owner(self, owner: str) -> None:
        with self._lock:
            self._answers.pop(owner, None)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(pods) for pods in self._answers.values())


Client = Any  # a factory: (base URL) -> VLLMAdapters


def _base(address: str, port: int) -> str:
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


def read_pods(pods: Sequence[ReadyPod], answers: Mapping[str, tuple[Answer, ...]], *, client: Client | None = None,
              port: int = VLLM_PORT) -> list[PodView]:
    """Each Ready pod as it is now: what its /v1/models says it serves, with the answers kept for it (by uid)."""
    views = []
    client = client or VLLMAdapters
    for pod in pods:
        kept = answers.get(pod.uid, ())
        refused = egress.pod_address_problem(pod.address)
        if refused is not None:  # a pod IP, in-cluster by design, but never loopback or the metadata service
            views.append(PodView(pod.name, None, pod.uid, pod.address, unreadable=refused, answers=kept))
            continue
        with client(_base(pod.address, port)) as vllm:
            try:
                views.append(PodView(pod.name, vllm.served(), pod.uid, pod.address, answers=kept))
            except CallFailed as exc:
                views.append(PodView(pod.name, None, pod.uid, pod.address, unreadable=str(exc), answers=kept))
    return views


def call_pod(calls: LoRAPodCalls, *, client: Client | None = None, port: int = VLLM_PORT) -> list[Answer]:
    """Make one pod's calls in order; vLLM's answer to each."""
    if egress.pod_address_problem(calls.address) is not None:  # the reader said why; nothing is sent there
        return []
    found = []
    with (client or VLLMAdapters)(_base(calls.address, port)) as vllm:
        for call in calls.calls:
            action: Action = call.action
            try:
                vllm.apply(action)
            except CallFailed as exc:
                found.append(Answer(action.kind, action.name, call.source, ok=False, refused=exc.refused,
                                    text=str(exc)))
                continue
            found.append(Answer(action.kind, action.name, call.source, ok=True))
    return found
