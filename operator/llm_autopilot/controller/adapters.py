"""Shell: read the LoRA adapters' ``adapter_config.json`` from the Hub, for api/lora.py to judge (no decision here).

Admission reads them with a short timeout and admits, with a warning, what it could not read (the reconciler
reads again); the reconciler reads them on every pass in read_world (gather.py; the Hub client's cache answers
an unchanged file with one HEAD request) and desired() stops, Planned=False, on an adapter it cannot read, as
it does for the model.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from llm_autopilot.api.lora import lora_refusal, parse_adapter_config
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.desired.intent import AdapterRefusal, adapter_refusal
from llm_autopilot.desired.world import AdapterReading
from llm_autopilot.hub.client import HubClient, ModelFetchError, fetch_adapter_config

#: the Hub token (read only when there are adapters; may raise with what to do)
TokenSource = Callable[[], str | None]


#: Refusal is desired/intent.py's AdapterRefusal
Refusal = AdapterRefusal
__all__ = ["AdapterReading", "Refusal", "TokenSource", "admission_check", "read_adapter_configs", "reconcile_refusal"]


def read_adapter_configs(spec: LLMDeploymentSpec, token: TokenSource, *, timeout: float,
                         endpoint: str | None = None, cache_dir: str | None = None) -> AdapterReading:
    if spec.lora is None or not spec.lora.adapters:
        return AdapterReading()
    try:
        hub = HubClient(token=token(), endpoint=endpoint, cache_dir=cache_dir, timeout=timeout)
    except Exception as exc:  # the token Secret: its reader's message says what to do
        return AdapterReading(errors=[f"the LoRA adapters cannot be read: {exc}"])
    reading = AdapterReading()
    for adapter in spec.lora.adapters:
        repo = adapter.source.removeprefix("hf://")
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
    return reading


def reconcile_refusal(spec: LLMDeploymentSpec, token: TokenSource, *, timeout: float) -> AdapterRefusal | None:
    """Why the reconciler must not deploy the adapters (None: it may): read, then desired's adapter_refusal."""
    return adapter_refusal(spec, read_adapter_configs(spec, token, timeout=timeout))


#: the webhook's reads run here, so that a Hub that does not answer (huggingface_hub retries a failed request for
#: about 25 s) never holds the answer past its budget
_ADMISSION_READS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="adapter-configs")


def admission_check(spec: LLMDeploymentSpec, *, timeout: float, budget: float,
                    pool: ThreadPoolExecutor | None = None) -> tuple[str | None, list[str]]:
    """For the webhook: (the refusal, or None; warnings for the adapters it could not read), within ``budget``
    seconds (the reads run on ``pool``, by default the webhook's own)."""
    if spec.lora is None or not spec.lora.adapters:
        return None, []
    future = (pool or _ADMISSION_READS).submit(read_adapter_configs, spec, lambda: None, timeout=timeout)
    try:
        reading = future.result(timeout=budget)
    except FutureTimeout:
        return None, [f"the LoRA adapters' adapter_config.json could not be read from the Hub within {budget:g} s; "
                      "checked when the operator reconciles it"]
    unread = [f"{e}; checked again when the operator reconciles it" for e in reading.errors]
    return lora_refusal(spec, reading.configs), unread + reading.notes
