"""Weights per GPU and KV bytes per token, checked against published sizes and vLLM's own examples."""

from __future__ import annotations

import dataclasses

import pytest

from llm_autopilot.catalog.models import catalog_models
from llm_autopilot.domain.architecture import ModelArchitecture
from llm_autopilot.domain.precision import GIB, KVCacheDtype, WeightFormat, weight_bytes_per_parameter
from llm_autopilot.planner.kv_cache import (
    kv_bytes_per_request,
    kv_bytes_per_token,
    largest_len_that_fits,
    stage_layer_split,
)
from llm_autopilot.planner.weights import (
    counted_checkpoint_bytes,
    stage_layers,
    total_parameters,
    weight_bytes_per_gpu,
)
from tests.conftest import model


@pytest.mark.parametrize("m", [m for m in catalog_models() if m.checkpoint_bytes], ids=lambda m: m.model_id)
def test_counted_size_matches_the_published_checkpoint(m: ModelArchitecture) -> None:
    assert m.checkpoint_bytes is not None
    # Gemma 3's checkpoint also holds its vision tower (1.6 %); everything else is within 0.5 %.
    assert counted_checkpoint_bytes(m) == pytest.approx(m.checkpoint_bytes, rel=0.02)


@pytest.mark.parametrize(("model_id", "billions"), [
    ("meta-llama/Llama-3.1-8B-Instruct", 8.03), ("meta-llama/Llama-3.1-70B-Instruct", 70.6),
    ("meta-llama/Llama-3.1-405B", 405.9), ("Qwen/Qwen3-30B-A3B", 30.5), ("deepseek-ai/DeepSeek-V3", 671.0),
    ("mistralai/Mixtral-8x7B-v0.1", 46.7), ("openai/gpt-oss-120b", 116.8),
])
def test_parameter_counts(model_id: str, billions: float) -> None:
    assert total_parameters(model(model_id)) / 1e9 == pytest.approx(billions, rel=0.005)


def test_tensor_parallel_splits_weights() -> None:
    m = model("meta-llama/Llama-3.1-70B-Instruct")
    one = weight_bytes_per_gpu(m, WeightFormat.NONE, 1)
    assert weight_bytes_per_gpu(m, WeightFormat.NONE, 4) == pytest.approx(one / 4, rel=0.01)


def test_kv_projection_replication_keeps_weights_above_an_even_split() -> None:
    m = model("meta-llama/Llama-3.1-70B-Instruct")  # 8 KV heads
    per_gpu_16 = weight_bytes_per_gpu(m, WeightFormat.NONE, 16)
    assert per_gpu_16 > weight_bytes_per_gpu(m, WeightFormat.NONE, 1) / 16


def test_online_fp8_keeps_embeddings_in_bf16() -> None:
    m = model("meta-llama/Llama-3.1-8B-Instruct")
    fp8 = weight_bytes_per_gpu(m, WeightFormat.FP8, 1) / GIB
    # vLLM 0.19 printed 8.49 GiB for --quantization fp8 on this model
    assert fp8 == pytest.approx(8.49, abs=0.1)


def test_awq_bytes_include_scales_and_zeros() -> None:
    assert weight_bytes_per_parameter(WeightFormat.AWQ, bits=4, group_size=128) == pytest.approx(0.5195, abs=1e-4)
    assert weight_bytes_per_parameter(WeightFormat.MXFP4) == pytest.approx(0.53125)
    with pytest.raises(ValueError, match="not a quantized"):
        weight_bytes_per_parameter(WeightFormat.NONE)


def test_awq_variant_is_about_a_third_of_bf16() -> None:
    base, awq = model("Qwen/Qwen3-32B"), model("Qwen/Qwen3-32B-AWQ")
    ratio = weight_bytes_per_gpu(awq, WeightFormat.AWQ, 1) / weight_bytes_per_gpu(base, WeightFormat.NONE, 1)
    assert 0.28 < ratio < 0.32


def test_pipeline_stages_hold_a_share_of_the_layers() -> None:
    assert stage_layers(80, 1) == 80
    assert stage_layers(61, 4) == 16  # the remainder goes to earlier stages; size for the busiest
    m = model("meta-llama/Llama-3.1-8B-Instruct")
    pp2 = weight_bytes_per_gpu(m, WeightFormat.NONE, 1, 2) / GIB
    assert pp2 == pytest.approx(7.51, abs=0.1)  # vLLM 0.19 printed 7.51 GiB per stage


def test_llama70b_kv_is_40_kib_per_token_at_tp8_and_tp16() -> None:
    m = model("meta-llama/Llama-3.1-70B-Instruct")
    assert kv_bytes_per_token(m, 8, 1, KVCacheDtype.AUTO) == 40 * 1024
    assert kv_bytes_per_token(m, 16, 1, KVCacheDtype.AUTO) == 40 * 1024  # KV heads replicated
    assert kv_bytes_per_token(m, 1, 1, KVCacheDtype.AUTO) == 320 * 1024


def test_deepseek_v3_mla_kv_is_70272_bytes_at_any_tp() -> None:
    m = model("deepseek-ai/DeepSeek-V3")
    for tp in (1, 8, 16):
        assert kv_bytes_per_token(m, tp, 1, KVCacheDtype.AUTO) == 70272


def test_fp8_kv_halves_bytes_per_token() -> None:
    m = model("Qwen/Qwen3-8B")
    assert kv_bytes_per_token(m, 1, 1, KVCacheDtype.FP8) * 2 == kv_bytes_per_token(m, 1, 1, KVCacheDtype.AUTO)


def test_pipeline_parallel_kv_counts_the_busiest_stage() -> None:
    m = model("meta-llama/Llama-3.1-8B-Instruct")
    assert kv_bytes_per_token(m, 1, 2, KVCacheDtype.AUTO) * 2 == kv_bytes_per_token(m, 1, 1, KVCacheDtype.AUTO)


def test_hybrid_groups_pad_to_equal_sizes() -> None:
    assert stage_layer_split(model("google/gemma-3-27b-it"), 1) == (10, 60)
    assert stage_layer_split(model("google/gemma-2-9b-it"), 1) == (21, 21)
    assert stage_layer_split(model("meta-llama/Llama-3.1-8B-Instruct"), 1) == (32, 0)


def test_sliding_window_layers_stop_growing_past_the_window() -> None:
    m = model("openai/gpt-oss-20b")
    kw = {"max_num_batched_tokens": 2048, "block_size": 16}
    short = kv_bytes_per_request(m, 1, 1, KVCacheDtype.AUTO, max_model_len=4096, **kw)
    long = kv_bytes_per_request(m, 1, 1, KVCacheDtype.AUTO, max_model_len=8192, **kw)
    full_only = dataclasses.replace(m, sliding_window=None, num_sliding_window_layers=0)
    full_long = kv_bytes_per_request(full_only, 1, 1, KVCacheDtype.AUTO, max_model_len=8192, **kw)
    assert long < full_long
    # doubling the length doubles only the full-attention half
    per_layer_block = 2 * 64 * 2 * 8 * 16
    assert long - short == 12 * (8192 - 4096) // 16 * per_layer_block


def test_largest_len_that_fits_is_exact_on_block_boundaries() -> None:
    m = model("meta-llama/Llama-3.1-8B-Instruct")
    per_token = kv_bytes_per_token(m, 1, 1, KVCacheDtype.AUTO)
    kw = {"max_num_batched_tokens": 2048, "block_size": 16, "limit": 131072}
    assert largest_len_that_fits(m, 1, 1, KVCacheDtype.AUTO, available_bytes=per_token * 1000, **kw) == 992
    assert largest_len_that_fits(m, 1, 1, KVCacheDtype.AUTO, available_bytes=per_token * 15, **kw) == 0
    assert largest_len_that_fits(m, 1, 1, KVCacheDtype.AUTO, available_bytes=-5, **kw) == 0
    assert largest_len_that_fits(m, 1, 1, KVCacheDtype.AUTO, available_bytes=1e15, **kw) == 131072
