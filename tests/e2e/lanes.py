"""Two lanes for `make test` (pytest-xdist, `-n 2 --dist loadgroup`): the end-to-end tests split by the nodes they use.

* **vllm-cpu**: every test that uses the process kubelet's vllm-cpu nodes (the ``real_vllm`` fixture: the real CPU
  vLLM, the stand-in on that pool, the KV-room annotations) and ``tests/vllm``'s judge. They run one after another,
  as before: they share two nodes and the machine's CPUs for vLLM.
* **kwok**: every other end-to-end test (KWOK's GPU pools, the metrics simulator, the chart), one after another,
  as before: they share the simulated GPUs, which a test expects to find free.

The two lanes share the control plane, Prometheus and nothing else: each worker has its own session operator,
namespace prefix and webhook (tests/e2e/conftest.py), and the vllm-cpu nodes are tainted so no KWOK-pool test lands
there. Unit tests fill whichever worker is free. A test that stops a shared service (Prometheus) is marked
``alone`` and runs in a second, sequential pytest run (the Makefile's ``test``).

Without xdist (``pytest`` alone, one worker) nothing changes: no groups, the collection order is kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

#: "gw0", "gw1" under xdist; "" in a plain pytest run
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
#: the id shared by every worker of one pytest run (xdist sets it), so two runs never share a lock or a record
RUN_UID = os.environ.get("PYTEST_XDIST_TESTRUNUID", "")
VLLM_CPU_LANE = "vllm-cpu-lane"
KWOK_LANE = "kwok-lane"


def lane_of(item: pytest.Item) -> str | None:
    """The lane an item runs in; None for a unit test (any worker)."""
    fixtures = getattr(item, "fixturenames", ())
    if "real_vllm" in fixtures or item.get_closest_marker("real_vllm") or item.get_closest_marker("vllm"):
        return VLLM_CPU_LANE
    if item.get_closest_marker("e2e"):
        return KWOK_LANE
    return None


def assign(items: list[pytest.Item]) -> None:
    """Under xdist: mark each end-to-end item with its lane's group and order the collection vllm-cpu lane, kwok
    lane, the rest. With ``--no-loadscope-reorder`` xdist hands the first group to the first worker and the second
    to the second before anything else, so the long lanes start at once and the unit tests fill in behind the
    shorter one. The relative order inside a lane (module by module) is kept."""
    if not WORKER:
        return
    lanes: dict[str | None, list[pytest.Item]] = {VLLM_CPU_LANE: [], KWOK_LANE: [], None: []}
    for item in items:
        lane = lane_of(item)
        if lane is not None:
            item.add_marker(pytest.mark.xdist_group(lane))
        lanes[lane].append(item)
    items[:] = [*lanes[VLLM_CPU_LANE], *lanes[KWOK_LANE], *lanes[None]]


def _run_dir() -> Path:
    path = Path("/tmp") / f"llm-autopilot-e2e-{RUN_UID or os.getpid()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def run_lock() -> Iterator[None]:
    """Held by one worker of this run at a time (starting the cluster, the session's start and end records)."""
    with (_run_dir() / "lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def session_started(objects: set[str], files: set[str]) -> None:
    """Record what this worker found at its start (the cluster-scoped objects and Prometheus' files)."""
    with run_lock():
        record = _run_dir() / f"started-{WORKER or 'main'}.json"
        record.write_text(json.dumps({"objects": sorted(objects), "files": sorted(files)}))


def session_ended() -> tuple[set[str], set[str]] | None:
    """Called as a worker's session ends. The last worker to end gets what was there before any worker started
    (the intersection of the start records: an object one worker made before the other one looked is not
    "before"), and checks for leftovers; an earlier worker gets None (the other lane may still be working)."""
    with run_lock():
        directory = _run_dir()
        (directory / f"started-{WORKER or 'main'}.json").rename(directory / f"ended-{WORKER or 'main'}.json")
        if list(directory.glob("started-*.json")):
            return None
        records = [json.loads(p.read_text()) for p in directory.glob("ended-*.json")]
        for path in directory.glob("ended-*.json"):
            path.unlink()
    objects = set.intersection(*(set(r["objects"]) for r in records))
    files = set.intersection(*(set(r["files"]) for r in records))
    return objects, files
