"""Words for a remediation state the operator did not attest (status.remediation without the operator's
attestation: written by someone else, by the release before remediation joined status.attestations, or by an
operator run without a key that has since restarted). Its applied rungs are kept only when the workload runs
exactly their plan: then the status says nothing the cluster does not already show, so no forged value can move a
plan. Pure: the section (desired/sections/remediation.py) asks, the shell
(controller/features/remediation_adoption.py) reads."""

from __future__ import annotations

from dataclasses import dataclass

from llm_autopilot.desired.vocabulary import WorkloadAsk


@dataclass(frozen=True)
class RunningPlanAsk:
    """Does the workload run this plan (every template carries its plan hash)?"""

    workload: WorkloadAsk


@dataclass(frozen=True)
class RunningPlan:
    """The answer for the plan ``plan_hash``."""

    plan_hash: str
    running: bool
