"""The process kubelet's CPUs: each node its own share of the machine's CPUs, each container the kubelet's
``cpu.shares`` for its request and CFS quota for its limit (hack/localcluster/cpucg.py)."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
from hack.localcluster import cpucg, runtime

SPLITS = {
    "2 CPUs, 2 nodes: one core each": ((0, 1), 2, [(0,), (1,)]),
    "8 CPUs, 3 nodes: the first nodes take the remainder": (tuple(range(8)), 3, [(0, 1, 2), (3, 4, 5), (6, 7)]),
    "4 CPUs, 1 node: all of them": ((0, 1, 2, 3), 1, [(0, 1, 2, 3)]),
    "a sparse cpuset, contiguous in its own order": ((6, 2, 3, 9), 2, [(2, 3), (6, 9)]),
    "fewer CPUs than nodes: at least one each, shared round": ((0,), 2, [(0,), (0,)]),
    "3 CPUs, 5 nodes": ((0, 1, 2), 5, [(0,), (1,), (2,), (0,), (1,)]),
}


@pytest.mark.parametrize(("cpus", "nodes", "expected"), list(SPLITS.values()), ids=list(SPLITS))
def test_the_machines_cpus_split_over_the_nodes(cpus: tuple[int, ...], nodes: int,
                                                expected: list[tuple[int, ...]]) -> None:
    split = cpucg.split_cpus(cpus, nodes)
    assert split == expected
    assert all(split) and len(split) == nodes
    if len(cpus) >= nodes:  # no CPU given twice, none left out
        assert sorted(c for share in split for c in share) == sorted(cpus)


def test_no_split_without_cpus_or_nodes() -> None:
    with pytest.raises(ValueError):
        cpucg.split_cpus((), 2)
    with pytest.raises(ValueError):
        cpucg.split_cpus((0, 1), 0)


def test_cpu_lists_in_the_kernels_format() -> None:
    assert cpucg.parse_cpu_list("0-2,5,7-8\n") == (0, 1, 2, 5, 7, 8)
    assert cpucg.parse_cpu_list("1") == (1,)
    assert cpucg.parse_cpu_list("") == ()
    assert cpucg.format_cpu_list((5, 0, 1, 2, 8, 7)) == "0-2,5,7-8"
    assert cpucg.format_cpu_list((1,)) == "1"


MILLICORES = {"250m": 250, "1": 1000, "1.5": 1500, 2: 2000, "0.0001": 1, "100m": 100, None: None, "": None}


@pytest.mark.parametrize(("quantity", "expected"), list(MILLICORES.items()))
def test_cpu_quantities_in_millicores_rounded_up(quantity: str | int | None, expected: int | None) -> None:
    assert cpucg.millicores(quantity) == expected


def test_shares_are_the_kubelets_millicores_x_1024_over_1000_at_least_2() -> None:
    assert cpucg.cpu_shares(None) == 2  # no request: the minimum (a BestEffort container)
    assert cpucg.cpu_shares(0) == 2
    assert cpucg.cpu_shares(1) == 2  # 1 x 1024 / 1000 = 1, raised to the minimum
    assert cpucg.cpu_shares(100) == 102
    assert cpucg.cpu_shares(250) == 256
    assert cpucg.cpu_shares(1000) == 1024
    assert cpucg.cpu_shares(10**6) == cpucg.MAX_SHARES


def test_quota_is_the_limits_share_of_a_100ms_period_or_none() -> None:
    assert cpucg.cfs_quota_us(None) == -1  # no limit: unthrottled
    assert cpucg.cfs_quota_us(0) == -1
    assert cpucg.cfs_quota_us(500) == 50_000
    assert cpucg.cfs_quota_us(2000) == 200_000
    assert cpucg.cfs_quota_us(1) == 1_000  # the kernel's minimum quota


def test_a_containers_resources_as_cgroup_values() -> None:
    assert cpucg.container_settings(None) == cpucg.CpuSettings(shares=2, quota_us=-1)
    assert cpucg.container_settings({"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}) \
        == cpucg.CpuSettings(shares=512, quota_us=-1)
    assert cpucg.container_settings({"requests": {"cpu": "250m"}, "limits": {"cpu": "1500m"}}) \
        == cpucg.CpuSettings(shares=256, quota_us=150_000)
    # a limit alone: the request defaults to it, as the API server defaults it
    assert cpucg.container_settings({"limits": {"cpu": "2"}}) == cpucg.CpuSettings(shares=2048, quota_us=200_000)


def test_the_container_enters_every_group_before_the_network_namespace() -> None:
    command = runtime.command_line(procs_file=Path("/mem/procs"), mounts=(), network_prefix=["ip", "netns", "exec",
                                   "pod"], sysfs_mounts=(), executable="/venv/bin/vllm", args=["serve"],
                                   more_procs_files=(Path("/cpuset/procs"), Path("/cpu/procs")))
    netns = command.index("netns")
    assert [command.index(p) for p in ("/mem/procs", "/cpuset/procs", "/cpu/procs")] == sorted(
        command.index(p) for p in ("/mem/procs", "/cpuset/procs", "/cpu/procs"))
    assert command.index("/cpu/procs") < netns
    assert command[-2:] == ["/venv/bin/vllm", "serve"]


def _cgroups_v1() -> bool:
    try:
        return os.geteuid() == 0 and (cpucg.own_cgroup("cpuset", cpucg.CPUSET_ROOT) / "cpuset.cpus").is_file() and (
            cpucg.own_cgroup("cpu", cpucg.CPU_ROOT) / "cpu.shares").is_file()
    except (OSError, cpucg.ClusterError):
        return False


@pytest.mark.skipif(not _cgroups_v1(), reason="needs root and cgroup v1's cpuset and cpu controllers")
def test_a_container_runs_on_its_nodes_cpus_with_its_share_and_the_groups_go_with_it(tmp_path: Path) -> None:
    name = f"llm-autopilot-test-{uuid.uuid4().hex[:8]}"
    host = cpucg.CpuHost(name, ["node-a", "node-b"])
    try:
        host.prepare()
        for node in ("node-a", "node-b"):
            cpu = host.container(node, "c-0", {"requests": {"cpu": "250m"}, "limits": {"cpu": "500m"}})
            cpu.create()
            command = runtime.command_line(procs_file=tmp_path / "memory.procs", mounts=(), network_prefix=[],
                                           sysfs_mounts=(), executable="/bin/grep",
                                           args=["Cpus_allowed_list", "/proc/self/status"],
                                           more_procs_files=cpu.procs_files)
            out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=30).stdout
            assert cpucg.parse_cpu_list(out.split(":")[1]) == host.node_cpus(node)
            assert (cpu.cpu_dir / "cpu.shares").read_text().strip() == "256"
            assert (cpu.cpu_dir / "cpu.cfs_quota_us").read_text().strip() == "50000"
            assert (cpu.cpuset_dir / "cpuset.mems").read_text().strip() == host.mems
            cpu.remove()
            assert not cpu.cpuset_dir.exists() and not cpu.cpu_dir.exists()
    finally:
        cpucg.remove_all(name)
    assert not host.cpuset_parent.exists() and not host.cpu_parent.exists()
