"""Container memory limits as a container runtime sets them: a cgroup (v1 memory controller) per container.

A process that outgrows its group's ``memory.limit_in_bytes`` is killed by the kernel (exit status 137 for
the process it picks), and the group's ``memory.oom_control`` counts the kill: that count is how a runtime
knows to report ``OOMKilled``. Groups are made under this process's own memory cgroup (``/proc/self/cgroup``),
where a sandboxed root may create children.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from .paths import ClusterError

MEMORY_ROOT = Path("/sys/fs/cgroup/memory")


def own_memory_cgroup() -> Path:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return MEMORY_ROOT / path.lstrip("/")
    raise ClusterError("no cgroup v1 memory controller for this process (/proc/self/cgroup)")


class MemoryCgroup:
    """One container's group: create with a limit, move a process in, read OOM kills, kill all, remove."""

    def __init__(self, parent: Path, name: str) -> None:
        self.path = parent / name

    @classmethod
    def parent_for(cls, cluster_name: str) -> Path:
        parent = own_memory_cgroup() / cluster_name
        try:
            parent.mkdir(exist_ok=True)
        except OSError as exc:
            raise ClusterError(f"cannot create memory cgroup {parent}: {exc} (needs root and cgroup v1's memory "
                               "controller)") from exc
        return parent

    def create(self, limit_bytes: int | None) -> None:
        self.path.mkdir(exist_ok=True)
        if limit_bytes is not None:
            (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))

    @property
    def procs_file(self) -> Path:
        """Writing a PID here moves that process (and its future children) into the group."""
        return self.path / "cgroup.procs"

    def oom_kills(self) -> int:
        try:
            for line in (self.path / "memory.oom_control").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except OSError:
            pass
        return 0

    def max_usage_bytes(self) -> int:
        try:
            return int((self.path / "memory.max_usage_in_bytes").read_text())
        except (OSError, ValueError):
            return 0

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self.procs_file.read_text().split()]
        except OSError:
            return []

    def kill_all(self, sig: signal.Signals = signal.SIGKILL) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def remove(self, timeout: float = 10.0) -> None:
        """Kill what is left in the group and remove it (a group with processes cannot be removed)."""
        if not self.path.exists():
            return
        deadline = time.monotonic() + timeout
        while self.pids() and time.monotonic() < deadline:
            self.kill_all()
            time.sleep(0.1)
        with contextlib.suppress(OSError):
            self.path.rmdir()


def remove_all(parent: Path) -> None:
    """Every container group under ``parent``, then ``parent`` itself (a crashed kubelet leaves them)."""
    if not parent.is_dir():
        return
    for child in parent.iterdir():
        if child.is_dir():
            MemoryCgroup(parent, child.name).remove()
    with contextlib.suppress(OSError):
        parent.rmdir()
