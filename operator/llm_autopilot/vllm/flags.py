"""Which ``vllm serve`` flags each vLLM release accepts (data/flags.json, read from each release's source
by ``hack/vllm_flags.py``).

A version between two examined releases takes the flags of the older one: flags are added and
removed at releases, and the older set is the one we verified.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from llm_autopilot.vllm.versions import VersionError, VLLMVersion


@cache
def _table() -> dict[VLLMVersion, dict[str, Any]]:
    raw = json.loads(resources.files("llm_autopilot.vllm").joinpath("data/flags.json").read_text("utf-8"))
    return {VLLMVersion.parse(v): entry for v, entry in raw["versions"].items()}


def examined_versions() -> list[VLLMVersion]:
    return sorted(_table())


def _entry(version: str | VLLMVersion) -> dict[str, Any]:
    wanted = version if isinstance(version, VLLMVersion) else VLLMVersion.parse(version)
    older = [v for v in _table() if v <= wanted]
    if not older:
        raise VersionError(f"vLLM {wanted} is older than the oldest release we know ({examined_versions()[0]})")
    return _table()[max(older)]


def flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


@cache
def known_flags(version: str | VLLMVersion) -> frozenset[str]:
    return frozenset(_entry(version)["flags"])


def kv_cache_dtype_choices(version: str | VLLMVersion) -> frozenset[str]:
    return frozenset(_entry(version).get("kv_cache_dtype_choices", ()))


def quantization_choices(version: str | VLLMVersion) -> frozenset[str]:
    return frozenset(_entry(version).get("quantization_choices", ()))


def alias_groups(version: str | VLLMVersion) -> list[frozenset[str]]:
    """Option strings that name one option (``--tensor-parallel-size``/``-tp``, ``--x``/``--no-x``)."""
    return [frozenset(group) for group in _entry(version).get("aliases", ())]
