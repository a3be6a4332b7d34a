"""``spec.vllm.dtype`` (vLLM's ``--dtype``) and INT8 W8A8 checkpoints (compressed-tensors): what the planner sizes,
what it renders and what it refuses. The figures vLLM printed for both are replayed in tests/unit/test_golden.py
(llm-d-planner's vLLM 0.19.0 runs)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import llm_autopilot.catalog
from llm_autopilot.api.convert import targets as targets_from_spec
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.catalog.hf_config import parse_hf_config, parse_quantization_config, planner_view
from llm_autopilot.controller.admission import review
from llm_autopilot.domain.precision import GIB, KVCacheDtype, WeightFormat, weight_bytes_per_parameter
from llm_autopilot.planner.config import ServingConfig
from llm_autopilot.planner.memory import estimate
from llm_autopilot.planner.plan import Infeasible, Plan, PlanRequest, Targets
from llm_autopilot.planner.search import plan
from llm_autopilot.planner.weights import weight_bytes_per_gpu
from llm_autopilot.render.vllm_args import render_vllm_args
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION, VLLMBehaviour, behaviour_of, serving_dtype
from tests.conftest import gpu, model
from tests.unit.test_memory import config as memory_config

CONFIGS = Path(llm_autopilot.catalog.__file__).parent / "models"
#: RedHatAI's W8A8 checkpoints (llm-compressor): int8 weights per output channel, dynamic per-token int8
#: activations, the LM head left out
W8A8 = {"quant_method": "compressed-tensors", "format": "int-quantized", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"],
                                      "weights": {"num_bits": 8, "type": "int", "strategy": "channel",
                                                  "symmetric": True, "dynamic": False, "group_size": None},
                                      "input_activations": {"num_bits": 8, "type": "int", "strategy": "token",
                                                            "dynamic": True}}}}


def llama_w8a8() -> Any:
    return dataclasses.replace(model("meta-llama/Llama-3.1-8B-Instruct"), quantization=parse_quantization_config(W8A8),
                               checkpoint_bytes=None)


def config(vllm: VLLMBehaviour, **changes: object) -> ServingConfig:
    """test_memory's Llama-3.1-8B on an H100, with llm-d-planner's 8,192 batched tokens."""
    return memory_config(vllm, **{"max_num_batched_tokens": 8192, **changes})


# --- INT8 W8A8 checkpoints -------------------------------------------------------------------------------------------

def test_a_w8a8_checkpoint_config_is_int8_per_output_channel() -> None:
    q = parse_quantization_config(W8A8)
    assert (q.method, q.weight_format, q.bits, q.group_size) == ("compressed-tensors", WeightFormat.INT8, 8, -1)


def test_a_w8a8_config_json_keeps_its_quantization_through_the_planners_view() -> None:
    """The config a pod's inspection carries back (planner_view) plans the same INT8 checkpoint."""
    config = {**json.loads((CONFIGS / "meta-llama--Llama-3.1-8B-Instruct.json").read_text()),
              "quantization_config": W8A8}
    whole, view = parse_hf_config(config, "x"), parse_hf_config(planner_view(config), "x")
    assert whole.weight_format is WeightFormat.INT8 and view.quantization == whole.quantization


@pytest.mark.parametrize(("group_size", "per_parameter"), [
    (-1, 1 + 4 / 4096),  # W8A8: one float32 scale per output channel (CompressedTensorsW8A8Int8)
    (128, 1 + 3 / 128),  # GPTQ 8-bit: an fp16 scale and an 8-bit zero point per group
])
def test_int8_bytes_per_parameter_count_its_scales(group_size: int, per_parameter: float) -> None:
    assert weight_bytes_per_parameter(WeightFormat.INT8, bits=8, group_size=group_size) == pytest.approx(per_parameter)


def test_int8_weights_are_8_bit_even_when_no_bits_are_given() -> None:
    """A variant planned without its config (no bits known) is still 8-bit: the 4-bit default is for AWQ/GPTQ."""
    assert weight_bytes_per_parameter(WeightFormat.INT8) == pytest.approx(1 + 3 / 128)


def test_w8a8_weights_keep_the_lm_head_and_embeddings_in_the_model_dtype() -> None:
    m = llama_w8a8()
    vocab_matrices = 2 * 128256 * 4096  # untied embedding and LM head, in bfloat16
    weights = weight_bytes_per_gpu(m, WeightFormat.INT8, 1)
    assert weights == pytest.approx(8.46 * GIB, abs=0.01 * GIB)  # vLLM 0.19.0 printed 8.49 GiB (tests/golden.py)
    assert weights > vocab_matrices * 2  # the vocabulary matrices alone, 1.96 GiB, are in there at 2 bytes


# --- the dtype override: named cases ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class DtypeCase:
    changes: dict[str, object]
    #: the dtype vLLM runs in
    serving: str
    #: the problem the memory model names (None: it plans)
    refused: str | None = None


LLAMA, GEMMA2 = model("meta-llama/Llama-3.1-8B-Instruct"), model("google/gemma-2-9b-it")
DEEPSEEK = model("deepseek-ai/DeepSeek-V3")

DTYPE_CASES = {
    "auto follows the checkpoint": DtypeCase({}, "bfloat16"),
    "float32 is taken as given": DtypeCase({"dtype": "float32"}, "float32"),
    "float (vLLM's other spelling) is float32": DtypeCase({"dtype": "float"}, "float32"),
    "half is float16": DtypeCase({"dtype": "half"}, "float16"),
    "float16 on a bfloat16 checkpoint is a cast vLLM allows": DtypeCase({"dtype": "float16"}, "float16"),
    "float16 for Gemma 2: vLLM refuses it": DtypeCase({"dtype": "float16", "model": GEMMA2}, "float16",
                                                      "vLLM refuses --dtype float16 for gemma2"),
    "bfloat16 on a T4: vLLM refuses it": DtypeCase({"dtype": "bfloat16", "gpu": gpu("nvidia-t4")}, "bfloat16",
                                                   "bfloat16 needs compute capability 8.0"),
    "float32 for an MLA model: no attention backend": DtypeCase(
        {"dtype": "float32", "model": DEEPSEEK, "tensor_parallel_size": 8}, "float32",
        "no float32 attention backend for MLA"),
    "float32 with fp8 weights: not planned": DtypeCase(
        {"dtype": "float32", "weight_format": WeightFormat.FP8}, "float32",
        "--dtype float32 is planned for unquantized weights only, not fp8"),
    "auto on a T4 for Gemma 2 is float32, refused as before": DtypeCase(
        {"model": GEMMA2, "gpu": gpu("nvidia-t4"), "tensor_parallel_size": 8}, "float32", "float32 on T4"),
    "float32 asked for Gemma 2 on a T4 is planned at 4 bytes": DtypeCase(
        {"model": GEMMA2, "gpu": gpu("nvidia-t4"), "tensor_parallel_size": 8, "max_model_len": 1024,
         "dtype": "float32"}, "float32"),
}


@pytest.mark.parametrize("case", DTYPE_CASES.values(), ids=DTYPE_CASES.keys())
def test_the_dtype_vllm_runs_in_and_what_it_refuses(vllm033: VLLMBehaviour, case: DtypeCase) -> None:
    c = config(vllm033, **case.changes)
    e = estimate(c)
    assert c.serving_dtype == case.serving
    if case.refused is None:
        assert e.fits, e.problems
    else:
        assert not e.fits and any(case.refused in p for p in e.problems), e.problems


def test_a_float32_checkpoint_is_served_in_the_gpus_16_bit_dtype_under_auto() -> None:
    """vLLM's _resolve_auto_dtype: "Downcast for float32 models" to the platform's preferred dtype."""
    assert serving_dtype("float32", "llama", gpu("nvidia-h100-80gb")) == "bfloat16"
    assert serving_dtype("float32", "llama", gpu("nvidia-t4")) == "float16"
    assert serving_dtype("float32", "gemma2", gpu("nvidia-t4")) == "float32"


def test_float32_doubles_the_weights_the_forward_peak_and_the_kv_bytes(vllm033: VLLMBehaviour) -> None:
    bf16, fp32 = estimate(config(vllm033)), estimate(config(vllm033, dtype="float32"))
    assert fp32.weights_bytes == pytest.approx(2 * bf16.weights_bytes)
    assert fp32.kv_bytes_per_token == 2 * bf16.kv_bytes_per_token
    assert fp32.activation_peak_bytes == pytest.approx(2 * bf16.activation_peak_bytes)  # forward-bound at 8192
    fp8_kv = estimate(config(vllm033, dtype="float32", kv_cache_dtype=KVCacheDtype.FP8))
    assert fp8_kv.kv_bytes_per_token == bf16.kv_bytes_per_token // 2  # an fp8 cache is one byte whatever the dtype


# --- planned, rendered, refused ------------------------------------------------------------------------------------

def _request(targets: Targets, m: Any = LLAMA, gpu_name: str = "nvidia-h100-80gb") -> PlanRequest:
    return PlanRequest(model=m, gpu=gpu(gpu_name), vllm=behaviour_of(DEFAULT_VLLM_VERSION), targets=targets)


def test_a_float32_plan_says_why_and_renders_the_flag() -> None:
    result = plan(_request(Targets(max_model_len=8192, dtype="float32")))
    assert isinstance(result, Plan), result
    assert result.config.weights_label == "fp32"
    assert any(r.field == "dtype" and r.value == "float32" for r in result.reasons), result.reasons
    args = render_vllm_args(result)
    assert args[args.index("--dtype") + 1] == "float32"


def test_auto_renders_no_dtype_flag() -> None:
    result = plan(_request(Targets(max_model_len=8192)))
    assert isinstance(result, Plan) and "--dtype" not in render_vllm_args(result)


def test_a_w8a8_checkpoint_is_planned_as_published() -> None:
    result = plan(_request(Targets(max_model_len=8192), m=llama_w8a8(), gpu_name="nvidia-l4"))
    assert isinstance(result, Plan), result
    assert result.config.weight_format is WeightFormat.INT8 and not result.config.online_fp8
    assert "--quantization" not in render_vllm_args(result)  # vLLM reads compressed-tensors from the config


@pytest.mark.parametrize(("targets", "m", "gpu_name", "message"), [
    (Targets(dtype="float16"), GEMMA2, "nvidia-h100-80gb",
     "dtype float16 for google/gemma-2-9b-it: vLLM refuses --dtype float16 for gemma2 (numerical instability); "
     "use bfloat16 or float32"),
    (Targets(dtype="bfloat16"), LLAMA, "nvidia-t4",
     "dtype bfloat16 for meta-llama/Llama-3.1-8B-Instruct: vLLM refuses --dtype bfloat16 on T4: bfloat16 needs "
     "compute capability 8.0 or newer; use float16"),
    (Targets(dtype="float32"), None, "nvidia-h100-80gb",
     "dtype float32 is planned for unquantized weights only, and meta-llama/Llama-3.1-8B-Instruct is served as "
     "int8; use dtype auto, or serve an unquantized checkpoint"),
])
def test_a_dtype_vllm_or_the_planner_refuses_is_named(targets: Targets, m: Any, gpu_name: str, message: str) -> None:
    result = plan(_request(targets, m=m or llama_w8a8(), gpu_name=gpu_name))
    assert isinstance(result, Infeasible) and result.message == message, result


# --- the spec and the webhook ----------------------------------------------------------------------------------------

GEMMA_ON_L4 = {"model": {"name": "google/gemma-2-9b-it"}, "gpu": {"product": "nvidia-l4"},
               "serving": {"maxModelLen": 4096}}


def test_spec_vllm_dtype_reaches_the_planner() -> None:
    spec = LLMDeploymentSpec.model_validate({**GEMMA_ON_L4, "vllm": {"dtype": "float32"}})
    assert targets_from_spec(spec).dtype == "float32"
    assert targets_from_spec(LLMDeploymentSpec.model_validate(GEMMA_ON_L4)).dtype == "auto"


@pytest.mark.parametrize(("vllm", "allowed", "message"), [
    ({"dtype": "float16"}, False,
     "dtype float16 for google/gemma-2-9b-it: vLLM refuses --dtype float16 for gemma2 (numerical instability); "
     "use bfloat16 or float32"),
    ({"dtype": "fp8"}, False, "spec.vllm.dtype"),
    ({"extraArgs": ["--dtype=float32"]}, False, "set spec.vllm.dtype instead"),
    ({"dtype": "bfloat16"}, True, ""),
])
def test_the_webhook_refuses_a_dtype_with_the_reason(vllm: dict[str, object], allowed: bool, message: str) -> None:
    verdict = review({**GEMMA_ON_L4, "vllm": vllm}, str(DEFAULT_VLLM_VERSION), name="x")  # the catalog's L4s
    assert verdict.allowed is allowed, verdict
    assert message in (verdict.message or ""), verdict
