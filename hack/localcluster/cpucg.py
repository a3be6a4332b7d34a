"""CPU as a cluster gives it: each process node its own CPUs, each container its request's weight and its limit.

A real node is its own machine; the process nodes share this one. Without a fence, vLLM's CPU build, which binds
its OpenMP worker threads to cores itself (``VLLM_CPU_OMP_THREADS_BIND=auto``: the cores in the process's affinity
mask, ``vllm/utils/cpu_resource_utils.py::get_allowed_cpu_list``), put the workers of two "nodes" on one core. So:

- each node gets a cpuset of its own (cgroup v1 ``cpuset`` controller): the machine's CPUs split over the nodes,
  contiguous, at least one each (``split_cpus``); its ``status.capacity.cpu`` says that count. A container's
  cpuset is its node's (a kubelet's CPU manager with the ``none`` policy: the node's shared pool), so
  ``sched_getaffinity`` in the container names its node's CPUs only, while ``/sys/devices/system/cpu`` (and
  ``lscpu``) still list the machine's, as in a container;
- each container gets a ``cpu`` group (cgroup v1 ``cpu`` controller) with the kubelet's arithmetic
  (``pkg/kubelet/cm/helpers_linux.go``): ``cpu.shares`` = request millicores x 1024 / 1000 (at least 2; no request:
  2), ``cpu.cfs_quota_us`` = limit millicores x period / 1000 (at least 1000; no limit: -1) with a 100 ms period;
- above them, as a kubelet's ``kubepods`` group, each node's cpu group weighs its CPUs (1024 per CPU), so the
  containers of the cluster compete with the machine's other processes as a node's pods would with its daemons.

Groups are made under this process's own groups of each controller (``/proc/self/cgroup``), as the memory groups.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Iterable, Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from .paths import ClusterError

CPUSET_ROOT = Path("/sys/fs/cgroup/cpuset")
CPU_ROOT = Path("/sys/fs/cgroup/cpu")
#: the kubelet's constants (pkg/kubelet/cm/helpers_linux.go)
SHARES_PER_CPU = 1024
MIN_SHARES = 2
MAX_SHARES = 262_144
CFS_PERIOD_US = 100_000
MIN_QUOTA_US = 1_000
NO_QUOTA = -1


# --- pure: CPU lists, the split, the kubelet's arithmetic --------------------------------------------------------


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """The kernel's list format ("0-3,6"), as in cpuset.cpus and Cpus_allowed_list."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return tuple(sorted(cpus))


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The kernel's list format, ranges folded: (0, 1, 2, 5) -> "0-2,5"."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][-1] + 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def split_cpus(cpus: Sequence[int], nodes: int) -> list[tuple[int, ...]]:
    """The machine's CPUs over ``nodes`` nodes: contiguous shares whose sizes differ by at most one (the first nodes
    take the remainder), at least one CPU each; with fewer CPUs than nodes, node i shares CPU i mod len(cpus)
    (an overcommitted machine: the only case where two nodes share a core)."""
    if nodes < 1 or not cpus:
        raise ValueError(f"cannot split {len(cpus)} CPUs over {nodes} nodes")
    ordered = sorted(cpus)
    if len(ordered) < nodes:
        return [(ordered[i % len(ordered)],) for i in range(nodes)]
    size, extra = divmod(len(ordered), nodes)
    shares, start = [], 0
    for i in range(nodes):
        end = start + size + (1 if i < extra else 0)
        shares.append(tuple(ordered[start:end]))
        start = end
    return shares


def millicores(quantity: str | int | float | None) -> int | None:
    """A CPU quantity in millicores, rounded up as ``resource.Quantity.MilliValue`` does ("250m" -> 250, "1.5" ->
    1500, "0.0001" -> 1); None for none."""
    if quantity is None or str(quantity).strip() == "":
        return None
    text = str(quantity).strip()
    try:
        value = Decimal(text[:-1]) / 1000 if text.endswith("m") else Decimal(text)
    except InvalidOperation as exc:
        raise ValueError(f"not a CPU quantity: {quantity!r}") from exc
    return math.ceil(value * 1000)


def cpu_shares(request_millicores: int | None) -> int:
    """``MilliCPUToShares``: the request's weight, 1024 a CPU; no (or a zero) request: the minimum, 2."""
    if not request_millicores:
        return MIN_SHARES
    return max(MIN_SHARES, min(MAX_SHARES, request_millicores * SHARES_PER_CPU // 1000))


def cfs_quota_us(limit_millicores: int | None, period_us: int = CFS_PERIOD_US) -> int:
    """``MilliCPUToQuota``: the limit's run time per period (µs); no (or a zero) limit: -1, unthrottled."""
    if not limit_millicores:
        return NO_QUOTA
    return max(MIN_QUOTA_US, limit_millicores * period_us // 1000)


@dataclasses.dataclass(frozen=True)
class CpuSettings:
    """What one container's cpu group says."""

    shares: int
    quota_us: int
    period_us: int = CFS_PERIOD_US


def container_settings(resources: dict[str, Any] | None) -> CpuSettings:
    """A container's ``resources`` as the kubelet turns them into cgroup values. A limit without a request has the
    limit as its request (the API server's defaulting, done here too for a pod that skipped it)."""
    resources = resources or {}
    limit = millicores((resources.get("limits") or {}).get("cpu"))
    request = millicores((resources.get("requests") or {}).get("cpu"))
    return CpuSettings(shares=cpu_shares(request if request is not None else limit), quota_us=cfs_quota_us(limit))


# --- the shell: groups under this process's own ---------------------------------------------------------------


def own_cgroup(controller: str, root: Path) -> Path:
    """This process's group of a cgroup v1 controller (a line "3:cpuset:/path" of /proc/self/cgroup)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return root / path.lstrip("/")
    raise ClusterError(f"no cgroup v1 {controller} controller for this process (/proc/self/cgroup)")


def machine_cpus() -> tuple[int, ...]:
    """The CPUs this process may use: its cpuset's effective CPUs (what its children may be given)."""
    with contextlib.suppress(ClusterError, OSError):
        return parse_cpu_list((own_cgroup("cpuset", CPUSET_ROOT) / "cpuset.effective_cpus").read_text())
    return tuple(sorted(os.sched_getaffinity(0)))


def _write(path: Path, value: str | int) -> None:
    try:
        path.write_text(str(value))
    except OSError as exc:
        raise ClusterError(f"cannot write {value!r} to {path}: {exc}") from exc


def _make(path: Path) -> None:
    try:
        path.mkdir(exist_ok=True)
    except OSError as exc:
        raise ClusterError(f"cannot create cgroup {path}: {exc} (needs root and cgroup v1's cpuset and cpu "
                           "controllers)") from exc


def _remove_tree(path: Path, timeout: float = 10.0) -> None:
    """A group and its children, leaves first (a group with processes or children cannot be removed; the memory
    group's removal has killed the processes, whose exit may take a moment to leave the group)."""
    if not path.is_dir():
        return
    for child in path.iterdir():
        if child.is_dir():
            _remove_tree(child, timeout)
    deadline = time.monotonic() + timeout
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.1)


@dataclasses.dataclass(frozen=True)
class ContainerCpu:
    """One container's cpuset group (under its node's) and cpu group (under its node's)."""

    cpuset_dir: Path
    cpu_dir: Path
    cpus: tuple[int, ...]
    mems: str
    settings: CpuSettings

    def create(self) -> None:
        _make(self.cpuset_dir)
        # a new cpuset group has no CPUs and no memory nodes: no task may join it until both are written
        _write(self.cpuset_dir / "cpuset.cpus", format_cpu_list(self.cpus))
        _write(self.cpuset_dir / "cpuset.mems", self.mems)
        _make(self.cpu_dir)
        _write(self.cpu_dir / "cpu.shares", self.settings.shares)
        _write(self.cpu_dir / "cpu.cfs_period_us", self.settings.period_us)
        _write(self.cpu_dir / "cpu.cfs_quota_us", self.settings.quota_us)

    @property
    def procs_files(self) -> tuple[Path, ...]:
        """Writing a PID to each moves that process (and its future children) into both groups."""
        return (self.cpuset_dir / "cgroup.procs", self.cpu_dir / "cgroup.procs")

    def remove(self) -> None:
        _remove_tree(self.cpuset_dir)
        _remove_tree(self.cpu_dir)


class CpuHost:
    """The cluster's groups: ``<own cpuset>/<cluster>/<node>/<container>`` and the same under the cpu controller."""

    def __init__(self, cluster_name: str, nodes: Sequence[str], cpus: Sequence[int] | None = None) -> None:
        self.cluster_name = cluster_name
        self.nodes = list(nodes)
        self.shares = dict(zip(self.nodes, split_cpus(cpus if cpus is not None else machine_cpus(), len(self.nodes)),
                               strict=True))
        self.cpuset_parent = Path("/nonexistent")
        self.cpu_parent = Path("/nonexistent")
        self.mems = ""

    def node_cpus(self, node: str) -> tuple[int, ...]:
        return self.shares[node]

    def prepare(self) -> None:
        """The cluster's and the nodes' groups, made afresh (whatever a crashed predecessor left goes first)."""
        own_cpuset = own_cgroup("cpuset", CPUSET_ROOT)
        own_cpu = own_cgroup("cpu", CPU_ROOT)
        self.cpuset_parent = own_cpuset / self.cluster_name
        self.cpu_parent = own_cpu / self.cluster_name
        _remove_tree(self.cpuset_parent)
        _remove_tree(self.cpu_parent)
        try:
            self.mems = (own_cpuset / "cpuset.mems").read_text().strip()
        except OSError as exc:
            raise ClusterError(f"cannot read {own_cpuset / 'cpuset.mems'}: {exc}") from exc
        all_cpus = sorted({cpu for share in self.shares.values() for cpu in share})
        _make(self.cpuset_parent)
        _write(self.cpuset_parent / "cpuset.cpus", format_cpu_list(all_cpus))
        _write(self.cpuset_parent / "cpuset.mems", self.mems)
        _make(self.cpu_parent)
        _write(self.cpu_parent / "cpu.shares", cpu_shares(len(all_cpus) * 1000))
        for node, cpus in self.shares.items():
            _make(self.cpuset_parent / node)
            _write(self.cpuset_parent / node / "cpuset.cpus", format_cpu_list(cpus))
            _write(self.cpuset_parent / node / "cpuset.mems", self.mems)
            _make(self.cpu_parent / node)
            _write(self.cpu_parent / node / "cpu.shares", cpu_shares(len(cpus) * 1000))  # the node's kubepods

    def container(self, node: str, name: str, resources: dict[str, Any] | None) -> ContainerCpu:
        return ContainerCpu(cpuset_dir=self.cpuset_parent / node / name, cpu_dir=self.cpu_parent / node / name,
                            cpus=self.node_cpus(node), mems=self.mems, settings=container_settings(resources))


def remove_all(cluster_name: str) -> None:
    """Every group of the cluster under both controllers (a crashed kubelet leaves them)."""
    for controller, root in (("cpuset", CPUSET_ROOT), ("cpu", CPU_ROOT)):
        with contextlib.suppress(ClusterError, OSError):
            _remove_tree(own_cgroup(controller, root) / cluster_name)
