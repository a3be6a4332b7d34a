"""Which ``vllm serve`` flags each vLLM release accepts (data/flags.json, read from each release's source
by ``hack/vllm_flags.py``), how vLLM's parser spells them, and which of them the planner owns.

A version between two examined releases takes the flags of the older one: flags are added and
removed at releases, and the older set is the one we verified.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from llm_autopilot.vllm.versions import VersionError, VLLMVersion

#: Options the operator derives from the plan, or that change what the plan's memory arithmetic assumes;
#: setting them in extraArgs fights the planner. Every spelling vLLM 0.31-0.33 gives them (short aliases,
#: the ``--no-`` negation, the older name), as the parser matches them after ``normalise_flag``.
OPERATOR_OWNED_FLAGS: frozenset[str] = frozenset({
    # GPUs per replica: the pod requests tensor x pipeline parallel GPUs, the planner splits the model so
    "--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp",
    "--data-parallel-size", "-dp", "--data-parallel-size-local", "-dpl",
    "--decode-context-parallel-size", "-dcp", "--prefill-context-parallel-size", "-pcp",
    # the memory budget and what the KV cache gets of it
    "--gpu-memory-utilization", "--device-memory-utilization", "--kv-cache-memory-bytes",
    "--num-gpu-blocks-override", "--block-size", "--cpu-offload-gb", "--kv-offloading-size",
    # context length and batch shape (activation peak, sampler warm-up, CUDA-graph sizes)
    "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens", "--max-num-scheduled-tokens",
    # precision of weights, activations and the KV cache
    "--quantization", "-q", "--dtype", "--kv-cache-dtype",
    # CUDA graphs: captured sizes and their memory (-O / --optimization-level pick a compilation preset)
    "--enforce-eager", "--no-enforce-eager", "-O", "--optimization-level", "--compilation-config", "-cc",
    "--cudagraph-capture-sizes", "--max-cudagraph-capture-size",
    # the model the planner read (config overrides, a draft model beside it) and where it is served
    "--model", "--revision", "--served-model-name", "--hf-overrides", "--speculative-config", "-sc", "--port",
})


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
    Unambiguous prefixes (``--max-model``), which argparse also accepts, are not expanded: they are not
    in the flag table, so the operator refuses them as unknown.
    """
    key = flag_name(arg)
    if key.startswith("--"):
        head = key[2:].split(".", 1)[0]
        return "--" + head.removesuffix("+").replace("_", "-")
    if key.startswith("-O"):
        return "-O"
    return key.split(".", 1)[0]


def is_owned(arg: str) -> bool:
    """Whether an argument (any spelling, with or without ``=value``) sets an option the planner owns."""
    return normalise_flag(arg) in OPERATOR_OWNED_FLAGS


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
