"""Copies of core/v1 types a pod takes from the spec (tolerations, environment variables, resources), with
the API server's own rules, so a rendered Deployment is never rejected."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from llm_autopilot.api import kubernetes_rules as rules
from llm_autopilot.api.fields import (
    APIModel,
    ConfigKey,
    EnvVarName,
    LabelKey,
    LabelValue,
    ObjectName,
    Quantity,
    TolerationKey,
    invalid,
    label_keys_rule,
    schema_pattern,
)
from llm_autopilot.api.serve_flags import (
    NO_VAR_REFERENCE,
    OWNED_ENV_PREFIXES,
    SECRET_ENV_NAME,
    env_name_problem,
    env_value_problem,
)


class SecretKeyRef(APIModel):
    name: ObjectName = Field(description="Name of a Secret in the LLMDeployment's namespace.")
    key: ConfigKey = Field("token", description="Key in the Secret. Defaults to `token`.")



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
        max_length=512, json_schema_extra=schema_pattern(rules.ENV_FIELD_PATH),
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
        None, max_length=2048, json_schema_extra=schema_pattern(NO_VAR_REFERENCE),
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



class LabelSelectorRequirement(APIModel):
    """One matchExpressions entry of a meta/v1 LabelSelector, with the API server's rules (ValidateLabelSelector)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",
         "message": "values must be set for In and NotIn, and empty for Exists and DoesNotExist"},
    ]})

    key: LabelKey = Field(max_length=rules.LABEL_KEY_MAX, json_schema_extra=schema_pattern(rules.LABEL_KEY),
                          description="The label key the requirement applies to.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="`In`, `NotIn`, `Exists` or `DoesNotExist`.")
    values: list[LabelValue] | None = Field(
        None, max_length=4, description="Label values; set for In and NotIn, empty for Exists and DoesNotExist.")

    @model_validator(mode="after")
    def _values_fit_the_operator(self) -> LabelSelectorRequirement:
        listed = bool(self.values)
        if self.operator in ("In", "NotIn") and not listed:
            raise invalid(f"operator {self.operator} needs values: the label values to match")
        if self.operator in ("Exists", "DoesNotExist") and listed:
            raise invalid(f"operator {self.operator} takes no values: remove them")
        return self


class LabelSelector(APIModel):
    """A meta/v1 LabelSelector, copied into a NetworkPolicy as written. An empty selector matches everything."""

    match_labels: dict[LabelKey, LabelValue] | None = Field(
        None, max_length=4, description="Labels that must all be present with these values.",
        json_schema_extra=label_keys_rule("matchLabels"),
    )
    match_expressions: list[LabelSelectorRequirement] | None = Field(
        None, max_length=2, description="Requirements that must all hold.")

    def to_kubernetes(self) -> dict[str, Any]:
        """The selector as a NetworkPolicy takes it (camelCase, unset fields left out)."""
        return self.model_dump(by_alias=True, exclude_none=True)
