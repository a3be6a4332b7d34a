"""One concrete vLLM configuration: the knobs the memory model evaluates and the renderer prints."""

from __future__ import annotations

from dataclasses import dataclass

from llm_autopilot.domain.architecture import ModelArchitecture
from llm_autopilot.domain.gpu import GPUSpec
from llm_autopilot.domain.precision import KVCacheDtype, WeightFormat
from llm_autopilot.planner.calibration import KVCalibration
from llm_autopilot.planner.lora import LoRASettings
from llm_autopilot.vllm.versions import VLLMBehaviour, serving_dtype

_DTYPE_LABELS = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def weights_label(model: ModelArchitecture, fmt: WeightFormat, gpu: GPUSpec | None = None,
                  dtype: str = "auto") -> str:
    """"bf16"/"fp16"/"fp32" for unquantized weights (as vLLM serves them on ``gpu`` with ``--dtype dtype``, when
    given), else the format ("fp8", "awq")."""
    if fmt is WeightFormat.NONE:
        dtype = (serving_dtype(model.torch_dtype, model.model_type, gpu, dtype) if gpu is not None
                 else model.torch_dtype)
        return _DTYPE_LABELS.get(dtype, "bf16")
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
    #: GiB of weights per GPU kept in host memory (``--cpu-offload-gb``): the planner's last resort
    cpu_offload_gib: float = 0.0
    #: pods (one per node) one replica spans; with more than one, each holds one pipeline stage
    nodes: int = 1
    #: ``--enable-lora``: the adapter slots vLLM reserves (planner/lora.py)
    lora: LoRASettings | None = None
    #: earlier deployments' measured / predicted KV memory, applied capped (planner/calibration.py)
    kv_calibration: KVCalibration | None = None
    #: ``--max-cudagraph-capture-size``: the largest batch captured in a CUDA graph (None: vLLM's default)
    max_cudagraph_capture_size: int | None = None
    #: ``--dtype``: the dtype of activations, unquantized weights and a model-dtype KV cache ("auto": vLLM picks)
    dtype: str = "auto"

    @property
    def num_gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def cuda_graph_capture_size(self) -> int:
        """The largest batch (tokens) vLLM captures a CUDA graph for; 0 in eager mode."""
        if self.enforce_eager:
            return 0
        return self.vllm.max_cuda_graph_capture_size(self.max_num_seqs, self.max_num_batched_tokens,
                                                     self.max_cudagraph_capture_size)

    @property
    def gpus_per_pod(self) -> int:
        return self.num_gpus // self.nodes

    @property
    def weights_label(self) -> str:
        return weights_label(self.model, self.weight_format, self.gpu, self.dtype)

    @property
    def serving_dtype(self) -> str:
        """The dtype vLLM runs the (unquantized) model in on this GPU."""
        return serving_dtype(self.model.torch_dtype, self.model.model_type, self.gpu, self.dtype)

    @property
    def dtype_bytes(self) -> int:
        """Bytes of one element in the serving dtype: activations, unquantized weights, an ``auto`` KV cache."""
        return 4 if self.serving_dtype == "float32" else 2

    @property
    def online_fp8(self) -> bool:
        """vLLM quantizes an unquantized checkpoint to FP8 while loading it."""
        return self.weight_format is WeightFormat.FP8 and self.model.weight_format is WeightFormat.NONE
