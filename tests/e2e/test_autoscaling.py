"""KEDA drives an LLMDeployment through its scale subresource, on the real Prometheus scraping simulated vLLM pods.

KEDA's operator and metrics API server run in the local cluster (hack/localcluster/keda.py), the HPA is
kube-controller-manager's own (15 s sync period): simulated KV pressure scales out, calm scales in, and
``kubectl get llmd`` shows the replicas. The sync periods are shortened only through the ScaledObject's own
settings (pollingInterval, the HPA's scale-down stabilization window), never by sleeping.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import yaml
from hack.vllm_sim import VllmSimulator

from tests.e2e.conftest import Kubectl, Operator, wait_for
from tests.e2e.helpers import running_pods, wait_condition
from tests.e2e.metrics import forget_namespace, repeating, wait_for_series

pytestmark = pytest.mark.e2e
NAME = "chat"
#: HPA sync (15 s) + KEDA polling (2 s) + a 2 s scrape + the operator's reconcile + the scheduler and kwok
SCALE_SECONDS = 150


@pytest.fixture(autouse=True)
def _simulated_pods_forgotten(request: pytest.FixtureRequest, namespace: str) -> Iterator[None]:
    yield
    if "vllm_sim" in request.fixturenames:
        forget_namespace(request.getfixturevalue("vllm_sim"), namespace)


def autoscaled(max_replicas: int = 3) -> dict[str, Any]:
    return {"apiVersion": "llm-autopilot.io/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": NAME},
            "spec": {"model": {"name": "Qwen/Qwen3-8B"},
                     "gpu": {"product": "nvidia-l4", "maxGPUs": 1,
                             "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}]},
                     "serving": {"maxModelLen": 16384},
                     "replicas": 1,
                     "autoscaling": {"minReplicas": 1, "maxReplicas": max_replicas, "targetKVCacheUsage": 0.6,
                                     "targetWaitingRequests": 5, "pollingIntervalSeconds": 2,
                                     "scaleDownStabilizationSeconds": 5}}}


@contextmanager
def load(sim: VllmSimulator, kubectl: Kubectl, ns: str, usage: dict[str, float]) -> Iterator[None]:
    """Every Running pod of the deployment reports ``usage["value"]`` (changeable while running), labelled as the
    chart's PodMonitor labels it, so KEDA's query finds it."""
    def feed() -> None:
        running = {p["metadata"]["name"] for p in running_pods(kubectl, ns, NAME)}
        for known in sim.pods():
            if known.namespace == ns and known.pod not in running:
                sim.delete_pod(ns, known.pod)
        for pod in running:
            sim.set_pod(ns, pod, labels={"llmdeployment": NAME}, model_name="Qwen/Qwen3-8B",
                        vllm_version="0.33.0", kv_cache_usage_perc=usage["value"], num_requests_running=4,
                        num_requests_waiting=0)

    with repeating(feed):
        yield


def printed_columns(table: str) -> dict[str, str]:
    """`kubectl get`'s first row by its header's column positions (values may hold spaces: "1 x L4")."""
    header, row = table.splitlines()[:2]
    starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")]
    ends = [*starts[1:], len(row) + 1]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, ends, strict=True)}


def spec_replicas(kubectl: Kubectl, ns: str) -> int:
    return int(kubectl.json("llmd", NAME, "-n", ns)["spec"].get("replicas", 0))


def ready_pods(kubectl: Kubectl, ns: str) -> int:
    return sum(1 for p in running_pods(kubectl, ns, NAME)
               if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])))


def test_kv_pressure_scales_out_and_calm_scales_in(kubectl: Kubectl, operator: Operator, namespace: str,
                                                   vllm_sim: VllmSimulator, prometheus_url: str) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(autoscaled()))
    wait_condition(kubectl, namespace, NAME, "Ready", "True", timeout=90)
    so = kubectl.json("scaledobject", NAME, "-n", namespace)
    assert so["spec"]["scaleTargetRef"]["kind"] == "LLMDeployment" and so["spec"]["maxReplicaCount"] == 3
    # KEDA made its HPA on the LLMDeployment's scale subresource, and the HPA can read it
    hpa = wait_for("KEDA's HPA reading the scale subresource", lambda: (
        h := kubectl.maybe("hpa", f"keda-hpa-{NAME}", "-n", namespace)) and any(
            c["type"] == "ScalingActive" and c["status"] == "True" for c in h.get("status", {}).get("conditions", []))
        and h, timeout=SCALE_SECONDS)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "llm-autopilot.io/v1alpha1", "kind": "LLMDeployment",
                                             "name": NAME}
    scale = kubectl.json("llmd", NAME, "-n", namespace, "--subresource=scale")
    assert scale["spec"]["replicas"] == 1 and scale["status"]["selector"] == (
        f"app.kubernetes.io/instance={NAME},app.kubernetes.io/name=vllm")

    usage = {"value": 0.95}
    with load(vllm_sim, kubectl, namespace, usage):
        wait_for_series(prometheus_url, f'vllm:kv_cache_usage_perc{{namespace="{namespace}",llmdeployment="{NAME}"}}')
        start = time.monotonic()
        wait_for("KEDA scaling out to 3 replicas", lambda: spec_replicas(kubectl, namespace) == 3,
                 timeout=SCALE_SECONDS)
        scaled_out = time.monotonic() - start
        wait_for("3 pods Ready", lambda: ready_pods(kubectl, namespace) == 3, timeout=SCALE_SECONDS)
        serving = time.monotonic() - start
        assert kubectl.json("deployment", NAME, "-n", namespace)["spec"]["replicas"] == 3
        llmd = wait_for("status.replicas 3", lambda: (o := kubectl.json("llmd", NAME, "-n", namespace))
                        and o["status"].get("readyReplicas") == 3 and o, timeout=SCALE_SECONDS)
        assert llmd["status"]["replicas"] == 3
        table = kubectl("get", "llmd", NAME, "-n", namespace).stdout
        columns = printed_columns(table)
        assert columns["REPLICAS"] == "3" and columns["AVAILABLE"] == "3", table

        usage["value"] = 0.05  # calm: the sum over 3 pods is well below one replica's target
        start = time.monotonic()
        wait_for("KEDA scaling in to 1 replica", lambda: spec_replicas(kubectl, namespace) == 1,
                 timeout=SCALE_SECONDS)
        scaled_in = time.monotonic() - start
        wait_for("1 pod left", lambda: len(running_pods(kubectl, namespace, NAME)) == 1, timeout=SCALE_SECONDS)
    # remediation never touched the replicas: KEDA owns them
    remediation = kubectl.json("llmd", NAME, "-n", namespace)["status"].get("remediation") or {}
    assert not [a for a in remediation.get("applied", []) if "replicas" in a]
    sys.stderr.write(f"scale-out 1 -> 3: spec after {scaled_out:.1f} s, 3 pods Ready after {serving:.1f} s; "
                     f"scale-in 3 -> 1: spec after {scaled_in:.1f} s\n")


def test_max_replicas_beyond_the_pool_is_refused_at_apply(kubectl: Kubectl, operator: Operator,
                                                          namespace: str) -> None:
    result = kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(autoscaled(max_replicas=5)),
                     check=False)
    assert result.returncode != 0
    assert ("spec.autoscaling.maxReplicas 5 is more than the GPU pool holds: 4 replicas of 1 x L4 fit on its "
            "4 node(s) of 1 x L4; set maxReplicas to 4 or fewer") in result.stderr
    assert kubectl.maybe("llmd", NAME, "-n", namespace) is None


def test_kubectl_scale_drives_the_replicas(kubectl: Kubectl, operator: Operator, namespace: str) -> None:
    obj = autoscaled()
    del obj["spec"]["autoscaling"]
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj))
    wait_condition(kubectl, namespace, NAME, "Ready", "True", timeout=90)
    kubectl("scale", "llmd", NAME, "-n", namespace, "--replicas=2")
    wait_for("2 pods Ready", lambda: ready_pods(kubectl, namespace) == 2, timeout=SCALE_SECONDS)
    wait_for("status.readyReplicas 2", lambda: kubectl.json("llmd", NAME, "-n", namespace)["status"].get(
        "readyReplicas") == 2, timeout=60)


def test_autoscaling_without_replicas_gives_keda_a_scale_target(kubectl: Kubectl, operator: Operator,
                                                                 namespace: str) -> None:
    """Issue 15: with spec.autoscaling and no spec.replicas, the ScaledObject was created and KEDA refused it ("the
    spec replicas field does not exist"): half-applied. The CRD's default makes /scale answer, so KEDA's own
    Ready condition turns True and its HPA reads the LLMDeployment."""
    body = autoscaled()
    del body["spec"]["replicas"]
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body))
    wait_condition(kubectl, namespace, NAME, "Planned", "True", timeout=90)

    def keda_ready() -> dict[str, Any] | None:
        so = kubectl.maybe("scaledobject", NAME, "-n", namespace)
        conditions = (so or {}).get("status", {}).get("conditions", [])
        return so if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) else None

    so = wait_for("KEDA's ScaledObject Ready", keda_ready, timeout=SCALE_SECONDS)
    assert so["spec"]["scaleTargetRef"]["kind"] == "LLMDeployment"
    hpa = wait_for("KEDA's HPA", lambda: kubectl.maybe("hpa", f"keda-hpa-{NAME}", "-n", namespace),
                   timeout=SCALE_SECONDS)
    assert hpa["spec"]["scaleTargetRef"]["name"] == NAME
    scale = kubectl.json("llmd", NAME, "-n", namespace, "--subresource=scale")
    assert scale["spec"]["replicas"] == 1
