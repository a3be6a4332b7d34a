"""Two lanes for `make test` (pytest-xdist, `-n 2 --dist loadgroup`): the end-to-end tests split by the nodes they use.

* **vllm-cpu**: every test that uses the process kubelet's vllm-cpu nodes (the ``real_vllm`` fixture: the real CPU
  vLLM, the stand-in on that pool, the KV-room annotations) and ``tests/vllm``'s judge. They run one after another,
  as before: they share two nodes and the machine's CPUs for vLLM.
* **kwok**: every other end-to-end test (KWOK's GPU pools, the metrics simulator, the chart), one after another,
  as before: they share the simulated GPUs, which a test expects to find free.

The two lanes share the control plane, Prometheus and nothing else: each worker has its own session operator,
namespace prefix and webhook (tests/e2e/conftest.py), and the vllm-cpu nodes are tainted so no KWOK-pool test lands
there. Unit tests fill whichever worker is free. No test stops a shared service: a test that needs Prometheus down
takes down a Prometheus of its own (tests/e2e/metrics.py ``own_prometheus``).

How: each worker orders its collection vllm-cpu lane, kwok lane, the rest, and writes which lane each test is in;
the controller's scheduler (``LaneScheduling``, chosen by ``--dist loadgroup``) reads that and hands each lane to
one worker whole. (xdist's own ``xdist_group`` marks do not reach the controller under pytest 9: the node id they
rewrite is no longer the one sent, so ``loadgroup`` alone spread a lane over both workers.)

Without xdist (``pytest`` alone, one worker) nothing changes: the collection order is kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

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
    """In an xdist worker: order the collection vllm-cpu lane, kwok lane, the rest (the order inside a lane, module
    by module, is kept), and record each end-to-end test's lane for the controller's ``LaneScheduling``. Every
    worker collects the same items, so each writes the same record."""
    if not WORKER:
        return
    lanes: dict[str | None, list[pytest.Item]] = {VLLM_CPU_LANE: [], KWOK_LANE: [], None: []}
    for item in items:
        lanes[lane_of(item)].append(item)
    items[:] = [*lanes[VLLM_CPU_LANE], *lanes[KWOK_LANE], *lanes[None]]
    record = {item.nodeid: lane for lane in (VLLM_CPU_LANE, KWOK_LANE) for item in lanes[lane]}
    path = _run_dir(RUN_UID) / f"lanes-{WORKER}.json"
    path.with_suffix(".tmp").write_text(json.dumps(record))
    path.with_suffix(".tmp").rename(path)


def configure(config: pytest.Config) -> None:
    """In the xdist controller: fix the run's id before the workers start, so controller and workers find the
    same run directory (xdist makes one up later otherwise, and tells only the workers)."""
    if not WORKER and config.getoption("numprocesses", None) and config.getoption("testrunuid", None) is None:
        config.option.testrunuid = uuid.uuid4().hex


class LaneScheduling(LoadScopeScheduling):  # type: ignore[misc]
    """The controller's scheduler for ``--dist loadgroup``: xdist's scope scheduling with each lane as one scope (so
    one worker runs it whole, in order) and every other test a scope of its own. ``--no-loadscope-reorder`` keeps
    the workers' order, so the two lanes go out first, one to each worker."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self.run_uid = str(config.getoption("testrunuid"))
        self.lanes: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self.lanes is None:  # read once the workers have collected (schedule() runs after that)
            self.lanes = {}
            for path in sorted(_run_dir(self.run_uid).glob("lanes-*.json")):
                self.lanes.update(json.loads(path.read_text()))
        return self.lanes.get(nodeid, nodeid)


def _run_dir(uid: str = RUN_UID) -> Path:
    path = Path("/tmp") / f"llm-autopilot-e2e-{uid or os.getpid()}"
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
