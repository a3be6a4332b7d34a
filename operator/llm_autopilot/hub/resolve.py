"""Resolve a model reference to its architecture: inline override, built-in catalog, then the Hub."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol

from llm_autopilot.catalog.hf_config import ModelConfigError, parse_hf_config
from llm_autopilot.catalog.models import find_catalog_entry, find_catalog_model
from llm_autopilot.domain.architecture import ModelArchitecture
from llm_autopilot.domain.precision import WeightFormat
from llm_autopilot.hub.client import HubClient, ModelFetchError, ModelFiles


class ModelReader(Protocol):
    """Reads config.json and the checkpoint size of a model: the Hub (HubClient) or an S3 prefix."""

    def fetch(self, repo_id: str, revision: str | None = None) -> ModelFiles: ...

#: Fields without which an override alone describes a model.
_REQUIRED_FOR_OVERRIDE_ONLY = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                               "vocab_size")


class ModelResolutionError(ValueError):
    """The model could not be resolved; the message is meant for the user."""


class InvalidOverride(ModelResolutionError):
    """spec.model.architecture, alone or merged onto the catalog's config, does not describe a model we can plan
    for (the same every time: nothing was read)."""


def hub_id(name: str) -> str:
    return name.strip().removeprefix("hf://")


#: Override fields that leave the weights as they are, so the catalog's checkpoint size still holds.
_WEIGHT_NEUTRAL = frozenset({"max_position_embeddings", "sliding_window"})


def _parsed(config: Mapping[str, Any], model_id: str, checkpoint_bytes: int | None,
            variants: Mapping[WeightFormat, str] | None) -> ModelArchitecture:
    try:
        base = parse_hf_config(config, model_id, checkpoint_bytes=checkpoint_bytes)
    except ModelConfigError as exc:
        raise ModelResolutionError(f"{model_id}: {exc}") from exc
    merged = {**base.variants, **(variants or {})}
    return dataclasses.replace(base, variants=merged) if merged != base.variants else base


def resolve_offline(
    name: str,
    *,
    revision: str | None = None,
    override: Mapping[str, Any] | None = None,
    override_checkpoint_bytes: int | None = None,
    variants: Mapping[WeightFormat, str] | None = None,
    use_catalog: bool = True,
) -> ModelArchitecture | None:
    """The architecture without the Hub: the catalog's config with the override merged on top, or an override
    complete enough on its own; None when the Hub is needed. Admission and reconcile both start here.
    ``use_catalog=False`` for an s3:// source, whose own config.json is read instead of the catalog's. Raises
    InvalidOverride when what the override makes of the model cannot be planned for."""
    model_id = hub_id(name)
    override = dict(override or {})
    entry = find_catalog_entry(model_id) if revision is None and use_catalog else None
    try:
        if entry is not None:
            if not override:
                catalog = find_catalog_model(model_id)
                assert catalog is not None  # the entry and the parsed model come from the same files
                return _with_variants(catalog, variants)
            keeps_weights = set(override) <= _WEIGHT_NEUTRAL
            checkpoint = override_checkpoint_bytes or (entry.checkpoint_bytes if keeps_weights else None)
            return _parsed({**entry.config, **override}, entry.model_id, checkpoint,
                           {**entry.variants, **(variants or {})})
        if override and all(k in override for k in _REQUIRED_FOR_OVERRIDE_ONLY):
            return _parsed(override, model_id, override_checkpoint_bytes, variants)
    except ModelResolutionError as exc:
        raise InvalidOverride(f"spec.model.architecture: {exc}") from exc
    return None


def _with_variants(model: ModelArchitecture, variants: Mapping[WeightFormat, str] | None) -> ModelArchitecture:
    return dataclasses.replace(model, variants={**model.variants, **variants}) if variants else model


def resolve_model(
    name: str,
    *,
    revision: str | None = None,
    override: Mapping[str, Any] | None = None,
    override_checkpoint_bytes: int | None = None,
    variants: Mapping[WeightFormat, str] | None = None,
    client: ModelReader | None = None,
    use_catalog: bool = True,
) -> ModelArchitecture:
    """The architecture of ``name``: offline when the catalog or the override says enough, else from the Hub
    (or ``client``: an S3 prefix)."""
    offline = resolve_offline(name, revision=revision, override=override,
                              override_checkpoint_bytes=override_checkpoint_bytes, variants=variants,
                              use_catalog=use_catalog)
    if offline is not None:
        return offline
    model_id = hub_id(name)
    override = dict(override or {})
    try:
        files = (client or HubClient()).fetch(model_id, revision)
    except ModelFetchError as exc:
        missing = [k for k in _REQUIRED_FOR_OVERRIDE_ONLY if k not in override]
        raise ModelResolutionError(
            f"{exc}; alternatively describe the model inline (spec.model.architecture; missing: "
            f"{', '.join(missing)})"
        ) from exc
    return _parsed({**files.config, **override}, model_id, override_checkpoint_bytes or files.checkpoint_bytes,
                   variants)


class ArchitectureRequired(ModelResolutionError):
    """The source cannot be read by the operator and nothing else describes the model (the same every time)."""


def pvc_needs_architecture(name: str, source: str, override: Mapping[str, Any] | None) -> str:
    """Why a pvc:// model cannot be planned: the operator does not mount volumes, so it cannot read config.json
    there; the catalog (by ``name``) or a complete spec.model.architecture must describe it."""
    missing = [k for k in _REQUIRED_FOR_OVERRIDE_ONLY if k not in (override or {})]
    return (f"{source}: the operator cannot read config.json from a volume, and {name} is not in the built-in "
            f"catalog; describe the model in spec.model.architecture (missing: {', '.join(missing)}; add "
            "weightBytes for the checkpoint size), or name a catalog model in spec.model.name")
