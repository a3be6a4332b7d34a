"""LoRA adapters on running pods: how a change of ``spec.lora.adapters`` reaches them, what to load and unload
on one pod, and the status that says where each adapter is served. Pure: ``controller/lora_runtime.py`` reads
each Ready pod's ``/v1/models`` and makes vLLM's load and unload calls (desired/lora_calls.py decides them).

Runtime: the pods start with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` and no ``--lora-modules``, so the pod
template (and its plan hash) does not change when adapters are added or removed; the operator loads the spec's
adapters onto each Ready pod (again after a restart: the pod's own ``/v1/models`` says what it serves) and
unloads the ones the spec dropped. Rollout: the adapters are in ``--lora-modules``, and a change rolls the pods.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec, LoRAAdapterStatus, LoRASpec, LoRAStatus
from llm_autopilot.planner.config import ServingConfig
from llm_autopilot.render import lora_volumes
from llm_autopilot.vllm.flags import named_options
from llm_autopilot.vllm.versions import RUNTIME_LORA_UPDATING_READ, VLLMVersion, behaviour_of

__all__ = ["Action", "Answer", "PodView", "Served", "Updates", "actions", "lora_status", "repeated", "runtime",
           "served_adapters", "settled", "sources", "updates_for", "wanted"]

#: ``--api-server-count`` and its short alias (vllm/data/flags.json)
_API_SERVERS = frozenset({"--api-server-count", "-asc"})


@dataclass(frozen=True)
class Updates:
    """How adapter changes are applied, and why."""

    runtime: bool
    reason: str

    @property
    def mode(self) -> Literal["Runtime", "Rollout"]:
        return "Runtime" if self.runtime else "Rollout"


def _api_servers(extra_args: Sequence[str]) -> int:
    """``--api-server-count`` (or any spelling vLLM reads as it) in extraArgs; 1 when absent or unreadable."""
    count = 1
    for i, arg in enumerate(extra_args):
        if not _API_SERVERS & named_options(arg):
            continue
        value = arg.split("=", 1)[1] if "=" in arg else (extra_args[i + 1] if i + 1 < len(extra_args) else "")
        count = int(value) if value.isdigit() else count
    return count


def updates_for(spec: LLMDeploymentSpec, version: VLLMVersion, *, nodes: int = 1) -> Updates | None:
    """Runtime where the spec asks for it and vLLM ``version`` can do it for this shape; else rollout (None:
    no LoRA)."""
    lora = spec.lora
    if lora is None:
        return None
    if not lora.runtime_updates:
        return Updates(False, "spec.lora.runtimeUpdates is off: the adapters are in the pods' --lora-modules, and "
                              "a change rolls the pods")
    if not behaviour_of(version).runtime_lora_updating:
        read = ", ".join(str(v) for v in RUNTIME_LORA_UPDATING_READ)
        return Updates(False, f"vLLM {version} was not read for runtime LoRA updating (read: {read}): the adapters "
                              "are in the pods' --lora-modules, and a change rolls the pods")
    if nodes > 1:
        return Updates(False, f"a replica spans {nodes} nodes: the adapters are in the pods' --lora-modules, and a "
                              "change rolls the pods")
    if (servers := _api_servers(spec.vllm.extra_args)) > 1:
        return Updates(False, f"extraArgs run {servers} API servers, which vLLM refuses with runtime LoRA "
                              "updating: the adapters are in the pods' --lora-modules, and a change rolls the pods")
    return Updates(True, f"spec.lora.runtimeUpdates on vLLM {version}: the operator loads and unloads adapters on "
                         "each Ready pod without a rollout" + _defaults_note(lora))


def _defaults_note(lora: LoRASpec) -> str:
    """What runtime updating cannot keep from a rollout: the slots are sized at start-up, and a default that
    follows the adapters (maxLoras: one per adapter; maxLoraRank: their largest rank) moves with them."""
    unset = [name for name, value in (("maxLoras", lora.max_loras), ("maxLoraRank", lora.max_lora_rank))
             if value is None]
    if not unset:
        return ""
    both = len(unset) > 1
    return (f", but {' and '.join(unset)} {'follow' if both else 'follows'} the adapters (unset) and a change of "
            f"{'them' if both else 'it'} is a rollout (slots are sized at start-up): set {'both' if both else 'it'} "
            "to keep adapter changes runtime")


@dataclass(frozen=True, order=True)
class Served:
    """An adapter a vLLM server serves: its model name and the path it was loaded from."""

    name: str
    path: str


def wanted(spec: LLMDeploymentSpec, waiting: Collection[str] = ()) -> tuple[Served, ...]:
    """The spec's adapters, with the path vLLM loads each from (render/lora_volumes.py: the Hub id, or a folder
    in the pod, as --lora-modules has it); ``waiting``: the s3:// adapters not downloaded yet, left out."""
    return tuple(Served(a.name, lora_volumes.adapter_path(spec, a))
                 for a in (spec.lora.adapters if spec.lora else []) if a.name not in waiting)


def sources(spec: LLMDeploymentSpec) -> dict[str, str]:
    """Each adapter's source as the spec writes it, by name (status.lora.adapters[].source)."""
    return {a.name: a.source for a in (spec.lora.adapters if spec.lora else [])}


def served_adapters(models: Any) -> tuple[Served, ...] | None:
    """The adapters an OpenAI ``/v1/models`` answer of vLLM lists: the cards with a ``parent`` (the base model's
    is null), ``root`` being the path. None: not such an answer."""
    if not isinstance(models, Mapping) or not isinstance(models.get("data"), list):
        return None
    cards = [c for c in models["data"] if isinstance(c, Mapping) and isinstance(c.get("id"), str)]
    return tuple(sorted(Served(c["id"], str(c.get("root") or "")) for c in cards if c.get("parent")))


@dataclass(frozen=True)
class Action:
    kind: Literal["load", "unload"]
    name: str
    path: str = ""
    #: replace an adapter served under this name from another path (vLLM's ``load_inplace``)
    inplace: bool = False


def actions(want: Sequence[Served], served: Sequence[Served]) -> tuple[Action, ...]:
    """What makes one pod serve ``want``: unloads first (vLLM's CPU cache of adapters is bounded), then loads in
    the spec's order; nothing when it already does (idempotent)."""
    names = {s.name: s for s in served}
    wanted_names = {w.name for w in want}
    unload = [Action("unload", s.name) for s in sorted(served) if s.name not in wanted_names]
    load = [Action("load", w.name, w.path, inplace=w.name in names)
            for w in want if names.get(w.name) != w]
    return (*unload, *load)


@dataclass(frozen=True)
class Answer:
    """What vLLM answered to one load or unload call on one pod, as the operator keeps it (controller/lora_runtime.py):
    ``source`` is the adapter's source as the spec wrote it for a load, the path it was served from for an unload;
    ``refused``: vLLM answered and said no (not called again for the same pod, adapter and source), else the call
    got no answer (called again next pass)."""

    kind: Literal["load", "unload"]
    name: str
    source: str
    ok: bool
    refused: bool = False
    text: str = ""


@dataclass(frozen=True)
class PodView:
    """One Ready pod before this pass's calls: what its /v1/models says it serves (None: unreadable, and why), and
    vLLM's answers to the operator's earlier calls on it (kept in the operator's memory, by pod uid)."""

    name: str
    served: tuple[Served, ...] | None
    uid: str = ""
    address: str = ""
    unreadable: str = ""
    answers: tuple[Answer, ...] = ()

    def failure(self, kind: str, name: str, source: str) -> str:
        """vLLM's answer to the last failed ``kind`` call of adapter ``name`` from ``source`` ("": none)."""
        return next((a.text for a in self.answers if (a.kind, a.name, a.source) == (kind, name, source) and not a.ok),
                    "")


def repeated(event: tuple[str, str, str], previous: LoRAStatus | None) -> bool:
    """A failure the last status already reported (the same pod, the same answer): no second Warning per resync."""
    type_, _, message = event
    said = [a.message for a in (*previous.adapters, *previous.removing)] if previous is not None else []
    _, _, where_and_why = message.partition(" on ")  # "load NAME on POD: ANSWER" -> "POD: ANSWER"
    return type_ == "Warning" and any(where_and_why and where_and_why in m for m in said)


def lora_status(updates: Updates, want: Sequence[Served], pods: Sequence[PodView], *,
                sources: Mapping[str, str] | None = None, waiting: Mapping[str, str] | None = None) -> LoRAStatus:
    """Per adapter of the spec, the Ready pods that serve it and those that do not yet (with why: vLLM's answer
    to the last load, or why the pod could not be read; an adapter loaded this pass is not served yet); per
    adapter the spec dropped that a pod still serves, where (``pods``: still serving it). ``sources``: each
    adapter's source by name (else its path); ``waiting``: adapters no pod is asked to load yet (their download),
    with why."""
    sources, waiting = sources or {}, waiting or {}

    def entry(adapter: Served, applied: Literal["Runtime", "Rollout"]) -> LoRAAdapterStatus:
        source = sources.get(adapter.name, adapter.path)
        serving = tuple(p.name for p in pods if p.served is not None and adapter in p.served)
        pending = tuple(p.name for p in pods if p.name not in serving)
        why = [f"{p.name}: {text}" for p in pods
               if p.name in pending and (text := p.failure("load", adapter.name, source) or p.unreadable)]
        return LoRAAdapterStatus(name=adapter.name, source=source, path=adapter.path,
                                 applied=applied, pods=serving, pending=pending, message="; ".join(why)[:500])

    def held(name: str) -> LoRAAdapterStatus:
        return LoRAAdapterStatus(name=name, source=sources.get(name, ""), applied=updates.mode,
                                 pending=tuple(p.name for p in pods), message=waiting[name][:500])

    wanted_names = {w.name for w in want} | set(waiting)
    extra = sorted({s for p in pods for s in (p.served or ()) if s.name not in wanted_names})
    return LoRAStatus(updates=updates.mode, reason=updates.reason,
                      adapters=(*(entry(w, updates.mode) for w in want), *(held(n) for n in waiting)),
                      removing=tuple(LoRAAdapterStatus(name=s.name, source=s.path, path=s.path, applied=updates.mode,
                                                       pods=tuple(p.name for p in pods if s in (p.served or ())),
                                                       message=_why(s, pods)) for s in extra))


def _why(adapter: Served, pods: Sequence[PodView]) -> str:
    return "; ".join(f"{p.name}: {text}" for p in pods
                     if (text := p.failure("unload", adapter.name, adapter.path)))[:500]


def settled(status: LoRAStatus) -> bool:
    """Whether every Ready pod serves exactly the spec's adapters (an adapter still downloading is not: the next
    resync looks again)."""
    return not status.removing and not any(a.pending or not a.path for a in status.adapters)


def runtime(spec: LLMDeploymentSpec, config: ServingConfig) -> bool:
    """Whether the pods of this plan start with runtime updating on and without ``--lora-modules``."""
    updates = updates_for(spec, config.vllm.version, nodes=config.nodes)
    return updates is not None and updates.runtime
