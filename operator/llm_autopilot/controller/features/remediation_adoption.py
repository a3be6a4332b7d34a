"""The reader behind an unattested remediation state's adoption (desired/remediation_adoption.py): whether the
workload's templates carry the plan hash of the state's rungs. It reads what only the operator writes (the
Deployment, LeaderWorkerSet or StatefulSets), never the status."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from llm_autopilot.controller.pod_reads import runs_plan
from llm_autopilot.controller.world_reads import workload_view
from llm_autopilot.desired.remediation_adoption import RunningPlan, RunningPlanAsk

if TYPE_CHECKING:
    from llm_autopilot.controller.reconcile import Reconciler


def _read(r: Reconciler, ask: RunningPlanAsk) -> RunningPlan:
    view = workload_view(r.kube, ask.workload) or {}
    template = (view.get("spec") or {}).get("template") or {}  # its metadata carries the plan hash, as a pod's
    return RunningPlan(ask.workload.plan_hash, runs_plan(template, ask.workload.plan_hash))


READERS: dict[type, Callable[[Reconciler, Any], object]] = {RunningPlanAsk: _read}
EXECUTORS: dict[type, Callable[[Reconciler, Any], None]] = {}
