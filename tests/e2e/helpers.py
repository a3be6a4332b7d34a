"""Helpers shared by the end-to-end modules (which import from here and from conftest, never from each
other): applying examples and specs, waiting on conditions, reading pods and args, writing crash evidence."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.conftest import Kubectl, wait_for

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
