"""End-to-end fixtures: the real local control plane (hack/cluster.py), the CRD, the operator as a process.

The cluster is started by `hack/cluster.py up` (idempotent; the first run builds the binaries), the
operator runs as `llm-autopilot operator` with the admission webhook on loopback, and each test gets
its own namespace.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hack.dev import cluster_env

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = [sys.executable, str(ROOT / "hack" / "cluster.py")]
CRD = ROOT / "crds" / "llm-autopilot.io_llmdeployments.yaml"
RESYNC_SECONDS = 3


def _cluster_env() -> dict[str, str]:
    subprocess.run([*CLUSTER, "up"], check=True, stdout=sys.stderr)
    return cluster_env()


@dataclass
class Kubectl:
    env: dict[str, str]

    def __call__(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(["kubectl", *args], env=self.env, capture_output=True, text=True, input=input,
                                timeout=60, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self("get", *args, "-o", "json").stdout)

    def maybe(self, *args: str) -> Any:
        result = self("get", *args, "-o", "json", check=False)
        return json.loads(result.stdout) if result.returncode == 0 else None


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except AssertionError as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:port."""
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="session")
def kubectl() -> Kubectl:
    k = Kubectl(_cluster_env())
    k("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    k("wait", "--for=condition=Established", "crd/llmdeployments.llm-autopilot.io", "--timeout=60s")
    return k


class Operator:
    """`llm-autopilot operator ARGS` as a child process (own log), restartable, stopped with SIGTERM or SIGKILL."""

    def __init__(self, env: dict[str, str], log: Path, args: list[str] | None = None) -> None:
        self.env, self.log, self.args = env, log, list(args or [])
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Operator:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "llm_autopilot.cli.main", "operator", "--verbose", *self.args],
                env=self.env, stdout=out, stderr=subprocess.STDOUT)
        return self

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@pytest.fixture(scope="session")
def operator(kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    workdir = tmp_path_factory.mktemp("operator")
    env = {**kubectl.env, "LLM_AUTOPILOT_RESYNC_SECONDS": str(RESYNC_SECONDS), "LLM_AUTOPILOT_WEBHOOK": "true",
           "LLM_AUTOPILOT_WEBHOOK_PORT": str(_free_port()), "LLM_AUTOPILOT_WEBHOOK_CERT_DIR": str(workdir / "certs"),
           "HF_ENDPOINT": "http://127.0.0.1:9", "LLM_AUTOPILOT_HUB_TIMEOUT_SECONDS": "1",
           "LLM_AUTOPILOT_METRICS_PORT": str(_free_port())}
    op = Operator(env, workdir / "operator.log")
    op.start()
    # the webhook configuration appears once Kopf's admission server is up
    wait_for("the operator's webhook configuration",
             lambda: kubectl.maybe("validatingwebhookconfiguration", "llm-autopilot.io"), timeout=60)
    yield op
    op.stop()
    kubectl("delete", "validatingwebhookconfiguration", "llm-autopilot.io", "--ignore-not-found", check=False)
    sys.stderr.write(f"operator log: {op.log}\n")


@pytest.fixture
def namespace(kubectl: Kubectl) -> Iterator[str]:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    yield name
    kubectl("delete", "namespace", name, "--wait=false", check=False)


# The metrics fixtures (Prometheus, the vLLM simulator) for every end-to-end module; imported last because
# tests/e2e/metrics.py itself imports from this module.
from tests.e2e.metrics import prometheus_url, vllm_sim  # noqa: E402, F401
