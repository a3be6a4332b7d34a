"""The quiet resync: a resync that would read the same inputs as the last full reconcile is not run.

A full reconcile of an LLMDeployment is a function of its spec and status, the GPU nodes, its children and
their pods (from the watches), what Prometheus says about its pods, the operator's version and settings, and
the clock (remediation's cooldown and stable windows). The reconcile remembers a fingerprint of those inputs
and the next time at which the clock alone could change its decision; a resync whose fingerprint and
Prometheus verdict are the same, before that time, changes nothing and is skipped: no planning, no rendering,
no API call. A reconcile that found something unsettled (a signal not acted on yet, a retry, an apply the API
server refused) is never skipped, and every object is reconciled in full at least every
``full_check_seconds``.

The memory is per process: after a restart every object is reconciled once in full (from the watches, so
with no LIST and, when nothing changed, no write).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime
from importlib import metadata

from llm_autopilot.controller.observed import digest
from llm_autopilot.desired.schedule import MAX_DELAY_SECONDS, later, metrics_verdict, next_due, unsettled

#: the schedule's pure part lives in desired/schedule.py, re-exported here
__all__ = ["MAX_DELAY_SECONDS", "OPERATOR_VERSION", "QuietMemory", "Seen", "fingerprint", "later", "metrics_verdict",
           "next_due", "operator_version", "unsettled"]


def operator_version() -> str:
    try:
        return metadata.version("llm-autopilot")
    except metadata.PackageNotFoundError:
        return "unknown"


OPERATOR_VERSION = operator_version()


def fingerprint(*, version: str, settings: str, llmd: str, observed: str) -> str:
    """The inputs of one reconcile: the operator (version, settings), the object (its resourceVersion: spec,
    status and metadata), and what the watches show for it (nodes, children, pods)."""
    return digest([version, settings, llmd, observed])


@dataclass(frozen=True)
class Seen:
    """What the last full reconcile of an object read, and until when the same inputs mean the same."""

    fingerprint: str
    metrics: str
    due: datetime
    settled: bool
    #: the plan in force, whose pods Prometheus is asked about, and the question: (window seconds, threshold)
    plan_hash: str | None
    namespace: str
    kv_question: tuple[int, float] | None = None


class QuietMemory:
    """Per process: the last full reconcile's inputs of each LLMDeployment (by uid)."""

    def __init__(self) -> None:
        self._seen: dict[str, Seen] = {}
        self._lock = threading.Lock()

    def get(self, uid: str) -> Seen | None:
        with self._lock:
            return self._seen.get(uid)

    def remember(self, uid: str, seen: Seen) -> None:
        with self._lock:
            self._seen[uid] = seen

    def forget(self, uid: str) -> None:
        with self._lock:
            self._seen.pop(uid, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._seen)
