"""Deleting an LLMDeployment never waits for the operator.

The operator holds no finalizer: `kubectl delete` finishes at once whether the operator is stopped or busy in
a resync, owner references garbage-collect the Deployment, Service and PodDisruptionBudget (so the GPUs are
freed), and the finalizer earlier versions put on every object is removed when the operator next sees it.
Each test runs its own operator process for its namespace, so that it can stop and start it.
"""

from __future__ import annotations

import json
import socket
import socketserver
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import ROOT, Kubectl, Operator, wait_for

pytestmark = pytest.mark.e2e

RESYNC_SECONDS = 3
OLD_FINALIZER = "llm-autopilot.io/finalizer"
#: `kubectl delete` must return within this (it used to hang with the operator stopped, and to wait up to Kopf's
#: 60 s cancellation polling during a resync)
PROMPT_SECONDS = 10.0
CHILDREN = ("deployment", "service", "poddisruptionbudget")


def manifest(name: str, model: str = "Qwen/Qwen3-8B", finalizers: list[str] | None = None) -> str:
    doc = yaml.safe_load((ROOT / "examples" / "qwen3-8b-l4.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["model"]["name"] = model
    if finalizers:
        doc["metadata"]["finalizers"] = finalizers
    return yaml.safe_dump(doc)


def start_operator(kubectl: Kubectl, namespace: str, log: Path, **env: str) -> Operator:
    settings = {"LLM_AUTOPILOT_RESYNC_SECONDS": str(RESYNC_SECONDS), "HF_ENDPOINT": "http://127.0.0.1:9",
                "LLM_AUTOPILOT_HUB_TIMEOUT_SECONDS": "1", **env}
    return Operator({**kubectl.env, **settings}, log, ["--standalone", f"--namespace={namespace}"]).start()


def finalizers(kubectl: Kubectl, namespace: str, name: str) -> list[str] | None:
    """The object's finalizers, None once it is gone."""
    obj = kubectl.maybe("llmd", name, "-n", namespace)
    return None if obj is None else list(obj["metadata"].get("finalizers") or [])


def timed_delete(kubectl: Kubectl, namespace: str, name: str) -> float:
    start = time.monotonic()
    result = kubectl("delete", "llmd", name, "-n", namespace, "--wait=true", "--timeout=45s", check=False)
    elapsed = time.monotonic() - start
    assert result.returncode == 0, f"kubectl delete failed after {elapsed:.1f}s: {result.stderr.strip()}"
    sys.stderr.write(f"kubectl delete llmd {name}: {elapsed:.1f}s\n")
    return elapsed


def children_of(kubectl: Kubectl, namespace: str, name: str) -> list[str]:
    return [kind for kind in CHILDREN if kubectl.maybe(kind, name, "-n", namespace) is not None]


@pytest.fixture
def release_finalizers(kubectl: Kubectl, namespace: str) -> Iterator[None]:
    """Whatever a failing test leaves behind must not keep the namespace Terminating forever."""
    yield
    for obj in (kubectl.maybe("llmd", "-n", namespace) or {}).get("items", []):
        kubectl("patch", "llmd", obj["metadata"]["name"], "-n", namespace, "--type=merge",
                "-p", '{"metadata":{"finalizers":null}}', check=False)


def test_delete_with_the_operator_stopped_finishes_and_frees_the_gpus(
        kubectl: Kubectl, namespace: str, tmp_path: Path, release_finalizers: None) -> None:
    op = start_operator(kubectl, namespace, tmp_path / "operator.log")
    try:
        kubectl("apply", "-n", namespace, "-f", "-", input=manifest("qwen3-8b"))
        wait_for("the workload", lambda: children_of(kubectl, namespace, "qwen3-8b") == list(CHILDREN), timeout=90)
        wait_for("a Running vLLM pod", lambda: any(
            p["status"].get("phase") == "Running"
            for p in kubectl.json("pods", "-n", namespace, "-l", "app.kubernetes.io/instance=qwen3-8b")["items"]),
            timeout=90)
        wait_for("a resync", lambda: "Timer 'resync' succeeded" in op.output(), timeout=30)
        assert finalizers(kubectl, namespace, "qwen3-8b") == [], "the operator put a finalizer on the object"
    finally:
        op.stop()

    assert timed_delete(kubectl, namespace, "qwen3-8b") < PROMPT_SECONDS
    # the garbage collector follows the owner references: the workload and its GPUs go too
    wait_for("the children collected", lambda: children_of(kubectl, namespace, "qwen3-8b") == [], timeout=90)
    wait_for("the pods gone", lambda: kubectl.json("pods", "-n", namespace)["items"] == [], timeout=90)
    sys.stderr.write(f"operator log: {op.log}\n")


def test_objects_with_the_old_finalizer_are_released_when_the_operator_resumes(
        kubectl: Kubectl, namespace: str, tmp_path: Path, release_finalizers: None) -> None:
    """What an upgrade finds: objects that carry the finalizer earlier versions added, one already deleted."""
    kubectl("apply", "-n", namespace, "-f", "-", input=manifest("kept", finalizers=[OLD_FINALIZER]))
    kubectl("apply", "-n", namespace, "-f", "-", input=manifest("deleted", finalizers=[OLD_FINALIZER]))
    kubectl("delete", "llmd", "deleted", "-n", namespace, "--wait=false")
    assert finalizers(kubectl, namespace, "deleted") == [OLD_FINALIZER]  # Terminating, held by the old finalizer

    op = start_operator(kubectl, namespace, tmp_path / "operator.log")
    try:
        wait_for("the deleted object released", lambda: finalizers(kubectl, namespace, "deleted") is None, timeout=60)
        wait_for("the old finalizer removed", lambda: finalizers(kubectl, namespace, "kept") == [], timeout=60)
        wait_for("the kept object reconciled", lambda: children_of(kubectl, namespace, "kept") == list(CHILDREN),
                 timeout=90)
    finally:
        op.stop()
    assert timed_delete(kubectl, namespace, "kept") < PROMPT_SECONDS
    wait_for("the children collected", lambda: children_of(kubectl, namespace, "kept") == [], timeout=90)


@dataclass
class SlowHub:
    """An HF_ENDPOINT that holds every request for `hold` seconds, then answers 404: each reconcile of a model
    outside the catalog takes that long, so a resync can be caught in flight."""

    hold: float
    requests: list[str] = field(default_factory=list)
    open: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)

    def count(self, needle: str) -> tuple[int, int]:
        """(requests so far, requests in flight) whose request line contains `needle`."""
        with self.lock:
            return (sum(needle in r for r in self.requests), sum(n for r, n in self.open.items() if needle in r))

    def serve(self) -> tuple[socketserver.ThreadingTCPServer, int]:
        hub = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                conn: socket.socket = self.request
                data = b""
                while b"\r\n\r\n" not in data and len(data) < 65536:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    data += chunk
                line = data.split(b"\r\n", 1)[0].decode(errors="replace")
                with hub.lock:
                    hub.requests.append(line)
                    hub.open[line] = hub.open.get(line, 0) + 1
                try:
                    hub.stopping.wait(hub.hold)
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass  # the client gave up first
                finally:
                    with hub.lock:
                        hub.open[line] -= 1

        server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server, int(server.server_address[1])


def test_delete_during_a_resync_is_not_held_by_it(kubectl: Kubectl, namespace: str, tmp_path: Path,
                                                  release_finalizers: None) -> None:
    hub = SlowHub(hold=15.0)
    server, port = hub.serve()
    model = f"e2e-slow/model-{uuid.uuid4().hex[:8]}"  # not in the catalog: every reconcile asks the Hub
    op = start_operator(kubectl, namespace, tmp_path / "operator.log", HF_ENDPOINT=f"http://127.0.0.1:{port}",
                        LLM_AUTOPILOT_HUB_TIMEOUT_SECONDS="60")
    try:
        kubectl("apply", "-n", namespace, "-f", "-", input=manifest("slow", model=model))
        # the operator runs one reconcile of an object at a time (controller/runtime.py::ObjectLocks): a second
        # request in flight after the first has ended is the reconcile that waited for it (a resync, or the
        # create handler's retry), on the Hub when the delete comes
        wait_for("a second reconcile in flight",
                 lambda: hub.count(model)[0] >= 2 and hub.count(model)[1] >= 1, timeout=90, interval=0.2)
        assert finalizers(kubectl, namespace, "slow") == []

        assert timed_delete(kubectl, namespace, "slow") < PROMPT_SECONDS
        assert hub.count(model)[1] >= 1, "the resync finished before the delete: nothing was proven"

        # the timer of the deleted object stops: once the requests in flight end, no new one comes
        wait_for("the requests in flight to end", lambda: hub.count(model)[1] == 0, timeout=hub.hold + 15)
        seen = hub.count(model)[0]
        deadline = time.monotonic() + 3 * RESYNC_SECONDS + 2  # a running timer would ask again within one interval
        while time.monotonic() < deadline:
            assert hub.count(model)[0] == seen, f"a resync ran for the deleted object: {hub.requests[-1]}"
            time.sleep(0.2)
        assert json.loads(kubectl("get", "llmd", "-n", namespace, "-o", "json").stdout)["items"] == []
    finally:
        op.stop()
        hub.stopping.set()
        server.shutdown()
        server.server_close()
    sys.stderr.write(f"operator log: {op.log}\n")
