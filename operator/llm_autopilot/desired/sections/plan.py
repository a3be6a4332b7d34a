"""Section: status.plan, Planned, Ready and Degraded's default, the observed replicas and the scale selector."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llm_autopilot.api.conditions import DEGRADED, PLANNED, READY, deployment_ready, get_condition
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.desired.planning import Rendered
from llm_autopilot.desired.status_fields import PLAN, READY_REPLICAS, REPLICAS, SELECTOR
from llm_autopilot.desired.vocabulary import Draft
from llm_autopilot.remediation.state import effective_replicas
from llm_autopilot.render.kubernetes import label_selector


def ready_condition(deployment: dict[str, Any] | None, *, spec_replicas: int, max_replicas: int | None,
                    remediation: Any, autoscaled: bool = False) -> tuple[bool | None, str, str]:
    """Ready from the effective replica count (remediation's last override, else the spec's; the spec's alone
    when KEDA drives it). desired() is Ready's one writer (the Deployment watch triggers a reconcile)."""
    replicas = spec_replicas if autoscaled else effective_replicas(remediation, spec_replicas, max_replicas)
    return deployment_ready(deployment, replicas)


def observed_replicas(deployment: Mapping[str, Any] | None) -> tuple[int, int]:
    """status.replicas and status.readyReplicas (the REPLICAS and AVAILABLE columns) from the workload's status:
    written with Ready."""
    observed = (deployment or {}).get("status") or {}
    return _int(observed.get("replicas")), _int(observed.get("availableReplicas"))


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def report_plan(d: Draft, r: Rendered, spec: LLMDeploymentSpec, deployment: dict[str, Any] | None) -> None:
    """status.plan (an Event when it changes), Planned, Ready from the workload as read, the replicas and the
    selector; Degraded=False unless remediation said otherwise; an Event per new plan warning."""
    if d.read.plan != r.status:
        d.put(PLAN, r.status)
        d.event("Normal", "Planned", f"{r.plan.summary}, {r.status.quantization} weights, "
                                     f"{r.status.kv_cache_dtype} KV, max_model_len {r.status.max_model_len}")
    memory = r.status.memory
    d.condition(PLANNED, True, "Planned", f"{r.plan.summary}: {memory.kv_cache_gib} GiB KV cache per GPU, "
                                          f"{memory.max_concurrency}x concurrency at {r.status.max_model_len}")
    remediation = d.state.to_status() if d.state is not None else None
    d.condition(READY, *ready_condition(deployment, spec_replicas=spec.replicas,
                                        max_replicas=spec.remediation.max_replicas,
                                        remediation=remediation, autoscaled=spec.autoscaling is not None))
    replicas, ready = observed_replicas(deployment)
    d.put(REPLICAS, replicas)
    d.put(READY_REPLICAS, ready)
    d.put(SELECTOR, label_selector(r.serving_selector))
    if get_condition(d.conditions, DEGRADED) is None:
        d.condition(DEGRADED, False, "AsPlanned", "running the planned configuration")
    for warning in r.status.warnings:
        if d.read.plan is None or warning not in d.read.plan.warnings:
            d.event("Warning", "PlanWarning", warning)
