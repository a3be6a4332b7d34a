"""``desired(spec, status, world, now) -> Intent``: one reconcile decided without I/O.

From the spec as written, the status as read, the World one gather step read (controller/gather.py) and the
clock, it gives the Intent: the objects to apply (all or none), the status patch with the conditions, the
Events, and the remediation step and the calibration chosen to record before the objects. What it needs read
first and has not been given -- the model cache's state for the chosen plan, the workload and remediation's
evidence for the plan in force, the plan's KV figures -- a section returns as Asks and the pipeline stops there;
the shell reads that, adds it to the World and asks again, so every decision stays here and the shell only reads
and writes. A refused apply, and the workload read again after a write, are given back the same way
(``World.applied``).

The only module that imports the sections (desired/sections/): it runs them in order over one Draft.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from llm_autopilot.api.errors import validation_message
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.catalog.gpus import UnknownGPUError
from llm_autopilot.desired.calibration import Calibrations
from llm_autopilot.desired.planning import context_of, counted_plan, render, workload_ask
from llm_autopilot.desired.refusals import autoscaling_problem, spec_refusal
from llm_autopilot.desired.sections import (
    burn_in,
    cache,
    canary,
    compile_cache,
    lora,
    network_policy,
    plan,
    remediation,
    source,
    startup_probe,
    verification,
)
from llm_autopilot.desired.startup_probe import StartupBudgets
from llm_autopilot.desired.vocabulary import MESSAGE_LIMIT, Asks, Draft, Intent
from llm_autopilot.desired.world import Unresolved, World
from llm_autopilot.planner.plan import Infeasible, Plan
from llm_autopilot.remediation.text import clean_line
from llm_autopilot.render import cache as cache_render
from llm_autopilot.render import model_volume
from llm_autopilot.vllm.versions import VersionError


def desired(spec: Mapping[str, Any], status: Mapping[str, Any], world: World, now: datetime) -> Intent:
    """The Intent of one reconcile of the object ``world.owner`` whose spec is ``spec`` (as written) and status
    ``status`` (as read), at ``now``."""
    return _decide(Draft(dict(status), world, now), dict(spec))


def _decide(d: Draft, spec_body: dict[str, Any]) -> Intent:
    world = d.world
    try:
        spec = LLMDeploymentSpec.model_validate(spec_body)
    except ValidationError as exc:
        return d.fail("InvalidSpec", validation_message(exc))
    # a policy left from before, once the switch is off: deleted whatever this pass decides (a failing plan
    # included), since a policy no longer rendered goes on cutting clients; a failing pass keeps its effects
    network_policy.report_network_policy(d)
    if world.source is not None and world.source.failure is not None:
        return source.inspecting(d, world.source)
    source.report_source(d, world.source)
    if (refused := spec_refusal(spec, world.adapters.configs, d.settings.default_vllm_version)) is not None:
        return d.fail(*refused)
    if isinstance(world.model, Unresolved):
        return d.fail(world.model.reason, world.model.message, retry=world.model.retry)
    lora.report_lora_sources(d, world.adapters)
    if world.adapters.inspecting is not None:
        return source.waiting_for_source(d, world.adapters.inspecting, world.adapters.objects,
                                         world.adapters.retry_delay)
    # the pin as read, even malformed: its own reader chooses again rather than take it for a spec planned before;
    # one set aside (not the operator's) is chosen again too
    calibrations = Calibrations.of(spec_body, d.status, world.calibration, d.now, world.calibration_unreadable,
                                   chosen_again="kvCalibration" in d.forged)
    try:
        ctx = context_of(spec, world, d.settings, calibrations)
    except UnknownGPUError as exc:
        return d.fail("UnknownGPU", str(exc))
    except VersionError as exc:
        return d.fail("UnsupportedVLLMVersion", str(exc))
    # the startup probe each plan takes: the pin of the plan in force, else learned from the store's starts
    ctx = dataclasses.replace(ctx, startup=StartupBudgets.of(
        d.status, world.calibration.starts if world.calibration is not None else None,
        d.settings.startup_probe_floor_seconds, d.now, chosen_again="startupProbe" in d.forged))
    if (refusal := lora.adapter_refusal(spec, world.adapters)) is not None:
        return d.fail(refusal.reason, refusal.message, retry=refusal.retry)
    state = remediation.read_state(d, ctx)
    if isinstance(state, Asks):  # a state the operator did not attest: does the workload run its plan?
        return d.asking(state)
    choice = counted_plan(d, ctx, state.overrides)
    if not isinstance(choice.result, Plan) and state.applied:
        # the spec changed so that remediation's overrides no longer fit: start again from the plan
        d.event("Normal", "RemediationReset", f"overrides no longer fit the spec: {choice.result.message}")
        state = d.state = state.reset()
        choice = counted_plan(d, ctx, state.overrides)
    if not isinstance(choice.result, Plan) or choice.pool is None:
        return d.fail("Infeasible", choice.result.message if isinstance(choice.result, Infeasible) else "no GPU pool")
    d.out.plan = choice.result
    unserved = autoscaling_problem(spec, choice.result, choice.pool, prometheus_url=d.settings.prometheus_url,
                                   crds=world.crds)
    if unserved is None and not cache_render.enabled(spec):
        unserved = model_volume.unserved_source(spec)
    if unserved is not None:
        return d.fail(*unserved)
    cache_objects = cache.observe_cache(d, spec, choice.result)
    if isinstance(cache_objects, Asks):
        return d.asking(cache_objects)
    if d.cache_status is not None:
        ctx = dataclasses.replace(ctx, cache_claim=d.cache_status.claim_name,
                                  cache_complete=d.cache_status.state == "Complete",
                                  downloaded_adapters=frozenset(a.name for a in d.cache_status.adapters or ()
                                                                if a.state == "Complete"))
    live = world.live_for(choice.result.config.nodes > 1)
    current = render(ctx, choice, state.overrides, d.owner, d.settings, live)
    # the after-plan features' asks still open, asked with the workload
    features = tuple(ask for ask in (burn_in.ask(d, spec, current), lora.ask(d, spec), canary.ask(d, spec, current))
                     if ask is not None)
    view = remediation.workload_of(d, spec, current, state, features)
    if isinstance(view, Asks):
        return d.asking(view)
    burn_signal = burn_in.report_burn_in(d, spec, current)
    final, decision = remediation.remediate(d, ctx, current, state, live, burn_signal)
    if world.applied is not None and world.applied.rejected is not None:
        # nothing was written (or a recorded step is applied next pass): a step whose objects the API
        # server refuses is not taken, nor reported
        return d.fail("ApplyRejected", clean_line(world.applied.rejected, MESSAGE_LIMIT))
    # a release change: the fleet held on the release it runs beside one canary pod of the new plan until it passed
    d.out.objects = cache_objects + compile_cache.objects(d, final) + canary.report_canary(d, spec, final, view)
    d.out.step = decision.state.attested(d.author).to_status() if decision.changed else None
    d.out.after = workload_ask(d.owner, final)
    remediation.record(d, decision, final)
    if world.applied is not None:  # written: the workload as it is now
        view = world.applied.view
    plan.report_plan(d, final, spec, view)
    startup_probe.report_startup_probe(d, final)
    pin = verification.report_calibration(d, final, calibrations)
    remediation.note_inputs(d, ctx, final)
    asks = verification.report_verification(d, final, spec.verification.tolerance_percent,
                                             pin.message if pin.ratio is not None else None)
    if asks is not None:
        return d.asking(asks)
    cache.report_cache(d)
    compile_cache.report_compile_cache(d, final)
    lora.report_lora(d, spec, final.plan.config)
    return d.finish()
