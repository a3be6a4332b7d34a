"""LoRA adapters on running pods as an after-plan feature: its words (the ask, the reading, the effects) and its
judgement (which load and unload calls each Ready pod needs, the Events of the calls made before). Pure.

One pass, in this order: the reader (controller/features/lora.py) reads each Ready pod's ``/v1/models`` and the
answers vLLM gave to the operator's earlier calls on it; desired() decides the calls and status.lora from that
(desired/sections/lora.py: an adapter loaded this pass is reported pending, not served); the executor makes the
calls once the objects are written, keeps vLLM's answers in the operator's memory and asks for a pass soon, which
reads the pods again: the status converges on what the pods serve, never on what was asked.

The answers are kept in memory only (controller/lora_runtime.py's LoRAAnswers, owned by the Operator), by pod uid,
adapter and source, and dropped when the pod goes. A load vLLM refused is not called again for the same pod,
adapter and source; after an operator restart the memory is empty, so the next pass calls once more, gets the
refusal again and says it again only if the status does not say it already.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llm_autopilot.api.status import LoRAStatus
from llm_autopilot.desired.lora_sync import Action, PodView, Served, Updates, actions, repeated

#: the pass after calls were made comes this soon (it reads what the pods serve then)
FOLLOW_UP_SECONDS = 2.0


@dataclass(frozen=True)
class LoRAPodsAsk:
    """The object whose Ready pods to read: what each serves, and what vLLM answered the operator's calls."""

    namespace: str
    name: str


@dataclass(frozen=True)
class LoRAReading:
    """Each Ready pod as read before this pass's calls (controller/features/lora.py)."""

    views: tuple[PodView, ...] = ()


@dataclass(frozen=True)
class LoRACall:
    """One load or unload on a pod; ``source``: the key its answer is kept under (Answer.source)."""

    action: Action
    source: str


@dataclass(frozen=True)
class LoRAPodCalls:
    """The calls one Ready pod needs, in order (unloads first), on its own IP."""

    pod: str
    uid: str
    address: str
    calls: tuple[LoRACall, ...]


@dataclass(frozen=True)
class LoRAKeep:
    """The pods (uids) whose answers the operator still keeps: the Ready pods read; the object's others go."""

    uids: tuple[str, ...]


def pod_calls(updates: Updates, want: Sequence[Served], sources: Mapping[str, str],
              pods: Sequence[PodView]) -> tuple[LoRAPodCalls, ...]:
    """The calls that bring each readable Ready pod to ``want`` (none with rollout updates: the pods'
    --lora-modules carry the adapters), less those vLLM already refused for the same pod, adapter and source."""
    if not updates.runtime:
        return ()
    found = []
    for pod in pods:
        if pod.served is None:
            continue
        paths = {s.name: s.path for s in pod.served}
        calls = []
        for action in actions(want, pod.served):
            source = sources.get(action.name, action.path) if action.kind == "load" else paths[action.name]
            if not any(a.refused and (a.kind, a.name, a.source) == (action.kind, action.name, source)
                       for a in pod.answers):
                calls.append(LoRACall(action, source))
        if calls:
            found.append(LoRAPodCalls(pod.name, pod.uid, pod.address, tuple(calls)))
    return tuple(found)


def events(want: Sequence[Served], sources: Mapping[str, str], pods: Sequence[PodView],
           previous: LoRAStatus | None) -> list[tuple[str, str, str]]:
    """The Events of the calls made before this pass, as the pods answer now: a load that a pod now serves and
    the last status did not list it for, an unload whose adapter the last status listed the pod for and it no
    longer serves, a failure the last status does not say yet (repeated)."""
    listed = {a.name: a.pods for a in previous.adapters} if previous is not None else {}
    removing = {a.name: a.pods for a in previous.removing} if previous is not None else {}
    paths = {w.name: w.path for w in want}
    found: list[tuple[str, str, str]] = []
    for pod in pods:
        if pod.served is None:
            continue
        serving = {s.name: s.path for s in pod.served}
        for a in pod.answers:
            wanted_now = a.kind == "load" and a.name in paths and sources.get(a.name, paths[a.name]) == a.source
            if a.ok and wanted_now and serving.get(a.name) == paths[a.name] and pod.name not in listed.get(a.name, ()):
                found.append(("Normal", "LoRAAdapterLoaded", f"loaded {a.name} on {pod.name} at runtime (no restart)"))
            elif a.ok and a.kind == "unload" and a.name not in serving and pod.name in removing.get(a.name, ()):
                found.append(("Normal", "LoRAAdapterUnloaded",
                              f"unloaded {a.name} on {pod.name} at runtime (no restart)"))
            elif not a.ok and ((wanted_now and serving.get(a.name) != paths[a.name])
                               or (a.kind == "unload" and serving.get(a.name) == a.source)):
                found.append(("Warning", "LoRAAdapterFailed", f"{a.kind} {a.name} on {pod.name}: {a.text}"))
    return [e for e in found if not repeated(e, previous)]
