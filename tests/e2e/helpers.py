"""Helpers shared by the end-to-end modules (which import from here and from conftest, never from each
other): applying examples and specs, waiting on conditions, reading pods and args, writing crash evidence, running
helm and the operator with the chart's ServiceAccount."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from hack.localcluster import kubelet

from tests.e2e.conftest import RESYNC_SECONDS, Kubectl, wait_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
KV_MESSAGE = (
    "ValueError: To serve at least one request with the model's max seq len (32768), (4.5 GiB KV cache is needed, "
    "which is larger than the available KV cache memory (3.1 GiB). Based on the available memory, the estimated "
    "maximum model length is 22416. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
    "initializing the engine.\nRuntimeError: Engine core initialization failed. See root cause above.")


def apply_example(kubectl: Kubectl, namespace: str, name: str, **changes: Any) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    for path, value in changes.items():
        node = obj["spec"]
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj))
    return obj


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return dict(c)
    return None


def wait_condition(kubectl: Kubectl, ns: str, name: str, type_: str, status: str,
                   timeout: float = 60) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        obj = kubectl.maybe("llmd", name, "-n", ns)
        c = condition(obj, type_)
        return obj if c and c["status"] == status else None

    result: dict[str, Any] = wait_for(f"{name} {type_}={status}", check, timeout)
    return result


def args_of(deployment: dict[str, Any]) -> list[str]:
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def running_pods(kubectl: Kubectl, ns: str, instance: str) -> list[dict[str, Any]]:
    pods = kubectl.json("pods", "-n", ns, "-l", f"app.kubernetes.io/instance={instance}")["items"]
    return [p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]


def deploy(kubectl: Kubectl, ns: str, name: str = "qwen", serving: dict[str, Any] | None = None,
           **remediation: Any) -> None:
    obj = {"apiVersion": "llm-autopilot.io/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": name},
           "spec": {"model": {"name": "Qwen/Qwen3-8B"},
                    "gpu": {"product": "nvidia-l4", "maxGPUs": 1,
                            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}]},
                    "serving": serving or {"maxModelLen": 32768, "minMaxModelLen": 8192,
                                           "allowedKVCacheDtypes": ["auto", "fp8"]},
                    "remediation": {"cooldownSeconds": 0, **remediation}}}
    kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(obj))
    wait_condition(kubectl, ns, name, "Ready", "True", timeout=90)


def crash(kubectl: Kubectl, ns: str, name: str, reason: str, exit_code: int, message: str = "") -> str:
    """Write a container termination into a Running pod's status, as the kubelet does after a restart."""
    pod = running_pods(kubectl, ns, name)[0]
    status = pod["status"]["containerStatuses"][0]
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    terminated = {"reason": reason, "exitCode": exit_code, "startedAt": stamp, "finishedAt": stamp}
    if message:
        terminated["message"] = message
    status.update(restartCount=int(status.get("restartCount", 0)) + 1, lastState={"terminated": terminated})
    patch = {"status": {"containerStatuses": [status]}}
    kubectl("patch", "pod", pod["metadata"]["name"], "-n", ns, "--subresource=status", "--type=merge",
            "-p", json.dumps(patch))
    return str(pod["metadata"]["name"])


def remediation(kubectl: Kubectl, ns: str, name: str = "qwen") -> dict[str, Any]:
    return dict((kubectl.json("llmd", name, "-n", ns).get("status") or {}).get("remediation") or {})


# --- one-shot pods on the vllm-cpu pool, and S3 requests (the local-volume and model-cache modules) ----------

POD_SECONDS = 120


def s3_request(method: str, url: str, access_key: str, secret_key: str, body: bytes = b"") -> tuple[int, bytes]:
    """One S3 request signed with AWS Signature Version 4 (path-style), standard library only; its source is also
    what a test pod runs (``inspect.getsource``)."""
    import datetime as _dt  # noqa: PLC0415 - the pod runs this function's source alone
    import hashlib as _hashlib  # noqa: PLC0415 - the pod runs this function's source alone
    import hmac as _hmac  # noqa: PLC0415 - the pod runs this function's source alone
    import urllib.error as _error  # noqa: PLC0415 - the pod runs this function's source alone
    import urllib.parse as _parse  # noqa: PLC0415 - the pod runs this function's source alone
    import urllib.request as _request  # noqa: PLC0415 - the pod runs this function's source alone

    parts = _parse.urlsplit(url)
    now = _dt.datetime.now(_dt.UTC)
    amz_date, day, region = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d"), "us-east-1"
    payload = _hashlib.sha256(body).hexdigest()
    path = _parse.quote(_parse.unquote(parts.path) or "/", safe="/~")
    headers = {"host": parts.netloc, "x-amz-content-sha256": payload, "x-amz-date": amz_date}
    signed = ";".join(sorted(headers))
    canonical = "\n".join([method, path, "", *(f"{k}:{headers[k]}" for k in sorted(headers)), "", signed, payload])
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, _hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + secret_key).encode()
    for part in (day, region, "s3", "aws4_request"):
        key = _hmac.new(key, part.encode(), _hashlib.sha256).digest()
    signature = _hmac.new(key, to_sign.encode(), _hashlib.sha256).hexdigest()
    headers["authorization"] = (f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={signed}, "
                                f"Signature={signature}")
    request = _request.Request(url, data=body if method in ("PUT", "POST") else None, method=method,
                               headers={k: v for k, v in headers.items() if k != "host"})
    try:
        with _request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except _error.HTTPError as exc:
        return exc.code, exc.read()


def pod_manifest(name: str, script: str, *, volumes: list[dict[str, Any]] | None = None,
                 mounts: list[dict[str, Any]] | None = None, env: list[dict[str, Any]] | None = None,
                 command: list[str] | None = None) -> dict[str, Any]:
    """A one-shot pod on the vllm-cpu pool (real processes); ``script`` is Python run by the image's python3."""
    container: dict[str, Any] = {"name": "main", "image": "python:3.11",
                                 "command": command or ["python3", "-c", script],
                                 "volumeMounts": mounts or [], "env": env or [],
                                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                                               "limits": {"memory": "1Gi"}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "nodeSelector": {kubelet.POOL_LABEL: kubelet.POOL},
                     "tolerations": [{"key": kubelet.TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                     "volumes": volumes or [], "containers": [container]}}


def apply(kubectl: Kubectl, namespace: str, *objects: dict[str, Any]) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(objects))


def run_pod(kubectl: Kubectl, namespace: str, manifest: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """Create the pod, wait until it has run to its end; its final object and the JSON its last line printed."""
    apply(kubectl, namespace, manifest)
    name = manifest["metadata"]["name"]

    def finished() -> dict[str, Any] | None:
        pod = kubectl.json("pod", name, "-n", namespace)
        return pod if pod["status"].get("phase") in ("Succeeded", "Failed") else None

    pod = wait_for(f"pod {namespace}/{name} to finish", finished, timeout=POD_SECONDS, interval=1)
    logs = kubectl("logs", "-n", namespace, name).stdout
    printed = [line for line in logs.splitlines() if line.startswith("{")]  # stderr (progress bars) is there too
    last = printed[-1] if printed else "null"
    try:
        return pod, json.loads(last)
    except json.JSONDecodeError:
        raise AssertionError(f"pod {name} ended {pod['status']['phase']}; its log:\n{logs}") from None


def volume_with(kubectl: Kubectl, namespace: str, claim: str, files: Mapping[str, Path | bytes]) -> Path:
    """A claim of the default (local-path) class, bound, with ``files`` written into its file system (as a
    user copies weights onto a volume; world-readable); the folder of its PersistentVolume."""
    apply(kubectl, namespace, {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim},
                               "spec": {"accessModes": ["ReadWriteOnce"],
                                        "resources": {"requests": {"storage": "64Mi"}}}})

    def bound() -> dict[str, Any] | None:
        found: dict[str, Any] = kubectl.json("pvc", claim, "-n", namespace)
        return found if found["status"].get("phase") == "Bound" else None

    found = wait_for(f"claim {claim} to be bound", bound, timeout=60, interval=1)
    root = Path(kubectl.json("pv", found["spec"]["volumeName"])["spec"]["hostPath"]["path"])
    for relative, content in files.items():
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copyfile(content, target)  # the cache's blobs, not its symlinks
        else:
            target.write_bytes(content)
        target.chmod(0o644)
    return root


# ---- the Helm chart ---------------------------------------------------------------------------------------

#: a namespaceSelector label no namespace has: the chart's in-cluster webhook (unreachable here) selects nothing
NO_NAMESPACE = "e2e-no-namespace=selected"


def run_helm(helm: Path, *args: str, env: dict[str, str] | None = None,
             check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(helm), *args], capture_output=True, text=True, env=env, timeout=120, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def sa_kubeconfig(kubectl: Kubectl, namespace: str, sa: str, path: Path) -> Path:
    """A kubeconfig for the API server that authenticates with a token of the chart's ServiceAccount."""
    token = kubectl("create", "token", sa, "-n", namespace, "--duration=2h").stdout.strip()
    config = json.loads(kubectl("config", "view", "--raw", "--minify", "-o", "json").stdout)
    config["users"] = [{"name": "chart-sa", "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = "chart-sa"
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


def forbidden(log: str) -> list[str]:
    lines = [line for line in log.splitlines()
             if re.search(r'" 403 |\(403\)|forbidden|Not enough permissions|Failed to post an event', line, re.I)]
    return sorted({line[:400] for line in lines})


def planned(kubectl: Kubectl, namespace: str, name: str) -> bool:
    llmd = kubectl.maybe("llmd", name, "-n", namespace) or {}
    conditions = (llmd.get("status") or {}).get("conditions") or []
    ok = any(c.get("type") == "Planned" and c.get("status") == "True" for c in conditions)
    return ok and kubectl.maybe("deployment", name, "-n", namespace) is not None


def operator_env(kubectl: Kubectl, kubeconfig: Path, **extra: str) -> dict[str, str]:
    return {**kubectl.env, "KUBECONFIG": str(kubeconfig), "LLM_AUTOPILOT_RESYNC_SECONDS": str(RESYNC_SECONDS),
            "HF_ENDPOINT": "http://127.0.0.1:9", "LLM_AUTOPILOT_HUB_TIMEOUT_SECONDS": "1", **extra}
