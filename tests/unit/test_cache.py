"""The model cache's objects (render/cache.py): one PVC per model and revision, the Job that fills it, and pods
that start only on a complete folder."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import pytest
from pydantic import ValidationError

from llm_autopilot.api.kubernetes_rules import subdomain_problem
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.cli.main import fetch_command
from llm_autopilot.render import cache, compile_cache
from llm_autopilot.render.rollout import startup_seconds
from llm_autopilot.storage import fetch
from tests.unit.fakes import FakeCluster, Run

S3 = {"name": "acme/tiny", "source": "s3://models/tiny",
      "s3": {"endpoint": "http://seaweedfs.storage:8333", "credentialsSecretRef": {"name": "s3-keys"}},
      "cache": {"enabled": True, "storageClassName": "local-path"}}


def spec(model: dict[str, Any], **fields: Any) -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate({"model": model, **fields})


def inputs(model: dict[str, Any] = S3, namespace: str = "ns", checkpoint: int = 16 * 10**9) -> cache.CacheInputs:
    return cache.CacheInputs(spec(model), namespace, "ghcr.io/llm-autopilot/operator:0.1.0", checkpoint)


def test_one_claim_per_namespace_source_and_revision() -> None:
    base = cache.claim_name(spec(S3), "ns")
    assert base.startswith("llm-cache-models-tiny-") and subdomain_problem(base) is None and len(base) <= 63
    # other vLLM settings, another LLMDeployment, a remediation step: the same weights, the same claim
    assert cache.claim_name(spec(S3, serving={"maxModelLen": 4096}, replicas=3), "ns") == base
    assert cache.claim_name(spec(S3), "other") != base
    hub = {"name": "Qwen/Qwen3-8B", "cache": {"enabled": True}}
    assert cache.claim_name(spec(hub), "ns") != cache.claim_name(spec({**hub, "revision": "v2"}), "ns")
    long = {**S3, "source": "s3://models/" + "a" * 200}
    assert len(cache.claim_name(spec(long), "ns")) <= 63


def test_the_claim_is_sized_from_the_checkpoint_unless_given() -> None:
    pvc = cache.pvc(inputs(checkpoint=16 * 10**9))
    assert pvc is not None
    size = pvc["spec"]["resources"]["requests"]["storage"]
    assert size % 2**30 == 0 and 16 * 10**9 * 1.1 + 2**30 <= size < 16 * 10**9 * 1.1 + 2 * 2**30
    assert pvc["spec"]["storageClassName"] == "local-path"
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert "ownerReferences" not in pvc["metadata"]  # shared: no one LLMDeployment owns it
    given = cache.pvc(inputs({**S3, "cache": {"enabled": True, "size": "40Gi", "accessMode": "ReadWriteOnce"}}))
    assert given is not None and given["spec"]["resources"]["requests"]["storage"] == "40Gi"
    assert given["spec"]["accessModes"] == ["ReadWriteOnce"]


def test_an_existing_claim_is_used_not_created() -> None:
    existing = inputs({**S3, "cache": {"enabled": True, "existingClaim": "team-models"}})
    assert cache.pvc(existing) is None and existing.claim == "team-models"
    assert cache.job(existing)["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"] == {
        "claimName": "team-models"}


def test_the_job_runs_fetch_with_the_secret_and_no_kubernetes_credentials() -> None:
    job = cache.job(inputs())
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == ["llm-autopilot"]
    assert container["args"] == ["fetch", "--source", "s3://models/tiny", "--dest", "/model-cache/model",
                                 "--s3-endpoint", "http://seaweedfs.storage:8333", "--s3-region", "us-east-1"]
    assert {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]} == {
        "AWS_ACCESS_KEY_ID": {"name": "s3-keys", "key": "AWS_ACCESS_KEY_ID"},
        "AWS_SECRET_ACCESS_KEY": {"name": "s3-keys", "key": "AWS_SECRET_ACCESS_KEY"}}
    assert pod["automountServiceAccountToken"] is False and pod["restartPolicy"] == "OnFailure"
    assert container["volumeMounts"] == [{"name": "model-cache", "mountPath": "/model-cache"}]  # it writes
    # the arguments are the fetch command's own
    ctx = fetch_command.make_context("fetch", list(container["args"][1:]))
    assert ctx.params["source"] == "s3://models/tiny" and ctx.params["s3_endpoint"].endswith(":8333")


def test_the_job_runs_on_the_gpu_pools_nodes() -> None:
    placed = {"nodeSelector": {"pool": "l4"},
              "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    pod = cache.job(cache.CacheInputs(spec(S3, gpu=placed), "ns", "img", 10**9))["spec"]["template"]["spec"]
    # the pool's taints would keep it from every node it may run on (measured: Pending on the local cluster)
    assert pod["nodeSelector"] == {"pool": "l4"} and pod["tolerations"] == placed["tolerations"]
    assert "nodeSelector" not in cache.job(inputs())["spec"]["template"]["spec"]


def test_a_hub_cache_passes_the_revision_and_token() -> None:
    job = cache.job(inputs({"name": "Qwen/Qwen3-8B", "revision": "v2", "hubTokenSecretRef": {"name": "hf"},
                            "cache": {"enabled": True}}))
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:3] == ["fetch", "--source", "hf://Qwen/Qwen3-8B"]
    assert container["args"][-2:] == ["--revision", "v2"]
    assert container["env"] == [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]


def test_pods_mount_it_read_only_and_wait_for_the_marker() -> None:
    assert cache.MARKER == fetch.MARKER  # the init container checks what fetch writes last
    assert cache.pod_volume("c") == {"name": "model-cache", "persistentVolumeClaim": {"claimName": "c",
                                                                                       "readOnly": True}}
    assert cache.pod_mount()["readOnly"] is True
    check = cache.marker_check("vllm/vllm-openai:v0.33.0", spec(S3))
    assert f"/model-cache/model/{fetch.MARKER}" in check["command"][-1] and check["volumeMounts"][0]["readOnly"]
    assert cache.model_path(spec(S3)) == "/model-cache/model"


# --- a claim shared by several models: a folder (and a Job) per source and revision (issue #28) ------------

SHARED = {"enabled": True, "existingClaim": "team-models"}


def shared(model: str, revision: str | None = None, **fields: Any) -> LLMDeploymentSpec:
    return spec({"name": model, "cache": SHARED, **({"revision": revision} if revision else {}), **fields})


def test_two_models_on_one_claim_get_two_folders_and_two_jobs() -> None:
    qwen, llama = shared("Qwen/Qwen3-8B"), shared("meta-llama/Llama-3.1-8B")
    assert cache.model_folder(qwen) != cache.model_folder(llama)
    assert cache.fetch_job_name(qwen, "team-models") != cache.fetch_job_name(llama, "team-models")
    for one in (qwen, llama):
        folder = cache.model_folder(one)
        assert folder.startswith("models/") and subdomain_problem(folder.removeprefix("models/")) is None
        job = cache.job(cache.CacheInputs(one, "ns", "img", 10**9))
        container = job["spec"]["template"]["spec"]["containers"][0]
        # fetch fills the folder vLLM loads and the init container checks
        assert container["args"][container["args"].index("--dest") + 1] == cache.model_path(one)
        assert cache.model_path(one) == f"/model-cache/{folder}"
        assert f"{cache.model_path(one)}/{fetch.MARKER}" in cache.marker_check("img", one)["command"][-1]
        assert job["metadata"]["annotations"]["llm-autopilot.io/folder"] == folder
        assert len(job["metadata"]["name"]) <= 63 and subdomain_problem(job["metadata"]["name"]) is None


def test_two_revisions_of_one_model_get_two_folders() -> None:
    assert cache.model_folder(shared("Qwen/Qwen3-8B", "v1")) != cache.model_folder(shared("Qwen/Qwen3-8B", "v2"))
    # no revision is the Hub's main: the same files, so the same folder
    assert cache.model_folder(shared("Qwen/Qwen3-8B")) == cache.model_folder(shared("Qwen/Qwen3-8B", "main"))


def test_the_same_model_twice_is_the_same_folder_and_it_is_stable() -> None:
    first, second = shared("Qwen/Qwen3-8B", "v2"), shared("Qwen/Qwen3-8B", "v2", servedModelName="qwen")
    assert cache.model_folder(first) == cache.model_folder(second)
    assert cache.fetch_job_name(first, "team-models") == cache.fetch_job_name(second, "team-models")
    # derived from the source alone (never from the object's name or a random value): the same in every release
    key = hashlib.sha256(b"hf://Qwen/Qwen3-8B\0v2\0").hexdigest()[:12]
    assert cache.shared_folder("hf://Qwen/Qwen3-8B", "v2") == f"models/qwen-qwen3-8b-{key}"


def test_one_bucket_prefix_on_two_stores_is_two_folders() -> None:
    def on(endpoint: str) -> LLMDeploymentSpec:
        return spec({**S3, "s3": {**S3["s3"], "endpoint": endpoint}, "cache": SHARED})  # type: ignore[dict-item]
    assert cache.model_folder(on("http://a.storage:8333")) != cache.model_folder(on("http://b.storage:8333"))


def test_the_operators_own_pvc_keeps_its_folder_and_job() -> None:
    """One PVC per source and revision already: ``model`` and ``<claim>-fetch`` as before, so an upgrade
    downloads nothing again into a PVC sized for one copy."""
    own = inputs()
    assert cache.model_folder(own.spec) == "model" and cache.model_path(own.spec) == "/model-cache/model"
    assert cache.job(own)["metadata"]["name"] == f"{own.claim}-fetch"
    assert "annotations" not in cache.job(own)["metadata"]


def test_a_long_claim_and_source_still_make_valid_names() -> None:
    claim = "c" * 63
    long = spec({"name": "org/" + "x" * 90, "cache": {"enabled": True, "existingClaim": claim}})
    name = cache.fetch_job_name(long, claim)
    assert len(name) <= 63 and subdomain_problem(name) is None
    assert len(cache.model_folder(long)) <= len("models/") + 40 + 1 + 12


def test_a_pvc_source_has_nothing_to_cache() -> None:
    with pytest.raises(ValidationError, match="a pvc:// source is already on a volume"):
        spec({"name": "acme/tiny", "source": "pvc://models/tiny", "cache": {"enabled": True}})
    with pytest.raises(ValidationError, match="cache holds one checkpoint"):
        spec({"name": "Qwen/Qwen3-8B", "variants": {"fp8": "Qwen/Qwen3-8B-FP8"}, "cache": {"enabled": True}})


def progress(done: int, total: int) -> str:
    return json.dumps({"fetch": "progress", "bytes": done, "total": total, "percent": round(100 * done / total, 1)})


@pytest.mark.parametrize(("job", "log", "message", "expected"), [
    (None, "", "", {"state": "Pending", "bytes": 0}),
    ({"status": {"active": 1}}, "", "", {"state": "Downloading", "bytes": 0}),
    ({"status": {"active": 1}}, f"{progress(10, 400)}\n{progress(100, 400)}\n", "",
     {"state": "Downloading", "bytes": 100, "totalBytes": 400, "percent": 25.0}),
    ({"status": {"succeeded": 1}}, "",
     fetch.Summary(files=3, total_bytes=400, downloaded_bytes=300).as_json(),
     {"state": "Complete", "bytes": 400, "totalBytes": 400, "percent": 100.0}),
    ({"status": {"failed": 7, "conditions": [{"type": "Failed", "status": "True", "message": "BackoffLimitExceeded"}]}},
     f"{progress(100, 400)}\nerror: size mismatch for s3://models/tiny/model.safetensors: got 1 bytes\n", "",
     {"state": "Failed", "bytes": 100, "percent": 25.0,
      "message": "error: size mismatch for s3://models/tiny/model.safetensors: got 1 bytes"}),
    ({"status": {"active": 1}}, "", "error: md5 mismatch for s3://models/tiny/model.safetensors: ...",
     {"state": "Downloading", "bytes": 0, "message": "the last try failed and the Job retries (at most 6 times): "
      "error: md5 mismatch for s3://models/tiny/model.safetensors: ..."}),
])
def test_the_status_reads_the_jobs_progress(job: dict[str, Any] | None, log: str, message: str,
                                            expected: dict[str, Any]) -> None:
    status = cache.cache_status("c", job, log, message).model_dump(by_alias=True, exclude_none=True)
    assert {k: status[k] for k in expected} == expected


# --- in a reconcile ---------------------------------------------------------------------------------------

CACHED_QWEN = {"model": {"name": "Qwen/Qwen3-8B", "cache": {"enabled": True}},
               "gpu": {"product": "nvidia-h100-80gb"}, "serving": {"maxModelLen": 16384, "minMaxModelLen": 4096},
               "remediation": {"cooldownSeconds": 0}}
KV_CRASH = ("ValueError: To serve at least one request with the model's max seq len (16384), (2.0 GiB KV cache is "
            "needed, which is larger than the available KV cache memory (1.0 GiB). Based on the available memory, "
            "the estimated maximum model length is 8100.")


def kinds(cluster: FakeCluster, kind: str) -> list[dict[str, Any]]:
    return [o for (k, _), o in cluster.objects.items() if k == kind]


def cached_run() -> tuple[Run, str, str]:
    run = Run(CACHED_QWEN)
    run.once()
    claim = cache.claim_name(spec(CACHED_QWEN["model"]), "ns")  # type: ignore[arg-type]
    return run, claim, f"{claim}-fetch"


def test_no_pod_starts_before_the_download_completes() -> None:
    run, claim, job = cached_run()
    # the model cache's PVC, and the compile cache's (on by default with the model cache: test_compile_cache.py)
    assert [p["metadata"]["name"] for p in kinds(run.cluster, "PersistentVolumeClaim")] == [
        claim, compile_cache.claim_name(spec(CACHED_QWEN["model"]), "ns")]  # type: ignore[arg-type]
    assert [j["metadata"]["name"] for j in kinds(run.cluster, "Job")] == [job]
    deployment = run.cluster.deployment()
    assert deployment["spec"]["replicas"] == 0  # held
    pod = deployment["spec"]["template"]["spec"]
    assert cache.pod_volume(claim) in pod["volumes"]
    assert pod["initContainers"][0]["name"] == "cache-complete"
    vllm = pod["containers"][0]
    assert cache.pod_mount() in vllm["volumeMounts"]
    assert vllm["args"][0] == "/model-cache/model"
    assert vllm["args"][vllm["args"].index("--served-model-name") + 1] == "Qwen/Qwen3-8B"
    assert run.condition("ModelCached")["reason"] == "Pending"
    assert run.status["cache"] == {"claimName": claim, "folder": "model", "state": "Pending", "bytes": 0,
                                   "message": ""}
    assert run.last is not None and not run.last.settled

    run.cluster.objects[("Job", job)]["status"] = {"active": 1}
    run.cluster.job_pod_list[job] = [{"metadata": {"name": "fetch-1"}, "status": {}}]
    run.cluster.current_logs["fetch-1"] = progress(4 * 10**9, 16 * 10**9)
    run.once()
    assert run.status["cache"]["state"] == "Downloading" and run.status["cache"]["percent"] == 25.0
    assert "25.0%" in run.condition("ModelCached")["message"]
    assert run.cluster.deployment()["spec"]["replicas"] == 0

    run.cluster.objects[("Job", job)]["status"] = {"succeeded": 1}
    # a kubelet without termination-message files (the local one): the summary is the log's last line
    run.cluster.current_logs["fetch-1"] = progress(16 * 10**9, 16 * 10**9) + "\n" + json.dumps(
        {"fetch": "complete", "files": 5, "bytes": 16 * 10**9, "downloaded": 16 * 10**9, "alreadyComplete": False})
    run.once()
    assert run.condition("ModelCached")["status"] == "True"
    assert run.status["cache"]["state"] == "Complete"
    assert run.status["cache"]["totalBytes"] == 16 * 10**9 and run.status["cache"]["bytes"] == 16 * 10**9
    assert f"{16 * 10**9} bytes" in run.condition("ModelCached")["message"]
    run.cluster.current_logs["fetch-1"] = RuntimeError("the finished pod's log is read once, not every resync")
    run.once()
    assert run.status["cache"]["totalBytes"] == 16 * 10**9
    deployment = run.cluster.deployment()
    assert deployment["spec"]["replicas"] == 1
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] <= startup_seconds(
        _qwen_config(), downloads=True)  # loading from the cache, not downloading


def _qwen_config() -> Any:
    from tests.unit.test_rollout import a_plan  # noqa: PLC0415

    return a_plan("Qwen/Qwen3-8B", "nvidia-h100-80gb", max_model_len=16384).config


def test_a_remediation_step_on_a_cached_model_downloads_nothing() -> None:
    run, claim, job = cached_run()
    run.cluster.objects[("Job", job)]["status"] = {"succeeded": 1}
    run.once()
    before = {k: o["metadata"]["annotations"] for k, o in run.cluster.objects.items() if k[0] in ("Job",
                                                                                                  "PersistentVolumeClaim")}
    run.cluster.crash(KV_CRASH)
    run.once()
    assert "Remediated" in run.reasons()
    after = {k: o["metadata"]["annotations"] for k, o in run.cluster.objects.items() if k[0] in ("Job",
                                                                                                 "PersistentVolumeClaim")}
    assert after == before  # the same PVC and the same finished Job: no new download
    deployment = run.cluster.deployment()
    assert deployment["spec"]["replicas"] == 1 and cache.pod_volume(claim) in deployment["spec"]["template"]["spec"][
        "volumes"]
    assert "--max-model-len" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_a_failed_download_says_why_and_holds_the_pods() -> None:
    run, _, job = cached_run()
    run.cluster.objects[("Job", job)]["status"] = {
        "failed": 7, "conditions": [{"type": "Failed", "status": "True", "message": "BackoffLimitExceeded"}]}
    run.cluster.job_pod_list[job] = [{"metadata": {"name": "fetch-7"}, "status": {}}]
    run.cluster.current_logs["fetch-7"] = "error: md5 mismatch for s3://models/tiny/model.safetensors: …"
    run.once()
    cached = run.condition("ModelCached")
    assert cached["reason"] == "CacheFailed" and "md5 mismatch" in cached["message"]
    assert "CacheFailed" in run.reasons() and run.cluster.deployment()["spec"]["replicas"] == 0


def test_a_download_that_completed_on_a_retry_keeps_saying_why_it_was_retried() -> None:
    """The retrying Job shows its failed try only until the retry ends, which can be sooner than a resync: the
    pod's previous termination (lastState) is read when the Job succeeds, and kept while the status says Complete."""
    run, _, job = cached_run()
    error = "error: md5 mismatch for s3://models/tiny/model.safetensors: the download is not the file the source lists"
    summary = json.dumps({"fetch": "complete", "files": 5, "bytes": 400, "downloaded": 400, "alreadyComplete": False})
    run.cluster.objects[("Job", job)]["status"] = {"succeeded": 1}
    run.cluster.job_pod_list[job] = [{"metadata": {"name": "fetch-1"}, "status": {"containerStatuses": [{
        "name": "fetch", "restartCount": 1, "state": {"terminated": {"exitCode": 0, "message": summary}},
        "lastState": {"terminated": {"exitCode": 1, "message": f"{{}}\n{error}"}}}]}}]
    run.once()
    cached = run.condition("ModelCached")
    assert cached["status"] == "True" and cached["message"] == (
        f"400 bytes in PVC {run.status['cache']['claimName']}; completed on a retry; the failed try said: {error}")
    run.cluster.job_pod_list[job] = []  # the finished pod is gone: the status keeps what it read
    run.once()
    assert "md5 mismatch" in run.condition("ModelCached")["message"]


def test_a_download_that_never_failed_says_only_its_size() -> None:
    run, claim, job = cached_run()
    summary = json.dumps({"fetch": "complete", "files": 5, "bytes": 400, "downloaded": 400, "alreadyComplete": False})
    run.cluster.objects[("Job", job)]["status"] = {"succeeded": 1}
    run.cluster.job_pod_list[job] = [{"metadata": {"name": "fetch-1"}, "status": {"containerStatuses": [{
        "name": "fetch", "restartCount": 0, "state": {"terminated": {"exitCode": 0, "message": summary}},
        # a previous run that succeeded (a kubelet restart) is not a failed try
        "lastState": {"terminated": {"exitCode": 0, "message": "error: an old line"}}}]}}]
    run.once()
    assert run.condition("ModelCached")["message"] == f"400 bytes in PVC {claim}"


def test_a_missing_existing_claim_is_named() -> None:
    body = {**CACHED_QWEN, "model": {"name": "Qwen/Qwen3-8B", "cache": {"enabled": True, "existingClaim": "gone"}}}
    run = Run(body)
    run.once()
    assert "PersistentVolumeClaim 'gone'" in run.condition("ModelCached")["message"]
    assert not kinds(run.cluster, "Job") and run.cluster.deployment()["spec"]["replicas"] == 0


def test_an_s3_model_with_a_cache_is_served_from_it() -> None:
    from tests.unit.test_model_sources import S3_SECRETS, S3_TINY  # noqa: PLC0415

    body = {**S3_TINY, "model": dict(S3_TINY["model"])}  # type: ignore[call-overload]
    arch = {"hiddenSize": 64, "numHiddenLayers": 2, "numAttentionHeads": 4, "numKeyValueHeads": 4,
            "intermediateSize": 128, "vocabSize": 1000, "maxPositionEmbeddings": 2048, "weightBytes": 10**8}
    body["model"]["architecture"] = arch  # type: ignore[index]
    run = Run(body, cluster=FakeCluster(secrets=dict(S3_SECRETS)))
    run.once()
    assert run.condition("Planned")["status"] == "True"
    job = kinds(run.cluster, "Job")[0]
    assert job["spec"]["template"]["spec"]["containers"][0]["args"][2] == "s3://models/tiny"
    assert run.cluster.deployment()["spec"]["template"]["spec"]["containers"][0]["args"][0] == "/model-cache/model"


# --- a shared claim in a reconcile: two models, and an object from a release that used model/ -----------------

SHARED_QWEN = {**CACHED_QWEN, "model": {"name": "Qwen/Qwen3-8B", "cache": SHARED}}
SHARED_LLAMA = {**CACHED_QWEN, "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "cache": SHARED}}


def test_a_second_model_on_a_claim_gets_its_own_job_and_is_not_served_the_first_ones_weights() -> None:
    """The bug: the second model found the first one's Job (the same name) complete and loaded its folder."""
    cluster = FakeCluster()
    cluster.objects[("PersistentVolumeClaim", "team-models")] = {"metadata": {"name": "team-models"}}
    qwen = Run(SHARED_QWEN, cluster=cluster, name="qwen")
    qwen.once()
    [qwen_job] = kinds(cluster, "Job")
    cluster.objects[("Job", qwen_job["metadata"]["name"])]["status"] = {"succeeded": 1}
    qwen.once()
    assert qwen.status["cache"]["state"] == "Complete" and cluster.deployment("qwen")["spec"]["replicas"] == 1

    llama = Run(SHARED_LLAMA, cluster=cluster, name="llama")
    llama.once()
    jobs = {j["metadata"]["name"]: j for j in kinds(cluster, "Job")}
    assert len(jobs) == 2  # its own download, not the first model's finished one
    assert llama.status["cache"]["state"] == "Pending" and cluster.deployment("llama")["spec"]["replicas"] == 0
    folders = {run.name: run.status["cache"]["folder"] for run in (qwen, llama)}
    assert folders["qwen"] != folders["llama"]
    for run in (qwen, llama):
        assert cluster.deployment(run.name)["spec"]["template"]["spec"]["containers"][0]["args"][0] == (
            f"/model-cache/{folders[run.name]}")
    llama_job = next(j for j in jobs.values() if j["metadata"]["name"] != qwen_job["metadata"]["name"])
    args = llama_job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--source") + 1] == "hf://meta-llama/Llama-3.1-8B-Instruct"
    assert args[args.index("--dest") + 1] == f"/model-cache/{folders['llama']}"


def test_an_object_cached_in_model_by_an_earlier_release_downloads_once_into_its_folder_and_says_so() -> None:
    """Upgrading: the status an earlier release wrote (no folder, Complete) and its finished ``<claim>-fetch`` Job
    are not taken for the new folder: one download into it, the pods held meanwhile and the condition saying so;
    the old Job is left as it was."""
    cluster = FakeCluster()
    cluster.objects[("PersistentVolumeClaim", "team-models")] = {"metadata": {"name": "team-models"}}
    old_job = {"kind": "Job", "metadata": {"name": "team-models-fetch", "annotations": {}},
               "status": {"succeeded": 1}}
    cluster.objects[("Job", "team-models-fetch")] = copy.deepcopy(old_job)
    run = Run(SHARED_QWEN, cluster=cluster,
              status={"cache": {"claimName": "team-models", "state": "Complete", "bytes": 400, "totalBytes": 400,
                                "percent": 100.0, "message": ""}})
    run.once()
    folder = cache.model_folder(spec(SHARED_QWEN["model"]))  # type: ignore[arg-type]
    assert run.status["cache"]["folder"] == folder and run.status["cache"]["state"] == "Pending"
    assert run.condition("ModelCached")["reason"] == "Pending"
    assert cluster.deployment()["spec"]["replicas"] == 0
    assert cluster.objects[("Job", "team-models-fetch")] == old_job  # left for the user to delete
    new_job = cache.fetch_job_name(spec(SHARED_QWEN["model"]), "team-models")  # type: ignore[arg-type]
    cluster.objects[("Job", new_job)]["status"] = {"succeeded": 1}
    run.once()
    assert run.status["cache"]["state"] == "Complete" and cluster.deployment()["spec"]["replicas"] == 1
