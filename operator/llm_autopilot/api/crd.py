"""Generate the LLMDeployment CustomResourceDefinition from the pydantic models.

Pydantic emits JSON Schema 2020-12; Kubernetes wants a structural OpenAPI v3 subset. The
conversion inlines ``$ref``s, drops titles, defaults, ``null`` branches and
``additionalProperties: false`` (the API server prunes unknown fields), turns ``int | str``
into ``x-kubernetes-int-or-string``, free-form objects into ``x-kubernetes-preserve-unknown-fields``,
and numeric exclusive bounds into the OpenAPI v3.0 boolean form.
Run ``python -m llm_autopilot.api.crd`` (``make crds``) to regenerate crds/.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from llm_autopilot.api import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION
from llm_autopilot.api.kubernetes_rules import DNS1035_LABEL, DNS1035_LABEL_MAX
from llm_autopilot.api.v1alpha1 import HUB_TOKEN_ENV, LLMDeploymentSpec, LLMDeploymentStatus

_DROP = {"title", "default"}

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
    {"name": "GPUs", "type": "string", "jsonPath": ".status.plan.summary"},
    {"name": "Quantization", "type": "string", "jsonPath": ".status.plan.quantization"},
    {"name": "MaxLen", "type": "integer", "jsonPath": ".status.plan.maxModelLen"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
    {"name": "Available", "type": "integer", "jsonPath": ".status.readyReplicas"},
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Rung", "type": "integer", "jsonPath": ".status.remediation.rung"},
    # only in `-o wide`: most deployments have no cache, and an empty cell would leave their rows a value short
    {"name": "Cached%", "type": "number", "jsonPath": ".status.cache.percent", "priority": 1},
    # the plan's KV tokens against vLLM's own (status.verification): `kubectl get llmd -o wide`
    {"name": "KV-Planned", "type": "integer", "jsonPath": ".status.verification.predictedTokens", "priority": 1},
    {"name": "KV-vLLM", "type": "integer", "jsonPath": ".status.verification.actualTokens", "priority": 1},
    {"name": "KV-Err%", "type": "number", "jsonPath": ".status.verification.errorPercent", "priority": 1},
    {"name": "Verified", "type": "string", "jsonPath": '.status.conditions[?(@.type=="PlanVerified")].status',
     "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

# Cross-field rules the API server enforces at `kubectl apply` (CEL), mirroring the models' validators.
_SPEC_RULES = [
    {
        "rule": "!has(self.serving) || !has(self.serving.minMaxModelLen) || !has(self.serving.maxModelLen) "
        "|| type(self.serving.maxModelLen) == string || self.serving.minMaxModelLen <= self.serving.maxModelLen",
        "message": "serving.minMaxModelLen must not be larger than serving.maxModelLen",
    },
    {
        "rule": "!has(self.gpu) || !has(self.gpu.computeCapability) || has(self.gpu.memoryGiB)",
        "message": "gpu.computeCapability is only used with gpu.memoryGiB",
    },
    {
        "rule": "!has(self.remediation) || !has(self.remediation.floors) "
        "|| !has(self.remediation.floors.minMaxModelLen) || !has(self.serving) || !has(self.serving.maxModelLen) "
        "|| type(self.serving.maxModelLen) == string "
        "|| self.remediation.floors.minMaxModelLen <= self.serving.maxModelLen",
        "message": "remediation.floors.minMaxModelLen must not be larger than serving.maxModelLen",
    },
    {
        "rule": f"!has(self.model.hubTokenSecretRef) || !has(self.vllm) || !has(self.vllm.env) "
        f"|| self.vllm.env.all(e, e.name != '{HUB_TOKEN_ENV}')",
        "message": f"vllm.env must not set {HUB_TOKEN_ENV} when model.hubTokenSecretRef sets it",
    },
    {
        "rule": "!has(self.autoscaling) || !has(self.remediation) || !has(self.remediation.maxReplicas)",
        "message": "remediation.maxReplicas has no effect with autoscaling: bound replicas with "
                   "autoscaling.maxReplicas",
    },
]

#: `kubectl scale`, an HPA and KEDA drive spec.replicas through this; the operator reports status.replicas (pods,
#: or groups of pods across nodes) and the selector of the pods that serve.
SCALE_SUBRESOURCE = {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                     "labelSelectorPath": ".status.selector"}

# The name is also the Service's name and a label value (render/kubernetes.py): a DNS-1035 label. CEL on
# metadata is allowed at the root of the schema, for metadata.name and metadata.generateName only.
_ROOT_RULES = [{
    "rule": f"size(self.metadata.name) <= {DNS1035_LABEL_MAX} && self.metadata.name.matches('{DNS1035_LABEL}')",
    "message": f"metadata.name must be a DNS-1035 label (it also names the Service): at most {DNS1035_LABEL_MAX} "
               "lowercase letters, digits and '-', starting with a letter and ending with a letter or digit",
}]


def _is_null(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "null"


def _convert(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_convert(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _convert(merged, defs)
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if not _is_null(b)]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        types = {b.get("type") for b in branches}
        if types == {"integer", "string"}:
            return _convert({**rest, "x-kubernetes-int-or-string": True}, defs)
        if len(branches) == 1:
            return _convert({**branches[0], **rest}, defs)
        raise ValueError(f"cannot express anyOf {branches} in a structural schema")
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP or key == "$defs":
            continue
        if key == "properties":
            out[key] = {name: _convert(prop, defs) for name, prop in value.items()}
        elif key == "const":
            out["enum"] = [value]  # a CRD's schema has no const (the API server would drop it)
        elif key == "exclusiveMinimum":
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum":
            out["maximum"], out["exclusiveMaximum"] = value, True
        elif key == "additionalProperties" and value is True:
            out["x-kubernetes-preserve-unknown-fields"] = True
        elif key == "additionalProperties" and value is False:
            continue  # Kubernetes prunes unknown fields instead; `false` is not allowed in a CRD
        else:
            out[key] = _convert(value, defs)
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("type") == "object" and out.get("additionalProperties") == {}:
        del out["additionalProperties"]
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def structural_schema(model: type[LLMDeploymentSpec] | type[LLMDeploymentStatus]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    schema: dict[str, Any] = _convert(raw, raw.get("$defs", {}))
    return schema


def crd() -> dict[str, Any]:
    spec = structural_schema(LLMDeploymentSpec)
    # the one default the API server must know: the scale subresource (kubectl scale, an HPA, KEDA) reads
    # .spec.replicas, and answers 500 for an object that has none
    spec["properties"]["replicas"]["default"] = LLMDeploymentSpec.model_fields["replicas"].default
    spec["description"] = "Desired state: the model, the GPUs it may use, serving targets and policies."
    spec["x-kubernetes-validations"] = _SPEC_RULES
    status = structural_schema(LLMDeploymentStatus)
    status["description"] = "Observed state, written by the operator."
    conditions = status["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    conditions["items"]["required"] = ["type", "status", "reason"]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL, "singular": SINGULAR,
                      "shortNames": list(SHORT_NAMES), "categories": ["llm-autopilot"]},
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}, "scale": SCALE_SUBRESOURCE},
                "additionalPrinterColumns": PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "LLMDeployment serves one model with vLLM on GPUs, sized by llm-autopilot's "
                                   "memory planner and rolled to safer settings after OOMs.",
                    "properties": {
                        "apiVersion": {"type": "string", "description": "API version of this object."},
                        "kind": {"type": "string", "description": "Kind of this object."},
                        "metadata": {"type": "object"},
                        "spec": spec,
                        "status": status,
                    },
                    "required": ["spec"],
                    "x-kubernetes-validations": _ROOT_RULES,
                }},
            }],
        },
    }


def render() -> str:
    header = "# Generated by `make crds` from operator/llm_autopilot/api/v1alpha1.py. Do not edit.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=120)


if __name__ == "__main__":
    sys.stdout.write(render())
