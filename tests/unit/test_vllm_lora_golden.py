"""planner/lora.py against what the real CPU vLLM allocated for LoRA (tests/data/vllm_cpu_lora_golden.json).

Recorded by ``make golden-lora`` (hack/record_vllm_lora.py): per tiny model, vLLM's engine started without LoRA
and with ``--enable-lora`` at several (``max_loras``, ``max_lora_rank``), all at the same KV room. The planner
must equal vLLM exactly: the bytes of every slot tensor vLLM's LoRA wrappers allocated, the punica wrapper's
tensors, and the KV tokens vLLM printed with and without LoRA.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llm_autopilot.catalog.hf_config import parse_hf_config
from llm_autopilot.domain.precision import KVCacheDtype
from llm_autopilot.planner import lora
from llm_autopilot.planner.kv_cache import kv_capacity
from llm_autopilot.planner.lora import LoRASettings
from llm_autopilot.vllm.versions import VLLMVersion, behaviour_of

GOLDEN = json.loads((Path(__file__).resolve().parent.parent / "data" / "vllm_cpu_lora_golden.json").read_text())
BEHAVIOUR = behaviour_of(VLLMVersion.parse(GOLDEN["vllm_version"]))
CASES = GOLDEN["cases"]
WITH_LORA = [c for c in CASES if c["max_loras"] is not None]
BLOCK = 128
_BYTES = {"torch.bfloat16": 2, "torch.float16": 2, "torch.float32": 4}


def _id(case: dict[str, Any]) -> str:
    return f"{case['model'].split('/')[1]}-{case['max_loras']}x{case['max_lora_rank']}"


def _settings(case: dict[str, Any]) -> LoRASettings:
    return LoRASettings(max_loras=case["max_loras"], max_lora_rank=case["max_lora_rank"])


def test_the_recording_covers_ranks_slots_models_and_target_sets() -> None:
    assert {c["max_lora_rank"] for c in WITH_LORA} >= {8, 16, 32, 64}
    assert {c["max_loras"] for c in WITH_LORA} >= {1, 2, 3, 4}
    assert {c["model"] for c in WITH_LORA} == {c["model"] for c in CASES if c["max_loras"] is None}
    targets = {tuple(a["target_modules"]) for c in WITH_LORA for a in c["adapters"]}
    assert len(targets) >= 3
    assert any(c["config"].get("tie_word_embeddings") for c in WITH_LORA)


@pytest.mark.parametrize("case", WITH_LORA, ids=_id)
def test_slot_bytes_equal_what_vllm_allocated(case: dict[str, Any]) -> None:
    m = parse_hf_config(case["config"], case["model"])
    measured = case["measured"]
    dtype_bytes = _BYTES[measured["lora_dtype"]]
    planned = lora.slot_bytes(m, 1, m.num_layers, 0, _settings(case), dtype_bytes=dtype_bytes)
    assert planned == measured["slot_bytes"], measured["by_class"]


@pytest.mark.parametrize("case", WITH_LORA, ids=_id)
def test_punica_metadata_equals_the_cpu_wrappers_tensors(case: dict[str, Any]) -> None:
    (wrapper,) = case["measured"]["punica"].values()
    assert wrapper["class"] == "PunicaWrapperCPU"
    planned = lora.punica_metadata_bytes(case["max_num_batched_tokens"], case["max_num_seqs"], case["max_loras"],
                                         device="cpu")
    assert planned == wrapper["bytes"], wrapper["tensors"]
    # the GPU wrapper adds its LoRAKernelMeta: the device matters
    assert lora.punica_metadata_bytes(case["max_num_batched_tokens"], case["max_num_seqs"], case["max_loras"]) \
        > wrapper["bytes"]


def _planned_tokens(case: dict[str, Any]) -> int:
    m = parse_hf_config(case["config"], case["model"])
    room = case["kv_cache_memory_bytes"]
    if case["max_loras"] is not None and lora.reduces_kv_room("cpu", explicit_kv_cache_bytes=True):
        room -= case["measured"]["slot_bytes"]
    capacity = kv_capacity(m, 1, 1, KVCacheDtype.AUTO, available_bytes=room, max_model_len=case["max_model_len"],
                           max_num_batched_tokens=case["max_num_batched_tokens"], block_size=BLOCK,
                           limit=case["max_model_len"], reserve_null_block=BEHAVIOUR.reserves_null_block,
                           group_aware_size=BEHAVIOUR.group_aware_kv_size)
    return capacity.tokens


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_kv_tokens_equal_what_vllm_printed_with_and_without_lora(case: dict[str, Any]) -> None:
    assert _planned_tokens(case) == case["kv_cache_tokens"], case["line"]
    without = next(c for c in CASES if c["model"] == case["model"] and c["max_loras"] is None)
    assert case["kv_cache_tokens"] == without["kv_cache_tokens"]


def test_on_a_gpu_without_an_explicit_room_the_slots_come_out_of_the_kv_cache() -> None:
    assert lora.reduces_kv_room("cuda", explicit_kv_cache_bytes=False)
    assert not lora.reduces_kv_room("cuda", explicit_kv_cache_bytes=True)
    assert not lora.reduces_kv_room("cpu", explicit_kv_cache_bytes=False)


@pytest.mark.parametrize("case", WITH_LORA, ids=_id)
def test_adapters_change_the_output_and_a_higher_rank_is_refused(case: dict[str, Any]) -> None:
    outputs, refused = case["measured"]["outputs"], case["measured"]["refused"]
    for adapter in case["adapters"]:
        if adapter["rank"] > case["max_lora_rank"]:
            assert refused[adapter["name"]] == (f"ValueError: LoRA rank {adapter['rank']} is greater than "
                                                f"max_lora_rank {case['max_lora_rank']}.")
        else:
            assert adapter["name"] in outputs and outputs[adapter["name"]] != outputs["base"], case["measured"]


def test_slot_bytes_do_not_depend_on_the_adapters_target_modules() -> None:
    """vLLM wraps every linear and the embeddings whatever the adapters target (--lora-target-modules unset):
    one adapter targets attention only, another the MLP only, and the slots are the planner's full set."""
    case = next(c for c in WITH_LORA if len({tuple(a["target_modules"]) for a in c["adapters"]}) >= 3)
    modules = case["measured"]["modules"]
    assert any(k.endswith("qkv_proj") for k in modules) and any(k.endswith("down_proj") for k in modules)
    assert "model.embed_tokens" in modules and "logits_processor" in modules
