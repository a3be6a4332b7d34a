"""config.json parsing: aliases, family defaults, sliding windows, MoE, MLA, quantization."""

from __future__ import annotations

import pytest

from llm_autopilot.catalog.hf_config import ModelConfigError, parse_hf_config, parse_quantization_config
from llm_autopilot.catalog.models import catalog_models, find_catalog_model
from llm_autopilot.domain.precision import WeightFormat
from tests.conftest import model

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
         "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
         "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 131072,
         "torch_dtype": "bfloat16"}


def test_dense_llama_fields() -> None:
    m = parse_hf_config(LLAMA, "x/llama")
    assert (m.hidden_size, m.num_layers, m.num_kv_heads, m.head_dim) == (4096, 32, 8, 128)
    assert m.moe is None and m.mla is None and m.quantization is None
    assert m.num_sliding_window_layers == 0 and m.sliding_window is None


def test_missing_kv_heads_means_multi_head_attention() -> None:
    cfg = {k: v for k, v in LLAMA.items() if k != "num_key_value_heads"}
    assert parse_hf_config(cfg, "x").num_kv_heads == 32


def test_transformers5_dtype_key_is_read() -> None:
    cfg = {**{k: v for k, v in LLAMA.items() if k != "torch_dtype"}, "dtype": "float16"}
    assert parse_hf_config(cfg, "x").torch_dtype == "float16"


@pytest.mark.parametrize("missing", ["hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size"])
def test_missing_required_field_names_it(missing: str) -> None:
    cfg = {k: v for k, v in LLAMA.items() if k != missing}
    with pytest.raises(ModelConfigError, match=missing):
        parse_hf_config(cfg, "x")


def test_non_positive_field_is_rejected() -> None:
    with pytest.raises(ModelConfigError, match="positive integer"):
        parse_hf_config({**LLAMA, "hidden_size": 0}, "x")


def test_not_an_object_is_rejected() -> None:
    with pytest.raises(ModelConfigError):
        parse_hf_config([1, 2], "x")  # type: ignore[arg-type]


def test_gemma3_text_config_and_family_defaults() -> None:
    m = model("google/gemma-3-27b-it")
    assert m.model_type == "gemma3_text"
    assert m.vocab_size == 262208 and m.max_position_embeddings == 131072  # transformers defaults
    assert m.sliding_window == 1024
    assert (m.num_full_attention_layers, m.num_sliding_window_layers) == (10, 52)  # every 6th layer is global


def test_gemma2_alternates_sliding_layers() -> None:
    m = model("google/gemma-2-9b-it")
    assert m.sliding_window == 4096 and m.num_sliding_window_layers == 21


def test_gpt_oss_layer_types_and_mxfp4_experts() -> None:
    m = model("openai/gpt-oss-20b")
    assert m.sliding_window == 128 and m.num_sliding_window_layers == 12
    assert m.moe is not None and (m.moe.num_experts, m.moe.experts_per_token) == (32, 4)
    assert m.quantization is not None and m.quantization.weight_format is WeightFormat.MXFP4
    assert m.quantization.experts_only


def test_qwen2_sliding_window_disabled_by_use_sliding_window() -> None:
    m = model("Qwen/Qwen2.5-7B-Instruct")
    assert m.sliding_window is None and m.num_sliding_window_layers == 0


def test_mistral_v01_style_window_applies_to_all_layers() -> None:
    cfg = {**LLAMA, "model_type": "mistral", "sliding_window": 4096, "max_position_embeddings": 32768}
    m = parse_hf_config(cfg, "x")
    assert m.num_sliding_window_layers == 32


def test_deepseek_v3_mla_and_moe() -> None:
    m = model("deepseek-ai/DeepSeek-V3")
    assert m.mla is not None and (m.mla.kv_lora_rank, m.mla.qk_rope_head_dim) == (512, 64)
    assert m.moe is not None
    assert (m.moe.num_experts, m.moe.experts_per_token, m.moe.first_dense_layers) == (256, 8, 3)
    assert m.moe.shared_expert_intermediate_size == 2048
    assert m.weight_format is WeightFormat.FP8


def test_mixtral_uses_local_experts_and_intermediate_size() -> None:
    m = model("mistralai/Mixtral-8x7B-v0.1")
    assert m.moe is not None and m.moe.expert_intermediate_size == 14336 and m.moe.num_experts == 8


@pytest.mark.parametrize(("qc", "fmt", "bits", "group"), [
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, WeightFormat.AWQ, 4, 128),
    ({"quant_method": "gptq", "bits": 4, "group_size": 32}, WeightFormat.GPTQ, 4, 32),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128}, WeightFormat.INT8, 8, 128),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, WeightFormat.FP8, 8, 0),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, WeightFormat.FP8, 8, 0),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, WeightFormat.NVFP4, 4, 16),
    ({"quant_method": "compressed-tensors",
      "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int", "group_size": 128}}}},
     WeightFormat.GPTQ, 4, 128),
    ({"quant_method": "compressed-tensors",
      "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}}}, WeightFormat.FP8, 8, 16),
])
def test_quantization_configs(qc: dict[str, object], fmt: WeightFormat, bits: int, group: int) -> None:
    q = parse_quantization_config(qc)
    assert (q.weight_format, q.bits, q.group_size) == (fmt, bits, group)


def test_unsupported_quantization_is_named() -> None:
    with pytest.raises(ModelConfigError, match="bitsandbytes"):
        parse_quantization_config({"quant_method": "bitsandbytes"})


def test_catalog_has_the_required_families() -> None:
    ids = {m.model_id for m in catalog_models()}
    assert len(ids) >= 20
    for needed in ["Qwen/Qwen3-8B", "Qwen/Qwen3-30B-A3B", "meta-llama/Llama-3.1-8B-Instruct",
                   "meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Llama-3.1-405B",
                   "mistralai/Mistral-7B-Instruct-v0.3", "mistralai/Mixtral-8x7B-v0.1", "deepseek-ai/DeepSeek-V3",
                   "deepseek-ai/DeepSeek-R1", "google/gemma-2-9b-it", "google/gemma-3-27b-it",
                   "openai/gpt-oss-20b", "openai/gpt-oss-120b", "microsoft/phi-4"]:
        assert needed in ids


def test_catalog_lookup_is_forgiving_but_unambiguous() -> None:
    assert find_catalog_model("qwen/qwen3-8b") is not None
    assert find_catalog_model("hf://Qwen/Qwen3-8B") is not None
    assert find_catalog_model("Qwen3-8B") is not None
    assert find_catalog_model("no/such-model") is None


def test_catalog_variants_point_at_catalog_checkpoints() -> None:
    for m in catalog_models():
        for fmt, variant_id in m.variants.items():
            variant = find_catalog_model(variant_id)
            assert variant is not None, variant_id
            assert variant.weight_format is fmt
            assert variant.num_layers == m.num_layers
