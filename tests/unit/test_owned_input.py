"""Issue 15, admission side: what runs is what the plan says.

- every ``vllm serve`` flag the operator owns is refused in extraArgs, in every spelling vLLM's parser accepts,
  with the spec field that sets it; the reconciler refuses it too when admission was bypassed;
- no ``$(`` the kubelet would expand, in extraArgs or env values; no env name the multi-node wiring reads;
- no credential as a literal env value;
- every number of the spec has an upper bound the code downstream handles, in the models and the CRD;
- the CRD gives spec.replicas its default (the scale subresource reads it) and bounds every size.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_autopilot.api.crd import crd
from llm_autopilot.api.serve_flags import NO_VAR_REFERENCE, OWNED_FLAGS, var_reference_problem
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.controller.admission import review
from llm_autopilot.render.vllm_args import ExtraArgRefused, ServeOptions
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION
from tests.unit.fakes import Run

V = str(DEFAULT_VLLM_VERSION)
BASE = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4"}}
H100 = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-h100-80gb"},
        "serving": {"maxModelLen": 16384, "minMaxModelLen": 4096}}


def with_vllm(**vllm: Any) -> dict[str, Any]:
    return {**BASE, "vllm": vllm}


def refusal(body: dict[str, Any]) -> str:
    verdict = review(body, V)
    assert not verdict.allowed, f"admitted: {body}"
    assert "\n" not in verdict.message
    return verdict.message


# --- owned flags ----------------------------------------------------------------------------------------------

#: (extraArgs, the spec field or words the refusal must name)
OWNED_CASES = [
    (["--max_model_len=1"], "spec.serving.maxModelLen"),
    (["--max-model-len", "1"], "spec.serving.maxModelLen"),
    (["--max-model=1"], "spec.serving.maxModelLen"),  # argparse's prefix abbreviation
    (["-tp", "99"], "spec.gpu.maxGPUs"),
    (["--tensor-parallel-size=99"], "spec.gpu.maxGPUs"),
    (["--tensor_parallel_size", "99"], "spec.gpu.maxGPUs"),
    (["-t", "4"], "spec.gpu.maxGPUs"),  # -t is a prefix of -tp only
    (["-pp", "2"], "spec.gpu.maxGPUs"),
    (["--kv_cache_dtype", "fp8"], "spec.serving.allowedKVCacheDtypes"),
    (["--kv-cache-dtype=fp8"], "spec.serving.allowedKVCacheDtypes"),
    (["--compilation-config", "{}"], "spec.vllm.enforceEager"),
    (["-cc.mode=0"], "spec.vllm.enforceEager"),
    (["-O0"], "spec.vllm.enforceEager"),
    (["-O3"], "spec.vllm.enforceEager"),
    (["--max-cudagraph-capture-size", "8"], "spec.vllm.enforceEager"),  # remediation's CUDA-graph rung sets it
    (["--cuda-graph-sizes=8"], "spec.vllm.enforceEager"),  # the same cap before vLLM 0.11
    (["--gpu-memory-utilization", "0.99"], "spec.vllm.gpuMemoryUtilization"),
    (["--gpu_memory_utilization=0.99"], "spec.vllm.gpuMemoryUtilization"),
    (["--max-num-seqs", "4096"], "spec.vllm.maxNumSeqs"),
    (["--max-num-batched-tokens=99999"], "spec.vllm.maxNumBatchedTokens"),
    (["--quantization", "fp8"], "spec.serving.allowedQuantizations"),
    (["-qfp8"], "spec.serving.allowedQuantizations"),  # a one-letter option with its value attached
    (["--enforce-eager"], "spec.vllm.enforceEager"),
    (["--no-enforce-eager"], "spec.vllm.enforceEager"),
    (["--cpu-offload-gb", "8"], "spec.serving.allowCPUOffload"),
    (["--served-model-name", "x"], "spec.model.servedModelName"),
    (["--revision", "v2"], "spec.model.revision"),
    (["--model", "org/other"], "spec.model.name"),
    (["--hf-overrides", "{}"], "spec.model.architecture"),
    (["--nnodes", "2"], "status.plan.nodes"),
    (["-n4"], "status.plan.nodes"),
    (["--node-rank=1"], "status.plan.nodes"),
    (["--node_rank", "1"], "status.plan.nodes"),
    (["-r", "1"], "status.plan.nodes"),
    (["--headless"], "status.plan.nodes"),
    (["--master-addr", "evil"], "status.plan.nodes"),
    (["--master_port=1"], "status.plan.nodes"),
    (["--data-parallel-size", "2"], "spec.replicas"),
    (["-dp", "2"], "spec.replicas"),
    (["--data-parallel-address=x"], "spec.replicas"),
    (["--kv-cache-memory-bytes=1G"], "spec.vllm.gpuMemoryUtilization"),
    (["--num-gpu-blocks-override", "1"], "spec.vllm.gpuMemoryUtilization"),
    (["--dtype", "half"], "spec.vllm.dtype"),
    (["--speculative-config", "{}"], "draft model"),
    (["--config", "/etc/x.yaml"], "config file"),
    (["--port", "9000"], "port 8000"),
    (["--api-key", "sk-SECRET"], "VLLM_API_KEY"),
]


@pytest.mark.parametrize(("args", "pointer"), OWNED_CASES, ids=[" ".join(a) for a, _ in OWNED_CASES])
def test_an_owned_flag_is_refused_in_every_spelling_with_the_field_that_sets_it(args: list[str],
                                                                                 pointer: str) -> None:
    message = refusal(with_vllm(extraArgs=["--enable-prefix-caching", *args]))
    assert message.startswith("spec.vllm.extraArgs[1]: "), message
    assert "owned by the operator" in message or "--port" in message or "--api-key" in message, message
    assert pointer in message, message
    assert "sk-SECRET" not in message


def test_an_ambiguous_abbreviation_of_owned_flags_is_refused_naming_them() -> None:
    message = refusal(with_vllm(extraArgs=["--max-num", "8"]))
    assert "--max-num-seqs" in message and "--max-num-batched-tokens" in message, message


def test_flags_the_operator_does_not_own_still_pass() -> None:
    verdict = review(with_vllm(extraArgs=["--enable-prefix-caching", "--seed", "-1", "--kv-offloading-size", "4",
                                          "--chat-template=$$(x)", "--api-server-count", "2"]), V)
    assert verdict.allowed, verdict.message


def test_every_owned_flag_of_the_table_is_refused() -> None:
    admitted = [f for f in OWNED_FLAGS if review(with_vllm(extraArgs=[f, "1"]), V).allowed]
    assert admitted == []


def test_the_renderer_refuses_an_owned_flag_whoever_built_the_options() -> None:
    with pytest.raises(ExtraArgRefused, match=r"spec\.serving\.maxModelLen"):
        ServeOptions(extra_args=("--max_model_len=1",))
    with pytest.raises(ExtraArgRefused, match=r"\$\$\("):
        ServeOptions(extra_args=("$(OVR)",))


def test_the_reconciler_says_planned_false_for_an_owned_flag_admission_never_saw() -> None:
    """A spec stored while the webhook was down (failurePolicy Ignore, or no webhook): nothing is applied."""
    run = Run({**H100, "vllm": {"extraArgs": ["-tp", "8", "--headless"]}})
    run.once()
    planned = run.condition("Planned")
    assert (planned["status"], planned["reason"]) == ("False", "InvalidSpec")
    assert planned["message"].startswith("spec.vllm.extraArgs[0]: -tp is owned by the operator"), planned
    assert "spec.vllm.extraArgs[2]: --headless" in planned["message"], planned
    assert ("Deployment", "x") not in run.cluster.objects


# --- $(VAR) and env ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["$(OVR)", "--x=$(OVR)", "$$$(OVR)", "a$(B", "$("])
def test_a_var_reference_the_kubelet_expands_is_refused(value: str) -> None:
    message = refusal(with_vllm(extraArgs=["--chat-template", value]))
    assert message.startswith("spec.vllm.extraArgs[1]: ") and "$$(" in message, message
    message = refusal(with_vllm(env=[{"name": "OVR", "value": value}]))
    assert message.startswith("spec.vllm.env[0]: ") and "$$(" in message, message


@pytest.mark.parametrize("value", ["$$(OVR)", "$", "a$", "$x", "$$", "cost $5", "$$$$(x)", "(x)"])
def test_an_escaped_or_lone_dollar_passes(value: str) -> None:
    assert var_reference_problem(value) is None
    assert review(with_vllm(env=[{"name": "A", "value": value}]), V).allowed


def test_the_issue_example_env_smuggling_an_owned_flag_is_refused() -> None:
    message = refusal(with_vllm(env=[{"name": "OVR", "value": "--max-model-len=1"}], extraArgs=["$(OVR)"]))
    assert "spec.vllm.extraArgs[0]" in message, message


@pytest.mark.parametrize("name", ["LWS_LEADER_ADDRESS", "LWS_WORKER_INDEX", "LLM_AUTOPILOT_NODE_RANK",
                                  "LLM_AUTOPILOT_LEADER_ADDRESS"])
def test_env_the_multi_node_wiring_reads_is_refused(name: str) -> None:
    message = refusal(with_vllm(env=[{"name": name, "value": "--max-model-len=1"}]))
    assert message.startswith("spec.vllm.env[0]: ") and "set by the operator" in message, message


SECRET_NAMES = ["VLLM_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY", "MY_APIKEY", "GH_TOKEN",
                "AWS_SECRET_ACCESS_KEY", "S3_SECRET_ACCESS_KEY", "DB_PASSWORD", "PASSWORD", "CLIENT_SECRET",
                "hf_token", "GOOGLE_APPLICATION_CREDENTIALS"]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_a_credential_as_a_literal_env_value_is_refused_like_api_key(name: str) -> None:
    message = refusal(with_vllm(env=[{"name": name, "value": "sk-SECRET"}]))
    assert message.startswith("spec.vllm.env[0]: ") and "secretKeyRef" in message, message
    assert "sk-SECRET" not in message
    sourced = [{"name": name, "valueFrom": {"secretKeyRef": {"name": "creds", "key": "k"}}}]
    assert review(with_vllm(env=sourced), V).allowed


@pytest.mark.parametrize("name", ["VLLM_LOGGING_LEVEL", "TOKENIZERS_PARALLELISM", "VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE",
                                  "HF_HUB_OFFLINE", "KEY", "MAX_TOKENS_X"])
def test_names_that_only_contain_token_or_key_are_not_credentials(name: str) -> None:
    assert review(with_vllm(env=[{"name": name, "value": "1"}]), V).allowed


# --- bounds ---------------------------------------------------------------------------------------------------

#: (a spec part with a number far too large, the path the refusal names)
HUGE = [
    ({"remediation": {"cooldownSeconds": 10**12}}, "spec.remediation.cooldownSeconds"),
    ({"remediation": {"cooldownSeconds": 604801}}, "spec.remediation.cooldownSeconds"),
    ({"remediation": {"stableWindowSeconds": 10**12}}, "spec.remediation.stableWindowSeconds"),
    ({"remediation": {"kvSaturationWindowSeconds": 10**12}}, "spec.remediation.kvSaturationWindowSeconds"),
    ({"remediation": {"kvSaturationWindowSeconds": 86401}}, "spec.remediation.kvSaturationWindowSeconds"),
    ({"remediation": {"maxReplicas": 10**9}}, "spec.remediation.maxReplicas"),
    ({"remediation": {"floors": {"minMaxNumSeqs": 10**12}}}, "spec.remediation.floors.minMaxNumSeqs"),
    ({"remediation": {"floors": {"minMaxNumBatchedTokens": 10**12}}},
     "spec.remediation.floors.minMaxNumBatchedTokens"),
    ({"serving": {"maxModelLen": 2**40}}, "spec.serving.maxModelLen"),
    ({"serving": {"minMaxModelLen": 2**40}}, "spec.serving.minMaxModelLen"),
    ({"serving": {"expectedConcurrency": 10**12}}, "spec.serving.expectedConcurrency"),
    ({"vllm": {"maxNumSeqs": 10**12}}, "spec.vllm.maxNumSeqs"),
    ({"vllm": {"maxNumBatchedTokens": 10**12}}, "spec.vllm.maxNumBatchedTokens"),
    ({"autoscaling": {"maxReplicas": 2, "targetWaitingRequests": 10**12}},
     "spec.autoscaling.targetWaitingRequests"),
    ({"gpu": {"product": "nvidia-l4", "tolerations": [{"key": "k", "effect": "NoExecute",
                                                       "tolerationSeconds": 10**12}]}},
     "spec.gpu.tolerations[0].tolerationSeconds"),
    ({"model": {"name": "org/m", "architecture": {"numHiddenLayers": 10**12}}},
     "spec.model.architecture.numHiddenLayers"),
    ({"model": {"name": "org/m", "architecture": {"weightBytes": 10**30}}}, "spec.model.architecture.weightBytes"),
    ({"resources": {"limits": {"memory": "9e999"}}}, "spec.resources.limits.memory"),
]


@pytest.mark.parametrize(("part", "path"), HUGE, ids=[p for _, p in HUGE])
def test_a_huge_number_is_refused_naming_its_field(part: dict[str, Any], path: str) -> None:
    message = refusal({**BASE, **part})
    assert message.startswith(f"{path}: "), message


def _numbers(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = []
    if isinstance(node, dict):
        if node.get("type") in ("integer", "number") or (node.get("x-kubernetes-int-or-string")
                                                          and "minimum" in node):
            found.append((path, node))
        for key, value in node.items():
            found += _numbers(value, f"{path}.{key}")
    return found


def test_every_number_of_the_spec_has_an_upper_bound_in_the_crd() -> None:
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    numbers = _numbers(spec, "spec")
    assert len(numbers) > 30
    assert [p for p, node in numbers if "maximum" not in node] == []
    # the API server reads bounds as float64: each must be exact there
    assert [p for p, node in numbers if float(node["maximum"]) != node["maximum"]] == []


# --- the CRD: replicas' default, sizes --------------------------------------------------------------------------


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = []
    if isinstance(node, dict):
        found.append((path, node))
        for key, value in node.items():
            found += _walk(value, f"{path}.{key}")
    return found


def test_the_crd_defaults_spec_replicas_for_the_scale_subresource() -> None:
    version = crd()["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["replicas"]["default"] == LLMDeploymentSpec.model_fields["replicas"].default == 1
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"


#: the most a spec can hold within the CRD's bounds (in characters, as maxLength counts them) stays well below
#: 1 MiB, the webhook's request limit: the API server refuses a larger spec naming the field, before any webhook
SPEC_BOUND_CHARS = 640 * 1024


def _largest(node: dict[str, Any]) -> int:
    """An upper bound of the JSON size of a value the schema admits (keys and punctuation counted generously)."""
    kind = node.get("type")
    if "enum" in node:
        return 2 + max(len(str(v)) for v in node["enum"])
    if kind == "string" or node.get("x-kubernetes-int-or-string"):
        return 2 + node.get("maxLength", 10**9)
    if kind in ("integer", "number", "boolean"):
        return 32
    if kind == "array":
        return 2 + node.get("maxItems", 10**9) * (1 + _largest(node["items"]))
    if kind == "object" and "properties" in node:
        return 2 + sum(len(k) + 4 + _largest(v) for k, v in node["properties"].items())
    if kind == "object" and "additionalProperties" in node:
        key = 2 + 317
        return 2 + node.get("maxProperties", 10**9) * (key + 2 + _largest(node["additionalProperties"]))
    return 10**9


def test_the_crd_bounds_every_size_of_the_spec() -> None:
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    unbounded = [p for p, n in _walk(spec, "spec")
                 if (n.get("type") == "string" and "maxLength" not in n and "enum" not in n)
                 or (n.get("type") == "array" and "maxItems" not in n)
                 or (n.get("type") == "object" and "additionalProperties" in n and "maxProperties" not in n)]
    assert unbounded == []
    assert _largest(spec) < SPEC_BOUND_CHARS


def test_a_one_mib_spec_is_refused_naming_a_field() -> None:
    big = with_vllm(env=[{"name": f"V{i}", "value": "x" * 16384} for i in range(64)])  # 1 MiB
    message = refusal(big)
    assert message.startswith("spec"), message


def test_the_var_reference_pattern_is_the_check() -> None:
    for value in ["$(A)", "$$(A)", "$", "x$$$(y", "", "$$"]:
        assert (re.fullmatch(NO_VAR_REFERENCE, value) is None) == (var_reference_problem(value) is not None)


# --- the hostile-spec property: admission never admits what the pod would run behind the plan ------------------

OWNED_SPELLINGS = st.sampled_from(sorted(OWNED_FLAGS)).flatmap(lambda flag: st.sampled_from([
    flag, f"{flag}=1", "--" + flag[2:].replace("-", "_") if flag.startswith("--") else flag,
    "--" + flag[2:].replace("-", "_") + "=1" if flag.startswith("--") else f"{flag}=1",
    flag[:-1] if flag.startswith("--") and len(flag) > 8 else flag,  # a prefix (maybe ambiguous)
]))
HOSTILE_ARGS = st.one_of(
    OWNED_SPELLINGS,
    st.builds(lambda a, b: f"{a}$({b}){a}", st.sampled_from(["", "--x=", "a"]), st.from_regex(r"[A-Z_]{1,8}",
                                                                                              fullmatch=True)),
    st.sampled_from(["-O0", "-O3", "-Odecode", "-n2", "-r1", "-qfp8", "-t", "-cc.mode=0",
                     "--compilation_config.mode=0"]),
)
HUGE_NUMBERS = st.integers(2**31, 2**70)
NUMBER_FIELDS = [("remediation", "cooldownSeconds"), ("remediation", "stableWindowSeconds"),
                 ("remediation", "kvSaturationWindowSeconds"), ("remediation", "maxReplicas"),
                 ("vllm", "maxNumSeqs"), ("vllm", "maxNumBatchedTokens"), ("serving", "maxModelLen"),
                 ("serving", "expectedConcurrency"), ("serving", "minMaxModelLen")]
SECRET_ENV = st.fixed_dictionaries({"name": st.sampled_from(SECRET_NAMES), "value": st.text(min_size=1, max_size=8)})


@st.composite
def hostile_specs(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    kind = draw(st.sampled_from(["owned", "var", "huge", "secret"]))
    safe = draw(st.lists(st.sampled_from(["--enable-prefix-caching", "--seed", "1"]), max_size=2))
    if kind in ("owned", "var"):
        bad = draw(OWNED_SPELLINGS if kind == "owned" else HOSTILE_ARGS)
        return kind, with_vllm(extraArgs=[*safe, bad, *safe])
    if kind == "huge":
        section, key = draw(st.sampled_from(NUMBER_FIELDS))
        return kind, {**BASE, section: {key: draw(HUGE_NUMBERS)}}
    return kind, with_vllm(env=[{"name": "A", "value": "1"}, draw(SECRET_ENV)])


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(hostile_specs())
def test_no_hostile_spec_is_admitted(case: tuple[str, dict[str, Any]]) -> None:
    _, body = case
    verdict = review(body, V)
    assert not verdict.allowed, body
    assert verdict.message.startswith("spec.") and "\n" not in verdict.message, verdict.message
