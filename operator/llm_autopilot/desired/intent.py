"""``desired(spec, status, world, now) -> Intent``: one reconcile decided without I/O.

From the spec as written, the status as read, the World one gather step read (controller/gather.py) and the
clock, it gives the Intent: the objects to apply (all or none), the status patch with the conditions, the
Events, and the remediation step and the calibration chosen to record before the objects. What it needs read
first and has not been given -- the model cache's state for the chosen plan, the workload and remediation's
evidence for the plan in force -- it names in ``Intent.asks``; the shell reads that, adds it to the World and
asks again, so every decision stays here and the shell only reads and writes. A refused apply, and the
workload read again after a write, are given back the same way (``World.applied``).

The decisions themselves are the pure modules': the planner, the renderer, remediation's decide(), the
refusals, the conditions.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from llm_autopilot.api import convert
from llm_autopilot.api.conditions import DEGRADED, PLANNED, READY, deployment_ready, set_condition
from llm_autopilot.api.errors import validation_message
from llm_autopilot.api.lora import lora_refusal, pinned_adapters
from llm_autopilot.api.v1alpha1 import (
    BurnInStatus,
    CacheStatus,
    KVCalibrationStatus,
    LLMDeploymentSpec,
    PlanStatus,
    PodBurnInStatus,
    VerificationStatus,
)
from llm_autopilot.catalog.gpus import UnknownGPUError, gpu_from_labels
from llm_autopilot.desired import burn_in, lora_sync
from llm_autopilot.desired.calibration import Calibrations, SampleToRecord, sample_of
from llm_autopilot.desired.refusals import autoscaling_problem, spec_refusal
from llm_autopilot.desired.schedule import metrics_verdict, next_due, unsettled
from llm_autopilot.desired.world import (
    AdapterReading,
    OperatorDefaults,
    SourceView,
    Target,
    Unresolved,
    World,
)
from llm_autopilot.domain.burn_in import BURN_IN_GATE, BurnInLoad
from llm_autopilot.planner import verify
from llm_autopilot.planner.calibration import CalibrationKey, key_of
from llm_autopilot.planner.config import ServingConfig
from llm_autopilot.planner.plan import Infeasible, Plan, PlanRequest
from llm_autopilot.planner.pools import GPUPool, PoolChoice, choose_pool, replicas_that_fit
from llm_autopilot.remediation.classify import Classification
from llm_autopilot.remediation.decide import Decision, Evidence, Probe, decide
from llm_autopilot.remediation.evidence import apply_overrides
from llm_autopilot.remediation.ladder import Overrides, Running, Workload, max_model_len_floor
from llm_autopilot.remediation.state import MAX_REPLICAS, Author, Limits, RemediationState, effective_replicas
from llm_autopilot.remediation.text import clean_line
from llm_autopilot.render import cache, lora_volumes, model_volume, rollout
from llm_autopilot.render.host_memory import host_memory
from llm_autopilot.render.kubernetes import Owner, WorkloadInputs, label_selector, memory_limit_gib, plan_hash
from llm_autopilot.render.vllm_args import VLLM_PORT, ServeOptions, render_vllm_args, unknown_flags
from llm_autopilot.render.workload import Live, Shape, children
from llm_autopilot.vllm.versions import VersionError, VLLMVersion, behaviour_of

logger = logging.getLogger(__name__)
MESSAGE_LIMIT = 500
MODEL_CACHED = "ModelCached"
#: Planned=False while a pvc:// source is being inspected (controller/inspect_step.py)
INSPECTING = "InspectingSource"

#: failures that the same inputs always give again (a resync with the same inputs may stay quiet); the others
#: depend on what the API server, the Hub or RBAC say next time
DETERMINISTIC_FAILURES = frozenset({"InvalidSpec", "UnknownGPU", "UnsupportedVLLMVersion", "Infeasible",
                                    "ArchitectureRequired", "InvalidArchitecture", "LoRAAdapterRefused"})


# ---- planning and rendering, per candidate -----------------------------------------------------------------

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
    #: the model cache's PVC (spec.model.cache) and whether its download is complete
    cache_claim: str | None = None
    cache_complete: bool = True
    #: the s3:// LoRA adapters whose download into the cache is complete (by name): the pods load only those
    downloaded_adapters: frozenset[str] = frozenset()

    def memory_of(self, pool: GPUPool | None) -> float:
        """The memory bound of a pool's nodes (0: no node of it is known); remediation's memory limit never
        goes above the nodes the plan runs on, whatever larger nodes of other GPUs the cluster has."""
        if pool is None:
            return self.node_memory_gib
        return self.pool_memory_gib.get(pool.gpu.name, 0.0)


def context_of(spec: LLMDeploymentSpec, world: World, settings: OperatorDefaults,
               calibrations: Calibrations | None = None) -> Context:
    """The GPU pools the spec may use and the plan request per pool, from the World read (no I/O), each request
    with the calibration ``calibrations`` gives its GPU; raises VersionError, UnknownGPUError."""
    model = world.model
    assert not isinstance(model, Unresolved)
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
        # the adapters' configs as read this pass: maxLoraRank's default is the largest of their ranks
        targets = apply_overrides(convert.targets_for_pool(spec, pool, world.adapters.configs), overrides,
                                  floor_max_model_len=floor)
        calibration = (calibrations.applied(key_of(pool.gpu.display_name, behaviour.version, model))
                       if calibrations is not None else None)
        return PlanRequest(model, pool.gpu, behaviour, targets, kv_calibration=calibration)

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
    return choose_pool(ctx.pools, lambda pool: ctx.request_for(pool, overrides))


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
           settings: OperatorDefaults, live: Live | None = None) -> Rendered:
    assert isinstance(choice.result, Plan) and choice.pool is not None
    plan, spec = choice.result, ctx.spec
    served_name = spec.model.served_name
    local = cache.model_path() if ctx.cache_claim else model_volume.model_path(spec)
    lora_runtime = lora_sync.runtime(spec, plan.config)
    modules = () if lora_runtime else lora_volumes.modules(spec, ctx.downloaded_adapters)
    args = render_vllm_args(plan, ServeOptions(served_model_name=served_name,
                                               revision=None if local else spec.model.revision,
                                               extra_args=tuple(spec.vllm.extra_args), model_path=local,
                                               lora_modules=modules, spec_args=spec.vllm.passed_args()))
    version = str(plan.config.vllm.version)
    host = host_memory(plan, spec.vllm.extra_args).total_gib
    fit = replicas_that_fit(plan.config, choice.pool) if choice.pool.nodes else None
    plan_status = convert.plan_status(plan, args, host_memory_gib=host, replicas_that_fit=fit)
    unknown = unknown_flags(args, version)
    if unknown:
        plan_status.warnings.append(f"vLLM {version} does not accept {', '.join(unknown)} (from spec.vllm)")
    products = choice.pool.products or tuple(plan.config.gpu.gfd_products)
    prometheus = (spec.autoscaling.prometheus_address or settings.prometheus_url) if spec.autoscaling else None
    inputs = WorkloadInputs(owner, spec, plan, tuple(args), spec.vllm.image or settings.default_image, products,
                            replicas=overrides.replicas, memory_limit_gib=overrides.memory_limit_gib,
                            host_memory_gib=host, prometheus_address=prometheus)
    inputs = dataclasses.replace(inputs, surge=rollout.can_surge(plan.config, choice.pool, inputs.replica_count),
                                 cache_claim=ctx.cache_claim, held=not ctx.cache_complete, lora_runtime=lora_runtime)
    workload = children(inputs, live or Live())
    return Rendered(plan, plan_status, workload.objects, inputs, plan_hash(inputs), workload.serving, workload.shape,
                    choice.pool)


def running(r: Rendered, ctx: Context) -> Running:
    """What runs, as remediation's ladder reads it: the rendered plan, with the spec's and the nodes' limits."""
    c, spec = r.plan.config, ctx.spec
    floors = spec.remediation.floors
    pool_max = max((p.gpus_per_node for p in ctx.pools if p.gpu.name == c.gpu.name), default=spec.gpu.max_gpus)
    return Running(
        config=c, workload=Workload(replicas=r.inputs.replica_count, memory_limit_gib=memory_limit_gib(r.inputs)),
        autoscaled=spec.autoscaling is not None,
        fp8_kv_allowed="fp8" in spec.serving.allowed_kv_cache_dtypes,
        max_gpus=min(spec.gpu.max_gpus, pool_max),
        max_replicas=min(spec.remediation.max_replicas or spec.replicas, MAX_REPLICAS),
        node_memory_gib=ctx.memory_of(r.pool) or memory_limit_gib(r.inputs),
        floor_max_model_len=ctx.floor_max_model_len,
        floor_gpu_memory_utilization=floors.min_gpu_memory_utilization,
        floor_max_num_seqs=floors.min_max_num_seqs, floor_max_num_batched_tokens=floors.min_max_num_batched_tokens,
        floor_max_loras=max(1, pinned_adapters(spec)),
    )


# ---- conditions -------------------------------------------------------------------------------------------

def ready_condition(deployment: dict[str, Any] | None, *, spec_replicas: int, max_replicas: int | None,
                    remediation: Any, autoscaled: bool = False) -> tuple[bool | None, str, str]:
    """Ready from the effective replica count (remediation's last override, else the spec's; the spec's alone
    when KEDA drives it). desired() is Ready's one writer (the Deployment watch triggers a reconcile)."""
    replicas = spec_replicas if autoscaled else effective_replicas(remediation, spec_replicas, max_replicas)
    return deployment_ready(deployment, replicas)


def observed_replicas(deployment: Mapping[str, Any] | None) -> dict[str, int]:
    """status.replicas and status.readyReplicas (the REPLICAS and AVAILABLE columns) from the workload's status:
    written with Ready."""
    observed = (deployment or {}).get("status") or {}
    return {"replicas": _int(observed.get("replicas")), "readyReplicas": _int(observed.get("availableReplicas"))}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def cache_condition(status: CacheStatus) -> tuple[bool, str, str]:
    """ModelCached: (status, reason, message). The status's message (why a try failed) follows what is said."""
    retrying = f"; {status.message}" if status.message else ""
    if status.state == "Complete":
        return True, "Cached", f"{status.total_bytes or status.bytes} bytes in PVC {status.claim_name}{retrying}"
    if status.state == "Failed":
        return False, "CacheFailed", status.message or f"the download into PVC {status.claim_name} failed"
    if status.state == "Downloading":
        shown = f"{status.percent}%" if status.percent is not None else f"{status.bytes} bytes"
        return False, "Downloading", (f"{shown} into PVC {status.claim_name}; no vLLM pod starts before it "
                                      f"completes{retrying}")
    return False, "Pending", f"waiting for the download Job of PVC {status.claim_name} to start{retrying}"


@dataclass(frozen=True)
class AdapterRefusal:
    reason: str
    message: str
    retry: bool


def adapter_refusal(spec: LLMDeploymentSpec, reading: AdapterReading) -> AdapterRefusal | None:
    """Why the reconciler must not deploy the adapters (None: it may): one api/lora.py refuses (the message
    admission gives), or an unreadable adapter (retried)."""
    if (refused := lora_refusal(spec, reading.configs)) is not None:
        return AdapterRefusal("LoRAAdapterRefused", refused, retry=False)
    if reading.errors:
        return AdapterRefusal("LoRAAdapterUnresolved", "; ".join(reading.errors), retry=True)
    return None


# ---- the Intent -------------------------------------------------------------------------------------------

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
class Asks:
    """What desired() needs read before it can decide, with what to read it for."""

    #: the model cache's state for these inputs, with the status recorded so far
    cache: cache.CacheInputs | None = None
    known_cache: CacheStatus | None = None
    #: the workload of the plan in force and remediation's evidence about it (the Target's deployment is the
    #: workload as read)
    workload: WorkloadAsk | None = None
    evidence: Target | None = None
    #: vLLM's own KV figures of the plan's Ready pods (plan verification)
    verification: VerificationAsk | None = None
    #: the burn-in of the plan in force's pods (spec.verification.burnIn), asked with the workload
    burn_in: BurnInAsk | None = None


@dataclass(frozen=True)
class BurnInAsk:
    """The plan whose pods' burn-in to read (their gate condition, and what the operator's runs measured)."""

    namespace: str
    name: str
    plan_hash: str


@dataclass(frozen=True)
class BurnInStart:
    """A burn-in run to start on a pod (controller/burn_in_load.py), on its own IP."""

    uid: str
    ip: str
    load: BurnInLoad


@dataclass(frozen=True)
class GateWrite:
    """The burn-in's readiness-gate condition to write on a pod (its status, strategic merge by type)."""

    pod: str
    condition: dict[str, Any]


@dataclass(frozen=True)
class VerificationAsk:
    """The plan whose Ready pods to read vLLM's KV figures from, and what status.verification already read."""

    namespace: str
    name: str
    plan_hash: str
    known: verify.Known | None


def known_verification(raw: Any, tolerance_percent: float) -> verify.Known | None:
    """Which plan and pods status.verification read (None: nothing readable, or judged with another tolerance
    than the spec's now: read again and judge again)."""
    if not isinstance(raw, dict):
        return None
    try:
        known = VerificationStatus.model_validate(raw)
    except ValueError:
        return None
    if known.plan_hash is None or known.tolerance_percent != tolerance_percent:
        return None
    return verify.Known(known.plan_hash, frozenset(p.pod for p in known.pods) | {s.pod for s in known.stages or ()})


@dataclass(frozen=True)
class LoRAAsk:
    """The spec's adapters and the plan in force, for the shell that loads and unloads them on the pods;
    ``waiting``: the s3:// adapters not downloaded yet (by name: why), which no pod is asked to load."""

    spec: LLMDeploymentSpec
    config: ServingConfig
    waiting: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Intent:
    """What one reconcile means to write: the objects (all or none), then the status (only the keys that
    change, the conditions among them) and the Events; ``step`` and ``pin`` are the status to record before
    the objects that carry them (remediation's step, the calibration chosen). ``asks``: not decided yet, read
    these first."""

    objects: list[dict[str, Any]] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    conditions: list[dict[str, Any]] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    step: dict[str, Any] | None = None
    #: status.kvCalibration's patch when the choice is new and the operator keeps a store, recorded with ``step``
    #: before the objects: a choice applied but unrecorded would be made again from the store as it is then
    pin: dict[str, Any] | None = None
    asks: Asks | None = None
    #: the workload to read again once the objects are written (the plan they carry)
    after: WorkloadAsk | None = None
    #: the LoRA adapters to bring the Ready pods to once the objects are written (controller/lora_runtime.py)
    lora: LoRAAsk | None = None
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
    #: the plans made ("feasible"/"infeasible") and remediation's steps taken ((signal, kind)), for the counters
    plans: list[str] = field(default_factory=list)
    counts: list[tuple[str, str]] = field(default_factory=list)
    #: log lines (warnings) the shell writes
    notes: list[str] = field(default_factory=list)
    #: vLLM's figures read this pass, as a sample for the calibration store (controller/calibration_store.py)
    calibration_sample: SampleToRecord | None = None
    #: the burn-in runs to start and the readiness-gate conditions to write, once the objects are written
    burn_in_starts: list[BurnInStart] = field(default_factory=list)
    gate_writes: list[GateWrite] = field(default_factory=list)
    #: the pods (uids) whose burn-in runs the operator still needs: the plan in force's whose verdict the status
    #: does not record yet; the object's other runs are dropped (None: not decided this pass, keep them all)
    burn_in_keep: tuple[str, ...] | None = None
    #: the plan chosen for the spec (with the overrides remediation recorded), once the planner found one: also on
    #: an Intent that asks, so the admission webhook has its verdict from the first round, and on one that a later
    #: cause stopped (spec.autoscaling, the source), so the webhook that admits it with a warning still gives the
    #: plan's own warnings
    plan: Plan | None = None


def desired(spec: Mapping[str, Any], status: Mapping[str, Any], world: World, now: datetime) -> Intent:
    """The Intent of one reconcile of the object ``world.owner`` whose spec is ``spec`` (as written) and status
    ``status`` (as read), at ``now``."""
    return _Pass(dict(status), world, now).run(dict(spec))


def _downloads_waiting(status: CacheStatus | None) -> dict[str, str]:
    """The s3:// adapters whose download into the cache is not complete, with what it is doing."""
    waiting: dict[str, str] = {}
    if status is None:
        return waiting
    for adapter in status.adapters or ():
        if adapter.state == "Complete":
            continue
        doing = (f"its download into PVC {status.claim_name} failed: {adapter.message}" if adapter.state == "Failed"
                 else f"downloading into PVC {status.claim_name} (Job {adapter.job_name}, {adapter.state}); served "
                      "once complete")
        waiting[adapter.name] = doing + (f"; {adapter.message}" if adapter.message and adapter.state != "Failed"
                                         else "")
    return waiting


def _changed(current: Mapping[str, Any], key: str, value: Any) -> bool:
    return bool(current.get(key) != value)


class _Ask(Exception):  # a control-flow signal: what to read first
    def __init__(self, asks: Asks) -> None:
        super().__init__("asks")
        self.asks = asks


class _Pass:
    """One pass over one object; collects the status changes and events."""

    def __init__(self, status: dict[str, Any], world: World, now: datetime) -> None:
        assert world.operator is not None, "the World names the operator's settings"
        self.world = world
        self.settings: OperatorDefaults = world.operator
        self.owner = world.owner
        self.generation = world.generation
        self.status = status
        self.out = Intent()
        self.now = now
        self.stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        self.conditions: list[dict[str, Any]] = list(status.get("conditions") or [])
        #: the remediation state as read, and as it stands now (None until the spec could be resolved)
        self.origin: RemediationState | None = None
        self.state: RemediationState | None = None
        self.repaired = False
        self.final: Rendered | None = None
        self.cache_status: CacheStatus | None = None
        #: a pod of the plan in force waits for its burn-in
        self.burning = False

    def condition(self, type_: str, value: bool | None, reason: str, message: str) -> None:
        self.conditions = set_condition(self.conditions, type_, value, reason, message,
                                        generation=self.generation, now=self.stamp)

    def event(self, type_: str, reason: str, message: str) -> None:
        self.out.events.append((type_, reason, message))

    def fail(self, reason: str, message: str, *, retry: bool = False) -> Intent:
        before = self.conditions
        self.condition(PLANNED, False, reason, message)
        if before != self.conditions:
            self.event("Warning", reason, message)
        self.out.retry = retry
        self.out.settled = reason in DETERMINISTIC_FAILURES
        self.out.objects = []
        self.out.step = self.out.pin = None
        return self.finish()

    def finish(self) -> Intent:
        if _changed(self.status, "conditions", self.conditions):
            self.out.status["conditions"] = self.conditions
        if _changed(self.status, "observedGeneration", self.generation):
            self.out.status["observedGeneration"] = self.generation
        if self.state is not None:
            self.state = self.state.attested(self.author)
            if self.state != self.origin or self.repaired:
                self.out.status["remediation"] = self.state.to_status()
        self.out.conditions = self.conditions
        return self.out

    @property
    def author(self) -> Author:
        return Author(self.owner.uid, self.generation or 0)

    def plan(self, ctx: Context, overrides: Overrides) -> PoolChoice:
        choice = plan_with(ctx, overrides)
        self.out.plans.append("feasible" if isinstance(choice.result, Plan) else "infeasible")
        return choice

    def read_state(self, ctx: Context) -> RemediationState:
        """The remediation state, only with the steps the operator recorded for this object, each clamped to
        the spec and to the nodes of the pool its overrides plan on."""
        raw = self.status.get("remediation")
        cap: float | None = None
        loose, _, _ = RemediationState.read_attributed(raw, limits(ctx), self.now, self.author)
        if loose.overrides.memory_limit_gib is not None:  # bounded by the planned pool's nodes, not the largest
            choice = self.plan(ctx, loose.overrides)
            if isinstance(choice.result, Plan) and choice.pool is not None:
                cap = ctx.memory_of(choice.pool) or None
        state, repairs, dropped = RemediationState.read_attributed(raw, limits(ctx, cap), self.now, self.author)
        self.out.notes += [f"{self.owner.namespace}/{self.owner.name}: {note}" for note in (*dropped, *repairs)]
        if dropped:  # written back without them, so this is said once
            self.event("Warning", "UnattributedRemediation", "; ".join(dropped))
        if repairs:
            self.event("Warning", "StatusRepaired", "; ".join(repairs))
        self.origin, self.state, self.repaired = state, state, bool(repairs or dropped)
        return state

    def run(self, spec_body: dict[str, Any]) -> Intent:
        try:
            return self.decide(spec_body)
        except _Ask as asked:
            return Intent(asks=asked.asks, plan=self.out.plan)

    def decide(self, spec_body: dict[str, Any]) -> Intent:
        world = self.world
        try:
            spec = LLMDeploymentSpec.model_validate(spec_body)
        except ValidationError as exc:
            return self.fail("InvalidSpec", validation_message(exc))
        if world.source is not None and world.source.failure is not None:
            return self.inspecting(world.source)
        self.report_source(world.source)
        if (refused := spec_refusal(spec, world.adapters.configs, self.settings.default_vllm_version)) is not None:
            return self.fail(*refused)
        if isinstance(world.model, Unresolved):
            return self.fail(world.model.reason, world.model.message, retry=world.model.retry)
        self.report_lora_sources(world.adapters)
        if world.adapters.inspecting is not None:
            return self.waiting_for_source(world.adapters.inspecting, world.adapters.objects,
                                           world.adapters.retry_delay)
        calibrations = Calibrations.of(spec_body, self.status, world.calibration, self.now,
                                       world.calibration_unreadable)
        try:
            ctx = context_of(spec, world, self.settings, calibrations)
        except UnknownGPUError as exc:
            return self.fail("UnknownGPU", str(exc))
        except VersionError as exc:
            return self.fail("UnsupportedVLLMVersion", str(exc))
        if (lora := adapter_refusal(spec, world.adapters)) is not None:
            return self.fail(lora.reason, lora.message, retry=lora.retry)
        state = self.read_state(ctx)
        choice = self.plan(ctx, state.overrides)
        if not isinstance(choice.result, Plan) and state.applied:
            # the spec changed so that remediation's overrides no longer fit: start again from the plan
            self.event("Normal", "RemediationReset", f"overrides no longer fit the spec: {choice.result.message}")
            state = self.state = state.reset()
            choice = self.plan(ctx, state.overrides)
        if not isinstance(choice.result, Plan) or choice.pool is None:
            message = choice.result.message if isinstance(choice.result, Infeasible) else "no GPU pool"
            return self.fail("Infeasible", message)
        self.out.plan = choice.result
        refusal = autoscaling_problem(ctx.spec, choice.result, choice.pool, prometheus_url=self.settings.prometheus_url,
                                      crds=world.crds)
        if refusal is None and not cache.enabled(ctx.spec):
            refusal = model_volume.unserved_source(ctx.spec)
        if refusal is not None:
            return self.fail(*refusal)
        cache_objects = self.observe_cache(ctx, choice.result)
        if self.cache_status is not None:
            ctx = dataclasses.replace(ctx, cache_claim=self.cache_status.claim_name,
                                      cache_complete=self.cache_status.state == "Complete",
                                      downloaded_adapters=frozenset(a.name for a in self.cache_status.adapters or ()
                                                                    if a.state == "Complete"))
        live = world.live_for(choice.result.config.nodes > 1)
        current = render(ctx, choice, state.overrides, self.owner, self.settings, live)
        view = self.workload_of(ctx, current, state)
        burn_signal = self.report_burn_in(ctx, current)
        final, decision = self.remediate(ctx, current, state, live, burn_signal)
        if world.applied is not None and world.applied.rejected is not None:
            # nothing was written (or a recorded step is applied next pass): a step whose objects the API
            # server refuses is not taken, nor reported
            return self.fail("ApplyRejected", clean_line(world.applied.rejected, MESSAGE_LIMIT))
        self.out.objects = cache_objects + final.objects
        self.out.step = decision.state.attested(self.author).to_status() if decision.changed else None
        self.out.after = _workload_ask(self.owner, final)
        self.final = final
        self.record(decision)
        if world.applied is not None:  # written: the workload as it is now
            view = world.applied.view
        self.report_plan(final, ctx, view)
        pin = self.report_calibration(final, calibrations)
        self.note_inputs(ctx, final, world.evidence)
        self.report_verification(final, ctx.spec.verification.tolerance_percent,
                                 pin.message if pin.ratio is not None else None)
        # without LoRA, status.lora goes (no pod is called)
        self.out.lora = LoRAAsk(ctx.spec, final.plan.config, _downloads_waiting(self.cache_status))
        self.report_cache()
        return self.finish()

    def report_source(self, found: SourceView | None) -> None:
        """status.source: what a pvc:// source's inspect Job or an s3:// source's reading found (removed when
        nothing was read)."""
        value = found.status.model_dump(by_alias=True, exclude_none=True) if found and found.status else None
        if _changed(self.status, "source", value):
            old = self.status.get("source")  # a merge patch: the fields it no longer has go as nulls
            self.out.status["source"] = {**dict.fromkeys(old), **value} if value and isinstance(old, dict) else value

    def inspecting(self, found: SourceView) -> Intent:
        """Planned=False while a pvc:// source is inspected or cannot be: only the inspect Job is applied."""
        self.report_source(found)
        assert found.failure is not None
        return self.waiting_for_source(found.failure, found.objects, found.retry_delay)

    def report_lora_sources(self, reading: AdapterReading) -> None:
        """status.loraSources: what the pvc:// adapters' inspect Jobs read (removed without such adapters)."""
        value = ([s.model_dump(by_alias=True, exclude_none=True) for s in reading.sources]
                 if reading.sources is not None else None)
        if _changed(self.status, "loraSources", value):
            self.out.status["loraSources"] = value

    def waiting_for_source(self, failure: tuple[str, str], objects: tuple[dict[str, Any], ...],
                           retry_delay: float) -> Intent:
        """Planned=False while a volume (the model's, a LoRA adapter's) is inspected or cannot be: only the inspect
        Jobs are applied."""
        applied = self.world.applied
        if applied is not None and applied.rejected is not None:
            return self.fail("ApplyRejected", clean_line(applied.rejected, MESSAGE_LIMIT), retry=True)
        self.out.retry_delay, self.out.retry_reason = retry_delay, failure[1][:200]
        reason, message = failure
        if reason != INSPECTING:
            self.fail(reason, message, retry=True)
        else:
            before = self.conditions
            self.condition(PLANNED, False, reason, message)
            if before != self.conditions:
                self.event("Normal", reason, message)
            self.out.retry = True
            self.finish()
        self.out.objects = list(objects)
        return self.out

    def observe_cache(self, ctx: Context, plan: Plan) -> list[dict[str, Any]]:
        """The cache's objects still to create, and its status (spec.model.cache); nothing without a cache."""
        if not cache.enabled(ctx.spec):
            return []
        inputs = cache.CacheInputs(ctx.spec, self.owner.namespace, self.settings.operator_image,
                                   rollout.checkpoint_bytes(plan.config), hub_endpoint=self.settings.hub_endpoint)
        seen = self.world.cache
        if seen is None or seen.inputs != inputs:
            previous = self.status.get("cache")
            try:
                known = CacheStatus.model_validate(previous) if isinstance(previous, dict) else None
            except ValueError:
                known = None
            raise _Ask(Asks(cache=inputs, known_cache=known))
        self.cache_status = seen.status
        return list(seen.objects)

    def workload_of(self, ctx: Context, current: Rendered, state: RemediationState) -> dict[str, Any] | None:
        """The workload of the plan in force as read (asked for, with remediation's evidence, if not yet)."""
        seen, evidence = self.world.workload, self.world.evidence
        wants_burn_in = _burns_in(ctx.spec, current)
        burned = self.world.burn_in
        if (seen is not None and seen.plan_hash == current.plan_hash and evidence is not None
                and (not wants_burn_in or (burned is not None and burned.plan_hash == current.plan_hash))):
            return seen.deployment
        policy = ctx.spec.remediation
        burn_in_ask = (BurnInAsk(self.owner.namespace, self.owner.name, current.plan_hash) if wants_burn_in
                       else None)
        raise _Ask(Asks(workload=_workload_ask(self.owner, current), burn_in=burn_in_ask, evidence=Target(
            namespace=self.owner.namespace, name=self.owner.name, plan_hash=current.plan_hash,
            replicas=state.effective_replicas(ctx.spec.replicas), deployment=None,
            last_evidence=state.last_evidence, kv_threshold=policy.kv_saturation_threshold,
            kv_window=policy.kv_saturation_window_seconds, lora=ctx.spec.lora is not None)))

    def report_burn_in(self, ctx: Context, r: Rendered) -> tuple[str, Classification] | None:
        """status.burnIn, BurnInPassed and the pods' readiness gates (desired/burn_in.py judges): a run started
        on each pod of the plan in force whose containers are ready, judged once it measured; a KV cache too
        small for the load is returned as remediation evidence (its key, its signal)."""
        spec = ctx.spec.verification.burn_in
        if spec is None or not _burns_in(ctx.spec, r):
            self.conditions = [c for c in self.conditions if c.get("type") != burn_in.BURN_IN_PASSED]
            if self.status.get("burnIn") is not None:
                self.out.status["burnIn"] = None
            self.out.burn_in_keep = ()
            return None
        seen = self.world.burn_in
        assert seen is not None and seen.plan_hash == r.plan_hash  # asked with the workload
        config = r.plan.config
        settings = burn_in.BurnInSettings(
            concurrency=spec.concurrency or ctx.spec.serving.expected_concurrency or 1, max_tokens=spec.max_tokens,
            timeout_seconds=float(spec.timeout_seconds), max_total_tokens=spec.max_total_tokens)
        load = burn_in.load_for(config, model=ctx.spec.model.served_name, port=VLLM_PORT, settings=settings)
        known = _known_burn_in(self.status.get("burnIn"), r.plan_hash)
        judged: list[tuple[str, burn_in.BurnInVerdict | None]] = []
        records: list[PodBurnInStatus] = []
        signal: tuple[str, Classification] | None = None
        # a pod is its own unit; a group across nodes is one: the load goes to its leader (rank 0, which serves
        # the API), the verdict is the group's and goes on every pod's gate, and the run costs every GPU of it
        units = burn_in.units(seen.pods, grouped=r.shape is not Shape.DEPLOYMENT)
        # the runs still needed: a verdict in status.burnIn is the record, the run's own result is not needed then
        self.out.burn_in_keep = tuple(leader.uid for leader, _ in units
                                      if leader is not None and leader.uid and leader.pod not in known)
        for leader, members in units:
            if leader is None:  # a group whose leader is not there yet: nothing to run, not passed either
                self.burning = True
                continue
            verdict = known.get(leader.pod)
            gate = next((p.gate for p in members if p.gate is not None), None)
            if verdict is None and leader.measurement is None and gate is not None:
                # judged before, its status.burnIn entry lost (an operator restarted since): the pod's gate is the
                # durable record; a pod let in may serve traffic already, so it is not run again
                verdict = burn_in.recorded_on_gate(leader.pod, gate)
            if verdict is None and leader.measurement is not None:
                verdict = burn_in.judge(leader.pod, load, leader.measurement,
                                        gpus=config.num_gpus if leader.rank is not None else config.gpus_per_pod,
                                        oom_killed_at=max((p.oom_killed_at for p in members if p.oom_killed_at),
                                                          default=None))  # a group's worker kills the engine too
                self.event("Normal" if verdict.passed else "Warning",
                           burn_in.BURN_IN_PASSED if verdict.passed else "BurnInFailed", verdict.message)
                if verdict.signal is not None and signal is None:
                    signal = burn_in.evidence_key(r.plan_hash, leader.pod), verdict.signal
            if verdict is not None:
                records.append(PodBurnInStatus(pod=leader.pod, passed=verdict.passed, reason=verdict.reason,
                                               message=verdict.message[:600], gpu_seconds=verdict.gpu_seconds))
                judged.append((leader.pod, verdict))
                for pod in members:
                    if pod.gate is not verdict.passed:
                        self.out.gate_writes.append(GateWrite(pod.pod, {
                            "type": BURN_IN_GATE, "status": "True" if verdict.passed else "False",
                            "reason": verdict.reason, "message": verdict.message[:1000],
                            "lastTransitionTime": self.stamp}))
                continue
            if leader.containers_ready and leader.ip and not leader.running:
                self.out.burn_in_starts.append(BurnInStart(leader.uid, leader.ip, load))
            if leader.containers_ready:
                judged.append((leader.pod, None))
            self.burning = True  # the next resync looks again (a run's end changes nothing the watches see)
        value = BurnInStatus(plan_hash=r.plan_hash, pods=tuple(records[:64])).model_dump(
            by_alias=True, mode="json")
        if _changed(self.status, "burnIn", value):
            self.out.status["burnIn"] = value
        self.condition(burn_in.BURN_IN_PASSED, *burn_in.condition(judged))
        return signal

    def report_calibration(self, r: Rendered, calibrations: Calibrations) -> KVCalibrationStatus:
        """status.kvCalibration: the calibrations this spec plans with (chosen once per spec, replicas aside)."""
        pin = calibrations.pin_for(_calibration_key(r), r.plan.estimate)
        value = pin.model_dump(by_alias=True, exclude_none=True, mode="json")
        if _changed(self.status, "kvCalibration", value):
            old = self.status.get("kvCalibration")  # a merge patch: the fields it no longer has go as nulls
            self.out.status["kvCalibration"] = {**dict.fromkeys(old), **value} if isinstance(old, dict) else value
            if calibrations.kept:  # recorded before the objects that plan with it (no store: nothing to choose)
                self.out.pin = self.out.status["kvCalibration"]
        return pin

    def report_verification(self, r: Rendered, tolerance: float, calibration: str | None) -> None:
        """status.verification and PlanVerified: the plan's Ready pods read once per plan (asked for, then
        judged by planner/verify.py); what they read is also a calibration sample. ``calibration``: what the
        plan applied (None: none)."""
        known = known_verification(self.status.get("verification"), tolerance)
        seen = self.world.verification
        if seen is None or seen.plan_hash != r.plan_hash:
            raise _Ask(Asks(verification=VerificationAsk(self.owner.namespace, self.owner.name, r.plan_hash, known)))
        config, version = r.plan.config, str(r.plan.config.vllm.version)
        uncalibrated = r.plan.estimate.uncalibrated_kv_bytes
        if config.pipeline_parallel_size > 1:  # groups across nodes: the engine and each stage
            group = verify.predict_group(config)
            uncalibrated = group.uncalibrated_kv_bytes
            decision = verify.decide_groups(group, r.plan_hash, known, seen.readings, vllm_version=version,
                                            now=self.now, tolerance_percent=tolerance)
        else:
            decision = verify.decide(verify.predict(config, r.plan.estimate), r.plan_hash, known, seen.readings,
                                     vllm_version=version, now=self.now, tolerance_percent=tolerance)
        if not decision.keep:
            found = VerificationStatus.of_pods(decision.results, plan_hash=r.plan_hash, calibration=calibration,
                                               stages=decision.stages)
            # a pod of another release measured another engine than the key's: it calibrates nothing
            self.out.calibration_sample = sample_of(_calibration_key(r), decision.results, uncalibrated,
                                                    f"{self.owner.namespace}/{self.owner.name}",
                                                    self.now) if decision.mismatch is None else None
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
            if decision.mismatch is not None:
                self.event("Warning", "VLLMVersionMismatch", decision.mismatch)
        if reason == verify.UNREADABLE:
            self.out.settled = False  # read again on the next resync

    def report_cache(self) -> None:
        status = self.cache_status
        if status is None:
            return
        value = status.model_dump(by_alias=True, exclude_none=True)
        if _changed(self.status, "cache", value):
            self.out.status["cache"] = value
        before = self.conditions
        self.condition(MODEL_CACHED, *cache_condition(status))
        if status.state == "Failed" and before != self.conditions:
            self.event("Warning", "CacheFailed", status.message)
        if status.state != "Complete":
            self.out.settled = False  # the next resync reads the download's progress again

    def note_inputs(self, ctx: Context, final: Rendered, evidence: Evidence | None) -> None:
        """For the quiet resync: whether this reconcile settled, until when, on which plan's pods."""
        state = self.state
        assert evidence is not None and state is not None
        self.out.plan_hash = final.plan_hash
        self.out.metrics = metrics_verdict(evidence.metrics, evidence.saturation is not None)
        policy = ctx.spec.remediation
        self.out.kv_question = (policy.kv_saturation_window_seconds, policy.kv_saturation_threshold)
        self.out.settled = not unsettled(evidence, state) and not self.burning
        self.out.due = next_due(state, ctx.spec.remediation, self.now, self.settings.full_check_seconds)

    def remediate(self, ctx: Context, current: Rendered, state: RemediationState, live: Live,
                  burn_signal: tuple[str, Classification] | None = None) -> tuple[Rendered, Decision]:
        """Let the pure decision speak on the evidence gathered (with a burn-in's failure): what should run, and
        why."""
        evidence = self.world.evidence
        assert evidence is not None
        if burn_signal is not None:
            evidence = dataclasses.replace(evidence, burn_in_key=burn_signal[0], burn_in=burn_signal[1])
        renders: dict[Overrides, Rendered] = {}

        def probe(overrides: Overrides) -> Probe:
            choice = self.plan(ctx, overrides)
            if not isinstance(choice.result, Plan):
                return Probe(False, problem=choice.result.message)
            renders[overrides] = render(ctx, choice, overrides, self.owner, self.settings, live)
            return Probe(True, changes=not renders[overrides].same_objects(current))

        decision = decide(evidence, state, ctx.spec.remediation, running(current, ctx), now=self.now, probe=probe)
        return (renders[decision.overrides] if decision.changed else current), decision

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
        self.out.counts += list(decision.counts)

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


def _burns_in(spec: LLMDeploymentSpec, r: Rendered) -> bool:
    """Whether the plan's pods carry the burn-in's readiness gate (a Deployment's pods, every pod of a group)."""
    return spec.verification.burn_in is not None


def _known_burn_in(raw: Any, plan_hash: str) -> dict[str, burn_in.BurnInVerdict]:
    """The verdicts status.burnIn holds for this plan's pods (none for another plan, or an unreadable one)."""
    if not isinstance(raw, dict):
        return {}
    try:
        known = BurnInStatus.model_validate(raw)
    except ValueError:
        return {}
    if known.plan_hash != plan_hash:
        return {}
    return {p.pod: burn_in.BurnInVerdict(p.pod, p.passed, p.reason, p.message, p.gpu_seconds) for p in known.pods}


def _calibration_key(r: Rendered) -> CalibrationKey:
    config = r.plan.config
    return key_of(config.gpu.display_name, config.vllm.version, config.model)


def _workload_ask(owner: Owner, r: Rendered) -> WorkloadAsk:
    return WorkloadAsk(r.shape, owner.name, owner.namespace, r.plan_hash, r.inputs.replica_count, r.nodes)
