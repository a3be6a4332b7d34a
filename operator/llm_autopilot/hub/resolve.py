"""Resolve a model reference to its architecture: inline override, built-in catalog, then the Hub."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from llm_autopilot.catalog.hf_config import ModelConfigError, parse_hf_config
from llm_autopilot.catalog.models import find_catalog_model
from llm_autopilot.domain.architecture import ModelArchitecture
from llm_autopilot.domain.precision import WeightFormat
from llm_autopilot.hub.client import HubClient, ModelFetchError

#: Fields without which an override alone describes a model.
_REQUIRED_FOR_OVERRIDE_ONLY = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                               "vocab_size")


class ModelResolutionError(ValueError):
    """The model could not be resolved; the message is meant for the user."""


def hub_id(name: str) -> str:
    return name.strip().removeprefix("hf://")


def resolve_model(
    name: str,
    *,
    revision: str | None = None,
    override: Mapping[str, Any] | None = None,
    override_checkpoint_bytes: int | None = None,
    variants: Mapping[WeightFormat, str] | None = None,
    client: HubClient | None = None,
) -> ModelArchitecture:
    """The architecture of ``name``: a complete override needs no look-up; the catalog needs no network."""
    model_id = hub_id(name)
    override = dict(override or {})
    base: ModelArchitecture | None = None
    config: dict[str, Any] | None = None
    checkpoint_bytes = override_checkpoint_bytes
    if override and all(k in override for k in _REQUIRED_FOR_OVERRIDE_ONLY):
        config = {}
    elif revision is None and not override and (base := find_catalog_model(model_id)) is not None:
        pass
    else:
        try:
            files = (client or HubClient()).fetch(model_id, revision)
        except ModelFetchError as exc:
            missing = [k for k in _REQUIRED_FOR_OVERRIDE_ONLY if k not in override]
            raise ModelResolutionError(
                f"{exc}; alternatively describe the model inline (spec.model.architecture; missing: "
                f"{', '.join(missing)})"
            ) from exc
        config, checkpoint_bytes = files.config, checkpoint_bytes or files.checkpoint_bytes
    if base is None:
        try:
            base = parse_hf_config({**(config or {}), **override}, model_id, checkpoint_bytes=checkpoint_bytes)
        except ModelConfigError as exc:
            raise ModelResolutionError(f"{model_id}: {exc}") from exc
    if variants:
        base = dataclasses.replace(base, variants={**base.variants, **variants})
    return base
