"""Security on the local control plane: Pod Security "restricted" and refused pods in Ready.

- The vLLM pods meet the "restricted" Pod Security Standard, which the API server enforces on a labelled
  namespace (KWOK then runs the pods).
- When the ReplicaSet cannot create a pod (here: a quota), the LLMDeployment's Ready condition says why.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.e2e.conftest import ROOT, Kubectl, Operator, wait_for

pytestmark = pytest.mark.e2e


def example(**spec: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "qwen3-8b-l4.yaml").read_text())
    for key, value in spec.items():
        doc["spec"][key] = {**doc["spec"].get(key, {}), **value}
    return doc


def condition(kubectl: Kubectl, namespace: str, name: str, type_: str) -> dict[str, Any] | None:
    llmd = kubectl.maybe("llmd", name, "-n", namespace) or {}
    return next((c for c in (llmd.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


def test_vllm_pods_run_in_a_restricted_namespace(kubectl: Kubectl, operator: Operator, namespace: str) -> None:
    kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/enforce-version=latest")
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(example()))

    def running() -> list[dict[str, Any]]:
        pods = kubectl.json("pods", "-n", namespace, "-l", "app.kubernetes.io/instance=qwen3-8b")["items"]
        return [p for p in pods if p["status"].get("phase") == "Running"]

    pod = wait_for("a Running vLLM pod in the restricted namespace", running, timeout=90)[0]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert not any(v.get("projected") for v in pod["spec"].get("volumes", [])), "a ServiceAccount token is mounted"
    ready = wait_for("Ready=True", lambda: (c := condition(kubectl, namespace, "qwen3-8b", "Ready"))
                     and c["status"] == "True" and c, timeout=60)
    assert ready["reason"] == "Available"


def test_ready_says_why_the_replicaset_cannot_create_pods(kubectl: Kubectl, operator: Operator,
                                                          namespace: str) -> None:
    kubectl("create", "quota", "no-pods", "--hard=pods=0", "-n", namespace)
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(example()))

    def refused() -> dict[str, Any] | None:
        c = condition(kubectl, namespace, "qwen3-8b", "Ready")
        return c if c and c["reason"] == "FailedCreate" else None

    ready = wait_for("Ready=False with the ReplicaSet's reason", refused, timeout=90)
    assert ready["status"] == "False"
    assert ready["message"].startswith("the ReplicaSet cannot create pods: ")
    assert "exceeded quota: no-pods" in ready["message"], ready["message"]
