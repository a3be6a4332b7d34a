"""The Kopf wiring: what the handlers ask of Kopf (no cluster; the e2e tests run them)."""

from __future__ import annotations

from typing import Any

import kopf

from llm_autopilot.api import PLURAL
from llm_autopilot.controller import handlers


def _ours() -> list[Any]:
    """Timers, daemons and change handlers: the kinds that can ask Kopf for a finalizer (all on LLMDeployments)."""
    registry = kopf.get_default_registry()
    found: list[Any] = [*registry._spawning.get_all_handlers(), *registry._changing.get_all_handlers()]
    assert {h.selector.any_name for h in found} == {PLURAL}
    return found


def test_no_handler_holds_the_deletion_of_an_llmdeployment() -> None:
    """A finalizer would make `kubectl delete` wait for (or, with the operator stopped, hang on) the operator."""
    ours = _ours()
    assert {h.id for h in ours} >= {handlers.RESYNC, "reconcile-on-create", "reconcile-on-update/spec"}
    assert [h.id for h in ours if h.requires_finalizer] == []


def test_the_resync_timer_stops_once_its_object_is_deleted() -> None:
    timer = next(h for h in _ours() if h.id == handlers.RESYNC)
    assert timer.when is not None
    memo = kopf.Memo()
    assert timer.when(memo=memo)
    handlers.deletion_stops_resync(type="MODIFIED", memo=memo)
    assert timer.when(memo=memo)
    handlers.deletion_stops_resync(type="DELETED", memo=memo)
    assert not timer.when(memo=memo)  # Kopf stops a timer whose filter no longer matches
