"""vLLM's compile caches on a PVC that outlives the pods (render/compile_cache.py): on with the model cache unless
turned off, one folder per image, model, revision and GPU product, the three caches' variables into it, the PVC
bounded and never rewritten, and its name in the status."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from llm_autopilot.api.kubernetes_rules import subdomain_problem
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.render import compile_cache
from tests.unit.fakes import Run
from tests.unit.test_cache import CACHED_QWEN, KV_CRASH, kinds

HUB = {"name": "Qwen/Qwen3-8B"}
CACHED = {"name": "Qwen/Qwen3-8B", "cache": {"enabled": True}}
IMAGE = "vllm/vllm-openai:v0.33.0"
H100 = "NVIDIA H100 80GB HBM3"


def spec(model: dict[str, Any], **fields: Any) -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate({"model": model, **fields})


def test_on_with_the_model_cache_unless_turned_off_and_on_by_itself_when_asked() -> None:
    assert compile_cache.enabled(spec(CACHED))
    assert not compile_cache.enabled(spec(HUB))  # no model cache: no PVC the user has said the cluster gives
    assert not compile_cache.enabled(spec(CACHED, vllm={"compileCache": {"enabled": False}}))
    assert compile_cache.enabled(spec(HUB, vllm={"compileCache": {"enabled": True}}))


@pytest.mark.parametrize("size", ["512Mi", "0", "2Ti"])
def test_the_size_is_bounded(size: str) -> None:
    with pytest.raises(ValidationError, match=r"outside 1Gi\.\.1Ti"):
        spec(CACHED, vllm={"compileCache": {"size": size}})


def test_the_folder_is_keyed_by_what_vllms_hash_does_not_separate() -> None:
    base = compile_cache.folder(spec(CACHED), IMAGE, H100)
    assert base.startswith("qwen-qwen3-8b-")
    # settings vLLM's own hash separates inside the folder (torch_compile_cache/<hash>): the same folder
    for fields in ({"serving": {"maxModelLen": 4096}}, {"vllm": {"gpuMemoryUtilization": 0.8, "maxNumSeqs": 8}},
                   {"replicas": 3}):
        assert compile_cache.folder(spec(CACHED, **fields), IMAGE, H100) == base
    # what it does not: the image, the model, its revision (a path in the model cache), the GPU product
    assert compile_cache.folder(spec(CACHED), "vllm/vllm-openai:v0.32.0", H100) != base
    assert compile_cache.folder(spec({**CACHED, "revision": "v2"}), IMAGE, H100) != base
    assert compile_cache.folder(spec({**CACHED, "name": "Qwen/Qwen3-4B"}), IMAGE, H100) != base
    assert compile_cache.folder(spec(CACHED), IMAGE, "NVIDIA A100-SXM4-80GB") != base


def test_one_claim_per_namespace_and_model_not_the_model_caches() -> None:
    claim = compile_cache.claim_name(spec(CACHED), "ns")
    assert claim.startswith("llm-compile-qwen-qwen3-8b-") and subdomain_problem(claim) is None
    assert compile_cache.claim_name(spec(CACHED, serving={"maxModelLen": 4096}), "ns") == claim
    assert compile_cache.claim_name(spec(CACHED), "other") != claim
    assert len(compile_cache.claim_name(spec({"name": "a/" + "b" * 90, "cache": {"enabled": True}}), "ns")) <= 63


def test_the_pvc_is_bounded_shared_and_never_rewritten() -> None:
    nfs = spec(CACHED, vllm={"compileCache": {"storageClassName": "nfs"}})
    volume = compile_cache.volume_of(nfs, "ns", IMAGE, H100)
    assert volume is not None
    pvc = compile_cache.pvc(volume, "ns")
    assert pvc["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}},
                           "storageClassName": "nfs"}
    assert "ownerReferences" not in pvc["metadata"]  # outlives the LLMDeployment, shared by the model's others
    bigger = compile_cache.volume_of(spec(CACHED, vllm={"compileCache": {"size": "50Gi"}}), "ns", IMAGE, H100)
    assert bigger is not None
    bigger_pvc = compile_cache.pvc(bigger, "ns")
    assert bigger_pvc["spec"]["resources"]["requests"]["storage"] == "50Gi"
    # created while missing, then left alone: the input hash is the name's, not the size's
    assert bigger_pvc["metadata"]["annotations"] == pvc["metadata"]["annotations"]


def test_off_the_pods_keep_their_caches_in_the_emptydir() -> None:
    run = Run({**CACHED_QWEN, "vllm": {"compileCache": {"enabled": False}}})
    run.once()
    assert [p["metadata"]["name"] for p in kinds(run.cluster, "PersistentVolumeClaim")] == [
        run.status["cache"]["claimName"]]  # the model cache's only
    pod = run.cluster.deployment()["spec"]["template"]["spec"]
    assert all(v["name"] != compile_cache.VOLUME for v in pod["volumes"])
    assert not {e["name"] for e in pod["containers"][0]["env"]} & set(compile_cache.CACHE_ENV)
    assert "fsGroup" not in pod["securityContext"]
    assert "compileCache" not in run.status


def test_the_pods_mount_it_writable_with_the_three_caches_in_the_keys_folder() -> None:
    run = Run(CACHED_QWEN)
    run.once()
    claim = compile_cache.claim_name(spec(CACHED), "ns")
    assert claim in [p["metadata"]["name"] for p in kinds(run.cluster, "PersistentVolumeClaim")]
    pod = run.cluster.deployment()["spec"]["template"]["spec"]
    assert {"name": "compile-cache", "persistentVolumeClaim": {"claimName": claim}} in pod["volumes"]
    assert not any("hostPath" in v for v in pod["volumes"])  # restricted Pod Security
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["fsGroup"] == 65534  # the pods' group owns the volume: they can write it
    vllm = pod["containers"][0]
    assert {"name": "compile-cache", "mountPath": "/compile-cache"} in vllm["volumeMounts"]
    folder = run.status["compileCache"]["folder"]
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert env["VLLM_CACHE_ROOT"] == f"/compile-cache/{folder}/vllm"
    assert env["TRITON_CACHE_DIR"] == f"/compile-cache/{folder}/triton"
    assert env["FLASHINFER_WORKSPACE_BASE"] == f"/compile-cache/{folder}/flashinfer"
    assert run.status["compileCache"] == {"claimName": claim, "folder": folder, "size": "10Gi"}


def test_a_users_own_cache_variable_wins() -> None:
    run = Run({**CACHED_QWEN, "vllm": {"env": [{"name": "TRITON_CACHE_DIR", "value": "/tmp/triton"}]}})
    run.once()
    env = [e for e in run.cluster.deployment()["spec"]["template"]["spec"]["containers"][0]["env"]
           if e["name"] == "TRITON_CACHE_DIR"]
    assert env == [{"name": "TRITON_CACHE_DIR", "value": "/tmp/triton"}]  # once: a duplicate would be refused


def test_a_kv_step_keeps_the_folder_and_does_not_rewrite_the_pvc() -> None:
    run = Run(CACHED_QWEN)
    run.once()
    job = next(j["metadata"]["name"] for j in kinds(run.cluster, "Job"))
    run.cluster.objects[("Job", job)]["status"] = {"succeeded": 1}
    run.once()
    before, pvcs = run.status["compileCache"], run.cluster.objects[("PersistentVolumeClaim", before_claim(run))]
    run.cluster.crash(KV_CRASH)
    run.once()
    assert "Remediated" in run.reasons()
    # a shorter max_model_len enters vLLM's hash: a new entry inside the same folder, not a new folder
    assert run.status["compileCache"] == before
    assert run.cluster.objects[("PersistentVolumeClaim", before_claim(run))] == pvcs


def before_claim(run: Run) -> str:
    return str(run.status["compileCache"]["claimName"])
