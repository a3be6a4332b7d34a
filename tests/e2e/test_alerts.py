"""The chart's PrometheusRule, loaded into the local cluster's real Prometheus and fired by simulated signals.

The rules are rendered with `helm template` (monitoring.prometheusRule.enabled=true, every `for:` the chart
exposes shortened to a few seconds through its values), checked with `promtool check rules`, dropped into
`<state>/prometheus/rules/` and loaded with `POST /-/reload`. The signals:

* KV saturation: simulated vLLM pods (hack/vllm_sim.py) with the `llmdeployment` target label the chart's
  PodMonitor gives them;
* an OOM kill: a managed vLLM pod's status patched as the kubelet would write it, seen by kube-state-metrics;
* not Ready: a managed Deployment whose pod the scheduler cannot place, seen by kube-state-metrics;
* remediation exhausted / operator down: the operator's own /metrics scraped through the cluster's `extra`
  file_sd job, labelled `job`/`namespace` as the chart's ServiceMonitor would label it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hack.vllm_sim import VllmSimulator, add_scrape_target, remove_scrape_target

from tests.e2e.conftest import ROOT, Kubectl, Operator, _free_port, wait_for
from tests.e2e.helpers import KV_MESSAGE, crash, deploy, running_pods, wait_condition
from tests.e2e.metrics import prom_query, repeating, wait_for_series

pytestmark = pytest.mark.e2e

RELEASE = "llm-autopilot"  # fullname = release name: the `job` label of the operator's ServiceMonitor targets
RELEASE_NAMESPACE = "llm-autopilot-alerts"
KV_WINDOW = "10s"  # kvSaturationWindow (5m by default)
FOR = "4s"  # kvSaturationFor, notReadyFor, operatorDownFor (10m, 30m, 5m by default)
FOR_SECONDS = 4
EVALUATION_SECONDS = 2  # hack/cluster.py: Prometheus' evaluation_interval
RULE_FILE = "e2e-llm-autopilot-alerts.yaml"
OPERATOR_TARGET = "e2e-alerts-operator"
ALERT_TIMEOUT = 60.0  # file_sd refresh (5 s) + scrapes (2 s) + evaluations (2 s) + `for` (4 s), with slack
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
ALERTS = {"LLMAutopilotVLLMOOMKilled", "LLMAutopilotKVCacheSaturated", "LLMAutopilotRemediationExhausted",
          "LLMAutopilotDeploymentNotReady", "LLMAutopilotOperatorDown"}


# --- Prometheus' HTTP API --------------------------------------------------------------------------------
def api(url: str, path: str, method: str = "GET") -> Any:
    req = urllib.request.Request(f"{url}{path}", method=method)
    with urllib.request.urlopen(req, timeout=10) as resp:
        raw = resp.read()
    return json.loads(raw) if raw.startswith(b"{") else raw.decode()


def reload(url: str) -> None:
    """Re-read prometheus.yml and the rule files (--web.enable-lifecycle)."""
    api(url, "/-/reload", "POST")


def active_alerts(url: str, name: str, **labels: str) -> list[dict[str, Any]]:
    """Pending or firing alerts `name` whose labels include `labels`."""
    body = api(url, "/api/v1/alerts")
    assert body["status"] == "success", body
    return [a for a in body["data"]["alerts"]
            if a["labels"].get("alertname") == name and all(a["labels"].get(k) == v for k, v in labels.items())]


def wait_firing(url: str, name: str, timeout: float = ALERT_TIMEOUT, **labels: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = wait_for(
        f"{name}{labels} firing",
        lambda: [a for a in active_alerts(url, name, **labels) if a["state"] == "firing"], timeout, interval=1)
    return found[0]


def wait_active(url: str, name: str, timeout: float = ALERT_TIMEOUT, **labels: str) -> None:
    """The alert's condition holds: pending, or already firing (on a loaded machine the 4-s pending phase
    can pass between two polls)."""
    wait_for(f"{name}{labels} pending or firing", lambda: active_alerts(url, name, **labels), timeout, 0.5)


def alert_record(url: str, name: str, since: float, **labels: str) -> dict[str, list[float]]:
    """When Prometheus evaluated the alert as pending and as firing since `since` (unix time): the ALERTS
    series it writes at every evaluation, so a pending phase shorter than a poll is still on record."""
    selector = ",".join([f'alertname="{name}"', *(f'{k}="{v}"' for k, v in labels.items())])
    window = int(time.time() - since) + 2 * EVALUATION_SECONDS
    record: dict[str, list[float]] = {"pending": [], "firing": []}
    for series in prom_query(url, f"ALERTS{{{selector}}}[{window}s]"):
        record[series["metric"]["alertstate"]] += [float(t) for t, _ in series["values"] if float(t) >= since]
    return record


def wait_held_back_then_firing(url: str, name: str, since: float, **labels: str) -> dict[str, Any]:
    """The alert fires, and Prometheus' record shows `for` held it back: pending first, firing no sooner
    than FOR_SECONDS after."""
    wait_active(url, name, **labels)
    alert = wait_firing(url, name, **labels)
    record: dict[str, list[float]] = wait_for(f"{name} firing on record", lambda: (
        r if (r := alert_record(url, name, since, **labels))["firing"] else None), 30)
    assert record["pending"], f"{name} fired without a pending phase: {record}"
    assert min(record["firing"]) - min(record["pending"]) >= FOR_SECONDS, record
    return alert


def wait_inactive(url: str, name: str, timeout: float = ALERT_TIMEOUT, **labels: str) -> None:
    wait_for(f"{name}{labels} inactive", lambda: not active_alerts(url, name, **labels), timeout, interval=1)


def rule_groups(url: str, file: Path) -> list[dict[str, Any]]:
    body = api(url, "/api/v1/rules")
    assert body["status"] == "success", body
    return [g for g in body["data"]["groups"] if g["file"] == str(file)]


# --- the rules ---------------------------------------------------------------------------------------------
def render_rules(workdir: Path) -> Path:
    """The chart's PrometheusRule as a plain Prometheus rule file (its spec.groups), checked by promtool."""
    helm = subprocess.run([sys.executable, str(ROOT / "hack" / "helm.py"), "path"], check=True,
                          capture_output=True, text=True, timeout=300).stdout.strip()
    values = ["monitoring.prometheusRule.enabled=true", f"monitoring.prometheusRule.kvSaturationFor={FOR}",
              f"monitoring.prometheusRule.kvSaturationWindow={KV_WINDOW}",
              f"monitoring.prometheusRule.notReadyFor={FOR}", f"monitoring.prometheusRule.operatorDownFor={FOR}"]
    rendered = subprocess.run(
        [helm, "template", RELEASE, str(ROOT / "charts" / "llm-autopilot"), "--namespace", RELEASE_NAMESPACE,
         *[arg for v in values for arg in ("--set", v)], "--show-only", "templates/prometheusrule.yaml"],
        check=True, capture_output=True, text=True, timeout=60).stdout
    (rule,) = [d for d in yaml.safe_load_all(rendered) if d and d.get("kind") == "PrometheusRule"]
    path = workdir / RULE_FILE
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    check = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60,
                           check=False)
    assert check.returncode == 0, f"promtool check rules failed:\n{check.stdout}{check.stderr}"
    return path


def _state_dir(kubectl: Kubectl, key: str, name: str) -> Path:
    """A directory `hack/cluster.py env` exports, or its default next to the vLLM targets dir."""
    if kubectl.env.get(key):
        return Path(kubectl.env[key])
    return Path(kubectl.env["LLM_AUTOPILOT_VLLM_TARGETS_DIR"]).parent / name


@pytest.fixture(scope="module")
def rules(kubectl: Kubectl, prometheus_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The chart's alerts loaded into Prometheus (every rule evaluated once, health ok); unloaded afterwards."""
    rendered = render_rules(tmp_path_factory.mktemp("alerts"))
    rules_dir = _state_dir(kubectl, "LLM_AUTOPILOT_PROMETHEUS_RULES_DIR", "rules")
    assert rules_dir.is_dir(), f"{rules_dir} missing: a cluster started before rule_files support? (cluster.py up)"
    loaded = rules_dir / RULE_FILE
    shutil.copyfile(rendered, loaded)
    try:
        reload(prometheus_url)
        yield loaded
    finally:
        loaded.unlink(missing_ok=True)
        reload(prometheus_url)
        wait_for("the rules unloaded", lambda: not rule_groups(prometheus_url, loaded), 30)


def scraped_jobs(url: str) -> set[str]:
    body = api(url, "/api/v1/targets?state=active")
    return {t["labels"].get("job", "") for t in body["data"]["activeTargets"]}


@pytest.fixture
def operator_target(kubectl: Kubectl, prometheus_url: str) -> Iterator[Callable[[int], None]]:
    """Point the scraped "operator" (job/namespace labels of the chart's ServiceMonitor) at a port."""
    targets_dir = _state_dir(kubectl, "LLM_AUTOPILOT_EXTRA_TARGETS_DIR", "extra-targets")

    def point(port: int) -> None:
        add_scrape_target(targets_dir, OPERATOR_TARGET, f"127.0.0.1:{port}",
                          {"job": RELEASE, "namespace": RELEASE_NAMESPACE})

    yield point
    remove_scrape_target(targets_dir, OPERATOR_TARGET)
    # let file_sd drop it before anything reloads Prometheus (a reload first would keep the target)
    wait_for("the operator target dropped", lambda: RELEASE not in scraped_jobs(prometheus_url), 30)


def operator_up(url: str, port: int, value: int) -> bool:
    query = f'up{{job="{RELEASE}",namespace="{RELEASE_NAMESPACE}",instance="127.0.0.1:{port}"}}'
    return [r["value"][1] for r in prom_query(url, query)] == [str(value)]


# --- tests -------------------------------------------------------------------------------------------------
def test_rules_load_with_health_ok(prometheus_url: str, rules: Path) -> None:
    def healthy() -> list[dict[str, Any]] | None:
        groups = rule_groups(prometheus_url, rules)
        ok = groups and all(r["health"] == "ok" for g in groups for r in g["rules"])
        return groups if ok else None

    groups = wait_for("every rule evaluated with health ok", healthy, 30)
    assert [g["name"] for g in groups] == ["llm-autopilot"]
    by_name = {r["name"]: r for r in groups[0]["rules"]}
    assert set(by_name) == ALERTS
    assert all(r["type"] == "alerting" and not r.get("lastError") for r in by_name.values())
    # the shortened `for:` values reached Prometheus
    for name in ("LLMAutopilotKVCacheSaturated", "LLMAutopilotDeploymentNotReady", "LLMAutopilotOperatorDown"):
        assert by_name[name]["duration"] == 4, by_name[name]


@contextmanager
def preempting(sim: VllmSimulator, namespace: str, pod: str) -> Iterator[None]:
    """The pod's preemption counter keeps climbing, as a saturated vLLM's does."""
    def climb() -> None:
        current = sim.get_pod(namespace, pod)
        if current is not None:
            sim.set_pod(namespace, pod, num_preemptions_total=current.num_preemptions_total + 1)

    with repeating(climb):
        yield


def test_kv_saturation_fires(prometheus_url: str, rules: Path, vllm_sim: VllmSimulator, namespace: str) -> None:
    """The operator's own rule: average usage, climbing preemptions and a queue that stays, over the window."""
    hot, calm, busy = "chat-5d8f7c9b6d-x7k2p", "other-6c9f8d7b5c-q4m8z", "busy-7b6c5d4f3e-r2t9w"
    since = time.time()
    vllm_sim.set_pod(namespace, hot, model_name="Qwen/Qwen3-8B", kv_cache_usage_perc=0.97,
                     num_requests_running=24, num_requests_waiting=8, labels={"llmdeployment": "chat"})
    vllm_sim.set_pod(namespace, calm, model_name="Qwen/Qwen3-8B", kv_cache_usage_perc=0.5,
                     labels={"llmdeployment": "other"})
    # as full as the hot one, but nothing preempted and nothing waiting: busy, not saturated
    vllm_sim.set_pod(namespace, busy, model_name="Qwen/Qwen3-8B", kv_cache_usage_perc=0.97,
                     num_requests_running=24, num_requests_waiting=0, labels={"llmdeployment": "busy"})
    with preempting(vllm_sim, namespace, hot):
        alerting(prometheus_url, vllm_sim, namespace, hot, calm, busy, since)


def alerting(prometheus_url: str, vllm_sim: VllmSimulator, namespace: str, hot: str, calm: str, busy: str,
             since: float) -> None:
    try:
        alert = wait_held_back_then_firing(prometheus_url, "LLMAutopilotKVCacheSaturated", since,
                                           namespace=namespace)
        assert alert["labels"]["llmdeployment"] == "chat" and alert["labels"]["severity"] == "warning"
        assert float(alert["value"]) == pytest.approx(0.97)
        assert f"{namespace}/chat saturated" in alert["annotations"]["summary"]
        for other in ("other", "busy"):
            assert not active_alerts(prometheus_url, "LLMAutopilotKVCacheSaturated", namespace=namespace,
                                     llmdeployment=other)
        vllm_sim.set_pod(namespace, hot, kv_cache_usage_perc=0.6)  # load drops: the alert resolves
        wait_inactive(prometheus_url, "LLMAutopilotKVCacheSaturated", namespace=namespace)
    finally:
        for pod in (hot, calm, busy):
            vllm_sim.delete_pod(namespace, pod)


def vllm_deployment(name: str) -> dict[str, Any]:
    """A Deployment labelled as the operator labels its vLLM Deployments (render/kubernetes.py)."""
    labels = {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": name,
              "app.kubernetes.io/managed-by": "llm-autopilot", "llm-autopilot.io/deployment": name}
    selector = {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": selector},
                     "template": {"metadata": {"labels": labels}, "spec": {
                         "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
                         "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"},
                         "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.33.0",
                                         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}


def test_oomkilled_restart_fires(kubectl: Kubectl, prometheus_url: str, rules: Path, namespace: str) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(vllm_deployment("qwen")))
    pod = wait_for("a Running vllm pod", lambda: running_pods(kubectl, namespace, "qwen"), 60)[0]
    name = pod["metadata"]["name"]
    # a sample of the restart counter before the restart, so increase() sees it grow
    wait_for_series(prometheus_url, f'kube_pod_container_status_restarts_total{{namespace="{namespace}",'
                                     f'pod="{name}",container="vllm"}} == 0')
    status = pod["status"]["containerStatuses"][0]
    assert status["name"] == "vllm"
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status.update(restartCount=int(status.get("restartCount", 0)) + 1, lastState={"terminated": {
        "reason": "OOMKilled", "exitCode": 137, "startedAt": stamp, "finishedAt": stamp}})
    kubectl("patch", "pod", name, "-n", namespace, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"containerStatuses": [status]}}))
    alert = wait_firing(prometheus_url, "LLMAutopilotVLLMOOMKilled", namespace=namespace, pod=name)
    assert alert["labels"]["container"] == "vllm" and alert["labels"]["severity"] == "warning"
    assert alert["annotations"]["summary"] == f"vLLM pod {namespace}/{name} was OOM-killed"


def test_deployment_not_ready_fires(kubectl: Kubectl, prometheus_url: str, rules: Path, namespace: str) -> None:
    """A managed vLLM Deployment whose pod cannot be scheduled (2 GPUs asked of 1-GPU L4 nodes) fires; the same
    Deployment without the operator's managed-by label does not; scaling it to zero resolves it."""
    name = "LLMAutopilotDeploymentNotReady"
    stuck, unmanaged = vllm_deployment("stuck"), vllm_deployment("unmanaged")
    unmanaged["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "someone-else"
    for obj in (stuck, unmanaged):
        obj["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "2"}}
        kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj))
    # kube-state-metrics sees both Deployments, one replica desired and none available
    wait_for_series(prometheus_url, f'kube_deployment_status_replicas_available{{namespace="{namespace}",'
                                     f'deployment="unmanaged"}} == 0')
    alert = wait_firing(prometheus_url, name, namespace=namespace, deployment="stuck")
    assert alert["labels"]["severity"] == "warning"
    assert alert["annotations"]["summary"] == f"LLMDeployment {namespace}/stuck not Ready for {FOR}"
    assert not active_alerts(prometheus_url, name, namespace=namespace, deployment="unmanaged")
    # nothing desired, nothing missing: the alert resolves
    kubectl("scale", "deployment", "stuck", "-n", namespace, "--replicas=0")
    wait_inactive(prometheus_url, name, namespace=namespace, deployment="stuck")


def exhaust(kubectl: Kubectl, ns: str) -> None:
    """An LLMDeployment whose KV-capacity crash leaves no safer configuration to try: already at its shortest
    context (minMaxModelLen = maxModelLen), no fp8 KV cache allowed, one GPU at most."""
    deploy(kubectl, ns, serving={"maxModelLen": 8192, "minMaxModelLen": 8192, "allowedKVCacheDtypes": ["auto"]})
    crash(kubectl, ns, "qwen", "Error", 1, KV_MESSAGE)
    llmd = wait_condition(kubectl, ns, "qwen", "Degraded", "True", timeout=30)
    degraded = next(c for c in llmd["status"]["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "RemediationExhausted" and "no safer configuration fits" in degraded["message"]


def delete_series(url: str, selector: str) -> None:
    """Drop stored samples (hack/cluster.py runs Prometheus with --web.enable-admin-api)."""
    query = urllib.parse.urlencode({"match[]": selector})
    try:
        api(url, f"/api/v1/admin/tsdb/delete_series?{query}", "POST")
    except urllib.error.HTTPError as err:
        pytest.fail(f"deleting {selector}: {err} (a Prometheus started without --web.enable-admin-api? "
                    "`hack/cluster.py stop prometheus && hack/cluster.py start prometheus`)")


def test_remediation_exhausted_fires(kubectl: Kubectl, operator: Operator, prometheus_url: str, rules: Path,
                                     operator_target: Callable[[int], None], namespace: str) -> None:
    name, signal = "LLMAutopilotRemediationExhausted", "KVCapacity"
    port = int(operator.env["LLM_AUTOPILOT_METRICS_PORT"])
    # the alert sums increase() over 30 min by signal: earlier runs' operators would still count
    delete_series(prometheus_url, f'llm_autopilot_remediation_steps_total{{job="{RELEASE}",'
                                  f'namespace="{RELEASE_NAMESPACE}"}}')
    wait_inactive(prometheus_url, name, signal=signal)
    operator_target(port)
    wait_for("the operator scraped", lambda: operator_up(prometheus_url, port, 1), 30)
    exhausted = (f'llm_autopilot_remediation_steps_total{{kind="exhausted",signal="{signal}",'
                 f'instance="127.0.0.1:{port}"}}')
    # The operator creates every counter series at 0 when it starts, so the first exhaustion is an increase
    # that the alert sees.
    assert float(wait_for_series(prometheus_url, exhausted)[0]["value"][1]) == 0
    exhaust(kubectl, namespace)
    alert = wait_firing(prometheus_url, name, signal=signal)
    assert alert["labels"]["severity"] == "critical"
    assert alert["annotations"]["summary"] == f"llm-autopilot remediation exhausted ({signal})"
    assert float(prom_query(prometheus_url, exhausted)[0]["value"][1]) >= 1


def test_operator_down_fires(operator: Operator, prometheus_url: str, rules: Path,
                             operator_target: Callable[[int], None]) -> None:
    # absent(<binary expression>) yields a series without labels; the rule names job and namespace itself
    name, summary = "LLMAutopilotOperatorDown", f"llm-autopilot operator down in {RELEASE_NAMESPACE}"
    port, closed = int(operator.env["LLM_AUTOPILOT_METRICS_PORT"]), _free_port()
    operator_target(port)
    wait_for("the operator scraped", lambda: operator_up(prometheus_url, port, 1), 30)
    wait_inactive(prometheus_url, name)
    since = time.time()
    operator_target(closed)  # nothing listens there: the scrape fails, up == 0
    alert = wait_held_back_then_firing(prometheus_url, name, since)  # held back by `for` first
    assert alert["labels"] == {"alertname": name, "severity": "critical", "job": "llm-autopilot",
                               "namespace": RELEASE_NAMESPACE}
    assert alert["annotations"]["summary"] == summary
    assert operator_up(prometheus_url, closed, 0)
    operator_target(port)
    wait_inactive(prometheus_url, name)
