"""Shell: read the LoRA adapters' ``adapter_config.json`` from where they live, for api/lora.py to judge (no
decision here): the Hub, an S3 prefix (the operator's own S3 client), a volume (what the adapter's inspect Job read,
controller/inspect_step.py).

Admission reads them with a short timeout and admits, with a warning, what it could not read (the reconciler
reads again), and hands the configs it read to desired(), which refuses as it does for the reconcile; the
reconciler reads them on every pass in read_world (world_reads.py; the Hub client's cache answers
an unchanged file with one HEAD request) and desired() stops, Planned=False, on an adapter it cannot read, as
it does for the model.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from llm_autopilot.api.lora import parse_adapter_config
from llm_autopilot.api.sources import PVCSource, S3Source
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec, S3Options
from llm_autopilot.controller import sources
from llm_autopilot.controller.inspect_step import AdapterInspections
from llm_autopilot.controller.sources import SecretReader
from llm_autopilot.desired.intent import AdapterRefusal, adapter_refusal
from llm_autopilot.desired.world import AdapterReading
from llm_autopilot.hub.client import HubClient, ModelFetchError, fetch_adapter_config
from llm_autopilot.hub.resolve import ModelResolutionError

#: the Hub token (read only when there are adapters; may raise with what to do)
TokenSource = Callable[[], str | None]


#: Refusal is desired/intent.py's AdapterRefusal
Refusal = AdapterRefusal
__all__ = ["AdapterReading", "Refusal", "TokenSource", "admission_check", "read_adapter_configs", "reconcile_refusal"]


def read_adapter_configs(spec: LLMDeploymentSpec, token: TokenSource, *, timeout: float,
                         endpoint: str | None = None, cache_dir: str | None = None,
                         secret: SecretReader | None = None,
                         inspected: AdapterInspections | None = None) -> AdapterReading:
    """Each adapter's adapter_config.json from where it lives: the Hub (``token``), an S3 prefix (the operator's
    S3 client; ``secret`` reads its keys: without it, as in the webhook, it is left to the reconcile), a volume
    (what its inspect Job read: ``inspected``; without it, left to the reconcile)."""
    if spec.lora is None or not spec.lora.adapters:
        return AdapterReading()
    reading = AdapterReading()
    hub: HubClient | None = None
    for adapter in spec.lora.adapters:
        where = adapter.location
        if isinstance(where, PVCSource):
            if inspected is not None and adapter.name in inspected.configs:
                reading.configs[adapter.name] = inspected.configs[adapter.name]
            elif inspected is None:
                reading.notes.append(f"lora adapter {adapter.name}: its adapter_config.json is read from {where.uri} "
                                     "by a short inspect Job when the operator reconciles it, and checked then")
            continue
        if isinstance(where, S3Source):
            if secret is None:
                reading.notes.append(f"lora adapter {adapter.name}: its adapter_config.json is read from {where.uri} "
                                     "when the operator reconciles it, and checked then")
                continue
            try:
                reading.configs[adapter.name] = parse_adapter_config(
                    read_s3_adapter_config(spec.lora.s3, where, secret, timeout=timeout))
            except (ModelFetchError, ModelResolutionError, RuntimeError) as exc:  # the store; the Secret
                reading.errors.append(f"lora adapter {adapter.name}: {exc}")
            continue
        if hub is None:
            try:
                hub = HubClient(token=token(), endpoint=endpoint, cache_dir=cache_dir, timeout=timeout)
            except Exception as exc:  # the token Secret: its reader's message says what to do
                reading.errors.append(f"the LoRA adapters cannot be read from the Hub: {exc}")
                return reading
        repo = where.repo
        try:
            raw = fetch_adapter_config(hub, repo, adapter.revision)
        except ModelFetchError as exc:
            reading.errors.append(f"lora adapter {adapter.name}: {exc}")
            continue
        if raw is None:
            reading.notes.append(f"lora adapter {adapter.name}: {repo} has no adapter_config.json, so its rank and "
                                 "base model are not checked")
            continue
        reading.configs[adapter.name] = parse_adapter_config(raw)
    if inspected is None:
        return reading
    return dataclasses.replace(reading, sources=inspected.statuses, objects=inspected.objects,
                               inspecting=inspected.failure, retry_delay=inspected.retry_delay)


ADAPTER_CONFIG = "adapter_config.json"


def read_s3_adapter_config(options: S3Options | None, source: S3Source, secret: SecretReader, *,
                           timeout: float) -> dict[str, Any]:
    """adapter_config.json under an s3:// adapter's prefix (one HEAD and one GET of a small object, with the
    adapters' endpoint and keys, spec.lora.s3); raises ModelFetchError (S3Error) with what to do."""
    key = source.key(ADAPTER_CONFIG)
    with sources.s3_client(options, secret, timeout=timeout, field="spec.lora.s3") as client:
        data = client.get(source.bucket, key, max_bytes=_ADAPTER_CONFIG_MAX_BYTES)
    if data is None:
        raise ModelFetchError(f"{source.uri} has no adapter_config.json (looked for s3://{source.bucket}/{key}): "
                              "the prefix must be the adapter's folder (adapter_config.json and "
                              "adapter_model.safetensors)")
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise ModelFetchError(f"s3://{source.bucket}/{key} is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ModelFetchError(f"s3://{source.bucket}/{key} is not a JSON object")
    return value


#: a PEFT adapter_config.json is about a KiB; a file this large is not one
_ADAPTER_CONFIG_MAX_BYTES = 2**20


def reconcile_refusal(spec: LLMDeploymentSpec, token: TokenSource, *, timeout: float) -> AdapterRefusal | None:
    """Why the reconciler must not deploy the adapters (None: it may): read, then desired's adapter_refusal."""
    return adapter_refusal(spec, read_adapter_configs(spec, token, timeout=timeout))


#: the webhook's reads run here, so that a Hub that does not answer (huggingface_hub retries a failed request for
#: about 25 s) never holds the answer past its budget
_ADMISSION_READS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="adapter-configs")


def admission_check(spec: LLMDeploymentSpec, *, timeout: float, budget: float,
                    pool: ThreadPoolExecutor | None = None) -> tuple[AdapterReading, list[str]]:
    """For the webhook, within ``budget`` seconds (the reads run on ``pool``, by default the webhook's own): the
    adapters' configs it read (for desired() to judge), and warnings for those it could not read (the reconcile
    reads them again) or that have no config."""
    if spec.lora is None or not spec.lora.adapters:
        return AdapterReading(), []
    future = (pool or _ADMISSION_READS).submit(read_adapter_configs, spec, lambda: None, timeout=timeout)
    try:
        reading = future.result(timeout=budget)
    except FutureTimeout:
        return AdapterReading(), [f"the LoRA adapters' adapter_config.json could not be read from the Hub within "
                                  f"{budget:g} s; checked when the operator reconciles it"]
    unread = [f"{e}; checked again when the operator reconciles it" for e in reading.errors]
    return AdapterReading(configs=reading.configs), unread + reading.notes
