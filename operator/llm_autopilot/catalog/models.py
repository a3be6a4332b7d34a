"""The built-in model catalog: real ``config.json`` fields of popular models, shipped as package data.

Each file in ``catalog/models/`` is a trimmed copy of the published ``config.json``
(``_model_id`` names the Hub id, ``_safetensors_total_bytes`` the published checkpoint size).
The catalog parses them with the same code that parses configs fetched from the Hub.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any

from llm_autopilot.catalog.hf_config import parse_hf_config
from llm_autopilot.domain.architecture import ModelArchitecture
from llm_autopilot.domain.precision import WeightFormat

#: Pre-quantized checkpoints published by the model's authors (or NVIDIA) for the same weights.
_VARIANTS: dict[str, dict[WeightFormat, str]] = {
    "Qwen/Qwen3-32B": {WeightFormat.FP8: "Qwen/Qwen3-32B-FP8", WeightFormat.AWQ: "Qwen/Qwen3-32B-AWQ"},
    "Qwen/Qwen3-30B-A3B": {WeightFormat.FP8: "Qwen/Qwen3-30B-A3B-FP8"},
    "Qwen/Qwen3-235B-A22B": {WeightFormat.FP8: "Qwen/Qwen3-235B-A22B-FP8"},
    "meta-llama/Llama-3.1-70B-Instruct": {WeightFormat.FP8: "nvidia/Llama-3.1-70B-Instruct-FP8"},
}

#: Fields the trimmed copies lack. NVIDIA's ModelOpt checkpoints describe their quantization in
#: hf_quant_config.json rather than config.json.
_PATCHES: dict[str, dict[str, Any]] = {
    "nvidia/Llama-3.1-70B-Instruct-FP8": {"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}},
}


@dataclass(frozen=True)
class CatalogEntry:
    """One catalog model: its config.json fields as shipped, its checkpoint size and its variants."""

    model_id: str
    config: Mapping[str, Any]
    checkpoint_bytes: int | None
    variants: Mapping[WeightFormat, str]


@cache
def _entries() -> dict[str, CatalogEntry]:
    entries: dict[str, CatalogEntry] = {}
    folder = resources.files("llm_autopilot.catalog").joinpath("models")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".json"):
            continue
        raw: dict[str, Any] = json.loads(entry.read_text(encoding="utf-8"))
        model_id = str(raw["_model_id"])
        raw.update(_PATCHES.get(model_id, {}))
        entries[model_id] = CatalogEntry(model_id, MappingProxyType(raw), raw.get("_safetensors_total_bytes"),
                                         MappingProxyType(_VARIANTS.get(model_id, {})))
    return entries


@cache
def _load_all() -> dict[str, ModelArchitecture]:
    return {model_id: parse_hf_config(e.config, model_id, checkpoint_bytes=e.checkpoint_bytes,
                                      variants=e.variants or None)
            for model_id, e in _entries().items()}


def _catalog_id(model_id: str) -> str | None:
    wanted = model_id.strip().removeprefix("hf://").lower()
    matches = [m_id for m_id in _entries() if m_id.lower() == wanted or m_id.lower().split("/", 1)[-1] == wanted]
    return matches[0] if len(matches) == 1 else None


def catalog_config(model_id: str) -> dict[str, Any]:
    """The config.json fields a catalog model was parsed from (patches applied, ``_``-keys dropped), e.g. to
    hand vLLM the very file the planner read."""
    return {k: v for k, v in _entries()[model_id].config.items() if not k.startswith("_")}


def catalog_models() -> list[ModelArchitecture]:
    return list(_load_all().values())


def find_catalog_model(model_id: str) -> ModelArchitecture | None:
    """Exact Hub id, case-insensitive; also the bare name ("Qwen3-8B") when it is unambiguous."""
    found = _catalog_id(model_id)
    return None if found is None else _load_all()[found]


def find_catalog_entry(model_id: str) -> CatalogEntry | None:
    """The catalog's config of a model (matched as find_catalog_model does), to merge an override onto."""
    found = _catalog_id(model_id)
    return None if found is None else _entries()[found]
