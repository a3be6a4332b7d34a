"""The volume the weights are loaded from, for sources vLLM does not download itself. Pure.

A pvc:// source is mounted read-only at :data:`MODEL_MOUNT` and vLLM is given the folder's local path (its
``--served-model-name`` keeps the name clients use). An hf:// source mounts nothing: vLLM downloads it.
"""

from __future__ import annotations

from typing import Any

from llm_autopilot.api.sources import HubSource, PVCSource, S3Source
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec

MODEL_MOUNT = "/models"
VOLUME = "model"


def model_path(spec: LLMDeploymentSpec) -> str | None:
    """The local folder vLLM loads, or None when it loads a Hub id."""
    where = spec.model.location
    if isinstance(where, PVCSource):
        return f"{MODEL_MOUNT}/{where.path}" if where.path else MODEL_MOUNT
    return None


def volumes(spec: LLMDeploymentSpec) -> list[dict[str, Any]]:
    where = spec.model.location
    if isinstance(where, PVCSource):
        return [{"name": VOLUME, "persistentVolumeClaim": {"claimName": where.claim, "readOnly": True}}]
    return []


def mounts(spec: LLMDeploymentSpec) -> list[dict[str, Any]]:
    if isinstance(spec.model.location, PVCSource):
        return [{"name": VOLUME, "mountPath": MODEL_MOUNT, "readOnly": True}]
    return []


def unserved_source(spec: LLMDeploymentSpec) -> tuple[str, str] | None:
    """(reason, message) when the pods cannot load the source yet: vLLM does not read s3:// itself."""
    where = spec.model.location
    if isinstance(where, S3Source):
        return ("SourceNotServed", f"{where.uri} is planned, but vLLM does not load from S3: set "
                "spec.model.cache.enabled: true (the weights are downloaded once into a PVC the pods mount)")
    return None


def downloads(spec: LLMDeploymentSpec) -> bool:
    """Whether each vLLM pod downloads the weights itself (an hf:// source)."""
    return isinstance(spec.model.location, HubSource)
