"""The pure remediation decision, scenario by scenario (the e2e tests prove the same stories in a cluster)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from llm_autopilot.api.v1alpha1 import RemediationEvent, RemediationPolicy
from llm_autopilot.remediation.classify import Classification, Signal
from llm_autopilot.remediation.decide import Decision, Evidence, Metrics, Probe, decide
from llm_autopilot.remediation.evidence import Termination, classify_crash, latest_crash
from llm_autopilot.remediation.ladder import Overrides, Running
from llm_autopilot.remediation.state import RemediationState
from llm_autopilot.render.kubernetes import CONTAINER, PLAN_HASH, plan_hash
from tests.unit.test_layering import PACKAGE, SHELLS, _imports
from tests.unit.test_remediation import CUDA_RUNTIME, CUDA_STARTUP, V033_KV, running
from tests.unit.test_render import inputs as render_inputs

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
LONG_AGO = NOW - timedelta(days=1)


def crash(message: str = "", *, reason: str = "Error", exit_code: int = 1, pod: str = "qwen-1",
          restarts: int = 1) -> Evidence:
    t = Termination(pod, restarts, reason, exit_code, message or None, "2026-12-01T11:59:00Z")
    return Evidence(crash=classify_crash(t))


OOM = crash(reason="OOMKilled", exit_code=137)


def oom_of_a_pod_at(limit_gib: float, *, current_gib: float) -> Evidence:
    """What the gatherer finds when the only OOM kill is of a pod rendered with ``limit_gib`` while the plan in
    force has ``current_gib`` (the same vLLM args: a memory step changes only the limit)."""
    base = render_inputs()
    pod = {"metadata": {"name": "qwen-old", "annotations": {
               PLAN_HASH: plan_hash(dataclasses.replace(base, memory_limit_gib=limit_gib))}},
           "status": {"containerStatuses": [{"name": CONTAINER, "restartCount": 2, "lastState": {"terminated": {
               "reason": "OOMKilled", "exitCode": 137, "finishedAt": "2026-12-01T11:59:30Z"}}}]}}
    current = plan_hash(dataclasses.replace(base, memory_limit_gib=current_gib))
    return Evidence(crash=latest_crash([pod], container=CONTAINER, plan_hash=current, plan_hash_annotation=PLAN_HASH),
                    plan_id=current)
SATURATED = Evidence(saturation=Classification(Signal.KV_SATURATION, "KV cache usage 97% for 300s",
                                               evidence={"query": "q", "value": "0.970", "source": "prometheus"}),
                     metrics=Metrics.AVAILABLE, metrics_detail="Prometheus at http://p", plan_id="abc")


def stepped(rung: int = 1, *, at: datetime = LONG_AGO, **fields: Any) -> RemediationState:
    state = RemediationState()
    for i in range(rung):
        state = state.with_step(Overrides(fp8_kv_cache=True) if i == 0 else Overrides(fp8_kv_cache=True, replicas=2),
                                at, RemediationEvent(time=at, rung=i + 1, signal="KVSaturation", action="a",
                                                     message=""))
    return state.model_copy(update=fields)


def policy(**changes: Any) -> RemediationPolicy:
    return RemediationPolicy.model_validate({"cooldownSeconds": 600, "maxSteps": 3, "stableWindowSeconds": 3600,
                                             "kvSaturationWindowSeconds": 300, **changes})


@dataclass(frozen=True)
class Case:
    evidence: Evidence
    state: RemediationState = field(default_factory=RemediationState)
    policy: RemediationPolicy = field(default_factory=policy)
    running: Running = field(default_factory=running)
    fits: bool = True
    # expected
    verdict: str = "Idle"
    action: str | None = None  # the step or relax taken (history), None when nothing changes
    degraded: tuple[bool, str] | None = None
    events: tuple[str, ...] = ()
    counts: tuple[tuple[str, str], ...] = ()


CASES = {
    "OOMKilled raises the memory limit": Case(
        OOM, verdict="Step", action="container memory limit 36Gi -> 54Gi", degraded=(False, "Remediated"),
        events=("Remediated",), counts=(("OOMKilled", "step"),)),
    "KV capacity cuts max_model_len to what vLLM reported": Case(
        crash(V033_KV), running=running(max_model_len=131072), verdict="Step",
        action="max_model_len 131072 -> 80384 (vLLM estimated 80608)", degraded=(False, "Remediated"),
        events=("Remediated",), counts=(("KVCapacity", "step"),)),
    "no KV memory halves the batched tokens": Case(
        crash("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`"),
        verdict="Step", action="max_num_batched_tokens 8192 -> 4096", degraded=(False, "Remediated"),
        events=("Remediated",), counts=(("NoKVCacheMemory", "step"),)),
    "CUDA OOM at start-up halves the batched tokens": Case(
        crash(CUDA_STARTUP), verdict="Step", action="max_num_batched_tokens 8192 -> 4096",
        degraded=(False, "Remediated"), events=("Remediated",), counts=(("CudaOOMAtStartup", "step"),)),
    "CUDA OOM at start-up with the batched tokens at their floor shrinks the CUDA graphs before eager mode": Case(
        crash(CUDA_STARTUP), running=running(max_num_batched_tokens=512), verdict="Step",
        action="CUDA graphs captured up to 512 -> 256 tokens per batch", degraded=(False, "Remediated"),
        events=("Remediated",), counts=(("CudaOOMAtStartup", "step"),)),
    "CUDA OOM at start-up with the CUDA graphs at their smallest turns them off": Case(
        crash(CUDA_STARTUP), running=running(max_num_batched_tokens=512, max_cudagraph_capture_size=64),
        verdict="Step", action="enforce eager mode (no CUDA graphs)", degraded=(False, "Remediated"),
        events=("Remediated",), counts=(("CudaOOMAtStartup", "step"),)),
    "CUDA OOM under load halves seqs and tokens": Case(
        crash(CUDA_RUNTIME), verdict="Step", action="max_num_seqs 1024 -> 512, max_num_batched_tokens 8192 -> 4096",
        degraded=(False, "Remediated"), events=("Remediated",), counts=(("CudaOOMUnderLoad", "step"),)),
    "KV saturation moves to an fp8 KV cache": Case(
        SATURATED, verdict="Step", action="KV cache dtype auto -> fp8 (half the bytes per token)",
        degraded=(False, "Remediated"), events=("Remediated",), counts=(("KVSaturation", "step"),)),
    "calm for the stable window relaxes one rung": Case(
        Evidence(), state=stepped(1), verdict="Relax", action="relax one rung", degraded=(False, "AsPlanned"),
        events=("Relaxed",), counts=(("Calm", "relax"),)),
    "calm, but not yet for the whole (backed-off) window": Case(
        Evidence(), state=stepped(1, relax_backoff=16, last_relax_time=NOW - timedelta(hours=3)), verdict="Idle"),
    "Prometheus down holds still and says why": Case(
        Evidence(crash=OOM.crash, metrics=Metrics.UNAVAILABLE, metrics_detail="Prometheus query failed: refused"),
        verdict="", events=()),
    "a crash already acted on is not stepped on twice (restart mid-remediation)": Case(
        OOM, state=stepped(1, at=NOW - timedelta(seconds=60), last_evidence="qwen-1/1/2026-12-01T11:59:00Z"),
        verdict="Idle"),
    "disabled remediation only reports": Case(
        OOM, policy=policy(enabled=False), verdict="ObserveOnly", degraded=(True, "RemediationDisabled"),
        events=("RemediationDisabled",)),
    "a non-memory crash is reported, not remediated": Case(
        crash("OSError: Qwen/Qwen3-8B does not appear to have a file named config.json"), verdict="NotAMemoryFailure",
        degraded=(True, "Crashed"), events=("Crashed",)),
    "after maxSteps the ladder is exhausted": Case(
        OOM, state=stepped(3), verdict="Exhausted", degraded=(True, "RemediationExhausted"),
        events=("RemediationExhausted",), counts=(("OOMKilled", "exhausted"),)),
    "no safer configuration fits: exhausted": Case(
        OOM, fits=False, verdict="Exhausted", degraded=(True, "RemediationExhausted"),
        events=("RemediationExhausted",), counts=(("OOMKilled", "exhausted"),)),
    "cooldown after the last step": Case(
        OOM, state=stepped(1, at=NOW - timedelta(seconds=60)), verdict="Cooldown"),
    "KV saturation waits for the rollout": Case(
        Evidence(saturation=SATURATED.saturation, metrics=Metrics.AVAILABLE, rollout_complete=False),
        verdict="WaitingForRollout"),
    "a crash of a pod running the current plan does not wait for the rollout": Case(
        Evidence(crash=OOM.crash, rollout_complete=False), verdict="Step", action="container memory limit 36Gi -> 54Gi",
        degraded=(False, "Remediated"), events=("Remediated",), counts=(("OOMKilled", "step"),)),
    "an OOM kill of a pod of the superseded memory limit does not move the ladder again (issue #29)": Case(
        oom_of_a_pod_at(1.76, current_gib=2.64), state=stepped(2, at=NOW - timedelta(minutes=20)), verdict="Idle"),
    "an OOM kill of a pod at the memory limit in force still steps": Case(
        oom_of_a_pod_at(2.64, current_gib=2.64), verdict="Step", action="container memory limit 36Gi -> 54Gi",
        degraded=(False, "Remediated"), events=("Remediated",), counts=(("OOMKilled", "step"),)),
    "KV saturation inside the window after a step judges the old settings: ignored": Case(
        SATURATED, state=stepped(1, at=NOW - timedelta(seconds=100)), verdict="Idle"),
}


def run(case: Case) -> Decision:
    return decide(case.evidence, case.state, case.policy, case.running, now=NOW,
                  probe=lambda _o: Probe(case.fits, problem="" if case.fits else "does not fit on 1 x H100-80GB"))


@pytest.mark.parametrize("name", list(CASES))
def test_decision(name: str) -> None:
    case = CASES[name]
    d = run(case)
    if case.verdict:
        assert d.state.state == case.verdict
    assert d.changed is (case.action is not None)
    if case.action is not None:
        assert d.state.history[-1].action == case.action
        assert d.state.history[-1].time == NOW and len(d.state.history) == len(case.state.history) + 1
    else:
        assert d.overrides == case.state.overrides and d.state.applied == case.state.applied
    degraded = [(c.status, c.reason) for c in d.conditions if c.type == "Degraded"]
    assert degraded == ([case.degraded] if case.degraded else [])
    assert tuple(e.reason for e in d.events) == case.events
    assert d.counts == case.counts


def test_a_step_records_the_overrides_the_evidence_and_the_time() -> None:
    d = run(CASES["OOMKilled raises the memory limit"])
    assert d.overrides == Overrides(memory_limit_gib=54.0) and d.state.overrides == d.overrides
    assert (d.state.rung, d.state.last_step_time, d.state.last_signal_time) == (1, NOW, NOW)
    assert d.state.last_evidence == "qwen-1/1/2026-12-01T11:59:00Z"
    evidence = d.state.history[-1].evidence
    assert evidence["exitCode"] == "137" and evidence["pod"] == "qwen-1"


def test_prometheus_down_changes_nothing_but_the_metrics_condition() -> None:
    case = CASES["Prometheus down holds still and says why"]
    d = run(case)
    assert d.state == case.state and not d.events and not d.changed
    (condition,) = d.conditions
    assert (condition.type, condition.status, condition.reason) == ("MetricsAvailable", False,
                                                                     "PrometheusUnreachable")
    assert "holds still" in condition.message and "refused" in condition.message
    available = run(Case(Evidence(metrics=Metrics.AVAILABLE, metrics_detail="Prometheus at http://p")))
    assert [(c.type, c.status) for c in available.conditions] == [("MetricsAvailable", True)]


def test_a_signal_soon_after_relaxing_doubles_the_backoff() -> None:
    """Alternating signals: step, relax, step again soon -> the next relax waits twice as long."""
    relaxed = stepped(1).with_relax(NOW - timedelta(minutes=10), RemediationEvent(
        time=NOW, rung=0, signal="Calm", action="relax one rung", message=""))
    d = run(Case(SATURATED, state=relaxed))
    assert d.state.relax_backoff == 2 and d.state.rung == 1 and d.changed
    def calm_for(seconds: int) -> RemediationState:
        at = NOW - timedelta(seconds=seconds)
        return d.state.model_copy(update={"last_step_time": at, "last_signal_time": at, "last_relax_time": at})

    assert run(Case(Evidence(), state=calm_for(3700))).state.state == "Idle"  # 3700 s calm < 2 x 3600 s
    again = run(Case(Evidence(), state=calm_for(7300)))
    assert again.state.state == "Relax" and again.changed


def test_exhaustion_is_reported_once_per_evidence() -> None:
    first = run(CASES["after maxSteps the ladder is exhausted"])
    second = decide(OOM, first.state, policy(), running(), now=NOW + timedelta(seconds=60),
                    probe=lambda _o: Probe(True))
    assert [e.reason for e in first.events] == ["RemediationExhausted"] and not second.events
    assert not second.counts


def test_candidates_that_do_not_plan_or_change_nothing_are_skipped_in_order() -> None:
    answers = iter([Probe(False, problem="does not fit"), Probe(True, changes=False), Probe(True)])
    d = decide(crash(CUDA_RUNTIME), RemediationState(), policy(), running(), now=NOW, probe=lambda _o: next(answers))
    assert d.state.history[-1].action == "GPUs per replica 1 -> 2"  # the third rung


def test_a_relax_whose_rung_no_longer_plans_stays() -> None:
    d = run(Case(Evidence(), state=stepped(1), fits=False))
    assert not d.changed and d.state.rung == 1 and not d.events


def test_the_remediation_package_is_pure() -> None:
    """The decision and everything it uses import no shell or I/O library, only the layers below."""
    allowed = {"domain", "catalog", "vllm", "planner", "api", "remediation"}
    files = sorted((PACKAGE / "remediation").glob("*.py"))
    assert {p.name for p in files} >= {"decide.py", "state.py", "saturation.py", "text.py", "classify.py"}
    for path in files:
        for name in _imports(path):
            assert not name.startswith(SHELLS), f"{path.name} imports shell {name}"
            if name.startswith("llm_autopilot."):
                assert name.split(".")[1] in allowed, f"{path.name} imports {name}"
