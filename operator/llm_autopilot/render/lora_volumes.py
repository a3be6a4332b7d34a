"""Where the vLLM pods find each LoRA adapter's files, and the volumes that put them there. Pure.

- ``hf://`` (or a bare Hub id): vLLM downloads it; its path is the Hub id, as before.
- ``pvc://claim/path``: the claim is mounted read-only at ``/lora-adapters/<claim>`` (one volume per claim, however
  many adapters it holds) and vLLM loads ``/lora-adapters/<claim>/<path>``; an adapter on the claim a pvc:// model
  is loaded from uses the model's own mount (``/models/<path>``), so the pod does not mount one claim twice.
- ``s3://bucket/prefix``: downloaded by its own Job into the model cache's PVC (render/cache.py), folder
  ``lora/<slug>-<hash>``; vLLM loads ``/model-cache/lora/<slug>-<hash>`` through the cache's mount. Until its Job
  completed the adapter is left out of the pods (not in ``--lora-modules``, not loaded at runtime), so a download
  never holds or breaks pods that serve.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from llm_autopilot.api import GROUP
from llm_autopilot.api.sources import HubSource, PVCSource, S3Source
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec, LoRAAdapter
from llm_autopilot.render.cache import CACHE_MOUNT, CacheInputs, fetch_job, s3_args, s3_env
from llm_autopilot.render.model_volume import MODEL_MOUNT

LORA_MOUNT = "/lora-adapters"
#: the cache PVC's folder of the s3:// adapters (the model is in ``model``)
CACHE_LORA_FOLDER = "lora"
_SLUG = re.compile(r"[^a-z0-9]+")


def _digest(text: str, length: int = 10) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def s3_endpoint_of(spec: LLMDeploymentSpec) -> str:
    options = spec.lora.s3 if spec.lora else None
    return (options.endpoint if options else None) or ""


def cache_folder(spec: LLMDeploymentSpec, adapter: LoRAAdapter) -> str:
    """The adapter's folder in the cache PVC: one per source and endpoint, so LLMDeployments of the same model
    that list the same adapter share its download."""
    uri = adapter.location.uri
    slug = _SLUG.sub("-", uri.split("://", 1)[1].lower()).strip("-")[:40].strip("-")
    return f"{CACHE_LORA_FOLDER}/{slug}-{_digest(uri + chr(0) + s3_endpoint_of(spec))}"


def volume_name(claim: str) -> str:
    return f"lora-{_digest(claim)}"


def _model_claim(spec: LLMDeploymentSpec) -> str | None:
    where = spec.model.location
    return where.claim if isinstance(where, PVCSource) else None


def adapter_path(spec: LLMDeploymentSpec, adapter: LoRAAdapter) -> str:
    """The path vLLM loads the adapter from (``--lora-modules name=path``, ``/v1/load_lora_adapter``)."""
    where = adapter.location
    if isinstance(where, HubSource):
        return where.repo
    if isinstance(where, PVCSource):
        base = MODEL_MOUNT if where.claim == _model_claim(spec) else f"{LORA_MOUNT}/{where.claim}"
        return f"{base}/{where.path}" if where.path else base
    assert isinstance(where, S3Source)
    return f"{CACHE_MOUNT}/{cache_folder(spec, adapter)}"


def s3_adapters(spec: LLMDeploymentSpec) -> list[LoRAAdapter]:
    return [a for a in (spec.lora.adapters if spec.lora else []) if isinstance(a.location, S3Source)]


def served_now(spec: LLMDeploymentSpec, downloaded: frozenset[str]) -> list[LoRAAdapter]:
    """The adapters the pods can load now: all but the s3:// ones whose download (by name) is not complete."""
    return [a for a in (spec.lora.adapters if spec.lora else [])
            if not isinstance(a.location, S3Source) or a.name in downloaded]


def modules(spec: LLMDeploymentSpec, downloaded: frozenset[str]) -> tuple[tuple[str, str], ...]:
    """``--lora-modules`` of the adapters the pods can load now: (name, path)."""
    return tuple((a.name, adapter_path(spec, a)) for a in served_now(spec, downloaded))


def claims(spec: LLMDeploymentSpec) -> list[str]:
    """The claims the pods mount for pvc:// adapters (sorted; the model's own claim is mounted already)."""
    model_claim = _model_claim(spec)
    found = {a.location.claim for a in (spec.lora.adapters if spec.lora else [])
             if isinstance(a.location, PVCSource) and a.location.claim != model_claim}
    return sorted(found)


def volumes(spec: LLMDeploymentSpec) -> list[dict[str, Any]]:
    return [{"name": volume_name(c), "persistentVolumeClaim": {"claimName": c, "readOnly": True}}
            for c in claims(spec)]


def mounts(spec: LLMDeploymentSpec) -> list[dict[str, Any]]:
    return [{"name": volume_name(c), "mountPath": f"{LORA_MOUNT}/{c}", "readOnly": True} for c in claims(spec)]


# --- s3:// adapters: their download Jobs into the model cache's PVC ---------------------------------------


def download_job_name(claim: str, folder: str) -> str:
    return f"{claim[:46].rstrip('-.')}-lora-{_digest(claim + chr(0) + folder)}"


def download_jobs(inputs: CacheInputs) -> list[tuple[LoRAAdapter, dict[str, Any]]]:
    """Per s3:// adapter, the Job that runs ``llm-autopilot fetch`` into its folder of the cache PVC (with the
    adapters' S3 endpoint and keys, spec.lora.s3): the model cache's download, resumable and checked, for the
    adapter."""
    found = []
    options = inputs.spec.lora.s3 if inputs.spec.lora else None
    for adapter in s3_adapters(inputs.spec):
        folder = cache_folder(inputs.spec, adapter)
        args = ["fetch", "--source", adapter.location.uri, "--dest", f"{CACHE_MOUNT}/{folder}", *s3_args(options)]
        found.append((adapter, fetch_job(inputs, download_job_name(inputs.claim, folder), args, s3_env(options),
                                         annotations={f"{GROUP}/source": adapter.location.uri})))
    return found
