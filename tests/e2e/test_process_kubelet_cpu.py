"""Each vllm-cpu node has CPUs of its own and each container its request's weight and its limit's quota
(issue #29 item 5; hack/localcluster/cpucg.py).

The first test is plumbing (the stand-in, tests/README.md "Tiers"): a pod on each node, read from the host as the
kernel sees the container's process: its affinity (``Cpus_allowed_list``, what vLLM's ``auto`` binding reads) is its
node's CPUs, the two nodes' are disjoint, and its cpu group holds the kubelet's ``cpu.shares`` and CFS quota.

The issue's scenario on the real CPU vLLM (a second vLLM starting on the other node beside a loaded one) is the
surge of tests/e2e/test_real_vllm.py's overload test, which asserts the new pod serves on the other node while the
old one is under three times its KV room of load (it had its own test here, one more vLLM start for CI).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from hack.localcluster import cpucg, kubelet

from tests.e2e.conftest import Kubectl, wait_for
from tests.e2e.real_vllm import (
    STAND_IN,
    STAND_IN_START_SECONDS,
    apply,
    operator_for,
    ready_pods,
    real_vllm_fixture,  # noqa: F401 - a fixture
    tiny,
)

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("real_vllm")]

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
