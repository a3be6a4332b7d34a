"""The burn-in in the reconcile: the readiness gate rendered, a run started on a new pod whose containers are
ready, its measurement judged once (status.burnIn, BurnInPassed, the pod's gate), and a KV cache too small for
the load taken as remediation evidence before the pod is Ready."""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from llm_autopilot.controller.burn_in_load import BurnInRunner
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
    #: what each reconcile said it still needs: (owner, uids)
    kept: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)

    def start(self, uid: str, address: str, load: BurnInLoad, owner: str = "") -> None:
        self.started.append((uid, address, load))

    def keep(self, owner: str, uids: Collection[str]) -> None:
        self.kept.append((owner, tuple(uids)))

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


# ---- what the operator keeps, and what a restart does -------------------------------------------------------

def _measured(runner: BurnInRunner, uid: str) -> None:
    deadline = time.monotonic() + 5
    while runner.result(uid) is None:
        assert time.monotonic() < deadline, f"no result for {uid}"
        time.sleep(0.01)


def test_a_result_is_dropped_once_its_verdict_is_recorded_and_a_burn_in_turned_off_drops_the_rest() -> None:
    """BurnInRunner kept each pod's result for the operator's life. The reconcile now says which runs it still
    needs: a verdict in status.burnIn is the record, the run's own result then goes."""
    runner = BurnInRunner(run=lambda address, load: HEALTHY)
    run = Run(SPEC, burn_ins=runner)
    run.once()
    run.cluster.pod_list = [_pod("x-1", run.cluster.plan_hash())]
    run.once()
    _measured(runner, "uid-x-1")
    run.once_losing_status()  # judged, the gate written; the status write after it is lost
    assert runner.kept() == 1 and not (run.status.get("burnIn") or {}).get("pods")
    run.once()  # judged again from the result still kept, and recorded this time
    assert run.status["burnIn"]["pods"][0]["passed"] is True and runner.kept() == 1
    run.once()  # recorded: the result is no longer needed
    assert runner.kept() == 0 and run.condition("BurnInPassed")["status"] == "True"
    # a second pod of the plan measured, then the burn-in turned off: nothing is kept for the object
    run.cluster.pod_list.append(_pod("x-2", run.cluster.plan_hash()))
    run.once()
    _measured(runner, "uid-x-2")
    run.spec = {k: v for k, v in SPEC.items() if k != "verification"}
    run.once()
    assert runner.kept() == 0


def test_the_old_plans_results_go_once_a_step_replaces_it() -> None:
    runner = BurnInRunner(run=lambda address, load: BurnInMeasurement(
        completed=4, sent=4, preemptions=6, peak_kv_usage=1.0, peak_waiting=2, peak_running=2, samples=30,
        wall_seconds=40.0))
    run = Run(SPEC, burn_ins=runner)
    run.once()
    first_plan = run.cluster.plan_hash()
    run.cluster.pod_list = [_pod("x-1", first_plan)]
    run.once()
    _measured(runner, "uid-x-1")
    run.once()  # KVCacheTooSmall: the step's plan rolls out
    assert run.cluster.plan_hash() != first_plan and len(run.remediation["history"]) == 1
    run.once()  # the plan in force is the step's: the old pod's result is no longer needed
    assert runner.kept() == 0


def test_a_restarted_operator_takes_the_pods_gate_as_the_verdict_the_status_lost() -> None:
    """The gate is written on the pod before the status that records the verdict. With that status write lost
    and the operator restarted (its runs gone), the pod's gate is the durable record: a pod let in may serve
    traffic already and is not run again. A pod whose gate is unwritten has no verdict anywhere, takes no
    traffic (its gate holds it), and is run again."""
    runs = Runs()
    run = Run(SPEC, burn_ins=runs)
    run.once()
    plan_hash = run.cluster.plan_hash()
    run.cluster.pod_list = [_pod("x-1", plan_hash), _pod("x-2", plan_hash)]
    run.once()
    assert sorted(u for u, _, _ in runs.started) == ["uid-x-1", "uid-x-2"]
    runs.results["uid-x-1"] = HEALTHY  # x-2 still runs when the operator dies
    run.once_losing_status()
    assert [(pod, c["status"]) for pod, c in run.cluster.pod_conditions] == [("x-1", "True")]
    assert not (run.status.get("burnIn") or {}).get("pods")  # the verdict's record in the status was lost
    restarted = Runs()  # a new operator process: no runs, no results
    run.burn_ins = restarted
    out = run.once()
    assert [u for u, _, _ in restarted.started] == ["uid-x-2"]  # x-2 again (no verdict anywhere); x-1 not
    (x1,) = run.status["burnIn"]["pods"]
    assert (x1["pod"], x1["passed"], x1["reason"]) == ("x-1", True, "BurnInPassed")
    assert "judged by an earlier pass" in x1["message"] and len(run.cluster.pod_conditions) == 1
    assert [e for e in out.events if "BurnIn" in e[1]] == []  # nothing judged anew
    restarted.results["uid-x-2"] = HEALTHY
    run.once()
    assert run.condition("BurnInPassed")["status"] == "True"
    assert [p["pod"] for p in run.status["burnIn"]["pods"]] == ["x-1", "x-2"]


def test_an_oom_kill_during_the_run_is_the_burn_ins_record_and_remediations_evidence() -> None:
    """The issue asks the burn-in to record any OOM: a vLLM killed for memory mid-run failed its requests (the
    connections dropped); the verdict names the kill, and remediation acts on the pod's termination."""
    runner = BurnInRunner(run=lambda address, load: BurnInMeasurement(
        completed=1, sent=4, errors=3, first_error="RemoteProtocolError: Server disconnected", samples=5,
        wall_seconds=6.0))
    run = Run(SPEC, burn_ins=runner)
    run.once()
    plan_hash = run.cluster.plan_hash()
    run.cluster.pod_list = [_pod("x-1", plan_hash)]
    run.once()
    _measured(runner, "uid-x-1")
    measured = runner.result("uid-x-1")
    assert measured is not None and measured.started_at is not None
    killed = (measured.started_at + timedelta(seconds=4)).strftime("%Y-%m-%dT%H:%M:%SZ")
    run.cluster.pod_list[0]["status"]["containerStatuses"] = [{"name": "vllm", "ready": False, "restartCount": 1,
                                                               "lastState": {"terminated": {
                                                                   "reason": "OOMKilled", "exitCode": 137,
                                                                   "finishedAt": killed}}}]
    out = run.once()
    (record,) = run.status["burnIn"]["pods"]
    assert (record["passed"], record["reason"]) == (False, "OOMKilled") and killed in record["message"]
    assert [(pod, c["status"], c["reason"]) for pod, c in run.cluster.pod_conditions] == [
        ("x-1", "False", "OOMKilled")]
    assert ("Warning", "BurnInFailed") in [e[:2] for e in out.events]
    history = run.remediation["history"]
    assert len(history) == 1 and "OOM" in history[0]["signal"], history
    limit = _deployment(run)["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
    assert history[0]["action"].endswith(f"-> {limit}"), (history, limit)  # the step is applied: a new pod
