"""A container runtime for the process kubelet: one container instance = one process tree in a memory cgroup,
inside its pod's network namespace, with its output in a CRI-format log file.

It runs the container's ``command`` and ``args`` exactly as the pod spec gives them, resolved on a PATH
whose first entry is the CPU vLLM's virtual environment (the "image"), plus the only stand-ins this project
documents for what a CPU has no notion of (``extra_args``, e.g. ``--kv-cache-memory-bytes`` for a GPU's KV
room; or ``sysfs_mounts``: a simulated device's memory, as a memory node's ``meminfo`` that vLLM's CPU worker
reads). What an instance ended with is reported as a CRI runtime does: exit code, ``OOMKilled`` when the
cgroup counted an OOM kill, start and finish times.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .cpucg import ContainerCpu
from .crilog import LogWriter, rfc3339_nano
from .memcg import MemoryCgroup
from .paths import ClusterError
from .podnet import PodNetwork

#: moves the shell into the container's cgroup, then becomes the container's command (same PID)
_ENTER_CGROUP = 'echo $$ > "$0" && exec "$@"'


@dataclasses.dataclass(frozen=True)
class Mount:
    """A volume mount: a host folder bound at ``target`` (an emptyDir's per-pod folder, a PersistentVolume's
    folder), or a tmpfs (``medium: Memory``); in the container's own mount namespace only."""

    target: str
    source: Path | None = None  # None: a tmpfs
    size_bytes: int | None = None
    read_only: bool = False
    create_source: bool = True  # an emptyDir's folder is made on first use; a PersistentVolume's must exist
    file: bool = False  # a single file (the termination message), bound over a file

    def shell(self) -> str:
        target = shlex.quote(self.target)
        if self.file:
            # the mount point: an empty file, made on the host's file system if missing (as mkdir -p makes a
            # folder's), e.g. /dev/termination-log; the file bound over it is the container's own
            parent = shlex.quote(str(Path(self.target).parent))
            bind = f"mount --bind {shlex.quote(str(self.source))} {target}"
            return f"{{ [ -e {target} ] || {{ mkdir -p {parent} && : > {target}; }}; }} && {bind}"
        if self.source is None:
            size = f",size={self.size_bytes}" if self.size_bytes else ""
            command = f"mount -t tmpfs -o mode=1777{size} tmpfs {target}"
        else:
            command = f"mount --bind {shlex.quote(str(self.source))} {target}"
        if self.read_only:
            command += f" && mount -o remount,bind,ro {target}"
        # the mount point must exist; created on the host as an empty folder (the mount itself is private)
        return f"mkdir -p {target} && {command}"


@dataclasses.dataclass(frozen=True)
class Exit:
    """How one container instance ended (``lastState.terminated``)."""

    exit_code: int
    reason: str  # OOMKilled, Error, Completed
    started_at: str
    finished_at: str
    container_id: str
    peak_memory_bytes: int = 0


class StartError(RuntimeError):
    """The container could not be started; ``reason`` as the kubelet reports it in ``state.waiting``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclasses.dataclass
class Instance:
    """One running container instance."""

    process: subprocess.Popen[bytes]
    cgroup: MemoryCgroup
    log: LogWriter
    started_at: str
    container_id: str
    cpu: ContainerCpu | None = None  # its node's cpuset and its own cpu share (cpucg)

    def exited(self) -> int | None:
        return self.process.poll()


def resolve(executable: str, path: str) -> str | None:
    if "/" in executable:
        return executable if os.access(executable, os.X_OK) else None
    return shutil.which(executable, path=path)


#: a memory node's meminfo, as the kernel writes it and vLLM's CPU worker reads it
#: (``vllm/utils/cpu_resource_utils.py::get_memory_node_info``: MemTotal, and MemFree + Active(file) +
#: Inactive(file) + SReclaimable as available)
NODE_MEMINFO = "/sys/devices/system/node/node{node}/meminfo"
_MEMINFO_KEYS = ("MemTotal", "MemFree", "MemUsed", "SwapCached", "Active", "Inactive", "Active(anon)",
                 "Inactive(anon)", "Active(file)", "Inactive(file)", "Unevictable", "Mlocked", "Dirty", "Writeback",
                 "FilePages", "Mapped", "AnonPages", "Shmem", "KernelStack", "PageTables", "Slab", "SReclaimable",
                 "SUnreclaim")


def simulated_meminfo(node: int, total_bytes: int) -> str:
    """A memory node of ``total_bytes`` with all of it free and nothing else counted (no page cache, nothing
    reclaimable): a device's memory before its process allocates, in the kernel's format ("Node 0 MemTotal:
    1024 kB")."""
    kib = total_bytes // 1024
    values = {"MemTotal": kib, "MemFree": kib}
    return "".join(f"Node {node} {key + ':':<16}{values.get(key, 0):>9} kB\n" for key in _MEMINFO_KEYS)


def command_line(*, procs_file: Path, mounts: tuple[Mount, ...], network_prefix: list[str],
                 sysfs_mounts: tuple[Mount, ...], executable: str, args: list[str],
                 more_procs_files: tuple[Path, ...] = ()) -> list[str]:
    """The container's process chain, each step ``exec``-ing the next (same PID throughout):
    1. into the cgroups first (the memory group's ``procs_file``, then ``more_procs_files``: the cpuset and cpu
       groups): `ip netns exec` mounts the namespace's own /sys, which hides the cgroup tree;
    2. a private mount namespace for the volumes;
    3. the pod's network namespace: `ip netns exec` unshares the mount namespace again and mounts a fresh sysfs
       on /sys, so
    4. binds over /sys files (``sysfs_mounts``) come after it, or that sysfs would hide them."""
    volumes = ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
               " && ".join([*(m.shell() for m in mounts), 'exec "$@"']), "volumes"] if mounts else []
    sysfs = ["/bin/sh", "-c", " && ".join([*(m.shell() for m in sysfs_mounts), 'exec "$@"']), "sysfs"] \
        if sysfs_mounts else []
    groups = [arg for path in (procs_file, *more_procs_files) for arg in ("/bin/sh", "-c", _ENTER_CGROUP, str(path))]
    return [*groups, *volumes, *network_prefix, *sysfs, executable, *args]


def start(*, network: PodNetwork, cgroup: MemoryCgroup, memory_limit_bytes: int | None, argv: list[str],
          env: dict[str, str], path: str, workdir: Path, log_path: Path, mounts: tuple[Mount, ...] = (),
          sysfs_mounts: tuple[Mount, ...] = (), cpu: ContainerCpu | None = None) -> Instance:
    executable = resolve(argv[0], path) if argv else None
    if executable is None:
        raise StartError("CreateContainerError", f'executable "{argv[0] if argv else ""}" not found in $PATH ({path})')
    for mount in (*mounts, *sysfs_mounts):
        if mount.file:
            if mount.source is None or not mount.source.is_file():
                raise StartError("CreateContainerError", f"file {mount.source} to mount at {mount.target} is missing")
        elif mount.source is not None and mount.create_source:
            mount.source.mkdir(parents=True, exist_ok=True)
        elif mount.source is not None and not mount.source.is_dir():
            raise StartError("CreateContainerConfigError", f"volume source {mount.source} does not exist")
    cgroup.create(memory_limit_bytes)
    if cpu is not None:
        try:
            cpu.create()
        except ClusterError as exc:
            raise StartError("RunContainerError", str(exc)) from exc
    workdir.mkdir(parents=True, exist_ok=True)
    log = LogWriter(log_path)
    command = command_line(procs_file=cgroup.procs_file, mounts=mounts, network_prefix=network.exec_prefix(),
                           sysfs_mounts=sysfs_mounts, executable=executable, args=argv[1:],
                           more_procs_files=cpu.procs_files if cpu is not None else ())
    process = subprocess.Popen(command, env={**env, "PATH": path}, cwd=workdir, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    assert process.stdout is not None and process.stderr is not None
    log.follow(process.stdout, "stdout")
    log.follow(process.stderr, "stderr")
    return Instance(process, cgroup, log, rfc3339_nano(), f"process://{process.pid}", cpu)


def signal_all(instance: Instance, sig: signal.Signals) -> None:
    """The whole container: every process in its cgroup (vLLM's engine and workers are children)."""
    instance.cgroup.kill_all(sig)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(instance.process.pid, sig)


def stop(instance: Instance, grace_seconds: float) -> None:
    """SIGTERM to the container's main process only, as a runtime's StopContainer signals the container's init
    (vLLM's API server then stops its engine itself; a worker signalled directly would end its part of the
    engine under the requests in flight); SIGKILL to the whole container after the grace period."""
    if instance.exited() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(instance.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        while instance.exited() is None and time.monotonic() < deadline:
            time.sleep(0.1)
    signal_all(instance, signal.SIGKILL)
    instance.process.wait()


def container_environment(instance: Instance) -> dict[str, str]:
    """The environment the container's main process started with (what an exec in the container gets)."""
    try:
        raw = Path(f"/proc/{instance.process.pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def exec_hook(instance: Instance, command: list[str], timeout_seconds: float) -> str | None:
    """An exec lifecycle hook, run as a kubelet's ExecSync runs it: in the container's cgroup, its mount and network
    namespaces and its environment (``command[0]`` found on the container's PATH). None when it exited 0 within
    ``timeout_seconds``, else why not (the kubelet's FailedPreStopHook message)."""
    if instance.exited() is not None or not command:
        return "the container is not running"
    argv = ["/bin/sh", "-c", _ENTER_CGROUP, str(instance.cgroup.procs_file),
            "nsenter", f"--target={instance.process.pid}", "--mount", "--net", "--", *command]
    try:
        result = subprocess.run(argv, env=container_environment(instance), stdin=subprocess.DEVNULL,
                                capture_output=True, timeout=max(timeout_seconds, 0.1), check=False)
    except subprocess.TimeoutExpired:
        return f"{shlex.join(command)} did not end within {timeout_seconds:.0f}s"
    if result.returncode != 0:
        output = (result.stdout + result.stderr).decode(errors="replace").strip()[-500:]
        return f"{shlex.join(command)} exited {result.returncode}: {output}"
    return None


def reap(instance: Instance, oom_kills_before: int) -> Exit:
    """After the main process ended: end the rest of the container, read what happened, release it."""
    code = instance.process.wait()
    oom = instance.cgroup.oom_kills() > oom_kills_before
    peak = instance.cgroup.max_usage_bytes()
    instance.cgroup.remove()  # kills whatever the main process left behind
    if instance.cpu is not None:
        instance.cpu.remove()  # empty now: every process of the container is gone
    instance.log.close()
    exit_code = 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell and a runtime report
    reason = "OOMKilled" if oom else ("Completed" if exit_code == 0 else "Error")
    return Exit(exit_code, reason, instance.started_at, rfc3339_nano(datetime.datetime.now(datetime.UTC)),
                instance.container_id, peak)
