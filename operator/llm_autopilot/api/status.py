"""LLMDeployment v1alpha1 status: what the operator reports."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import AwareDatetime, ConfigDict, Field, create_model
from pydantic.alias_generators import to_camel

from llm_autopilot.api.fields import APIModel
from llm_autopilot.domain.knobs import KNOBS, Kind, Knob
from llm_autopilot.domain.precision import GIB
from llm_autopilot.planner.verify import StageResult, Verification


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
    lora_slots_gib: float | None = Field(None, alias="loraSlotsGiB", description="LoRA adapter slots (GiB).")
    lora_profile_gib: float | None = Field(None, alias="loraProfileGiB",
                                           description="LoRA's extra profile-run peak (GiB).")
    max_concurrency: float = Field(description="Requests of maxModelLen tokens served at once.")
    max_model_len_capacity: int = Field(description="Largest maxModelLen that fits.")


class StageMemory(APIModel):
    stage: int = Field(description="Pipeline stage (the pod of that rank in the group).")
    layers: int = Field(description="Decoder layers on this stage.")
    weights_gib: float = Field(alias="weightsGiB", description="Weights on each GPU of this stage (GiB).")
    kv_cache_gib: float = Field(alias="kvCacheGiB", description="Left for the KV cache on each GPU (GiB).")
    kv_cache_tokens: int = Field(description="Tokens that memory holds (vLLM uses the smallest stage's).")


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
    nodes: int = Field(1, description="Nodes (pods) one replica spans; one pipeline stage each.")
    cpu_offload_gib: float = Field(0.0, alias="cpuOffloadGiB", description="vLLM --cpu-offload-gb (slow).")
    host_memory_gib: float = Field(
        0.0, alias="hostMemoryGiB",
        description="Host memory added to each pod's memory request and limit: CPU-offloaded weights, "
        "--kv-offloading-size, multimodal caches (GiB).")
    replicas_that_fit: int | None = Field(
        None, description="Replicas of this plan the matching GPU node pool holds at once.")
    memory: MemoryBreakdown = Field(description="Per-GPU memory breakdown for the busiest GPU.")
    stages: list[StageMemory] = Field(
        default_factory=list, description="Per pipeline stage, when one replica spans nodes.")
    reasons: list[str] = Field(default_factory=list, description="One line per decision.")
    warnings: list[str] = Field(default_factory=list, description="What the plan could not satisfy.")
    args: list[str] = Field(default_factory=list, description="The `vllm serve` arguments.")
    lora_adapters: list[str] = Field(default_factory=list, description="Served LoRA adapter names.")


ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(APIModel):
    type: str = Field(description="Planned, Ready, Degraded, MetricsAvailable...")
    status: ConditionStatus = Field(description="True, False or Unknown.")
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
    # a step's recovery (remediation/recovery.py); absent on a relax and on steps recorded before them
    plan_hash: str | None = Field(None, max_length=64, description="The plan the step rolled to (its pods' "
                                                                    "plan hash); set on steps, not on relaxes.")
    recovered_seconds: float | None = Field(
        None, ge=0, description="Seconds from the step (time) to the first pod of its plan Ready (the pod's Ready "
                                "condition lastTransitionTime); recorded once. Absent: not recovered yet, or "
                                "superseded.")
    served_throughout: bool | None = Field(
        None, description="true: a Ready pod served the model at every look from the step to its recovery (a "
                          "surge); false: the operator saw no Ready pod at some point (set when seen).")
    superseded: bool | None = Field(
        None, description="true: a later step, a relax or a spec change replaced this step's plan before any of "
                          "its pods was Ready; no recovery figure is recorded.")


class RemediationOverridesBase(StatusModel):
    """Settings remediation imposes on top of the spec and the planner."""

    if TYPE_CHECKING:  # the attribution read by name (the fields are _ATTRIBUTION's); knobs: model_dump
        generation: int | None
        attestation: str | None


#: after the knobs: who recorded the step
_ATTRIBUTION: dict[str, Any] = {
    "generation": (int | None, Field(None, ge=0, description="The spec generation the step was taken under.")),
    "attestation": (str | None, Field(
        None, max_length=64, description="The operator's digest of this step (the object's uid, the generation, "
                                         "the overrides and the previous step's digest); a step without a valid "
                                         "one was not recorded by the operator and is dropped, not applied.")),
}
_KNOB_TYPES: dict[Kind, Any] = {Kind.INTEGER: int | None, Kind.NUMBER: float | None, Kind.FLAG: bool | None}


def remediation_overrides_model(knobs: tuple[Knob, ...]) -> type[RemediationOverridesBase]:
    """The status model of an applied step: one field per knob of the table (in its order), then the attribution."""
    fields: dict[str, Any] = {}
    for k in knobs:
        alias = None if to_camel(k.field) == k.alias else k.alias  # else the alias generator's
        fields[k.field] = (_KNOB_TYPES[k.kind], Field(None, alias=alias, ge=k.ge, gt=k.gt, le=k.le,
                                                      description=k.description))
    return create_model("RemediationOverrides", __base__=RemediationOverridesBase,
                        __doc__=RemediationOverridesBase.__doc__, __module__=__name__, **fields, **_ATTRIBUTION)


if TYPE_CHECKING:
    RemediationOverrides = RemediationOverridesBase
else:
    RemediationOverrides = remediation_overrides_model(KNOBS)


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


CacheState = Literal["Pending", "Downloading", "Complete", "Failed"]


class CachedAdapter(APIModel):
    """An s3:// LoRA adapter's download into the model cache (its own Job)."""

    name: str = Field(max_length=128, description="The adapter (spec.lora.adapters[].name).")
    source: str = Field(max_length=1024, description="Its source.")
    folder: str = Field(max_length=256, description="Its folder in the cache PVC.")
    job_name: str = Field(max_length=63, description="The download Job.")
    state: CacheState = Field(description="Where its download is; it is served once Complete.")
    message: str = Field("", max_length=500, description="Why its download failed.")


class CacheStatus(APIModel):
    claim_name: str = Field(description="The cache PVC.")
    folder: str | None = Field(
        None, description="The model's folder in the PVC (vLLM loads /model-cache/<folder>): `model` in the "
        "operator's PVC, `models/<source>-<hash>` in an existingClaim, one per source and revision.")
    state: CacheState = Field(description="Where the download is.")
    bytes: int = Field(0, ge=0, description="Bytes in the cache.")
    total_bytes: int | None = Field(None, ge=0, description="Bytes of the whole checkpoint.")
    percent: float | None = Field(None, ge=0, le=100, description="bytes / totalBytes, in percent.")
    message: str = Field("", description="Why a download failed; once Complete, why a try before the last was retried.")
    adapters: list[CachedAdapter] | None = Field(
        None, max_length=32, description="The s3:// LoRA adapters downloaded into the same PVC.")


class SourceObject(APIModel):
    """One S3 object the operator read, as a HEAD shows it: a new ETag or size means it changed."""

    key: str = Field(description="The object's key.")
    etag: str = Field(description="Its ETag (without quotes).")
    size: int = Field(ge=0, description="Its size in bytes.")


class SourceStatus(APIModel):
    """What the operator read from a pvc:// source (its inspect Job) or an s3:// source (config.json and the
    safetensors index), for the planner: kept until the source, the claim or an object's ETag changes, so the
    files are read once."""

    uri: str = Field(description="The source read (spec.model.source).")
    claim_uid: str | None = Field(None, alias="claimUID", description="The uid of the PersistentVolumeClaim inspected.")
    endpoint: str | None = Field(None, description="The S3 endpoint the objects were read from.")
    objects: list[SourceObject] | None = Field(
        None, description="The S3 objects read, with their ETags: a HEAD of each tells whether they changed.")
    state: Literal["Inspecting", "Inspected", "Failed"] = Field(description="Where the inspection is.")
    job_name: str | None = Field(None, description="The inspect Job.")
    config: dict[str, Any] | None = Field(
        None, description="config.json's fields the planner reads, as read from the source.")
    checkpoint_bytes: int | None = Field(None, ge=0, description="Bytes of the *.safetensors files.")
    weight_files: int | None = Field(None, ge=0, description="Weight files (*.safetensors) on the volume.")
    files: int | None = Field(None, ge=0, description="Files in the model's folder.")
    message: str = Field("", description="Why the inspection failed.")


class LoRASourceStatus(APIModel):
    """What a pvc:// LoRA adapter's inspect Job read on its volume: kept until the source or the claim changes."""

    name: str = Field(max_length=128, description="The adapter (spec.lora.adapters[].name).")
    uri: str = Field(max_length=1024, description="Its source, as read.")
    claim_uid: str = Field(alias="claimUID", max_length=64, description="The uid of the claim inspected.")
    state: Literal["Inspecting", "Inspected", "Failed"] = Field(description="Where the inspection is.")
    job_name: str | None = Field(None, max_length=63, description="The inspect Job.")
    rank: int | None = Field(None, ge=1, description="Its rank (adapter_config.json's r, or the largest of "
                                                      "rank_pattern).")
    base_model: str | None = Field(None, max_length=256, description="adapter_config.json's "
                                                                     "base_model_name_or_path.")
    message: str = Field("", max_length=1000, description="Why the inspection failed.")


class PodVerification(StatusModel):
    """One pod's (a replica's, or a pipeline stage's) KV cache as its vLLM reports it."""

    pod: str = Field(max_length=253, description="The pod.")
    stage: int | None = Field(None, ge=0, le=64, description="Pipeline stage of the pod in a multi-node group.")
    actual_tokens: int | None = Field(None, ge=0, description="KV-cache tokens vLLM reports.")
    actual_blocks: int | None = Field(None, ge=0, description="KV-cache blocks vLLM reports (num_gpu_blocks).")
    error_percent: float = Field(description="(actual - predicted) KV memory in percent of one GPU's memory.")


class StageVerification(StatusModel):
    """One pipeline stage of a group across nodes: its own KV room (the "Available KV cache memory" its pod's log
    prints) against the plan's for that stage."""

    pod: str = Field(max_length=253, description="The pod of that rank.")
    stage: int = Field(ge=0, le=64, description="Pipeline stage (the pod's rank in its group).")
    predicted_kv_gib: float = Field(alias="predictedKVGiB", description="The stage's KV room the plan predicted "
                                                                        "(GiB, per GPU).")
    actual_kv_gib: float | None = Field(None, alias="actualKVGiB", description="The stage's KV room vLLM printed "
                                                                               "(GiB, to 0.01).")
    predicted_blocks: int = Field(ge=0, description="Blocks the stage's predicted room holds.")
    actual_blocks: int | None = Field(None, ge=0, description="Blocks the stage's room holds (its room / its block "
                                                              "bytes); vLLM gives every stage the fewest.")
    error_percent: float | None = Field(None, description="(actual - predicted) room in percent of one GPU's "
                                                          "memory.")
    bounds: bool = Field(False, description="The stage with the fewest blocks: the group's KV cache is its.")
    problem: str = Field("", max_length=300, description="Why the stage's room could not be read.")


class ReleaseVerification(StatusModel):
    """One vLLM release this object ran: the KV cache its plan predicted and what its pods reported (the last
    reading on that release), kept across upgrades so a platform team sees what an upgrade changed."""

    vllm_version: str = Field(max_length=64, description="The vLLM release that reported the figures.")
    predicted_tokens: int = Field(ge=0, description="KV-cache tokens the plan predicted for it.")
    actual_tokens: int | None = Field(None, ge=0, description="KV-cache tokens that release's vLLM reported.")
    error_percent: float = Field(description="(actual - predicted) KV memory in percent of one GPU's memory.")
    verified: bool = Field(description="Whether the error was within the tolerance.")
    plan_hash: str | None = Field(None, max_length=64, description="The plan read on that release.")
    time: AwareDatetime = Field(description="When it was read (RFC 3339).")


class VerificationStatus(StatusModel):
    """The plan's KV cache against what the running vLLM reports (planner/verify.py)."""

    predicted_tokens: int = Field(ge=0, description="KV-cache tokens the plan predicted.")
    actual_tokens: int | None = Field(None, ge=0, description="KV-cache tokens vLLM reports (\"KV cache size\").")
    predicted_blocks: int = Field(ge=0, description="KV-cache blocks the plan predicted.")
    actual_blocks: int | None = Field(None, ge=0, description="KV-cache blocks vLLM reports (num_gpu_blocks).")
    predicted_kv_gib: float = Field(alias="predictedKVGiB", description="KV memory the plan predicted (GiB).")
    actual_kv_gib: float = Field(alias="actualKVGiB", description="KV memory vLLM has (GiB).")
    error_percent: float = Field(description="(actual - predicted) KV memory in percent of one GPU's memory; "
                                             "negative: vLLM has less room than planned.")
    tolerance_percent: float = Field(description="The error PlanVerified allows either way.")
    verified: bool = Field(description="Whether the error is within the tolerance (the PlanVerified condition).")
    source: Literal["metrics", "log"] = Field(
        description="Where the actual figures come from: vllm:cache_config_info, or the start-up log.")
    vllm_version: str = Field(max_length=64, description="The vLLM version that reported them.")
    time: AwareDatetime = Field(description="When they were read (RFC 3339).")
    calibration: str | None = Field(None, max_length=400, description="The KV calibration the plan applied.")
    plan_hash: str | None = Field(
        None, max_length=64, description="The plan whose pods were read (the pods' plan-hash annotation); they "
                                         "are read again only when the plan changes or a new pod of it is Ready.")
    pods: tuple[PodVerification, ...] = Field(
        default=(), max_length=64, description="Each pod read (replicas; a group across nodes: its leader, whose "
                                               "engine's figures are the group's); the figures above are the "
                                               "pod's furthest from the plan.")
    bound_stage: int | None = Field(
        None, ge=0, le=64, description="A group across nodes: the pipeline stage whose blocks vLLM gives every "
                                       "stage (the fewest); the engine's figures above are its.")
    stages: tuple[StageVerification, ...] | None = Field(
        default=None, max_length=64, description="A group across nodes: each stage's own KV room against the "
                                               "plan's.")

    @classmethod
    def of(cls, v: Verification, *, calibration: str | None = None, plan_hash: str | None = None,
           pods: tuple[PodVerification, ...] = ()) -> VerificationStatus:
        return cls(predicted_tokens=v.predicted_tokens, actual_tokens=v.actual_tokens,
                   predicted_blocks=v.predicted_blocks, actual_blocks=v.actual_blocks,
                   predicted_kv_gib=round(v.predicted_kv_bytes / GIB, 3),
                   actual_kv_gib=round(v.actual_kv_bytes / GIB, 3), error_percent=round(v.error_percent, 3),
                   tolerance_percent=v.tolerance_percent, verified=v.verified, source=v.source.value,
                   vllm_version=v.vllm_version, time=v.time, calibration=calibration, plan_hash=plan_hash,
                   pods=pods)

    @classmethod
    def of_pods(cls, results: tuple[tuple[str, Verification], ...], *, plan_hash: str,
                calibration: str | None = None, stages: tuple[StageResult, ...] = ()) -> VerificationStatus | None:
        """The status of one reading of a plan's pods (None: nothing was read); ``stages``: of groups across
        nodes."""
        if not results:
            return None
        worst = max((v for _, v in results), key=lambda v: abs(v.error_percent))
        pods = tuple(PodVerification(pod=pod, actual_tokens=v.actual_tokens, actual_blocks=v.actual_blocks,
                                     error_percent=round(v.error_percent, 3)) for pod, v in results[:64])
        found = cls.of(worst, calibration=calibration, plan_hash=plan_hash, pods=pods)
        if not stages:
            return found
        worst_pod = next(pod for pod, v in results if v is worst)
        group = next((s.group for s in stages if s.pod == worst_pod), None)
        bound = next((s.stage for s in stages if s.bounds and s.group == group),
                     next((s.stage for s in stages if s.bounds), None))
        return found.model_copy(update={"bound_stage": bound, "stages": tuple(
            StageVerification(pod=s.pod, stage=s.stage, predicted_kv_gib=round(s.prediction.kv_cache_bytes / GIB, 3),
                              actual_kv_gib=None if s.verification is None else round(
                                  s.verification.actual_kv_bytes / GIB, 3),
                              predicted_blocks=s.prediction.num_blocks, actual_blocks=s.blocks,
                              error_percent=None if s.verification is None else round(
                                  s.verification.error_percent, 3),
                              bounds=s.bounds, problem=s.problem[:300]) for s in stages[:64])})


class PodBurnInStatus(StatusModel):
    """One pod's burn-in, as judged (desired/burn_in.py)."""

    pod: str = Field(max_length=253, description="The pod.")
    passed: bool = Field(description="Whether it passed (its readiness gate is True).")
    reason: str = Field(max_length=64, description="BurnInPassed, KVCacheTooSmall, RequestsFailed or TimedOut.")
    message: str = Field(max_length=600, description="The figures: requests, peak KV usage, preemptions, time.")
    gpu_seconds: float = Field(ge=0, alias="gpuSeconds", description="What the run cost: seconds x GPUs.")


class BurnInStatus(StatusModel):
    """The burn-in of the plan in force's pods (spec.verification.burnIn)."""

    plan_hash: str = Field(max_length=64, description="The plan whose pods these are.")
    pods: tuple[PodBurnInStatus, ...] = Field(default=(), max_length=64, description="Each pod judged.")


CanaryPhase = Literal["Pending", "Running", "Passed", "Failed"]


class CanaryStatus(StatusModel):
    """The canary of a vLLM release change (desired/canary.py): one pod of the new release, judged before the fleet
    rolls. Attested: a Passed the operator did not write never rolls a fleet."""

    vllm_version: str = Field(max_length=64, description="The release the canary runs (the spec's).")
    image: str = Field(max_length=253, description="The image the canary runs (the spec's).")
    from_vllm_version: str | None = Field(None, max_length=64, description="The fleet's release when it began.")
    from_image: str | None = Field(None, max_length=253, description="The fleet's image when it began.")
    plan_hash: str = Field(max_length=64, description="The plan the canary runs (its pod's plan hash).")
    phase: CanaryPhase = Field(description="Pending: no canary pod yet (or no room for one); Running: its pod "
                                           "starts or is judged; Passed: the fleet rolls; Failed: the fleet is "
                                           "held (UpgradeHeld).")
    replaces_replica: bool = Field(False, description="No free GPU for a surge: one replica of the fleet was "
                                                      "given up for the canary.")
    pod: str | None = Field(None, max_length=253, description="The canary's pod, once seen.")
    reason: str | None = Field(None, max_length=64, description="Failed or waiting: UpgradeHeld's reason.")
    since: AwareDatetime = Field(description="When the canary entered this phase (RFC 3339).")
    message: str = Field("", max_length=600, description="Why it is in this phase, with vLLM's own figures.")


class KVCalibrationChoice(StatusModel):
    """The KV calibration one calibration key (GPU product, vLLM version, family) plans with."""

    gpu_product: str = Field(max_length=253, description="The GPU product of the calibration key.")
    vllm_version: str = Field(max_length=64, description="The vLLM version of the calibration key.")
    family: str = Field(max_length=253, description="The architecture family (config.json model_type).")
    ratio: float | None = Field(None, ge=0.5, le=1.5, description="Measured / predicted KV memory applied "
                                                                   "(capped); none: not calibrated.")
    deployments: int = Field(0, ge=0, le=100000, description="How many deployments' samples it came from.")
    message: str = Field(max_length=400, description="What was applied, or why nothing was.")


class KVCalibrationStatus(KVCalibrationChoice):
    """The KV calibration the spec plans with (the top-level fields: the plan in force's GPU), fixed when the spec
    is first planned (desired/calibration.py): a sample another deployment adds later, or a change of replicas,
    never rolls this one."""

    spec_hash: str = Field(max_length=64, description="The spec (without replicas) it was chosen for.")
    candidates: tuple[KVCalibrationChoice, ...] = Field(
        default=(), max_length=16, description="The choice for every GPU the spec was planned on (its pools).")


class StartupProbeStatus(StatusModel):
    """The startup probe's length the plan in force runs with and why (desired/startup_probe.py): learned from
    the vLLM starts observed for its image, model and GPU product, or the formula's first guess. Fixed per plan: a
    start observed later never changes the probe of running pods; the next plan (a spec change, a remediation
    step) takes what has been learned by then."""

    plan_hash: str = Field(max_length=64, description="The plan it was chosen for.")
    image: str = Field(max_length=253, description="The vLLM image of the key the starts are kept under.")
    model: str = Field(max_length=253, description="The model of that key.")
    gpu_product: str = Field(max_length=253, description="The GPU product of that key.")
    downloads: bool = Field(False, description="The pods download their weights themselves: their starts are "
                                               "kept apart from loads from the model cache or a volume.")
    seconds: int = Field(ge=1, le=86400, description="The startup probe's length (periodSeconds x "
                                                     "failureThreshold) in the pod template.")
    formula_seconds: int = Field(ge=1, le=86400, description="The first guess from the checkpoint's size: the "
                                                             "most a learned probe may be.")
    starts: int = Field(0, ge=0, le=1000, description="How many observed starts it was learned from (0: the "
                                                      "first guess).")
    median_start_seconds: float | None = Field(None, ge=0, le=86400,
                                               description="The median of those starts (seconds).")
    message: str = Field(max_length=300, description="Which budget was used, and why.")


class CompileCacheStatus(StatusModel):
    """Where the vLLM pods keep their compile caches (spec.vllm.compileCache): the PVC, and the folder of the plan
    in force, keyed by what vLLM's own hash does not separate (render/compile_cache.py)."""

    claim_name: str = Field(max_length=253, description="The compile cache PVC.")
    folder: str = Field(max_length=253, description="The folder in it: VLLM_CACHE_ROOT, TRITON_CACHE_DIR and "
                                                    "FLASHINFER_WORKSPACE_BASE are below /compile-cache/<folder>.")
    size: str = Field(max_length=64, description="The PVC's requested size (its bound) when the operator made it.")


LoRAUpdates = Literal["Runtime", "Rollout"]


class LoRAAdapterStatus(StatusModel):
    """Where one adapter is served, as the pods' own /v1/models say, and how a change of it reaches them."""

    name: str = Field(max_length=128, description="The adapter's served name.")
    source: str = Field(max_length=1024, description="Where it comes from: spec.lora.adapters[].source (for an "
                                                     "adapter being removed, the path a pod loaded it from).")
    path: str = Field("", max_length=1024, description="The path vLLM loads it from: a Hub id, or a folder in the "
                                                        "pod (a pvc:// claim's mount, the model cache).")
    applied: LoRAUpdates = Field(description="Runtime: loaded on the running pods through vLLM's API; Rollout: "
                                             "in the pods' --lora-modules, so a change of it rolls the pods.")
    pods: tuple[str, ...] = Field(default=(), max_length=64, description="Ready pods that serve it.")
    pending: tuple[str, ...] = Field(default=(), max_length=64, description="Ready pods that do not serve it yet.")
    message: str = Field("", max_length=500, description="Why it is not served everywhere (vLLM's answer).")


class LoRAStatus(StatusModel):
    """The adapters the spec lists and what the pods serve (controller/lora_runtime.py reads and writes it)."""

    updates: LoRAUpdates = Field(description="How adapter additions and removals are applied.")
    reason: str = Field(max_length=300, description="Why that way.")
    adapters: tuple[LoRAAdapterStatus, ...] = Field(default=(), max_length=64, description="The spec's adapters.")
    removing: tuple[LoRAAdapterStatus, ...] = Field(
        default=(), max_length=64, description="Adapters pods still serve that the spec no longer lists.")


class LLMDeploymentStatus(APIModel):
    observed_generation: int | None = Field(None, description="The spec generation last reconciled.")
    replicas: int | None = Field(
        None, description="Replicas that exist (pods, or groups of pods across nodes): the scale subresource's.")
    ready_replicas: int | None = Field(None, description="Replicas whose every pod is ready.")
    selector: str | None = Field(
        None, description="Label selector of the pods that serve (the scale subresource's, for HPA and KEDA).")
    plan: PlanStatus | None = Field(None, description="The current plan and its memory breakdown.")
    conditions: list[Condition] = Field(default_factory=list, description="Planned, Ready, Degraded...")
    remediation: RemediationStatus | None = Field(None, description="Remediation rung and history.")
    cache: CacheStatus | None = Field(None, description="The model cache's download (spec.model.cache).")
    source: SourceStatus | None = Field(
        None, description="What was read from a pvc:// source's volume or an s3:// source's objects.")
    lora_sources: list[LoRASourceStatus] | None = Field(
        None, max_length=32, description="What the inspect Jobs of the pvc:// LoRA adapters read on their volumes.")
    burn_in: BurnInStatus | None = Field(
        None, description="Each new pod's burn-in before traffic (spec.verification.burnIn; BurnInPassed).")
    verification: VerificationStatus | None = Field(
        None, description="The plan's KV cache against what the running vLLM reports (the PlanVerified condition).")
    lora: LoRAStatus | None = Field(None, description="Where each LoRA adapter is served, and how changes apply.")
    releases: tuple[ReleaseVerification, ...] | None = Field(
        None, max_length=8, description="Per vLLM release this object ran (the last 8, oldest first): the KV "
                                        "tokens predicted and reported, so an upgrade's effect is seen.")
    kv_calibration: KVCalibrationStatus | None = Field(
        None, alias="kvCalibration", description="The KV calibration from earlier deployments this generation "
                                                 "plans with (fixed per spec generation).")
    startup_probe: StartupProbeStatus | None = Field(
        None, description="The startup probe's length the plan in force runs with: learned from the starts "
                          "observed for the same image, model and GPU, or the first guess (fixed per plan).")
    compile_cache: CompileCacheStatus | None = Field(
        None, description="The PVC and folder the vLLM pods keep their compile caches in (spec.vllm.compileCache).")
    canary: CanaryStatus | None = Field(
        None, description="The canary of a vLLM release change (spec.rollout.canary; UpgradeHeld when it failed).")
    attestations: dict[str, str] | None = Field(
        None, max_length=16,
        description="The operator's HMAC of each section it reads back (source, loraSources, cache, verification, "
                    "releases, kvCalibration, burnIn, lora, startupProbe, canary), made with a key only it holds: a "
                    "section whose attestation does not verify is ignored and decided again (the StatusForged Event).")

