"""The learning startup probe's shell: the starts desired/sections/startup_probe.py observed, added to the store
(controller/calibration_store.py; none without one). It reads nothing of its own: the pods' start and Ready times
come with remediation's evidence (controller/evidence.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from llm_autopilot.desired.startup_probe import RecordStarts

if TYPE_CHECKING:
    from llm_autopilot.controller.reconcile import Reconciler


def _record(r: Reconciler, record: RecordStarts) -> None:
    if r.calibration is not None and r.calibration.record_starts(record.key, record.starts, r.now):
        r.writes += 1


READERS: dict[type, Callable[[Reconciler, Any], object]] = {}
EXECUTORS: dict[type, Callable[[Reconciler, Any], None]] = {RecordStarts: _record}
