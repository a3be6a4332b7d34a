"""Section: LoRA adapters: whether the spec's adapters may be deployed, status.loraSources (what the pvc://
adapters' inspect Jobs read), and status.lora from what the Ready pods answer once the shell brought them to the
spec's adapters."""

from __future__ import annotations

from dataclasses import dataclass

from llm_autopilot.api.lora import lora_refusal
from llm_autopilot.api.v1alpha1 import CacheStatus, LLMDeploymentSpec
from llm_autopilot.desired import lora_sync
from llm_autopilot.desired.status_fields import LORA, LORA_SOURCES
from llm_autopilot.desired.vocabulary import Draft, LoRAAsk
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


def report_lora(d: Draft, spec: LLMDeploymentSpec, config: ServingConfig) -> None:
    """status.lora: where each adapter is served, from what the Ready pods answered once brought to the spec
    (asked of the shell first, the s3:// adapters still downloading left out); unsettled until every pod serves
    exactly the spec's adapters. Without LoRA status.lora goes and no pod is called."""
    updates = lora_sync.updates_for(spec, config.vllm.version, nodes=config.nodes)
    if updates is None:
        d.put(LORA, None)
        return
    waiting = downloads_waiting(d.cache_status)
    reading = d.world.lora
    if reading is None:
        d.out.lora = LoRAAsk(spec, config, waiting)
        return
    status = lora_sync.lora_status(updates, lora_sync.wanted(spec, tuple(waiting)), reading.views,
                                   sources=lora_sync.sources(spec), waiting=waiting)
    previous = d.status.get("lora")
    for event in reading.events:
        if not lora_sync.repeated(event, previous):
            d.event(*event)
    d.put(LORA, status)
    d.out.settled = d.out.settled and lora_sync.settled(status)
