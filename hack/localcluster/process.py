"""Starting, checking and stopping the cluster's processes (each in its own session, PID in a file)."""

from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .paths import ClusterError, fmt_duration, log

if TYPE_CHECKING:  # only for annotations: the component table is built on top of this module
    from .components import Component
    from .state import Cluster

STOP_GRACE_SECONDS = 10.0


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Like Go's listeners: TIME_WAIT leftovers do not block, a listener does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def check_ports_free(cluster: Cluster, comp: Component) -> None:
    """Refuse to start next to a foreign listener (its health check would lie)."""
    busy = [cluster.ports[k] for k in comp.ports if port_in_use(cluster.ports[k])]
    if busy:
        raise ClusterError(
            f"{comp.name}: 127.0.0.1 port(s) {busy} already in use, probably by another "
            "cluster; set LLM_AUTOPILOT_PORT_BASE (and LLM_AUTOPILOT_CLUSTER_DIR) "
            f"or stop it. State: {cluster.root}"
        )


def read_pid(cluster: Cluster, comp: Component) -> int | None:
    """PID of the component if its recorded process still runs our binary."""
    try:
        pid = int(cluster.pid_file(comp.name).read_text().split()[0])
        exe = os.readlink(f"/proc/{pid}/exe")
    except (OSError, ValueError, IndexError):
        return None
    expected = str(comp.executable.resolve())
    return pid if exe.removesuffix(" (deleted)") == expected else None


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start_component(cluster: Cluster, comp: Component) -> None:
    log_path = cluster.log_file(comp.name)
    cmd = [str(comp.executable), *comp.args(cluster)]
    start = time.monotonic()
    with log_path.open("a") as out:
        out.write(f"\n==== {datetime.datetime.now(datetime.UTC).isoformat()} {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(
            cmd,
            cwd=cluster.root,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **comp.env(cluster)} if comp.env else None,
        )
    cluster.pid_file(comp.name).write_text(f"{proc.pid}\n")
    deadline = start + comp.start_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ClusterError(f"{comp.name} exited with {proc.returncode}; log {log_path}:\n{tail(log_path)}")
        if comp.healthy(cluster):
            log(f"{comp.name}: up (pid {proc.pid}, {fmt_duration(time.monotonic() - start)})")
            return
        time.sleep(0.5)
    raise ClusterError(f"{comp.name} not healthy after {comp.start_timeout:.0f}s; log {log_path}:\n{tail(log_path)}")


def wait_healthy(cluster: Cluster, comp: Component, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not comp.healthy(cluster):
        if time.monotonic() > deadline:
            return False
        time.sleep(1.0)
    return True


def wait_for(what: str, check: Callable[[], bool], timeout: float) -> None:
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.5)
    log(f"{what}: ok ({fmt_duration(time.monotonic() - start)})")


def stop_pid(name: str, pid: int, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM the component's process group, SIGKILL it after a grace period."""

    def alive() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        try:  # a zombie (our own child) counts as gone
            return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
        except (OSError, IndexError):
            return False

    def signal_group(sig: signal.Signals) -> None:
        try:
            os.killpg(pid, sig)  # started with start_new_session: pgid == pid
        except ProcessLookupError:
            pass
        except PermissionError:
            os.kill(pid, sig)

    signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    if alive():
        log(f"{name}: still running after {grace_seconds:.0f}s, sending SIGKILL")
        signal_group(signal.SIGKILL)
        while alive():
            time.sleep(0.1)
    log(f"{name}: stopped (pid {pid})")
