"""Graceful drain on a real vLLM (the CPU build on the vllm-cpu pool): a surge rollout replaces the serving pod
while a client holds long streaming completions on it. Every one of them completes, and the requests sent once
the old pod is terminating reach the new pod.

How requests are routed here: this cluster has no kube-proxy, so the test's client does what kube-proxy (or a
gateway) does for the LLMDeployment's Service: it reads the Service's EndpointSlices and sends each request to an
endpoint whose ``ready`` condition is true. The EndpointSlice controller marks a pod that is being deleted
``terminating`` and not ready at once; the pod's preStop wait (10 s) outlasts that update, and only then does
the kubelet send vLLM SIGTERM, on which ``--shutdown-timeout`` makes it refuse new requests and finish the
ones in flight (docs/users/rollouts.md, "Graceful drain").
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Kubectl, wait_for
from tests.e2e.real_vllm import (
    MODEL,
    START_SECONDS,
    apply,
    arg,
    operator_for,
    pods,
    ready_pods,
    real_vllm_fixture,  # noqa: F401 - a fixture
    tiny,
)

pytestmark = [pytest.mark.e2e, pytest.mark.real_vllm, pytest.mark.usefixtures("real_vllm")]
NAME = "drain"
#: spec.vllm.drainSeconds: the streams below last about STREAM_SECONDS at the rate measured before the rollout;
#: five times that leaves room for a machine that slows them down (an earlier run before each node had its own
#: CPUs took 179 s)
DRAIN_SECONDS = 300
#: streaming completions held on the old pod
STREAMS = 4
#: how long each stream should last at the rate measured on the pod: longer than the new pod's readiness (up to
#: 15 s after its /health answers), the Deployment's scale-down and the 10 s preStop wait together (about 27 s at
#: most). Four streams at once run slower than the one measured: at 60 the last ended 81-103 s after the deletion
STREAM_SECONDS = 40
#: the tiny model's own maximum: room for long streams (4 x 30,000 tokens fit the nodes' 131,072-token KV room)
MAX_MODEL_LEN = 32768
MAX_STREAM_TOKENS = 30000
PROMPT = [11, 12, 13, 14, 15, 16, 17, 18]


@dataclass
class Stream:
    """One streaming completion: when each chunk came, how it ended."""

    ip: str
    max_tokens: int
    chunk_times: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int = 0
    done: bool = False
    error: str | None = None

    def run(self) -> None:
        body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": self.max_tokens, "ignore_eos": True,
                           "stream": True, "stream_options": {"include_usage": True}})
        connection = http.client.HTTPConnection(self.ip, 8000, timeout=DRAIN_SECONDS + 60)
        try:
            connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            if response.status != 200:
                self.error = f"HTTP {response.status}: {response.read()[:200]!r}"
                return
            while line := response.readline():
                text = line.decode().strip()
                if not text.startswith("data: "):
                    continue
                if text == "data: [DONE]":
                    self.done = True
                    break
                chunk = json.loads(text[len("data: "):])
                self.chunk_times.append(time.time())
                for choice in chunk.get("choices") or []:
                    self.finish_reason = choice.get("finish_reason") or self.finish_reason
                if chunk.get("usage"):
                    self.completion_tokens = int(chunk["usage"]["completion_tokens"])
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            connection.close()

    @property
    def complete(self) -> bool:
        return (self.error is None and self.done and self.finish_reason == "length"
                and self.completion_tokens == self.max_tokens)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, daemon=True)
        thread.start()
        return thread


def ready_endpoints(kubectl: Kubectl, namespace: str) -> tuple[list[str], list[str]]:
    """(ready, terminating) addresses of the Service's EndpointSlices, as kube-proxy reads them."""
    slices = kubectl.json("endpointslices", "-n", namespace, "-l", f"kubernetes.io/service-name={NAME}")["items"]
    ready: list[str] = []
    terminating: list[str] = []
    for endpoint in (e for s in slices for e in s.get("endpoints") or []):
        conditions = endpoint.get("conditions") or {}
        if conditions.get("ready"):
            ready += endpoint["addresses"]
        if conditions.get("terminating"):
            terminating += endpoint["addresses"]
    return ready, terminating


def completion_through_service(kubectl: Kubectl, namespace: str, turn: int) -> str:
    """One short completion sent where the Service would send it (a ready endpoint, in turn); the address."""
    ready, _ = ready_endpoints(kubectl, namespace)
    assert ready, "no ready endpoint"
    address = ready[turn % len(ready)]
    body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "ignore_eos": True}).encode()
    request = urllib.request.Request(f"http://{address}:8000/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = json.load(response)
    assert answer["usage"]["completion_tokens"] == 8, answer
    return address


def health(ip: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{ip}:8000/health", timeout=2) as response:
            return int(response.status) == 200
    except OSError:
        return False


def tokens_per_second(ip: str) -> float:
    """One stream's rate with STREAMS of them at once on the pod (the streams below share it so)."""
    probes = [Stream(ip, 256) for _ in range(STREAMS)]
    started = time.time()
    for thread in [p.start() for p in probes]:
        thread.join(120)
    assert all(p.complete for p in probes), [(p.error, p.finish_reason, p.completion_tokens) for p in probes]
    return 256 / (max(p.chunk_times[-1] for p in probes) - started)


def log_of(kubectl: Kubectl, namespace: str, pod: str) -> str:
    result = kubectl("logs", "-n", namespace, pod, "-c", "vllm", check=False)
    return result.stdout if result.returncode == 0 else ""


def test_a_replaced_pod_finishes_its_streams_and_new_requests_go_to_the_new_pod(
        kubectl: Kubectl, namespace: str, tmp_path: Path) -> None:
    spec: dict[str, Any] = {"serving": {"maxModelLen": MAX_MODEL_LEN},
                            "vllm": {"enforceEager": True, "drainSeconds": DRAIN_SECONDS},
                            "remediation": {"enabled": False}}
    began = time.monotonic()
    with operator_for(kubectl, namespace, tmp_path):
        apply(kubectl, namespace, tiny(NAME, **spec))
        old: dict[str, Any] = wait_for("a Ready vLLM", lambda: next(iter(ready_pods(kubectl, namespace, NAME)), None),
                                       timeout=START_SECONDS, interval=2)
        old_name, old_ip = old["metadata"]["name"], old["status"]["podIP"]
        # what the operator rendered: the flag (vLLM 0.32 has it), the preStop wait, the grace period
        container = old["spec"]["containers"][0]
        assert arg(old, "--shutdown-timeout") == str(DRAIN_SECONDS)
        assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "10"]
        assert old["spec"]["terminationGracePeriodSeconds"] == 10 + DRAIN_SECONDS + 15
        rate = tokens_per_second(old_ip)
        max_tokens = min(MAX_STREAM_TOKENS, max(1000, int(rate * STREAM_SECONDS)))

        # a change of the pod template: the Deployment surges a new pod onto the second node, then deletes the old
        apply(kubectl, namespace, tiny(NAME, **{**spec, "vllm": {**spec["vllm"], "env": [
            {"name": "DRAIN_TEST_ROLLOUT", "value": "1"}]}}))

        def new_pod_answers() -> dict[str, Any] | None:
            for pod in pods(kubectl, namespace, NAME):
                ip = (pod.get("status") or {}).get("podIP")
                if pod["metadata"]["name"] != old_name and ip and health(ip):
                    return pod
            return None

        new = wait_for("the surge pod's vLLM answering", new_pod_answers, timeout=START_SECONDS, interval=0.5)
        new_ip = new["status"]["podIP"]
        # the streams start as soon as the new vLLM answers: it is Ready within a probe period or two, and the
        # Deployment then deletes the old pod under them
        streams = [Stream(old_ip, max_tokens) for _ in range(STREAMS)]
        threads = [s.start() for s in streams]

        def old_terminating() -> float | None:
            pod = next((p for p in pods(kubectl, namespace, NAME) if p["metadata"]["name"] == old_name), None)
            return time.time() if pod is None or pod["metadata"].get("deletionTimestamp") else None

        terminating_since = wait_for("the old pod terminating", old_terminating, timeout=120, interval=0.5)
        assert all(t.is_alive() for t in threads), "a stream ended before the old pod began terminating"
        # requests sent from now on, where the Service sends them: every one answered, by the new pod
        routed: list[str] = []
        saw_old_terminating = False
        for turn in range(6):
            ready, terminating = ready_endpoints(kubectl, namespace)
            saw_old_terminating = saw_old_terminating or (old_ip in terminating and old_ip not in ready)
            routed.append(completion_through_service(kubectl, namespace, turn))
            time.sleep(1)
        drain_line = wait_for("vLLM's drain in the old pod's log", lambda: next(
            (line for line in log_of(kubectl, namespace, old_name).splitlines()
             if "draining in-flight requests" in line), None), timeout=60, interval=1)
        for thread in threads:
            thread.join(DRAIN_SECONDS + 60)
        wait_for("the old pod gone", lambda: all(p["metadata"]["name"] != old_name
                                                 for p in pods(kubectl, namespace, NAME)), timeout=120, interval=2)

    cut = [s for s in streams if not s.complete]
    after_sigterm = [s for s in streams if s.chunk_times and s.chunk_times[-1] > terminating_since + 10]
    sys.stderr.write(
        f"\n[real vLLM] drain: {STREAMS} streams of {max_tokens} tokens ({rate:.0f} tokens/s each) on the old pod; "
        f"cut off {len(cut)} ({[(s.error, s.finish_reason, s.completion_tokens) for s in cut]}); "
        f"{len(after_sigterm)} still streaming 10 s after its deletion (after SIGTERM), the last ending "
        f"{max(s.chunk_times[-1] for s in streams if s.chunk_times) - terminating_since:.0f} s after it; "
        f"vLLM: {drain_line.strip()[-110:]!r}; requests after the deletion: {routed} (new pod {new_ip}, "
        f"old {old_ip}); test {time.monotonic() - began:.0f} s\n")
    assert not cut, "streams cut off"
    assert after_sigterm, "no stream outlived the preStop wait: the drain was not exercised"
    assert "count=" in drain_line
    assert saw_old_terminating and set(routed) == {new_ip}, (routed, new_ip)
