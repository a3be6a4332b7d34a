"""Section: status.burnIn, BurnInPassed and the pods' readiness gates (desired/burn_in.py judges): a run started on
each pod of the plan in force whose containers are ready, judged once it measured; a KV cache too small for the
load is remediation evidence."""

from __future__ import annotations

from llm_autopilot.api.conditions import without_condition
from llm_autopilot.api.v1alpha1 import BurnInStatus, LLMDeploymentSpec, PodBurnInStatus
from llm_autopilot.desired import burn_in
from llm_autopilot.desired.burn_in import BURN_IN, BurnInAsk, BurnInGateWrite, BurnInKeep, BurnInReading, BurnInStart
from llm_autopilot.desired.planning import Rendered
from llm_autopilot.desired.vocabulary import Draft
from llm_autopilot.domain.burn_in import BURN_IN_GATE
from llm_autopilot.remediation.classify import Classification
from llm_autopilot.render.vllm_args import VLLM_PORT
from llm_autopilot.render.workload import Shape


def known_burn_in(known: BurnInStatus | None, plan_hash: str) -> dict[str, burn_in.BurnInVerdict]:
    """The verdicts status.burnIn holds for this plan's pods (none for another plan)."""
    if known is None or known.plan_hash != plan_hash:
        return {}
    return {p.pod: burn_in.BurnInVerdict(p.pod, p.passed, p.reason, p.message, p.gpu_seconds) for p in known.pods}


def ask(d: Draft, spec: LLMDeploymentSpec, r: Rendered) -> BurnInAsk | None:
    """The burn-in of the plan in force's pods to read (asked with the workload), unless read or not asked for."""
    seen = d.world.reading(BurnInReading)
    if spec.verification.burn_in is None or (seen is not None and seen.plan_hash == r.plan_hash):
        return None
    return BurnInAsk(d.owner.namespace, d.owner.name, r.plan_hash)


def report_burn_in(d: Draft, spec: LLMDeploymentSpec, r: Rendered) -> tuple[str, Classification] | None:
    """The burn-in of the plan in force's pods (every shape's pods carry the gate when the spec asks for one);
    returns the KV-saturation evidence a failed run gave (its key, its signal)."""
    wanted = spec.verification.burn_in
    if wanted is None:
        d.conditions = without_condition(d.conditions, burn_in.BURN_IN_PASSED)
        d.put(BURN_IN, None)
        d.out.effects.append(BurnInKeep(()))
        return None
    seen = d.world.reading(BurnInReading)
    assert seen is not None and seen.plan_hash == r.plan_hash  # asked with the workload
    config = r.plan.config
    settings = burn_in.BurnInSettings(
        concurrency=wanted.concurrency or spec.serving.expected_concurrency or 1, max_tokens=wanted.max_tokens,
        timeout_seconds=float(wanted.timeout_seconds), max_total_tokens=wanted.max_total_tokens)
    load = burn_in.load_for(config, model=spec.model.served_name, port=VLLM_PORT, settings=settings)
    known = known_burn_in(d.read.burn_in, r.plan_hash)
    judged: list[tuple[str, burn_in.BurnInVerdict | None]] = []
    records: list[PodBurnInStatus] = []
    signal: tuple[str, Classification] | None = None
    # a pod is its own unit; a group across nodes is one: the load goes to its leader (rank 0, which serves
    # the API), the verdict is the group's and goes on every pod's gate, and the run costs every GPU of it
    units = burn_in.units(seen.pods, grouped=r.shape is not Shape.DEPLOYMENT)
    # the runs still needed: a verdict in status.burnIn is the record, the run's own result is not needed then
    keep = BurnInKeep(tuple(leader.uid for leader, _ in units
                            if leader is not None and leader.uid and leader.pod not in known))
    starts: list[BurnInStart] = []
    gates: list[BurnInGateWrite] = []
    for leader, members in units:
        if leader is None:  # a group whose leader is not there yet: nothing to run, not passed either
            d.waiting = True
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
            d.event("Normal" if verdict.passed else "Warning",
                    burn_in.BURN_IN_PASSED if verdict.passed else "BurnInFailed", verdict.message)
            if verdict.signal is not None and signal is None:
                signal = burn_in.evidence_key(r.plan_hash, leader.pod), verdict.signal
        if verdict is not None:
            records.append(PodBurnInStatus(pod=leader.pod, passed=verdict.passed, reason=verdict.reason,
                                           message=verdict.message[:600], gpu_seconds=verdict.gpu_seconds))
            judged.append((leader.pod, verdict))
            for pod in members:
                if pod.gate is not verdict.passed:
                    gates.append(BurnInGateWrite(pod.pod, {
                        "type": BURN_IN_GATE, "status": "True" if verdict.passed else "False",
                        "reason": verdict.reason, "message": verdict.message[:1000],
                        "lastTransitionTime": d.stamp}))
            continue
        if leader.containers_ready and leader.ip and not leader.running:
            starts.append(BurnInStart(leader.uid, leader.ip, load))
        if leader.containers_ready:
            judged.append((leader.pod, None))
        d.waiting = True  # the next resync looks again (a run's end changes nothing the watches see)
    d.out.effects += [*starts, keep, *gates]  # the runs started and kept, then the gates written
    d.put(BURN_IN, BurnInStatus(plan_hash=r.plan_hash, pods=tuple(records[:64])))
    d.condition(burn_in.BURN_IN_PASSED, *burn_in.condition(judged))
    return signal
