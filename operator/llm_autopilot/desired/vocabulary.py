"""The words desired() speaks in, below every section: what it asks to read (the asks), what it leaves the shell to
do (the effects, carried by the Intent), and the Draft every section adds its part of the status to.

Lowest module of desired/'s decision: it imports no section and not the pipeline (tests/unit/test_layering.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from llm_autopilot.api.conditions import PLANNED, set_condition
from llm_autopilot.api.status import Condition, LLMDeploymentStatus
from llm_autopilot.api.v1alpha1 import CacheStatus
from llm_autopilot.desired.calibration import SampleToRecord
from llm_autopilot.desired.patch import merge_patch
from llm_autopilot.desired.status_fields import CONDITIONS, OBSERVED_GENERATION, REMEDIATION, StatusField
from llm_autopilot.desired.status_read import (
    ATTESTED,
    STATUS_FORGED,
    STATUS_READ,
    forged_message,
    read_status,
    status_read_condition,
)
from llm_autopilot.desired.world import OperatorDefaults, Target, World
from llm_autopilot.planner import verify
from llm_autopilot.planner.plan import Plan
from llm_autopilot.remediation.recovery import Recovery
from llm_autopilot.remediation.state import Author, RemediationState
from llm_autopilot.render import cache
from llm_autopilot.render.workload import Shape

T = TypeVar("T")

MESSAGE_LIMIT = 500
MODEL_CACHED = "ModelCached"
#: Planned=False while a pvc:// source is being inspected (controller/inspect_step.py)
INSPECTING = "InspectingSource"

#: failures that the same inputs always give again (a resync with the same inputs may stay quiet); the others
#: depend on what the API server, the Hub or RBAC say next time
DETERMINISTIC_FAILURES = frozenset({"InvalidSpec", "UnknownGPU", "UnsupportedVLLMVersion", "Infeasible",
                                    "ArchitectureRequired", "InvalidArchitecture", "LoRAAdapterRefused"})


# ---- the asks: what desired() needs read before it can decide ----------------------------------------------

@dataclass(frozen=True)
class WorkloadAsk:
    """The serving workload to read as a Deployment's status: its shape, its replicas and nodes, its plan."""

    shape: Shape
    name: str
    namespace: str
    plan_hash: str
    replicas: int
    nodes: int


@dataclass(frozen=True)
class VerificationAsk:
    """The plan whose Ready pods to read vLLM's KV figures from, and what status.verification already read."""

    namespace: str
    name: str
    plan_hash: str
    known: verify.Known | None


@dataclass(frozen=True)
class Asks:
    """What desired() needs read before it can decide, with what to read it for. A section that needs a reading
    returns its Asks; the pipeline stops there and the shell reads it into the World."""

    #: the model cache's state for these inputs, with the status recorded so far
    cache: cache.CacheInputs | None = None
    known_cache: CacheStatus | None = None
    #: the workload of the plan in force and remediation's evidence about it (the Target's deployment is the
    #: workload as read)
    workload: WorkloadAsk | None = None
    evidence: Target | None = None
    #: vLLM's own KV figures of the plan's Ready pods (plan verification)
    verification: VerificationAsk | None = None
    #: the after-plan features' asks, asked with the workload: each of its feature's own type, which the shell's
    #: reader is found by (controller/features/); its reading comes back in ``World.readings``
    features: tuple[object, ...] = ()


# ---- the effects: what the shell does once the objects are written -----------------------------------------

class Event(NamedTuple):
    """A Kubernetes Event to post on the object."""

    type: str  # Normal or Warning
    reason: str  # CamelCase
    message: str


@dataclass
class Report:
    """What a reconcile reports to the handlers: the status patch, the Events, whether to retry and the quiet
    resync's inputs. The Intent decides it; the shell's Outcome carries it on (controller/reconcile.py)."""

    #: the merge patch of the status (only what changes, the conditions among it)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    retry: bool = False
    retry_reason: str = "model could not be resolved yet; retrying"
    retry_delay: float = 30.0
    #: for the quiet resync: whether the same inputs would decide the same again, until ``due``; the plan in
    #: force and what Prometheus said about its pods, and the KV-saturation question asked (window, threshold)
    settled: bool = False
    due: datetime | None = None
    plan_hash: str | None = None
    metrics: str = ""
    kv_question: tuple[int, float] | None = None
    #: remediation's steps that recovered in this pass: the shell observes llm_autopilot_step_recovery_seconds
    #: once the status that records them is written, with the Events (a write lost or refused decides again)
    recoveries: list[Recovery] = field(default_factory=list)


@dataclass
class Intent(Report):
    """What one reconcile means to write: the objects (all or none), then the status and the Events (its
    Report); ``step`` and ``pin`` are the status to record before the objects that carry them (remediation's
    step, the calibration chosen). ``asks``: not decided yet, read these first."""

    objects: list[dict[str, Any]] = field(default_factory=list)
    #: the status as decided, typed (``status`` is the merge patch that writes it)
    decided: LLMDeploymentStatus | None = None
    conditions: tuple[Condition, ...] = ()
    step: dict[str, Any] | None = None
    #: status.kvCalibration's patch when the choice is new and the operator keeps a store, recorded with ``step``
    #: before the objects: a choice applied but unrecorded would be made again from the store as it is then
    pin: dict[str, Any] | None = None
    #: status.startupProbe when a new plan's probe was chosen (desired/startup_probe.py), recorded with ``step``:
    #: chosen again after a lost write, it could differ from the store as it is then and roll the pods again
    startup_pin: dict[str, Any] | None = None
    asks: Asks | None = None
    #: the workload to read again once the objects are written (the plan they carry)
    after: WorkloadAsk | None = None
    #: the plans made ("feasible"/"infeasible") and remediation's steps taken ((signal, kind)), for the counters
    plans: list[str] = field(default_factory=list)
    counts: list[tuple[str, str]] = field(default_factory=list)
    #: log lines (warnings) the shell writes
    notes: list[str] = field(default_factory=list)
    #: vLLM's figures read this pass, as a sample for the calibration store (controller/calibration_store.py)
    calibration_sample: SampleToRecord | None = None
    #: the after-plan features' effects, in order, once the objects are written: each of its feature's own type,
    #: which the shell's executor is found by (controller/features/)
    effects: list[object] = field(default_factory=list)
    #: the attested sections (status_read.ATTESTED) the shell attests with this write, each whole as decided
    #: (None: removed, its attestation with it): those that change, and those read without a valid attestation
    attest: dict[str, Any] = field(default_factory=dict)
    #: the plan chosen for the spec (with the overrides remediation recorded), once the planner found one: also on
    #: an Intent that asks, so the admission webhook has its verdict from the first round, and on one that a later
    #: cause stopped (spec.autoscaling, the source), so the webhook that admits it with a warning still gives the
    #: plan's own warnings
    plan: Plan | None = None


# ---- the accumulator every section writes its part into ------------------------------------------------------

class Draft:
    """One pass over one object: the status as read, the World, the clock, and what the sections decided so far
    (the Intent under construction, the status as decided, the conditions, the remediation state). The Intent's
    status is the merge patch from the status as read to the status as decided (``finish``)."""

    def __init__(self, status: dict[str, Any], world: World, now: datetime) -> None:
        assert world.operator is not None, "the World names the operator's settings"
        self.world = world
        self.settings: OperatorDefaults = world.operator
        self.owner = world.owner
        self.generation = world.generation
        #: the status as read; parsed once: what parses (``read``, and as the sections read it: ``status``)
        self.raw = status
        read = read_status(status, world.attested)
        self.read = read.status
        #: the attested sections set aside as not the operator's
        self.forged = read.forged
        self.status = read.readable
        #: the status as decided so far, typed (``decided``) and as written (``after``): the sections replace or
        #: remove whole fields of it (``put``)
        self.decided: LLMDeploymentStatus = read.status
        self.after: dict[str, Any] = dict(read.readable)
        self.out = Intent()
        self.now = now
        self.stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        self.conditions: tuple[Condition, ...] = tuple(self.read.conditions)
        #: the remediation state as read, and as it stands now (None until the spec could be resolved)
        self.origin: RemediationState | None = None
        self.state: RemediationState | None = None
        self.repaired = False
        self.cache_status: CacheStatus | None = None
        #: a feature waits on what no watch shows (a burn-in run's end): the quiet resync looks again
        self.waiting = False
        if (said := status_read_condition(read, self.conditions)) is not None:
            before = self.conditions
            self.condition(STATUS_READ, *said)
            if not said[0] and before != self.conditions:
                self.event("Warning", "StatusUnreadable", said[2])
        # said once: the write removes them or attests what is decided in their place (remediation's own reader
        # says what it kept of status.remediation)
        if forged := tuple(key for key in read.forged if key != "remediation"):
            self.event("Warning", STATUS_FORGED, forged_message(forged))
            self.out.notes.append(f"{self.owner.namespace}/{self.owner.name}: {forged_message(forged)}")

    @property
    def author(self) -> Author:
        return Author(self.owner.uid, self.generation or 0)

    def condition(self, type_: str, value: bool | None, reason: str, message: str) -> None:
        self.conditions = set_condition(self.conditions, type_, value, reason, message,
                                        generation=self.generation, now=self.stamp)

    def event(self, type_: str, reason: str, message: str) -> None:
        self.out.events.append(Event(type_, reason, message))

    def put(self, field: StatusField[T], value: T | None) -> None:
        """A field of the status as decided (None: removed): a new typed status, and its written form."""
        self.decided = self.decided.model_copy(update={field.name: value})
        if value is None:
            self.after.pop(field.key, None)
        else:
            self.after[field.key] = field.wire(value)

    def patch_of(self, field: StatusField[T]) -> Any:
        """A field's part of the merge patch (None: removed, or unchanged)."""
        key = field.key
        return merge_patch({key: self.raw[key]} if key in self.raw else {},
                           {key: self.after[key]} if key in self.after else {}).get(key)

    def asking(self, asks: Asks) -> Intent:
        """Not decided yet: read these first (the plan chosen so far goes along, for the admission webhook)."""
        return Intent(asks=asks, plan=self.out.plan)

    def fail(self, reason: str, message: str, *, retry: bool = False) -> Intent:
        before = self.conditions
        self.condition(PLANNED, False, reason, message)
        if before != self.conditions:
            self.event("Warning", reason, message)
        self.out.retry = retry
        self.out.settled = reason in DETERMINISTIC_FAILURES
        self.out.objects = []
        self.out.step = self.out.pin = self.out.startup_pin = None
        return self.finish()

    def finish(self) -> Intent:
        self.put(CONDITIONS, list(self.conditions))
        self.put(OBSERVED_GENERATION, self.generation)
        if self.state is not None:
            self.state = self.state.attested(self.author)
            if self.state != self.origin or self.repaired:
                self.put(REMEDIATION, self.state)
            elif REMEDIATION.key in self.raw:  # as read: its written form stays as it was
                self.decided = self.decided.model_copy(update={REMEDIATION.name: self.state})
        self.out.decided = self.decided
        self.out.status = merge_patch(self.raw, self.after)
        self.out.conditions = self.conditions
        attested = self.world.attested
        self.out.attest = {key: self.after.get(key) for key in ATTESTED
                           if key in self.out.status or (attested is not None and key in self.after
                                                         and key not in attested)}
        return self.out
