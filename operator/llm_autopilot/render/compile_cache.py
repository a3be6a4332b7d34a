"""vLLM's compile caches on a PVC that outlives the pods (spec.vllm.compileCache). Pure.

Without it every vLLM pod compiles in its emptyDir HOME: vLLM's torch.compile artefacts (``VLLM_CACHE_ROOT``),
Triton's kernels (``TRITON_CACHE_DIR``) and FlashInfer's JIT modules (``FLASHINFER_WORKSPACE_BASE``, below which
FlashInfer writes ``.cache/flashinfer/<arch>/``) die with the pod, so a restart, a remediation step or a scale-out
compiles again. With it the three point into one folder of a shared PVC.

The PVC: one per (namespace, source, revision), named like the model cache's and with no owner, so every
LLMDeployment and every step of the model shares it and it outlives them (``kubectl delete pvc -l
llm-autopilot.io/compile-cache=<name>`` removes it). Not the model cache's own claim: the vLLM pods mount that
read-only on purpose (the weights were checked by fetch and no model code may change them), and its size is the
checkpoint's; a compile cache is written by the pods and bounded by a size of its own.

The folder: keyed by what vLLM's own hash does not separate. vLLM names its cache directory
``torch_compile_cache/<hash>`` from the vLLM version, the configs that shape the graph (ModelConfig with its
``model`` string, max_model_len and dtype; ParallelConfig; SchedulerConfig's max_num_seqs and
max_num_batched_tokens; CompilationConfig with its cudagraph sizes), the environment, torch's and inductor's
state with the device, and the source of every traced file (vllm/compilation/backends.py, vllm/config/*.py
``compute_hash``); so settings need no place in the key. What it does not separate: ``model`` is a path when the
weights come from the model cache or a volume (``/model-cache/model`` for every model and revision), the revision
is not passed then, and an image may carry the same vLLM release over another build. Hence the key: the image,
the model source and revision, and the GPU product (FlashInfer's and Triton's caches sit beside vLLM's, keyed by
their own rules). See docs/users/model-cache.md, "Compile cache".
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from llm_autopilot.api import GROUP
from llm_autopilot.api.sources import S3Source
from llm_autopilot.api.v1alpha1 import CompileCacheStatus, LLMDeploymentSpec
from llm_autopilot.render import cache

COMPILE_CACHE_LABEL = f"{GROUP}/compile-cache"
MOUNT = "/compile-cache"
VOLUME = "compile-cache"
#: the environment the three caches are found by, each to its subfolder of the key's folder
VLLM_CACHE_ROOT = "VLLM_CACHE_ROOT"
TRITON_CACHE_DIR = "TRITON_CACHE_DIR"
FLASHINFER_WORKSPACE_BASE = "FLASHINFER_WORKSPACE_BASE"
CACHE_ENV = {VLLM_CACHE_ROOT: "vllm", TRITON_CACHE_DIR: "triton", FLASHINFER_WORKSPACE_BASE: "flashinfer"}
_SLUG = re.compile(r"[^a-z0-9]+")


def enabled(spec: LLMDeploymentSpec) -> bool:
    """On when spec.vllm.compileCache.enabled says so; unset, on where the model cache is (its PVCs exist)."""
    wanted = spec.vllm.compile_cache.enabled
    return cache.enabled(spec) if wanted is None else wanted


def _slug(text: str, length: int) -> str:
    return _SLUG.sub("-", text.lower()).strip("-")[:length].strip("-") or "model"


def claim_name(spec: LLMDeploymentSpec, namespace: str) -> str:
    """``llm-compile-<model>-<hash>`` (at most 63 characters): one PVC per namespace, source and revision."""
    where = spec.model.location
    slug = _slug(where.uri.split("://", 1)[1], 30)
    return f"llm-compile-{slug}-{cache.cache_key(namespace, where.uri, spec.model.revision)}"


def folder(spec: LLMDeploymentSpec, image: str, gpu_product: str) -> str:
    """``<model>-<hash>``: the hash of the image, the model source and revision (and an s3:// source's endpoint)
    and the GPU product, what vLLM's own cache directory does not separate (the module's docstring)."""
    where = spec.model.location
    endpoint = (spec.model.s3.endpoint or "") if isinstance(where, S3Source) and spec.model.s3 is not None else ""
    parts = (image, where.uri, spec.model.revision or "main", endpoint, gpu_product)
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    return f"{_slug(where.uri.split('://', 1)[-1], 40)}-{key}"


@dataclass(frozen=True)
class CompileCacheVolume:
    """The PVC and the folder one plan's pods keep their compile caches in."""

    claim: str
    folder: str
    size: str
    storage_class_name: str | None = None
    access_mode: str = "ReadWriteMany"

    def status(self) -> CompileCacheStatus:
        return CompileCacheStatus(claim_name=self.claim, folder=self.folder, size=self.size)


def volume_of(spec: LLMDeploymentSpec, namespace: str, image: str, gpu_product: str) -> CompileCacheVolume | None:
    """The compile cache of this spec's pods, or None when it is off."""
    if not enabled(spec):
        return None
    options = spec.vllm.compile_cache
    return CompileCacheVolume(claim_name(spec, namespace), folder(spec, image, gpu_product), str(options.size),
                              options.storage_class_name, options.access_mode)


def pvc(volume: CompileCacheVolume, namespace: str) -> dict[str, Any]:
    """The PVC, created while missing and never changed after: its input hash is its name's, so a later size or
    class (a PVC's spec is mostly immutable, and other LLMDeployments share it) leaves the live one as it is."""
    spec: dict[str, Any] = {"accessModes": [volume.access_mode], "resources": {"requests": {"storage": volume.size}}}
    if volume.storage_class_name:
        spec["storageClassName"] = volume.storage_class_name
    digest = hashlib.sha256(f"{namespace}/{volume.claim}".encode()).hexdigest()[:16]
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": volume.claim, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "llm-autopilot",
                                    "app.kubernetes.io/component": "compile-cache", COMPILE_CACHE_LABEL: volume.claim},
                         "annotations": {f"{GROUP}/input-hash": digest}},
            "spec": spec}


def pod_volume(volume: CompileCacheVolume) -> dict[str, Any]:
    return {"name": VOLUME, "persistentVolumeClaim": {"claimName": volume.claim}}


def pod_mount() -> dict[str, Any]:
    return {"name": VOLUME, "mountPath": MOUNT}


def env(volume: CompileCacheVolume, given: set[str]) -> list[dict[str, str]]:
    """The three caches' variables into the key's folder, except those spec.vllm.env sets (a duplicate name
    would be refused; the user's choice wins)."""
    return [{"name": name, "value": f"{MOUNT}/{volume.folder}/{sub}"} for name, sub in CACHE_ENV.items()
            if name not in given]
