"""When the same inputs decide the same again: what Prometheus said as far as a decision depends on it,
whether the evidence holds an unconsumed signal, and when the clock alone could change the decision (the
quiet resync, controller/quiet.py, remembers these). Pure."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from llm_autopilot.api.v1alpha1 import RemediationPolicy
from llm_autopilot.remediation.decide import Evidence, Metrics
from llm_autopilot.remediation.state import RemediationState


def metrics_verdict(metrics: Metrics, signal: bool) -> str:
    """What Prometheus said, as far as a decision depends on it: not asked, unreachable, quiet or a signal."""
    return f"{metrics.value}/{'signal' if signal else 'quiet'}"


def unsettled(evidence: Evidence, state: RemediationState) -> bool:
    """Whether the evidence holds a signal the decision has not consumed: a KV-saturation signal (its evidence
    key moves with the window), or a crash other than the one last acted on or reported."""
    if evidence.saturation is not None:
        return True
    return evidence.crash is not None and evidence.crash.key != state.last_evidence


#: no delay the quiet resync computes is longer than this (the spec's own bounds are lower; a status or a spec
#: written past them must not make the schedule overflow, as a cooldown of 10**20 s once did)
MAX_DELAY_SECONDS = 10 * 365 * 24 * 3600


def later(at: datetime, seconds: float) -> datetime:
    """``at`` plus ``seconds``, the delay clamped into 0..MAX_DELAY_SECONDS (never an OverflowError)."""
    if not isinstance(seconds, int | float) or (isinstance(seconds, float) and math.isnan(seconds)):
        seconds = 0
    delay = float(min(max(seconds, 0), MAX_DELAY_SECONDS))  # clamped before float(): 10**400 fits no float
    try:
        return at + timedelta(seconds=delay)
    except OverflowError:  # past datetime.max
        return datetime.max.replace(tzinfo=at.tzinfo)


def next_due(state: RemediationState, policy: RemediationPolicy, now: datetime, longest: float) -> datetime:
    """The earliest time at which the clock alone could change the decision on the same evidence: the end of
    the cooldown and of the KV window after the last step, and the relax after the stable window (times the
    backoff) without a signal; at the latest ``longest`` seconds from now. Every delay is clamped
    (``later``): a huge number in the spec or the status never makes this raise."""
    candidates = [later(now, longest)]
    if state.last_step_time is not None:
        candidates += [later(state.last_step_time, policy.cooldown_seconds),
                       later(state.last_step_time, policy.kv_saturation_window_seconds)]
    if state.rung > 0 and policy.enabled:
        times = [t for t in (state.last_step_time, state.last_signal_time, state.last_relax_time) if t is not None]
        if times:  # (with none, calm has lasted since 1970: the relax was due in this very reconcile)
            candidates.append(later(max(times), float(policy.stable_window_seconds) * state.relax_backoff))
    return min((c for c in candidates if c > now), default=candidates[0])
