"""Security on the local control plane: Pod Security "restricted", refused pods in Ready, and Secret access.

- The vLLM pods meet the "restricted" Pod Security Standard, which the API server enforces on a labelled
  namespace (KWOK then runs the pods).
- When the ReplicaSet cannot create a pod (here: a quota), the LLMDeployment's Ready condition says why.
- The webhook asks the API server, in the requesting user's name, whether they may read every Secret the spec
  would hand to the pods, and refuses otherwise; the users are ServiceAccounts authenticating with their tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
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


# ---- Secrets: SubjectAccessReview as the requesting user -----------------------------------------------


def token_kubeconfig(kubectl: Kubectl, namespace: str, sa: str, path: Path) -> Path:
    """A kubeconfig that authenticates only with a token of the ServiceAccount (no admin certificate)."""
    token = kubectl("create", "token", sa, "-n", namespace, "--duration=1h").stdout.strip()
    config = json.loads(kubectl("config", "view", "--raw", "--minify", "-o", "json").stdout)
    config["users"] = [{"name": sa, "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = sa
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


@pytest.fixture
def users(kubectl: Kubectl, namespace: str, tmp_path: Path) -> dict[str, Kubectl]:
    """`reader` may get Secret hf-token, `outsider` may not; both may create and edit LLMDeployments."""
    kubectl("create", "secret", "generic", "hf-token", "--from-literal=token=hf_test", "-n", namespace)
    kubectl("create", "secret", "generic", "db-password", "--from-literal=pw=secret", "-n", namespace)
    kubectl("create", "role", "llmd-editor", "-n", namespace, "--verb=get,list,watch,create,update,patch",
            "--resource=llmdeployments.llm-autopilot.io")
    kubectl("create", "role", "hf-token-reader", "-n", namespace, "--verb=get", "--resource=secrets",
            "--resource-name=hf-token")
    result = {}
    for sa in ("reader", "outsider"):
        kubectl("create", "serviceaccount", sa, "-n", namespace)
        kubectl("create", "rolebinding", f"{sa}-llmd-editor", "-n", namespace, "--role=llmd-editor",
                f"--serviceaccount={namespace}:{sa}")
        path = token_kubeconfig(kubectl, namespace, sa, tmp_path / f"{sa}.kubeconfig")
        result[sa] = Kubectl({**kubectl.env, "KUBECONFIG": str(path)})
    kubectl("create", "rolebinding", "reader-hf-token", "-n", namespace, "--role=hf-token-reader",
            f"--serviceaccount={namespace}:reader")
    return result


def apply_as(user: Kubectl, namespace: str, doc: dict[str, Any], *flags: str) -> tuple[int, str]:
    result = user("apply", "-n", namespace, *flags, "-f", "-", input=yaml.safe_dump(doc), check=False)
    return result.returncode, result.stderr.strip()


def test_webhook_refuses_secrets_the_user_may_not_read(kubectl: Kubectl, operator: Operator, namespace: str,
                                                       users: dict[str, Kubectl]) -> None:
    reader, outsider = users["reader"], users["outsider"]
    whoami = json.loads(outsider("auth", "whoami", "-o", "json").stdout)["status"]["userInfo"]["username"]
    assert whoami == f"system:serviceaccount:{namespace}:outsider"
    hub_token = example(model={"hubTokenSecretRef": {"name": "hf-token", "key": "token"}})
    db_env = example(vllm={"env": [{"name": "DB_PASSWORD",
                                    "valueFrom": {"secretKeyRef": {"name": "db-password", "key": "pw"}}}]})

    # the RBAC the test set up holds: the outsider cannot read the Secret directly
    assert outsider("get", "secret", "hf-token", "-n", namespace, check=False).returncode != 0

    code, message = apply_as(outsider, namespace, hub_token, "--dry-run=server")
    assert code != 0 and "denied the request" in message, message
    assert (f"system:serviceaccount:{namespace}:outsider may not get Secret 'hf-token' in namespace "
            f"'{namespace}'") in message
    code, message = apply_as(outsider, namespace, example(), "--dry-run=server")
    assert code == 0, message  # no Secret named: nothing to check
    code, message = apply_as(reader, namespace, db_env, "--dry-run=server")
    assert code != 0 and "may not get Secret 'db-password'" in message, message

    # the reader may hand hf-token to the pods, and the operator then does
    code, message = apply_as(reader, namespace, hub_token)
    assert code == 0, message
    wait_for("the Deployment", lambda: kubectl.maybe("deployment", "qwen3-8b", "-n", namespace), timeout=60)
    env = kubectl.json("deployment", "qwen3-8b", "-n", namespace)["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}} in env

    # and the outsider cannot take over that object to read it either: every spec change is checked
    code, message = apply_as(outsider, namespace, {**hub_token, "spec": {**hub_token["spec"], "replicas": 2}})
    assert code != 0 and "may not get Secret 'hf-token'" in message, message
    assert kubectl.json("llmd", "qwen3-8b", "-n", namespace)["spec"].get("replicas", 1) == 1
