"""One reconcile of an LLMDeployment: resolve, find GPUs, plan, render, gather evidence, decide, apply, report.

Decisions are the pure modules' (planner, renderer, remediation's decision, conditions); this module
sequences the I/O and turns failures into conditions. It never writes the spec, writes nothing when nothing
changed, and writes every child object or none (each write is tried as a server-side dry run first). A resync
enters through ``resync``, which first asks whether anything the reconcile reads has changed (quiet.py).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from llm_autopilot.api import convert
from llm_autopilot.api.conditions import DEGRADED, PLANNED, READY, deployment_ready, set_condition
from llm_autopilot.api.errors import validation_message
from llm_autopilot.api.lora import pinned_adapters
from llm_autopilot.api.v1alpha1 import CacheStatus, LLMDeploymentSpec, PlanStatus, VerificationStatus
from llm_autopilot.catalog.gpus import UnknownGPUError, gpu_from_labels
from llm_autopilot.controller import adapters, cache_step, inspect_step, telemetry
from llm_autopilot.controller.gather import (
    Gatherer,
    PodSource,
    SecretUnreadable,
    Target,
    hub_token,
    read_model,
    read_nodes,
    read_world,
)
from llm_autopilot.controller.kube import ApplyRejected, NodeGPUs, api_message
from llm_autopilot.controller.metrics import PrometheusClient, PrometheusSettings, SaturationRounds
from llm_autopilot.controller.quiet import (
    OPERATOR_VERSION,
    QuietMemory,
    Seen,
    fingerprint,
    later,
    metrics_verdict,
    next_due,
    unsettled,
)
from llm_autopilot.controller.settings import OperatorSettings
from llm_autopilot.desired.refusals import autoscaling_problem
from llm_autopilot.desired.world import World
from llm_autopilot.domain.precision import KVCacheDtype
from llm_autopilot.hub.resolve import ArchitectureRequired, ModelResolutionError
from llm_autopilot.planner import verify
from llm_autopilot.planner.plan import Infeasible, Plan, PlanRequest
from llm_autopilot.planner.pools import GPUPool, PoolChoice, choose_pool, replicas_that_fit
from llm_autopilot.remediation.decide import METRICS_AVAILABLE, Decision, Evidence, Probe, decide
from llm_autopilot.remediation.evidence import apply_overrides
from llm_autopilot.remediation.ladder import Overrides, Running, max_model_len_floor
from llm_autopilot.remediation.state import MAX_REPLICAS, Author, Limits, RemediationState, effective_replicas
from llm_autopilot.remediation.text import clean_line
from llm_autopilot.render import cache, groups, model_volume, rollout
from llm_autopilot.render.host_memory import host_memory
from llm_autopilot.render.kubernetes import Owner, WorkloadInputs, label_selector, memory_limit_gib, plan_hash
from llm_autopilot.render.vllm_args import ServeOptions, render_vllm_args, unknown_flags
from llm_autopilot.render.workload import Live, Shape, children
from llm_autopilot.vllm.versions import VersionError, VLLMVersion, behaviour_of

__all__ = ["METRICS_AVAILABLE", "Outcome", "SecretUnreadable", "ready_condition", "reconcile", "resync"]

logger = logging.getLogger(__name__)
_MESSAGE_LIMIT = 500
MODEL_CACHED = "ModelCached"


class Cluster(PodSource, Protocol):
    """The Kubernetes calls one reconcile makes (Kube; in-memory fakes in tests)."""

    def gpu_nodes(self) -> list[NodeGPUs]: ...

    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None: ...

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


#: failures that the same inputs always give again (a resync with the same inputs may stay quiet); the others
#: depend on what the API server, the Hub or RBAC say next time
_DETERMINISTIC_FAILURES = frozenset({"InvalidSpec", "UnknownGPU", "UnsupportedVLLMVersion", "Infeasible",
                                     "ArchitectureRequired", "LoRAAdapterRefused"})


@dataclass
class Outcome:
    status: dict[str, Any] = field(default_factory=dict)  # only the keys that change
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    writes: int = 0
    retry: bool = False
    #: for the quiet resync: whether the same inputs would decide the same again, until ``due``; the plan in
    #: force and what Prometheus said about its pods
    settled: bool = False
    due: datetime | None = None
    plan_hash: str | None = None
    metrics: str = ""
    #: the KV-saturation question the reconcile asked Prometheus: (window seconds, threshold)
    kv_question: tuple[int, float] | None = None
    #: False for a quiet resync (nothing was planned, rendered or read)
    full: bool = True
    #: why a retry is asked for, and after how many seconds
    retry_reason: str = "model could not be resolved yet; retrying"
    retry_delay: float = 30.0


def _utcnow() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def now() -> str:
    return _utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")


def ready_condition(deployment: dict[str, Any] | None, *, spec_replicas: int, max_replicas: int | None,
                    remediation: Any, autoscaled: bool = False) -> tuple[bool | None, str, str]:
    """Ready from the effective replica count (remediation's last override, else the spec's; the spec's alone
    when KEDA drives it). The reconcile is Ready's one writer (the Deployment watch triggers it)."""
    replicas = spec_replicas if autoscaled else effective_replicas(remediation, spec_replicas, max_replicas)
    return deployment_ready(deployment, replicas)


def observed_replicas(deployment: Mapping[str, Any] | None) -> dict[str, int]:
    """status.replicas and status.readyReplicas (the REPLICAS and AVAILABLE columns) from the workload's status:
    the reconcile writes them with Ready."""
    observed = (deployment or {}).get("status") or {}
    return {"replicas": _int(observed.get("replicas")), "readyReplicas": _int(observed.get("availableReplicas"))}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class StatusConflict(RuntimeError):
    """The LLMDeployment changed between the read and the status write (409): nothing was written."""


@dataclass
class Context:
    """What one reconcile learned about the world, reused for every candidate plan."""

    spec: LLMDeploymentSpec
    request_for: Callable[[GPUPool, Overrides], PlanRequest]
    pools: list[GPUPool]
    #: the most allocatable memory of any matching GPU node (GiB; 0: none known)
    node_memory_gib: float
    #: the shortest max_model_len remediation may cut to (never 1: see ladder.max_model_len_floor)
    floor_max_model_len: int
    #: per GPU (catalog name): the most allocatable memory of a matching node with it (GiB)
    pool_memory_gib: dict[str, float] = field(default_factory=dict)

    def memory_of(self, pool: GPUPool | None) -> float:
        """The memory bound of a pool's nodes (0: no node of it is known); remediation's memory limit never
        goes above the nodes the plan runs on, whatever larger nodes of other GPUs the cluster has."""
        if pool is None:
            return self.node_memory_gib
        return self.pool_memory_gib.get(pool.gpu.name, 0.0)
    #: the model cache's PVC (spec.model.cache) and whether its download is complete
    cache_claim: str | None = None
    cache_complete: bool = True


def context(spec: LLMDeploymentSpec, namespace: str, kube: Cluster, settings: OperatorSettings) -> Context:
    """Resolve the model and the GPU pools the spec may use (the part of the World that planning reads)."""
    return context_of(spec, World(read_model(spec, namespace, kube, settings), read_nodes(kube)), settings)


def context_of(spec: LLMDeploymentSpec, world: World, settings: OperatorSettings) -> Context:
    """The GPU pools the spec may use and the plan request per pool, from the World read (no I/O)."""
    model = world.model
    behaviour = behaviour_of(VLLMVersion.parse(spec.vllm.version or settings.default_vllm_version))
    wanted = spec.gpu.node_selector or {}
    pools = convert.gpu_pools(spec, world.node_pairs())
    pool_memory: dict[str, float] = {}
    for n in world.nodes:
        gpu = gpu_from_labels(dict(n.labels))
        if gpu is not None and all(n.labels.get(k) == v for k, v in wanted.items()):
            pool_memory[gpu.name] = max(pool_memory.get(gpu.name, 0.0), n.memory_gib)
    memory = max(pool_memory.values(), default=0.0)
    floor = max_model_len_floor(floor=spec.remediation.floors.min_max_model_len,
                                serving_min=spec.serving.min_max_model_len,
                                serving_max=spec.serving.fixed_max_model_len,
                                model_max=model.max_position_embeddings)

    def request_for(pool: GPUPool, overrides: Overrides) -> PlanRequest:
        # a pool seen on nodes: their GPUs per node and their number; else 8-GPU nodes, as many as maxGPUs needs
        targets = apply_overrides(convert.targets_for_pool(spec, pool), overrides, floor_max_model_len=floor)
        return PlanRequest(model, pool.gpu, behaviour, targets)

    return Context(spec, request_for, pools, memory, floor, pool_memory)


def limits(ctx: Context, node_memory_gib: float | None = None) -> Limits:
    """The bounds a status read from the cluster is clamped into (the memory limit: the given pool's nodes')."""
    spec, floors = ctx.spec, ctx.spec.remediation.floors
    return Limits(max_steps=spec.remediation.max_steps, spec_replicas=spec.replicas,
                  max_replicas=spec.remediation.max_replicas, max_gpus=spec.gpu.max_gpus,
                  node_memory_gib=ctx.node_memory_gib if node_memory_gib is None else node_memory_gib,
                  floor_max_model_len=ctx.floor_max_model_len,
                  floor_max_num_seqs=floors.min_max_num_seqs,
                  floor_max_num_batched_tokens=floors.min_max_num_batched_tokens,
                  floor_gpu_memory_utilization=floors.min_gpu_memory_utilization)


def plan_with(ctx: Context, overrides: Overrides) -> PoolChoice:
    with telemetry.PLAN_SECONDS.time():
        choice = choose_pool(ctx.pools, lambda pool: ctx.request_for(pool, overrides))
    telemetry.PLANS.labels("feasible" if isinstance(choice.result, Plan) else "infeasible").inc()
    return choice


@dataclass(frozen=True)
class Rendered:
    plan: Plan
    status: PlanStatus
    objects: list[dict[str, Any]]
    inputs: WorkloadInputs
    plan_hash: str
    #: the pods that serve the API (the scale subresource's selector)
    serving_selector: dict[str, str]
    shape: Shape
    pool: GPUPool | None = None

    @property
    def nodes(self) -> int:
        return self.plan.config.nodes

    def same_objects(self, other: Rendered) -> bool:
        return [o["metadata"]["annotations"] for o in self.objects] == [
            o["metadata"]["annotations"] for o in other.objects]


def render(ctx: Context, choice: PoolChoice, overrides: Overrides, owner: Owner,
           settings: OperatorSettings, live: Live | None = None) -> Rendered:
    assert isinstance(choice.result, Plan) and choice.pool is not None
    plan, spec = choice.result, ctx.spec
    served_name = spec.model.served_model_name or spec.model.name.removeprefix("hf://")
    local = cache.model_path() if ctx.cache_claim else model_volume.model_path(spec)
    args = render_vllm_args(plan, ServeOptions(served_model_name=served_name,
                                               revision=None if local else spec.model.revision,
                                               extra_args=tuple(spec.vllm.extra_args), model_path=local))
    version = str(plan.config.vllm.version)
    host = host_memory(plan, spec.vllm.extra_args).total_gib
    fit = replicas_that_fit(plan.config, choice.pool) if choice.pool.nodes else None
    plan_status = convert.plan_status(plan, args, host_memory_gib=host, replicas_that_fit=fit)
    unknown = unknown_flags(args, version)
    if unknown:
        plan_status.warnings.append(f"vLLM {version} does not accept {', '.join(unknown)} (from extraArgs)")
    products = choice.pool.products or tuple(plan.config.gpu.gfd_products)
    prometheus = (spec.autoscaling.prometheus_address or settings.prometheus_url) if spec.autoscaling else None
    inputs = WorkloadInputs(owner, spec, plan, tuple(args), spec.vllm.image or settings.default_image, products,
                            replicas=overrides.replicas, memory_limit_gib=overrides.memory_limit_gib,
                            host_memory_gib=host, prometheus_address=prometheus)
    inputs = dataclasses.replace(inputs, surge=rollout.can_surge(plan.config, choice.pool, inputs.replica_count),
                                 cache_claim=ctx.cache_claim, held=not ctx.cache_complete)
    workload = children(inputs, live or Live())
    return Rendered(plan, plan_status, workload.objects, inputs, plan_hash(inputs), workload.serving, workload.shape,
                    choice.pool)


def workload_view(kube: Cluster, r: Rendered) -> dict[str, Any] | None:
    """The serving workload's status as a Deployment's: the Deployment itself, or the groups summarised."""
    owner = r.inputs.owner
    if r.shape is Shape.DEPLOYMENT:
        return kube.get("apps/v1", "Deployment", owner.name, owner.namespace)
    if r.shape is Shape.LEADER_WORKER_SET:
        return groups.lws_view(kube.get(groups.LWS_API_VERSION, "LeaderWorkerSet", owner.name, owner.namespace),
                               current_hash=r.plan_hash)
    return groups.groups_view(
        [kube.get("apps/v1", "StatefulSet", groups.group_name(owner.name, i), owner.namespace)
         for i in range(r.inputs.replica_count)], current_hash=r.plan_hash, size=r.nodes)


def _running(r: Rendered, ctx: Context) -> Running:
    c, spec = r.plan.config, ctx.spec
    floors = spec.remediation.floors
    replicas = r.inputs.replica_count
    pool_max = max((p.gpus_per_node for p in ctx.pools if p.gpu.name == c.gpu.name), default=spec.gpu.max_gpus)
    return Running(
        autoscaled=spec.autoscaling is not None,
        max_model_len=c.max_model_len, max_num_batched_tokens=c.max_num_batched_tokens, max_num_seqs=c.max_num_seqs,
        enforce_eager=c.enforce_eager, gpu_memory_utilization=c.gpu_memory_utilization,
        fp8_kv_cache=c.kv_cache_dtype is KVCacheDtype.FP8, gpus=c.num_gpus, replicas=replicas,
        memory_limit_gib=memory_limit_gib(r.inputs),
        fp8_kv_allowed="fp8" in spec.serving.allowed_kv_cache_dtypes,
        max_gpus=min(spec.gpu.max_gpus, pool_max),
        max_replicas=min(spec.remediation.max_replicas or spec.replicas, MAX_REPLICAS),
        node_memory_gib=ctx.memory_of(r.pool) or memory_limit_gib(r.inputs),
        floor_max_model_len=ctx.floor_max_model_len,
        floor_gpu_memory_utilization=floors.min_gpu_memory_utilization,
        floor_max_num_seqs=floors.min_max_num_seqs, floor_max_num_batched_tokens=floors.min_max_num_batched_tokens,
        max_loras=c.lora.max_loras if c.lora else 0, floor_max_loras=max(1, pinned_adapters(spec)),
    )


def _changed(current: dict[str, Any], key: str, value: Any) -> bool:
    return bool(current.get(key) != value)


def _known_verification(raw: Any) -> verify.Known | None:
    """Which plan and pods status.verification read (None: nothing readable, so read again)."""
    if not isinstance(raw, dict):
        return None
    try:
        known = VerificationStatus.model_validate(raw)
    except ValueError:
        return None
    if known.plan_hash is None:
        return None
    return verify.Known(known.plan_hash, frozenset(p.pod for p in known.pods))


def gatherer_for(kube: Cluster, settings: OperatorSettings) -> Gatherer:
    """The evidence gatherer for these settings (the operator keeps one per process: it remembers crashes)."""
    if not settings.prometheus_url:
        return Gatherer(kube)
    client = PrometheusClient(PrometheusSettings(settings.prometheus_url, settings.prometheus_headers,
                                                 settings.prometheus_verify_tls))
    return Gatherer(kube, saturation=SaturationRounds(client, round_seconds=settings.prometheus_round_seconds),
                    labels=client)


class Reconciler:
    """One pass over one object; collects the status changes and events to report."""

    def __init__(self, *, name: str, namespace: str, uid: str, generation: int | None, status: dict[str, Any],
                 kube: Cluster, settings: OperatorSettings, gatherer: Gatherer,
                 resource_version: str | None = None, now: datetime | None = None) -> None:
        self.owner = Owner(name, namespace, uid)
        self.generation = generation
        self.resource_version = resource_version
        self.status = status
        self.kube = kube
        self.settings = settings
        self.gatherer = gatherer
        self.out = Outcome()
        #: the reconcile's clock, injected (one reading for the whole pass)
        self.now = now if now is not None else _utcnow()
        self.stamp = self.now.strftime("%Y-%m-%dT%H:%M:%SZ")
        self.conditions: list[dict[str, Any]] = list(status.get("conditions") or [])
        #: the remediation state as read, and as it stands now (None until the spec could be resolved)
        self.origin: RemediationState | None = None
        self.state: RemediationState | None = None
        self.repaired = False
        self.evidence: Evidence | None = None
        #: the objects written (for the step's Event: does its rollout surge?)
        self.final: Rendered | None = None
        #: the model cache's download (spec.model.cache), when there is one
        self.cache_status: CacheStatus | None = None

    def condition(self, type_: str, value: bool | None, reason: str, message: str) -> None:
        self.conditions = set_condition(self.conditions, type_, value, reason, message,
                                        generation=self.generation, now=self.stamp)

    def event(self, type_: str, reason: str, message: str) -> None:
        self.out.events.append((type_, reason, message))

    def fail(self, reason: str, message: str, *, retry: bool = False) -> Outcome:
        before = self.conditions
        self.condition(PLANNED, False, reason, message)
        if before != self.conditions:
            self.event("Warning", reason, message)
        self.out.retry = retry
        self.out.settled = reason in _DETERMINISTIC_FAILURES
        return self.finish()

    def finish(self) -> Outcome:
        if _changed(self.status, "conditions", self.conditions):
            self.out.status["conditions"] = self.conditions
        if _changed(self.status, "observedGeneration", self.generation):
            self.out.status["observedGeneration"] = self.generation
        if self.state is not None:
            self.state = self.state.attested(self.author)
            if self.state != self.origin or self.repaired:
                self.out.status["remediation"] = self.state.to_status()
        return self.out

    @property
    def author(self) -> Author:
        return Author(self.owner.uid, self.generation or 0)

    def read_state(self, ctx: Context) -> RemediationState:
        """The remediation state, only with the steps the operator recorded for this object, each clamped to
        the spec and to the nodes of the pool its overrides plan on."""
        raw = self.status.get("remediation")
        cap: float | None = None
        loose, _, _ = RemediationState.read_attributed(raw, limits(ctx), self.now, self.author)
        if loose.overrides.memory_limit_gib is not None:  # bounded by the planned pool's nodes, not the largest
            choice = plan_with(ctx, loose.overrides)
            if isinstance(choice.result, Plan) and choice.pool is not None:
                cap = ctx.memory_of(choice.pool) or None
        state, repairs, dropped = RemediationState.read_attributed(raw, limits(ctx, cap), self.now, self.author)
        for note in (*dropped, *repairs):
            logger.warning("%s/%s: %s", self.owner.namespace, self.owner.name, note)
        if dropped:  # written back without them, so this is said once
            self.event("Warning", "UnattributedRemediation", "; ".join(dropped))
        if repairs:
            self.event("Warning", "StatusRepaired", "; ".join(repairs))
        self.origin, self.state, self.repaired = state, state, bool(repairs or dropped)
        return state

    def run(self, spec_body: dict[str, Any]) -> Outcome:
        try:
            spec = LLMDeploymentSpec.model_validate(spec_body)
        except ValidationError as exc:
            return self.fail("InvalidSpec", validation_message(exc))
        found = inspect_step.observe_spec(self.kube, self.owner, spec, self.settings.operator_image,
                                          self.status.get("source"))
        if found is not None and found.failure is not None:
            return self.inspecting(found)
        self.report_source(found)
        try:
            world = read_world(spec, self.owner.name, self.owner.namespace, self.kube, self.settings,
                               volume=found.files if found is not None else None)
            ctx = context_of(spec, world, self.settings)
        except UnknownGPUError as exc:
            return self.fail("UnknownGPU", str(exc))
        except VersionError as exc:
            return self.fail("UnsupportedVLLMVersion", str(exc))
        except SecretUnreadable as exc:
            return self.fail("SecretUnreadable", str(exc))
        except ArchitectureRequired as exc:
            return self.fail("ArchitectureRequired", str(exc))
        except ModelResolutionError as exc:
            return self.fail("ModelUnresolved", str(exc), retry=True)
        if (lora := adapters.reconcile_refusal(spec, lambda: hub_token(spec, self.owner.namespace, self.kube),
                                               timeout=self.settings.hub_timeout_seconds)) is not None:
            return self.fail(lora.reason, lora.message, retry=lora.retry)
        state = self.read_state(ctx)
        choice = plan_with(ctx, state.overrides)
        if not isinstance(choice.result, Plan) and state.applied:
            # the spec changed so that remediation's overrides no longer fit: start again from the plan
            self.event("Normal", "RemediationReset", f"overrides no longer fit the spec: {choice.result.message}")
            state = self.state = state.reset()
            choice = plan_with(ctx, state.overrides)
        if not isinstance(choice.result, Plan) or choice.pool is None:
            message = choice.result.message if isinstance(choice.result, Infeasible) else "no GPU pool"
            return self.fail("Infeasible", message)
        refusal = autoscaling_problem(ctx.spec, choice.result, choice.pool, prometheus_url=self.settings.prometheus_url,
                                      crds=world.crds)
        if refusal is None and not cache.enabled(ctx.spec):
            refusal = model_volume.unserved_source(ctx.spec)
        if refusal is not None:
            return self.fail(*refusal)
        cache_objects = self.observe_cache(ctx, choice.result)
        if self.cache_status is not None:
            ctx = dataclasses.replace(ctx, cache_claim=self.cache_status.claim_name,
                                      cache_complete=self.cache_status.state == "Complete")
        live = world.live_for(choice.result.config.nodes > 1)
        current = render(ctx, choice, state.overrides, self.owner, self.settings, live)
        view = workload_view(self.kube, current)
        final, decision = self.remediate(ctx, current, state, view, live)
        recorded: list[bool] = []

        def record_first() -> None:  # the dry runs passed: the step goes into the status before any child
            if decision.changed:
                self.record_step(decision.state)
                recorded.append(True)

        try:
            written = self.kube.apply_all(cache_objects + final.objects, before_write=record_first)
        except ApplyRejected as exc:
            if recorded:  # refused for real after the dry run (a race): the recorded step is applied next pass
                self.state = self.origin
            # else nothing was written: a step whose objects the API server refuses is not taken, nor reported
            return self.fail("ApplyRejected", clean_line(str(exc), _MESSAGE_LIMIT))
        except StatusConflict:
            # the object changed since it was read: nothing was written; decide again on what it says now
            return Outcome(retry=True, retry_reason="the LLMDeployment changed while it was reconciled; retrying",
                           retry_delay=1.0)
        self.out.writes += written
        self.final = final
        self.record(decision)
        if written:
            view = workload_view(self.kube, final)
        self.report_plan(final, ctx, view)
        self.note_inputs(ctx, final)
        self.report_verification(final)
        self.report_cache()
        return self.finish()

    def report_verification(self, r: Rendered) -> None:
        """status.verification and PlanVerified: the plan's Ready pods read once per plan (gather), judged by
        planner/verify.py."""
        known = _known_verification(self.status.get("verification"))
        owner = self.owner
        ready = self.gatherer.ready_plan_pods(owner.namespace, owner.name, r.plan_hash)
        readings = self.gatherer.kv_figures(owner.namespace, verify.pods_to_read(known, r.plan_hash, ready))
        decision = verify.decide(verify.predict(r.plan.config, r.plan.estimate), r.plan_hash, known, readings,
                                 vllm_version=str(r.plan.config.vllm.version), now=self.now)
        if not decision.keep:
            found = VerificationStatus.of_pods(decision.results, plan_hash=r.plan_hash)
            value = found.model_dump(by_alias=True, exclude_none=True, mode="json") if found else None
            if _changed(self.status, "verification", value):
                self.out.status["verification"] = value
        status, reason, message = decision.condition
        if not reason:
            return
        before = self.conditions
        self.condition(verify.PLAN_VERIFIED, status, reason, message)
        if decision.event is not None and before != self.conditions:
            self.event(*decision.event)
        if reason == verify.UNREADABLE:
            self.out.settled = False  # read again on the next resync

    def report_source(self, found: inspect_step.Inspection | None) -> None:
        """status.source: what a pvc:// source's inspect Job read (removed when no inspection is needed)."""
        value = found.status.model_dump(by_alias=True, exclude_none=True) if found and found.status else None
        if _changed(self.status, "source", value):
            self.out.status["source"] = value

    def inspecting(self, found: inspect_step.Inspection) -> Outcome:
        """Planned=False while a pvc:// source is inspected or cannot be: only the inspect Job is applied."""
        self.report_source(found)
        assert found.failure is not None
        if found.objects:
            try:
                self.out.writes += self.kube.apply_all(found.objects)
            except ApplyRejected as exc:
                return self.fail("ApplyRejected", clean_line(str(exc), _MESSAGE_LIMIT), retry=True)
        self.out.retry_delay, self.out.retry_reason = found.retry_delay, found.failure[1][:200]
        reason, message = found.failure
        if reason != inspect_step.INSPECTING:
            return self.fail(reason, message, retry=True)
        before = self.conditions
        self.condition(PLANNED, False, reason, message)
        if before != self.conditions:
            self.event("Normal", reason, message)
        self.out.retry = True
        return self.finish()

    def observe_cache(self, ctx: Context, plan: Plan) -> list[dict[str, Any]]:
        """The cache's objects still to create, and its status (spec.model.cache); nothing without a cache."""
        if not cache.enabled(ctx.spec):
            return []
        inputs = cache.CacheInputs(ctx.spec, self.owner.namespace, self.settings.operator_image,
                                   rollout.checkpoint_bytes(plan.config), hub_endpoint=self.settings.hub_endpoint)
        previous = self.status.get("cache")
        try:
            known = CacheStatus.model_validate(previous) if isinstance(previous, dict) else None
        except ValueError:
            known = None
        objects, self.cache_status = cache_step.observe(self.kube, inputs, known)
        return objects

    def report_cache(self) -> None:
        status = self.cache_status
        if status is None:
            return
        value = status.model_dump(by_alias=True, exclude_none=True)
        if _changed(self.status, "cache", value):
            self.out.status["cache"] = value
        before = self.conditions
        self.condition(MODEL_CACHED, *cache_step.condition(status))
        if status.state == "Failed" and before != self.conditions:
            self.event("Warning", "CacheFailed", status.message)
        if status.state != "Complete":
            self.out.settled = False  # the next resync reads the download's progress again

    def note_inputs(self, ctx: Context, final: Rendered) -> None:
        """For the quiet resync: whether this reconcile settled, until when, on which plan's pods."""
        evidence, state = self.evidence, self.state
        assert evidence is not None and state is not None
        self.out.plan_hash = final.plan_hash
        self.out.metrics = metrics_verdict(evidence.metrics, evidence.saturation is not None)
        policy = ctx.spec.remediation
        self.out.kv_question = (policy.kv_saturation_window_seconds, policy.kv_saturation_threshold)
        self.out.settled = not unsettled(evidence, state)
        self.out.due = next_due(state, ctx.spec.remediation, self.now, self.settings.full_check_seconds)

    def remediate(self, ctx: Context, current: Rendered, state: RemediationState,
                  deployment: dict[str, Any] | None, live: Live) -> tuple[Rendered, Decision]:
        """Gather the evidence, let the pure decision speak: what should run, and why."""
        policy = ctx.spec.remediation
        evidence = self.gatherer.gather(Target(
            namespace=self.owner.namespace, name=self.owner.name, plan_hash=current.plan_hash,
            replicas=state.effective_replicas(ctx.spec.replicas), deployment=deployment,
            last_evidence=state.last_evidence, kv_threshold=policy.kv_saturation_threshold,
            kv_window=policy.kv_saturation_window_seconds))
        self.evidence = evidence
        renders: dict[Overrides, Rendered] = {}

        def probe(overrides: Overrides) -> Probe:
            choice = plan_with(ctx, overrides)
            if not isinstance(choice.result, Plan):
                return Probe(False, problem=choice.result.message)
            renders[overrides] = render(ctx, choice, overrides, self.owner, self.settings, live)
            return Probe(True, changes=not renders[overrides].same_objects(current))

        decision = decide(evidence, state, policy, _running(current, ctx), now=self.now, probe=probe)
        return (renders[decision.overrides] if decision.changed else current), decision

    def record_step(self, state: RemediationState) -> None:
        """Write a remediation step (or relax) to the status before the children that carry it, so no crash in
        between can leave a step applied but unrecorded: a reconcile after a crash reads the recorded step and
        applies its children (the apply is idempotent). Raises StatusConflict when the object changed since it
        was read."""
        try:
            state = state.attested(self.author)
            self.kube.patch_llmd_status(self.owner.namespace, self.owner.name, {"remediation": state.to_status()},
                                        resource_version=self.resource_version)
        except ApiException as exc:
            if exc.status == 409:
                raise StatusConflict(api_message(exc)) from exc
            raise
        self.out.writes += 1
        self.origin, self.repaired = state, False  # written: finish() need not write it again

    def outage(self, decision: Decision, reason: str) -> str:
        """What a step's rollout costs, added to its Event when it cannot surge onto a free GPU."""
        final = self.final
        if reason != "Remediated" or not decision.changed or final is None or final.inputs.surge:
            return ""
        if final.shape is not Shape.DEPLOYMENT:
            return "; pods across nodes are replaced group by group, so capacity drops during the rollout"
        return rollout.outage_note(final.inputs.replica_count)

    def record(self, decision: Decision) -> None:
        """The decision's state, conditions, events and counters, once its objects are written."""
        self.state = decision.state
        for c in decision.conditions:
            self.condition(c.type, c.status, c.reason, c.message)
        for note in decision.events:
            self.event(note.type, note.reason, note.message + self.outage(decision, note.reason))
        for signal, kind in decision.counts:
            telemetry.REMEDIATION_STEPS.labels(signal, kind).inc()

    def report_plan(self, r: Rendered, ctx: Context, deployment: dict[str, Any] | None) -> None:
        plan_dict = r.status.model_dump(by_alias=True, exclude_none=True)
        if _changed(self.status, "plan", plan_dict):
            self.out.status["plan"] = plan_dict
            self.event("Normal", "Planned", f"{r.plan.summary}, {r.status.quantization} weights, "
                                            f"{r.status.kv_cache_dtype} KV, max_model_len {r.status.max_model_len}")
        memory = r.status.memory
        self.condition(PLANNED, True, "Planned", f"{r.plan.summary}: {memory.kv_cache_gib} GiB KV cache per GPU, "
                                                 f"{memory.max_concurrency}x concurrency at {r.status.max_model_len}")
        remediation = self.state.to_status() if self.state is not None else None
        self.condition(READY, *ready_condition(deployment, spec_replicas=ctx.spec.replicas,
                                               max_replicas=ctx.spec.remediation.max_replicas,
                                               remediation=remediation, autoscaled=ctx.spec.autoscaling is not None))
        for key, value in (*observed_replicas(deployment).items(), ("selector", label_selector(r.serving_selector))):
            if _changed(self.status, key, value):
                self.out.status[key] = value
        if not any(c.get("type") == DEGRADED for c in self.conditions):
            self.condition(DEGRADED, False, "AsPlanned", "running the planned configuration")
        for warning in r.status.warnings:
            if warning not in ((self.status.get("plan") or {}).get("warnings") or []):
                self.event("Warning", "PlanWarning", warning)


def reconcile(
    *, name: str, namespace: str, uid: str, generation: int | None, spec_body: dict[str, Any],
    status: dict[str, Any], kube: Cluster, settings: OperatorSettings, gatherer: Gatherer | None = None,
    resource_version: str | None = None, now: datetime | None = None,
) -> Outcome:
    """One full reconcile at ``now`` (the clock is the caller's; default: the current second, UTC)."""
    return Reconciler(name=name, namespace=namespace, uid=uid, generation=generation, status=status, kube=kube,
                      settings=settings, gatherer=gatherer or gatherer_for(kube, settings),
                      resource_version=resource_version, now=now).run(spec_body)


def _settings_digest(settings: OperatorSettings) -> str:
    return f"{settings.default_image}/{settings.default_vllm_version}"


def resync(
    *, name: str, namespace: str, uid: str, generation: int | None, resource_version: str | None,
    spec_body: dict[str, Any], status: dict[str, Any], observed: str, current_pods: Callable[[str], list[str]],
    kube: Cluster, settings: OperatorSettings, gatherer: Gatherer, memory: QuietMemory, now: datetime | None = None,
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
                    now=at)
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
