"""The LLMDeployment API models and the CRD generated from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from llm_autopilot.api.crd import PRINTER_COLUMNS, crd, render
from llm_autopilot.api.v1alpha1 import LLMDeployment, LLMDeploymentSpec, LLMDeploymentStatus

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "llm-autopilot.io_llmdeployments.yaml"


def spec(**changes: Any) -> dict[str, Any]:
    return {"model": {"name": "Qwen/Qwen3-8B"}, **changes}


def test_minimal_spec_gets_documented_defaults() -> None:
    s = LLMDeploymentSpec.model_validate(spec())
    assert s.gpu.max_gpus == 8 and s.replicas == 1
    assert s.serving.allowed_quantizations == ["none"] and s.serving.allowed_kv_cache_dtypes == ["auto"]
    assert s.remediation.enabled and s.remediation.max_steps == 5


def test_camel_case_wire_names() -> None:
    s = LLMDeploymentSpec.model_validate(spec(
        gpu={"product": "nvidia-l4", "maxGPUs": 2, "memoryGiB": 22.0, "computeCapability": "8.9"},
        serving={"maxModelLen": 32768, "minMaxModelLen": 8192, "allowedKVCacheDtypes": ["auto", "fp8"]},
        vllm={"extraArgs": ["--enable-prefix-caching"], "gpuMemoryUtilization": 0.85},
    ))
    assert s.gpu.max_gpus == 2 and s.gpu.memory_gib == 22.0
    assert s.serving.min_max_model_len == 8192 and s.vllm.gpu_memory_utilization == 0.85
    dumped = s.model_dump(by_alias=True, exclude_none=True)
    assert dumped["gpu"]["maxGPUs"] == 2 and dumped["serving"]["allowedKVCacheDtypes"] == ["auto", "fp8"]


@pytest.mark.parametrize(("changes", "needle"), [
    ({"model": {"name": "not a model id"}}, "name"),
    ({"serving": {"maxModelLen": 4096, "minMaxModelLen": 8192}}, "minMaxModelLen"),
    ({"serving": {"allowedQuantizations": ["int3"]}}, "allowedQuantizations"),
    ({"gpu": {"maxGPUs": 0}}, "maxGPUs"),
    ({"gpu": {"computeCapability": "8.9"}}, "computeCapability"),
    ({"vllm": {"gpuMemoryUtilization": 1.5}}, "gpuMemoryUtilization"),
    ({"vllm": {"version": "latest"}}, "version"),
    ({"replicas": -1}, "replicas"),
    ({"modle": {}}, "modle"),
    ({"remediation": {"floors": {"minMaxModelLen": 9000}}, "serving": {"maxModelLen": 4096}}, "floors"),
])
def test_user_mistakes_are_named(changes: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        LLMDeploymentSpec.model_validate({**spec(), **changes})


def test_whole_object_round_trip() -> None:
    obj = {"apiVersion": "llm-autopilot.io/v1alpha1", "kind": "LLMDeployment",
           "metadata": {"name": "qwen3", "namespace": "ml"}, "spec": spec()}
    parsed = LLMDeployment.model_validate(obj)
    assert parsed.spec.model.name == "Qwen/Qwen3-8B" and parsed.metadata["name"] == "qwen3"
    with pytest.raises(ValidationError):
        LLMDeployment.model_validate({**obj, "apiVersion": "v1"})


def test_committed_crd_matches_the_models() -> None:
    assert CRD_FILE.read_text() == render(), "crds/ is stale: run `make crds`"


def _walk(node: Any, path: str = "") -> Any:
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


#: the one default the CRD carries: the scale subresource reads spec.replicas (issue 15)
CRD_DEFAULTS = {".properties.spec.properties.replicas": 1}


def test_crd_schema_is_structural() -> None:
    for path, node in _walk(_schema()):
        for forbidden in ("$ref", "anyOf", "oneOf", "allOf", "$defs", "title", "default"):
            if forbidden == "default" and path in CRD_DEFAULTS:
                assert node["default"] == CRD_DEFAULTS[path]
                continue
            assert forbidden not in node or path.endswith(".properties"), f"{forbidden} at {path}"
        if node.get("type") == "object":
            assert not ("properties" in node and "additionalProperties" in node), path
        assert node.get("additionalProperties") is not False, path
        if "properties" in node and not path.endswith(".properties"):
            for name, prop in node["properties"].items():
                assert "type" in prop or prop.get("x-kubernetes-int-or-string"), f"{path}.{name} has no type"


def test_every_spec_and_status_field_is_described() -> None:
    root = _schema()
    for part in ("spec", "status"):
        for path, node in _walk(root["properties"][part]):
            if path.endswith(".properties"):
                for name, prop in node.items():
                    assert prop.get("description"), f"{part}{path}.{name} has no description"


def test_printer_columns_and_names() -> None:
    c = crd()
    assert c["spec"]["names"]["shortNames"] == ["llmd"] and c["spec"]["group"] == "llm-autopilot.io"
    version = c["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}, "scale": {
        "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector"}}
    assert [col["name"] for col in PRINTER_COLUMNS] == ["Model", "GPUs", "Quantization", "MaxLen", "Replicas",
                                                        "Available", "Ready", "Rung", "Cached%", "KV-Planned",
                                                        "KV-vLLM", "KV-Err%", "Verified", "Age"]
    # an empty cell in the default view leaves a row a value short of its header
    wide_only = [col["name"] for col in PRINTER_COLUMNS if col.get("priority", 0) > 0]
    assert wide_only == ["Cached%", "KV-Planned", "KV-vLLM", "KV-Err%", "Verified"]


def test_status_model_fits_the_status_schema() -> None:
    """Every field the status model can hold is in the CRD (Kopf patches /status; unknown fields are pruned)."""
    props = _schema()["properties"]["status"]["properties"]
    for name in LLMDeploymentStatus.model_fields:
        alias = LLMDeploymentStatus.model_fields[name].alias or name
        assert alias in props
    plan_props = props["plan"]["properties"]
    assert {"summary", "quantization", "maxModelLen", "memory", "reasons", "args"} <= set(plan_props)
    assert props["conditions"]["x-kubernetes-list-map-keys"] == ["type"]
    assert props["remediation"]["properties"]["history"]["maxItems"] == 20


def test_crd_file_is_valid_yaml_with_header() -> None:
    text = CRD_FILE.read_text()
    assert text.startswith("# Generated by `make crds`")
    assert yaml.safe_load(text)["kind"] == "CustomResourceDefinition"
