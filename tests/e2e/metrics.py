"""Metrics fixtures for end-to-end tests: the local cluster's Prometheus and the vLLM metrics simulator.

Import the fixtures into a test module (pytest finds them there)::

    from tests.e2e.metrics import prometheus_url, vllm_sim  # noqa: F401 - fixtures

* ``prometheus_url`` (session): ``http://127.0.0.1:<base+90>`` of the cluster's Prometheus (ready);
  ``LLM_AUTOPILOT_PROMETHEUS_URL`` in ``kubectl.env`` has the same value.
* ``vllm_sim`` (session): a started :class:`VllmSimulator` (hack/vllm_sim.py) whose pods Prometheus scrapes
  (file_sd in ``<state>/prometheus/vllm-targets``) every 2 s, labelled ``namespace``/``pod``.
* ``own_prometheus`` (per test): a :class:`PrometheusForwarder`, the shared Prometheus at a URL of the test's own,
  which the test takes down (``.stopped()``) while the other lane keeps using the shared one.

Helpers: :func:`prom_query` (instant query, raises on error), :func:`wait_for_series`, :func:`wait_scraped`
(the simulator's latest values are in Prometheus), :func:`forget_namespace` (drop a namespace's simulated pods),
:func:`start_prometheus`, the context manager :func:`repeating` (a feed of the simulator, every second in a
thread, until the block ends).
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
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
    "PrometheusForwarder",
    "SimulatorError",
    "VllmSimulator",
    "forget_namespace",
    "own_prometheus",
    "prom_query",
    "prometheus_url",
    "start_prometheus",
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


def _port_below_ephemeral_range() -> int:
    """A free port below the kernel's ephemeral range (where ``bind(0)`` and every outgoing connection take theirs),
    like the cluster's own ports: while a forwarder is down, nothing on the machine takes its port as a source port
    (so ``up()`` can listen there again), and a connect to it cannot meet itself (TCP's self-connect)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.sample(range(low - 2000, low), 200):
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low - 2000}..{low - 1}")


class PrometheusForwarder:
    """The shared Prometheus at a URL of a test's own (a TCP forwarder on 127.0.0.1), to take down without
    stopping the Prometheus the other lane uses.

    Why it stands for a stopped Prometheus: what the operator and ``PrometheusSignals`` see of one is its URL
    refusing connections. ``down()`` closes the listening socket, so a connect is refused (RST, ECONNREFUSED)
    exactly as on the port of a stopped process, and closes every open connection, as a stopped process's are, so
    a kept-alive connection of the client's pool cannot reach Prometheus either. ``up()`` listens again on the same
    port: Prometheus is back at the same URL, as after ``hack/cluster.py start prometheus``. What it does not stand
    for: Prometheus' own restart (its ``/-/ready`` and its data are the shared one's, always up).
    """

    def __init__(self, upstream: str) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        assert parsed.hostname and parsed.port, upstream
        self.upstream = (parsed.hostname, parsed.port)
        self.port = _port_below_ephemeral_range()
        self.url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()

    def up(self) -> None:
        """Listen (again) on the forwarder's port; each accepted connection is piped to Prometheus."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the port's closed connections linger
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        with self._lock:
            assert self._listener is None, "already up"
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        """Refuse connections from now on, and end the open ones."""
        with self._lock:
            listener, self._listener = self._listener, None
            connections, self._open = self._open, set()
        if listener is not None:
            _close(listener)  # a connection still in its backlog is reset with it
        for connection in connections:
            _close(connection)

    @contextmanager
    def stopped(self) -> Iterator[None]:
        """Down inside the block, up again afterwards, also when the block fails."""
        self.down()
        try:
            yield
        finally:
            self.up()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed by down()
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._listener is not listener:  # down() came between accept() and here
                    _close(client)
                    _close(upstream)
                    return
                self._open |= {client, upstream}
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with self._lock:  # one side ended (or down() closed it): the connection ends both ways
            self._open -= {source, sink}
        _close(source)
        _close(sink)


def _close(sock: socket.socket) -> None:
    """Shut down before closing: on Linux, close() alone does not wake a thread blocked in accept() or recv()."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


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


@pytest.fixture
def own_prometheus(prometheus_url: str) -> Iterator[PrometheusForwarder]:
    """A Prometheus of the test's own to take down (:class:`PrometheusForwarder`), up; down after the test."""
    forwarder = PrometheusForwarder(prometheus_url)
    forwarder.up()
    yield forwarder
    forwarder.down()


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
