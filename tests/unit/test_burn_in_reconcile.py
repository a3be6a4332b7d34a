"""The burn-in in the reconcile: the readiness gate rendered, a run started on a new pod whose containers are
ready, its measurement judged once (status.burnIn, BurnInPassed, the pod's gate), and a KV cache too small for
the load taken as remediation evidence before the pod is Ready."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llm_autopilot.domain.burn_in import BURN_IN_GATE, BurnInLoad, BurnInMeasurement
from tests.unit.fakes import Run

SPEC = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-h100-80gb"},
        "serving": {"maxModelLen": 16384, "minMaxModelLen": 4096, "expectedConcurrency": 4},
        "verification": {"burnIn": {"maxTokens": 8, "timeoutSeconds": 120}}}
HEALTHY = BurnInMeasurement(completed=4, sent=4, peak_kv_usage=0.4, peak_waiting=1, peak_running=4, samples=20,
                            generated_tokens=32, wall_seconds=12.0)


@dataclass
class Runs:
    """The burn-in runs as a test drives them: started, and measured when the test says."""

    started: list[tuple[str, str, BurnInLoad]] = field(default_factory=list)
    results: dict[str, BurnInMeasurement] = field(default_factory=dict)

    def start(self, uid: str, address: str, load: BurnInLoad) -> None:
        self.started.append((uid, address, load))

    def result(self, uid: str) -> BurnInMeasurement | None:
        return self.results.get(uid)

    def running(self, uid: str) -> bool:
        return uid not in self.results and any(u == uid for u, _, _ in self.started)


def _pod(name: str, plan_hash: str, *, ready_containers: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "annotations": {"llm-autopilot.io/plan-hash": plan_hash}},
            "status": {"podIP": "10.0.0.7", "conditions": [{"type": "Ready", "status": "False"}],
                       "containerStatuses": [{"name": "vllm", "ready": ready_containers}]}}


def _deployment(run: Run) -> dict[str, Any]:
    return next(o for (kind, _), o in run.cluster.objects.items() if kind == "Deployment")


def test_no_burn_in_no_gate() -> None:
    run = Run({k: v for k, v in SPEC.items() if k != "verification"})
    run.once()
    assert "readinessGates" not in _deployment(run)["spec"]["template"]["spec"]
    assert all(c["type"] != "BurnInPassed" for c in run.status["conditions"])


def test_a_new_pod_is_burned_in_once_then_let_in() -> None:
    runs = Runs()
    run = Run(SPEC, burn_ins=runs)
    run.once()
    template = _deployment(run)["spec"]["template"]["spec"]
    assert template["readinessGates"] == [{"conditionType": BURN_IN_GATE}]
    assert run.condition("BurnInPassed")["reason"] == "BurnInPending"
    # the pod's vLLM is up (containers ready), not yet Ready: its gate waits for the burn-in
    plan_hash = run.cluster.plan_hash()
    run.cluster.pod_list = [_pod("x-1", plan_hash, ready_containers=False)]
    run.once()
    assert runs.started == []  # its vLLM does not answer yet
    run.cluster.pod_list = [_pod("x-1", plan_hash)]
    out = run.once()
    assert [(u, ip) for u, ip, _ in runs.started] == [("uid-x-1", "10.0.0.7")]
    load = runs.started[0][2]
    assert (load.requests, load.max_tokens, load.prompt_tokens) == (4, 8, run.status["plan"]["maxModelLen"] - 8)
    assert load.model == "Qwen/Qwen3-8B" and load.timeout_seconds == 120
    assert run.condition("BurnInPassed")["reason"] == "BurnInRunning" and not out.settled
    run.once()
    assert len(runs.started) == 1  # running: not started again
    runs.results["uid-x-1"] = HEALTHY
    out = run.once()
    assert [(pod, c["type"], c["status"]) for pod, c in run.cluster.pod_conditions] == [
        ("x-1", BURN_IN_GATE, "True")]
    assert run.condition("BurnInPassed")["status"] == "True"
    assert "4 requests of 16376+8 tokens at once: 4/4 answered in 12s" in run.condition("BurnInPassed")["message"]
    assert run.status["burnIn"]["pods"][0] == {
        "pod": "x-1", "passed": True, "reason": "BurnInPassed", "gpuSeconds": 12.0,
        "message": run.status["burnIn"]["pods"][0]["message"]}
    assert [e[:2] for e in out.events if "BurnIn" in e[1]] == [("Normal", "BurnInPassed")]
    # judged: never again, and nothing written twice
    out = run.once()
    assert len(run.cluster.pod_conditions) == 1 and [e for e in out.events if "BurnIn" in e[1]] == []
    assert len(runs.started) == 1


def test_a_kv_cache_too_small_for_the_load_is_remediated_before_the_pod_is_ready() -> None:
    runs = Runs()
    run = Run(SPEC, burn_ins=runs)
    run.once()
    first_plan = run.cluster.plan_hash()
    seqs = run.status["plan"]["maxNumSeqs"]
    run.cluster.pod_list = [_pod("x-1", first_plan)]
    run.once()
    runs.results["uid-x-1"] = BurnInMeasurement(completed=4, sent=4, preemptions=6, peak_kv_usage=1.0,
                                                peak_waiting=2, peak_running=2, samples=30, wall_seconds=40.0)
    out = run.once()
    assert [(pod, c["status"], c["reason"]) for pod, c in run.cluster.pod_conditions] == [
        ("x-1", "False", "KVCacheTooSmall")]
    assert run.condition("BurnInPassed")["status"] == "False"
    assert "vLLM preempted 6 times" in run.condition("BurnInPassed")["message"]
    assert "BurnInFailed" in [e[1] for e in out.events]
    history = run.remediation["history"]
    assert len(history) == 1 and history[0]["signal"] == "KVSaturation"
    assert history[0]["evidence"]["source"] == "burn-in" and history[0]["evidence"]["pod"] == "x-1"
    # the ladder's KV-saturation rung that fits here: more GPUs for the KV cache (fp8 KV is not allowed)
    assert history[0]["action"] == "GPUs per replica 1 -> 2"
    assert run.status["plan"]["maxNumSeqs"] == seqs and run.status["plan"]["tensorParallelSize"] == 2
    assert run.cluster.plan_hash() != first_plan  # the step's plan rolls out
    degraded = run.condition("Degraded")
    assert (degraded["reason"], degraded["message"].split(": ")[1]) == ("Remediated", "burn-in on x-1")
    # the same failure is acted on once: a pass more takes no second step
    run.once()
    assert len(run.remediation["history"]) == 1
