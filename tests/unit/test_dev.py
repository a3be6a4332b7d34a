"""hack/dev.py: whether the operator it started still runs."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from hack import dev


def _wait_state(pid: int, state: str) -> None:
    for _ in range(2000):  # the kernel turns a killed child into a zombie at once; bounded, no fixed sleep
        if dev.process_state(pid) == state:
            return
        subprocess.run(["true"], check=True)
    raise AssertionError(f"pid {pid} never reached state {state} (now {dev.process_state(pid)})")


def test_a_killed_unreaped_operator_is_not_taken_for_a_running_one(tmp_path: Path) -> None:
    """`make dev` saw the pid of a killed operator still present (a zombie: nobody reaped it) and did not start
    a new one."""
    pid_file = tmp_path / "operator.pid"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "llm-autopilot", "operator"])
    try:
        pid_file.write_text(str(child.pid))
        assert dev.operator_running(pid_file)
        child.send_signal(signal.SIGKILL)  # and not reaped: a zombie
        _wait_state(child.pid, "Z")
        assert not dev.operator_running(pid_file)
    finally:
        child.kill()
        child.wait(10)
    assert not dev.operator_running(pid_file)  # reaped: gone


def test_a_recycled_pid_or_a_bad_file_is_not_the_operator(tmp_path: Path) -> None:
    pid_file = tmp_path / "operator.pid"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pid_file.write_text(str(other.pid))
        assert not dev.operator_running(pid_file)
    finally:
        other.kill()
        other.wait(10)
    pid_file.write_text("not a pid")
    assert not dev.operator_running(pid_file)
    assert not dev.operator_running(tmp_path / "absent.pid")
    stat = tmp_path / "proc" / "42"
    stat.mkdir(parents=True)
    (stat / "stat").write_text("42 (odd) name) Z 1 42 42 0 -1")
    assert dev.process_state(42, tmp_path / "proc") == "Z"
