"""The planner's KV arithmetic against what a real vLLM printed (tests/data/vllm_cpu_kv_golden.json).

Each case is one start of the CPU build of vLLM on a tiny model with a known KV room
(``--kv-cache-memory-bytes``), recorded by ``make golden-vllm`` (hack/record_vllm_kv.py). The planner must
land on vLLM's own numbers exactly: bytes per token (from the room and the tokens vLLM reported), the
cache's size in tokens ("CPU KV cache size: N tokens"), and the largest max_model_len it admits ("the
estimated maximum model length is N").
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from llm_autopilot.catalog.hf_config import parse_hf_config
from llm_autopilot.domain.precision import KVCacheDtype
from llm_autopilot.planner.kv_cache import kv_bytes_per_token, kv_cache_group_size, kv_capacity, stage_layer_split
from llm_autopilot.vllm.versions import VLLMVersion, behaviour_of

GOLDEN = json.loads((Path(__file__).resolve().parent.parent / "data" / "vllm_cpu_kv_golden.json").read_text())
BEHAVIOUR = behaviour_of(VLLMVersion.parse(GOLDEN["vllm_version"]))
CASES = GOLDEN["cases"]


def _capacity(case: dict[str, Any]) -> tuple[int, int, int]:
    model = parse_hf_config(case["config"], case["model"])
    dtype = KVCacheDtype.FP8 if case["kv_cache_dtype"] == "fp8" else KVCacheDtype.AUTO
    room = kv_capacity(model, 1, 1, dtype, available_bytes=case["kv_cache_memory_bytes"],
                       max_model_len=case["max_model_len"],
                       max_num_batched_tokens=case["max_num_batched_tokens"] * BEHAVIOUR.in_flight_batches(on_cpu=True),
                       block_size=GOLDEN["block_size"], limit=case["max_model_len"],
                       reserve_null_block=BEHAVIOUR.reserves_null_block,
                       group_aware_size=BEHAVIOUR.group_aware_kv_size)
    return kv_bytes_per_token(model, 1, 1, dtype), room.tokens, room.largest_len


def test_the_recording_covers_every_shape() -> None:
    models = {c["model"] for c in CASES}
    assert {"llm-autopilot/tiny-llama-gqa", "llm-autopilot/tiny-llama-mqa", "llm-autopilot/tiny-llama-tied",
            "llm-autopilot/tiny-mistral-swa", "llm-autopilot/tiny-phi3-longwindow", "llm-autopilot/tiny-gemma2-9",
            "llm-autopilot/tiny-gemma2-3f5s"} <= models
    gemma2 = next(c for c in CASES if c["model"] == "llm-autopilot/tiny-gemma2-9")
    assert "layer_types" not in gemma2["config"]  # the Hub's form: transformers fills it in
    assert any(c["kv_cache_dtype"] == "fp8" for c in CASES)
    assert any("estimated_max_model_len" in c for c in CASES) and any("kv_cache_tokens" in c for c in CASES)


@pytest.mark.parametrize("case", [c for c in CASES if "kv_cache_tokens" in c], ids=lambda c: c["command"][11:80])
def test_kv_cache_tokens_equal_what_vllm_printed(case: dict[str, Any]) -> None:
    per_token, tokens, largest = _capacity(case)
    assert tokens == case["kv_cache_tokens"], case["line"]
    # vLLM started, so the requested length fitted: the planner must agree
    assert largest == case["max_model_len"]
    if "sliding_window" not in case["config"] or not case["config"]["sliding_window"]:
        # full attention: the printed tokens are whole blocks of the room, so they pin the bytes per token
        printed, block = case["kv_cache_tokens"], GOLDEN["block_size"]
        assert printed * per_token <= case["kv_cache_memory_bytes"] < (printed + block) * per_token


@pytest.mark.parametrize("case", [c for c in CASES if "estimated_max_model_len" in c],
                         ids=lambda c: c["command"][11:80])
def test_largest_max_model_len_equals_vllms_estimate(case: dict[str, Any]) -> None:
    _, _, largest = _capacity(case)
    assert largest == case["estimated_max_model_len"], case["line"]


def test_without_the_null_block_the_estimate_would_be_one_block_longer() -> None:
    """The reservation is what makes 8,064 of 8,192: dropping it must break the match (the test can fail)."""
    case = next(c for c in CASES if c.get("estimated_max_model_len") == 8064)
    model = parse_hf_config(case["config"], case["model"])
    room = kv_capacity(model, 1, 1, KVCacheDtype.AUTO, available_bytes=case["kv_cache_memory_bytes"],
                       max_model_len=case["max_model_len"], max_num_batched_tokens=case["max_num_batched_tokens"],
                       block_size=GOLDEN["block_size"], limit=case["max_model_len"], reserve_null_block=False,
                       group_aware_size=True)
    assert room.largest_len == 8064 + GOLDEN["block_size"]


def _case(model: str, length: int) -> dict[str, Any]:
    return next(c for c in CASES if c["model"] == f"llm-autopilot/{model}" and c["max_model_len"] == length)


def test_a_window_longer_than_the_context_costs_one_block_per_request() -> None:
    """Phi-3-mini-128k's shape: dropping the window (the planner's old rule) gives whole-room tokens, one block
    per request too many, which vLLM does not (the test can fail)."""
    case = _case("tiny-phi3-longwindow", 4096)
    model = parse_hf_config(case["config"], case["model"])
    assert model.sliding_window is not None and model.sliding_window > case["max_model_len"]
    without = dataclasses.replace(model, sliding_window=None, num_sliding_window_layers=0)
    room = kv_capacity(without, 1, 1, KVCacheDtype.AUTO, available_bytes=case["kv_cache_memory_bytes"],
                       max_model_len=case["max_model_len"], max_num_batched_tokens=case["max_num_batched_tokens"],
                       block_size=GOLDEN["block_size"], limit=case["max_model_len"], reserve_null_block=True,
                       group_aware_size=True)
    assert room.tokens == case["kv_cache_memory_bytes"] // kv_bytes_per_token(without, 1, 1, KVCacheDtype.AUTO)
    assert room.tokens != case["kv_cache_tokens"]


@pytest.mark.parametrize(("name", "full", "sliding", "group"), [
    ("one type only", 0, 2, 2),
    ("near-equal, sliding larger (9-layer Gemma 2)", 4, 5, 5),
    ("near-equal, full larger", 13, 12, 13),
    ("equal", 21, 21, 21),
    ("exactly 1.5x: the smaller", 2, 3, 2),
    ("1.67x: the smaller", 3, 5, 3),
    ("Gemma 3's 1:5", 10, 52, 10),
])
def test_kv_cache_group_size_follows_vllms_rule(name: str, full: int, sliding: int, group: int) -> None:
    assert kv_cache_group_size(full, sliding) == group, name


def test_grouping_near_equal_counts_by_the_smaller_would_miss_vllms_tokens() -> None:
    """The 9-layer Gemma 2 without layer_types: groups of 4 (the old rule) instead of vLLM's padded 5."""
    case = _case("tiny-gemma2-9", 1024)
    model = parse_hf_config(case["config"], case["model"])
    assert (model.num_full_attention_layers, model.num_sliding_window_layers) == (4, 5)
    assert stage_layer_split(model, 1) == (5, 5)
    per_layer_block = kv_bytes_per_token(model, 1, 1, KVCacheDtype.AUTO) // 9 * GOLDEN["block_size"]
    old_pool = case["kv_cache_memory_bytes"] // (4 * per_layer_block)
    old_per_request = 8 + 2 * 9  # 1 full group of cdiv(1024, 128) blocks, 2 sliding groups of cdiv(min(2303, 1024)) + 1
    assert int(old_pool / old_per_request * 1024) != case["kv_cache_tokens"]
