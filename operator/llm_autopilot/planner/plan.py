"""What the planner is asked, and what it answers."""

from __future__ import annotations

from dataclasses import dataclass, field

from llm_autopilot.domain.architecture import ModelArchitecture
from llm_autopilot.domain.gpu import GPUSpec
from llm_autopilot.domain.precision import KVCacheDtype, WeightFormat
from llm_autopilot.planner.calibration import KVCalibration
from llm_autopilot.planner.config import ServingConfig
from llm_autopilot.planner.lora import LoRASettings
from llm_autopilot.planner.memory import MemoryEstimate
from llm_autopilot.vllm.versions import VLLMBehaviour

#: Context lengths the planner never goes below unless told to (or the model is shorter).
DEFAULT_MIN_MAX_MODEL_LEN = 8192
#: The planner leaves this share of the estimated KV cache unused, for the estimate's own error...
KV_HEADROOM = 0.05
#: ...and at least this share of the whole memory budget.
BUDGET_HEADROOM = 0.02
#: GPUs one node holds when the nodes are not known (an 8-GPU server: HGX/DGX, the largest common size).
DEFAULT_GPUS_PER_NODE = 8


@dataclass(frozen=True)
class Targets:
    """What the user asks for. ``None`` means "not said": the planner picks and says why."""

    max_model_len: int | None = None
    min_max_model_len: int | None = None
    concurrency: int | None = None
    allowed_weight_formats: tuple[WeightFormat, ...] = (WeightFormat.NONE,)
    allowed_kv_cache_dtypes: tuple[KVCacheDtype, ...] = (KVCacheDtype.AUTO,)
    max_gpus: int = 8
    #: at least this many GPUs (remediation asks for more GPUs this way)
    min_gpus: int = 1
    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enforce_eager: bool = False
    #: the largest batch captured in a CUDA graph (None: vLLM's default; remediation lowers it before eager mode)
    max_cudagraph_capture_size: int | None = None
    #: GPUs one node gives one pod: tensor parallelism stays within it, pipeline stages span nodes
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    #: nodes of the pool one replica may span (None: as many as maxGPUs allows)
    max_nodes: int | None = None
    #: ``maxModelLen: auto``: the longest length that fits, within the minimum and the model's maximum
    max_model_len_auto: bool = False
    #: the last resort: offload weights to host memory (``--cpu-offload-gb``), which is slow
    allow_cpu_offload: bool = False
    #: ``spec.lora``: the adapter slots to reserve (``--enable-lora``); ``lora_min_slots`` is the number of pinned
    #: adapters, below which a suggestion never lowers ``max_loras``
    lora: LoRASettings | None = None
    lora_min_slots: int = 0
    #: ``--dtype`` (``spec.vllm.dtype``): "auto" lets vLLM pick from the checkpoint and the GPU
    dtype: str = "auto"


@dataclass(frozen=True)
class PlanRequest:
    model: ModelArchitecture
    gpu: GPUSpec
    vllm: VLLMBehaviour
    targets: Targets = field(default_factory=Targets)
    #: architectures of pre-quantized variants, when known (else derived from the base model)
    variant_models: dict[WeightFormat, ModelArchitecture] = field(default_factory=dict)
    #: for this GPU, vLLM version and family, from earlier deployments (planner/calibration.py); None: none
    kv_calibration: KVCalibration | None = None


@dataclass(frozen=True)
class Reason:
    """One decision and why, e.g. ``Reason("tensorParallelSize", "2", "1 x L4 leaves no KV cache")``."""

    field: str
    value: str
    why: str

    def __str__(self) -> str:
        return f"{self.field}={self.value}: {self.why}"


@dataclass(frozen=True)
class Plan:
    config: ServingConfig
    estimate: MemoryEstimate
    served_model_id: str
    reasons: tuple[Reason, ...]
    warnings: tuple[str, ...] = ()

    @property
    def feasible(self) -> bool:
        return True

    @property
    def summary(self) -> str:
        c = self.config
        nodes = f" ({c.nodes} nodes)" if c.nodes > 1 else ""
        return f"{c.num_gpus} x {c.gpu.display_name}{nodes}"


@dataclass(frozen=True)
class Infeasible:
    """Nothing fits the constraints; ``message`` names the smallest change that would."""

    message: str
    suggestions: tuple[str, ...] = ()
    closest: MemoryEstimate | None = None

    @property
    def feasible(self) -> bool:
        return False


PlanResult = Plan | Infeasible
