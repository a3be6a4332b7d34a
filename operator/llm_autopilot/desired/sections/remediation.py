"""Section: status.remediation, Degraded and remediation's Events (remediation/decide.py decides on the evidence
gathered for the plan in force), and what the quiet resync needs to know about this pass."""

from __future__ import annotations

import dataclasses
from typing import Any

from llm_autopilot.api.lora import pinned_adapters
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.desired.planning import Context, Rendered, counted_plan, limits, render, workload_ask
from llm_autopilot.desired.remediation_adoption import RunningPlan, RunningPlanAsk
from llm_autopilot.desired.schedule import metrics_verdict, next_due, unsettled
from llm_autopilot.desired.vocabulary import Asks, Draft
from llm_autopilot.desired.world import Target
from llm_autopilot.planner.plan import Plan
from llm_autopilot.remediation.classify import Classification
from llm_autopilot.remediation.decide import Decision, Probe, decide
from llm_autopilot.remediation.ladder import Overrides, Running, Workload
from llm_autopilot.remediation.state import MAX_REPLICAS, RemediationState
from llm_autopilot.render import rollout
from llm_autopilot.render.kubernetes import memory_limit_gib
from llm_autopilot.render.workload import Live, Shape


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


def read_state(d: Draft, ctx: Context) -> RemediationState | Asks:
    """The remediation state, only with the steps the operator recorded for this object, each clamped to
    the spec and to the nodes of the pool its overrides plan on. A state without the operator's attestation
    (status.attestations) keeps its rungs only if the workload runs exactly their plan (``_adopted``), else it is
    dropped; either is said once."""
    raw = d.status.get("remediation")
    if "remediation" in d.forged:
        adopted = _adopted(d, ctx, d.raw.get("remediation"))
        if isinstance(adopted, Asks):
            return adopted
        raw = adopted.to_status() if adopted is not None else None
    cap: float | None = None
    loose, _, _ = RemediationState.read_attributed(raw, limits(ctx), d.now, d.author)
    if loose.overrides.memory_limit_gib is not None:  # bounded by the planned pool's nodes, not the largest
        choice = counted_plan(d, ctx, loose.overrides)
        if isinstance(choice.result, Plan) and choice.pool is not None:
            cap = ctx.memory_of(choice.pool) or None
    state, repairs, dropped = RemediationState.read_attributed(raw, limits(ctx, cap), d.now, d.author)
    d.out.notes += [f"{d.owner.namespace}/{d.owner.name}: {note}" for note in (*dropped, *repairs)]
    if dropped:  # written back without them, so this is said once
        d.event("Warning", "UnattributedRemediation", "; ".join(dropped))
    if repairs:
        d.event("Warning", "StatusRepaired", "; ".join(repairs))
    d.origin, d.state, d.repaired = state, state, bool(repairs or dropped or "remediation" in d.forged)
    return state


def _adopted(d: Draft, ctx: Context, raw: Any) -> RemediationState | Asks | None:
    """A state read without the operator's attestation: its applied rungs (re-attested) if the workload runs
    exactly their plan, else None (dropped). What the workload cannot prove starts afresh: the step's time is
    now (so no relax and no cooldown is shortened by a written time), no last evidence, the relax backoff at 1;
    the history is kept as the report it is."""
    written, _ = RemediationState.read(raw, limits(ctx), d.now)
    where = f"{d.owner.namespace}/{d.owner.name}"
    said = "status.remediation is not attested by this operator (written by someone else, by a release before " \
           "it was attested, or by an operator without this key)"
    runs: Rendered | None = None
    if written.applied:
        choice = counted_plan(d, ctx, written.overrides)
        if isinstance(choice.result, Plan):
            runs = render(ctx, choice, written.overrides, d.owner, d.settings,
                          d.world.live_for(choice.result.config.nodes > 1))
    if runs is not None:
        seen = d.world.reading(RunningPlan)
        if seen is None or seen.plan_hash != runs.plan_hash:
            return Asks(features=(RunningPlanAsk(workload_ask(d.owner, runs)),))
        if seen.running:
            message = (f"{said}; its {len(written.applied)} applied rung(s) are kept, since the workload runs "
                       "exactly their plan")
            d.event("Warning", "RemediationAdopted", message)
            d.out.notes.append(f"{where}: {message}")
            rungs = tuple(entry.model_copy(update={"generation": None, "attestation": None})
                          for entry in written.applied)  # attested anew, under this generation
            return RemediationState(rung=written.rung, applied=rungs, history=written.history,
                                    last_step_time=d.now, state=written.state).attested(d.author)
    message = f"{said}: dropped, not applied (the workload does not run its plan)" if written.applied else \
        f"{said}: dropped"
    d.event("Warning", "UnattributedRemediation", message)
    d.out.notes.append(f"{where}: {message}")
    return None


def workload_of(d: Draft, spec: LLMDeploymentSpec, current: Rendered, state: RemediationState,
                features: tuple[object, ...] = ()) -> dict[str, Any] | Asks | None:
    """The workload of the plan in force as read, or the Asks for it with remediation's evidence (and the
    after-plan features' asks still open, ``features``: they are asked with the workload)."""
    seen, evidence = d.world.workload, d.world.evidence
    if seen is not None and seen.plan_hash == current.plan_hash and evidence is not None and not features:
        return seen.deployment
    policy = spec.remediation
    return Asks(workload=workload_ask(d.owner, current), features=features, evidence=Target(
        namespace=d.owner.namespace, name=d.owner.name, plan_hash=current.plan_hash,
        replicas=state.effective_replicas(spec.replicas), deployment=None,
        last_evidence=state.last_evidence, kv_threshold=policy.kv_saturation_threshold,
        kv_window=policy.kv_saturation_window_seconds, lora=spec.lora is not None))


def remediate(d: Draft, ctx: Context, current: Rendered, state: RemediationState, live: Live,
              burn_signal: tuple[str, Classification] | None = None) -> tuple[Rendered, Decision]:
    """Let the pure decision speak on the evidence gathered (with a burn-in's failure): what should run, and
    why."""
    evidence = d.world.evidence
    assert evidence is not None
    if burn_signal is not None:
        evidence = dataclasses.replace(evidence, burn_in_key=burn_signal[0], burn_in=burn_signal[1])
    renders: dict[Overrides, Rendered] = {}

    def probe(overrides: Overrides) -> Probe:
        choice = counted_plan(d, ctx, overrides)
        if not isinstance(choice.result, Plan):
            return Probe(False, problem=choice.result.message)
        renders[overrides] = render(ctx, choice, overrides, d.owner, d.settings, live)
        return Probe(True, changes=not renders[overrides].same_objects(current),
                     plan_hash=renders[overrides].plan_hash)

    decision = decide(evidence, state, ctx.spec.remediation, running(current, ctx), now=d.now, probe=probe)
    return (renders[decision.overrides] if decision.changed else current), decision


def outage(decision: Decision, reason: str, final: Rendered) -> str:
    """What a step's rollout costs, added to its Event when it cannot surge onto a free GPU."""
    if reason != "Remediated" or not decision.changed or final.inputs.surge:
        return ""
    if final.shape is not Shape.DEPLOYMENT:
        return "; pods across nodes are replaced group by group, so capacity drops during the rollout"
    return rollout.outage_note(final.inputs.replica_count)


def record(d: Draft, decision: Decision, final: Rendered) -> None:
    """The decision's state, conditions, events, counters and recoveries, once its objects are written."""
    d.state = decision.state
    for c in decision.conditions:
        d.condition(c.type, c.status, c.reason, c.message)
    for note in decision.events:
        d.event(note.type, note.reason, note.message + outage(decision, note.reason, final))
    d.out.counts += list(decision.counts)
    d.out.recoveries += list(decision.recoveries)


def note_inputs(d: Draft, ctx: Context, final: Rendered) -> None:
    """For the quiet resync: whether this reconcile settled, until when, on which plan's pods."""
    state, evidence = d.state, d.world.evidence
    assert evidence is not None and state is not None
    d.out.plan_hash = final.plan_hash
    d.out.metrics = metrics_verdict(evidence.metrics, evidence.saturation is not None)
    policy = ctx.spec.remediation
    d.out.kv_question = (policy.kv_saturation_window_seconds, policy.kv_saturation_threshold)
    d.out.settled = not unsettled(evidence, state) and not d.waiting
    d.out.due = next_due(state, ctx.spec.remediation, d.now, d.settings.full_check_seconds)
