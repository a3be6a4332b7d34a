"""Section: status.source (what a pvc:// source's inspect Job or an s3:// source's reading found), and Planned=False
while a volume (the model's, a LoRA adapter's) is inspected or cannot be."""

from __future__ import annotations

from typing import Any

from llm_autopilot.api.conditions import PLANNED
from llm_autopilot.desired.status_fields import SOURCE
from llm_autopilot.desired.vocabulary import INSPECTING, MESSAGE_LIMIT, Draft, Intent
from llm_autopilot.desired.world import SourceView
from llm_autopilot.remediation.text import clean_line


def report_source(d: Draft, found: SourceView | None) -> None:
    """status.source: what was read (removed when nothing was)."""
    d.put(SOURCE, found.status if found else None)


def inspecting(d: Draft, found: SourceView) -> Intent:
    """Planned=False while a pvc:// source is inspected or cannot be: only the inspect Job is applied."""
    report_source(d, found)
    assert found.failure is not None
    return waiting_for_source(d, found.failure, found.objects, found.retry_delay)


def waiting_for_source(d: Draft, failure: tuple[str, str], objects: tuple[dict[str, Any], ...],
                       retry_delay: float) -> Intent:
    """Planned=False while a volume is inspected or cannot be: only the inspect Jobs are applied."""
    applied = d.world.applied
    if applied is not None and applied.rejected is not None:
        return d.fail("ApplyRejected", clean_line(applied.rejected, MESSAGE_LIMIT), retry=True)
    d.out.retry_delay, d.out.retry_reason = retry_delay, failure[1][:200]
    reason, message = failure
    if reason != INSPECTING:
        d.fail(reason, message, retry=True)
    else:
        before = d.conditions
        d.condition(PLANNED, False, reason, message)
        if before != d.conditions:
            d.event("Normal", reason, message)
        d.out.retry = True
        d.finish()
    d.out.objects = list(objects)
    return d.out
