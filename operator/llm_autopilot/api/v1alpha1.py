"""LLMDeployment v1alpha1: what platform teams write (spec) and what the operator reports (status).

Every field has a description: the CRD generated from these models carries them, so
``kubectl explain llmd.spec`` documents the API. Defaults live here, not in the CRD, so the API
server never writes them into stored objects and GitOps tools see no drift.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

QuantizationName = Literal["none", "fp8", "awq", "gptq"]
KVCacheDtypeName = Literal["auto", "fp8"]


class APIModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields are mistakes."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


# --- spec -----------------------------------------------------------------------------------------


class SecretKeyRef(APIModel):
    name: str = Field(min_length=1, description="Name of a Secret in the LLMDeployment's namespace.")
    key: str = Field("token", min_length=1, description="Key in the Secret. Defaults to `token`.")


class ArchitectureOverride(APIModel):
    """Fields of the model's config.json, for models whose config cannot be fetched or is wrong."""

    hidden_size: int | None = Field(None, ge=1, description="config.json `hidden_size`.")
    num_hidden_layers: int | None = Field(None, ge=1, description="config.json `num_hidden_layers`.")
    num_attention_heads: int | None = Field(None, ge=1, description="config.json `num_attention_heads`.")
    num_key_value_heads: int | None = Field(None, ge=1, description="config.json `num_key_value_heads` (GQA).")
    head_dim: int | None = Field(None, ge=1, description="config.json `head_dim`; defaults to hidden/heads.")
    intermediate_size: int | None = Field(None, ge=1, description="config.json `intermediate_size`.")
    vocab_size: int | None = Field(None, ge=1, description="config.json `vocab_size`.")
    max_position_embeddings: int | None = Field(None, ge=1, description="The model's maximum context length.")
    torch_dtype: Literal["bfloat16", "float16", "float32"] | None = Field(None, description="Weight dtype.")
    tie_word_embeddings: bool | None = Field(None, description="Whether the LM head shares the embedding.")
    sliding_window: int | None = Field(None, ge=1, description="Window of the sliding-window attention layers.")
    num_experts: int | None = Field(None, ge=1, description="Routed experts of each MoE layer.")
    num_experts_per_tok: int | None = Field(None, ge=1, description="Experts each token is routed to.")
    moe_intermediate_size: int | None = Field(None, ge=1, description="Intermediate size of one expert.")
    kv_lora_rank: int | None = Field(None, ge=1, description="MLA latent size (DeepSeek `kv_lora_rank`).")
    qk_rope_head_dim: int | None = Field(None, ge=1, description="MLA rotary head size.")
    qk_nope_head_dim: int | None = Field(None, ge=1, description="MLA non-rotary head size.")
    v_head_dim: int | None = Field(None, ge=1, description="MLA value head size.")
    weight_bytes: int | None = Field(None, ge=1, description="Checkpoint size in bytes (safetensors total_size).")

    def as_hf_config(self) -> dict[str, Any]:
        """The override as config.json fields (snake_case, as Hugging Face spells them)."""
        return {k: v for k, v in self.model_dump(by_alias=False).items() if v is not None and k != "weight_bytes"}


class QuantizedVariants(APIModel):
    fp8: str | None = Field(None, description="Hub id of an FP8 checkpoint of the same model.")
    awq: str | None = Field(None, description="Hub id of an AWQ (4-bit) checkpoint of the same model.")
    gptq: str | None = Field(None, description="Hub id of a GPTQ (4-bit) checkpoint of the same model.")


class ModelSource(APIModel):
    name: str = Field(
        min_length=1,
        pattern=r"^(hf://)?[A-Za-z0-9][\w.\-]*/[\w.\-]+$",
        description="Hugging Face Hub id (`org/name`) or `hf://org/name` of the model to serve.",
    )
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit). Defaults to `main`.")
    served_model_name: str | None = Field(
        None, description="Name clients use in API requests. Defaults to `name`, even when a variant is served."
    )
    architecture: ArchitectureOverride | None = Field(
        None, description="Override or supply config.json fields; required when the config cannot be fetched."
    )
    variants: QuantizedVariants | None = Field(
        None, description="Pre-quantized checkpoints of the same model the planner may serve instead."
    )
    hub_token_secret_ref: SecretKeyRef | None = Field(
        None, description="Secret holding a Hugging Face token, for gated or private models."
    )


class Toleration(APIModel):
    key: str | None = Field(None, description="Taint key the toleration applies to.")
    operator: Literal["Exists", "Equal"] | None = Field(None, description="`Exists` or `Equal` (default).")
    value: str | None = Field(None, description="Taint value to match with `Equal`.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; empty matches all."
    )
    toleration_seconds: int | None = Field(None, description="How long a NoExecute taint is tolerated.")


class GPUSelector(APIModel):
    product: str | None = Field(
        None,
        description="GPU from the catalog (e.g. `nvidia-h100-80gb`, `nvidia-l4`) or a GPU Feature Discovery "
        "`nvidia.com/gpu.product` value. Omit to use what the cluster's GPU nodes report.",
    )
    memory_gib: float | None = Field(
        None, alias="memoryGiB", gt=0, le=1024,
        description="Total memory of one GPU in GiB, for GPUs not in the catalog.",
    )
    compute_capability: str | None = Field(
        None, pattern=r"^\d+\.\d+$", description="CUDA compute capability (e.g. `8.9`), with memoryGiB."
    )
    max_gpus: int = Field(8, alias="maxGPUs", ge=1, le=64, description="Most GPUs one replica may use. Default 8.")
    node_selector: dict[str, str] | None = Field(None, description="Extra node labels the pods must match.")
    tolerations: list[Toleration] | None = Field(None, description="Tolerations added to the vLLM pods.")

    @model_validator(mode="after")
    def _capability_needs_memory(self) -> GPUSelector:
        if self.compute_capability and self.memory_gib is None:
            raise ValueError("gpu.computeCapability is only used with gpu.memoryGiB")
        return self


class ServingTargets(APIModel):
    max_model_len: int | None = Field(
        None, ge=1, description="Desired context length. Defaults to the model's maximum."
    )
    min_max_model_len: int | None = Field(
        None, ge=1,
        description="Shortest acceptable context length. Defaults to maxModelLen when that is set, "
        "else to the smaller of 8192 and the model's maximum.",
    )
    expected_concurrency: int | None = Field(
        None, ge=1, description="Concurrent sequences of maxModelLen tokens the KV cache should hold."
    )
    allowed_quantizations: list[QuantizationName] = Field(
        default_factory=lambda: list[QuantizationName](["none"]),
        description="Weight formats the planner may use, best quality first: none (as published), fp8, "
        "awq, gptq. awq/gptq need a variant; fp8 uses a variant or quantizes on the fly. Default [none].",
    )
    allowed_kv_cache_dtypes: list[KVCacheDtypeName] = Field(
        default_factory=lambda: list[KVCacheDtypeName](["auto"]), alias="allowedKVCacheDtypes",
        description="KV-cache dtypes the planner may use: auto (model dtype), fp8. Default [auto].",
    )

    @model_validator(mode="after")
    def _lengths_ordered(self) -> ServingTargets:
        if self.min_max_model_len and self.max_model_len and self.min_max_model_len > self.max_model_len:
            raise ValueError(f"serving.minMaxModelLen ({self.min_max_model_len}) is larger than "
                             f"serving.maxModelLen ({self.max_model_len})")
        return self


class EnvVar(APIModel):
    name: str = Field(min_length=1, description="Environment variable name.")
    value: str | None = Field(None, description="Literal value.")
    value_from: dict[str, Any] | None = Field(
        None, description="Kubernetes EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef...)."
    )


class VLLMSettings(APIModel):
    image: str | None = Field(None, description="vLLM container image. Defaults to the operator's default.")
    version: str | None = Field(
        None, pattern=r"^v?\d+\.\d+(\.\d+)?$",
        description="vLLM version in the image (decides defaults and accepted flags). Defaults to the "
        "operator's default.",
    )
    extra_args: list[str] = Field(
        default_factory=list, description="Extra `vllm serve` arguments, appended after the planned ones."
    )
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment variables for vLLM.")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="Pin vLLM's gpu_memory_utilization instead of the version default."
    )
    enforce_eager: bool = Field(False, description="Disable CUDA graphs (less memory, slower decoding).")
    max_num_seqs: int | None = Field(None, ge=1, description="Pin vLLM's max_num_seqs.")
    max_num_batched_tokens: int | None = Field(None, ge=1, description="Pin vLLM's max_num_batched_tokens.")


class ContainerResources(APIModel):
    requests: dict[str, int | str] | None = Field(
        None, description="CPU/memory requests of the vLLM container (GPUs are set from the plan)."
    )
    limits: dict[str, int | str] | None = Field(
        None, description="CPU/memory limits of the vLLM container (GPUs are set from the plan)."
    )


class RemediationFloors(APIModel):
    min_max_model_len: int | None = Field(
        None, ge=1, description="Never lower maxModelLen below this. Defaults to serving.minMaxModelLen."
    )
    min_gpu_memory_utilization: float = Field(
        0.7, gt=0, le=1, description="Never lower gpu_memory_utilization below this. Default 0.7."
    )
    min_max_num_seqs: int = Field(8, ge=1, description="Never lower max_num_seqs below this. Default 8.")
    min_max_num_batched_tokens: int = Field(
        512, ge=1, description="Never lower max_num_batched_tokens below this. Default 512."
    )


class RemediationPolicy(APIModel):
    enabled: bool = Field(True, description="Roll to safer settings on OOM or KV saturation. false = report only.")
    cooldown_seconds: int = Field(600, ge=0, description="Minimum time between two steps. Default 600.")
    max_steps: int = Field(5, ge=0, le=20, description="Steps before giving up (Degraded). Default 5.")
    stable_window_seconds: int = Field(
        3600, ge=60, description="Calm time after which one step is relaxed. Default 3600."
    )
    kv_saturation_threshold: float = Field(
        0.95, gt=0, le=1, description="kv_cache_usage_perc counted as saturated. Default 0.95."
    )
    kv_saturation_window_seconds: int = Field(
        300, ge=30, alias="kvSaturationWindowSeconds",
        description="How long KV usage must stay at the threshold, with preemptions or a growing queue. Default 300.",
    )
    max_replicas: int | None = Field(None, ge=1, description="Most replicas remediation may scale to.")
    floors: RemediationFloors = Field(
        default_factory=RemediationFloors, description="Lower bounds remediation never crosses."
    )


class LLMDeploymentSpec(APIModel):
    model: ModelSource = Field(description="The model to serve.")
    gpu: GPUSelector = Field(default_factory=GPUSelector, description="GPUs the deployment may use.")
    serving: ServingTargets = Field(default_factory=ServingTargets, description="Context, concurrency, quality.")
    vllm: VLLMSettings = Field(default_factory=VLLMSettings, description="vLLM image, version and overrides.")
    replicas: int = Field(1, ge=0, le=1000, description="vLLM replicas. Default 1.")
    resources: ContainerResources | None = Field(None, description="CPU/memory of the vLLM container.")
    remediation: RemediationPolicy = Field(
        default_factory=RemediationPolicy, description="How the operator reacts to OOM and KV saturation."
    )

    @model_validator(mode="after")
    def _floors_within_targets(self) -> LLMDeploymentSpec:
        floor = self.remediation.floors.min_max_model_len
        if floor and self.serving.max_model_len and floor > self.serving.max_model_len:
            raise ValueError(f"remediation.floors.minMaxModelLen ({floor}) is larger than "
                             f"serving.maxModelLen ({self.serving.max_model_len})")
        return self


# --- status ---------------------------------------------------------------------------------------


class MemoryBreakdown(APIModel):
    gpu_total_gib: float = Field(alias="gpuTotalGiB", description="Total memory of one GPU (GiB).")
    budget_gib: float = Field(alias="budgetGiB", description="gpu_memory_utilization x total (GiB).")
    weights_gib: float = Field(alias="weightsGiB", description="Weights on the busiest GPU (GiB).")
    activation_peak_gib: float = Field(alias="activationPeakGiB", description="Profile-run activation peak (GiB).")
    non_torch_gib: float = Field(alias="nonTorchGiB", description="CUDA context, NCCL buffers (GiB).")
    cuda_graph_gib: float = Field(alias="cudaGraphGiB", description="CUDA graph memory (GiB).")
    kv_cache_gib: float = Field(alias="kvCacheGiB", description="Left for the KV cache (GiB).")
    kv_bytes_per_token: int = Field(description="KV-cache bytes per token on one GPU.")
    kv_cache_tokens: int = Field(description="Tokens the KV cache holds.")
    max_concurrency: float = Field(description="Requests of maxModelLen tokens served at once.")
    max_model_len_capacity: int = Field(description="Largest maxModelLen that fits.")


class PlanStatus(APIModel):
    summary: str = Field(description="GPUs per replica, e.g. `2 x H100-80GB`.")
    served_model: str = Field(description="Checkpoint vLLM loads (a variant when quantized).")
    gpu_product: str = Field(description="Catalog name of the GPU planned for.")
    gpus: int = Field(description="GPUs per replica.")
    tensor_parallel_size: int = Field(description="vLLM --tensor-parallel-size.")
    pipeline_parallel_size: int = Field(description="vLLM --pipeline-parallel-size.")
    quantization: str = Field(description="Weight format: bf16, fp8, awq, gptq, mxfp4...")
    kv_cache_dtype: str = Field(description="vLLM --kv-cache-dtype.")
    max_model_len: int = Field(description="vLLM --max-model-len.")
    max_num_seqs: int = Field(description="vLLM --max-num-seqs.")
    max_num_batched_tokens: int = Field(description="vLLM --max-num-batched-tokens.")
    gpu_memory_utilization: float = Field(description="vLLM --gpu-memory-utilization.")
    enforce_eager: bool = Field(description="vLLM --enforce-eager.")
    vllm_version: str = Field(description="vLLM version planned for.")
    memory: MemoryBreakdown = Field(description="Per-GPU memory breakdown for the busiest GPU.")
    reasons: list[str] = Field(default_factory=list, description="One line per decision.")
    warnings: list[str] = Field(default_factory=list, description="What the plan could not satisfy.")
    args: list[str] = Field(default_factory=list, description="The `vllm serve` arguments.")


class Condition(APIModel):
    type: str = Field(description="Planned, Ready, Degraded, MetricsAvailable...")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason.")
    message: str = Field("", description="Human-readable explanation.")
    last_transition_time: str | None = Field(None, description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(None, description="Spec generation the condition is about.")


class StatusModel(APIModel):
    """Status parts the remediation state is made of: immutable once parsed (changes return a new value)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class RemediationEvent(StatusModel):
    time: AwareDatetime = Field(description="When the step was taken (RFC 3339).")
    rung: int = Field(ge=0, le=20, description="Rung after the step.")
    signal: str = Field(description="What was observed (OOMKilled, KVCapacity, CudaOOM, KVSaturation...).")
    action: str = Field(description="What changed.")
    message: str = Field("", description="Why, in one line.")
    evidence: dict[str, str] = Field(default_factory=dict, description="Query, value, pod, time, source...")


class RemediationOverrides(StatusModel):
    """Settings remediation imposes on top of the spec and the planner."""

    max_model_len: int | None = Field(None, ge=1, description="Cap on max_model_len.")
    max_num_batched_tokens: int | None = Field(None, ge=1, description="Pinned max_num_batched_tokens.")
    max_num_seqs: int | None = Field(None, ge=1, description="Pinned max_num_seqs.")
    enforce_eager: bool | None = Field(None, description="CUDA graphs off.")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="Pinned gpu_memory_utilization.")
    fp8_kv_cache: bool | None = Field(None, alias="fp8KVCache", description="KV cache forced to fp8.")
    min_gpus: int | None = Field(None, alias="minGPUs", ge=1, le=64,
                                 description="At least this many GPUs per replica.")
    replicas: int | None = Field(None, ge=1, le=1000, description="Replicas instead of spec.replicas.")
    memory_limit_gib: float | None = Field(None, alias="memoryLimitGiB", gt=0,
                                           description="Container memory limit (GiB).")


class RemediationStatus(StatusModel):
    rung: int = Field(0, ge=0, le=20, description="Current step on the safety ladder (0 = as planned).")
    last_step_time: AwareDatetime | None = Field(None, description="When the last step was taken (RFC 3339).")
    last_signal_time: AwareDatetime | None = Field(
        None, description="When a failure signal was last seen (RFC 3339).")
    last_relax_time: AwareDatetime | None = Field(None, description="When a step was last relaxed (RFC 3339).")
    relax_backoff: int = Field(1, ge=1, le=16, description="Multiplier on the stable window before the next relax.")
    last_evidence: str | None = Field(None, description="Key of the last acted-on evidence (no double steps).")
    state: str | None = Field(None, description="Idle, Step, Relax, Cooldown, WaitingForRollout, Exhausted...")
    applied: tuple[RemediationOverrides, ...] = Field(
        default=(), max_length=20, description="Overrides per rung (the last is in force)."
    )
    history: tuple[RemediationEvent, ...] = Field(
        default=(), max_length=20, description="The most recent steps, newest last (at most 20)."
    )


class LLMDeploymentStatus(APIModel):
    observed_generation: int | None = Field(None, description="The spec generation last reconciled.")
    plan: PlanStatus | None = Field(None, description="The current plan and its memory breakdown.")
    conditions: list[Condition] = Field(default_factory=list, description="Planned, Ready, Degraded...")
    remediation: RemediationStatus | None = Field(None, description="Remediation rung and history.")


class LLMDeployment(APIModel):
    """A whole object, for validating files (CLI) and admission requests."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    api_version: Literal["llm-autopilot.io/v1alpha1"] = Field("llm-autopilot.io/v1alpha1", description="API version.")
    kind: Literal["LLMDeployment"] = Field("LLMDeployment", description="Kind.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: LLMDeploymentSpec = Field(description="Desired state.")
    status: LLMDeploymentStatus | None = Field(None, description="Observed state.")
