"""The ground every LLMDeployment model stands on: the camelCase base model, validation errors shown as
written, field types with the API server's rules (api/kubernetes_rules.py), and the upper bounds of numbers."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, WithJsonSchema
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from llm_autopilot.api import kubernetes_rules as rules
from llm_autopilot.api.serve_flags import NO_VAR_REFERENCE, extra_arg_problem
from llm_autopilot.catalog.gpus import GFD_PRODUCT

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


def checked(problem: Callable[[str], str | None]) -> AfterValidator:
    def check(value: str) -> str:
        found = problem(value)
        if found is not None:
            raise invalid(found)
        return value

    return AfterValidator(check)


def schema_pattern(pattern: str) -> dict[str, Any]:
    # in the CRD only: pydantic runs the check above, which says what is wrong in words
    return {"pattern": pattern}


_HUB_ID = r"^(hf://)?[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$"
_HUB_ID_RE = re.compile(_HUB_ID)


def label_keys_rule(field: str) -> dict[str, Any]:
    """The CEL rule a map of labels (nodeSelector, a selector's matchLabels) puts on its keys, naming ``field``."""
    return {"x-kubernetes-validations": [{
        "rule": f"self.all(k, size(k) <= {rules.LABEL_KEY_MAX} && k.matches(r'{rules.LABEL_KEY}'))",
        "message": f"{field} keys must be label keys: an optional DNS-subdomain prefix and '/', "
                   "then letters, digits, '-', '_' or '.'",
    }]}


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


HubID = Annotated[str, Field(min_length=1, max_length=256, json_schema_extra=schema_pattern(_HUB_ID)),
                  checked(_hub_id_problem)]
CLIValue = Annotated[str, Field(min_length=1, max_length=256), checked(_cli_value_problem)]
ObjectName = Annotated[str, Field(min_length=1, max_length=rules.DNS1123_SUBDOMAIN_MAX,
                                  json_schema_extra=schema_pattern(rules.DNS1123_SUBDOMAIN)),
                       checked(rules.subdomain_problem)]
ConfigKey = Annotated[str, Field(min_length=1, max_length=rules.DNS1123_SUBDOMAIN_MAX,
                                 json_schema_extra=schema_pattern(rules.CONFIG_KEY)),
                      checked(rules.config_key_problem)]
#: dict keys carry no schema (a CRD has no propertyNames): the check is the model's, and CEL's
LabelKey = Annotated[str, checked(rules.label_key_problem)]
LabelValue = Annotated[str, Field(max_length=rules.LABEL_VALUE_MAX,
                                  json_schema_extra=schema_pattern(rules.LABEL_VALUE)),
                       checked(rules.label_value_problem)]
TolerationKey = Annotated[str, Field(max_length=rules.LABEL_KEY_MAX,
                                     json_schema_extra=schema_pattern(f"^$|{rules.LABEL_KEY}")),
                          checked(_optional_label_key_problem)]
EnvVarName = Annotated[str, Field(min_length=1, max_length=256,
                                  json_schema_extra=schema_pattern(rules.ENV_VAR_NAME)),
                       checked(rules.env_var_name_problem)]
ImageReference = Annotated[str, Field(min_length=1, max_length=rules.IMAGE_MAX,
                                      json_schema_extra=schema_pattern(rules.IMAGE_REFERENCE)),
                           checked(rules.image_problem)]
GPUProduct = Annotated[str, Field(min_length=1, max_length=rules.LABEL_VALUE_MAX,
                                  json_schema_extra=schema_pattern(rules.LABEL_VALUE)),
                       checked(_product_problem)]
ExtraArg = Annotated[str, Field(max_length=4096, json_schema_extra=schema_pattern(NO_VAR_REFERENCE)),
                    checked(extra_arg_problem)]


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

