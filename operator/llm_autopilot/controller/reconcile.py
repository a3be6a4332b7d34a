"""One reconcile of an LLMDeployment: resolve, find GPUs, plan, render, apply, remediate, report.

Decisions are the pure modules' (planner, renderer, remediation ladder and guards, conditions); this
module sequences the I/O and turns failures into conditions. It never writes the spec, and writes
nothing when nothing changed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from llm_autopilot.api import convert
from llm_autopilot.api.conditions import DEGRADED, PLANNED, READY, deployment_ready, set_condition
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec, PlanStatus
from llm_autopilot.catalog.gpus import UnknownGPUError, find_gpu, gpu_from_labels
from llm_autopilot.controller import telemetry
from llm_autopilot.controller.kube import Kube
from llm_autopilot.controller.metrics import MetricsUnavailable, PrometheusSettings, PrometheusSignals
from llm_autopilot.controller.settings import OperatorSettings
from llm_autopilot.domain.gpu import GPUSpec
from llm_autopilot.domain.precision import KVCacheDtype
from llm_autopilot.hub.client import HubClient
from llm_autopilot.hub.resolve import ModelResolutionError, resolve_model
from llm_autopilot.planner.plan import Infeasible, Plan, PlanRequest
from llm_autopilot.planner.pools import GPUPool, PoolChoice, choose_pool, group_pools
from llm_autopilot.remediation.classify import Classification
from llm_autopilot.remediation.evidence import Evidence, apply_overrides, latest_crash
from llm_autopilot.remediation.guards import Policy, State, Verdict, backoff_after_signal, decide
from llm_autopilot.remediation.ladder import Candidate, Overrides, Running, candidates
from llm_autopilot.render.kubernetes import (
    CONTAINER,
    PLAN_HASH,
    Owner,
    WorkloadInputs,
    content_hash,
    memory_limit_gib,
    workload,
)
from llm_autopilot.render.vllm_args import ServeOptions, render_vllm_args, unknown_flags
from llm_autopilot.vllm.versions import VersionError, VLLMVersion, behaviour_of

METRICS_AVAILABLE = "MetricsAvailable"
HISTORY_LIMIT = 20


@dataclass
class Outcome:
    status: dict[str, Any] = field(default_factory=dict)  # only the keys that change
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    writes: int = 0
    retry: bool = False


def format_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "spec"
        parts.append(f"spec.{where}: {err['msg']}")
    return "; ".join(parts)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds(stamp: str | None) -> float | None:
    if not stamp:
        return None
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def _hub_client(spec: LLMDeploymentSpec, namespace: str, kube: Kube, settings: OperatorSettings) -> HubClient:
    token = None
    ref = spec.model.hub_token_secret_ref
    if ref is not None:
        token = kube.secret_value(namespace, ref.name, ref.key)
        if token is None:
            raise ModelResolutionError(f"Secret {ref.name!r} (key {ref.key!r}) for the Hub token was not found in "
                                       f"namespace {namespace}")
    return HubClient(token=token, timeout=settings.hub_timeout_seconds)


@dataclass
class Context:
    """What one reconcile learned about the world, reused for every candidate plan."""

    spec: LLMDeploymentSpec
    request_for: Callable[[GPUPool, Overrides], PlanRequest]
    pools: list[GPUPool]
    node_memory_gib: float


def context(spec: LLMDeploymentSpec, namespace: str, kube: Kube, settings: OperatorSettings) -> Context:
    """Resolve the model and the GPU pools the spec may use."""
    override = spec.model.architecture
    model = resolve_model(
        spec.model.name, revision=spec.model.revision,
        override=override.as_hf_config() if override else None,
        override_checkpoint_bytes=override.weight_bytes if override else None,
        variants=convert.variants(spec), client=_hub_client(spec, namespace, kube, settings),
    )
    behaviour = behaviour_of(VLLMVersion.parse(spec.vllm.version or settings.default_vllm_version))
    wanted = spec.gpu.node_selector or {}
    nodes = [n for n in kube.gpu_nodes() if all(n.labels.get(k) == v for k, v in wanted.items())]
    gpus = [(gpu, n) for n in nodes if (gpu := gpu_from_labels(n.labels))]
    pools = group_pools((gpu, n.labels["nvidia.com/gpu.product"], n.allocatable_gpus) for gpu, n in gpus)
    if spec.gpu.memory_gib is not None:
        gpu = GPUSpec.custom(spec.gpu.memory_gib, spec.gpu.compute_capability or "8.0")
        pools = [GPUPool(gpu, spec.gpu.max_gpus, (), 0)]
    elif spec.gpu.product:
        gpu = find_gpu(spec.gpu.product)
        pools = [p for p in pools if p.gpu.name == gpu.name] or [
            GPUPool(gpu, spec.gpu.max_gpus, tuple(sorted({*gpu.gfd_products, spec.gpu.product})), 0)]
    memory = max((n.allocatable_memory_gib for _, n in gpus), default=0.0)

    def request_for(pool: GPUPool, overrides: Overrides) -> PlanRequest:
        limit = pool.gpus_per_node if pool.nodes else None
        targets = apply_overrides(convert.targets(spec, max_gpus=limit), overrides)
        return PlanRequest(model, pool.gpu, behaviour, targets)

    return Context(spec, request_for, pools, memory)


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


def render(ctx: Context, choice: PoolChoice, overrides: Overrides, owner: Owner,
           settings: OperatorSettings) -> Rendered:
    assert isinstance(choice.result, Plan) and choice.pool is not None
    plan, spec = choice.result, ctx.spec
    served_name = spec.model.served_model_name or spec.model.name.removeprefix("hf://")
    args = render_vllm_args(plan, ServeOptions(served_model_name=served_name, revision=spec.model.revision,
                                               extra_args=tuple(spec.vllm.extra_args)))
    version = str(plan.config.vllm.version)
    plan_status = convert.plan_status(plan, args)
    unknown = unknown_flags(args, version)
    if unknown:
        plan_status.warnings.append(f"vLLM {version} does not accept {', '.join(unknown)} (from extraArgs)")
    products = choice.pool.products or tuple(plan.config.gpu.gfd_products)
    inputs = WorkloadInputs(owner, spec, plan, tuple(args), spec.vllm.image or settings.default_image, products,
                            replicas=overrides.replicas, memory_limit_gib=overrides.memory_limit_gib)
    return Rendered(plan, plan_status, workload(inputs), inputs)


def _running(r: Rendered, ctx: Context) -> Running:
    c, spec = r.plan.config, ctx.spec
    floors = spec.remediation.floors
    replicas = r.inputs.replicas if r.inputs.replicas is not None else spec.replicas
    pool_max = max((p.gpus_per_node for p in ctx.pools if p.gpu.name == c.gpu.name), default=spec.gpu.max_gpus)
    return Running(
        max_model_len=c.max_model_len, max_num_batched_tokens=c.max_num_batched_tokens, max_num_seqs=c.max_num_seqs,
        enforce_eager=c.enforce_eager, gpu_memory_utilization=c.gpu_memory_utilization,
        fp8_kv_cache=c.kv_cache_dtype is KVCacheDtype.FP8, gpus=c.num_gpus, replicas=replicas,
        memory_limit_gib=memory_limit_gib(r.inputs),
        fp8_kv_allowed="fp8" in spec.serving.allowed_kv_cache_dtypes,
        max_gpus=min(spec.gpu.max_gpus, pool_max), max_replicas=spec.remediation.max_replicas or spec.replicas,
        node_memory_gib=ctx.node_memory_gib or memory_limit_gib(r.inputs),
        floor_max_model_len=floors.min_max_model_len or spec.serving.min_max_model_len or 1,
        floor_gpu_memory_utilization=floors.min_gpu_memory_utilization,
        floor_max_num_seqs=floors.min_max_num_seqs, floor_max_num_batched_tokens=floors.min_max_num_batched_tokens,
    )


def _changed(current: dict[str, Any], key: str, value: Any) -> bool:
    return bool(current.get(key) != value)


class Reconciler:
    """One pass over one object; collects the status changes and events to report."""

    def __init__(self, *, name: str, namespace: str, uid: str, generation: int | None, status: dict[str, Any],
                 kube: Kube, settings: OperatorSettings) -> None:
        self.owner = Owner(name, namespace, uid)
        self.generation = generation
        self.status = status
        self.kube = kube
        self.settings = settings
        self.out = Outcome()
        self.stamp = now()
        self.conditions: list[dict[str, Any]] = list(status.get("conditions") or [])
        self.remediation: dict[str, Any] = dict(status.get("remediation") or {})

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
        return self.finish()

    def finish(self) -> Outcome:
        if _changed(self.status, "conditions", self.conditions):
            self.out.status["conditions"] = self.conditions
        if _changed(self.status, "observedGeneration", self.generation):
            self.out.status["observedGeneration"] = self.generation
        if self.remediation and _changed(self.status, "remediation", self.remediation):
            self.out.status["remediation"] = self.remediation
        return self.out

    def apply(self, rendered: Rendered) -> None:
        for obj in rendered.objects:
            self.out.writes += self.kube.apply(obj)

    def run(self, spec_body: dict[str, Any]) -> Outcome:
        try:
            spec = LLMDeploymentSpec.model_validate(spec_body)
        except ValidationError as exc:
            return self.fail("InvalidSpec", format_validation_error(exc))
        try:
            ctx = context(spec, self.owner.namespace, self.kube, self.settings)
        except UnknownGPUError as exc:
            return self.fail("UnknownGPU", str(exc))
        except VersionError as exc:
            return self.fail("UnsupportedVLLMVersion", str(exc))
        except ModelResolutionError as exc:
            return self.fail("ModelUnresolved", str(exc), retry=True)
        applied = list(self.remediation.get("applied") or [])
        overrides = Overrides.from_status(applied[-1]) if applied else Overrides()
        choice = plan_with(ctx, overrides)
        if not isinstance(choice.result, Plan) and applied:
            # the spec changed so that remediation's overrides no longer fit: start again from the plan
            self.event("Normal", "RemediationReset", f"overrides no longer fit the spec: {choice.result.message}")
            self.remediation = {"rung": 0, "applied": [], "history": self.remediation.get("history", [])}
            overrides = Overrides()
            choice = plan_with(ctx, overrides)
        if not isinstance(choice.result, Plan) or choice.pool is None:
            message = choice.result.message if isinstance(choice.result, Infeasible) else "no GPU pool"
            return self.fail("Infeasible", message)
        rendered = render(ctx, choice, overrides, self.owner, self.settings)
        self.apply(rendered)
        deployment = self.kube.get("apps/v1", "Deployment", self.owner.name, self.owner.namespace)
        remediated = self.remediate(ctx, rendered, overrides, deployment)
        if remediated is not rendered:  # a step or a relax rewrote the Deployment
            deployment = self.kube.get("apps/v1", "Deployment", self.owner.name, self.owner.namespace)
        self.report_plan(remediated, ctx, deployment)
        return self.finish()

    def report_plan(self, r: Rendered, ctx: Context, deployment: dict[str, Any] | None) -> None:
        plan_dict = r.status.model_dump(by_alias=True, exclude_none=True)
        if _changed(self.status, "plan", plan_dict):
            self.out.status["plan"] = plan_dict
            self.event("Normal", "Planned", f"{r.plan.summary}, {r.status.quantization} weights, "
                                            f"{r.status.kv_cache_dtype} KV, max_model_len {r.status.max_model_len}")
        memory = r.status.memory
        self.condition(PLANNED, True, "Planned", f"{r.plan.summary}: {memory.kv_cache_gib} GiB KV cache per GPU, "
                                                 f"{memory.max_concurrency}x concurrency at {r.status.max_model_len}")
        replicas = r.inputs.replicas if r.inputs.replicas is not None else ctx.spec.replicas
        self.condition(READY, *deployment_ready(deployment, replicas))
        if not any(c.get("type") == DEGRADED for c in self.conditions):
            self.condition(DEGRADED, False, "AsPlanned", "running the planned configuration")
        for warning in r.status.warnings:
            if warning not in ((self.status.get("plan") or {}).get("warnings") or []):
                self.event("Warning", "PlanWarning", warning)

    # --- remediation ---------------------------------------------------------------------------------

    def _signal(self, ctx: Context, r: Rendered) -> tuple[Classification | None, str | None, bool]:
        """(classification, evidence key, metrics usable)."""
        plan_hash = r.objects[0]["spec"]["template"]["metadata"]["annotations"][PLAN_HASH]
        pods = self.kube.pods(self.owner.namespace, f"app.kubernetes.io/instance={self.owner.name}")
        current_pods = [p["metadata"]["name"] for p in pods
                        if (p["metadata"].get("annotations") or {}).get(PLAN_HASH) == plan_hash]
        crash: Evidence | None = latest_crash(pods, container=CONTAINER, plan_hash=plan_hash,
                                              plan_hash_annotation=PLAN_HASH)
        if self.settings.prometheus_url:
            signals = PrometheusSignals(PrometheusSettings(self.settings.prometheus_url,
                                                           self.settings.prometheus_headers,
                                                           self.settings.prometheus_verify_tls))
            try:
                policy = ctx.spec.remediation
                kv = signals.kv_saturation(self.owner.namespace, self.owner.name,
                                           threshold=policy.kv_saturation_threshold,
                                           window=policy.kv_saturation_window_seconds, pods=current_pods)
            except MetricsUnavailable as exc:
                telemetry.PROMETHEUS_ERRORS.inc()
                self.condition(METRICS_AVAILABLE, False, "PrometheusUnreachable",
                               f"{exc}; remediation holds still until metrics return")
                return None, None, False
            self.condition(METRICS_AVAILABLE, True, "Queried", f"Prometheus at {self.settings.prometheus_url}")
            window = policy.kv_saturation_window_seconds
            last_step = _seconds(self.remediation.get("lastStepTime"))
            if last_step is not None and (_seconds(self.stamp) or 0) - last_step < window:
                kv = None  # the window must lie wholly after the last step: judge the new settings, not the old
            if kv is not None and (crash is None or crash.key == self.remediation.get("lastEvidence")):
                bucket = int((_seconds(self.stamp) or 0) // window)
                return kv, f"kv-saturation/{content_hash(r.status.args)}/{bucket}", True
        if crash is not None and crash.key != self.remediation.get("lastEvidence"):
            return crash.classification, crash.key, True
        return None, None, True

    def remediate(self, ctx: Context, r: Rendered, overrides: Overrides,
                  deployment: dict[str, Any] | None) -> Rendered:
        signal, key, metrics_ok = self._signal(ctx, r)
        if not metrics_ok:
            return r
        policy = ctx.spec.remediation
        guard_policy = Policy(policy.enabled, policy.cooldown_seconds, policy.max_steps, policy.stable_window_seconds)
        now_seconds = _seconds(self.stamp) or 0.0
        rem = self.remediation
        state = State(rung=int(rem.get("rung", 0)), last_step_at=_seconds(rem.get("lastStepTime")),
                      last_signal_at=_seconds(rem.get("lastSignalTime")),
                      last_relax_at=_seconds(rem.get("lastRelaxTime")), relax_backoff=int(rem.get("relaxBackoff", 1)))
        replicas = r.inputs.replicas if r.inputs.replicas is not None else ctx.spec.replicas
        status = (deployment or {}).get("status") or {}
        rollout_complete = (deployment is not None and int(status.get("updatedReplicas") or 0) >= replicas
                            and int(status.get("observedGeneration") or 0) >= int(
                                deployment["metadata"].get("generation") or 0))
        crash_of_current_plan = signal is not None and key is not None and not key.startswith("kv-saturation/")
        verdict = decide(now=now_seconds, policy=guard_policy, state=state,
                         signal_is_memory=None if signal is None else signal.signal.is_memory,
                         rollout_complete=rollout_complete or crash_of_current_plan)
        if signal is not None:
            rem["lastSignalTime"] = self.stamp
            rem["relaxBackoff"] = backoff_after_signal(state, now_seconds, guard_policy)
        rem.setdefault("rung", 0)
        rem["state"] = str(verdict)
        if verdict is Verdict.STEP and signal is not None and key is not None:
            return self._step(ctx, r, overrides, signal, key)
        if verdict is Verdict.RELAX:
            return self._relax(ctx, r)
        if signal is not None and key is not None and verdict in (Verdict.NOT_MEMORY, Verdict.OBSERVE_ONLY,
                                                                  Verdict.EXHAUSTED):
            reason = {Verdict.NOT_MEMORY: signal.signal.value, Verdict.OBSERVE_ONLY: "RemediationDisabled",
                      Verdict.EXHAUSTED: "RemediationExhausted"}[verdict]
            prefix = {Verdict.NOT_MEMORY: "", Verdict.OBSERVE_ONLY: "remediation is disabled; observed: ",
                      Verdict.EXHAUSTED: f"remediation exhausted after {state.rung} steps; still: "}[verdict]
            self.condition(DEGRADED, True, reason, prefix + signal.summary)
            if rem.get("lastEvidence") != key:
                rem["lastEvidence"] = key
                self.event("Warning", reason, prefix + signal.summary)
                if verdict is Verdict.EXHAUSTED:
                    telemetry.REMEDIATION_STEPS.labels(signal.signal.value, "exhausted").inc()
        return r

    def _history(self, signal: str, action: str, message: str, evidence: dict[str, str]) -> None:
        history = list(self.remediation.get("history") or [])
        history.append({"time": self.stamp, "rung": self.remediation["rung"], "signal": signal, "action": action,
                        "message": message[:500], "evidence": {k: v[:500] for k, v in evidence.items()}})
        self.remediation["history"] = history[-HISTORY_LIMIT:]

    def _step(self, ctx: Context, r: Rendered, overrides: Overrides, signal: Classification, key: str) -> Rendered:
        rem = self.remediation
        rem["lastEvidence"] = key
        tried = []
        for candidate in candidates(signal, _running(r, ctx), overrides):
            choice = plan_with(ctx, candidate.overrides)
            if not isinstance(choice.result, Plan):
                tried.append(f"{candidate.action}: {choice.result.message[:200]}")
                continue
            new = render(ctx, choice, candidate.overrides, self.owner, self.settings)
            if [o["metadata"]["annotations"] for o in new.objects] == [o["metadata"]["annotations"] for o in r.objects]:
                tried.append(f"{candidate.action}: changes nothing")
                continue
            return self._take(new, candidate, signal)
        message = f"{signal.summary}; no safer configuration fits" + (f" (tried: {'; '.join(tried)})" if tried else "")
        self.condition(DEGRADED, True, "RemediationExhausted", message)
        self.event("Warning", "RemediationExhausted", message)
        telemetry.REMEDIATION_STEPS.labels(signal.signal.value, "exhausted").inc()
        return r

    def _take(self, new: Rendered, candidate: Candidate, signal: Classification) -> Rendered:
        rem = self.remediation
        rem["rung"] = int(rem.get("rung", 0)) + 1
        rem["applied"] = [*list(rem.get("applied") or []), candidate.overrides.to_status()]
        rem["lastStepTime"] = self.stamp
        rem["state"] = str(Verdict.STEP)
        message = f"{signal.summary} -> {candidate.action}"
        self._history(signal.signal.value, candidate.action, message, signal.evidence)
        self.apply(new)
        self.condition(DEGRADED, False, "Remediated", f"rung {rem['rung']}: {message}")
        telemetry.REMEDIATION_STEPS.labels(signal.signal.value, "step").inc()
        self.event("Warning", "Remediated", f"rung {rem['rung']}: {message}")
        return new

    def _relax(self, ctx: Context, r: Rendered) -> Rendered:
        rem = self.remediation
        applied = list(rem.get("applied") or [])[:-1]
        overrides = Overrides.from_status(applied[-1]) if applied else Overrides()
        choice = plan_with(ctx, overrides)
        if not isinstance(choice.result, Plan):
            return r
        new = render(ctx, choice, overrides, self.owner, self.settings)
        rem["applied"], rem["rung"] = applied, len(applied)
        rem["lastRelaxTime"] = self.stamp
        message = f"calm for the stable window; relaxed to rung {rem['rung']}"
        self._history("Calm", "relax one rung", message, {"stableWindowSeconds": str(
            ctx.spec.remediation.stable_window_seconds * int(rem.get("relaxBackoff", 1)))})
        self.apply(new)
        self.condition(DEGRADED, False, "Relaxed" if applied else "AsPlanned", message)
        self.event("Normal", "Relaxed", message)
        telemetry.REMEDIATION_STEPS.labels("Calm", "relax").inc()
        return new


def reconcile(
    *, name: str, namespace: str, uid: str, generation: int | None, spec_body: dict[str, Any],
    status: dict[str, Any], kube: Kube, settings: OperatorSettings,
) -> Outcome:
    return Reconciler(name=name, namespace=namespace, uid=uid, generation=generation, status=status, kube=kube,
                      settings=settings).run(spec_body)
