"""Container logs as the CRI writes them, and as the kubelet reads them back.

The runtime writes one file per container instance (``<pod dir>/<container>/<restartCount>.log``), each
line ``<RFC 3339 time> <stream> F <text>``. The kubelet serves them for ``pods/log`` (``tailLines``,
``limitBytes``, ``previous``, ``timestamps``, ``sinceSeconds``), and computes a ``FallbackToLogsOnError``
termination message from them: the last 80 lines, of which the last 2048 bytes
(``MaxContainerTerminationMessageLogLines`` / ``...LogLength`` in ``pkg/kubelet/container/runtime.go``,
read by ``readLastStringFromContainerLogs`` through a circular buffer).
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

TERMINATION_LOG_LINES = 80
TERMINATION_LOG_BYTES = 2048
#: the kubelet reads at most the last 4096 bytes of a terminationMessagePath file
#: (``MaxContainerTerminationMessageLength``, read with ``tail.ReadAtMost`` in kuberuntime_container.go)
TERMINATION_MESSAGE_BYTES = 4096


def rfc3339_nano(moment: datetime.datetime | None = None) -> str:
    moment = moment or datetime.datetime.now(datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


class LogWriter:
    """Copies a process's stdout and stderr into one CRI-format file, a thread per stream."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("ab")
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def follow(self, stream: IO[bytes], name: str) -> None:
        thread = threading.Thread(target=self._copy, args=(stream, name.encode()), daemon=True)
        thread.start()
        self._threads.append(thread)

    def _copy(self, stream: IO[bytes], name: bytes) -> None:
        for raw in iter(stream.readline, b""):
            text = raw.removesuffix(b"\n")  # the rest is kept as written, \r of progress bars included
            record = rfc3339_nano().encode() + b" " + name + b" F " + text + b"\n"
            with self._lock:
                self._file.write(record)
                self._file.flush()
        stream.close()

    def close(self, timeout: float = 5.0) -> None:
        """Wait for the streams to drain (the process has exited), then close the file."""
        for thread in self._threads:
            thread.join(timeout)
        with self._lock:
            self._file.close()


def _records(path: Path) -> Iterator[tuple[str, str]]:
    """(timestamp, text) per line of a CRI log file."""
    with path.open("rb") as f:
        for raw in f:
            stamp, _, rest = raw.rstrip(b"\n").partition(b" ")
            _stream, _, rest = rest.partition(b" ")
            _tag, _, text = rest.partition(b" ")
            yield stamp.decode(), text.decode(errors="replace")


def read_log(path: Path, *, tail_lines: int | None = None, limit_bytes: int | None = None, timestamps: bool = False,
             since: datetime.datetime | None = None) -> bytes:
    """What ``GET pods/log`` returns for one container instance (the kubelet's ``ReadLogs``)."""
    if not path.is_file():
        return b""
    lines = []
    for stamp, text in _records(path):
        if since is not None and datetime.datetime.fromisoformat(stamp[:26] + "+00:00") < since:
            continue
        lines.append(f"{stamp} {text}\n" if timestamps else f"{text}\n")
    if tail_lines is not None:
        lines = lines[-tail_lines:] if tail_lines > 0 else []
    data = "".join(lines).encode()
    # limitBytes counts from the start of what would be returned (the kubelet stops writing at the limit)
    return data[:limit_bytes] if limit_bytes is not None else data


def message_file(path: Path) -> str:
    """What a container wrote to its terminationMessagePath: the file's last 4096 bytes ("" when absent)."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - TERMINATION_MESSAGE_BYTES))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def termination_message(path: Path) -> str:
    """``FallbackToLogsOnError``: the last 80 lines, then of those the last 2048 bytes."""
    tail = read_log(path, tail_lines=TERMINATION_LOG_LINES)
    return tail[-TERMINATION_LOG_BYTES:].decode(errors="replace")
