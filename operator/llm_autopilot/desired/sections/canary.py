"""Section: status.canary, UpgradeHeld and the fleet's and the canary's Deployments (desired/canary.py judges): a
change of the vLLM release or image runs one pod of the new plan (``<name>-canary``) before the fleet rolls."""

from __future__ import annotations

from typing import Any

from llm_autopilot.api.conditions import deployment_ready, without_condition
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.desired import canary
from llm_autopilot.desired.canary import CANARY, CanaryAsk, CanaryDelete, CanaryInputs, CanaryReading, Release
from llm_autopilot.desired.planning import Rendered
from llm_autopilot.desired.vocabulary import Draft
from llm_autopilot.render import canary as render_canary
from llm_autopilot.render.workload import Shape


def ask(d: Draft, spec: LLMDeploymentSpec, r: Rendered) -> CanaryAsk | None:
    """The canary to read (asked with the workload), only where it can matter: status.canary is there (even one
    set aside as forged: its canary may still run), or the fleet's Deployment, once read, runs another release
    than the spec's. A pass with no release change reads nothing more; a workload of groups across nodes has no
    canary."""
    if r.shape is not Shape.DEPLOYMENT or d.world.reading(CanaryReading) is not None:
        return None
    if CANARY.key not in d.raw:
        seen = d.world.workload
        if not spec.rollout.canary or seen is None:  # the fleet's release is known once the workload is read
            return None
        fleet = _fleet_release(d, seen.deployment)
        if fleet is None or fleet == _wanted(r):
            return None
    return CanaryAsk(d.owner.namespace, d.owner.name)


def _wanted(r: Rendered) -> Release:
    """The release the spec asks for: the plan's vLLM version and the image its pods run."""
    return Release(str(r.plan.config.vllm.version), r.inputs.image)


def _fleet_release(d: Draft, live: dict[str, Any] | None) -> Release | None:
    """What the fleet's Deployment runs: its pod template's image, and the version its Deployment was rendered for
    (a Deployment from before the annotation: the plan in force's, status.plan)."""
    image = render_canary.template_image(live)
    if image is None:
        return None
    version = render_canary.deployment_version(live) or (d.read.plan.vllm_version if d.read.plan else None)
    return None if version is None else Release(version, image)


def report_canary(d: Draft, spec: LLMDeploymentSpec, r: Rendered, live: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The objects to apply: ``r.objects`` with the fleet's Deployment held on the pod template it runs and the
    canary's added while a release change is judged; status.canary, UpgradeHeld, the canary's Events, and its
    deletion once it is no longer wanted."""
    seen = d.world.reading(CanaryReading)
    fleet = next((o for o in r.objects if o["kind"] == "Deployment" and o["metadata"]["name"] == d.owner.name),
                 None)
    if seen is None or fleet is None:  # not a Deployment's workload: no canary
        d.put(CANARY, None)
        d.conditions = without_condition(d.conditions, canary.UPGRADE_HELD)
        return r.objects
    replicas = r.inputs.replica_count
    decision = canary.decide(CanaryInputs(
        fleet=_fleet_release(d, live), wanted=_wanted(r),
        plan_hash=r.plan_hash, enabled=spec.rollout.canary and not r.inputs.held, replicas=replicas,
        fleet_ready=deployment_ready(live, replicas)[0] is True, surge_room=r.inputs.surge,
        startup_seconds=r.inputs.startup_seconds, now=d.now, known=d.read.canary, pod=seen.pod,
        canary_exists=seen.uid is not None, verification=d.read.verification, burn_in=d.read.burn_in,
        burn_in_wanted=spec.verification.burn_in is not None))
    # KEDA owns the replicas of an autoscaled fleet: the canary does not move them
    fleet_replicas = fleet["spec"]["replicas"] if spec.autoscaling is not None else decision.fleet_replicas
    if decision.fleet == "old" and seen.fleet_template is not None and decision.status is not None:
        objects_fleet = render_canary.held_fleet(fleet, seen.fleet_template, fleet_replicas,
                                                 version=decision.status.from_vllm_version or "")
    else:
        objects_fleet = render_canary.with_replicas(fleet, fleet_replicas)
    objects = [objects_fleet if o is fleet else o for o in r.objects]
    if decision.canary:
        objects.append(render_canary.canary_deployment(fleet))
    elif seen.uid is not None:
        d.out.effects.append(CanaryDelete(render_canary.canary_name(d.owner.name), seen.uid))
    d.put(CANARY, decision.status)
    if decision.held is not None:
        d.condition(canary.UPGRADE_HELD, *decision.held)
    else:
        d.conditions = without_condition(d.conditions, canary.UPGRADE_HELD)
    if decision.event is not None:
        d.event(*decision.event)
    if decision.status is not None and decision.status.phase != "Failed":
        d.waiting = True  # the canary's readings (its verification, its burn-in) come on later passes
    return objects
