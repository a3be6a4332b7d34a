"""The remediation decision: (evidence, state, policy) -> new state, conditions, events, overrides. Pure.

Like cert-manager's certificate policies (``internal/controller/certificates/policies``), the shell first
gathers every input (pods, the previous log, Prometheus) into an :class:`Evidence`; this module then decides
without any I/O, and it is the one writer of the ``Degraded`` reasons of remediation and of
``MetricsAvailable``. Which step fits is asked through ``probe`` (the planner and renderer, pure too), so
every step the decision takes is one the planner can place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from llm_autopilot.api.conditions import DEGRADED
from llm_autopilot.api.v1alpha1 import RemediationEvent, RemediationPolicy
from llm_autopilot.remediation.classify import Classification
from llm_autopilot.remediation.evidence import Crash
from llm_autopilot.remediation.guards import Policy, State, Verdict, backoff_after_signal
from llm_autopilot.remediation.guards import decide as guard
from llm_autopilot.remediation.ladder import Overrides, Running, candidates
from llm_autopilot.remediation.recovery import PodReadiness, Recovery, track
from llm_autopilot.remediation.state import RemediationState

METRICS_AVAILABLE = "MetricsAvailable"
_EXCERPT = 500


class Metrics(StrEnum):
    NOT_CONFIGURED = "NotConfigured"
    #: configured, but there was nothing to ask (no pod runs the current plan): MetricsAvailable is left alone
    NOT_ASKED = "NotAsked"
    AVAILABLE = "Available"
    UNAVAILABLE = "Unavailable"
    #: Prometheus is up and refused the operator's query (the spec makes it invalid): not an outage
    REJECTED = "Rejected"


@dataclass(frozen=True)
class Evidence:
    """Everything the gatherer read, before anything is decided."""

    #: the newest termination of a pod that runs the current plan (classified)
    crash: Crash | None = None
    #: KV saturation of the current plan's pods, when Prometheus says so
    saturation: Classification | None = None
    metrics: Metrics = Metrics.NOT_CONFIGURED
    #: where Prometheus was asked, or why it could not be
    metrics_detail: str = ""
    #: the Deployment runs the current plan on every replica
    rollout_complete: bool = True
    #: identifies the plan in force (KV-saturation evidence is keyed on it)
    plan_id: str = ""
    #: a new pod's burn-in found the KV cache too small (desired/burn_in.py), and the key that names it
    burn_in: Classification | None = None
    burn_in_key: str = ""
    #: every pod of the LLMDeployment (any plan) and its readiness: each step's recovery (remediation/recovery.py)
    pods: tuple[PodReadiness, ...] = ()


@dataclass(frozen=True)
class Probe:
    """What the planner says about a candidate: whether it fits, and whether it changes what runs."""

    plans: bool
    changes: bool = True
    problem: str = ""
    #: the plan hash of the candidate's pods (a step records it: its recovery is its first pod Ready)
    plan_hash: str | None = None


@dataclass(frozen=True)
class ConditionUpdate:
    type: str
    status: bool | None
    reason: str
    message: str


@dataclass(frozen=True)
class Note:
    """An Event to post: (type, reason, message); never untrusted text, only summaries."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    state: RemediationState
    #: the overrides to render and apply (those in force unless a step or a relax changed them)
    overrides: Overrides
    changed: bool = False
    conditions: tuple[ConditionUpdate, ...] = ()
    events: tuple[Note, ...] = ()
    #: (signal, kind) increments of llm_autopilot_remediation_steps_total
    counts: tuple[tuple[str, str], ...] = ()
    #: the steps that recovered in this pass (llm_autopilot_step_recovery_seconds, their Recovered Events)
    recoveries: tuple[Recovery, ...] = ()


@dataclass
class _Draft:
    state: RemediationState
    conditions: list[ConditionUpdate] = field(default_factory=list)
    events: list[Note] = field(default_factory=list)
    counts: list[tuple[str, str]] = field(default_factory=list)

    def done(self, overrides: Overrides, *, changed: bool = False) -> Decision:
        return Decision(self.state, overrides, changed, tuple(self.conditions), tuple(self.events),
                        tuple(self.counts))


def _seconds(at: datetime | None) -> float | None:
    return None if at is None else at.timestamp()


def guard_policy(policy: RemediationPolicy) -> Policy:
    return Policy(policy.enabled, policy.cooldown_seconds, policy.max_steps, policy.stable_window_seconds)


def _pick(evidence: Evidence, state: RemediationState, policy: RemediationPolicy,
          now: datetime) -> tuple[Classification | None, str | None, bool]:
    """(signal, its evidence key, whether it is a crash of the current plan)."""
    window = policy.kv_saturation_window_seconds
    kv = evidence.saturation
    if kv is not None and state.last_step_time is not None and (now - state.last_step_time).total_seconds() < window:
        kv = None  # the window must lie wholly after the last step: judge the new settings, not the old
    crash = evidence.crash
    fresh_crash = crash is not None and crash.key != state.last_evidence
    if evidence.burn_in is not None and evidence.burn_in_key != state.last_evidence and not fresh_crash:
        # a pod of the plan in force, before any traffic: like its crash, it judges the settings that run now
        return evidence.burn_in, evidence.burn_in_key, True
    if kv is not None and (crash is None or crash.key == state.last_evidence):
        return kv, f"kv-saturation/{evidence.plan_id}/{int(now.timestamp() // window)}", False
    if crash is not None and crash.key != state.last_evidence:
        return crash.classification, crash.key, True
    return None, None, False


def _event(now: datetime, rung: int, signal: str, action: str, message: str,
           evidence: dict[str, str], plan_hash: str | None = None) -> RemediationEvent:
    return RemediationEvent(time=now, rung=rung, signal=signal, action=action, message=message[:_EXCERPT],
                            evidence={k: v[:_EXCERPT] for k, v in evidence.items()}, plan_hash=plan_hash)


def decide(evidence: Evidence, state: RemediationState, policy: RemediationPolicy, running: Running, *,
           now: datetime, probe: Callable[[Overrides], Probe]) -> Decision:
    """What remediation does with this evidence, and each step's recovery as the pods show it (after the
    decision, so the step taken in this pass is judged on the pods seen in it too). ``probe`` must be pure (the
    planner and renderer are)."""
    decision = _decide(evidence, state, policy, running, now=now, probe=probe)
    # a changed plan in force is the new last entry's own (a step) or replaces every earlier one (a relax)
    history, recoveries = track(decision.state.history, evidence.pods,
                                None if decision.changed or not evidence.plan_id else evidence.plan_id)
    if not recoveries and history == decision.state.history:
        return decision
    notes = tuple(Note("Normal", "Recovered", r.message) for r in recoveries)
    return dataclasses.replace(decision, state=decision.state.model_copy(update={"history": history}),
                               events=decision.events + notes, recoveries=recoveries)


def _decide(evidence: Evidence, state: RemediationState, policy: RemediationPolicy, running: Running, *,
            now: datetime, probe: Callable[[Overrides], Probe]) -> Decision:
    draft = _Draft(state)
    in_force = state.overrides
    if evidence.metrics is Metrics.UNAVAILABLE:
        draft.conditions.append(ConditionUpdate(METRICS_AVAILABLE, False, "PrometheusUnreachable",
                                                f"{evidence.metrics_detail}; remediation holds still until "
                                                "metrics return"))
        return draft.done(in_force)  # nothing else changes: the next resync retries
    if evidence.metrics is Metrics.REJECTED:
        draft.conditions.append(ConditionUpdate(
            METRICS_AVAILABLE, False, "QueryRejected",
            f"{evidence.metrics_detail}; check spec.remediation.kvSaturationWindowSeconds and "
            "kvSaturationThreshold; remediation holds still until the query is valid"))
        return draft.done(in_force)
    if evidence.metrics is Metrics.AVAILABLE:
        draft.conditions.append(ConditionUpdate(METRICS_AVAILABLE, True, "Queried", evidence.metrics_detail))

    signal, key, crash_of_current_plan = _pick(evidence, state, policy, now)
    rules = guard_policy(policy)
    guard_state = State(rung=state.rung, last_step_at=_seconds(state.last_step_time),
                        last_signal_at=_seconds(state.last_signal_time),
                        last_relax_at=_seconds(state.last_relax_time), relax_backoff=state.relax_backoff)
    verdict = guard(now=now.timestamp(), policy=rules, state=guard_state,
                    signal_is_memory=None if signal is None else signal.signal.is_memory,
                    rollout_complete=evidence.rollout_complete or crash_of_current_plan)
    if signal is not None:
        draft.state = draft.state.with_signal(now, backoff_after_signal(guard_state, now.timestamp(), rules))
    draft.state = draft.state.with_verdict(str(verdict))

    if verdict is Verdict.STEP and signal is not None and key is not None:
        return _step(draft, signal, key, running, in_force, now, probe)
    if verdict is Verdict.RELAX:
        return _relax(draft, in_force, now, probe, policy)
    if signal is not None and key is not None and verdict in (Verdict.NOT_MEMORY, Verdict.OBSERVE_ONLY,
                                                              Verdict.EXHAUSTED):
        reason = {Verdict.NOT_MEMORY: signal.signal.value, Verdict.OBSERVE_ONLY: "RemediationDisabled",
                  Verdict.EXHAUSTED: "RemediationExhausted"}[verdict]
        prefix = {Verdict.NOT_MEMORY: "", Verdict.OBSERVE_ONLY: "remediation is disabled; observed: ",
                  Verdict.EXHAUSTED: f"remediation exhausted after {state.rung} steps; still: "}[verdict]
        draft.conditions.append(ConditionUpdate(DEGRADED, True, reason, prefix + signal.summary))
        if state.last_evidence != key:
            draft.state = draft.state.with_evidence(key)
            draft.events.append(Note("Warning", reason, prefix + signal.summary))
            if verdict is Verdict.EXHAUSTED:
                draft.counts.append((signal.signal.value, "exhausted"))
    return draft.done(in_force)


def _step(draft: _Draft, signal: Classification, key: str, running: Running, in_force: Overrides, now: datetime,
          probe: Callable[[Overrides], Probe]) -> Decision:
    draft.state = draft.state.with_evidence(key)
    tried: list[str] = []
    for candidate in candidates(signal, running, in_force):
        answer = probe(candidate.overrides)
        if not answer.plans:
            tried.append(f"{candidate.action}: {answer.problem[:200]}")
            continue
        if not answer.changes:
            tried.append(f"{candidate.action}: changes nothing")
            continue
        message = f"{signal.summary} -> {candidate.action}"
        rung = draft.state.rung + 1
        draft.state = draft.state.with_step(candidate.overrides, now, _event(
            now, rung, signal.signal.value, candidate.action, message, signal.evidence, answer.plan_hash))
        draft.conditions.append(ConditionUpdate(DEGRADED, False, "Remediated", f"rung {rung}: {message}"))
        draft.events.append(Note("Warning", "Remediated", f"rung {rung}: {message}"))
        draft.counts.append((signal.signal.value, "step"))
        return draft.done(candidate.overrides, changed=True)
    message = f"{signal.summary}; no safer configuration fits" + (f" (tried: {'; '.join(tried)})" if tried else "")
    draft.state = draft.state.with_verdict(str(Verdict.EXHAUSTED))
    draft.conditions.append(ConditionUpdate(DEGRADED, True, "RemediationExhausted", message))
    draft.events.append(Note("Warning", "RemediationExhausted", message))
    draft.counts.append((signal.signal.value, "exhausted"))
    return draft.done(in_force)


def _relax(draft: _Draft, in_force: Overrides, now: datetime, probe: Callable[[Overrides], Probe],
           policy: RemediationPolicy) -> Decision:
    remaining = draft.state.applied[:-1]
    relaxed = Overrides.from_status(remaining[-1].model_dump(by_alias=True, exclude_none=True)) if remaining \
        else Overrides()
    if not probe(relaxed).plans:
        return draft.done(in_force)  # the rung below no longer fits the spec: stay
    rung = len(remaining)
    message = f"calm for the stable window; relaxed to rung {rung}"
    window = policy.stable_window_seconds * draft.state.relax_backoff
    draft.state = draft.state.with_relax(now, _event(now, rung, "Calm", "relax one rung", message,
                                                     {"stableWindowSeconds": str(window)}))
    draft.conditions.append(ConditionUpdate(DEGRADED, False, "Relaxed" if remaining else "AsPlanned", message))
    draft.events.append(Note("Normal", "Relaxed", message))
    draft.counts.append(("Calm", "relax"))
    return draft.done(relaxed, changed=True)
