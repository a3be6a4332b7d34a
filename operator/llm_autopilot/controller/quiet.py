"""The quiet resync: a resync that would read the same inputs as the last full reconcile is not run.

A full reconcile of an LLMDeployment is a function of its spec and status, the GPU nodes, its children and
their pods (from the watches), what Prometheus says about its pods, the operator's version and settings, and
the clock (remediation's cooldown and stable windows). The reconcile remembers a fingerprint of those inputs
and the next time at which the clock alone could change its decision; a resync whose fingerprint and
Prometheus verdict are the same, before that time, changes nothing and is skipped: no planning, no rendering,
no API call. A reconcile that found something unsettled (a signal not acted on yet, a retry, an apply the API
server refused) is never skipped, and every object is reconciled in full at least every
``full_check_seconds``.

The memory is per process: after a restart every object is reconciled once in full (from the watches, so
with no LIST and, when nothing changed, no write).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib import metadata

from llm_autopilot.api.v1alpha1 import RemediationPolicy
from llm_autopilot.controller.observed import digest
from llm_autopilot.remediation.decide import Evidence, Metrics
from llm_autopilot.remediation.state import RemediationState


def operator_version() -> str:
    try:
        return metadata.version("llm-autopilot")
    except metadata.PackageNotFoundError:
        return "unknown"


OPERATOR_VERSION = operator_version()


def fingerprint(*, version: str, settings: str, llmd: str, observed: str) -> str:
    """The inputs of one reconcile: the operator (version, settings), the object (its resourceVersion: spec,
    status and metadata), and what the watches show for it (nodes, children, pods)."""
    return digest([version, settings, llmd, observed])


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


@dataclass(frozen=True)
class Seen:
    """What the last full reconcile of an object read, and until when the same inputs mean the same."""

    fingerprint: str
    metrics: str
    due: datetime
    settled: bool
    #: the plan in force, whose pods Prometheus is asked about, and the question: (window seconds, threshold)
    plan_hash: str | None
    namespace: str
    kv_question: tuple[int, float] | None = None


class QuietMemory:
    """Per process: the last full reconcile's inputs of each LLMDeployment (by uid)."""

    def __init__(self) -> None:
        self._seen: dict[str, Seen] = {}
        self._lock = threading.Lock()

    def get(self, uid: str) -> Seen | None:
        with self._lock:
            return self._seen.get(uid)

    def remember(self, uid: str, seen: Seen) -> None:
        with self._lock:
            self._seen[uid] = seen

    def forget(self, uid: str) -> None:
        with self._lock:
            self._seen.pop(uid, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._seen)
