"""Section: LoRA adapters: whether the spec's adapters may be deployed, status.loraSources (what the pvc://
adapters' inspect Jobs read), and, in one pass, the load and unload calls each Ready pod needs and status.lora
from what the pods serve before them (desired/lora_calls.py)."""

from __future__ import annotations

from dataclasses import dataclass

from llm_autopilot.api.lora import lora_refusal
from llm_autopilot.api.v1alpha1 import CacheStatus, LLMDeploymentSpec
from llm_autopilot.desired import lora_calls, lora_sync
from llm_autopilot.desired.lora_calls import LoRAKeep, LoRAPodsAsk, LoRAReading
from llm_autopilot.desired.status_fields import LORA, LORA_SOURCES
from llm_autopilot.desired.vocabulary import Draft
from llm_autopilot.desired.world import AdapterReading
from llm_autopilot.planner.config import ServingConfig


@dataclass(frozen=True)
class AdapterRefusal:
    reason: str
    message: str
    retry: bool


def adapter_refusal(spec: LLMDeploymentSpec, reading: AdapterReading) -> AdapterRefusal | None:
    """Why the reconciler must not deploy the adapters (None: it may): one api/lora.py refuses (the message
    admission gives), or an unreadable adapter (retried)."""
    if (refused := lora_refusal(spec, reading.configs)) is not None:
        return AdapterRefusal("LoRAAdapterRefused", refused, retry=False)
    if reading.errors:
        return AdapterRefusal("LoRAAdapterUnresolved", "; ".join(reading.errors), retry=True)
    return None


def report_lora_sources(d: Draft, reading: AdapterReading) -> None:
    """status.loraSources (removed without pvc:// adapters)."""
    d.put(LORA_SOURCES, list(reading.sources) if reading.sources is not None else None)


def downloads_waiting(status: CacheStatus | None) -> dict[str, str]:
    """The s3:// adapters whose download into the cache is not complete, with what it is doing."""
    waiting: dict[str, str] = {}
    if status is None:
        return waiting
    for adapter in status.adapters or ():
        if adapter.state == "Complete":
            continue
        doing = (f"its download into PVC {status.claim_name} failed: {adapter.message}" if adapter.state == "Failed"
                 else f"downloading into PVC {status.claim_name} (Job {adapter.job_name}, {adapter.state}); served "
                      "once complete")
        waiting[adapter.name] = doing + (f"; {adapter.message}" if adapter.message and adapter.state != "Failed"
                                         else "")
    return waiting


def ask(d: Draft, spec: LLMDeploymentSpec) -> LoRAPodsAsk | None:
    """The Ready pods to read (asked with the workload), unless read or the spec has no LoRA."""
    if spec.lora is None or d.world.reading(LoRAReading) is not None:
        return None
    return LoRAPodsAsk(d.owner.namespace, d.owner.name)


def report_lora(d: Draft, spec: LLMDeploymentSpec, config: ServingConfig) -> None:
    """status.lora: where each adapter is served, from what the Ready pods serve now and what vLLM answered the
    earlier calls (an adapter loaded this pass is pending until a later pass reads it served; the s3:// adapters
    still downloading left out), and the calls each pod needs, with a pass soon after them; unsettled until
    every pod serves exactly the spec's adapters. Without LoRA status.lora goes and no pod is called."""
    updates = lora_sync.updates_for(spec, config.vllm.version, nodes=config.nodes)
    if updates is None:
        d.put(LORA, None)
        d.out.effects.append(LoRAKeep(()))
        return
    waiting = downloads_waiting(d.cache_status)
    reading = d.world.reading(LoRAReading)
    assert reading is not None  # asked with the workload
    want, sources = lora_sync.wanted(spec, tuple(waiting)), lora_sync.sources(spec)
    status = lora_sync.lora_status(updates, want, reading.views, sources=sources, waiting=waiting)
    for event in lora_calls.events(want, sources, reading.views, d.read.lora):
        d.event(*event)
    calls = lora_calls.pod_calls(updates, want, sources, reading.views)
    d.out.effects += [LoRAKeep(tuple(v.uid for v in reading.views if v.uid)), *calls]
    d.put(LORA, status)
    d.out.settled = d.out.settled and lora_sync.settled(status)
    if calls and not d.out.retry:  # the next pass reads what the pods serve after the calls
        d.out.retry, d.out.retry_delay = True, lora_calls.FOLLOW_UP_SECONDS
        d.out.retry_reason = "LoRA adapters loaded or unloaded on the pods; reading them again"
