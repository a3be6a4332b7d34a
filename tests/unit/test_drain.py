"""Graceful drain (issue #29 item 2): spec.vllm.drainSeconds renders --shutdown-timeout where the release has it,
a preStop wait and a grace period that covers both; the flag is owned; it stays out of the plan hash. The process
kubelet stops a deleted pod's containers as a kubelet does (preStop, SIGTERM to the main process, SIGKILL at the
deadline). The proof on the real CPU vLLM is tests/e2e/test_real_vllm_drain.py."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hack.localcluster import podworker, runtime

from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.controller.admission import review
from llm_autopilot.controller.reconcile import context, render, timed_plan
from llm_autopilot.controller.settings import OperatorSettings
from llm_autopilot.domain.drain import termination_grace_seconds
from llm_autopilot.planner.plan import Plan
from llm_autopilot.remediation.ladder import Overrides
from llm_autopilot.render import groups
from llm_autopilot.render.kubernetes import Owner, WorkloadInputs, plan_hash
from llm_autopilot.render.vllm_args import shutdown_args, without_shutdown_timeout
from llm_autopilot.vllm.flags import examined_versions, known_flags
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION, VLLMVersion
from tests.render_driver import FakeKube
from tests.unit.test_groups_and_autoscaling import LLAMA_405B, group_inputs

V = str(DEFAULT_VLLM_VERSION)
OWNER = Owner("x", "ns", "00000000-0000-0000-0000-000000000000")


def spec(**vllm: Any) -> dict[str, Any]:
    return {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4"}, "vllm": vllm}


def rendered(body: dict[str, Any]) -> tuple[dict[str, Any], list[str], WorkloadInputs]:
    """The Deployment's pod spec, status.plan.warnings and the workload inputs for a spec, as the reconciler renders."""
    settings = OperatorSettings()
    ctx = context(LLMDeploymentSpec.model_validate(body), "ns", FakeKube(), settings)  # type: ignore[arg-type]
    choice = timed_plan(ctx, Overrides())
    assert isinstance(choice.result, Plan)
    r = render(ctx, choice, Overrides(), OWNER, settings)
    return r.objects[0]["spec"]["template"]["spec"], list(r.status.warnings), r.inputs


# --- the API -------------------------------------------------------------------------------------------------


def test_drain_seconds_defaults_to_120_and_takes_0_to_3600() -> None:
    assert LLMDeploymentSpec.model_validate(spec()).vllm.drain_seconds == 120
    for seconds in (0, 1, 3600):
        assert review(spec(drainSeconds=seconds), V).allowed


@pytest.mark.parametrize(("value", "needle"), [(3601, "less than or equal to 3600"),
                                               (-1, "greater than or equal to 0"), ("soon", "integer")])
def test_a_drain_out_of_bounds_is_refused_with_its_path(value: object, needle: str) -> None:
    verdict = review(spec(drainSeconds=value), V)
    assert not verdict.allowed and "spec.vllm.drainSeconds:" in verdict.message, verdict.message
    assert needle in verdict.message, verdict.message


@pytest.mark.parametrize("arg", ["--shutdown-timeout=30", "--shutdown_timeout", "--shutdown-time=5"])
def test_the_flag_is_owned_in_every_spelling(arg: str) -> None:
    verdict = review(spec(extraArgs=[arg]), V)
    assert not verdict.allowed, arg
    assert "--shutdown-timeout" in verdict.message and "set spec.vllm.drainSeconds instead" in verdict.message, (
        verdict.message)


# --- the render ------------------------------------------------------------------------------------------------


def test_the_default_drain_renders_the_flag_the_prestop_wait_and_a_grace_period_covering_both() -> None:
    pod, warnings, _ = rendered(spec())
    container = pod["containers"][0]
    args = container["args"]
    assert args[args.index("--shutdown-timeout") + 1] == "120"
    assert container["lifecycle"] == {"preStop": {"exec": {"command": ["sleep", "10"]}}}
    assert pod["terminationGracePeriodSeconds"] == 10 + 120 + 15 == termination_grace_seconds(120)
    assert not [w for w in warnings if "shutdown" in w]


def test_a_drain_of_0_renders_none_of_it() -> None:
    pod, _, _ = rendered(spec(drainSeconds=0))
    container = pod["containers"][0]
    assert "--shutdown-timeout" not in container["args"] and "lifecycle" not in container
    assert pod["terminationGracePeriodSeconds"] == 15


@pytest.mark.parametrize("version", examined_versions(), ids=str)
def test_the_flag_is_rendered_exactly_for_the_releases_that_have_it(version: VLLMVersion) -> None:
    has = version >= VLLMVersion(0, 18, 0)
    assert ("--shutdown-timeout" in known_flags(version)) is has
    assert shutdown_args(300, version) == (["--shutdown-timeout", "300"] if has else [])
    assert shutdown_args(0, version) == []


def test_an_older_release_gets_the_prestop_wait_and_a_warning_but_no_flag() -> None:
    pod, warnings, _ = rendered(spec(version="0.17.1", image="vllm/vllm-openai:v0.17.1"))
    container = pod["containers"][0]
    assert "--shutdown-timeout" not in container["args"] and container["lifecycle"]
    assert any("vLLM 0.17.1 has no --shutdown-timeout" in w for w in warnings), warnings


def test_the_drain_is_not_part_of_the_plan() -> None:
    _, _, short = rendered(spec(drainSeconds=30))
    _, _, long = rendered(spec(drainSeconds=600))
    _, _, off = rendered(spec(drainSeconds=0))
    assert short.args != long.args and plan_hash(short) == plan_hash(long) == plan_hash(off)
    assert without_shutdown_timeout(["m", "--shutdown-timeout", "30", "--port", "8000"]) == ["m", "--port", "8000"]
    # a workload rendered before the drain existed (no flag) keeps its hash
    assert plan_hash(dataclasses.replace(short, args=tuple(without_shutdown_timeout(short.args)))) == plan_hash(short)


def test_a_groups_worker_waits_for_its_leader_after_the_prestop_wait() -> None:
    inputs = group_inputs()
    sts = groups.statefulset(inputs, 0)
    pod = sts["spec"]["template"]["spec"]
    hook = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:2] == ["/bin/sh", "-c"] and hook[2].startswith("sleep 10; ")
    assert f'"${groups.NODE_RANK_ENV}" != 0' in hook[2] and f"${groups.LEADER_ENV}:8000/health" in hook[2]
    assert pod["terminationGracePeriodSeconds"] == 145
    lws = groups.leader_worker_set(inputs)["spec"]["leaderWorkerTemplate"]
    leader = lws["leaderTemplate"]["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    worker = lws["workerTemplate"]["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert leader == ["sleep", "10"]
    assert "$LWS_LEADER_ADDRESS:8000/health" in worker[2] and "!= 0" not in worker[2]
    undrained = groups.statefulset(group_inputs({**LLAMA_405B, "vllm": {**LLAMA_405B.get("vllm", {}),
                                                                        "drainSeconds": 0}}), 0)
    assert "lifecycle" not in undrained["spec"]["template"]["spec"]["containers"][0]


# --- the process kubelet ---------------------------------------------------------------------------------------


class _Cgroup:
    """A memory cgroup stand-in: the processes it holds, killed by kill_all."""

    def __init__(self, pids: list[int], procs_file: Path) -> None:
        self.held, self.procs_file, self.signals = pids, procs_file, []

    def kill_all(self, sig: signal.Signals = signal.SIGKILL) -> None:
        self.signals.append(sig)
        for pid in self.held:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


# the main process records its SIGTERM and ends a moment later; its child records any SIGTERM it gets
_MAIN = """
import signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\\n"
    "signal.signal(signal.SIGTERM, lambda *_: open(sys.argv[1], 'a').write('child TERM\\\\n'))\\n"
    "time.sleep(60)", sys.argv[1]])
print(child.pid, flush=True)
def term(*_):
    open(sys.argv[1], "a").write("main TERM\\n")
    time.sleep(0.3)
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
time.sleep(60)
"""


def test_sigterm_goes_to_the_main_process_only_and_sigkill_to_the_rest(tmp_path: Path) -> None:
    record = tmp_path / "signals"
    record.touch()
    process = subprocess.Popen([sys.executable, "-c", _MAIN, str(record)], stdout=subprocess.PIPE,
                               start_new_session=True)
    assert process.stdout is not None
    child = int(process.stdout.readline())
    time.sleep(0.3)  # both handlers installed
    cgroup = _Cgroup([child], tmp_path / "procs")
    instance = runtime.Instance(process, cgroup, None, "t0", f"process://{process.pid}")  # type: ignore[arg-type]
    started = time.monotonic()
    runtime.stop(instance, 10)
    assert time.monotonic() - started < 5  # the main process ended on SIGTERM: no wait for the grace period
    assert record.read_text() == "main TERM\n"  # a worker signalled directly would end under the requests
    assert cgroup.signals == [signal.SIGKILL]


class _Kubelet:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def event(self, pod: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((reason, message))


def _worker(pod_spec: dict[str, Any], metadata: dict[str, Any] | None = None) -> podworker.PodWorker:
    worker = podworker.PodWorker.__new__(podworker.PodWorker)
    worker.kubelet = _Kubelet()
    worker.pod = {"metadata": metadata or {}, "spec": pod_spec}
    return worker


@pytest.mark.parametrize(("spec_seconds", "deletion_seconds", "expected"), [
    (145, None, 145.0), (145, 30, 30.0), (None, None, 30.0), (3625, None, podworker.MAX_DELETION_GRACE_SECONDS),
    (145, 0, 0.0)])
def test_the_deletion_grace_is_the_deletes_else_the_pods_capped(spec_seconds: int | None,
                                                                deletion_seconds: int | None,
                                                                expected: float) -> None:
    pod_spec = {} if spec_seconds is None else {"terminationGracePeriodSeconds": spec_seconds}
    metadata = {} if deletion_seconds is None else {"deletionGracePeriodSeconds": deletion_seconds}
    assert _worker(pod_spec, metadata)._deletion_grace() == expected


def test_a_deleted_container_runs_its_prestop_hook_then_gets_the_rest_of_the_grace(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, Any, float]] = []

    def hook(instance: Any, command: list[str], timeout: float) -> str | None:
        calls.append(("hook", command, timeout))
        return "sleep 10 exited 1: no"

    monkeypatch.setattr(runtime, "exec_hook", hook)
    monkeypatch.setattr(runtime, "stop", lambda instance, grace: calls.append(("stop", None, grace)))
    worker = _worker({})
    container = podworker.Container({"name": "vllm", "lifecycle": {"preStop": {"exec": {"command": ["sleep", "10"]}}}},
                                    instance=object())  # type: ignore[arg-type]
    deadline = time.monotonic() + 145
    worker._stop_container(container, deadline)
    assert [c[0] for c in calls] == ["hook", "stop"] and calls[0][1] == ["sleep", "10"]
    assert 144 < calls[0][2] <= 145 and 144 < calls[1][2] <= 145  # both within the one grace period
    assert worker.kubelet.events == [("FailedPreStopHook", "PreStopHook failed: sleep 10 exited 1: no")]  # type: ignore[attr-defined]
    calls.clear()
    worker._stop_container(container, time.monotonic() - 1)  # the hook used the whole period: 2 s more, as a kubelet
    assert calls[-1] == ("stop", None, podworker.MIN_GRACE_AFTER_HOOK_SECONDS)


@pytest.mark.skipif(os.geteuid() != 0, reason="nsenter into another process's namespaces needs root, as the kubelet")
def test_an_exec_hook_runs_with_the_containers_environment_and_says_why_it_failed(tmp_path: Path) -> None:
    process = subprocess.Popen(["sleep", "30"], env={"PATH": os.environ["PATH"], "SEEN": "from the container"},
                               start_new_session=True)
    procs = tmp_path / "cgroup.procs"
    instance = runtime.Instance(process, _Cgroup([], procs), None, "t0", "process://1")  # type: ignore[arg-type]
    try:
        # until the child has exec'd `sleep`, /proc/<pid>/environ is still pytest's (no SEEN): on a busy machine the
        # hook ran in that gap (the fresh CI's one failure). A kubelet's hook runs long after its container started
        deadline = time.monotonic() + 10
        while b"SEEN=" not in Path(f"/proc/{process.pid}/environ").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        out = tmp_path / "out"
        assert runtime.exec_hook(instance, ["/bin/sh", "-c", f'echo "$SEEN" > {out}'], 10) is None
        assert out.read_text() == "from the container\n" and procs.read_text().strip().isdigit()  # in its cgroup
        assert runtime.exec_hook(instance, ["/bin/sh", "-c", "echo no; exit 3"], 10) == (
            "/bin/sh -c 'echo no; exit 3' exited 3: no")
        assert runtime.exec_hook(instance, ["sleep", "5"], 1) == "sleep 5 did not end within 1s"
    finally:
        process.kill()
        process.wait()
