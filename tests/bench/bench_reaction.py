"""Reaction time: from a KV-saturation signal being visible in Prometheus to the Deployment being patched.

On the local cluster with the real Prometheus and the vLLM metrics simulator. For each trial: deploy an
LLMDeployment, feed saturated KV usage with growing preemptions, note when the operator's own query first
returns the signal in Prometheus (t0) and when the Deployment carries the new rung's arguments (t1).
Prints the figures; asserts nothing. Goal: t1 - t0 <= the poll (resync) interval + 5 s. `make bench-reaction`.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import yaml
from hack.vllm_sim import VllmSimulator

from llm_autopilot.controller.metrics import USAGE_METRICS, saturated_query
from tests.e2e.conftest import CRD, Kubectl, Operator, _cluster_env, _free_port, wait_for

POLL_SECONDS = 5
WINDOW = 30
TRIALS = int(sys.argv[1]) if len(sys.argv) > 1 else 3


def query(url: str, promql: str) -> list[dict[str, object]]:
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}", timeout=5) as r:
        return list(json.loads(r.read())["data"]["result"])


def running_pods(k: Kubectl, ns: str) -> list[str]:
    pods = k.json("pods", "-n", ns, "-l", "app.kubernetes.io/instance=chat")["items"]
    return [p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")]


def kv_args(k: Kubectl, ns: str) -> bool:
    args = k.json("deployment", "chat", "-n", ns)["spec"]["template"]["spec"]["containers"][0]["args"]
    return "--kv-cache-dtype" in args


def trial(k: Kubectl, sim: VllmSimulator, prom: str) -> float:
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    k("create", "namespace", ns)
    obj = {"apiVersion": "llm-autopilot.io/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": "chat"},
           "spec": {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4", "maxGPUs": 1, "tolerations": [
               {"key": "kwok.x-k8s.io/node", "operator": "Exists"}]},
               "serving": {"maxModelLen": 16384, "allowedKVCacheDtypes": ["auto", "fp8"]},
               "remediation": {"cooldownSeconds": 0, "kvSaturationWindowSeconds": WINDOW,
                               "kvSaturationThreshold": 0.9}}}
    k("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(obj))
    pods = wait_for("a Running pod", lambda: running_pods(k, ns), 90)
    stop = threading.Event()

    def feed() -> None:
        count = 0
        while not stop.is_set():
            count += 3
            for pod in pods:
                sim.set_pod(ns, pod, model_name="Qwen/Qwen3-8B", kv_cache_usage_perc=0.97, num_requests_running=20,
                            num_requests_waiting=6, num_preemptions_total=count)
            stop.wait(1)

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    selector = f'namespace="{ns}",pod=~"{"|".join(pods)}"'
    promql = saturated_query(USAGE_METRICS[0], selector, WINDOW, 0.9)
    try:
        wait_for("the signal in Prometheus", lambda: query(prom, promql), WINDOW + 60, interval=0.25)
        t0 = time.monotonic()
        wait_for("the patched Deployment", lambda: kv_args(k, ns), 60, interval=0.25)
        return time.monotonic() - t0
    finally:
        stop.set()
        thread.join(5)
        for pod in pods:
            sim.delete_pod(ns, pod)
        k("delete", "namespace", ns, "--wait=false", check=False)


def main() -> None:
    env = _cluster_env()
    k = Kubectl(env)
    k("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    prom = env["LLM_AUTOPILOT_PROMETHEUS_URL"]
    work = Path(tempfile.mkdtemp(prefix="bench-reaction-"))
    op = Operator({**env, "LLM_AUTOPILOT_RESYNC_SECONDS": str(POLL_SECONDS), "LLM_AUTOPILOT_METRICS_PORT":
                   str(_free_port())}, work / "operator.log")
    sim = VllmSimulator(0, Path(env["LLM_AUTOPILOT_VLLM_TARGETS_DIR"])).start()
    op.start()
    try:
        times = [trial(k, sim, prom) for _ in range(TRIALS)]
    finally:
        op.stop()
        sim.stop()
    print(f"reaction time, signal visible in Prometheus -> Deployment patched ({TRIALS} trials, poll "
          f"interval {POLL_SECONDS} s, scrape 2 s):")
    print("  " + ", ".join(f"{t:.1f} s" for t in times))
    print(f"  median {statistics.median(times):.1f} s, max {max(times):.1f} s; goal <= {POLL_SECONDS + 5} s: "
          f"{'met' if max(times) <= POLL_SECONDS + 5 else 'NOT met'}")


if __name__ == "__main__":
    main()
