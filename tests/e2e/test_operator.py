"""The operator against the real local control plane: API server, scheduler, controllers, KWOK GPU nodes."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import RESYNC_SECONDS, Kubectl, Operator, _free_port, wait_for
from tests.e2e.helpers import EXAMPLES, apply_example, args_of, condition, flag, running_pods, wait_condition

pytestmark = pytest.mark.e2e
#: deleting an LLMDeployment: Kopf removes its finalizer at once, or, when the resync timer is mid-run, at its
#: next check (settings.background.cancellation_polling, 60 s); with room for a loaded machine
DELETE_SECONDS = 60 + 60


def node_product(kubectl: Kubectl, node: str) -> str:
    return str(kubectl.json("node", node)["metadata"]["labels"]["nvidia.com/gpu.product"])


def test_qwen3_8b_on_l4(kubectl: Kubectl, operator: Operator, namespace: str) -> None:
    apply_example(kubectl, namespace, "qwen3-8b-l4.yaml")
    llmd = wait_condition(kubectl, namespace, "qwen3-8b", "Planned", "True")
    plan = llmd["status"]["plan"]
    assert plan["summary"] == "1 x L4" and plan["kvCacheDtype"] == "fp8" and plan["maxModelLen"] == 32768
    assert plan["memory"]["kvCacheGiB"] > 0 and plan["reasons"]

    dep = kubectl.json("deployment", "qwen3-8b", "-n", namespace)
    args = args_of(dep)
    assert args[0] == "Qwen/Qwen3-8B"
    assert flag(args, "--tensor-parallel-size") == "1" and flag(args, "--max-model-len") == "32768"
    assert flag(args, "--kv-cache-dtype") == "fp8" and args == plan["args"]
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    terms = dep["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == ["NVIDIA-L4"]
    owner = dep["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "LLMDeployment" and owner["controller"] is True
    assert dep["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "llm-autopilot"
    for kind in ("service", "poddisruptionbudget"):
        assert kubectl.json(kind, "qwen3-8b", "-n", namespace)["metadata"]["ownerReferences"][0]["uid"] == owner["uid"]

    pods = wait_for("a Running pod", lambda: running_pods(kubectl, namespace, "qwen3-8b"), 60)
    assert node_product(kubectl, pods[0]["spec"]["nodeName"]) == "NVIDIA-L4"
    wait_condition(kubectl, namespace, "qwen3-8b", "Ready", "True")
    table = kubectl("get", "llmd", "-n", namespace).stdout
    header, row = table.splitlines()[0].split(), table.splitlines()[1]
    assert header[:10] == ["NAME", "MODEL", "GPUS", "QUANTIZATION", "MAXLEN", "REPLICAS", "AVAILABLE", "READY",
                           "RUNG", "AGE"]
    for cell in ("Qwen/Qwen3-8B", "1 x L4", "bf16", "32768", "True"):
        assert cell in row


def test_llama70b_on_h100_gets_tensor_parallelism(kubectl: Kubectl, operator: Operator, namespace: str) -> None:
    apply_example(kubectl, namespace, "llama-3.1-70b-h100.yaml")
    plan = wait_condition(kubectl, namespace, "llama-70b", "Planned", "True")["status"]["plan"]
    tp = plan["tensorParallelSize"]
    assert tp in (2, 4, 8) and plan["gpus"] == tp
    dep = kubectl.json("deployment", "llama-70b", "-n", namespace)
    args = args_of(dep)
    assert flag(args, "--tensor-parallel-size") == str(tp) and flag(args, "--served-model-name") == "llama-70b"
    assert dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == str(tp)
    pods = wait_for("a Running pod", lambda: running_pods(kubectl, namespace, "llama-70b"), 60)
    assert node_product(kubectl, pods[0]["spec"]["nodeName"]) == "NVIDIA-H100-80GB-HBM3"


def test_qwen3_30b_a3b_on_a100_two_replicas(kubectl: Kubectl, operator: Operator, namespace: str) -> None:
    apply_example(kubectl, namespace, "qwen3-30b-a3b-a100.yaml")
    plan = wait_condition(kubectl, namespace, "qwen3-30b-a3b", "Planned", "True")["status"]["plan"]
    assert plan["gpuProduct"] == "nvidia-a100-40gb" and plan["memory"]["maxConcurrency"] >= 8
    pods = wait_for("two Running pods",
                    lambda: (p if len(p := running_pods(kubectl, namespace, "qwen3-30b-a3b")) == 2 else None), 90)
    assert {node_product(kubectl, p["spec"]["nodeName"]) for p in pods} == {"NVIDIA-A100-SXM4-40GB"}
    wait_condition(kubectl, namespace, "qwen3-30b-a3b", "Ready", "True", timeout=90)


def test_gpu_pool_discovered_when_no_product_is_named(kubectl: Kubectl, operator: Operator, namespace: str) -> None:
    obj = {"apiVersion": "llm-autopilot.io/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": "auto"},
           "spec": {"model": {"name": "Qwen/Qwen3-4B"}, "serving": {"maxModelLen": 16384},
                    "gpu": {"tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}]}}}
    result = kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj))
    assert "not set" in result.stderr  # the webhook's warning
    plan = wait_condition(kubectl, namespace, "auto", "Planned", "True")["status"]["plan"]
    assert plan["summary"] == "1 x L4"  # the pool with the least GPU memory that fits


def test_spec_update_rolls_the_new_plan(kubectl: Kubectl, operator: Operator, namespace: str) -> None:
    apply_example(kubectl, namespace, "qwen3-8b-l4.yaml")
    wait_condition(kubectl, namespace, "qwen3-8b", "Ready", "True", timeout=90)
    before = kubectl.json("deployment", "qwen3-8b", "-n", namespace)
    old_pods = {p["metadata"]["name"] for p in running_pods(kubectl, namespace, "qwen3-8b")}
    apply_example(kubectl, namespace, "qwen3-8b-l4.yaml", **{"serving.maxModelLen": 16384})

    def rolled() -> dict[str, Any] | None:
        dep = kubectl.json("deployment", "qwen3-8b", "-n", namespace)
        return dep if flag(args_of(dep), "--max-model-len") == "16384" else None

    after = wait_for("the new plan in the Deployment", rolled, 60)
    assert after["metadata"]["generation"] > before["metadata"]["generation"]
    assert flag(args_of(after), "--kv-cache-dtype") if "--kv-cache-dtype" in args_of(after) else True
    new_pods = wait_for("a pod of the new plan", lambda: {
        p["metadata"]["name"] for p in running_pods(kubectl, namespace, "qwen3-8b")} - old_pods, 90)
    assert new_pods

    def ready_for_the_update() -> dict[str, Any] | None:  # Ready was True before the update too
        obj = kubectl.maybe("llmd", "qwen3-8b", "-n", namespace)
        ready = condition(obj, "Ready")
        current = obj is not None and obj["status"].get("observedGeneration") == obj["metadata"]["generation"]
        return obj if current and ready and ready["status"] == "True" else None

    llmd = wait_for("Ready=True with the update's generation observed", ready_for_the_update, 90)
    assert llmd["status"]["plan"]["maxModelLen"] == 16384
    assert llmd["status"]["observedGeneration"] == llmd["metadata"]["generation"]


def test_delete_garbage_collects_children(kubectl: Kubectl, operator: Operator, namespace: str) -> None:
    apply_example(kubectl, namespace, "qwen3-8b-l4.yaml")
    wait_condition(kubectl, namespace, "qwen3-8b", "Planned", "True")
    wait_for("the Deployment", lambda: kubectl.maybe("deployment", "qwen3-8b", "-n", namespace))
    # not `kubectl delete`'s own wait: it would outlast Kubectl's 60 s subprocess timeout when Kopf holds the
    # finalizer for its cancellation polling
    kubectl("delete", "llmd", "qwen3-8b", "-n", namespace, "--wait=false")
    wait_for("the LLMDeployment to be gone (its finalizer removed)",
             lambda: kubectl.maybe("llmd", "qwen3-8b", "-n", namespace) is None, DELETE_SECONDS)
    for kind in ("deployment", "service", "poddisruptionbudget"):
        wait_for(f"{kind} to be garbage-collected",
                 lambda kind=kind: kubectl.maybe(kind, "qwen3-8b", "-n", namespace) is None, 60)


def test_kopf_registers_the_webhook_configuration(kubectl: Kubectl, namespace: str, tmp_path: Path) -> None:
    """`make dev`'s way (LLM_AUTOPILOT_WEBHOOK_MANAGED unset): Kopf registers the ValidatingWebhookConfiguration
    itself. The session operator registers a namespace-limited one instead (Kopf's selects every namespace),
    so this runs its own operator."""
    port = _free_port()
    env = {**kubectl.env, "LLM_AUTOPILOT_RESYNC_SECONDS": str(RESYNC_SECONDS), "LLM_AUTOPILOT_WEBHOOK": "true",
           "LLM_AUTOPILOT_WEBHOOK_PORT": str(port), "LLM_AUTOPILOT_WEBHOOK_CERT_DIR": str(tmp_path / "certs"),
           "HF_ENDPOINT": "http://127.0.0.1:9", "LLM_AUTOPILOT_HUB_TIMEOUT_SECONDS": "1"}
    op = Operator(env, tmp_path / "operator.log", [f"--namespace={namespace}"]).start()
    try:
        # Kopf creates the configuration first and patches its webhooks in after: wait for the webhooks
        def registered() -> dict[str, Any] | None:
            if not op.alive():
                return None
            vwc = kubectl.maybe("validatingwebhookconfiguration", "llm-autopilot.io")
            return vwc if vwc and vwc.get("webhooks") else None

        vwc = wait_for("Kopf's webhook configuration with its webhooks", registered)
        assert vwc["webhooks"][0]["clientConfig"]["url"] == f"https://127.0.0.1:{port}/validate-llmdeployment"

        def denied() -> str | None:
            infeasible = str(EXAMPLES / "infeasible-llama-405b.yaml")
            result = kubectl("apply", "--dry-run=server", "-n", namespace, "-f", infeasible, check=False)
            return result.stderr if result.returncode != 0 and "denied the request" in result.stderr else None

        assert "needs at least 8 x H100-80GB" in wait_for("the API server calling Kopf's webhook", denied)
    finally:
        op.stop()
        # Kopf registers an (empty) mutating configuration of the same name beside the validating one
        kubectl("delete", "validatingwebhookconfiguration,mutatingwebhookconfiguration", "llm-autopilot.io",
                "--ignore-not-found", check=False)


def test_webhook_rejects_infeasible_with_the_planners_message(kubectl: Kubectl, operator: Operator,
                                                              namespace: str) -> None:
    result = kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / "infeasible-llama-405b.yaml"), check=False)
    assert result.returncode != 0
    assert "needs at least 8 x H100-80GB with fp8 weights" in result.stderr and "maxGPUs is 4" in result.stderr
    assert kubectl.maybe("llmd", "llama-405b", "-n", namespace) is None


def test_webhook_rejects_malformed_and_owned_args(kubectl: Kubectl, operator: Operator, namespace: str) -> None:
    bad = {"apiVersion": "llm-autopilot.io/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": "bad"},
           "spec": {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-a1000"}}}
    result = kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(bad), check=False)
    assert result.returncode != 0 and "unknown GPU 'nvidia-a1000'" in result.stderr
    cel = {**bad, "spec": {"model": {"name": "Qwen/Qwen3-8B"},
                           "serving": {"maxModelLen": 4096, "minMaxModelLen": 8192}}}
    result = kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(cel), check=False)
    assert result.returncode != 0 and "minMaxModelLen" in result.stderr
    owned = {**bad, "spec": {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-h100-80gb"},
                             "vllm": {"extraArgs": ["--gpu_memory_utilization=0.99"]}}}
    result = kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(owned), check=False)
    assert result.returncode != 0 and "spec.vllm.extraArgs[0]: --gpu_memory_utilization" in result.stderr
    assert "spec.vllm.gpuMemoryUtilization" in result.stderr, result.stderr


def test_infeasible_at_reconcile_then_recovers(kubectl: Kubectl, operator: Operator, namespace: str) -> None:
    # No product named: the webhook cannot check it; the operator finds no pool that fits.
    obj = {"apiVersion": "llm-autopilot.io/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": "big"},
           "spec": {"model": {"name": "meta-llama/Llama-3.1-405B"}, "gpu": {
               "maxGPUs": 4, "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}]},
               "serving": {"maxModelLen": 8192}}}
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj))
    llmd = wait_condition(kubectl, namespace, "big", "Planned", "False")
    assert "does not fit on any GPU pool" in condition(llmd, "Planned")["message"]  # type: ignore[index]
    assert kubectl.maybe("deployment", "big", "-n", namespace) is None  # no workload churn
    obj["spec"]["gpu"]["maxGPUs"] = 8
    obj["spec"]["serving"]["allowedQuantizations"] = ["none", "fp8"]
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj))
    plan = wait_condition(kubectl, namespace, "big", "Planned", "True")["status"]["plan"]
    assert plan["summary"] == "8 x H100-80GB" and plan["quantization"] == "fp8"
    assert kubectl.json("deployment", "big", "-n", namespace)


def _versions(kubectl: Kubectl, ns: str, name: str) -> dict[str, str]:
    return {kind: kubectl.json(kind, name, "-n", ns)["metadata"]["resourceVersion"]
            for kind in ("llmd", "deployment", "service", "poddisruptionbudget")}


def settled_versions(kubectl: Kubectl, operator: Operator, ns: str, name: str) -> dict[str, str]:
    """The objects' resourceVersions once a complete reconcile of `name` changed none of them (the last
    status writes of the roll-out are over)."""
    def unchanged_across_a_reconcile() -> dict[str, str] | None:
        before, mark = _versions(kubectl, ns, name), operator.mark()
        operator.wait_reconciles(ns, name, 1, since=mark)
        return before if _versions(kubectl, ns, name) == before else None

    result: dict[str, str] = wait_for(f"{name}'s objects to settle", unchanged_across_a_reconcile, 120)
    return result


def test_resync_and_restart_write_nothing(kubectl: Kubectl, operator: Operator, namespace: str) -> None:
    apply_example(kubectl, namespace, "qwen3-8b-l4.yaml")
    wait_condition(kubectl, namespace, "qwen3-8b", "Ready", "True", timeout=90)
    before = settled_versions(kubectl, operator, namespace, "qwen3-8b")
    operator.wait_reconciles(namespace, "qwen3-8b", 3, since=operator.mark())  # several resyncs
    assert _versions(kubectl, namespace, "qwen3-8b") == before, "a resync wrote"
    restart = operator.mark()
    operator.stop()
    operator.start()
    operator.wait_reconciles(namespace, "qwen3-8b", 3, since=restart)  # startup and several resyncs
    assert operator.process is not None and operator.process.poll() is None, operator.output()[-2000:]
    assert _versions(kubectl, namespace, "qwen3-8b") == before, "the restarted operator wrote"


def test_operator_metrics(kubectl: Kubectl, operator: Operator, namespace: str) -> None:
    apply_example(kubectl, namespace, "qwen3-8b-l4.yaml")
    wait_condition(kubectl, namespace, "qwen3-8b", "Planned", "True")
    kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / "infeasible-llama-405b.yaml"), check=False)
    url = f"http://127.0.0.1:{operator.env['LLM_AUTOPILOT_METRICS_PORT']}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    samples = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
               if line.startswith("llm_autopilot_")}
    assert samples['llm_autopilot_reconciles_total{result="ok"}'] >= 1
    assert samples['llm_autopilot_plans_total{outcome="feasible"}'] >= 1
    assert samples['llm_autopilot_admission_reviews_total{verdict="rejected"}'] >= 1
    assert samples["llm_autopilot_plan_duration_seconds_count"] >= 1


def test_kubectl_explain_documents_the_api(kubectl: Kubectl) -> None:
    def explained() -> str | None:
        result = kubectl("explain", "llmd.spec.gpu", check=False)
        return result.stdout if result.returncode == 0 else None

    text = wait_for("the schema in discovery", explained, 30)
    assert "maxGPUs" in text and "Most GPUs one replica may use" in text
    status = kubectl("explain", "llmd.status.plan.memory").stdout
    assert "kvCacheGiB" in status and "Left for the KV cache" in status
