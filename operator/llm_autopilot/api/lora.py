"""``spec.lora`` -> the planner's LoRA settings, and the admission refusals that need the adapters' configs. Pure.

The adapters' ``adapter_config.json`` files are read by the shell where they live (the Hub, an S3 prefix, a
volume's inspect Job: ``controller/adapters.py``) and handed in already parsed (``AdapterConfig``); nothing here
does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec, LoRASpec
from llm_autopilot.planner.lora import DEFAULT_MAX_LORA_RANK, VLLM_LORA_RANKS, LoRASettings, rank_for


@dataclass(frozen=True)
class AdapterConfig:
    """What the planner needs from a PEFT ``adapter_config.json``."""

    rank: int | None
    base_model: str | None


def parse_adapter_config(raw: Mapping[str, Any]) -> AdapterConfig:
    """``r`` (the rank; PEFT's ``rank_pattern`` may raise it per module) and ``base_model_name_or_path``."""
    rank = raw.get("r")
    ranks = [rank] if isinstance(rank, int) and not isinstance(rank, bool) and rank > 0 else []
    pattern = raw.get("rank_pattern")
    if isinstance(pattern, Mapping):
        ranks += [v for v in pattern.values() if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    base = raw.get("base_model_name_or_path")
    return AdapterConfig(max(ranks) if ranks else None, base if isinstance(base, str) and base else None)


def _hub_path(source: str) -> str:
    return source.removeprefix("hf://")


def default_rank(lora: LoRASpec, configs: Mapping[str, AdapterConfig]) -> int:
    """``maxLoraRank`` when the spec leaves it out: the largest known adapter rank (rounded up to one vLLM
    accepts), else vLLM's default 16."""
    known = [c.rank for a in lora.adapters if (c := configs.get(a.name)) is not None and c.rank]
    if not known:
        return DEFAULT_MAX_LORA_RANK
    return rank_for(max(known)) or max(known)


def lora_settings(spec: LLMDeploymentSpec, configs: Mapping[str, AdapterConfig] | None = None) -> LoRASettings | None:
    lora = spec.lora
    if lora is None:
        return None
    rank = lora.max_lora_rank or default_rank(lora, configs or {})
    return LoRASettings(max_loras=lora.slots, max_lora_rank=rank, max_cpu_loras=lora.max_cpu_loras,
                        modules=tuple((a.name, _hub_path(a.source)) for a in lora.adapters))


def pinned_adapters(spec: LLMDeploymentSpec) -> int:
    return sum(a.pinned for a in spec.lora.adapters) if spec.lora else 0


def _looks_like_hub_id(name: str) -> bool:
    # a trainer's local path ("/models/llama", "./base") says nothing about which Hub model it was
    return _hub_path(name).count("/") == 1 and not name.startswith(("/", ".", "~"))


def _same_model(a: str, b: str) -> bool:
    return _hub_path(a).strip("/").lower() == _hub_path(b).strip("/").lower()


def lora_problems(spec: LLMDeploymentSpec, configs: Mapping[str, AdapterConfig] | None = None) -> list[str]:
    """Why the adapters cannot be served as the spec says, each with the fix. ``configs`` holds the adapters'
    configs read so far (by adapter name); an adapter without one is judged on the spec alone."""
    lora, configs = spec.lora, configs or {}
    if lora is None:
        return []
    problems = []
    rank = lora.max_lora_rank or default_rank(lora, configs)
    for i, adapter in enumerate(lora.adapters):
        where = f"lora.adapters[{i}] ({adapter.name})"
        config = configs.get(adapter.name)
        if config is None:
            continue
        if config.rank is not None and rank_for(config.rank) is None:
            # with maxLoraRank left out the default would be this rank, which no slot of vLLM's can hold
            problems.append(f"{where}: rank {config.rank} is above vLLM's largest max_lora_rank "
                            f"({VLLM_LORA_RANKS[-1]}); vLLM cannot serve it: retrain the adapter at a lower rank")
        elif config.rank is not None and config.rank > rank:
            problems.append(f"{where}: rank {config.rank} exceeds maxLoraRank {rank}; vLLM refuses to load it: "
                            f"raise lora.maxLoraRank to {rank_for(config.rank)} (every slot grows with it)")
        if config.base_model is not None and _looks_like_hub_id(config.base_model) \
                and not _same_model(config.base_model, spec.model.name):
            problems.append(f"{where}: its adapter_config.json says it was trained on {config.base_model}, not "
                            f"{_hub_path(spec.model.name)}; serve it on that model, or use an adapter of this one")
    return problems


def lora_refusal(spec: LLMDeploymentSpec, configs: Mapping[str, AdapterConfig] | None = None) -> str | None:
    """The one message admission and reconcile give for :func:`lora_problems` (None: nothing to refuse). The
    pinned adapters beyond maxLoras are refused by the spec itself (``LoRASpec``, and its CEL rule)."""
    problems = lora_problems(spec, configs)
    return "spec." + "; spec.".join(problems) if problems else None
