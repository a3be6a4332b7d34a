"""config.json parsing: aliases, family defaults, sliding windows, MoE, MLA, quantization."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_autopilot.catalog.hf_config import ModelConfigError, parse_hf_config, parse_quantization_config
from llm_autopilot.catalog.models import catalog_models, find_catalog_model
from llm_autopilot.domain.architecture import InvalidArchitecture, structural_problems
from llm_autopilot.domain.precision import WeightFormat
from llm_autopilot.planner.config import ServingConfig
from llm_autopilot.planner.memory import estimate
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION, behaviour_of
from tests.conftest import gpu, model

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
    with pytest.raises(ModelConfigError, match="whole number >= 1"):
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


@pytest.mark.parametrize(("name", "extra", "window", "sliding"), [
    # Phi-3-mini-128k / Phi-3.5-mini: window 262,144 over 131,072 positions; vLLM keeps it on every layer
    ("window longer than the context", {"model_type": "phi3", "sliding_window": 262144}, 262144, 32),
    ("window equal to the context", {"model_type": "phi3", "sliding_window": 131072}, 131072, 32),
    ("window shorter than the context", {"model_type": "phi3", "sliding_window": 2047}, 2047, 32),
    ("no window", {"model_type": "phi3", "sliding_window": None}, None, 0),
    # Gemma 2 without layer_types: transformers slides layers 0, 2, 4, ...: ceil(n/2)
    ("gemma2, odd layer count", {"model_type": "gemma2", "num_hidden_layers": 9, "sliding_window": 256}, 256, 5),
    ("gemma2, even layer count", {"model_type": "gemma2", "num_hidden_layers": 42, "sliding_window": 4096},
     4096, 21),
    ("gemma2, one layer", {"model_type": "gemma2", "num_hidden_layers": 1, "sliding_window": 256}, 256, 1),
    ("gemma2 with layer_types", {"model_type": "gemma2", "num_hidden_layers": 3, "sliding_window": 256,
                                 "layer_types": ["full_attention", "sliding_attention", "full_attention"]}, 256, 1),
], ids=lambda v: v if isinstance(v, str) else "")
def test_sliding_window_layers_as_vllm_builds_them(name: str, extra: dict[str, object], window: int | None,
                                                   sliding: int) -> None:
    m = parse_hf_config({**LLAMA, **extra}, "x")
    assert (m.sliding_window, m.num_sliding_window_layers) == (window, sliding), name


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


def test_zero_kv_heads_is_refused_not_read_as_multi_head_attention() -> None:
    with pytest.raises(ModelConfigError, match="'num_key_value_heads' must be a whole number >= 1, got 0"):
        parse_hf_config({**LLAMA, "num_key_value_heads": 0}, "x")


def test_integral_floats_are_whole_numbers() -> None:
    assert parse_hf_config({**LLAMA, "hidden_size": 4096.0}, "x").hidden_size == 4096


@pytest.mark.parametrize(("override", "message"), [
    ({"hidden_size": 8}, "head_dim must be at least 1, got 0"),  # hidden < heads
    ({"num_key_value_heads": 48}, "num_key_value_heads (48) exceeds num_attention_heads (32)"),
    ({"num_key_value_heads": 3}, "not divisible by num_key_value_heads (3)"),
    ({"torch_dtype": "int4"}, "torch_dtype 'int4' is not a weight dtype"),
    ({"sliding_window": 0}, "'sliding_window' must be a whole number >= 1, got 0"),
    ({"text_config": {"num_attention_heads": True}}, "'num_attention_heads' must be a whole number"),
])
def test_structural_nonsense_is_refused_with_the_rule(override: dict[str, object], message: str) -> None:
    with pytest.raises(ModelConfigError, match=re.escape(message)):
        parse_hf_config({**LLAMA, **override}, "x")


def test_architecture_refuses_nonsense_when_built_directly() -> None:
    llama = parse_hf_config(LLAMA, "x")
    with pytest.raises(InvalidArchitecture, match=re.escape("num_attention_heads (32) is not divisible")):
        dataclasses.replace(llama, num_kv_heads=7)
    moe = model("Qwen/Qwen3-30B-A3B").moe
    assert moe is not None
    with pytest.raises(InvalidArchitecture, match="exceeds the 128 experts"):
        dataclasses.replace(llama, moe=dataclasses.replace(moe, experts_per_token=129))


# Values a hand-written or corrupted config.json may hold, including the JSON numbers Python reads as inf.
HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.lists(st.integers(0, 8), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(),
                                                                                    max_size=2))
FIELDS = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
          "intermediate_size", "vocab_size", "max_position_embeddings", "torch_dtype", "architectures", "model_type",
          "tie_word_embeddings", "sliding_window", "sliding_window_pattern", "layer_types", "num_experts",
          "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace",
          "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "q_lora_rank", "quantization_config",
          "text_config"]
QUANTIZATION_FIELDS = ["quant_method", "bits", "w_bit", "group_size", "q_group_size", "quant_algo"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.dictionaries(st.sampled_from(FIELDS), HOSTILE, min_size=1, max_size=4),
       quantization=st.dictionaries(st.sampled_from(QUANTIZATION_FIELDS), st.one_of(HOSTILE, st.sampled_from(
           ["awq", "gptq", "fp8", "modelopt", "compressed-tensors"])), max_size=3))
def test_any_config_is_either_refused_with_a_message_or_a_consistent_model(
        changes: dict[str, object], quantization: dict[str, object]) -> None:
    config: dict[str, object] = {**LLAMA, **changes}
    if quantization:
        config["quantization_config"] = quantization
    try:
        m = parse_hf_config(config, "x")
    except ModelConfigError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert structural_problems(m) == []
    assert m.head_dim >= 1 and m.num_kv_heads >= 1 and m.num_attention_heads % m.num_kv_heads == 0
    result = estimate(ServingConfig(model=m, gpu=gpu("nvidia-h100-80gb"), vllm=behaviour_of(DEFAULT_VLLM_VERSION),
                                    tensor_parallel_size=1, pipeline_parallel_size=1, gpu_memory_utilization=0.9,
                                    max_model_len=min(m.max_position_embeddings, 8192), max_num_seqs=256,
                                    max_num_batched_tokens=2048))
    assert not result.fits or result.kv_cache_tokens >= 1


def test_a_huge_size_is_refused_not_overflowed() -> None:
    """A config.json with hidden_size 9.48e153 (hypothesis found it) overflowed the planner's float arithmetic."""
    with pytest.raises(ModelConfigError, match="'hidden_size' must be a whole number >= 1, at most 2\\^40"):
        parse_hf_config({**LLAMA, "hidden_size": 9.480751908109177e+153}, "x")
