"""LLMDeployment v1alpha1: what platform teams write (spec) and what the operator reports (status).

Every field has a description: the CRD generated from these models carries them, so
``kubectl explain llmd.spec`` documents the API. Defaults live here, not in the CRD, so the API
server never writes them into stored objects and GitOps tools see no drift; the one exception is
``spec.replicas``, which the scale subresource reads (api/crd.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from llm_autopilot.api import kubernetes_rules as rules
from llm_autopilot.api.serve_flags import (
    NO_VAR_REFERENCE,
    OWNED_ENV_PREFIXES,
    PASSED_FLAGS,
    SECRET_ENV_NAME,
    env_name_problem,
    env_value_problem,
    extra_arg_problem,
)
from llm_autopilot.api.sources import (
    HubSource,
    S3Source,
    Source,
    adapter_source_problem,
    parse_adapter_source,
    parse_source,
    source_problem,
)
from llm_autopilot.catalog.gpus import GFD_PRODUCT
from llm_autopilot.domain.knobs import KNOBS, Kind, Knob
from llm_autopilot.domain.precision import GIB
from llm_autopilot.planner.verify import TOLERANCE_PERCENT as VERIFICATION_TOLERANCE_PERCENT
from llm_autopilot.planner.verify import StageResult, Verification

QuantizationName = Literal["none", "fp8", "awq", "gptq"]
KVCacheDtypeName = Literal["auto", "fp8"]
#: The environment variable vLLM (huggingface_hub) reads the Hub token from.
HUB_TOKEN_ENV = "HF_TOKEN"
_INT64_MAX = 2**63 - 1

# --- upper bounds: what the code downstream handles (Python's datetime and asyncio, PromQL durations, float64
# arithmetic in the planner, the API server's float64 reading of a CRD's bounds: every bound is exact in float64)
#: A context length or a batch in tokens: 2^30 (over a billion; vLLM and the planner count tokens in int64).
TOKENS_MAX = 2**30
#: Sequences at once: 2^20.
SEQUENCES_MAX = 2**20
#: A duration remediation waits (cooldown, stable window): 7 days. It times a resync (asyncio, datetime), and the
#: stable window is multiplied by the relax back-off (at most 16): 112 days, far inside timedelta's range.
DURATION_MAX_SECONDS = 7 * 24 * 3600
#: A PromQL range the operator queries on every resync: 1 day (inside Prometheus' default 15-day retention; a
#: queue that never drains for a day is saturation already).
QUERY_WINDOW_MAX_SECONDS = 24 * 3600
#: A quantity's value: 2^62 (4Ei bytes; exact in float64, inside Kubernetes' int64, and float() of it is finite).
QUANTITY_VALUE_MAX = 2**62
#: A pod's replicas: 1000, as spec.replicas.
REPLICAS_MAX = 1000


class APIModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields are mistakes."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


# --- field types with the API server's rules (api/kubernetes_rules.py) -----------------------------------


def invalid(message: str) -> PydanticCustomError:
    """A validation error whose message is shown as is (no "Value error, " prefix)."""
    return PydanticCustomError("invalid", message)


def _checked(problem: Callable[[str], str | None]) -> AfterValidator:
    def check(value: str) -> str:
        found = problem(value)
        if found is not None:
            raise invalid(found)
        return value

    return AfterValidator(check)


def _schema_pattern(pattern: str) -> dict[str, Any]:
    # in the CRD only: pydantic runs the check above, which says what is wrong in words
    return {"pattern": pattern}


_HUB_ID = r"^(hf://)?[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$"
_HUB_ID_RE = re.compile(_HUB_ID)


def _hub_id_problem(value: str) -> str | None:
    # huggingface_hub's validate_repo_id: no '--' or '..', name parts start and end with a letter, digit or '_'
    org, _, name = value.removeprefix("hf://").partition("/")
    if (_HUB_ID_RE.fullmatch(value) and ".." not in value and "--" not in value and len(name) <= 96
            and all(part[0] not in ".-" and part[-1] not in ".-" for part in (org, name))):
        return None
    return (f"{value!r} is not a Hugging Face Hub id: org/name (or hf://org/name), letters, digits, '_', '-' "
            "and '.', e.g. Qwen/Qwen3-8B")


def _optional_label_key_problem(key: str) -> str | None:
    return rules.label_key_problem(key) if key else None  # an empty toleration key (with Exists) matches all


def _product_problem(product: str) -> str | None:
    if product and rules.label_value_problem(product) is None:
        return None
    return (f"{product!r} cannot be matched against the nodes' {GFD_PRODUCT} label: name a catalog GPU "
            "(e.g. nvidia-l4) or a GPU Feature Discovery product value (e.g. NVIDIA-L4)")


def _cli_value_problem(value: str) -> str | None:
    # passed as the value of a vllm serve flag: a leading '-' would be read as another flag
    if value.startswith("-") or any(c in value for c in "\x00\n\r\t"):
        return f"{value!r} must not start with '-' or contain control characters"
    return None


HubID = Annotated[str, Field(min_length=1, max_length=256, json_schema_extra=_schema_pattern(_HUB_ID)),
                  _checked(_hub_id_problem)]
CLIValue = Annotated[str, Field(min_length=1, max_length=256), _checked(_cli_value_problem)]
ObjectName = Annotated[str, Field(min_length=1, max_length=rules.DNS1123_SUBDOMAIN_MAX,
                                  json_schema_extra=_schema_pattern(rules.DNS1123_SUBDOMAIN)),
                       _checked(rules.subdomain_problem)]
ConfigKey = Annotated[str, Field(min_length=1, max_length=rules.DNS1123_SUBDOMAIN_MAX,
                                 json_schema_extra=_schema_pattern(rules.CONFIG_KEY)),
                      _checked(rules.config_key_problem)]
#: dict keys carry no schema (a CRD has no propertyNames): the check is the model's, and CEL's
LabelKey = Annotated[str, _checked(rules.label_key_problem)]
LabelValue = Annotated[str, Field(max_length=rules.LABEL_VALUE_MAX,
                                  json_schema_extra=_schema_pattern(rules.LABEL_VALUE)),
                       _checked(rules.label_value_problem)]
TolerationKey = Annotated[str, Field(max_length=rules.LABEL_KEY_MAX,
                                     json_schema_extra=_schema_pattern(f"^$|{rules.LABEL_KEY}")),
                          _checked(_optional_label_key_problem)]
EnvVarName = Annotated[str, Field(min_length=1, max_length=256,
                                  json_schema_extra=_schema_pattern(rules.ENV_VAR_NAME)),
                       _checked(rules.env_var_name_problem)]
ImageReference = Annotated[str, Field(min_length=1, max_length=rules.IMAGE_MAX,
                                      json_schema_extra=_schema_pattern(rules.IMAGE_REFERENCE)),
                           _checked(rules.image_problem)]
GPUProduct = Annotated[str, Field(min_length=1, max_length=rules.LABEL_VALUE_MAX,
                                  json_schema_extra=_schema_pattern(rules.LABEL_VALUE)),
                       _checked(_product_problem)]
ExtraArg = Annotated[str, Field(max_length=4096, json_schema_extra=_schema_pattern(NO_VAR_REFERENCE)),
                    _checked(extra_arg_problem)]


def _quantity(value: Any) -> int | str:
    if (isinstance(value, bool) or not isinstance(value, int | str) or (isinstance(value, int) and value > _INT64_MAX)
            or (isinstance(value, str) and len(value) > rules.QUANTITY_MAX)):
        raise invalid(f"{value!r:.80} is not a quantity: an integer or a string such as 500m or 64Gi")
    problem = rules.quantity_problem(value)
    if problem is not None:
        raise invalid(problem)
    if rules.parse_quantity(value) > QUANTITY_VALUE_MAX:
        raise invalid(f"{value!r:.80} is too large: at most 4Ei (2^62), e.g. 64Gi")
    return value


#: A non-negative Kubernetes quantity (an int or a string); one check, one message.
Quantity = Annotated[int | str, PlainValidator(_quantity), WithJsonSchema({
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "minimum": 0, "maximum": QUANTITY_VALUE_MAX, "pattern": rules.QUANTITY, "maxLength": rules.QUANTITY_MAX,
})]


# --- spec -----------------------------------------------------------------------------------------


class SecretKeyRef(APIModel):
    name: ObjectName = Field(description="Name of a Secret in the LLMDeployment's namespace.")
    key: ConfigKey = Field("token", description="Key in the Secret. Defaults to `token`.")


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
        "`https://s3.<region>.amazonaws.com`. Buckets are addressed path-style (`<endpoint>/<bucket>/<key>`).")
    region: str = Field(
        "us-east-1", min_length=1, max_length=64, pattern=r"^[a-z0-9-]+$",
        description="Region the requests are signed for (SigV4). Default us-east-1.")
    credentials_secret_ref: S3CredentialsRef | None = Field(
        None, description="Secret with the access key id and secret access key. Omit for a public bucket "
        "(unsigned requests).")


ModelURI = Annotated[str, Field(min_length=6, max_length=1024), _checked(source_problem)]


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
        None, description="Use this PVC in the namespace instead of creating one (the download Job fills it).")


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


class Toleration(APIModel):
    """A pod toleration, with core/v1 ValidateTolerations' rules (so the Deployment is never rejected)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
         "message": "value must be empty when operator is Exists"},
        {"rule": "(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
         "message": "key is required unless operator is Exists"},
        {"rule": "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
         "message": "tolerationSeconds needs effect NoExecute"},
    ]})

    key: TolerationKey | None = Field(None, description="Taint key the toleration applies to.")
    operator: Literal["Exists", "Equal"] | None = Field(None, description="`Exists` or `Equal` (default).")
    value: LabelValue | None = Field(None, description="Taint value to match with `Equal`.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; empty matches all."
    )
    # bounds a float64 holds exactly: the API server reads a CRD's minimum/maximum as float64, and rejects
    # every value when a bound (like 2^63-1) does not round-trip to an integer
    toleration_seconds: int | None = Field(
        None, ge=-(10**9), le=10**9,
        description="How long a NoExecute taint is tolerated, in seconds (at most 10^9, about 31 years: the node "
        "lifecycle controller turns it into nanoseconds in an int64).")

    @model_validator(mode="after")
    def _kubernetes_rules(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise invalid(f"value must be empty when operator is Exists (got {self.value!r}); "
                          "Exists matches every value of the key")
        if not self.key and self.operator != "Exists":
            raise invalid("key is required unless operator is Exists (an empty key with Exists tolerates "
                          "every taint)")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise invalid("tolerationSeconds only applies to effect NoExecute; set effect: NoExecute or remove it")
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
        json_schema_extra={"x-kubernetes-validations": [{
            "rule": f"self.all(k, size(k) <= {rules.LABEL_KEY_MAX} && k.matches(r'{rules.LABEL_KEY}'))",
            "message": "nodeSelector keys must be label keys: an optional DNS-subdomain prefix and '/', "
                       "then letters, digits, '-', '_' or '.'",
        }]},
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


# --- environment variables: core/v1 EnvVar and EnvVarSource, the sources a pod env may use -------------


class EnvSecretKeySelector(APIModel):
    name: ObjectName = Field(description="Name of a Secret in the LLMDeployment's namespace.")
    key: ConfigKey = Field(description="Key in the Secret.")
    optional: bool | None = Field(None, description="Start the pod even when the Secret or key is missing.")


class EnvConfigMapKeySelector(APIModel):
    name: ObjectName = Field(description="Name of a ConfigMap in the LLMDeployment's namespace.")
    key: ConfigKey = Field(description="Key in the ConfigMap.")
    optional: bool | None = Field(None, description="Start the pod even when the ConfigMap or key is missing.")


class EnvFieldSelector(APIModel):
    api_version: Literal["v1"] | None = Field(None, description="Always v1.")
    field_path: str = Field(
        max_length=512, json_schema_extra=_schema_pattern(rules.ENV_FIELD_PATH),
        description="Pod field: metadata.name, metadata.namespace, metadata.uid, metadata.labels['KEY'], "
        "metadata.annotations['KEY'], spec.nodeName, spec.serviceAccountName, status.hostIP(s), status.podIP(s).",
    )

    @field_validator("field_path")
    @classmethod
    def _known_field(cls, path: str) -> str:
        problem = rules.field_path_problem(path)
        if problem is not None:
            raise invalid(problem)
        return path


class EnvResourceFieldSelector(APIModel):
    container_name: Literal["vllm"] | None = Field(None, description="The vLLM container (the only one).")
    resource: Literal["limits.cpu", "limits.memory", "limits.ephemeral-storage",
                      "requests.cpu", "requests.memory", "requests.ephemeral-storage"] = Field(
        description="Which request or limit of the vLLM container.")
    divisor: int | str | None = Field(None, json_schema_extra={"maxLength": 8, "minimum": 1, "maximum": 1},
                                      description="Unit: 1 or 1m for cpu; 1, 1Ki, 1Mi, 1Gi, 1M... for bytes.")

    @model_validator(mode="after")
    def _supported_divisor(self) -> EnvResourceFieldSelector:
        problem = None if self.divisor is None else rules.divisor_problem(self.resource, self.divisor)
        if problem is not None:
            raise invalid(problem)
        return self


class EnvVarSource(APIModel):
    """Exactly one source, as core/v1 validateEnvVarValueFrom requires."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [{
        "rule": "[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef), "
                "has(self.resourceFieldRef)].filter(x, x).size() == 1",
        "message": "valueFrom needs exactly one of secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef",
    }]})

    secret_key_ref: EnvSecretKeySelector | None = Field(None, description="A key of a Secret.")
    config_map_key_ref: EnvConfigMapKeySelector | None = Field(None, description="A key of a ConfigMap.")
    field_ref: EnvFieldSelector | None = Field(None, description="A field of the pod (downward API).")
    resource_field_ref: EnvResourceFieldSelector | None = Field(
        None, description="A request or limit of the vLLM container.")

    @model_validator(mode="after")
    def _one_source(self) -> EnvVarSource:
        given = [s for s in (self.secret_key_ref, self.config_map_key_ref, self.field_ref, self.resource_field_ref)
                 if s is not None]
        if len(given) != 1:
            raise invalid("valueFrom needs exactly one of secretKeyRef, configMapKeyRef, fieldRef or "
                          f"resourceFieldRef (got {len(given)})")
        return self


class EnvVar(APIModel):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [{
        "rule": "!has(self.valueFrom) || !has(self.value) || self.value == ''",
        "message": "set value or valueFrom, not both",
    }, {
        "rule": f"!has(self.value) || self.value == '' || !self.name.matches('(?i){SECRET_ENV_NAME}')",
        "message": "a credential (a name like *_API_KEY, *_TOKEN, *_SECRET, *PASSWORD) is set with "
                   "valueFrom.secretKeyRef, never a literal value",
    }, {
        "rule": " && ".join(f"!self.name.startsWith('{p}')" for p in OWNED_ENV_PREFIXES),
        "message": f"names starting with {' or '.join(OWNED_ENV_PREFIXES)} are set by the operator",
    }]})

    name: EnvVarName = Field(description="Environment variable name.")
    value: str | None = Field(
        None, max_length=2048, json_schema_extra=_schema_pattern(NO_VAR_REFERENCE),
        description="Literal value. No $( (the kubelet expands $(NAME): write $$( for a literal $(), and no "
        "credentials: names like *_API_KEY, *_TOKEN, *_SECRET or *PASSWORD need valueFrom.secretKeyRef.")
    value_from: EnvVarSource | None = Field(
        None, description="Where the value comes from: secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef."
    )

    @model_validator(mode="after")
    def _value_or_source(self) -> EnvVar:
        if self.value and self.value_from is not None:
            raise invalid(f"{self.name}: set value or valueFrom, not both")
        problem = env_name_problem(self.name) or env_value_problem(self.name, self.value or "")
        if problem is not None:
            raise invalid(problem)
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
    reasoning_parser: str | None = Field(
        None, pattern=r"^[a-z0-9][a-z0-9_.-]*$", max_length=64,
        description="vLLM's reasoning parser (--reasoning-parser), e.g. deepseek_r1 or qwen3: the model's reasoning "
        "is returned apart from its answer. vLLM checks the name against the parsers of its release when it starts "
        "(an unknown one fails the start, with vLLM's list of names in the pod's log).")

    def passed_args(self) -> tuple[str, ...]:
        """The fields passed to ``vllm serve`` as given (api/serve_flags.PASSED_FLAGS), in the table's order."""
        return tuple(arg for passed in PASSED_FLAGS for arg in passed.args(getattr(self, passed.field)))

    @field_validator("env")
    @classmethod
    def _unique_names(cls, env: list[EnvVar]) -> list[EnvVar]:
        first: dict[str, int] = {}
        for i, var in enumerate(env):
            if var.name in first:
                raise invalid(f"{var.name} is set twice (env[{first[var.name]}] and env[{i}]); keep one")
            first[var.name] = i
        return env


class ResourceList(APIModel):
    """CPU, memory and ephemeral storage; the GPUs come from the plan."""

    cpu: Quantity | None = Field(None, description="CPU cores, e.g. 8 or 500m.")
    memory: Quantity | None = Field(None, description="Memory, e.g. 64Gi.")
    ephemeral_storage: Quantity | None = Field(
        None, alias="ephemeral-storage", description="Local ephemeral storage, e.g. 100Gi.")

    @model_validator(mode="before")
    @classmethod
    def _known_resources(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(str(k) for k in data if k not in ("cpu", "memory", "ephemeral-storage",
                                                               "ephemeral_storage"))
            if unknown:
                raise invalid(f"{', '.join(unknown)} cannot be set here: only cpu, memory and ephemeral-storage "
                              "(the operator sets nvidia.com/gpu from the plan)")
        return data

    def quantities(self) -> dict[str, int | str]:
        """As the container spells them: {"cpu": "8", "memory": "64Gi", ...}, unset ones left out."""
        return self.model_dump(by_alias=True, exclude_none=True)


class ContainerResources(APIModel):
    requests: ResourceList | None = Field(
        None, description="CPU/memory requests of the vLLM container (GPUs are set from the plan)."
    )
    limits: ResourceList | None = Field(
        None, description="CPU/memory limits of the vLLM container (GPUs are set from the plan)."
    )

    @model_validator(mode="after")
    def _requests_within_limits(self) -> ContainerResources:
        requests = self.requests.quantities() if self.requests else {}
        limits = self.limits.quantities() if self.limits else {}
        for name, request in requests.items():
            if name in limits and rules.parse_quantity(request) > rules.parse_quantity(limits[name]):
                raise invalid(f"requests.{name} ({request}) is more than limits.{name} ({limits[name]}); "
                              "a request must not exceed its limit")
        return self


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


AdapterURI = Annotated[str, Field(min_length=3, max_length=1024), _checked(adapter_source_problem)]


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
    verification: VerificationSpec = Field(
        default_factory=VerificationSpec,
        description="How the plan is checked against the running vLLM's KV-cache figures (PlanVerified).")
    remediation: RemediationPolicy = Field(
        default_factory=RemediationPolicy, description="How the operator reacts to OOM and KV saturation."
    )

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
    kv_calibration: KVCalibrationStatus | None = Field(
        None, alias="kvCalibration", description="The KV calibration from earlier deployments this generation "
                                                 "plans with (fixed per spec generation).")


class LLMDeployment(APIModel):
    """A whole object, for validating files (CLI) and admission requests."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    api_version: Literal["llm-autopilot.io/v1alpha1"] = Field("llm-autopilot.io/v1alpha1", description="API version.")
    kind: Literal["LLMDeployment"] = Field("LLMDeployment", description="Kind.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: LLMDeploymentSpec = Field(description="Desired state.")
    status: LLMDeploymentStatus | None = Field(None, description="Observed state.")
