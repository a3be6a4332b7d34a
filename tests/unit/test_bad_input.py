"""Bad input (docs: bad-input review D1, D2, D5, D6, D15, D20, D21, D22): refused at `kubectl apply` with the field's
path, or rendered into objects the API server accepts. The end-to-end proof on the real API server is
tests/e2e/test_admitted_deploys.py; these pin each rule down without a cluster."""

from __future__ import annotations

from typing import Any

import pytest

from llm_autopilot.api.crd import crd
from llm_autopilot.controller.admission import review
from llm_autopilot.remediation.ladder import Overrides
from llm_autopilot.render.kubernetes import quantity_gib
from llm_autopilot.render.vllm_args import conflicting_extra_args, unknown_flags
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION
from tests.render_driver import render_objects

V = str(DEFAULT_VLLM_VERSION)
L4 = {"product": "nvidia-l4"}


def spec(**parts: Any) -> dict[str, Any]:
    return {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": dict(L4), **parts}


def refused(body: dict[str, Any], path: str, *needles: str, name: str | None = None) -> str:
    verdict = review(body, V, name=name) if name is not None else review(body, V)
    assert not verdict.allowed, f"admitted: {body}"
    assert f"{path}:" in verdict.message, verdict.message
    for needle in needles:
        assert needle in verdict.message, verdict.message
    assert "\n" not in verdict.message
    return verdict.message


def pod_spec(body: dict[str, Any], name: str = "x", overrides: Overrides | None = None) -> dict[str, Any]:
    objects = render_objects(body, name=name, namespace="ns", overrides=overrides)
    assert isinstance(objects, list), objects
    result: dict[str, Any] = objects[0]["spec"]["template"]["spec"]
    return result


# --- D1: a GPU named by its memory renders no `In` without values ----------------------------------------


def test_memory_gib_without_a_product_renders_no_empty_affinity() -> None:
    body = spec(gpu={"memoryGiB": 80, "computeCapability": "9.0"})
    assert "affinity" not in pod_spec(body)
    verdict = review(body, V)
    assert verdict.allowed and any("spec.gpu.nodeSelector" in w for w in verdict.warnings)
    pinned = spec(gpu={"memoryGiB": 80, "computeCapability": "9.0", "nodeSelector": {"pool": "h100"}})
    assert pod_spec(pinned)["nodeSelector"] == {"pool": "h100"}
    assert not any("nodeSelector" in w for w in review(pinned, V).warnings)


def test_a_named_product_still_pins_the_pods() -> None:
    terms = pod_spec(spec())["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["NVIDIA-L4"]


# --- D2: names ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a" * 64, "qwen3.8b", "1llama", "Qwen3", "qwen_3", "qwen-", "a" * 253])
def test_names_that_cannot_name_the_service_are_refused(name: str) -> None:
    refused(spec(), "metadata.name", "DNS-1035", name=name)


@pytest.mark.parametrize("name", ["a", "qwen3-8b", "a" * 63, "l-1"])
def test_dns_1035_names_are_admitted_and_name_every_object(name: str) -> None:
    assert review(spec(), V, name=name).allowed
    objects = render_objects(spec(), name=name, namespace="ns")
    assert isinstance(objects, list)
    assert {o["metadata"]["name"] for o in objects} == {name}
    assert objects[0]["metadata"]["labels"]["app.kubernetes.io/instance"] == name


def test_the_crd_refuses_the_same_names() -> None:
    root = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    (rule,) = root["x-kubernetes-validations"]
    assert "self.metadata.name" in rule["rule"] and "^[a-z]([-a-z0-9]*[a-z0-9])?$" in rule["rule"]
    assert "63" in rule["rule"] and "DNS-1035" in rule["message"]


# --- D5: what the API server would reject in the Deployment -----------------------------------------------


@pytest.mark.parametrize(("body", "path", "needle"), [
    (spec(model={"name": "Qwen/Qwen3-8B", "hubTokenSecretRef": {"name": "hf"}},
          vllm={"env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "t", "key": "k"}}}]}),
     "spec", "hubTokenSecretRef"),
    (spec(vllm={"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}), "spec.vllm.env", "twice"),
    (spec(vllm={"env": [{"name": "A=B", "value": "1"}]}), "spec.vllm.env[0].name", "environment variable"),
    (spec(vllm={"env": [{"name": "1ABC", "value": "1"}]}), "spec.vllm.env[0].name", "digit"),
    (spec(vllm={"env": [{"name": "..", "value": "1"}]}), "spec.vllm.env[0].name", "'..'"),
    (spec(vllm={"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}),
     "spec.vllm.env[0]", "not both"),
    (spec(vllm={"env": [{"name": "A", "valueFrom": {"secretRef": {"name": "s"}}}]}),
     "spec.vllm.env[0].valueFrom.secretRef", "not permitted"),
    (spec(vllm={"env": [{"name": "A", "valueFrom": {}}]}), "spec.vllm.env[0].valueFrom", "exactly one"),
    (spec(vllm={"env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"},
                                                    "secretKeyRef": {"name": "s", "key": "k"}}}]}),
     "spec.vllm.env[0].valueFrom", "exactly one"),
    (spec(vllm={"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "Bad_Name", "key": "k"}}}]}),
     "spec.vllm.env[0].valueFrom.secretKeyRef.name", "object name"),
    (spec(vllm={"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "a/b"}}}]}),
     "spec.vllm.env[0].valueFrom.secretKeyRef.key", "key"),
    (spec(vllm={"env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.containers"}}}]}),
     "spec.vllm.env[0].valueFrom.fieldRef.fieldPath", "metadata.name"),
    (spec(vllm={"env": [{"name": "A", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu",
                                                                         "divisor": "1Gi"}}}]}),
     "spec.vllm.env[0].valueFrom.resourceFieldRef", "1m"),
    (spec(resources={"requests": {"cpu": -1}}), "spec.resources.requests.cpu", "negative"),
    (spec(resources={"requests": {"memory": "lots"}}), "spec.resources.requests.memory", "quantity"),
    (spec(resources={"limits": {"memory": "-1Gi"}}), "spec.resources.limits.memory", "quantity"),
    (spec(resources={"requests": {"memory": "64Gi"}, "limits": {"memory": "32Gi"}}), "spec.resources",
     "requests.memory (64Gi) is more than limits.memory (32Gi)"),
    (spec(resources={"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}}), "spec.resources", "requests.cpu"),
    (spec(resources={"requests": {"nvidia.com/gpu": 1}}), "spec.resources.requests", "from the plan"),
    (spec(gpu={**L4, "nodeSelector": {"pool": "not a label value"}}), "spec.gpu.nodeSelector.pool", "label value"),
    (spec(gpu={**L4, "nodeSelector": {"bad key": "v"}}), "spec.gpu.nodeSelector.bad key", "label key"),
    (spec(gpu={**L4, "nodeSelector": {"-x.io/pool": "v"}}), "spec.gpu.nodeSelector.-x.io/pool", "prefix"),
    (spec(gpu={**L4, "tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}), "spec.gpu.tolerations[0]",
     "value must be empty"),
    (spec(gpu={**L4, "tolerations": [{"key": "k", "tolerationSeconds": 30}]}), "spec.gpu.tolerations[0]",
     "NoExecute"),
    (spec(gpu={**L4, "tolerations": [{"operator": "Equal", "value": "v"}]}), "spec.gpu.tolerations[0]",
     "key is required"),
    (spec(gpu={**L4, "tolerations": [{"key": "k", "value": "a b"}]}), "spec.gpu.tolerations[0].value",
     "label value"),
    (spec(gpu={**L4, "tolerations": [{"key": "a b", "operator": "Exists"}]}), "spec.gpu.tolerations[0].key",
     "label key"),
    (spec(vllm={"image": " vllm/vllm-openai:v0.33.0 "}), "spec.vllm.image", "image reference"),
    (spec(vllm={"image": "vllm/vllm openai"}), "spec.vllm.image", "without spaces"),
    (spec(gpu={"product": "NVIDIA L4"}), "spec.gpu.product", "nvidia-l4"),
    (spec(model={"name": "Qwen/Qwen3-8B", "hubTokenSecretRef": {"name": "hf", "key": "a b"}}),
     "spec.model.hubTokenSecretRef.key", "key"),
])
def test_what_the_api_server_would_reject_is_refused_with_its_path(body: dict[str, Any], path: str,
                                                                    needle: str) -> None:
    refused(body, path, needle)


def test_valid_env_sources_render_as_given() -> None:
    env = [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
           {"name": "CPUS", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}}},
           {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "api", "key": "key", "optional": True}}},
           {"name": "CFG", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "a.json"}}},
           {"name": ".hidden", "value": ""}]
    body = spec(vllm={"env": env})
    assert review(body, V).allowed
    # then the pod's own HOME on its emptyDir (the restricted pod runs as non-root; the spec's HOME would win)
    assert pod_spec(body)["containers"][0]["env"] == [*env, {"name": "HOME", "value": "/home/vllm"}]


def test_default_requests_never_exceed_a_smaller_limit() -> None:
    resources = pod_spec(spec(resources={"limits": {"cpu": 1, "memory": "8Gi"}}))["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": 1, "memory": "8Gi", "nvidia.com/gpu": "1"}
    assert resources["limits"] == {"cpu": 1, "memory": "8Gi", "nvidia.com/gpu": "1"}
    roomy = pod_spec(spec(resources={"limits": {"memory": "500Gi"}}))["containers"][0]["resources"]
    assert roomy["requests"]["memory"] == "24Gi"


def test_a_remediated_memory_limit_never_drops_below_the_request() -> None:
    body = spec(resources={"requests": {"memory": "2000Gi"}})
    limits = pod_spec(body, overrides=Overrides(memory_limit_gib=1843))["containers"][0]["resources"]["limits"]
    assert limits["memory"] == "2000Gi"


@pytest.mark.parametrize(("text", "gib"), [("36Gi", 36), ("1Pi", 2**20), ("1e9", 1e9 / 2**30), ("512Mi", 0.5),
                                          ("1.5Ti", 1536), ("lots", 0), ("-1Gi", 0)])
def test_memory_quantities_are_read_exactly(text: str, gib: float) -> None:
    assert quantity_gib(text) == pytest.approx(gib)


# --- D6: variants are model ids -------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["--trust-remote-code", "/etc", "../../x", "https://x.io/m", "org/..", "a/b c"])
def test_variants_are_validated_like_the_model_name(variant: str) -> None:
    body = {"model": {"name": "Qwen/Qwen3-32B", "variants": {"fp8": variant}},
            "gpu": {"product": "nvidia-l40s", "maxGPUs": 1},
            "serving": {"maxModelLen": 8192, "allowedQuantizations": ["fp8"]}}
    refused(body, "spec.model.variants.fp8", "Hugging Face Hub id")
    refused({"model": {"name": variant}}, "spec.model.name", "Hugging Face Hub id")


# --- D15, D21: extraArgs that leak secrets or break the pod ----------------------------------------------


@pytest.mark.parametrize(("args", "needle"), [
    (["--api-key", "sk-SECRET"], "VLLM_API_KEY"),
    (["--api-key=sk-SECRET"], "VLLM_API_KEY"),
    (["--api_key", "sk-SECRET"], "VLLM_API_KEY"),
    (["--hf-token", "hf_x"], "hubTokenSecretRef"),
    (["--hf_token=hf_x"], "hubTokenSecretRef"),
    (["--port", "9000"], "port 8000"),
    (["--port=9000"], "port 8000"),
    (["--host", "127.0.0.1"], "pod IP"),
    (["--uds", "/tmp/v.sock"], "port 8000"),
    ([""], "empty"),
    (["--enable-prefix-caching", "a\x00b"], "NUL"),
])
def test_extra_args_that_leak_secrets_or_break_the_pod_are_refused(args: list[str], needle: str) -> None:
    message = refused(spec(vllm={"extraArgs": args}), f"spec.vllm.extraArgs[{len(args) - 1 if needle == 'NUL' else 0}]",
                      needle)
    assert "sk-SECRET" not in message and "hf_x" not in message  # the refusal does not echo the secret


def test_flags_are_matched_as_vllm_spells_them() -> None:
    # named as written, matched as vLLM reads them (both are owned: the length, and CUDA graphs' memory)
    assert conflicting_extra_args(["--max_model_len=4096", "--compilation_config.level=3"]) == [
        "--compilation_config.level", "--max_model_len"]
    assert unknown_flags(["--enable_prefix_caching", "--compilation-config.level=3", "-O3"], V) == []
    assert unknown_flags(["--api-ke", "x"], V) == ["--api-ke"]  # argparse abbreviations are not admitted


def test_huge_specs_are_refused() -> None:
    refused(spec(vllm={"extraArgs": ["--chat-template", "x" * 100_000]}), "spec", "KiB")
    refused(spec(vllm={"extraArgs": ["--chat-template=" + "x" * 5000]}), "spec.vllm.extraArgs[0]", "4096")


def test_the_crd_bounds_sizes() -> None:
    vllm = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["vllm"]
    assert vllm["properties"]["extraArgs"]["maxItems"] == 64
    assert vllm["properties"]["extraArgs"]["items"]["maxLength"] == 4096
    assert vllm["properties"]["env"]["maxItems"] == 64
    assert vllm["properties"]["env"]["x-kubernetes-list-map-keys"] == ["name"]


# --- D20: overrides on catalog models; empty allowed-lists --------------------------------------------------


def test_an_override_on_a_catalog_model_is_merged_and_planned_at_admission() -> None:
    verdict = review(spec(model={"name": "Qwen/Qwen3-8B", "architecture": {"numKeyValueHeads": 4}}), V)
    assert verdict.allowed and not any("catalog" in w for w in verdict.warnings), verdict.warnings
    # the merged config is the one planned: the override's shorter context refuses a longer target
    short = spec(model={"name": "Qwen/Qwen3-8B", "architecture": {"maxPositionEmbeddings": 8192}},
                 serving={"maxModelLen": 16384})
    assert not review(short, V).allowed


def test_an_override_on_a_catalog_model_renders_without_the_hub() -> None:
    body = spec(model={"name": "Qwen/Qwen3-8B", "architecture": {"maxPositionEmbeddings": 16384}})
    args = pod_spec(body)["containers"][0]["args"]
    assert args[args.index("--max-model-len") + 1] == "16384"


@pytest.mark.parametrize("field", ["allowedQuantizations", "allowedKVCacheDtypes"])
def test_empty_allowed_lists_are_refused(field: str) -> None:
    refused(spec(serving={field: []}), f"spec.serving.{field}", "at least 1")


# --- D22: the CRD carries every cross-field rule -------------------------------------------------------------


def test_the_crd_refuses_floors_above_the_target_length() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules_text = [r["rule"] for r in schema["x-kubernetes-validations"]]
    assert any("floors.minMaxModelLen <= self.serving.maxModelLen" in r for r in rules_text), rules_text
    refused(spec(serving={"maxModelLen": 4096}, remediation={"floors": {"minMaxModelLen": 9000}}), "spec", "floors")


def _bounds(node: Any) -> Any:
    if isinstance(node, dict):
        yield from ((k, v) for k, v in node.items() if k in ("minimum", "maximum"))
        for value in node.values():
            yield from _bounds(value)
    elif isinstance(node, list):
        for value in node:
            yield from _bounds(value)


def test_every_crd_bound_survives_the_api_servers_float64() -> None:
    # a bound like 2^63-1 becomes 2^63 as float64, and the API server then refuses every value of that field
    for key, bound in _bounds(crd()):
        assert float(bound) == bound, (key, bound)
    assert review(spec(gpu={**L4, "tolerations": [{"key": "k", "effect": "NoExecute", "tolerationSeconds": 30}]}),
                  V).allowed
