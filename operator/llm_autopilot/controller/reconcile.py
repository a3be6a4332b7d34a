"""One reconcile of an LLMDeployment: gather the World, let ``desired()`` decide, apply its Intent, report.

The decisions are desired/pipeline.py's (pure: the planner, the renderer, remediation's decision, the
conditions); this module only reads and writes: read_world (gather.py) and what the Intent asks for (READERS: the
model cache's state, the workload, remediation's evidence, the plan's KV figures; FEATURE_READERS: the after-plan
features' asks, by type, from controller/features/), then the objects, all or none (each write is tried as a
server-side dry run first), with a remediation step and a new calibration choice recorded in the status before
the objects that carry them, then the Intent's effects (EFFECTS, by type, from controller/features/).
It never writes the spec and writes nothing when nothing changed. A resync enters through ``resync``, which
first asks whether anything the reconcile reads has changed (quiet.py).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.catalog.gpus import UnknownGPUError
from llm_autopilot.controller import cache_step, inspect_step, telemetry
from llm_autopilot.controller.calibration_store import CalibrationBook
from llm_autopilot.controller.features import FEATURES
from llm_autopilot.controller.features.burn_in import BurnInRuns
from llm_autopilot.controller.gather import (
    Gatherer,
    PodSource,
    SecretUnreadable,
    read_model,
    read_nodes,
    read_vllm_version,
    read_world,
)
from llm_autopilot.controller.kube import ApplyRejected, NodeGPUs, api_message
from llm_autopilot.controller.lora_runtime import LoRAAnswers
from llm_autopilot.controller.metrics import PrometheusClient, PrometheusSettings, SaturationRounds
from llm_autopilot.controller.quiet import OPERATOR_VERSION, QuietMemory, Seen, fingerprint, later, metrics_verdict
from llm_autopilot.controller.settings import OperatorSettings
from llm_autopilot.controller.status_attestation import (
    attestations_patch,
    status_key,
    trusted_status,
    verified_sections,
)
from llm_autopilot.controller.world_reads import workload_view
from llm_autopilot.desired import planning
from llm_autopilot.desired.pipeline import desired
from llm_autopilot.desired.planning import Context, Rendered, context_of, limits, render
from llm_autopilot.desired.vocabulary import (
    MODEL_CACHED,
    Asks,
    Intent,
    Report,
)
from llm_autopilot.desired.world import (
    Applied,
    CacheObservation,
    SourceView,
    Unresolved,
    VerificationReading,
    WorkloadView,
    World,
)
from llm_autopilot.hub.resolve import ArchitectureRequired, InvalidOverride, ModelResolutionError
from llm_autopilot.planner import verify
from llm_autopilot.planner.plan import Plan
from llm_autopilot.planner.pools import PoolChoice
from llm_autopilot.remediation.decide import METRICS_AVAILABLE
from llm_autopilot.remediation.ladder import Overrides
from llm_autopilot.render.kubernetes import Owner
from llm_autopilot.vllm.versions import VersionError

#: desired/'s names that callers import from here
__all__ = [
    "METRICS_AVAILABLE",
    "MODEL_CACHED",
    "Context",
    "Outcome",
    "Rendered",
    "SecretUnreadable",
    "context",
    "context_of",
    "limits",
    "reconcile",
    "render",
    "resync",
    "timed_plan",
    "workload_view",
]

logger = logging.getLogger(__name__)


class Cluster(PodSource, Protocol):
    """The Kubernetes calls one reconcile makes (Kube; in-memory fakes in tests)."""

    def gpu_nodes(self) -> list[NodeGPUs]: ...

    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None: ...

    def get_whole(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        """The object as the API server has it, whole (``get`` may give a watch's summary of it)."""
        ...

    def apply_all(self, objects: list[dict[str, Any]], before_write: Callable[[], None] | None = None) -> int:
        """Write the objects that changed, all or none; raises ApplyRejected. ``before_write`` runs after the
        dry runs passed, before the first write."""
        ...

    def patch_llmd_status(self, namespace: str, name: str, status: dict[str, Any],
                          resource_version: str | None = None) -> None:
        """Merge-patch the LLMDeployment's status; with ``resource_version``, 409 if it changed since."""
        ...

    def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        """None when the Secret or key does not exist; raises ApiException otherwise."""
        ...

    def current_log(self, namespace: str, pod: str, container: str, *, tail_lines: int, limit_bytes: int) -> str:
        """The running container's log tail; raises LogUnavailable."""
        ...

    def job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]: ...

    def patch_pod_condition(self, namespace: str, pod: str, condition: dict[str, Any]) -> None:
        """Write one condition of a pod's status (strategic merge by type: the kubelet's stay)."""
        ...

    def delete(self, api_version: str, kind: str, name: str, namespace: str, *, uid: str) -> bool:
        """Delete the object if it still is the one with this uid; False when it was gone or replaced."""
        ...


@dataclass
class Outcome(Report):
    """The Intent's Report as the handlers get it, with what the shell did: the writes made, and whether the
    reconcile was a full one."""

    writes: int = 0
    #: False for a quiet resync (nothing was planned, rendered or read)
    full: bool = True

    @classmethod
    def of(cls, decided: Report, *, status: dict[str, Any], writes: int) -> Outcome:
        report = {f.name: getattr(decided, f.name) for f in dataclasses.fields(Report)}
        return cls(**{**report, "status": status, "events": list(decided.events)}, writes=writes)


def _utcnow() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def now() -> str:
    return _utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")


class StatusConflict(RuntimeError):
    """The LLMDeployment changed between the read and the status write (409): nothing was written."""


def context(spec: LLMDeploymentSpec, namespace: str, kube: Cluster, settings: OperatorSettings) -> Context:
    """Resolve the model and the GPU pools the spec may use (the part of the World that planning reads)."""
    return context_of(spec, World(read_model(spec, namespace, kube, settings), read_nodes(kube)), settings)


def timed_plan(ctx: Context, overrides: Overrides) -> PoolChoice:
    """desired's plan_with, timed and counted (for tools and tests that plan outside a reconcile)."""
    with telemetry.PLAN_SECONDS.time():
        choice = planning.plan_with(ctx, overrides)
    telemetry.PLANS.labels("feasible" if isinstance(choice.result, Plan) else "infeasible").inc()
    return choice


def gatherer_for(kube: Cluster, settings: OperatorSettings) -> Gatherer:
    """The evidence gatherer for these settings (the operator keeps one per process: it remembers crashes)."""
    if not settings.prometheus_url:
        return Gatherer(kube, versions=read_vllm_version)
    client = PrometheusClient(PrometheusSettings(settings.prometheus_url, settings.prometheus_headers,
                                                 settings.prometheus_verify_tls))
    return Gatherer(kube, saturation=SaturationRounds(client, round_seconds=settings.prometheus_round_seconds),
                    labels=client, versions=read_vllm_version)


#: how many times desired() may run in one settle: it asks at most whether the workload runs an unattested
#: remediation state's plan, for the model cache, then the workload with its evidence (and its burn-in), then the
#: plan's KV figures, and decides on the next
_ROUNDS = 6


class Reconciler:
    """One pass over one object: gather the World, let desired() decide, apply its Intent, report."""

    def __init__(self, *, name: str, namespace: str, uid: str, generation: int | None, status: dict[str, Any],
                 kube: Cluster, settings: OperatorSettings, gatherer: Gatherer,
                 resource_version: str | None = None, now: datetime | None = None,
                 calibration: CalibrationBook | None = None, burn_ins: BurnInRuns | None = None,
                 key: bytes | None = None, lora_answers: LoRAAnswers | None = None) -> None:
        self.owner = Owner(name, namespace, uid)
        self.generation = generation
        self.resource_version = resource_version
        self.status = status
        #: the key the status's sections are attested with, and those of the status read that verify: the
        #: shell's own reads (status.source, status.loraSources) take only those, desired() sets the others aside
        self.key = key if key is not None else status_key()
        self.attested = verified_sections(self.key, uid, status)
        self.trusted = trusted_status(status, self.attested)
        self.kube = kube
        self.settings = settings
        #: the evidence's pods come from this reconcile's view of the cluster (the operator's watches)
        self.gatherer = gatherer.reading(kube)
        #: the reconcile's clock, injected (one reading for the whole pass)
        self.now = now if now is not None else _utcnow()
        self.writes = 0
        #: the KV calibration store (None: the operator keeps none)
        self.calibration = calibration
        #: the burn-in runs the operator keeps (None: none are run; a spec asking for one waits)
        self.burn_ins = burn_ins
        #: vLLM's answers to the LoRA calls, kept by the operator between passes (without one: this pass's only,
        #: so every pass calls again)
        self.lora_answers = lora_answers if lora_answers is not None else LoRAAnswers()

    def run(self, spec_body: dict[str, Any]) -> Outcome:
        world = dataclasses.replace(self.read(spec_body), attested=self.attested)
        decided, world = self.settle(spec_body, world)
        if not decided.objects:
            return self.outcome(decided, recorded=())
        recorded: list[str] = []

        def record_first() -> None:  # the dry runs passed: the step and the calibration chosen go first
            first = {key: value for key, value in (("remediation", decided.step), ("kvCalibration", decided.pin),
                                                   ("startupProbe", decided.startup_pin)) if value is not None}
            # each goes with its attestation: the step as written (the API server keeps no nulls), the pin as decided
            first |= attestations_patch(self.key, self.owner.uid,
                                        {key: decided.step if key == "remediation" else decided.attest.get(key)
                                         for key in first})
            if first:
                self.record_first(first)
                recorded.extend(first)

        try:
            written = self.kube.apply_all(decided.objects, before_write=record_first)
        except ApplyRejected as exc:
            # nothing was written, or a step recorded just before a refusal for real (a race) is applied next pass
            rejected, _ = self.settle(spec_body, dataclasses.replace(world, applied=Applied(rejected=str(exc))))
            return self.outcome(rejected, recorded=tuple(recorded))
        except StatusConflict:
            # the object changed since it was read: nothing was written; decide again on what it says now
            return Outcome(retry=True, retry_reason="the LLMDeployment changed while it was reconciled; retrying",
                           retry_delay=1.0, writes=self.writes)
        self.writes += written
        if written and decided.after is not None:  # Ready from the workload as the write left it
            world = dataclasses.replace(world, applied=Applied(view=workload_view(self.kube, decided.after)))
            decided, _ = self.settle(spec_body, world)
        return self.outcome(decided, recorded=tuple(recorded))

    def read(self, spec_body: dict[str, Any]) -> World:
        """The World desired() starts from: the object, the pvc:// source's inspection, then read_world's
        model, nodes, CRDs, live shapes and adapters (a failure to read the model is the World's answer)."""
        base = World(Unresolved("InvalidSpec", ""), owner=self.owner, generation=self.generation,
                     operator=self.settings)
        try:
            spec = LLMDeploymentSpec.model_validate(spec_body)
        except ValidationError:
            return base  # desired() says why
        found = inspect_step.observe_spec(self.kube, self.owner, spec, self.settings.operator_image,
                                          self.trusted.get("source"))
        source = (SourceView(found.status, tuple(found.objects), found.failure, found.retry_delay)
                  if found is not None else None)
        if found is not None and found.failure is not None:
            return dataclasses.replace(base, model=Unresolved(*found.failure), source=source)
        adapters = inspect_step.observe_adapters(self.kube, self.owner, spec, self.settings.operator_image,
                                                 self.trusted.get("loraSources"))
        try:
            world = read_world(spec, self.owner.name, self.owner.namespace, self.kube, self.settings,
                               volume=found.files if found is not None else None,
                               recorded=inspect_step.recorded_source(self.trusted.get("source")), adapters=adapters)
        except UnknownGPUError as exc:
            return dataclasses.replace(base, model=Unresolved("UnknownGPU", str(exc)), source=source)
        except VersionError as exc:
            return dataclasses.replace(base, model=Unresolved("UnsupportedVLLMVersion", str(exc)), source=source)
        except SecretUnreadable as exc:
            return dataclasses.replace(base, model=Unresolved("SecretUnreadable", str(exc)), source=source)
        except ArchitectureRequired as exc:
            return dataclasses.replace(base, model=Unresolved("ArchitectureRequired", str(exc)), source=source)
        except InvalidOverride as exc:
            return dataclasses.replace(base, model=Unresolved("InvalidArchitecture", str(exc)), source=source)
        except ModelResolutionError as exc:
            return dataclasses.replace(base, model=Unresolved("ModelUnresolved", str(exc), retry=True),
                                       source=source)
        store, unreadable = self.calibration.current(self.now) if self.calibration else (None, None)
        return dataclasses.replace(world, owner=self.owner, generation=self.generation, operator=self.settings,
                                   source=source or world.source,  # world.source: an s3:// source's reading
                                   calibration=store, calibration_unreadable=unreadable)

    def settle(self, spec_body: dict[str, Any], world: World) -> tuple[Intent, World]:
        """desired() on the World, reading what it asks for until it decides."""
        for _ in range(_ROUNDS):
            started = time.perf_counter()
            decided = desired(spec_body, self.status, world, self.now)
            if decided.asks is None:
                for _plan in decided.plans:  # the decision's plans, each its share of the time desired() took
                    telemetry.PLAN_SECONDS.observe((time.perf_counter() - started) / len(decided.plans))
                return decided, world
            world = self.answer(decided.asks, world)
        raise RuntimeError(f"desired() still asks after {_ROUNDS} rounds: {decided.asks}")

    def answer(self, asks: Asks, world: World) -> World:
        """Read what desired() asked for into the World (READERS: one reader per ask; a feature's ask is found
        by its type, its reading goes to World.readings)."""
        for ask, read in READERS.items():
            if getattr(asks, ask) is not None:
                world = read(self, asks, world)
        for feature_ask in asks.features:
            world = world.with_reading(FEATURE_READERS[type(feature_ask)](self, feature_ask))
        return world

    def outcome(self, decided: Intent, *, recorded: tuple[str, ...]) -> Outcome:
        """The Intent as the handlers report it, with the counters; what was recorded before the objects (the
        status keys ``recorded``) is not written again."""
        status = dict(decided.status)
        for key in recorded:
            status.pop(key, None)
        # what was recorded first went with its attestation
        status |= attestations_patch(self.key, self.owner.uid,
                                     {key: value for key, value in decided.attest.items() if key not in recorded})
        for line in decided.notes:
            logger.warning("%s", line)
        for outcome in decided.plans:
            telemetry.PLANS.labels(outcome).inc()
        for signal, kind in decided.counts:
            telemetry.REMEDIATION_STEPS.labels(signal, kind).inc()
        _record_calibration(self, decided)
        for effect in decided.effects:
            EFFECTS[type(effect)](self, effect)
        return Outcome.of(decided, status=status, writes=self.writes)

    def record_first(self, status: dict[str, Any]) -> None:
        """Write a remediation step (or relax) and a new calibration choice to the status before the children
        that carry them, so no crash in between, nor a status write lost after them, can leave them applied but
        unrecorded: a reconcile after it reads what was recorded and applies its children (the apply is
        idempotent) instead of choosing again. Raises StatusConflict when the object changed since it was read."""
        try:
            self.kube.patch_llmd_status(self.owner.namespace, self.owner.name, status,
                                        resource_version=self.resource_version)
        except ApiException as exc:
            if exc.status == 409:
                raise StatusConflict(api_message(exc)) from exc
            raise
        self.writes += 1


# ---- the readers: what desired() asks for, read into the World ----------------------------------------------

def _read_cache(r: Reconciler, asks: Asks, world: World) -> World:
    """The model cache's Jobs and download state for the inputs asked (with the status recorded so far)."""
    assert asks.cache is not None
    objects, status = cache_step.observe(r.kube, asks.cache, asks.known_cache)
    return dataclasses.replace(world, cache=CacheObservation(asks.cache, tuple(objects), status))


def _read_workload(r: Reconciler, asks: Asks, world: World) -> World:
    """The plan in force's workload, and remediation's evidence about it."""
    assert asks.workload is not None
    view = workload_view(r.kube, asks.workload)
    world = dataclasses.replace(world, workload=WorkloadView(asks.workload.plan_hash, view))
    if asks.evidence is not None:
        world = dataclasses.replace(world, evidence=r.gatherer.gather(dataclasses.replace(asks.evidence,
                                                                                          deployment=view)))
    return world


def _read_verification(r: Reconciler, asks: Asks, world: World) -> World:
    """vLLM's own KV figures of the plan's Ready pods not read yet."""
    asked = asks.verification
    assert asked is not None
    ready = r.gatherer.ready_plan_pods(asked.namespace, asked.name, asked.plan_hash)
    readings = r.gatherer.kv_figures(asked.namespace, verify.pods_to_read(asked.known, asked.plan_hash, ready),
                                     instance=asked.name)
    return dataclasses.replace(world, verification=VerificationReading(asked.plan_hash, readings))


#: each ask (a field of Asks; ``known_cache`` and ``evidence`` go with ``cache`` and ``workload``, the
#: features' with their types: FEATURE_READERS) and its reader
READERS: dict[str, Callable[[Reconciler, Asks, World], World]] = {
    "cache": _read_cache, "workload": _read_workload, "verification": _read_verification,
}


#: each after-plan feature's ask type and its reader (what it reads goes to World.readings)
FEATURE_READERS: dict[type, Callable[[Reconciler, Any], object]] = {
    kind: read for feature in FEATURES for kind, read in feature.READERS.items()}


# ---- the executors: what an Intent leaves the shell to do once its objects are written -----------------------

def _record_calibration(r: Reconciler, decided: Intent) -> None:
    """vLLM's figures read this pass, as a sample for the calibration store (when the operator keeps one)."""
    sample = decided.calibration_sample
    if sample is not None and r.calibration is not None and r.calibration.record(sample, r.now):
        r.writes += 1


#: each effect type an Intent may carry (Intent.effects) and its executor, run in the Intent's order once the
#: objects are written (the objects themselves -- the cache's and the inspect Jobs among them -- are applied
#: before, all or none; the calibration sample is recorded first)
EFFECTS: dict[type, Callable[[Reconciler, Any], None]] = {
    kind: execute for feature in FEATURES for kind, execute in feature.EXECUTORS.items()}


def reconcile(
    *, name: str, namespace: str, uid: str, generation: int | None, spec_body: dict[str, Any],
    status: dict[str, Any], kube: Cluster, settings: OperatorSettings, gatherer: Gatherer | None = None,
    resource_version: str | None = None, now: datetime | None = None, calibration: CalibrationBook | None = None,
    burn_ins: BurnInRuns | None = None, key: bytes | None = None, lora_answers: LoRAAnswers | None = None,
) -> Outcome:
    """One full reconcile at ``now`` (the clock is the caller's; default: the current second, UTC); ``key``
    attests the status (default: status_attestation.status_key())."""
    return Reconciler(name=name, namespace=namespace, uid=uid, generation=generation, status=status, kube=kube,
                      settings=settings, gatherer=gatherer or gatherer_for(kube, settings),
                      resource_version=resource_version, now=now, calibration=calibration,
                      burn_ins=burn_ins, key=key, lora_answers=lora_answers).run(spec_body)


def _settings_digest(settings: OperatorSettings) -> str:
    return f"{settings.default_image}/{settings.default_vllm_version}"


def resync(
    *, name: str, namespace: str, uid: str, generation: int | None, resource_version: str | None,
    spec_body: dict[str, Any], status: dict[str, Any], observed: str, current_pods: Callable[[str], list[str]],
    kube: Cluster, settings: OperatorSettings, gatherer: Gatherer, memory: QuietMemory, now: datetime | None = None,
    calibration: CalibrationBook | None = None, burn_ins: BurnInRuns | None = None,
    lora_answers: LoRAAnswers | None = None,
) -> Outcome:
    """The resync's front gate: quiet when nothing the last full reconcile read has changed (quiet.py), else a
    full reconcile, whose inputs are remembered.

    ``observed`` is the digest of what the watches show for the object (nodes, children, pods);
    ``current_pods(plan_hash)`` names its pods that run a plan, which Prometheus is asked about (batched per
    namespace and round) as the reconcile would ask.
    """
    key = quiet_key(generation=generation, resource_version=resource_version, spec_body=spec_body, status=status,
                    observed=observed, settings=settings)
    at = now if now is not None else _utcnow()
    seen = memory.get(uid)
    if (seen is not None and unchanged(seen, key, at)
            and _verdict(gatherer, seen, current_pods) == seen.metrics):
        return Outcome(full=False, settled=True, due=seen.due, plan_hash=seen.plan_hash, metrics=seen.metrics)
    out = reconcile(name=name, namespace=namespace, uid=uid, generation=generation, spec_body=spec_body,
                    status=status, kube=kube, settings=settings, gatherer=gatherer, resource_version=resource_version,
                    now=at, calibration=calibration, burn_ins=burn_ins, lora_answers=lora_answers)
    due = out.due or later(at, settings.full_check_seconds)
    memory.remember(uid, Seen(fingerprint=key, metrics=out.metrics, due=due, settled=out.settled and not out.retry,
                              plan_hash=out.plan_hash, namespace=namespace, kv_question=out.kv_question))
    return out


def quiet_key(*, generation: int | None, resource_version: str | None, spec_body: Mapping[str, Any],
              status: Mapping[str, Any], observed: str, settings: OperatorSettings) -> str:
    """The fingerprint of what a full reconcile reads: the object (its resourceVersion), the watches' digest
    ``observed``, the operator's version and settings."""
    llmd = resource_version or fingerprint(version="", settings="", llmd=str(generation),
                                           observed=f"{spec_body}{status}")
    return fingerprint(version=OPERATOR_VERSION, settings=_settings_digest(settings), llmd=llmd, observed=observed)


def unchanged(seen: Seen, key: str, now: datetime | None = None) -> bool:
    """Whether the last full reconcile settled on the inputs ``key`` names, and is not due again yet at ``now``
    (what Prometheus says is asked separately)."""
    return seen.settled and seen.fingerprint == key and (now if now is not None else _utcnow()) < seen.due


def _verdict(gatherer: Gatherer, seen: Seen, current_pods: Callable[[str], list[str]]) -> str:
    """What Prometheus says now about the remembered plan's pods: the question the reconcile asked."""
    if seen.plan_hash is None or seen.kv_question is None:
        return seen.metrics  # the reconcile stopped before asking (a failure: no plan)
    window, threshold = seen.kv_question
    metrics, _, signal = gatherer.kv_saturation(seen.namespace, current_pods(seen.plan_hash), window=window,
                                                threshold=threshold)
    return metrics_verdict(metrics, signal is not None)
