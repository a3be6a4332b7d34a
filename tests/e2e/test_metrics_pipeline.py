"""The metrics pipeline on the local cluster: simulated vLLM pods and kube-state-metrics -> Prometheus -> operator.

Prometheus (hack/cluster.py) scrapes every 2 s and re-reads the simulator's file_sd targets every 5 s, so
each wait below is a poll with a deadline of tens of seconds, not a sleep.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from llm_autopilot.controller.metrics import MetricsUnavailable, PrometheusSettings, PrometheusSignals, QueryRejected
from llm_autopilot.remediation.classify import Signal
from tests.e2e.conftest import Kubectl, wait_for
from tests.e2e.metrics import (
    SCRAPE_SECONDS,
    PrometheusForwarder,
    VllmSimulator,
    forget_namespace,
    own_prometheus,
    prom_query,
    prometheus_url,
    vllm_sim,
    wait_for_series,
    wait_scraped,
)

pytestmark = pytest.mark.e2e
__all__ = ["own_prometheus", "prometheus_url", "vllm_sim"]  # fixtures, imported for pytest

WINDOW = 30  # seconds, the saturation window under test


@pytest.fixture
def sim_ns(vllm_sim: VllmSimulator) -> Iterator[str]:
    """A namespace name for simulated pods (they need no Kubernetes namespace); its pods are forgotten
    afterwards, also when the test fails half-way."""
    ns = f"sim-{uuid.uuid4().hex[:8]}"
    yield ns
    forget_namespace(vllm_sim, ns)


def _http(method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def _value(series: list[dict[str, Any]]) -> float:
    assert len(series) == 1, series
    return float(series[0]["value"][1])


def test_simulated_pod_values_reach_prometheus(vllm_sim: VllmSimulator, prometheus_url: str, sim_ns: str) -> None:
    ns, pod = sim_ns, "qwen-5d8f7c9b6d-abcde"
    values = {"model_name": "Qwen/Qwen3-8B", "vllm_version": "0.33.0", "kv_cache_usage_perc": 0.97,
              "num_requests_running": 12, "num_requests_waiting": 4, "num_preemptions_total": 7,
              "num_gpu_blocks": 1234}
    start = time.monotonic()
    assert _http("PUT", f"{vllm_sim.url}/pods/{ns}/{pod}", values)[0] == 200

    selector = f'namespace="{ns}",pod="{pod}"'
    series = wait_for_series(prometheus_url, f"vllm:kv_cache_usage_perc{{{selector}}}")
    elapsed = time.monotonic() - start
    assert elapsed < 20, f"took {elapsed:.1f}s to appear in Prometheus"
    labels = series[0]["metric"]
    assert labels["job"] == "vllm"
    assert (labels["namespace"], labels["pod"], labels["model_name"], labels["engine"]) == (
        ns, pod, "Qwen/Qwen3-8B", "0")
    assert _value(series) == pytest.approx(0.97)
    assert _value(prom_query(prometheus_url, f"vllm:num_requests_running{{{selector}}}")) == 12
    assert _value(prom_query(prometheus_url, f"vllm:num_requests_waiting{{{selector}}}")) == 4
    assert _value(prom_query(prometheus_url, f"vllm:num_preemptions_total{{{selector}}}")) == 7
    info = prom_query(prometheus_url, f"vllm:cache_config_info{{{selector}}}")
    assert info[0]["metric"]["num_gpu_blocks"] == "1234"
    assert info[0]["metric"]["block_size"] == "16"
    assert info[0]["metric"]["cache_dtype"] == "auto"
    assert "model_name" not in info[0]["metric"]  # vLLM's info gauge carries the engine only
    assert not prom_query(prometheus_url, f"vllm:gpu_cache_usage_perc{{{selector}}}")  # 0.33: new name only

    # a counter never goes down; an update is visible after the next scrape
    status, body = _http("PUT", f"{vllm_sim.url}/pods/{ns}/{pod}", {"num_preemptions_total": 3})
    assert status == 400 and "counter" in body["error"]
    assert _http("PUT", f"{vllm_sim.url}/pods/{ns}/{pod}", {"kv_cache_usage_perc": 0.5})[0] == 200
    wait_for("the new value in Prometheus",
             lambda: _value(prom_query(prometheus_url, f"vllm:kv_cache_usage_perc{{{selector}}}")) == 0.5,
             timeout=4 * SCRAPE_SECONDS + 5)

    # deleting the pod removes its scrape target
    assert _http("DELETE", f"{vllm_sim.url}/pods/{ns}/{pod}")[0] == 200
    assert vllm_sim.targets_file is not None
    assert pod not in vllm_sim.targets_file.read_text()
    wait_for("the target to go", lambda: not prom_query(prometheus_url, f'up{{job="vllm",{selector}}}'),
             timeout=30)


def test_kube_state_metrics_reports_oomkilled(kubectl: Kubectl, namespace: str, prometheus_url: str) -> None:
    name = "oom"
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"},
                                       "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists",
                                                        "effect": "NoSchedule"}],
                                       "containers": [{"name": "vllm", "image": "vllm/vllm-openai:latest",
                                                       "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}},
    }
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(deployment))

    def running_pod() -> dict[str, Any] | None:
        pods = kubectl.json("pods", "-n", namespace, "-l", f"app={name}")["items"]
        return next((p for p in pods if p["status"].get("phase") == "Running"
                     and p["status"].get("containerStatuses")), None)

    pod = wait_for("a Running pod", running_pod, timeout=60)
    statuses = pod["status"]["containerStatuses"]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    statuses[0]["restartCount"] = 1
    statuses[0]["lastState"] = {"terminated": {"reason": "OOMKilled", "exitCode": 137, "startedAt": now,
                                               "finishedAt": now, "containerID": "containerd://oom"}}
    patch = json.dumps({"status": {"containerStatuses": statuses}})
    kubectl("patch", "pod", pod["metadata"]["name"], "-n", namespace, "--subresource=status", "--type=merge",
            "-p", patch)

    selector = f'namespace="{namespace}",pod="{pod["metadata"]["name"]}",container="vllm"'
    series = wait_for_series(
        prometheus_url, f'kube_pod_container_status_last_terminated_reason{{{selector},reason="OOMKilled"}}')
    assert _value(series) == 1
    assert series[0]["metric"]["job"] == "kube-state-metrics"
    exit_code = wait_for_series(prometheus_url, f"kube_pod_container_status_last_terminated_exitcode{{{selector}}}")
    assert _value(exit_code) == 137


def _signals(url: str) -> PrometheusSignals:
    return PrometheusSignals(PrometheusSettings(url=url))


def _drive(sim: VllmSimulator, ns: str, seconds: float, plan: dict[str, Any],
           waiting: dict[str, Any] | None = None) -> None:
    """For `seconds`, every scrape interval: grow each pod's preemption counter, apply its kv usage plan.

    `plan` maps pod -> callable(elapsed seconds) -> kv usage; `waiting` (optional) maps pod -> callable(elapsed
    seconds) -> requests waiting (otherwise the pod's queue stays as it was set).
    """
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        for pod, usage in plan.items():
            current = sim.get_pod(ns, pod)
            assert current is not None
            queue = {"num_requests_waiting": waiting[pod](elapsed)} if waiting and pod in waiting else {}
            sim.set_pod(ns, pod, kv_cache_usage_perc=usage(elapsed),
                        num_preemptions_total=current.num_preemptions_total + 1, **queue)
        time.sleep(SCRAPE_SECONDS / 2)  # paces the updates (two per scrape); waits for nothing


def test_kv_saturation_from_prometheus(vllm_sim: VllmSimulator, prometheus_url: str, sim_ns: str) -> None:
    """The rule's PromQL on the real Prometheus: average usage, climbing preemptions, a queue that stays."""
    ns = sim_ns
    pods = {"qwen": "qwen-5d8f7c9b6d-abcde", "llama": "llama-7c9f8b6d5c-xk2lp", "mistral": "mistral-6b7c8d9f5d-q8zrt",
            "gemma": "gemma-5c6d7e8f9b-m3n4p"}
    for pod in pods.values():
        vllm_sim.set_pod(ns, pod, model_name="Qwen/Qwen3-8B", kv_cache_usage_perc=0.95, num_requests_running=8,
                         num_requests_waiting=8)
    for pod in pods.values():
        wait_for_series(prometheus_url, f'vllm:kv_cache_usage_perc{{namespace="{ns}",pod="{pod}"}}')

    # qwen: saturated the whole window; llama: preempting but a low average; mistral: full and preempting, but its
    # queue drained once inside the window; gemma: full with a queue, but nothing preempted (not driven: its
    # counter stays)
    dip = (WINDOW * 0.4, WINDOW * 0.4 + 3 * SCRAPE_SECONDS)
    _drive(vllm_sim, ns, WINDOW + 2 * SCRAPE_SECONDS, {
        pods["qwen"]: lambda _: 0.97,
        pods["llama"]: lambda _: 0.40,
        pods["mistral"]: lambda _: 0.98,
    }, waiting={pods["mistral"]: lambda t: 0 if dip[0] <= t <= dip[1] else 8})
    wait_scraped(prometheus_url, vllm_sim, ns, list(pods.values()))  # the last values scraped

    signals = _signals(prometheus_url)
    saturated = signals.kv_saturation(ns, "qwen", threshold=0.9, window=WINDOW)
    assert saturated is not None
    assert saturated.signal is Signal.KV_SATURATION
    assert float(saturated.evidence["value"]) >= 0.9
    assert float(saturated.evidence["preemptions"]) > 0 and float(saturated.evidence["minWaiting"]) >= 1
    assert signals.kv_saturation(ns, "llama", threshold=0.9, window=WINDOW) is None
    assert signals.kv_saturation(ns, "mistral", threshold=0.9, window=WINDOW) is None
    assert signals.kv_saturation(ns, "gemma", threshold=0.9, window=WINDOW) is None
    # no pod of that name at all
    assert signals.kv_saturation(ns, "absent", threshold=0.9, window=WINDOW) is None
    for pod in pods.values():
        vllm_sim.delete_pod(ns, pod)


def test_old_vllm_metric_name(vllm_sim: VllmSimulator, prometheus_url: str, sim_ns: str) -> None:
    """vLLM before 0.9.2 exposes vllm:gpu_cache_usage_perc only; the operator's query reads it."""
    ns, window = sim_ns, 10
    old, new = "oldllm-5d8f7c9b6d-abcde", "newllm-5d8f7c9b6d-abcde"
    vllm_sim.set_pod(ns, old, model_name="meta-llama/Llama-3.1-8B", vllm_version="0.9.1", kv_cache_usage_perc=0.96,
                     num_requests_waiting=8)
    vllm_sim.set_pod(ns, new, model_name="meta-llama/Llama-3.1-8B", vllm_version="0.10.2", kv_cache_usage_perc=0.5)
    selector = f'namespace="{ns}",pod="{old}"'
    assert _value(wait_for_series(prometheus_url, f"vllm:gpu_cache_usage_perc{{{selector}}}")) == pytest.approx(0.96)
    assert not prom_query(prometheus_url, f"vllm:kv_cache_usage_perc{{{selector}}}")
    # 0.10.2 (deprecation period) exposes both names
    both = wait_for_series(prometheus_url, f'{{__name__=~"vllm:(kv|gpu)_cache_usage_perc",pod="{new}"}}')
    assert sorted(s["metric"]["__name__"] for s in both) == ["vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"]

    _drive(vllm_sim, ns, window + 2 * SCRAPE_SECONDS, {old: lambda _: 0.96})
    wait_scraped(prometheus_url, vllm_sim, ns, [old])
    saturated = _signals(prometheus_url).kv_saturation(ns, "oldllm", threshold=0.9, window=window)
    assert saturated is not None and saturated.signal is Signal.KV_SATURATION
    assert "gpu_cache_usage_perc" in saturated.evidence["query"]
    vllm_sim.delete_pod(ns, old)
    vllm_sim.delete_pod(ns, new)


@pytest.mark.parametrize(("version", "hidden", "names"), [
    ("0.9.1", False, {"vllm:gpu_cache_usage_perc"}),
    ("0.9.2", False, {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}),
    ("0.10.2", False, {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}),
    ("0.11.2", False, {"vllm:kv_cache_usage_perc"}),
    ("0.11.2", True, {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}),
    ("0.12.0", True, {"vllm:kv_cache_usage_perc"}),
    ("0.33.0", False, {"vllm:kv_cache_usage_perc"}),
])
def test_simulator_kv_usage_names_by_version(version: str, hidden: bool, names: set[str]) -> None:
    with VllmSimulator() as sim:
        sim.set_pod("ns", "p-1-a", model_name="m", vllm_version=version, show_hidden_metrics=hidden,
                    kv_cache_usage_perc=0.5)
        text = sim.render("ns", "p-1-a")
    exposed = {line.split("{")[0] for line in text.splitlines() if "cache_usage_perc{" in line}
    assert exposed == names


def test_prometheus_down_raises_metrics_unavailable(vllm_sim: VllmSimulator, own_prometheus: PrometheusForwarder,
                                                    sim_ns: str) -> None:
    """Prometheus down (its URL refuses connections: the test's own, metrics.PrometheusForwarder)."""
    ns = sim_ns
    vllm_sim.set_pod(ns, "qwen-5d8f7c9b6d-abcde", model_name="Qwen/Qwen3-8B", kv_cache_usage_perc=0.2)
    signals = _signals(own_prometheus.url)
    assert signals.healthy()
    with own_prometheus.stopped():
        assert not signals.healthy()
        with pytest.raises(MetricsUnavailable):
            signals.kv_saturation(ns, "qwen", threshold=0.9, window=WINDOW)
    # started again: queries answer (no data yet or low usage -> None)
    assert wait_for("Prometheus answering again", signals.healthy, timeout=30)
    assert signals.kv_saturation(ns, "qwen", threshold=0.9, window=WINDOW) is None
    vllm_sim.delete_pod(ns, "qwen-5d8f7c9b6d-abcde")


def test_a_query_prometheus_refuses_is_query_rejected_not_unavailable(prometheus_url: str) -> None:
    """Issue #15, class 4: a KV window PromQL cannot hold made the operator's query invalid (HTTP 400,
    "duration out of range"), and that read as Prometheus being unreachable while it was up."""
    signals = _signals(prometheus_url)
    assert signals.healthy()
    with pytest.raises(QueryRejected, match="duration out of range") as refused:
        signals.kv_saturation("default", "qwen", threshold=0.9, window=10**12)
    assert "HTTP 400" in str(refused.value) and len(str(refused.value)) < 400
    assert signals.kv_saturation("default", "qwen", threshold=0.9, window=WINDOW) is None  # a valid one answers
