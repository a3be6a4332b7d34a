"""The startup probe that learns (issue #29 item 4): which probe length each plan runs with, and the starts a
reconcile observed for the store. Pure: its words (the effect the shell carries out) beside its judgement.

- **Observed.** A pod of the plan in force, Ready, not being deleted, whose vLLM container never restarted: its
  start is its Ready condition's ``lastTransitionTime`` minus its container's ``startedAt`` (both as the pod
  says, remediation/recovery.py reads them with each step's recovery). A restarted container is left out: it
  started after a crash, on a warm page cache, so it is another kind of start. Only once the rollout of the plan
  is complete (every pod runs its template, so its image), and only for plans on one node per replica (a group
  across nodes waits for its workers). A pod's start is recorded once (by ``namespace/name``).
- **Kept** in the calibration store under (image, model, GPU product, whether the pod downloaded its weights),
  so any LLMDeployment of the same model, image and GPU learns from it (planner/start_times.py). A pod that
  downloads, with no downloading start observed yet, learns from the starts from a cache or a volume with the
  formula's download estimate on top.
- **Chosen** once per plan (render/rollout.py ``probe_budget``), and pinned in ``status.startupProbe`` with the
  plan's hash: a start observed later, a replica change or a resync never changes a running pod template; the
  next plan -- a spec change or a remediation step, which rolls the pods anyway -- takes what has been learned
  by then. A deployment planned before this field existed keeps the formula until its plan changes. A pin not
  attested by this operator is set aside and chosen again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from llm_autopilot.api.v1alpha1 import StartupProbeStatus
from llm_autopilot.desired.status_fields import StatusField
from llm_autopilot.desired.status_read import read_section
from llm_autopilot.planner.start_times import Start, StartKey, Starts, recent, valid_seconds
from llm_autopilot.remediation.recovery import PodReadiness
from llm_autopilot.render import rollout

#: status.startupProbe, as this feature decides it
STARTUP_PROBE = StatusField[StartupProbeStatus]("startup_probe")

_NAME_MAX = 253


@dataclass(frozen=True)
class RecordStarts:
    """The effect: add these observed starts to the store under ``key`` (controller/features/startup_probe.py)."""

    key: StartKey
    starts: tuple[Start, ...]


def start_key(image: str, model: str, gpu_product: str, *, downloads: bool) -> StartKey:
    return StartKey(image[:_NAME_MAX], model[:_NAME_MAX], gpu_product[:_NAME_MAX], downloads)


def observed_starts(pods: tuple[PodReadiness, ...], plan_hash: str, namespace: str,
                    known: frozenset[str]) -> tuple[Start, ...]:
    """The starts of the plan's pods not recorded yet (``known``: the pods the store holds)."""
    found = []
    for p in pods:
        name = f"{namespace}/{p.pod}"
        if (p.plan_hash != plan_hash or p.ready_since is None or p.started_at is None or p.terminating
                or p.restarts != 0 or not p.pod or name in known):
            continue
        seconds = round((p.ready_since - p.started_at).total_seconds(), 1)
        if valid_seconds(seconds):
            found.append(Start(seconds, p.ready_since, name))
    return tuple(sorted(found, key=lambda s: s.pod))


def read_pin(raw: Any) -> StartupProbeStatus | None:
    """status.startupProbe as read (None: absent or malformed: chosen again)."""
    return read_section(StartupProbeStatus, raw)


@dataclass(frozen=True)
class StartupBudgets:
    """The probe each rendered plan takes in one reconcile."""

    starts: Starts
    pin: StartupProbeStatus | None
    floor: int
    now: datetime
    #: planned before the probe learned (status.plan, no status.startupProbe): the formula until the plan changes
    planned_before: bool = False

    @classmethod
    def of(cls, status: Mapping[str, Any], starts: Starts | None, floor: int, now: datetime, *,
           chosen_again: bool = False) -> StartupBudgets:
        """``chosen_again``: the pin read was set aside (not the operator's): chosen as for a new plan."""
        raw = status.get("startupProbe")
        planned_before = raw is None and status.get("plan") is not None and not chosen_again
        return cls(starts or {}, read_pin(raw), floor, now, planned_before)

    def budget(self, plan_hash: str, key: StartKey, formula: int, *, learns: bool,
               download: float = 0.0) -> rollout.ProbeBudget:
        """The probe of the plan ``plan_hash`` (its formula ``formula``): the pinned one for the plan, else the
        formula or what the store's starts for ``key`` give (``learns``: a plan the starts speak for)."""
        pin = self.pin
        if pin is not None and pin.plan_hash == plan_hash and pin.image == key.image:
            return rollout.ProbeBudget(pin.seconds, pin.formula_seconds, pin.starts, pin.median_start_seconds)
        if self.planned_before or not learns:
            return rollout.ProbeBudget(formula, formula)
        observed = [s.seconds for s in recent(self.starts, key, self.now)]
        if observed or not key.downloads:
            return rollout.probe_budget(formula, observed, floor=self.floor)
        loaded = dataclasses.replace(key, downloads=False)  # the download estimated on top of a load's start
        return rollout.probe_budget(formula, [s.seconds for s in recent(self.starts, loaded, self.now)],
                                    floor=self.floor, download=download)


def status_of(budget: rollout.ProbeBudget, plan_hash: str, key: StartKey) -> StartupProbeStatus:
    return StartupProbeStatus(plan_hash=plan_hash, image=key.image, model=key.model, gpu_product=key.gpu_product,
                              downloads=key.downloads, seconds=budget.seconds,
                              formula_seconds=budget.formula_seconds, starts=budget.starts,
                              median_start_seconds=budget.median_seconds, message=budget.message[:300])
