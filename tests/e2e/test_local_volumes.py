"""The local cluster's real parts for model storage, seen from pods of the process kubelet (vllm-cpu pool):

- a pod gets only what its spec mounts: an emptyDir starts empty, a pod that mounts nothing sees no model cache;
- a model download goes to the local Hub-shaped server for real and is counted in its log;
- a PersistentVolumeClaim of the default StorageClass is provisioned, bound and mounted; its size is a real
  limit (ENOSPC), a read-only mount refuses a write (EROFS), and its storage goes with the claim;
- a pre-created (static) volume carries files into a pod (the air-gapped case);
- a Job's pod runs to completion, with the operator's own image (`llm-autopilot`);
- an object PUT into SeaweedFS with the cluster's keys is read from inside a pod, and SeaweedFS's own access
  log shows exactly one GET of it.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import Kubectl, wait_for
from tests.e2e.helpers import POD_SECONDS, apply, pod_manifest, run_pod, s3_request
from tests.e2e.real_vllm import MODEL, real_vllm_fixture  # noqa: F401 - a fixture

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("real_vllm")]

def pod_ip_range(kubectl: Kubectl) -> str:
    """The pod bridge's subnet prefix (e.g. ``10.224.``): requests from pods come from there."""
    base = int(kubectl.env.get("LLM_AUTOPILOT_PORT_BASE", "26400"))
    return f"10.{150 + (base // 100) % 100}."


def log_lines(path: Path, since: float) -> list[dict[str, Any]]:
    lines = []
    for text in path.read_text(errors="replace").splitlines():
        if text.startswith("{"):
            line = json.loads(text)
            if float(line.get("time", 0)) >= since:
                lines.append(line)
    return lines


def test_an_empty_dir_starts_empty_and_a_pod_that_mounts_nothing_sees_no_model_cache(
        kubectl: Kubectl, namespace: str) -> None:
    script = f"""
import json, os
from huggingface_hub import constants, snapshot_download
from huggingface_hub.errors import LocalEntryNotFoundError
scratch = sorted(os.listdir("/scratch"))
open("/scratch/written", "w").write("x")
try:
    snapshot_download({MODEL!r}, local_files_only=True)
    cached = True
except LocalEntryNotFoundError:
    cached = False
print(json.dumps({{"scratch": scratch, "home": sorted(os.listdir(os.environ["HOME"])), "cached": cached,
                  "hub_cache_exists": os.path.exists(constants.HF_HUB_CACHE), "offline": constants.HF_HUB_OFFLINE,
                  "env": sorted(k for k in os.environ if k.startswith(("HF_", "TRANSFORMERS")))}}))
"""
    pod, seen = run_pod(kubectl, namespace, pod_manifest(
        "empty", script, volumes=[{"name": "scratch", "emptyDir": {}}],
        mounts=[{"name": "scratch", "mountPath": "/scratch"}]))
    assert pod["status"]["phase"] == "Succeeded", seen
    assert seen["scratch"] == [] and seen["home"] == [], seen
    assert seen["cached"] is False and seen["hub_cache_exists"] is False and seen["offline"] is False, seen
    assert seen["env"] == ["HF_ENDPOINT"], seen  # the one network stand-in; no HF_HUB_CACHE, no HF_HUB_OFFLINE
    # a second pod with the same spec gets its own, empty emptyDir
    _, again = run_pod(kubectl, namespace, pod_manifest(
        "empty-again", script, volumes=[{"name": "scratch", "emptyDir": {}}],
        mounts=[{"name": "scratch", "mountPath": "/scratch"}]))
    assert again["scratch"] == [], again


def test_a_download_from_the_hub_is_real_and_counted_in_its_log(kubectl: Kubectl, namespace: str) -> None:
    hub_log = Path(kubectl.env["LLM_AUTOPILOT_HUB_LOG"])
    since = time.time() - 1
    script = f"""
import json, os, time
from huggingface_hub import snapshot_download
start = time.monotonic()
folder = snapshot_download({MODEL!r})
files = {{name: os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder)}}
print(json.dumps({{"seconds": round(time.monotonic() - start, 2), "files": files}}))
"""
    pod, seen = run_pod(kubectl, namespace, pod_manifest(
        "download", script, volumes=[{"name": "home", "emptyDir": {}}],
        mounts=[{"name": "home", "mountPath": "/home/probe"}], env=[{"name": "HOME", "value": "/home/probe"}]))
    assert pod["status"]["phase"] == "Succeeded", seen
    assert "model.safetensors" in seen["files"] and "config.json" in seen["files"], seen
    pod_ip = pod["status"]["podIP"]
    assert pod_ip.startswith(pod_ip_range(kubectl)), pod_ip
    downloads = [line for line in log_lines(hub_log, since) if line["download"] and line["client"] == pod_ip]
    got = {line["path"].rsplit("/", 1)[-1]: line["bytes"] for line in downloads}
    assert got == seen["files"], (got, seen["files"])  # each file once, every byte from the Hub
    assert len(downloads) == len(seen["files"]), downloads
    print(f"\n[local volumes] {MODEL} downloaded from the local Hub in {seen['seconds']} s "
          f"({sum(got.values())} bytes, {len(got)} files)")


def test_a_claim_of_the_default_class_is_provisioned_bound_mounted_and_enforced(
        kubectl: Kubectl, namespace: str) -> None:
    apply(kubectl, namespace, {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "cache"},
                               "spec": {"accessModes": ["ReadWriteOnce"],
                                        "resources": {"requests": {"storage": "16Mi"}}}})
    def bound() -> dict[str, Any] | None:
        found: dict[str, Any] = kubectl.json("pvc", "cache", "-n", namespace)
        return found if found["status"].get("phase") == "Bound" else None

    claim = wait_for("the claim to be bound", bound, timeout=60, interval=1)
    assert claim["spec"]["storageClassName"] == "local-path"  # the default class, filled in at admission
    volume = kubectl.json("pv", claim["spec"]["volumeName"])
    assert volume["spec"]["capacity"]["storage"] == str(16 * 2**20)
    assert volume["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
    folder = Path(volume["spec"]["hostPath"]["path"])
    image = folder.with_suffix(".img")
    assert image.is_file() and image.stat().st_size == 16 * 2**20

    writer = """
import errno, json, os
open("/data/hello", "w").write("written by the first pod")
full = None
try:
    with open("/data/fill", "wb") as f:
        for _ in range(64):
            f.write(b"\\0" * 2**20)
            f.flush()
            os.fsync(f.fileno())
except OSError as exc:
    full = errno.errorcode[exc.errno]
os.remove("/data/fill")
print(json.dumps({"full": full}))
"""
    pod, seen = run_pod(kubectl, namespace, pod_manifest(
        "writer", writer, volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "cache"}}],
        mounts=[{"name": "data", "mountPath": "/data"}]))
    assert pod["status"]["phase"] == "Succeeded", seen
    assert seen["full"] == "ENOSPC", seen  # 64 MiB do not fit a 16Mi volume

    reader = """
import errno, json
text = open("/data/hello").read()
try:
    open("/data/other", "w").write("no")
    refused = None
except OSError as exc:
    refused = errno.errorcode[exc.errno]
print(json.dumps({"text": text, "refused": refused}))
"""
    for name, volume_source, mount in (
            ("reader-mount", {"claimName": "cache"}, {"name": "data", "mountPath": "/data", "readOnly": True}),
            ("reader-claim", {"claimName": "cache", "readOnly": True}, {"name": "data", "mountPath": "/data"})):
        pod, seen = run_pod(kubectl, namespace, pod_manifest(
            name, reader, volumes=[{"name": "data", "persistentVolumeClaim": volume_source}], mounts=[mount]))
        assert seen == {"text": "written by the first pod", "refused": "EROFS"}, (name, seen)

    kubectl("delete", "pods", "--all", "-n", namespace, "--wait=true", "--timeout=60s")
    kubectl("delete", "pvc", "cache", "-n", namespace, "--wait=true", "--timeout=60s")
    wait_for("the volume and its storage to be deleted",
             lambda: kubectl.maybe("pv", volume["metadata"]["name"]) is None and not image.exists(), timeout=60)


def test_a_static_volume_carries_config_json_into_a_pod(kubectl: Kubectl, namespace: str, tmp_path: Path) -> None:
    folder = tmp_path / "weights"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    pv_name = f"e2e-static-{uuid.uuid4().hex[:8]}"
    try:
        kubectl("apply", "-f", "-", input=yaml.safe_dump({
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv_name},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"], "storageClassName": "",
                     "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(folder)},
                     "claimRef": {"namespace": namespace, "name": "weights"}}}))
        apply(kubectl, namespace, {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                   "metadata": {"name": "weights"},
                                   "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "",
                                            "volumeName": pv_name, "resources": {"requests": {"storage": "1Gi"}}}})
        wait_for("the static claim to be bound", lambda: kubectl.json("pvc", "weights", "-n", namespace)["status"]
                 .get("phase") == "Bound", timeout=60, interval=1)
        script = 'import json; print(json.dumps(json.load(open("/models/config.json"))))'
        pod, seen = run_pod(kubectl, namespace, pod_manifest(
            "static", script, volumes=[{"name": "m", "persistentVolumeClaim": {"claimName": "weights"}}],
            mounts=[{"name": "m", "mountPath": "/models", "readOnly": True}]))
        assert pod["status"]["phase"] == "Succeeded" and seen == {"model_type": "llama", "hidden_size": 64}, seen
    finally:
        kubectl("delete", "pods,pvc", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False)
        kubectl("delete", "pv", pv_name, "--wait=true", "--timeout=60s", check=False)
    assert (folder / "config.json").is_file()  # Retain: a static volume's files are the owner's


def test_a_job_runs_to_completion_with_the_operators_image(kubectl: Kubectl, namespace: str) -> None:
    template = pod_manifest("fill", "", command=["llm-autopilot", "--help"])
    for field in ("apiVersion", "kind", "metadata"):
        del template[field]
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "fill"},
           "spec": {"backoffLimit": 0, "template": template}}
    apply(kubectl, namespace, job)

    def complete() -> dict[str, Any] | None:
        status = kubectl.json("job", "fill", "-n", namespace).get("status") or {}
        done = {c["type"] for c in status.get("conditions") or [] if c.get("status") == "True"}
        assert "Failed" not in done, status
        return status if "Complete" in done else None

    status = wait_for("the Job to complete", complete, timeout=POD_SECONDS, interval=1)
    assert status["succeeded"] == 1, status
    pod = kubectl.json("pods", "-n", namespace, "-l", "job-name=fill")["items"][0]
    assert pod["status"]["phase"] == "Succeeded"
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert "Usage: llm-autopilot" in kubectl("logs", "-n", namespace, pod["metadata"]["name"]).stdout


def test_an_object_in_seaweedfs_is_read_from_a_pod_with_the_keys_and_logged_once(
        kubectl: Kubectl, namespace: str) -> None:
    endpoint = kubectl.env["LLM_AUTOPILOT_S3_ENDPOINT"]
    access, secret = kubectl.env["LLM_AUTOPILOT_S3_ACCESS_KEY"], kubectl.env["LLM_AUTOPILOT_S3_SECRET_KEY"]
    access_log = Path(kubectl.env["LLM_AUTOPILOT_S3_ACCESS_LOG"])
    bucket, key = f"e2e-{uuid.uuid4().hex[:8]}", "tiny/model.safetensors"
    content = os.urandom(200_000)
    url = f"{endpoint}/{bucket}/{key}"
    since = int(time.time())  # the log's times are whole seconds
    try:
        assert s3_request("PUT", f"{endpoint}/{bucket}", access, secret)[0] == 200
        assert s3_request("PUT", url, access, secret, content)[0] == 200
        try:  # unsigned: refused
            urllib.request.urlopen(url, timeout=10)
            raise AssertionError("an anonymous GET was answered")
        except urllib.error.HTTPError as exc:
            assert exc.code == 403, exc.code
        kubectl("create", "secret", "generic", "s3", "-n", namespace, f"--from-literal=access={access}",
                f"--from-literal=secret={secret}")
        script = inspect.getsource(s3_request) + f"""
import hashlib, json, os
status, body = s3_request("GET", {url!r}, os.environ["S3_ACCESS"], os.environ["S3_SECRET"])
print(json.dumps({{"status": status, "sha256": hashlib.sha256(body).hexdigest(), "bytes": len(body)}}))
"""
        env = [{"name": f"S3_{k.upper()}", "valueFrom": {"secretKeyRef": {"name": "s3", "key": k}}}
               for k in ("access", "secret")]
        pod, seen = run_pod(kubectl, namespace, pod_manifest("s3-get", script, env=env))
        assert pod["status"]["phase"] == "Succeeded", seen
        assert seen == {"status": 200, "sha256": hashlib.sha256(content).hexdigest(), "bytes": len(content)}, seen

        def gets(status: int) -> list[dict[str, Any]]:
            return [r for r in log_lines(access_log, since) if r.get("operation") == "REST.GET.OBJECT"
                    and r.get("bucket") == bucket and r.get("key", "").lstrip("/") == key and r["status"] == status]

        # its log is sent asynchronously: wait for the record, then count
        found = wait_for("SeaweedFS's access log to show the pod's GET", lambda: gets(200), timeout=30)
        assert len(found) == 1, found
        assert found[0]["remote_ip"].startswith(pod["status"]["podIP"]), found
        assert found[0]["access_key_id"] == access, found
        refused = gets(403)  # the anonymous GET above, logged as refused
        assert len(refused) == 1 and refused[0]["access_key_id"] == "", refused
    finally:
        s3_request("DELETE", url, access, secret)
        s3_request("DELETE", f"{endpoint}/{bucket}", access, secret)

