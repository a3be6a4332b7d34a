"""One concrete vLLM configuration: the knobs the memory model evaluates and the renderer prints."""

from __future__ import annotations

from dataclasses import dataclass

from llm_autopilot.domain.architecture import ModelArchitecture
from llm_autopilot.domain.gpu import GPUSpec
from llm_autopilot.domain.precision import KVCacheDtype, WeightFormat
from llm_autopilot.vllm.versions import VLLMBehaviour


def weights_label(model: ModelArchitecture, fmt: WeightFormat) -> str:
    """"bf16"/"fp16" for unquantized weights (as vLLM serves them), else the format ("fp8", "awq")."""
    if fmt is WeightFormat.NONE:
        return "fp16" if model.torch_dtype == "float16" else "bf16"
    return str(fmt)


@dataclass(frozen=True)
class ServingConfig:
    """What vLLM is started with.

    ``model`` is the checkpoint actually served (a pre-quantized variant when one was chosen).
    ``weight_format`` is how its linear weights sit in GPU memory: the checkpoint's own format, or
    FP8 when vLLM quantizes a bf16 checkpoint on the fly (``online_fp8``).
    """

    model: ModelArchitecture
    gpu: GPUSpec
    vllm: VLLMBehaviour
    tensor_parallel_size: int
    pipeline_parallel_size: int
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    weight_format: WeightFormat = WeightFormat.NONE
    kv_cache_dtype: KVCacheDtype = KVCacheDtype.AUTO
    enforce_eager: bool = False
    block_size: int = 16

    @property
    def num_gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def weights_label(self) -> str:
        return weights_label(self.model, self.weight_format)

    @property
    def online_fp8(self) -> bool:
        """vLLM quantizes an unquantized checkpoint to FP8 while loading it."""
        return self.weight_format is WeightFormat.FP8 and self.model.weight_format is WeightFormat.NONE
