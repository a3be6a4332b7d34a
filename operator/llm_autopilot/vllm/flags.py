"""Which ``vllm serve`` flags each vLLM release accepts (data/flags.json, read from each release's source
by ``hack/vllm_flags.py``) and how vLLM's parser reads an argument. Which of them the operator owns is
api/serve_flags.py's one table.

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


def is_option(arg: str) -> bool:
    """Whether a command-line argument is an option (``--x``, ``-tp``), not a value (``-1``, ``3.5``)."""
    if not arg.startswith("-"):
        return False
    try:
        float(arg)
    except ValueError:
        return True
    return False


def flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def normalise_flag(arg: str) -> str:
    """The option an argument names, spelled as vLLM's FlexibleArgumentParser matches it.

    ``--max_model_len=4096`` -> ``--max-model-len`` (``_`` becomes ``-`` up to the first ``.``);
    ``--compilation-config.mode=3`` -> ``--compilation-config`` and ``-cc.mode`` -> ``-cc`` (dotted keys of
    a JSON option); ``-O3``, ``-O=3``, ``-Odecode`` -> ``-O`` (rewritten to ``--optimization-level``).
    Prefixes (``--max-model``), which argparse also accepts, are not expanded here: ``named_options`` does.
    """
    key = flag_name(arg)
    if key.startswith("--"):
        head = key[2:].split(".", 1)[0]
        return "--" + head.removesuffix("+").replace("_", "-")
    if key.startswith("-O"):
        return "-O"
    return key.split(".", 1)[0]


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


@cache
def every_flag() -> frozenset[str]:
    """Every option string of every examined release."""
    return frozenset().union(*(known_flags(v) for v in examined_versions()))


def named_options(arg: str) -> frozenset[str]:
    """The options of any examined release an argument may set, as vLLM's parser reads it: after
    ``normalise_flag``, argparse (``allow_abbrev`` is left on: vLLM never turns it off) takes an exact option, else
    any unambiguous prefix of a ``--`` option (``--max-model`` is ``--max-model-len``); a single-dash argument is
    also read as a one-letter option with its value attached (``-n4`` is ``-n 4``, ``-qfp8`` is ``-q fp8``) or as a
    prefix of a single-dash option (``-t`` is ``-tp``). Several options: argparse calls it ambiguous and exits."""
    if not is_option(arg):
        return frozenset()
    key, flags = normalise_flag(arg), every_flag()
    if key in flags:
        return frozenset({key})
    if key.startswith("--"):
        return frozenset(f for f in flags if len(key) > 2 and f.startswith(key))
    short = {key[:2]} & flags if len(key) > 2 else set()
    return frozenset(short | {f for f in flags if not f.startswith("--") and f.startswith(key)})
