"""Each vllm-cpu node has CPUs of its own and each container its request's weight and its limit's quota
(issue #29 item 5; hack/localcluster/cpucg.py).

The first test is plumbing (the stand-in, tests/README.md "Tiers"): a pod on each node, read from the host as the
kernel sees the container's process: its affinity (``Cpus_allowed_list``, what vLLM's ``auto`` binding reads) is its
node's CPUs, the two nodes' are disjoint, and its cpu group holds the kubelet's ``cpu.shares`` and CFS quota.

The second runs the real CPU vLLM in the issue's scenario: one pod serving under light load, a second one starting
on the other node. It states the second pod's start time and the CPU each pod's processes used meanwhile (from
``/proc/<pid>/stat``); a figure, not an assertion on time.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hack.localcluster import cpucg, kubelet
from hack.vllm_load import Load

from tests.e2e.conftest import Kubectl, wait_for
from tests.e2e.real_vllm import (
    MODEL,
    STAND_IN,
    STAND_IN_START_SECONDS,
    START_SECONDS,
    apply,
    operator_for,
    pods,
    ready_pods,
    real_vllm_fixture,  # noqa: F401 - a fixture
    tiny,
)

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("real_vllm")]

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def main_pid(pod: dict[str, Any]) -> int:
    """The container's process on this host: the process kubelet's container ID is ``process://<pid>``."""
    container_id = pod["status"]["containerStatuses"][0]["containerID"]
    assert container_id.startswith("process://"), container_id
    return int(container_id.removeprefix("process://"))


def cgroup_dir(pid: int, controller: str, root: Path) -> Path:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return root / path.lstrip("/")
    raise AssertionError(f"process {pid} has no {controller} cgroup")


def allowed_cpus(pid: int) -> tuple[int, ...]:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("Cpus_allowed_list"))
    return cpucg.parse_cpu_list(line.split(":", 1)[1])


def node_cpus(kubectl: Kubectl, node: str) -> int:
    return int(kubectl.json("node", node)["status"]["capacity"]["cpu"])


def test_each_node_runs_its_pods_on_its_own_cpus_with_their_requests_weight_and_limit(
        kubectl: Kubectl, namespace: str, tmp_path: Path) -> None:
    resources = {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"cpu": "500m", "memory": "6Gi"}}
    with operator_for(kubectl, namespace, tmp_path):
        # one simulated GPU per node: the two replicas are on the two nodes
        apply(kubectl, namespace, tiny("spread", vllm=STAND_IN, replicas=2, resources=resources))

        def on_every_node() -> list[dict[str, Any]] | None:
            found = ready_pods(kubectl, namespace, "spread")
            return found if len({p["spec"]["nodeName"] for p in found}) == kubelet.NODE_COUNT else None

        running = wait_for("a Ready pod on each vllm-cpu node", on_every_node, timeout=STAND_IN_START_SECONDS + 60,
                           interval=2)
        seen: dict[str, tuple[int, ...]] = {}
        for pod in running:
            node, pid = pod["spec"]["nodeName"], main_pid(pod)
            cpus = allowed_cpus(pid)
            cpuset = cgroup_dir(pid, "cpuset", cpucg.CPUSET_ROOT)
            cpu = cgroup_dir(pid, "cpu", cpucg.CPU_ROOT)
            assert cpucg.parse_cpu_list((cpuset / "cpuset.cpus").read_text()) == cpus, (node, cpuset)
            assert cpuset.parent.name == node and cpu.parent.name == node  # <cluster>/<node>/<container>
            assert len(cpus) == node_cpus(kubectl, node), (node, cpus)  # the capacity the scheduler counts
            assert (cpu / "cpu.shares").read_text().strip() == "256"  # 250m x 1024 / 1000
            assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "50000"  # 500m of a 100 ms period
            assert (cpu / "cpu.cfs_period_us").read_text().strip() == "100000"
            seen[node] = cpus
        assert not set(seen[kubelet.node_names()[0]]) & set(seen[kubelet.node_names()[1]]), seen
        # the machine's CPUs (the kubelet's cpuset is this test's: the same host), split over the nodes
        assert sorted(seen.values()) == sorted(cpucg.split_cpus(cpucg.machine_cpus(), kubelet.NODE_COUNT))
    sys.stderr.write(f"\n[process kubelet] CPUs per node: {seen}\n")


class CpuMeter:
    """The CPU time of every process in each pod's cpu group, sampled in a thread (processes come and go during a
    start: each sample counts what each process used since the last one)."""

    def __init__(self) -> None:
        self.groups: dict[str, Path] = {}
        self.seconds: dict[str, float] = {}
        self._last: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def watch(self, name: str, pod: dict[str, Any]) -> None:
        self.groups[name] = cgroup_dir(main_pid(pod), "cpu", cpucg.CPU_ROOT)
        self.seconds.setdefault(name, 0.0)

    @staticmethod
    def _ticks(pid: int) -> int | None:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))

    def sample(self) -> None:
        for name, group in list(self.groups.items()):
            try:
                pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
            except OSError:
                continue
            for pid in pids:
                ticks = self._ticks(pid)
                if ticks is not None:
                    self.seconds[name] += (ticks - self._last.get(pid, 0)) / CLOCK_TICKS
                    self._last[pid] = ticks

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.sample()

    def start(self) -> CpuMeter:
        self.sample()
        self.seconds = dict.fromkeys(self.seconds, 0.0)  # what was used before the window does not count
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        self.sample()
        return dict(self.seconds)


@pytest.mark.real_vllm
def test_a_second_vllm_starts_on_the_other_node_beside_a_serving_one(
        kubectl: Kubectl, namespace: str, tmp_path: Path) -> None:
    """The issue's scenario: a serving pod under light load (one client, one short completion after another) and
    a second vLLM pod starting on the other node. Each node's CPUs are its own, so the start is not starved."""
    spec = {"serving": {"maxModelLen": 4096}, "remediation": {"enabled": False}}
    with operator_for(kubectl, namespace, tmp_path):
        apply(kubectl, namespace, tiny("pair", replicas=1, **spec))
        first = wait_for("one serving vLLM", lambda: next(iter(ready_pods(kubectl, namespace, "pair")), None),
                         timeout=START_SECONDS, interval=2)
        load = Load(f"http://{first['status']['podIP']}:8000", MODEL, clients=1, prompt_tokens=100,
                    max_tokens=32).start()
        meter = CpuMeter()
        try:
            meter.watch("serving", first)
            meter.start()
            scaled = time.monotonic()
            apply(kubectl, namespace, tiny("pair", replicas=2, **spec))

            def second_running() -> dict[str, Any] | None:
                for pod in pods(kubectl, namespace, "pair"):
                    statuses = pod["status"].get("containerStatuses") or []
                    if pod["metadata"]["name"] != first["metadata"]["name"] and statuses and statuses[0].get(
                            "containerID"):
                        return pod
                return None

            second = wait_for("the second pod's container", second_running, timeout=120, interval=1)
            meter.watch("starting", second)
            wait_for("two serving vLLMs", lambda: len(ready_pods(kubectl, namespace, "pair")) == 2,
                     timeout=START_SECONDS, interval=1)
            started = time.monotonic() - scaled
            used = meter.stop()
        finally:
            result = load.stop()
        nodes = {p["spec"]["nodeName"] for p in ready_pods(kubectl, namespace, "pair")}
        assert len(nodes) == kubelet.NODE_COUNT, nodes
        assert result.completed > 0, result  # the serving pod served throughout
    shares = {name: f"{100 * seconds / started:.0f} % of a core" for name, seconds in used.items()}
    sys.stderr.write(f"\n[real vLLM] a second vLLM beside a serving one: Ready {started:.0f} s after the scale-out; "
                     f"CPU meanwhile {shares}; {result.completed} completions served, {result.failed} failed; "
                     f"load average {os.getloadavg()[0]:.1f}\n")
