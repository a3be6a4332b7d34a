"""LLMDeployment v1alpha1 spec: what platform teams write.

Defaults live here, not in the CRD, so the API server never writes them into stored objects and GitOps tools see
no drift; the one exception is ``spec.replicas``, which the scale subresource reads (api/crd.py).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, PlainValidator, WithJsonSchema, field_validator, model_validator
from pydantic.alias_generators import to_camel

from llm_autopilot.api import kubernetes_rules as rules
from llm_autopilot.api.core_types import ContainerResources, EnvVar, LabelSelector, SecretKeyRef, Toleration
from llm_autopilot.api.fields import (
    DURATION_MAX_SECONDS,
    QUERY_WINDOW_MAX_SECONDS,
    REPLICAS_MAX,
    SEQUENCES_MAX,
    TOKENS_MAX,
    APIModel,
    CLIValue,
    ConfigKey,
    ExtraArg,
    GPUProduct,
    HubID,
    ImageReference,
    LabelKey,
    LabelValue,
    ObjectName,
    Quantity,
    checked,
    invalid,
    label_keys_rule,
)
from llm_autopilot.api.serve_flags import PASSED_FLAGS, extra_args_problems
from llm_autopilot.api.sources import (
    HubSource,
    S3Source,
    Source,
    adapter_source_problem,
    parse_adapter_source,
    parse_source,
    source_problem,
)
from llm_autopilot.domain import egress
from llm_autopilot.domain.drain import (
    DRAIN_MARGIN_SECONDS,
    DRAIN_SECONDS_DEFAULT,
    DRAIN_SECONDS_MAX,
    PRE_STOP_SECONDS,
)
from llm_autopilot.planner.verify import TOLERANCE_PERCENT as VERIFICATION_TOLERANCE_PERCENT

QuantizationName = Literal["none", "fp8", "awq", "gptq"]
KVCacheDtypeName = Literal["auto", "fp8"]
#: The environment variable vLLM (huggingface_hub) reads the Hub token from.
HUB_TOKEN_ENV = "HF_TOKEN"


class ArchitectureOverride(APIModel):
    """Fields of the model's config.json, for models whose config cannot be fetched or is wrong."""

    hidden_size: int | None = Field(None, ge=1, le=2**20, description="config.json `hidden_size`.")
    num_hidden_layers: int | None = Field(None, ge=1, le=4096, description="config.json `num_hidden_layers`.")
    num_attention_heads: int | None = Field(None, ge=1, le=4096, description="config.json `num_attention_heads`.")
    num_key_value_heads: int | None = Field(None, ge=1, le=4096, description="config.json `num_key_value_heads` (GQA).")
    head_dim: int | None = Field(None, ge=1, le=2**16, description="config.json `head_dim`; defaults to hidden/heads.")
    intermediate_size: int | None = Field(None, ge=1, le=2**24, description="config.json `intermediate_size`.")
    vocab_size: int | None = Field(None, ge=1, le=2**24, description="config.json `vocab_size`.")
    max_position_embeddings: int | None = Field(
        None, ge=1, le=TOKENS_MAX, description="The model's maximum context length.")
    torch_dtype: Literal["bfloat16", "float16", "float32"] | None = Field(None, description="Weight dtype.")
    tie_word_embeddings: bool | None = Field(None, description="Whether the LM head shares the embedding.")
    sliding_window: int | None = Field(
        None, ge=1, le=TOKENS_MAX, description="Window of the sliding-window attention layers.")
    num_experts: int | None = Field(None, ge=1, le=2**16, description="Routed experts of each MoE layer.")
    num_experts_per_tok: int | None = Field(None, ge=1, le=2**16, description="Experts each token is routed to.")
    moe_intermediate_size: int | None = Field(None, ge=1, le=2**24, description="Intermediate size of one expert.")
    kv_lora_rank: int | None = Field(None, ge=1, le=2**16, description="MLA latent size (DeepSeek `kv_lora_rank`).")
    qk_rope_head_dim: int | None = Field(None, ge=1, le=2**16, description="MLA rotary head size.")
    qk_nope_head_dim: int | None = Field(None, ge=1, le=2**16, description="MLA non-rotary head size.")
    v_head_dim: int | None = Field(None, ge=1, le=2**16, description="MLA value head size.")
    weight_bytes: int | None = Field(
        None, ge=1, le=2**53, description="Checkpoint size in bytes (safetensors total_size), at most 2^53 (8 PiB).")

    def as_hf_config(self) -> dict[str, Any]:
        """The override as config.json fields (snake_case, as Hugging Face spells them)."""
        return {k: v for k, v in self.model_dump(by_alias=False).items() if v is not None and k != "weight_bytes"}


class QuantizedVariants(APIModel):
    fp8: HubID | None = Field(None, description="Hub id of an FP8 checkpoint of the same model.")
    awq: HubID | None = Field(None, description="Hub id of an AWQ (4-bit) checkpoint of the same model.")
    gptq: HubID | None = Field(None, description="Hub id of a GPTQ (4-bit) checkpoint of the same model.")


class S3CredentialsRef(APIModel):
    name: ObjectName = Field(description="Name of a Secret in the LLMDeployment's namespace.")
    access_key_id_key: ConfigKey = Field(
        "AWS_ACCESS_KEY_ID", description="Key of the access key id in the Secret. Defaults to AWS_ACCESS_KEY_ID.")
    secret_access_key_key: ConfigKey = Field(
        "AWS_SECRET_ACCESS_KEY",
        description="Key of the secret access key in the Secret. Defaults to AWS_SECRET_ACCESS_KEY.")


class S3Options(APIModel):
    """How to reach an S3-compatible store (AWS S3, SeaweedFS, MinIO, Ceph RGW...)."""

    endpoint: str | None = Field(
        None, max_length=2048, pattern=r"^https?://[^\s/]+(/[^\s]*)?$",
        description="Store URL, e.g. `http://seaweedfs.storage:8333`. Defaults to AWS: "
        "`https://s3.<region>.amazonaws.com`. Buckets are addressed path-style (`<endpoint>/<bucket>/<key>`). "
        "The operator reads the model's config through it: a private or cluster address must be in the "
        "operator's egress allowlist (Helm value egress.allow); link-local (cloud metadata), unspecified and "
        "multicast addresses are refused.")
    region: str = Field(
        "us-east-1", min_length=1, max_length=64, pattern=r"^[a-z0-9-]+$",
        description="Region the requests are signed for (SigV4). Default us-east-1.")
    credentials_secret_ref: S3CredentialsRef | None = Field(
        None, description="Secret with the access key id and secret access key. Omit for a public bucket "
        "(unsigned requests).")

    @field_validator("endpoint")
    @classmethod
    def _reachable(cls, endpoint: str | None) -> str | None:
        problem = egress.endpoint_problem(endpoint) if endpoint is not None else None
        if problem is not None:
            raise invalid(problem)
        return endpoint


ModelURI = Annotated[str, Field(min_length=6, max_length=1024), checked(source_problem)]


#: the smallest cache PVC admitted: below it no checkpoint fits (and 0 is refused by the API server)
CACHE_SIZE_MIN_BYTES = 2**20


class ModelCache(APIModel):
    """A PersistentVolumeClaim holding the weights, filled once by a download Job, shared by every replica and
    every remediation step of the same model and revision in the namespace."""

    enabled: bool = Field(False, description="Download the weights once into a shared PVC. Default false.")
    storage_class_name: ObjectName | None = Field(
        None, description="StorageClass of the cache PVC. Defaults to the cluster's default StorageClass.")
    size: Quantity | None = Field(
        None, description="Size of the cache PVC. Defaults to the checkpoint's bytes plus 10 % and 1 GiB.")
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce"] = Field(
        "ReadWriteMany", description="ReadWriteMany (default) lets pods on any node mount it; ReadWriteOnce "
        "(node-local volumes) keeps every pod on the volume's node.")
    existing_claim: ObjectName | None = Field(
        None, description="Use this PVC in the namespace instead of creating one (the download Job fills it). At "
        f"most {rules.LABEL_VALUE_MAX} characters: the download Job carries it as a label.")

    @field_validator("size")
    @classmethod
    def _holds_a_model(cls, size: int | str | None) -> int | str | None:
        if size is not None and rules.parse_quantity(size) < CACHE_SIZE_MIN_BYTES:
            raise invalid(f"cache.size {size!r} is less than 1Mi: no model fits (and the API server refuses a PVC "
                          "of 0 bytes); give the checkpoint's size with room, e.g. 64Gi, or omit it for the "
                          "checkpoint's size plus 10 % and 1 GiB")
        return size

    @field_validator("existing_claim")
    @classmethod
    def _fits_a_label(cls, claim: str | None) -> str | None:
        if claim is not None and len(claim) > rules.LABEL_VALUE_MAX:
            raise invalid(f"existingClaim {claim[:20]!r}... is {len(claim)} characters: the download Job labels "
                          f"its pods with the claim's name, and a label value has at most {rules.LABEL_VALUE_MAX}; "
                          "use a claim with a shorter name")
        return claim


#: the compile cache's PVC: large enough for a few entries of vLLM's torch.compile, Triton and FlashInfer caches
#: (a model's entry is tens to hundreds of MiB), bounded so that no entry outgrows a typical volume
COMPILE_CACHE_SIZE_DEFAULT = "10Gi"
COMPILE_CACHE_SIZE_MIN_BYTES = 2**30
COMPILE_CACHE_SIZE_MAX_BYTES = 2**40


class CompileCache(APIModel):
    """A PersistentVolumeClaim that keeps vLLM's compile caches (torch.compile, Triton, FlashInfer JIT) across pods:
    a pod that starts after another with the same image, model, revision and GPU product loads the compiled
    graphs instead of compiling them again."""

    enabled: bool | None = Field(
        None, description="Keep the compile caches on a shared PVC. Unset: on when spec.model.cache.enabled is "
        "(the cluster then provides the PVCs it needs); false turns it off (each pod compiles in its own "
        "emptyDir); true turns it on without the model cache.")
    size: Quantity = Field(
        COMPILE_CACHE_SIZE_DEFAULT, description=f"Size of the compile cache PVC: the bound of everything it "
        f"keeps. Default {COMPILE_CACHE_SIZE_DEFAULT}; from 1Gi to 1Ti. Applied when the PVC is created (like the "
        "model cache's, a PVC that exists is left as it is).")
    storage_class_name: ObjectName | None = Field(
        None, description="StorageClass of the compile cache PVC. Defaults to the cluster's default StorageClass.")
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce"] = Field(
        "ReadWriteMany", description="ReadWriteMany (default): pods on every node share it; ReadWriteOnce "
        "(node-local volumes) keeps every pod on the volume's node.")

    @field_validator("size")
    @classmethod
    def _bounded(cls, size: int | str) -> int | str:
        given = rules.parse_quantity(size)
        if not COMPILE_CACHE_SIZE_MIN_BYTES <= given <= COMPILE_CACHE_SIZE_MAX_BYTES:
            raise invalid(f"compileCache.size {size!r} is outside 1Gi..1Ti: a model's compiled graphs take tens to "
                          "hundreds of MiB per entry, and the volume is the cache's only bound")
        return size


class ModelSource(APIModel):
    name: HubID = Field(description="Hugging Face Hub id (`org/name`) or `hf://org/name` of the model to serve. "
                        "With a pvc:// or s3:// source it names the model (the default served name, and the "
                        "built-in catalog's entry used for a pvc:// source).")
    source: ModelURI | None = Field(
        None, description="Where the weights are: `hf://org/name` (the Hub; default `hf://<name>`), "
        "`pvc://claim/path` (a folder on a PersistentVolumeClaim in the namespace, mounted read-only) or "
        "`s3://bucket/prefix` (an S3-compatible store, see `s3`).")
    s3: S3Options | None = Field(None, description="Endpoint, region and credentials of an s3:// source.")
    cache: ModelCache | None = Field(
        None, description="Download the weights once into a PVC that the pods mount read-only (hf:// and s3://).")
    revision: CLIValue | None = Field(
        None, description="Hub revision (branch, tag or commit). Defaults to `main`.")
    served_model_name: CLIValue | None = Field(
        None, description="Name clients use in API requests. Defaults to `name`, even when a variant is served."
    )
    architecture: ArchitectureOverride | None = Field(
        None, description="Override or supply config.json fields; required when the config cannot be fetched. "
        "On a catalog model the fields are merged onto the catalog's config.",
    )
    variants: QuantizedVariants | None = Field(
        None, description="Pre-quantized checkpoints of the same model the planner may serve instead."
    )
    hub_token_secret_ref: SecretKeyRef | None = Field(
        None, description="Secret holding a Hugging Face token, for gated or private models."
    )

    @property
    def served_name(self) -> str:
        """The name clients ask vLLM for (``--served-model-name``): servedModelName, else the Hub id."""
        return self.served_model_name or self.name.removeprefix("hf://")

    @property
    def location(self) -> Source:
        """Where the checkpoint is read from (the Hub id in ``name`` unless ``source`` says otherwise)."""
        return parse_source(self.source) if self.source else HubSource(self.name.removeprefix("hf://"))

    @property
    def hub_repo(self) -> str | None:
        """The Hub repository of an hf:// source; None for pvc:// and s3://."""
        where = self.location
        return where.repo if isinstance(where, HubSource) else None

    @model_validator(mode="after")
    def _source_rules(self) -> ModelSource:
        if self.cache is not None and self.cache.enabled and self.variants is not None:
            raise invalid("cache holds one checkpoint, the source's: remove variants (or serve a pre-quantized "
                          "checkpoint as the source itself)")
        if self.source is None or self.source.startswith("hf://"):
            if self.s3 is not None:
                raise invalid("s3 only applies to an s3:// source")
            return self
        scheme = self.source.partition("://")[0]
        if self.cache is not None and self.cache.enabled and scheme == "pvc":
            raise invalid("cache applies to hf:// and s3:// sources: a pvc:// source is already on a volume")
        if self.s3 is not None and scheme != "s3":
            raise invalid(f"s3 only applies to an s3:// source, not {scheme}://")
        for given, field in ((self.revision, "revision"), (self.hub_token_secret_ref, "hubTokenSecretRef"),
                             (self.variants, "variants")):
            if given is not None:
                raise invalid(f"{field} applies to the Hub (hf:// sources), not to {scheme}://: remove it "
                              f"(put another revision or a quantized variant under its own {scheme}:// path)")
        if scheme == "s3" and (self.cache is None or not self.cache.enabled):
            raise invalid("an s3:// source needs cache.enabled: true: vLLM does not load from S3, so the weights "
                          "are downloaded once into a PVC the pods mount")
        return self



class GPUSelector(APIModel):
    product: GPUProduct | None = Field(
        None,
        description="GPU from the catalog (e.g. `nvidia-h100-80gb`, `nvidia-l4`) or a GPU Feature Discovery "
        "`nvidia.com/gpu.product` value. Omit to use what the cluster's GPU nodes report.",
    )
    memory_gib: float | None = Field(
        None, alias="memoryGiB", gt=0, le=1024,
        description="Total memory of one GPU in GiB, for GPUs not in the catalog. The pods are then not pinned "
        "to a GPU product: pin them with nodeSelector.",
    )
    compute_capability: str | None = Field(
        None, pattern=r"^\d+\.\d+$", max_length=16,
        description="CUDA compute capability (e.g. `8.9`), with memoryGiB.",
    )
    max_gpus: int = Field(8, alias="maxGPUs", ge=1, le=64, description="Most GPUs one replica may use. Default 8.")
    node_selector: dict[LabelKey, LabelValue] | None = Field(
        None, max_length=32, description="Extra node labels the pods must match.",
        json_schema_extra=label_keys_rule("nodeSelector"),
    )
    tolerations: list[Toleration] | None = Field(
        None, max_length=32, description="Tolerations added to the vLLM pods.")

    @model_validator(mode="after")
    def _capability_needs_memory(self) -> GPUSelector:
        if self.compute_capability and self.memory_gib is None:
            raise invalid("gpu.computeCapability is only used with gpu.memoryGiB")
        return self


AUTO = "auto"


def _max_model_len(value: Any) -> int | str:
    if value == AUTO:
        return AUTO
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= TOKENS_MAX:
        raise invalid(f"{value!r:.80} is not a context length: a whole number of tokens from 1 to {TOKENS_MAX}, or "
                      "auto (the longest that fits, chosen by the planner)")
    return value


#: A length in tokens, or ``auto``: the planner's longest fitting length (not vLLM's own ``auto``).
MaxModelLen = Annotated[int | str, PlainValidator(_max_model_len), WithJsonSchema({
    "anyOf": [{"type": "integer"}, {"type": "string"}], "minimum": 1, "maximum": TOKENS_MAX, "pattern": f"^{AUTO}$",
    "maxLength": len(AUTO),
})]


class ServingTargets(APIModel):
    max_model_len: MaxModelLen | None = Field(
        None, description="Desired context length. Defaults to the model's maximum. `auto`: the longest length "
        "that fits (with headroom), between minMaxModelLen and the model's maximum, chosen by the planner and "
        "shown in the status (vLLM is given the number, not its own auto).",
    )
    min_max_model_len: int | None = Field(
        None, ge=1, le=TOKENS_MAX,
        description="Shortest acceptable context length. Defaults to maxModelLen when that is set, "
        "else to the smaller of 8192 and the model's maximum.",
    )
    expected_concurrency: int | None = Field(
        None, ge=1, le=SEQUENCES_MAX, description="Concurrent sequences of maxModelLen tokens the KV cache should hold."
    )
    allowed_quantizations: list[QuantizationName] = Field(
        default_factory=lambda: list[QuantizationName](["none"]), min_length=1, max_length=8,
        description="Weight formats the planner may use, best quality first: none (as published), fp8, "
        "awq, gptq. awq/gptq need a variant; fp8 uses a variant or quantizes on the fly. Default [none].",
    )
    allowed_kv_cache_dtypes: list[KVCacheDtypeName] = Field(
        default_factory=lambda: list[KVCacheDtypeName](["auto"]), alias="allowedKVCacheDtypes",
        min_length=1, max_length=8,
        description="KV-cache dtypes the planner may use: auto (model dtype), fp8. Default [auto].",
    )

    allow_cpu_offload: bool = Field(
        False, alias="allowCPUOffload",
        description="As a last resort, when nothing fits in GPU memory, keep part of the weights in host memory "
        "(vLLM --cpu-offload-gb). Slow: the offloaded weights cross PCIe on every forward pass. The host memory "
        "is added to the pod's memory request and limit. Default false.",
    )

    @property
    def fixed_max_model_len(self) -> int | None:
        """maxModelLen when it is a number (None when unset or auto)."""
        return self.max_model_len if isinstance(self.max_model_len, int) else None

    @property
    def auto_max_model_len(self) -> bool:
        return self.max_model_len == AUTO

    @model_validator(mode="after")
    def _lengths_ordered(self) -> ServingTargets:
        fixed = self.fixed_max_model_len
        if self.min_max_model_len and fixed and self.min_max_model_len > fixed:
            raise invalid(f"serving.minMaxModelLen ({self.min_max_model_len}) is larger than "
                          f"serving.maxModelLen ({fixed})")
        return self



class VLLMSettings(APIModel):
    image: ImageReference | None = Field(
        None, description="vLLM container image. Defaults to the operator's default.")
    version: str | None = Field(
        None, pattern=r"^v?\d+\.\d+(\.\d+)?$", max_length=32,
        description="vLLM version in the image (decides defaults and accepted flags). Defaults to the "
        "operator's default.",
    )
    extra_args: list[ExtraArg] = Field(
        default_factory=list, max_length=64,
        description="Extra `vllm serve` arguments, appended after the planned ones. A flag the operator owns "
        "(--max-model-len, -tp, --gpu-memory-utilization, --kv-cache-dtype, -O, --nnodes, ...: the README's table) "
        "is refused in any spelling, with the spec field that sets it; so are --port, --host, --uds (the Service "
        "and the probes use port 8000), --api-key, --hf-token (use env with a secretKeyRef) and $( (the kubelet "
        "would expand it: write $$( for a literal $().",
    )
    env: list[EnvVar] = Field(
        default_factory=list, max_length=64, description="Extra environment variables for vLLM.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="Pin vLLM's gpu_memory_utilization instead of the version default."
    )
    enforce_eager: bool = Field(False, description="Disable CUDA graphs (less memory, slower decoding).")
    max_num_seqs: int | None = Field(None, ge=1, le=SEQUENCES_MAX, description="Pin vLLM's max_num_seqs.")
    max_num_batched_tokens: int | None = Field(
        None, ge=1, le=TOKENS_MAX, description="Pin vLLM's max_num_batched_tokens.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] | None = Field(
        None,
        description="vLLM's --dtype: the dtype of activations, unquantized weights and an auto KV cache. Unset or "
        "auto: vLLM's choice (the checkpoint's dtype; float16 on GPUs without bfloat16). The planner sizes the "
        "weights, the activation peak and the KV cache in it (float32: 4 bytes each, so about half the KV cache of "
        "bfloat16). Refused where vLLM refuses it: float16 for Gemma 2/3 and GLM-4, bfloat16 below compute "
        "capability 8.0, float32 for MLA models (no float32 MLA attention backend) or with quantized weights.")
    reasoning_parser: str | None = Field(
        None, pattern=r"^[a-z0-9][a-z0-9_.-]*$", max_length=64,
        description="vLLM's reasoning parser (--reasoning-parser), e.g. deepseek_r1 or qwen3: the model's reasoning "
        "is returned apart from its answer. vLLM checks the name against the parsers of its release when it starts "
        "(an unknown one fails the start, with vLLM's list of names in the pod's log).")
    compile_cache: CompileCache = Field(
        default_factory=CompileCache,
        description="vLLM's compile caches (torch.compile, Triton, FlashInfer) on a PVC shared by every pod of the "
        "same model: a restarted pod, a remediation step or a scale-out loads the compiled graphs instead of "
        "compiling them again.")
    drain_seconds: int = Field(
        DRAIN_SECONDS_DEFAULT, ge=0, le=DRAIN_SECONDS_MAX,
        description="How long a pod being replaced or removed may take to finish the requests it is generating, in "
        "seconds: vLLM's --shutdown-timeout (vLLM 0.18 and later; an older release aborts them), after a "
        f"{PRE_STOP_SECONDS} s preStop wait in which the pod leaves the Service's endpoints, so no new request "
        "reaches it once vLLM stops accepting; the pod's terminationGracePeriodSeconds is that wait, this and "
        f"{DRAIN_MARGIN_SECONDS} s more. Default {DRAIN_SECONDS_DEFAULT}; at most {DRAIN_SECONDS_MAX} (1 hour). "
        "0: no drain (no preStop wait, vLLM aborts what is in flight when the pod stops).")

    def passed_args(self) -> tuple[str, ...]:
        """The fields passed to ``vllm serve`` as given (api/serve_flags.PASSED_FLAGS), in the table's order."""
        return tuple(arg for passed in PASSED_FLAGS for arg in passed.args(getattr(self, passed.field)))

    @field_validator("extra_args")
    @classmethod
    def _no_owned_config_keys(cls, args: list[str]) -> list[str]:
        problems = extra_args_problems(args)  # each argument alone is checked by its type; this reads them together
        if problems:
            raise invalid("; ".join(f"extraArgs[{i}]: {p}" for i, p in problems))
        return args

    @field_validator("env")
    @classmethod
    def _unique_names(cls, env: list[EnvVar]) -> list[EnvVar]:
        first: dict[str, int] = {}
        for i, var in enumerate(env):
            if var.name in first:
                raise invalid(f"{var.name} is set twice (env[{first[var.name]}] and env[{i}]); keep one")
            first[var.name] = i
        return env



class RemediationFloors(APIModel):
    min_max_model_len: int | None = Field(
        None, ge=1, le=TOKENS_MAX, description="Never lower maxModelLen below this. Defaults to serving.minMaxModelLen."
    )
    min_gpu_memory_utilization: float = Field(
        0.7, gt=0, le=1, description="Never lower gpu_memory_utilization below this. Default 0.7."
    )
    min_max_num_seqs: int = Field(
        8, ge=1, le=SEQUENCES_MAX, description="Never lower max_num_seqs below this. Default 8.")
    min_max_num_batched_tokens: int = Field(
        512, ge=1, le=TOKENS_MAX, description="Never lower max_num_batched_tokens below this. Default 512."
    )


class RemediationPolicy(APIModel):
    enabled: bool = Field(True, description="Roll to safer settings on OOM or KV saturation. false = report only.")
    cooldown_seconds: int = Field(
        600, ge=0, le=DURATION_MAX_SECONDS,
        description="Minimum time between two steps, in seconds. Default 600; at most 604800 (7 days).")
    max_steps: int = Field(5, ge=0, le=20, description="Steps before giving up (Degraded). Default 5.")
    stable_window_seconds: int = Field(
        3600, ge=60, le=DURATION_MAX_SECONDS,
        description="Calm time after which one step is relaxed, in seconds. Default 3600; at most 604800 (7 days)."
    )
    kv_saturation_threshold: float = Field(
        0.7, gt=0, le=1,
        description="Average kv_cache_usage_perc over the window counted as saturated (together with "
        "preemptions and a queue that never drains). Default 0.7.",
    )
    kv_saturation_window_seconds: int = Field(
        300, ge=30, le=QUERY_WINDOW_MAX_SECONDS, alias="kvSaturationWindowSeconds",
        description="The window KV saturation is judged on: average usage at the threshold, preemptions "
        "increasing and requests waiting throughout, in seconds (a PromQL range). Default 300; at most 86400 "
        "(1 day).",
    )
    max_replicas: int | None = Field(
        None, ge=1, le=REPLICAS_MAX, description="Most replicas remediation may scale to (at most 1000).")
    floors: RemediationFloors = Field(
        default_factory=RemediationFloors, description="Lower bounds remediation never crosses."
    )


class AutoscalingPolicy(APIModel):
    """Replicas driven by KEDA on vLLM's own load signals; the operator renders the ScaledObject."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              json_schema_extra={"x-kubernetes-validations": [{
                                  "rule": "!has(self.minReplicas) || !has(self.maxReplicas) "
                                          "|| self.minReplicas <= self.maxReplicas",
                                  "message": "autoscaling.minReplicas must not be larger than maxReplicas",
                              }]})

    min_replicas: int = Field(
        1, ge=1, le=1000,
        description="Fewest replicas. Default 1 (not 0: with no pod there is no KV usage to scale up on).")
    max_replicas: int = Field(
        ge=1, le=1000,
        description="Most replicas. Refused when the matching GPU node pool cannot hold that many; the "
        "message gives the number that fits.")
    target_kv_cache_usage: float = Field(
        0.7, gt=0, le=1, alias="targetKVCacheUsage",
        description="Average vllm:kv_cache_usage_perc per replica KEDA scales to. Default 0.7.")
    target_waiting_requests: int = Field(
        5, ge=1, le=10**6,
        description="Average vllm:num_requests_waiting per replica KEDA scales to. Default 5.")
    polling_interval_seconds: int = Field(
        30, ge=1, le=3600, description="How often KEDA queries Prometheus. Default 30.")
    cooldown_period_seconds: int = Field(
        300, ge=0, le=86400, description="KEDA's cooldownPeriod (only used to scale to zero). Default 300.")
    scale_down_stabilization_seconds: int = Field(
        300, ge=0, le=3600,
        description="The HPA's scale-down stabilization window: calm must last this long before a replica "
        "goes. Default 300.")
    prometheus_address: str | None = Field(
        None, max_length=2048, pattern=r"^https?://[^\s]+$",
        description="Prometheus that KEDA queries. Defaults to the operator's (LLM_AUTOPILOT_PROMETHEUS_URL).")

    @model_validator(mode="after")
    def _ordered(self) -> AutoscalingPolicy:
        if self.min_replicas > self.max_replicas:
            raise invalid(f"autoscaling.minReplicas ({self.min_replicas}) is larger than maxReplicas "
                          f"({self.max_replicas})")
        return self


_LORA_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$"
LoRAName = Annotated[str, Field(min_length=1, max_length=128, pattern=_LORA_NAME)]


AdapterURI = Annotated[str, Field(min_length=3, max_length=1024), checked(adapter_source_problem)]


class LoRAAdapter(APIModel):
    name: LoRAName = Field(description="Model name requests use for this adapter (`model` in /v1/completions).")
    source: AdapterURI = Field(
        description="Where the PEFT adapter's folder is, as for the model: `org/name` or `hf://org/name` (the Hub), "
        "`pvc://claim/path` (a folder on a PersistentVolumeClaim in the namespace, mounted read-only) or "
        "`s3://bucket/prefix` (an S3-compatible store, see lora.s3; downloaded into the model cache).")
    revision: CLIValue | None = Field(
        None, description="Branch, tag or commit. vLLM 0.33's --lora-modules loads the default branch: only `main`.")
    pinned: bool = Field(False, description="Always loaded: maxLoras never goes below the pinned adapters.")

    @property
    def location(self) -> Source:
        """Where the adapter's files are (a bare Hub id is the Hub's)."""
        return parse_adapter_source(self.source)

    @field_validator("revision")
    @classmethod
    def _default_branch(cls, revision: str | None) -> str | None:
        if revision not in (None, "main"):
            raise invalid(f"lora adapter revision {revision!r}: vLLM's --lora-modules has no revision and downloads "
                          "the default branch; remove revision (or publish that revision as its own repository)")
        return revision

    @model_validator(mode="after")
    def _source_rules(self) -> LoRAAdapter:
        scheme = self.source.partition("://")[0] if "://" in self.source else "hf"
        if self.revision is not None and scheme != "hf":
            raise invalid(f"lora adapter {self.name}: revision applies to the Hub (hf:// sources), not to "
                          f"{scheme}://: remove it (put another revision under its own {scheme}:// path)")
        return self


class LoRASpec(APIModel):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!has(self.maxLoras) || !has(self.adapters) || "
                 "self.adapters.filter(a, has(a.pinned) && a.pinned).size() <= self.maxLoras",
         "message": "more pinned adapters than maxLoras: raise maxLoras or unpin some"},
        {"rule": "!has(self.maxCPULoras) || self.maxCPULoras >= (has(self.maxLoras) ? self.maxLoras : "
                 "(has(self.adapters) && self.adapters.size() > 1 ? self.adapters.size() : 1))",
         "message": "maxCPULoras must be at least maxLoras"},
    ]})

    adapters: list[LoRAAdapter] = Field(
        default_factory=list, max_length=32, description="The adapters to serve.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
    max_loras: int | None = Field(None, ge=1, le=64, description="Adapter slots on the GPU (--max-loras). "
                                  "Default: one per adapter.")
    max_lora_rank: Literal[1, 8, 16, 32, 64, 128, 256, 320, 512] | None = Field(
        None, description="Rank of every slot (--max-lora-rank). Default: the largest adapter rank, else 16.",
        json_schema_extra={"minimum": 1, "maximum": 512})
    max_cpu_loras: int | None = Field(None, alias="maxCPULoras", ge=1, le=1024,
                                      description="Adapters cached in host memory (--max-cpu-loras), >= maxLoras.")
    s3: S3Options | None = Field(
        None, description="Endpoint, region and credentials of the store the s3:// adapters are in (one for all of "
        "them; the model's is spec.model.s3).")
    runtime_updates: bool = Field(
        False, description="Add and remove adapters on the running pods through vLLM's /v1/load_lora_adapter and "
        "/v1/unload_lora_adapter (VLLM_ALLOW_RUNTIME_LORA_UPDATING), without a rollout, where the vLLM version "
        "supports it (status.lora.updates says which applies). Off by default: vLLM calls these endpoints a "
        "development feature (whoever reaches a pod's port may load an adapter). A change of maxLoras or "
        "maxLoraRank (also through their defaults) is still a rollout: set both to keep adapter changes runtime.")

    @property
    def slots(self) -> int:
        return self.max_loras or max(1, len(self.adapters))

    @model_validator(mode="after")
    def _consistent(self) -> LoRASpec:
        names = [a.name for a in self.adapters]
        if len(set(names)) != len(names):
            raise invalid(f"lora.adapters: names must be unique, got {names}")
        pinned = sum(a.pinned for a in self.adapters)
        if pinned > self.slots:
            raise invalid(f"lora: {pinned} pinned adapters need {pinned} slots but maxLoras is {self.slots}; "
                          f"raise maxLoras to {pinned} or unpin some")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.slots:
            raise invalid(f"lora.maxCPULoras ({self.max_cpu_loras}) must be at least maxLoras ({self.slots})")
        if self.s3 is not None and not any(a.source.startswith("s3://") for a in self.adapters):
            raise invalid("lora.s3 only applies to s3:// adapters, and none is listed: remove it")
        return self


#: Kopf keeps a copy of the spec in an annotation (ASCII-escaped JSON) and `kubectl apply` another; the API
#: server caps all annotations of an object at 256 KiB together.
SPEC_MAX_BYTES = 64 * 1024


class BurnInSpec(APIModel):
    """A bounded load on each new pod before it gets traffic (desired/burn_in.py): a readiness gate keeps the pod
    out of the Services until it passes."""

    concurrency: int | None = Field(
        None, ge=1, le=1024,
        description="Requests sent at once, each of about maxModelLen tokens (at most the plan's max_num_seqs). "
                    "Default: spec.serving.expectedConcurrency, else 1.")
    max_tokens: int = Field(16, ge=1, le=1024, description="Tokens generated per request. Default 16.")
    timeout_seconds: int = Field(300, ge=10, le=3600, description="The whole run's time limit. Default 300.")
    max_total_tokens: int = Field(
        2_000_000, ge=1, le=TOKENS_MAX,
        description="The most tokens (prompts and outputs) one pod's run may cost; prompts are shortened to stay "
                    "within it. Default 2,000,000.")


class RolloutSpec(APIModel):
    """How a change of the vLLM release reaches the running fleet (desired/canary.py)."""

    canary: bool = Field(
        True, description="On unless false: a change of spec.vllm.version or spec.vllm.image first runs one pod of "
                          "the new release (the `<name>-canary` Deployment, on a free GPU, else in place of one "
                          "replica, never the last), verified against the plan (and burned in where "
                          "verification.burnIn is set); only a canary that passed rolls the fleet, one that fails "
                          "holds it (UpgradeHeld). false: the fleet rolls to the new release at once.")


class VerificationSpec(APIModel):
    """How a plan is checked against the running vLLM's own KV-cache figures (planner/verify.py)."""

    burn_in: BurnInSpec | None = Field(
        None, description="Off unless set: each new pod of the plan is given a bounded load on its own IP before "
                          "it is Ready (BurnInPassed); a group across nodes, on its leader, and the verdict holds "
                          "every pod of the group; a KV cache too small for it is remediation evidence.")

    tolerance_percent: float = Field(
        VERIFICATION_TOLERANCE_PERCENT, ge=0.5, le=20,
        description="KV-memory error, in percent of one GPU's memory, beyond which PlanVerified is False. "
                    f"Default {VERIFICATION_TOLERANCE_PERCENT:g} (the plan's own minimum headroom).")


#: most client entries one LLMDeployment's NetworkPolicy lists. The bounds here and on api/core_types.LabelSelector
#: are small because every size of the spec is bounded (tests/unit/test_owned_input.py) and label keys are long
#: (317 characters): a namespace label or a pod label usually names a client in one entry
ALLOWED_CLIENTS_MAX = 4


class NetworkPeer(APIModel):
    """Pods allowed to reach vLLM's port: a NetworkPolicy ``from`` entry (NetworkPolicyPeer), written as the API
    server reads one."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [{
        "rule": "has(self.namespaceSelector) || has(self.podSelector)",
        "message": "name a namespaceSelector, a podSelector or both; for every pod of the cluster write "
                   "namespaceSelector: {}",
    }]})

    namespace_selector: LabelSelector | None = Field(
        None, description="Namespaces whose pods may connect (`{}`: every namespace). Alone: every pod there.")
    pod_selector: LabelSelector | None = Field(
        None, description="Pods that may connect: in the LLMDeployment's namespace, or with namespaceSelector in "
        "the namespaces it selects (`{}`: every pod).")

    @model_validator(mode="after")
    def _names_someone(self) -> NetworkPeer:
        if self.namespace_selector is None and self.pod_selector is None:
            raise invalid("name a namespaceSelector, a podSelector or both; for every pod of the cluster write "
                          "namespaceSelector: {}")
        return self

    def to_kubernetes(self) -> dict[str, Any]:
        """The NetworkPolicyPeer as the API server takes it."""
        peer: dict[str, Any] = {}
        if self.namespace_selector is not None:
            peer["namespaceSelector"] = self.namespace_selector.to_kubernetes()
        if self.pod_selector is not None:
            peer["podSelector"] = self.pod_selector.to_kubernetes()
        return peer


class NetworkAccess(APIModel):
    """Who may reach the model's vLLM when the operator renders NetworkPolicies (the Helm value
    `networkPolicy.enabled`; without it this section is accepted and has no effect)."""

    allowed_clients: list[NetworkPeer] | None = Field(
        None, max_length=ALLOWED_CLIENTS_MAX,
        description="Pods that may call vLLM's port, each a NetworkPolicy `from` entry. Unset: the pods of the "
        "LLMDeployment's own namespace. `[]`: no client (only Prometheus and the operator). Prometheus, the "
        "operator and the model's own pods are always allowed.")


class LLMDeploymentSpec(APIModel):
    model: ModelSource = Field(description="The model to serve.")
    gpu: GPUSelector = Field(default_factory=GPUSelector, description="GPUs the deployment may use.")
    serving: ServingTargets = Field(default_factory=ServingTargets, description="Context, concurrency, quality.")
    vllm: VLLMSettings = Field(default_factory=VLLMSettings, description="vLLM image, version and overrides.")
    replicas: int = Field(
        1, ge=0, le=1000,
        description="vLLM replicas (a group of pods each when one replica spans nodes). Default 1. The scale "
        "subresource writes it: kubectl scale, an HPA, or KEDA through spec.autoscaling.")
    autoscaling: AutoscalingPolicy | None = Field(
        None, description="Scale replicas with KEDA on KV-cache usage and waiting requests (Prometheus). "
        "Remediation then leaves replicas alone.")
    resources: ContainerResources | None = Field(None, description="CPU/memory of the vLLM container.")
    lora: LoRASpec | None = Field(None, description="LoRA adapters served on the base model, with their GPU slots.")
    rollout: RolloutSpec = Field(
        default_factory=RolloutSpec, description="How a new vLLM release reaches the fleet: a canary first.")
    verification: VerificationSpec = Field(
        default_factory=VerificationSpec,
        description="How the plan is checked against the running vLLM's KV-cache figures (PlanVerified).")
    remediation: RemediationPolicy = Field(
        default_factory=RemediationPolicy, description="How the operator reacts to OOM and KV saturation."
    )
    network: NetworkAccess | None = Field(
        None, description="Who may reach vLLM when the operator renders a NetworkPolicy for the model (Helm value "
        "`networkPolicy.enabled`).")

    @model_validator(mode="before")
    @classmethod
    def _fits_in_an_annotation(cls, data: Any) -> Any:
        try:
            size = len(json.dumps(data, separators=(",", ":")))
        except (TypeError, ValueError):
            return data  # not JSON (a Python caller's objects): the field checks say what is wrong
        if size > SPEC_MAX_BYTES:
            raise invalid(f"the spec is {size // 1024} KiB as JSON; at most {SPEC_MAX_BYTES // 1024} KiB "
                          "(the operator keeps a copy in an annotation, and Kubernetes caps annotations)")
        return data

    @model_validator(mode="after")
    def _cross_field_rules(self) -> LLMDeploymentSpec:
        floor = self.remediation.floors.min_max_model_len
        fixed = self.serving.fixed_max_model_len
        if floor and fixed and floor > fixed:
            raise invalid(f"remediation.floors.minMaxModelLen ({floor}) is larger than "
                          f"serving.maxModelLen ({fixed})")
        if self.autoscaling is not None and self.remediation.max_replicas is not None:
            raise invalid("remediation.maxReplicas has no effect with autoscaling (remediation leaves the "
                          "replicas to the autoscaler): remove it, or bound the replicas with autoscaling.maxReplicas")
        if self.model.hub_token_secret_ref is not None:
            for i, var in enumerate(self.vllm.env):
                if var.name == HUB_TOKEN_ENV:
                    raise invalid(f"vllm.env[{i}] sets {HUB_TOKEN_ENV}, which model.hubTokenSecretRef already "
                                  "sets; keep one")
        return self

    @model_validator(mode="after")
    def _lora_names(self) -> LLMDeploymentSpec:
        served = self.model.served_name
        cached = self.model.cache is not None and self.model.cache.enabled
        for i, adapter in enumerate(self.lora.adapters if self.lora else []):
            if adapter.name == served:
                raise invalid(f"lora.adapters[{i}].name {adapter.name!r} is the base model's served name; requests "
                              "could not tell them apart: rename the adapter")
            if isinstance(adapter.location, S3Source) and not cached:
                way = ("put the adapter on a PersistentVolumeClaim (pvc://claim/path): a pvc:// model has no cache"
                       if self.model.source and self.model.source.startswith("pvc://")
                       else "set model.cache.enabled: true")
                raise invalid(f"lora.adapters[{i}] ({adapter.name}): an s3:// adapter is downloaded into the model "
                              f"cache's PVC by a Job (vLLM does not load from S3): {way}")
        return self

