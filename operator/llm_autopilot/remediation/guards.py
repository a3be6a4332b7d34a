"""When remediation may act: cooldown, rollouts, step budget, relaxing after calm with backoff. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

MAX_RELAX_BACKOFF = 16


class Verdict(StrEnum):
    IDLE = "Idle"
    STEP = "Step"
    RELAX = "Relax"
    WAIT_ROLLOUT = "WaitingForRollout"
    WAIT_COOLDOWN = "Cooldown"
    EXHAUSTED = "Exhausted"
    OBSERVE_ONLY = "ObserveOnly"
    NOT_MEMORY = "NotAMemoryFailure"


@dataclass(frozen=True)
class Policy:
    enabled: bool
    cooldown_seconds: float
    max_steps: int
    stable_window_seconds: float


@dataclass(frozen=True)
class State:
    rung: int = 0
    last_step_at: float | None = None
    last_signal_at: float | None = None
    last_relax_at: float | None = None
    relax_backoff: int = 1


def decide(*, now: float, policy: Policy, state: State, signal_is_memory: bool | None,
           rollout_complete: bool) -> Verdict:
    """``signal_is_memory``: None when nothing is wrong, else whether the failure is a memory one."""
    if signal_is_memory is not None:
        if not signal_is_memory:
            return Verdict.NOT_MEMORY
        if not policy.enabled:
            return Verdict.OBSERVE_ONLY
        if state.rung >= policy.max_steps:
            return Verdict.EXHAUSTED
        if not rollout_complete:
            return Verdict.WAIT_ROLLOUT
        if state.last_step_at is not None and now - state.last_step_at < policy.cooldown_seconds:
            return Verdict.WAIT_COOLDOWN
        return Verdict.STEP
    if state.rung == 0 or not policy.enabled or not rollout_complete:
        return Verdict.IDLE
    calm_since = max(t for t in (state.last_step_at, state.last_signal_at, state.last_relax_at, 0.0) if t is not None)
    if now - calm_since >= policy.stable_window_seconds * state.relax_backoff:
        return Verdict.RELAX
    return Verdict.IDLE


def backoff_after_signal(state: State, now: float, policy: Policy) -> int:
    """A signal soon after relaxing means the relaxed rung was not safe: wait twice as long next time."""
    window = policy.stable_window_seconds * state.relax_backoff
    if state.last_relax_at is not None and now - state.last_relax_at < window:
        return min(state.relax_backoff * 2, MAX_RELAX_BACKOFF)
    return state.relax_backoff
