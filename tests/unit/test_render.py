"""Rendering: the vllm serve arguments per version, and the Kubernetes objects."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.catalog.gpus import GPUS
from llm_autopilot.catalog.models import catalog_models
from llm_autopilot.domain.precision import KVCacheDtype, WeightFormat
from llm_autopilot.planner.plan import Plan, PlanRequest, Targets
from llm_autopilot.planner.search import plan
from llm_autopilot.remediation.evidence import latest_termination
from llm_autopilot.render.kubernetes import (
    CONTAINER,
    INPUT_HASH,
    PLAN_HASH,
    Owner,
    WorkloadInputs,
    content_hash,
    plan_hash,
    workload,
)
from llm_autopilot.render.vllm_args import (
    ServeOptions,
    command_line,
    conflicting_extra_args,
    render_vllm_args,
    unknown_flags,
)
from llm_autopilot.vllm.flags import examined_versions, known_flags, kv_cache_dtype_choices, quantization_choices
from llm_autopilot.vllm.versions import VersionError, VLLMVersion, behaviour_of
from tests.conftest import gpu, model

VERSIONS = examined_versions()
ALL_TARGETS = Targets(allowed_weight_formats=(WeightFormat.NONE, WeightFormat.FP8, WeightFormat.AWQ),
                      allowed_kv_cache_dtypes=(KVCacheDtype.AUTO, KVCacheDtype.FP8), max_model_len=None)


def a_plan(model_id: str, gpu_name: str, version: VLLMVersion, **targets: object) -> Plan:
    result = plan(PlanRequest(model(model_id), gpu(gpu_name), behaviour_of(version), Targets(**targets)))  # type: ignore[arg-type]
    assert isinstance(result, Plan), getattr(result, "message", "")
    return result


@pytest.mark.parametrize(("version", "flag"), [
    (VLLMVersion(0, 10, 2), "--cuda-graph-sizes"), (VLLMVersion(0, 11, 2), "--max-cudagraph-capture-size"),
    (VLLMVersion(0, 32, 0), "--max-cudagraph-capture-size"), (VLLMVersion(0, 33, 0), "--max-cudagraph-capture-size"),
])
def test_a_pinned_capture_size_renders_in_the_flag_the_release_knows(version: VLLMVersion, flag: str) -> None:
    capped = a_plan("Qwen/Qwen3-8B", "nvidia-h100-80gb", version, max_model_len=8192, max_cudagraph_capture_size=128)
    args = render_vllm_args(capped)
    assert args[args.index(flag) + 1] == "128" and unknown_flags(args, str(version)) == []
    assert any(r.field == "maxCudagraphCaptureSize" and r.value == "128" for r in capped.reasons)
    plain = render_vllm_args(a_plan("Qwen/Qwen3-8B", "nvidia-h100-80gb", version, max_model_len=8192))
    eager = render_vllm_args(a_plan("Qwen/Qwen3-8B", "nvidia-h100-80gb", version, max_model_len=8192,
                                    enforce_eager=True, max_cudagraph_capture_size=128))
    assert not {"--cuda-graph-sizes", "--max-cudagraph-capture-size"} & {*plain, *eager}


def test_flag_table_covers_the_supported_range() -> None:
    assert VERSIONS[0] == VLLMVersion(0, 10, 2) and VERSIONS[-1] == VLLMVersion(0, 33, 0)
    assert len(VERSIONS) >= 20
    assert "--swap-space" in known_flags("0.17.1") and "--swap-space" not in known_flags("0.33.0")
    assert known_flags("0.33.5") == known_flags("0.33.0")  # between releases: the older table
    with pytest.raises(VersionError):
        known_flags("0.9.0")


@pytest.mark.parametrize("version", VERSIONS, ids=str)
def test_every_rendered_argument_is_known_to_that_version(version: VLLMVersion) -> None:
    vllm = behaviour_of(version)
    checked = 0
    for m, g in itertools.product(catalog_models(), GPUS):
        eager = Targets(enforce_eager=True, max_model_len=min(8192, m.max_position_embeddings))
        for targets in (Targets(), ALL_TARGETS, eager):
            result = plan(PlanRequest(m, g, vllm, targets))
            if not isinstance(result, Plan):
                continue
            args = render_vllm_args(result, ServeOptions(served_model_name="x", revision="main"))
            assert unknown_flags(args, str(version)) == [], (m.model_id, g.name, args)
            if "--kv-cache-dtype" in args:
                assert args[args.index("--kv-cache-dtype") + 1] in kv_cache_dtype_choices(version)
            if "--quantization" in args:
                assert args[args.index("--quantization") + 1] in quantization_choices(version)
            checked += 1
    assert checked > 100


def test_online_fp8_is_spelled_as_the_version_spells_it() -> None:
    for version, spelling in ((VLLMVersion(0, 19, 1), "fp8"), (VLLMVersion(0, 33, 0), "fp8_per_tensor")):
        p = a_plan("Qwen/Qwen3-14B", "l4", version, max_gpus=1, max_model_len=8192,
                   allowed_weight_formats=(WeightFormat.FP8,))
        args = render_vllm_args(p)
        assert args[args.index("--quantization") + 1] == spelling


def test_pre_quantized_variant_is_served_without_a_quantization_flag() -> None:
    p = a_plan("Qwen/Qwen3-32B", "l40s", VLLMVersion(0, 33, 0), max_gpus=1, max_model_len=8192,
               allowed_weight_formats=(WeightFormat.FP8,))
    args = render_vllm_args(p, ServeOptions(served_model_name="qwen3-32b"))
    assert args[0] == "Qwen/Qwen3-32B-FP8" and "--quantization" not in args
    assert args[args.index("--served-model-name") + 1] == "qwen3-32b"


def test_arguments_carry_the_plan() -> None:
    p = a_plan("meta-llama/Llama-3.1-70B-Instruct", "h100", VLLMVersion(0, 33, 0), max_model_len=32768)
    args = render_vllm_args(p, ServeOptions(extra_args=("--enable-prefix-caching",)))
    c = p.config
    pairs = dict(zip(args[1::2], args[2::2], strict=False))
    assert pairs["--tensor-parallel-size"] == str(c.tensor_parallel_size)
    assert pairs["--max-model-len"] == "32768" and pairs["--gpu-memory-utilization"] == "0.92"
    assert args[-1] == "--enable-prefix-caching"
    assert "--swap-space" not in args and "--pipeline-parallel-size" not in args
    assert command_line(p).startswith("vllm serve meta-llama/Llama-3.1-70B-Instruct ")


def test_extra_args_checks() -> None:
    assert conflicting_extra_args(["--max-model-len=4096", "--enable-prefix-caching", "-tp", "2"]) == [
        "--max-model-len", "-tp"]
    assert unknown_flags(["--swap-space", "4"], "0.33.0") == ["--swap-space"]
    assert unknown_flags(["--swap-space", "4"], "0.15.1") == []
    assert unknown_flags(["--temperature", "-1.5"], "0.33.0") == ["--temperature"]  # negative numbers are values


# --- Kubernetes objects -----------------------------------------------------------------------------

OWNER = Owner("qwen", "ml", "1234")


def inputs(args: tuple[str, ...] = ("Qwen/Qwen3-8B", "--max-model-len", "8192"), **spec: object) -> WorkloadInputs:
    p = a_plan("Qwen/Qwen3-8B", "l4", VLLMVersion(0, 33, 0), max_model_len=8192)
    s = LLMDeploymentSpec.model_validate({"model": {"name": "Qwen/Qwen3-8B"}, **spec})
    return WorkloadInputs(OWNER, s, p, args, "vllm/vllm-openai:v0.33.0", ("NVIDIA-L4",))


def test_deployment_shape() -> None:
    dep, svc, pdb = workload(inputs(gpu={"tolerations": [{"key": "x", "operator": "Exists"}],
                                         "nodeSelector": {"pool": "a"}}))
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["command"] == ["vllm", "serve"] and c["args"][0] == "Qwen/Qwen3-8B"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1" == c["resources"]["requests"]["nvidia.com/gpu"]
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert {p["httpGet"]["path"] for p in (c["startupProbe"], c["readinessProbe"], c["livenessProbe"])} == {"/health"}
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 600
    assert pod["volumes"][0]["emptyDir"]["medium"] == "Memory"
    expr = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert expr["matchExpressions"][0] == {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-L4"]}
    assert pod["tolerations"] == [{"key": "x", "operator": "Exists"}] and pod["nodeSelector"] == {"pool": "a"}
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    for obj in (dep, svc, pdb):
        meta = obj["metadata"]
        assert meta["ownerReferences"][0]["uid"] == "1234" and meta["ownerReferences"][0]["controller"] is True
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "llm-autopilot"
        assert meta["annotations"][INPUT_HASH]
    assert svc["spec"]["ports"][0]["port"] == 8000
    assert pdb["spec"]["maxUnavailable"] == 1


def test_hub_token_is_a_secret_reference_never_inline() -> None:
    dep = workload(inputs(model={"name": "Qwen/Qwen3-8B", "hubTokenSecretRef": {"name": "hf"}},
                          vllm={"env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]}))[0]
    env = dep["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env[0] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    assert env[1] == {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}


#: volume types the "restricted" Pod Security Standard allows
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def test_pods_meet_the_restricted_pod_security_standard() -> None:
    pod = workload(inputs())[0]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False  # the model code gets no API token
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] not in (None, 0)
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "hostNetwork" not in pod and "hostPID" not in pod and "hostIPC" not in pod
    for volume in pod["volumes"]:
        assert set(volume) - {"name"} <= RESTRICTED_VOLUMES, volume
    for container in pod["containers"]:
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
        assert not sc.get("privileged") and sc.get("runAsUser", 1) != 0 and "ports" not in sc
        assert all("hostPort" not in port for port in container["ports"])
        # non-root: caches go to HOME, which must be a mounted, writable volume (the image's is /root)
        home = next(e["value"] for e in container["env"] if e["name"] == "HOME")
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == home)
        assert not mount.get("readOnly")
        assert next(v for v in pod["volumes"] if v["name"] == mount["name"])["emptyDir"] == {}


def test_a_home_set_in_the_spec_wins_without_a_duplicate() -> None:
    dep = workload(inputs(vllm={"env": [{"name": "HOME", "value": "/models"}]}))[0]
    env = dep["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] == "HOME"] == [{"name": "HOME", "value": "/models"}]


def test_resources_default_and_override() -> None:
    default = workload(inputs())[0]["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert default["requests"]["memory"] == "24Gi" and default["limits"]["memory"] == "36Gi"
    custom = workload(inputs(resources={"requests": {"cpu": "4", "memory": "64Gi"}, "limits": {"memory": "80Gi"}}))
    res = custom[0]["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert res["requests"] == {"cpu": "4", "memory": "64Gi", "nvidia.com/gpu": "1"}
    assert res["limits"] == {"memory": "80Gi", "nvidia.com/gpu": "1"}


def test_a_memory_step_is_a_new_plan_so_the_old_pods_failures_are_not_its_evidence() -> None:
    """Issue #29 item 6: after a memory-limit step (same vLLM args), the old pods' next OOM kill was read as the
    new plan's and took a second step. The plan hash names the raised limit; without an override it is the hash
    of the args alone, as it always was (no rollout on upgrade)."""
    base = inputs()
    raised = dataclasses.replace(base, memory_limit_gib=1.76)
    higher = dataclasses.replace(base, memory_limit_gib=2.64)
    assert plan_hash(base) == content_hash(list(base.args))
    assert len({plan_hash(base), plan_hash(raised), plan_hash(higher)}) == 3
    assert plan_hash(dataclasses.replace(base, replicas=3)) == plan_hash(base)  # replicas are not the plan
    old_pod = {"metadata": {"name": "a", "annotations": {PLAN_HASH: plan_hash(raised)}},
               "status": {"containerStatuses": [{"name": CONTAINER, "restartCount": 2, "lastState": {"terminated": {
                   "reason": "OOMKilled", "exitCode": 137, "finishedAt": "2026-01-01T00:00:09Z"}}}]}}
    assert latest_termination([old_pod], container=CONTAINER, plan_hash=plan_hash(higher),
                              plan_hash_annotation=PLAN_HASH) is None
    assert latest_termination([old_pod], container=CONTAINER, plan_hash=plan_hash(raised),
                              plan_hash_annotation=PLAN_HASH) is not None


def test_hashes_change_only_with_the_inputs() -> None:
    first, again = workload(inputs()), workload(inputs())
    assert [o["metadata"]["annotations"][INPUT_HASH] for o in first] == [
        o["metadata"]["annotations"][INPUT_HASH] for o in again]
    changed = workload(inputs(args=("Qwen/Qwen3-8B", "--max-model-len", "4096")))
    assert changed[0]["metadata"]["annotations"][INPUT_HASH] != first[0]["metadata"]["annotations"][INPUT_HASH]
    template = "spec", "template", "metadata", "annotations"
    old_plan = first[0][template[0]][template[1]][template[2]][template[3]][PLAN_HASH]
    assert changed[0]["spec"]["template"]["metadata"]["annotations"][PLAN_HASH] != old_plan
    assert changed[1]["metadata"]["annotations"][INPUT_HASH] == first[1]["metadata"]["annotations"][INPUT_HASH]
