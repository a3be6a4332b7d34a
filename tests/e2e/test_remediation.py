"""Remediation on the local control plane: crash evidence written into pod status as the kubelet would."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.conftest import Kubectl, Operator, wait_for
from tests.e2e.helpers import KV_MESSAGE, args_of, crash, deploy, flag, remediation, running_pods, wait_condition

pytestmark = pytest.mark.e2e

def container(kubectl: Kubectl, ns: str, name: str = "qwen") -> dict[str, Any]:
    return dict(kubectl.json("deployment", name, "-n", ns)["spec"]["template"]["spec"]["containers"][0])


def test_oomkilled_raises_the_memory_limit(kubectl: Kubectl, operator: Operator, namespace: str) -> None:
    deploy(kubectl, namespace)
    assert container(kubectl, namespace)["resources"]["limits"]["memory"] == "36Gi"
    crash(kubectl, namespace, "qwen", "OOMKilled", 137)
    wait_for("a larger memory limit",
             lambda: container(kubectl, namespace)["resources"]["limits"]["memory"] == "54Gi", 30)
    rem = wait_for("rung 1 in the status", lambda: (r := remediation(kubectl, namespace)).get("rung") == 1 and r, 10)
    assert rem["history"][-1]["signal"] == "OOMKilled"
    assert rem["history"][-1]["evidence"]["exitCode"] == "137" and rem["history"][-1]["evidence"]["pod"]
    events = kubectl("get", "events", "-n", namespace, "--field-selector", "reason=Remediated").stdout
    assert "memory limit 36Gi -> 54Gi" in events


def test_kv_capacity_error_lowers_max_model_len_to_what_vllm_reported(kubectl: Kubectl, operator: Operator,
                                                                       namespace: str) -> None:
    # planned at 32768 tokens (fp8 KV); vLLM then reports that only 22416 fit. minMaxModelLen lets remediation
    # cut (without it the floor is maxModelLen itself); fp8 only, or the planner would trade length for auto KV.
    deploy(kubectl, namespace, serving={"maxModelLen": 32768, "minMaxModelLen": 8192,
                                        "allowedKVCacheDtypes": ["fp8"]})
    assert flag(args_of(kubectl.json("deployment", "qwen", "-n", namespace)), "--max-model-len") == "32768"
    crash(kubectl, namespace, "qwen", "Error", 1, KV_MESSAGE)

    def lowered() -> str | None:
        value = flag(args_of(kubectl.json("deployment", "qwen", "-n", namespace)), "--max-model-len")
        return value if value != "32768" else None

    new_len = int(wait_for("a shorter max_model_len", lowered, 30))
    assert new_len == 22272  # what vLLM reported, rounded down to 256
    # the operator records the step before it applies the children and writes the new plan into the status
    # after them (reconcile.py::record_first): wait for both, or a quick poll sees rung 1 beside the old plan
    llmd = wait_for("the step and its plan in the status", lambda: (o := kubectl.json("llmd", "qwen", "-n", namespace))[
        "status"].get("remediation", {}).get("rung") == 1 and o["status"]["plan"]["maxModelLen"] == new_len and o, 30)
    assert llmd["status"]["plan"]["maxModelLen"] == new_len
    history = llmd["status"]["remediation"]["history"][-1]
    assert history["signal"] == "KVCapacity" and "estimated 22416" in history["message"]
    assert "estimated maximum model length is 22416" in history["evidence"]["message"]  # vLLM's own line
    # KWOK's simulated kubelet serves no container logs: the evidence fell back, and says so
    source = history["evidence"]["source"]
    assert source.startswith("termination message") and "previous log unavailable" in source, source
    assert llmd["spec"]["serving"]["maxModelLen"] == 32768  # the spec is never written


def test_restart_mid_remediation_does_not_step_twice(kubectl: Kubectl, operator: Operator, namespace: str) -> None:
    deploy(kubectl, namespace)
    crash(kubectl, namespace, "qwen", "OOMKilled", 137)
    wait_for("the first step", lambda: remediation(kubectl, namespace).get("rung") == 1, 30)
    restart = operator.mark()
    operator.stop()
    operator.start()
    operator.wait_reconciles(namespace, "qwen", 3, since=restart)  # the new process resumes and resyncs
    assert remediation(kubectl, namespace)["rung"] == 1
    assert container(kubectl, namespace)["resources"]["limits"]["memory"] == "54Gi"


def test_disabled_remediation_only_reports(kubectl: Kubectl, operator: Operator, namespace: str) -> None:
    deploy(kubectl, namespace, enabled=False)
    before = kubectl.json("deployment", "qwen", "-n", namespace)["metadata"]["generation"]
    crash(kubectl, namespace, "qwen", "OOMKilled", 137)
    llmd = wait_condition(kubectl, namespace, "qwen", "Degraded", "True", timeout=30)
    degraded = next(c for c in llmd["status"]["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "RemediationDisabled" and "OOMKilled" in degraded["message"]
    assert kubectl.json("deployment", "qwen", "-n", namespace)["metadata"]["generation"] == before


def test_non_memory_crash_is_reported_not_remediated(kubectl: Kubectl, operator: Operator, namespace: str) -> None:
    deploy(kubectl, namespace)
    before = kubectl.json("deployment", "qwen", "-n", namespace)["metadata"]["generation"]
    crash(kubectl, namespace, "qwen", "Error", 1, "OSError: qwen/Qwen3-8B does not appear to have a file named x")
    llmd = wait_condition(kubectl, namespace, "qwen", "Degraded", "True", timeout=30)
    assert next(c for c in llmd["status"]["conditions"] if c["type"] == "Degraded")["reason"] == "Crashed"
    assert kubectl.json("deployment", "qwen", "-n", namespace)["metadata"]["generation"] == before


def test_exhausted_after_max_steps(kubectl: Kubectl, operator: Operator, namespace: str) -> None:
    deploy(kubectl, namespace, maxSteps=1)
    crash(kubectl, namespace, "qwen", "OOMKilled", 137)
    wait_for("the first step", lambda: remediation(kubectl, namespace).get("rung") == 1, 30)
    wait_for("the new pod", lambda: running_pods(kubectl, namespace, "qwen") and all(
        p["status"]["containerStatuses"][0].get("restartCount", 0) == 0
        for p in running_pods(kubectl, namespace, "qwen")),
        60)
    crash(kubectl, namespace, "qwen", "OOMKilled", 137)
    llmd = wait_condition(kubectl, namespace, "qwen", "Degraded", "True", timeout=30)
    degraded = next(c for c in llmd["status"]["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "RemediationExhausted" and "after 1 steps" in degraded["message"]
    assert remediation(kubectl, namespace)["rung"] == 1


def test_a_forged_status_step_is_dropped_not_applied(kubectl: Kubectl, operator: Operator, namespace: str) -> None:
    """Issue #15, class 7: someone who may write llmdeployments/status plants applied entries (here without the
    operator's attestation); the operator drops them with an Event and never rolls the Deployment to them."""
    deploy(kubectl, namespace)
    before = kubectl.json("deployment", "qwen", "-n", namespace)
    forged = {"status": {"remediation": {"rung": 1, "applied": [{"gpuMemoryUtilization": 0.7, "maxNumSeqs": 8}]}}}
    mark = operator.mark()
    kubectl("patch", "llmd", "qwen", "-n", namespace, "--subresource=status", "--type=merge", "-p",
            json.dumps(forged))
    wait_for("the forged step dropped", lambda: remediation(kubectl, namespace).get("applied") == [], 60)
    operator.wait_reconciles(namespace, "qwen", 1, since=mark)
    events = wait_for("the UnattributedRemediation Event", lambda: kubectl.json(
        "events", "-n", namespace, "--field-selector", "reason=UnattributedRemediation")["items"], 30)
    assert "not attested by this operator" in events[0]["message"], events[0]["message"]
    after = kubectl.json("deployment", "qwen", "-n", namespace)
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert args_of(after) == args_of(before) and remediation(kubectl, namespace)["rung"] == 0
