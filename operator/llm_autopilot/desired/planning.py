"""Planning and rendering for one candidate: the Context one reconcile learned (the pools, the requests per
pool, the nodes' memory) and a plan rendered into the objects that run it. Shared by the sections below the
pipeline; it decides no status."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llm_autopilot.api import convert
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec, PlanStatus
from llm_autopilot.catalog.gpus import gpu_from_labels
from llm_autopilot.desired import lora_sync
from llm_autopilot.desired.calibration import Calibrations
from llm_autopilot.desired.startup_probe import StartupBudgets, start_key
from llm_autopilot.desired.vocabulary import Draft, WorkloadAsk
from llm_autopilot.desired.world import OperatorDefaults, Unresolved, World
from llm_autopilot.planner.calibration import CalibrationKey, key_of
from llm_autopilot.planner.plan import Plan, PlanRequest
from llm_autopilot.planner.pools import GPUPool, PoolChoice, choose_pool, replicas_that_fit
from llm_autopilot.planner.start_times import StartKey
from llm_autopilot.remediation.evidence import apply_overrides
from llm_autopilot.remediation.ladder import Overrides, max_model_len_floor
from llm_autopilot.remediation.state import Limits
from llm_autopilot.render import cache, compile_cache, lora_volumes, model_volume, rollout
from llm_autopilot.render.host_memory import host_memory
from llm_autopilot.render.kubernetes import Owner, WorkloadInputs, plan_hash
from llm_autopilot.render.vllm_args import (
    SHUTDOWN_TIMEOUT_FLAG,
    ServeOptions,
    has_shutdown_timeout,
    render_vllm_args,
    unknown_flags,
)
from llm_autopilot.render.workload import Live, Shape, children
from llm_autopilot.vllm.versions import VLLMVersion, behaviour_of


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
    #: the startup probe each plan takes (None: the formula's)
    startup: StartupBudgets | None = None

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
    #: the startup probe it runs with, and the key its starts are kept under
    startup: rollout.ProbeBudget | None = None
    startup_key: StartKey | None = None

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
    local = cache.model_path(spec) if ctx.cache_claim else model_volume.model_path(spec)
    lora_runtime = lora_sync.runtime(spec, plan.config)
    modules = () if lora_runtime else lora_volumes.modules(spec, ctx.downloaded_adapters)
    args = render_vllm_args(plan, ServeOptions(served_model_name=served_name,
                                               revision=None if local else spec.model.revision,
                                               extra_args=tuple(spec.vllm.extra_args), model_path=local,
                                               lora_modules=modules, spec_args=spec.vllm.passed_args(),
                                               drain_seconds=spec.vllm.drain_seconds))
    version = str(plan.config.vllm.version)
    host = host_memory(plan, spec.vllm.extra_args).total_gib
    fit = replicas_that_fit(plan.config, choice.pool) if choice.pool.nodes else None
    plan_status = convert.plan_status(plan, args, host_memory_gib=host, replicas_that_fit=fit)
    unknown = unknown_flags(args, version)
    if unknown:
        plan_status.warnings.append(f"vLLM {version} does not accept {', '.join(unknown)} (from spec.vllm)")
    if spec.vllm.drain_seconds and not has_shutdown_timeout(version):
        plan_status.warnings.append(f"vLLM {version} has no {SHUTDOWN_TIMEOUT_FLAG} (0.18 and later have it): a pod "
                                    "that stops aborts the requests in flight, whatever spec.vllm.drainSeconds says")
    products = choice.pool.products or tuple(plan.config.gpu.gfd_products)
    prometheus = (spec.autoscaling.prometheus_address or settings.prometheus_url) if spec.autoscaling else None
    inputs = WorkloadInputs(owner, spec, plan, tuple(args), spec.vllm.image or settings.default_image, products,
                            replicas=overrides.replicas, memory_limit_gib=overrides.memory_limit_gib,
                            host_memory_gib=host, prometheus_address=prometheus)
    compiled = compile_cache.volume_of(spec, owner.namespace, inputs.image, plan.config.gpu.display_name)
    inputs = dataclasses.replace(inputs, surge=rollout.can_surge(plan.config, choice.pool, inputs.replica_count),
                                 cache_claim=ctx.cache_claim, held=not ctx.cache_complete, lora_runtime=lora_runtime,
                                 compile_cache=compiled)
    digest = plan_hash(inputs)  # the probe is not part of it: the plan it is pinned to
    key = start_key(inputs.image, plan.config.model.model_id, plan.config.gpu.display_name,
                    downloads=inputs.downloads_weights)
    formula = inputs.formula_startup_seconds
    budget = (ctx.startup.budget(digest, key, formula, learns=plan.config.nodes == 1,
                                 download=rollout.download_seconds(plan.config) if inputs.downloads_weights else 0.0)
              if ctx.startup is not None else rollout.ProbeBudget(formula, formula))
    inputs = dataclasses.replace(inputs, startup_budget=budget.seconds)
    workload = children(inputs, live or Live(), settings.network_policy)
    return Rendered(plan, plan_status, workload.objects, inputs, digest, workload.serving, workload.shape,
                    choice.pool, budget, key)


def counted_plan(d: Draft, ctx: Context, overrides: Overrides) -> PoolChoice:
    """plan_with, counted in the Intent (the shell's counters and timings)."""
    choice = plan_with(ctx, overrides)
    d.out.plans.append("feasible" if isinstance(choice.result, Plan) else "infeasible")
    return choice


def calibration_key(r: Rendered) -> CalibrationKey:
    config = r.plan.config
    return key_of(config.gpu.display_name, config.vllm.version, config.model)


def workload_ask(owner: Owner, r: Rendered) -> WorkloadAsk:
    return WorkloadAsk(r.shape, owner.name, owner.namespace, r.plan_hash, r.inputs.replica_count, r.nodes)
