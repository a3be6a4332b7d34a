"""Remediation driven by a real Prometheus scraping simulated vLLM metrics (and kube-state-metrics)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from hack.vllm_sim import VllmSimulator

from tests.e2e.conftest import RESYNC_SECONDS, Kubectl, Operator, wait_for
from tests.e2e.helpers import args_of, crash, remediation, running_pods, wait_condition
from tests.e2e.metrics import PrometheusForwarder, forget_namespace, own_prometheus, repeating

pytestmark = pytest.mark.e2e
__all__ = ["own_prometheus"]  # a fixture, imported for pytest
WINDOW = 30  # kvSaturationWindowSeconds (the API's minimum)
STABLE = 60  # stableWindowSeconds (the API's minimum)


@pytest.fixture(autouse=True)
def _simulated_pods_forgotten(request: pytest.FixtureRequest, namespace: str) -> Iterator[None]:
    """The simulator outlives the test: drop the pods `load` fed for this namespace."""
    yield
    if "vllm_sim" in request.fixturenames:
        forget_namespace(request.getfixturevalue("vllm_sim"), namespace)


@pytest.fixture
def outage_operator(kubectl: Kubectl, namespace: str, own_prometheus: PrometheusForwarder,
                    tmp_path: Path) -> Iterator[Operator]:
    """An operator of the test's own, on the test's namespace, whose Prometheus is `own_prometheus`: the test takes
    that one down, not the shared one the other lane's tests (and the session operator) read. Set up as the
    session operator is (conftest `operator`), without its admission webhook, which these tests do not reach."""
    env = {**kubectl.env, "LLM_AUTOPILOT_PROMETHEUS_URL": own_prometheus.url,
           "LLM_AUTOPILOT_RESYNC_SECONDS": str(RESYNC_SECONDS),
           "HF_ENDPOINT": "http://127.0.0.1:9", "LLM_AUTOPILOT_HUB_TIMEOUT_SECONDS": "1",
           "LLM_AUTOPILOT_CALIBRATION_KEY": uuid.uuid4().hex * 2}
    op = Operator(env, tmp_path / "operator.log", ["--standalone", f"--namespace={namespace}"]).start()
    try:
        yield op
    finally:
        op.stop()


def deploy(kubectl: Kubectl, ns: str) -> str:
    obj = {"apiVersion": "llm-autopilot.io/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": "chat"},
           "spec": {"model": {"name": "Qwen/Qwen3-8B"},
                    "gpu": {"product": "nvidia-l4", "maxGPUs": 1,
                            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}]},
                    "serving": {"maxModelLen": 16384, "allowedKVCacheDtypes": ["auto", "fp8"]},
                    "remediation": {"cooldownSeconds": 0, "kvSaturationWindowSeconds": WINDOW,
                                    "kvSaturationThreshold": 0.9, "stableWindowSeconds": STABLE}}}
    kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(obj))
    wait_condition(kubectl, ns, "chat", "Ready", "True", timeout=90)
    assert "--kv-cache-dtype" not in args_of(kubectl.json("deployment", "chat", "-n", ns))  # auto KV fits
    return str(running_pods(kubectl, ns, "chat")[0]["metadata"]["name"])


@contextmanager
def load(sim: VllmSimulator, ns: str, kubectl: Kubectl, *, usage: float, preempting: bool) -> Iterator[None]:
    """Keep every Running pod of `chat` reporting this KV usage (and a growing preemption counter)."""
    def feed() -> None:
        running = {p["metadata"]["name"] for p in running_pods(kubectl, ns, "chat")}
        for known in sim.pods():  # pods that are gone stop being scraped, as with a real ServiceMonitor
            if known.namespace == ns and known.pod not in running:
                sim.delete_pod(ns, known.pod)
        for name in running:
            current = sim.get_pod(ns, name)
            preemptions = (current.num_preemptions_total if current else 0) + (3 if preempting else 0)
            sim.set_pod(ns, name, model_name="Qwen/Qwen3-8B", vllm_version="0.33.0", kv_cache_usage_perc=usage,
                        num_requests_running=24, num_requests_waiting=8 if preempting else 0,
                        num_preemptions_total=preemptions)

    with repeating(feed):
        yield


def kv_dtype(kubectl: Kubectl, ns: str) -> str:
    args = args_of(kubectl.json("deployment", "chat", "-n", ns))
    return args[args.index("--kv-cache-dtype") + 1] if "--kv-cache-dtype" in args else "auto"


def steps(kubectl: Kubectl, ns: str) -> list[dict[str, Any]]:
    return list(remediation(kubectl, ns, "chat").get("history") or [])


def test_kv_saturation_moves_to_fp8_then_relaxes_after_calm(kubectl: Kubectl, operator: Operator,
                                                            vllm_sim: VllmSimulator, namespace: str) -> None:
    deploy(kubectl, namespace)
    with load(vllm_sim, namespace, kubectl, usage=0.97, preempting=True):
        wait_for("fp8 KV cache", lambda: kv_dtype(kubectl, namespace) == "fp8", WINDOW + 40)
    history = wait_for("the step in the status", lambda: steps(kubectl, namespace), 10)
    assert history[-1]["signal"] == "KVSaturation" and "fp8" in history[-1]["action"]
    evidence = history[-1]["evidence"]
    assert "kv_cache_usage_perc" in evidence["query"] and float(evidence["value"]) >= 0.9
    assert evidence["source"] == "prometheus"
    with load(vllm_sim, namespace, kubectl, usage=0.3, preempting=False):
        try:
            wait_for("relaxed back to auto KV", lambda: kv_dtype(kubectl, namespace) == "auto", STABLE + 40)
        except AssertionError as exc:
            status = kubectl.json("llmd", "chat", "-n", namespace)["status"]
            raise AssertionError(f"{exc}; remediation: {status.get('remediation')}; "
                                 f"conditions: {status.get('conditions')}") from exc
    rem = wait_for("rung 0", lambda: (r := remediation(kubectl, namespace, "chat")).get("rung") == 0 and r, 10)
    assert rem["history"][-1]["signal"] == "Calm"


def test_alternating_signals_make_a_bounded_number_of_changes(kubectl: Kubectl, operator: Operator,
                                                              vllm_sim: VllmSimulator, namespace: str) -> None:
    deploy(kubectl, namespace)
    with load(vllm_sim, namespace, kubectl, usage=0.97, preempting=True):
        wait_for("the first step", lambda: kv_dtype(kubectl, namespace) == "fp8", WINDOW + 40)
    with load(vllm_sim, namespace, kubectl, usage=0.3, preempting=False):
        wait_for("the relax", lambda: kv_dtype(kubectl, namespace) == "auto", STABLE + 40)
    with load(vllm_sim, namespace, kubectl, usage=0.97, preempting=True):  # back soon after relaxing
        wait_for("the second step", lambda: kv_dtype(kubectl, namespace) == "fp8", WINDOW + 40)
    rem = wait_for("the backoff", lambda: (r := remediation(kubectl, namespace, "chat")).get("relaxBackoff") == 2
                   and r, 15)
    assert rem["rung"] == 1
    with load(vllm_sim, namespace, kubectl, usage=0.3, preempting=False):
        # one stable window is no longer enough: the next relax waits twice as long. The guard counts the
        # operator's clock, so this is a span of time to let pass, not a state to wait for; then one complete
        # reconcile judges it.
        time.sleep(STABLE + 10)
        operator.wait_reconciles(namespace, "chat", 1, since=operator.mark())
        assert kv_dtype(kubectl, namespace) == "fp8"
    assert len(steps(kubectl, namespace)) == 3  # step, relax, step: no flapping


def test_prometheus_down_holds_still_and_says_why(kubectl: Kubectl, outage_operator: Operator,
                                                 own_prometheus: PrometheusForwarder, namespace: str) -> None:
    deploy(kubectl, namespace)
    before = kubectl.json("deployment", "chat", "-n", namespace)["metadata"]["generation"]
    with own_prometheus.stopped():
        llmd = wait_condition(kubectl, namespace, "chat", "MetricsAvailable", "False", timeout=30)
        cond = next(c for c in llmd["status"]["conditions"] if c["type"] == "MetricsAvailable")
        assert cond["reason"] == "PrometheusUnreachable" and "holds still" in cond["message"]
        crashed = outage_operator.mark()
        crash(kubectl, namespace, "chat", "OOMKilled", 137)  # evidence arrives while metrics are down
        outage_operator.wait_reconciles(namespace, "chat", 3, since=crashed)  # each one sees the crash
        assert kubectl.json("deployment", "chat", "-n", namespace)["metadata"]["generation"] == before
        assert remediation(kubectl, namespace, "chat").get("rung", 0) == 0
    wait_condition(kubectl, namespace, "chat", "MetricsAvailable", "True", timeout=30)
    wait_for("the held-back step once metrics return", lambda: remediation(kubectl, namespace, "chat").get("rung") == 1,
             30)


def test_metrics_available_holds_still_through_an_outage(kubectl: Kubectl, outage_operator: Operator,
                                                        own_prometheus: PrometheusForwarder, namespace: str) -> None:
    """Issue #15, class 5: with Prometheus stopped, MetricsAvailable read True|Queried in some one-second samples.
    Once False it must stay False, with the same reason, message and transition time, across reconciles and a
    replaced pod, until Prometheus is back."""
    deploy(kubectl, namespace)
    wait_condition(kubectl, namespace, "chat", "MetricsAvailable", "True", timeout=60)

    def metrics() -> dict[str, Any]:
        return next(c for c in kubectl.json("llmd", "chat", "-n", namespace)["status"]["conditions"]
                    if c["type"] == "MetricsAvailable")

    with own_prometheus.stopped():
        wait_condition(kubectl, namespace, "chat", "MetricsAvailable", "False", timeout=60)
        first = metrics()
        assert first["reason"] == "PrometheusUnreachable"
        samples: list[dict[str, Any]] = []
        pod = running_pods(kubectl, namespace, "chat")[0]["metadata"]["name"]
        kubectl("delete", "pod", pod, "-n", namespace, "--wait=false")  # a pod replaced during the outage
        mark = outage_operator.mark()

        def sampled() -> bool:  # one sample per poll, until four reconciles have completed since the stop
            samples.append(metrics())
            return outage_operator.reconciles(namespace, "chat", since=mark) >= 5

        wait_for("four reconciles during the outage", sampled, 180)
        samples.append(metrics())
        seen = {(c["status"], c["reason"], c["message"], c["lastTransitionTime"]) for c in samples}
        assert seen == {(first["status"], first["reason"], first["message"], first["lastTransitionTime"])}, seen
    wait_condition(kubectl, namespace, "chat", "MetricsAvailable", "True", timeout=60)
