"""The reconcile's desired state, decided without I/O from what one gather step read (issue #16, item 1)."""

from __future__ import annotations

from datetime import UTC, datetime

from llm_autopilot.controller.reconcile import reconcile
from llm_autopilot.controller.settings import OperatorSettings
from tests.unit.fakes import NAME, NAMESPACE, FakeCluster

QWEN_L4 = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4"}, "serving": {"maxModelLen": 8192}}


def test_the_reconcilers_clock_is_injected() -> None:
    """Every time the pass writes is the one it was given (conditions' lastTransitionTime, remediation's)."""
    at = datetime(2031, 5, 17, 8, 30, tzinfo=UTC)
    out = reconcile(name=NAME, namespace=NAMESPACE, uid="uid", generation=1, spec_body=QWEN_L4, status={},
                    kube=FakeCluster(), settings=OperatorSettings(), now=at)
    times = {c["lastTransitionTime"] for c in out.status["conditions"]}
    assert times == {"2031-05-17T08:30:00Z"}
