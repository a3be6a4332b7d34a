"""Metrics fixtures for end-to-end tests: the local cluster's Prometheus and the vLLM metrics simulator.

Import the fixtures into a test module (pytest finds them there)::

    from tests.e2e.metrics import prometheus_url, vllm_sim  # noqa: F401 - fixtures

* ``prometheus_url`` (session): ``http://127.0.0.1:<base+90>`` of the cluster's Prometheus (ready);
  ``LLM_AUTOPILOT_PROMETHEUS_URL`` in ``kubectl.env`` has the same value.
* ``vllm_sim`` (session): a started :class:`VllmSimulator` (hack/vllm_sim.py) whose pods Prometheus scrapes
  (file_sd in ``<state>/prometheus/vllm-targets``) every 2 s, labelled ``namespace``/``pod``.

Helpers: :func:`prom_query` (instant query, raises on error), :func:`wait_for_series`, :func:`wait_scraped`
(the simulator's latest values are in Prometheus), :func:`forget_namespace` (drop a namespace's simulated pods),
:func:`stop_prometheus` / :func:`start_prometheus`, the context managers :func:`prometheus_stopped` and
:func:`repeating` (a feed of the simulator, every second in a thread, until the block ends).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hack.vllm_sim import SimulatorError, VllmSimulator

from tests.e2e.conftest import CLUSTER, Kubectl, listening

__all__ = [
    "SimulatorError",
    "VllmSimulator",
    "forget_namespace",
    "prom_query",
    "prometheus_stopped",
    "prometheus_url",
    "start_prometheus",
    "stop_prometheus",
    "vllm_sim",
    "wait_for_series",
    "wait_scraped",
]

SCRAPE_SECONDS = 2  # hack/cluster.py PROMETHEUS_SCRAPE_SECONDS
DISCOVERY_TIMEOUT = 30.0  # file_sd refresh (5 s) + first scrapes (2 s), with slack for a loaded machine


def prom_query(url: str, query: str, timeout: float = 5.0) -> list[dict[str, Any]]:
    """Instant query through Prometheus' HTTP API; the ``data.result`` vector."""
    full = f"{url}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    with urllib.request.urlopen(full, timeout=timeout) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def wait_for_series(url: str, query: str, timeout: float = DISCOVERY_TIMEOUT) -> list[dict[str, Any]]:
    """Poll ``query`` until it returns at least one series (bounded by ``timeout``)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = prom_query(url, query)
        except (OSError, AssertionError) as err:
            last = err
        else:
            if last:
                return list(last)
        time.sleep(0.5)
    raise AssertionError(f"no series for {query!r} after {timeout}s; last: {last!r}")


def wait_scraped(url: str, sim: VllmSimulator, namespace: str, pods: list[str],
                 timeout: float = DISCOVERY_TIMEOUT) -> None:
    """Wait until Prometheus holds each simulated pod's current preemption counter: its latest values are
    scraped (the counter only grows, so an equal sample is the latest one)."""
    for pod in pods:
        current = sim.get_pod(namespace, pod)
        assert current is not None, f"no simulated pod {namespace}/{pod}"
        query = f'vllm:num_preemptions_total{{namespace="{namespace}",pod="{pod}"}} == {current.num_preemptions_total}'
        wait_for_series(url, query, timeout)


def forget_namespace(sim: VllmSimulator, namespace: str) -> None:
    """Delete every simulated pod of `namespace` (their scrape targets go with them)."""
    for pod in sim.pods():
        if pod.namespace == namespace:
            sim.delete_pod(namespace, pod.pod)


def _prometheus_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _cluster(env: dict[str, str], *args: str) -> None:
    subprocess.run([*CLUSTER, *args], env=env, check=True, stdout=sys.stderr, timeout=120)


def stop_prometheus(env: dict[str, str]) -> None:
    """``hack/cluster.py stop prometheus`` (state kept)."""
    _cluster(env, "stop", "prometheus")


def start_prometheus(env: dict[str, str]) -> None:
    """``hack/cluster.py start prometheus``; returns once ``/-/ready`` answers."""
    _cluster(env, "start", "prometheus")


@contextmanager
def repeating(step: Callable[[], None], interval: float = 1.0) -> Iterator[None]:
    """Run ``step`` every ``interval`` seconds in a thread while the block runs (feeding the simulator, as a
    vLLM's counters move on their own); stopped and joined on the way out."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            step()
            stop.wait(interval)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


@contextmanager
def prometheus_stopped(env: dict[str, str]) -> Iterator[None]:
    """Prometheus is down inside the block and up (ready) again afterwards, even on failure."""
    stop_prometheus(env)
    try:
        yield
    finally:
        start_prometheus(env)


def _remove_dead_targets(targets_dir: Path) -> None:
    """Drop file_sd files left by killed simulators (their port no longer listens)."""
    for path in targets_dir.glob("vllm-sim-*.json"):
        port = path.stem.removeprefix("vllm-sim-")
        if not (port.isdigit() and listening(int(port))):
            path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def prometheus_url(kubectl: Kubectl) -> str:
    url = kubectl.env.get("LLM_AUTOPILOT_PROMETHEUS_URL")
    if not url:
        pytest.fail("`hack/cluster.py env` exported no LLM_AUTOPILOT_PROMETHEUS_URL (cluster up --no-prometheus?)")
    if not _prometheus_ready(url):  # e.g. left stopped by an interrupted test
        start_prometheus(kubectl.env)
    return url


@pytest.fixture(scope="session")
def vllm_sim(kubectl: Kubectl, prometheus_url: str) -> Iterator[VllmSimulator]:
    """A running VllmSimulator on a free port, registered with Prometheus through file_sd."""
    targets_dir = kubectl.env.get("LLM_AUTOPILOT_VLLM_TARGETS_DIR")
    if not targets_dir:
        pytest.fail("`hack/cluster.py env` exported no LLM_AUTOPILOT_VLLM_TARGETS_DIR")
    _remove_dead_targets(Path(targets_dir))
    sim = VllmSimulator(0, Path(targets_dir)).start()
    yield sim
    sim.stop()
