"""The canary of a vLLM release change: one pod of the new release judged before the fleet rolls. Pure.

A change of spec.vllm.version or spec.vllm.image re-plans for the new release; without a canary every replica
rolls at once, and a release whose memory moved (vLLM's KV room, its activation peak) takes the whole fleet down
or under-serves it. Here the fleet's Deployment keeps the pod template it runs (the old release) while a second
Deployment, ``<name>-canary`` (render/canary.py), runs one pod of the new plan: on a free GPU when the pool has
one (a surge), else in place of one replica of the fleet, never the last serving one. The canary passes when its
pod is Ready, its KV room is not below the plan's beyond the tolerance (vLLM's own figures, as PlanVerified read
them for the new plan: status.verification) and, where spec.verification.burnIn is set, its burn-in passed
(status.burnIn). Only then does the fleet roll, and the canary goes at once (kept, it would hold the GPU the
roll needs); status.canary stays Passed until the fleet is Ready. A canary that fails
holds the fleet on the old release (UpgradeHeld, quoting vLLM's figures) until the spec changes: reverting to
the fleet's release deletes the canary and clears the condition; a new plan (another release, a remediation step
of the canary's settings) is judged afresh.

Every input the verdict rests on is an attested status section (status.canary, status.verification,
status.burnIn: desired/status_read.py ATTESTED), so a forged "Passed" is set aside before it reaches here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from llm_autopilot.api.status import BurnInStatus, CanaryPhase, CanaryStatus, VerificationStatus
from llm_autopilot.desired.status_fields import StatusField

#: status.canary, as this feature decides it
CANARY = StatusField[CanaryStatus]("canary")

UPGRADE_HELD = "UpgradeHeld"
#: UpgradeHeld's reasons (docs/troubleshooting.md)
NO_ROOM_FOR_CANARY = "NoRoomForCanary"
CANARY_NOT_READY = "CanaryNotReady"
CANARY_KV_BELOW_PLAN = "CanaryKVBelowPlan"
CANARY_BURN_IN_FAILED = "CanaryBurnInFailed"
#: Events
CANARY_STARTED = "CanaryStarted"
CANARY_PASSED = "CanaryPassed"
UPGRADE_REVERTED = "UpgradeReverted"
#: restarts of the canary's vLLM container after which it is crash-looping, not still starting
CRASH_RESTARTS = 3


# ---- the canary's words: its ask, its reading, its effect (controller/features/canary.py reads and executes) ----

@dataclass(frozen=True)
class CanaryAsk:
    """The canary of the LLMDeployment ``name`` to read: its Deployment and its newest pod."""

    namespace: str
    name: str


@dataclass(frozen=True)
class CanaryReading:
    """The canary as read: its Deployment's uid (None: none exists), its newest pod not being deleted, and the
    fleet's pod template as it runs (whole: a held fleet is written with it; None: no fleet Deployment)."""

    uid: str | None
    pod: CanaryPod | None = None
    fleet_template: dict[str, Any] | None = None


@dataclass(frozen=True)
class CanaryDelete:
    """The canary's Deployment to delete (that one: by its uid)."""

    name: str
    uid: str


@dataclass(frozen=True)
class Release:
    """What a fleet runs: the vLLM version it was planned for and the image its pods run."""

    version: str
    image: str

    def __str__(self) -> str:
        return f"vLLM {self.version} ({self.image})"


@dataclass(frozen=True)
class CanaryPod:
    """The canary's pod as the shell read it (the newest pod of ``<name>-canary`` not being deleted)."""

    name: str
    ready: bool
    #: seconds since the pod was created
    age_seconds: float
    #: restarts of its vLLM container
    restarts: int = 0
    #: why its vLLM container waits (CrashLoopBackOff, ImagePullBackOff...), None: it does not
    waiting_reason: str | None = None


@dataclass(frozen=True)
class CanaryInputs:
    """What the decision reads: the fleet as it runs, the release the spec wants, the room, and the canary's
    record and readings (every status section attested)."""

    #: the release the fleet's Deployment runs (its pod template; None: no fleet yet, nothing to guard)
    fleet: Release | None
    #: the release the spec asks for, and the hash of the plan the canary runs
    wanted: Release
    plan_hash: str
    #: spec.rollout.canary
    enabled: bool
    #: the fleet's replicas as the spec (and remediation) want them, and whether the fleet's Deployment is Ready
    replicas: int
    fleet_ready: bool
    #: the pool holds one replica more than ``replicas`` (render/rollout.can_surge)
    surge_room: bool
    #: the canary's startup probe (seconds): a pod not Ready by then failed to start
    startup_seconds: int
    now: datetime
    #: status.canary as read (attested), the canary's pod, whether its Deployment exists
    known: CanaryStatus | None = None
    pod: CanaryPod | None = None
    canary_exists: bool = False
    #: status.verification and status.burnIn as read (attested): judged for ``plan_hash`` only
    verification: VerificationStatus | None = None
    burn_in: BurnInStatus | None = None
    burn_in_wanted: bool = False


Fleet = Literal["new", "old"]


@dataclass(frozen=True)
class CanaryDecision:
    """What the fleet and the canary become this pass."""

    #: the fleet's pod template: the new plan's ("new": it rolls) or the one it runs ("old": held)
    fleet: Fleet
    #: the fleet's replicas
    fleet_replicas: int
    #: render ``<name>-canary`` (one pod of the new plan); False: delete it if it exists
    canary: bool
    status: CanaryStatus | None
    #: UpgradeHeld (True, reason, message); None: the condition is removed
    held: tuple[bool, str, str] | None = None
    event: tuple[str, str, str] | None = None

    @property
    def delete_canary(self) -> bool:
        return not self.canary


def _status(i: CanaryInputs, phase: CanaryPhase, message: str, *, replaces_replica: bool,
            pod: str | None = None, reason: str | None = None) -> CanaryStatus:
    """status.canary in ``phase``: ``since`` kept while the phase is the one recorded for this plan."""
    known = _known(i)
    since = known.since if known is not None and known.phase == phase else i.now
    fleet = i.fleet or (Release(known.from_vllm_version or "", known.from_image or "") if known else None)
    return CanaryStatus(vllm_version=i.wanted.version, image=i.wanted.image,
                        from_vllm_version=fleet.version if fleet else None, from_image=fleet.image if fleet else None,
                        plan_hash=i.plan_hash, phase=phase, replaces_replica=replaces_replica,
                        pod=pod or (known.pod if known is not None else None), reason=reason, since=since,
                        message=message[:600])


def _known(i: CanaryInputs) -> CanaryStatus | None:
    """status.canary when it is this plan's (another release's or plan's record judges nothing here)."""
    k = i.known
    if k is None or k.plan_hash != i.plan_hash or k.vllm_version != i.wanted.version or k.image != i.wanted.image:
        return None
    return k


def decide(i: CanaryInputs) -> CanaryDecision:
    """The fleet and the canary for one pass (the named cases: tests/unit/test_canary.py)."""
    if i.fleet is None or not i.enabled:
        # a first deployment has nothing to guard; an opt-out rolls the fleet at once
        return CanaryDecision("new", i.replicas, canary=False, status=None)
    if i.fleet == i.wanted:
        known = _known(i)
        if known is not None and known.phase == "Passed" and not i.fleet_ready:
            # the fleet rolls after a canary that passed (gone: the roll has its GPU); said until the fleet is Ready
            return CanaryDecision("new", i.replicas, canary=False, status=known)
        reverted = i.known is not None and i.known.phase != "Passed" and (
            i.known.from_vllm_version, i.known.from_image) == (i.wanted.version, i.wanted.image)
        event = (("Normal", UPGRADE_REVERTED, f"the spec is back on {i.wanted}: the canary of vLLM "
                  f"{i.known.vllm_version} ({i.known.image}) is deleted, the fleet runs as it did")
                 if reverted and i.known is not None else None)
        return CanaryDecision("new", i.replicas, canary=False, status=None, event=event)
    return _upgrade(i)


def _upgrade(i: CanaryInputs) -> CanaryDecision:
    """The fleet runs another release than the spec's: a canary first."""
    assert i.fleet is not None
    known = _known(i)
    if known is not None and known.phase == "Passed":
        return CanaryDecision("new", i.replicas, canary=False, status=known)
    if known is not None and known.phase == "Failed":  # held until the spec (or the canary's plan) changes
        return CanaryDecision("old", _fleet_replicas(i, known.replaces_replica), canary=True, status=known,
                              held=(True, known.reason or CANARY_NOT_READY, known.message))
    replaces = known.replaces_replica if known is not None else not i.surge_room
    if replaces and i.replicas < 2:
        message = (f"no free GPU for a canary of {i.wanted} and the fleet's only replica keeps serving "
                   f"{i.fleet}: the upgrade waits for a free GPU (or spec.rollout.canary: false rolls at once)")
        return CanaryDecision("old", i.replicas, canary=False,
                              status=_status(i, "Pending", message, replaces_replica=True, reason=NO_ROOM_FOR_CANARY),
                              held=(True, NO_ROOM_FOR_CANARY, message))
    fleet_replicas = _fleet_replicas(i, replaces)
    if i.pod is None:
        how = ("in place of one replica (no free GPU for a surge)" if replaces else "on a free GPU")
        message = f"one pod of {i.wanted} starts {how}; the fleet stays on {i.fleet} until it passes"
        event = ("Normal", CANARY_STARTED, message) if known is None else None
        return CanaryDecision("old", fleet_replicas, canary=True,
                              status=_status(i, "Pending", message, replaces_replica=replaces), event=event)
    failure = _judge(i, i.pod)
    if failure is not None:
        reason, why = failure
        message = f"the canary of {i.wanted} failed: {why}; the fleet stays on {i.fleet}"
        return CanaryDecision("old", fleet_replicas, canary=True,
                              status=_status(i, "Failed", message, replaces_replica=replaces, pod=i.pod.name,
                                              reason=reason),
                              held=(True, reason, message), event=("Warning", UPGRADE_HELD, message))
    verdict = _passed(i, i.pod)
    if verdict is None:
        message = f"the canary {i.pod.name} of {i.wanted} is judged: {_what_waits(i, i.pod)}"
        return CanaryDecision("old", fleet_replicas, canary=True,
                              status=_status(i, "Running", message, replaces_replica=replaces, pod=i.pod.name))
    message = f"the canary {i.pod.name} of {i.wanted} passed: {verdict}; the fleet rolls from {i.fleet}"
    # the canary goes now: the fleet's roll takes its GPU
    return CanaryDecision("new", i.replicas, canary=False,
                          status=_status(i, "Passed", message, replaces_replica=replaces, pod=i.pod.name),
                          event=("Normal", CANARY_PASSED, message))


def _fleet_replicas(i: CanaryInputs, replaces: bool) -> int:
    """The fleet's replicas beside the canary: one fewer when the canary took a replica's GPU, never 0."""
    return max(1, i.replicas - 1) if replaces else i.replicas


def _reading(i: CanaryInputs, pod: str) -> VerificationStatus | None:
    """status.verification when it read the canary's pod of this plan."""
    v = i.verification
    if v is None or v.plan_hash != i.plan_hash or pod not in {p.pod for p in v.pods}:
        return None
    return v


def _judge(i: CanaryInputs, pod: CanaryPod) -> tuple[str, str] | None:
    """Why the canary failed (UpgradeHeld's reason and the figures), None: not failed (yet)."""
    if not pod.ready:
        if pod.restarts >= CRASH_RESTARTS or pod.waiting_reason == "CrashLoopBackOff":
            return CANARY_NOT_READY, (f"its pod {pod.name} is crash-looping ({pod.restarts} restarts"
                                      f"{', ' + pod.waiting_reason if pod.waiting_reason else ''}); its vLLM log says "
                                      "why")
        if pod.age_seconds > i.startup_seconds:
            return CANARY_NOT_READY, (f"its pod {pod.name} was not Ready within its startup probe "
                                      f"({i.startup_seconds} s; {pod.age_seconds:.0f} s old"
                                      f"{', ' + pod.waiting_reason if pod.waiting_reason else ''})")
        return None
    v = _reading(i, pod.name)
    if v is not None and v.error_percent < -v.tolerance_percent:
        actual = f"{v.actual_tokens:,}" if v.actual_tokens is not None else "an unknown number of"
        return CANARY_KV_BELOW_PLAN, (
            f"vLLM {v.vllm_version} on {pod.name} reports {actual} KV-cache tokens ({v.actual_kv_gib:g} GiB) where "
            f"the plan needs {v.predicted_tokens:,} ({v.predicted_kv_gib:g} GiB): {v.error_percent:+.2f} % of the "
            f"GPU's memory, beyond the {v.tolerance_percent:g} % tolerance (from vLLM's {v.source})")
    burn = _burn_in(i, pod.name)
    if burn is not None and not burn[0]:
        return CANARY_BURN_IN_FAILED, f"its burn-in failed: {burn[1]}"
    return None


def _burn_in(i: CanaryInputs, pod: str) -> tuple[bool, str] | None:
    """The canary pod's burn-in verdict (passed, figures); None: none yet, or none asked for."""
    if not i.burn_in_wanted or i.burn_in is None or i.burn_in.plan_hash != i.plan_hash:
        return None
    found = next((p for p in i.burn_in.pods if p.pod == pod), None)
    return None if found is None else (found.passed, found.message)


def _passed(i: CanaryInputs, pod: CanaryPod) -> str | None:
    """The canary's figures when it passed everything asked of it; None: a judgement is still to come."""
    v = _reading(i, pod.name)
    if not pod.ready or v is None:
        return None
    figures = (f"vLLM {v.vllm_version} reports {v.actual_tokens if v.actual_tokens is not None else '?'} KV-cache "
               f"tokens against {v.predicted_tokens} planned ({v.error_percent:+.2f} %)")
    if not i.burn_in_wanted:
        return figures
    burn = _burn_in(i, pod.name)
    return None if burn is None else f"{figures}; burn-in: {burn[1]}"


def _what_waits(i: CanaryInputs, pod: CanaryPod) -> str:
    if not pod.ready:
        return f"its pod {pod.name} is not Ready yet (startup probe {i.startup_seconds} s)"
    if _reading(i, pod.name) is None:
        return "vLLM's KV-cache figures are not read yet (PlanVerified)"
    return "its burn-in runs"

