#!/usr/bin/env python3
"""Tiny LoRA adapters for the tiny models (``hack/tiny_models.py``), made locally: no PEFT, no download.

PEFT is not in the CPU vLLM's environment, so each adapter is written in PEFT's own format with torch and
safetensors: ``adapter_config.json`` (``peft_type`` LORA, ``r``, ``lora_alpha``, ``target_modules``,
``base_model_name_or_path``) and ``adapter_model.safetensors`` with ``base_model.model.<module>.lora_A.weight``
(``r x in``) and ``lora_B.weight`` (``out x r``) for every target module of every layer. The weights are random
(a fixed seed) and B is not zero (PEFT starts B at zero, which would leave the adapter without effect), so an
adapter changes what the model generates. Runs in the CPU vLLM's environment:

    $(python3 hack/cluster.py vllm path) hack/tiny_adapters.py DIR [NAME ...]

prints one JSON line per adapter: ``{"name", "path", "base_model", "rank", "target_modules"}``. Idempotent.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_models import BY_NAME, SEED

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class TinyAdapter:
    name: str
    model: str  # a tiny model's name (tiny_models.MODELS)
    rank: int
    target_modules: tuple[str, ...]


ADAPTERS: tuple[TinyAdapter, ...] = (
    TinyAdapter("gqa-r8-attn", "tiny-llama-gqa", 8, ATTENTION),
    TinyAdapter("gqa-r16-all", "tiny-llama-gqa", 16, ATTENTION + MLP),
    TinyAdapter("gqa-r64-mlp", "tiny-llama-gqa", 64, MLP),
    TinyAdapter("mqa-r32-qv", "tiny-llama-mqa", 32, ("q_proj", "v_proj")),
    TinyAdapter("tied-r8-all", "tiny-llama-tied", 8, ATTENTION + MLP),
)
BY_ADAPTER = {a.name: a for a in ADAPTERS}


def shapes(config: dict[str, Any], module: str) -> tuple[int, int]:
    """(in_features, out_features) of a Llama linear."""
    h, hd = config["hidden_size"], config["head_dim"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    inter = config["intermediate_size"]
    return {"q_proj": (h, heads * hd), "k_proj": (h, kv * hd), "v_proj": (h, kv * hd), "o_proj": (heads * hd, h),
            "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}[module]


def make(adapter: TinyAdapter, root: Path) -> dict[str, Any]:
    import torch  # noqa: PLC0415
    from safetensors.torch import save_file  # noqa: PLC0415

    folder = root / adapter.name
    base = f"llm-autopilot/{adapter.model}"
    described = {"name": adapter.name, "path": str(folder), "base_model": base, "rank": adapter.rank,
                 "target_modules": list(adapter.target_modules)}
    if (folder / "adapter_config.json").is_file() and (folder / "adapter_model.safetensors").is_file():
        return described
    config = BY_NAME[adapter.model].config
    generator = torch.Generator().manual_seed(SEED + adapter.rank)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module in adapter.target_modules:
            part = "self_attn" if module in ATTENTION else "mlp"
            fan_in, fan_out = shapes(config, module)
            prefix = f"base_model.model.model.layers.{layer}.{part}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = (torch.randn(adapter.rank, fan_in, generator=generator) * 0.1
                                                  ).to(torch.bfloat16)
            tensors[f"{prefix}.lora_B.weight"] = (torch.randn(fan_out, adapter.rank, generator=generator) * 0.1
                                                  ).to(torch.bfloat16)
    staging = root / f".{adapter.name}.staging"
    staging.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(staging / "adapter_model.safetensors"), metadata={"format": "pt"})
    (staging / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base, "r": adapter.rank,
        "lora_alpha": 2 * adapter.rank, "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
        "target_modules": list(adapter.target_modules), "modules_to_save": None, "inference_mode": True,
    }, indent=2) + "\n")
    staging.rename(folder)  # whole or not at all
    return described


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(argv[0])
    root.mkdir(parents=True, exist_ok=True)
    names = argv[1:] or [a.name for a in ADAPTERS]
    unknown = [n for n in names if n not in BY_ADAPTER]
    if unknown:
        print(f"unknown adapter(s) {unknown}; known: {', '.join(BY_ADAPTER)}", file=sys.stderr)
        return 2
    for name in names:
        print(json.dumps(make(BY_ADAPTER[name], root)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
