"""The controller's verification: the pure decision (planner/verify.py ``decide``, ``pods_to_read``) case by
case, the gather shell's reads (Prometheus's vllm:cache_config_info, then the pod's start-up log), and the
reconcile's hook (read once per plan, PlanVerified with an Event, status.verification)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec, VerificationStatus
from llm_autopilot.controller.gather import START_LOG_BYTES, Gatherer, read_vllm_version
from llm_autopilot.controller.kube import LogUnavailable
from llm_autopilot.controller.metrics import MetricsUnavailable
from llm_autopilot.planner.verify import (
    AWAITING_PODS,
    OUTSIDE_TOLERANCE,
    TOLERANCE_PERCENT,
    UNREADABLE,
    WITHIN_TOLERANCE,
    Known,
    Observed,
    PodReading,
    Prediction,
    Source,
    decide,
    pods_to_read,
)
from tests.conftest import DATA
from tests.unit.fakes import NAMESPACE, FakeCluster, Run
from tests.unit.fakes import FakeLabels as Labels

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
INFO = json.loads((DATA / "vllm_cache_config_info.json").read_text())["labels"]
CPU_LINE = json.loads((DATA / "vllm_cpu_kv_golden.json").read_text())["cases"][0]["line"]
# 1,000 blocks of 1 MiB planned on a "GPU" of 1,000 MiB: one block is 0.1 % of its memory
PREDICTION = Prediction(kv_cache_tokens=16000, num_blocks=1000, block_size=16, kv_cache_bytes=1000 * 2**20,
                        block_bytes=2**20, gpu_total_bytes=1000 * 2**20)


def blocks(n: int) -> Observed:
    return Observed(Source.METRICS, kv_cache_tokens=n * 16, num_blocks=n, block_size=16)


@pytest.mark.parametrize(("name", "known", "ready", "read"), [
    ("nothing known: every Ready pod", None, ("a", "b"), ("a", "b")),
    ("no Ready pod", None, (), ()),
    ("this plan, every pod read: none (not read again each reconcile)", Known("h1", frozenset({"a", "b"})),
     ("a", "b"), ()),
    ("this plan, a pod gone: none", Known("h1", frozenset({"a", "b"})), ("a",), ()),
    ("this plan, a new replica Ready: all again", Known("h1", frozenset({"a"})), ("a", "b"), ("a", "b")),
    ("another plan: all", Known("h0", frozenset({"a"})), ("a",), ("a",)),
])
def test_which_pods_are_read(name: str, known: Known | None, ready: tuple[str, ...],
                             read: tuple[str, ...]) -> None:
    assert pods_to_read(known, "h1", ready) == read, name


@pytest.mark.parametrize(("name", "known", "readings", "condition", "keep", "pods", "error", "event"), [
    ("no pod Ready yet", None, (), (None, AWAITING_PODS), False, (), None, None),
    ("a new plan, its pods not Ready: the old plan's figures go", Known("h0", frozenset({"a"})), (),
     (None, AWAITING_PODS), False, (), None, None),
    ("this plan already read: nothing changes", Known("h1", frozenset({"a"})), (), (None, ""), True, (), None,
     None),
    ("as planned", None, (PodReading("a", blocks(1000)),), (True, WITHIN_TOLERANCE), False, ("a",), 0.0,
     ("Normal", "PlanVerified")),
    ("1.5 % short: within 2 %", None, (PodReading("a", blocks(985)),), (True, WITHIN_TOLERANCE), False, ("a",),
     -1.5, ("Normal", "PlanVerified")),
    ("3 % short: past the tolerance", None, (PodReading("a", blocks(970)),), (False, OUTSIDE_TOLERANCE), False,
     ("a",), -3.0, ("Warning", "PlanNotVerified")),
    ("3 % over: wasted memory is past it too", None, (PodReading("a", blocks(1030)),),
     (False, OUTSIDE_TOLERANCE), False, ("a",), 3.0, ("Warning", "PlanNotVerified")),
    ("two replicas: the furthest one decides", None,
     (PodReading("a", blocks(1000)), PodReading("b", blocks(960))), (False, OUTSIDE_TOLERANCE), False,
     ("a", "b"), -4.0, ("Warning", "PlanNotVerified")),
    ("one replica unreadable: the other is verified", None,
     (PodReading("a", blocks(995)), PodReading("b", problem="no series; log: 403")), (True, WITHIN_TOLERANCE),
     False, ("a",), -0.5, ("Normal", "PlanVerified")),
    ("nothing readable: Unknown, read again", None, (PodReading("a", problem="no series; log: 403"),),
     (None, UNREADABLE), False, (), None, ("Warning", "VerificationUnreadable")),
    ("nothing readable on a read plan: its figures stay", Known("h1", frozenset({"a"})),
     (PodReading("b", problem="no series; log: 403"),), (None, UNREADABLE), True, (), None,
     ("Warning", "VerificationUnreadable")),
    ("figures that cannot be compared are unreadable", None, (PodReading("a", Observed(Source.LOG)),),
     (None, UNREADABLE), False, (), None, ("Warning", "VerificationUnreadable")),
])
def test_the_decision(name: str, known: Known | None, readings: tuple[PodReading, ...],
                      condition: tuple[bool | None, str], keep: bool, pods: tuple[str, ...], error: float | None,
                      event: tuple[str, str] | None) -> None:
    d = decide(PREDICTION, "h1", known, readings, vllm_version="0.32.0", now=NOW)
    assert d.condition[:2] == condition, name
    assert d.keep is keep, name
    assert tuple(p for p, _ in d.results) == pods, name
    worst = d.worst
    assert (None if worst is None else round(worst.error_percent, 6)) == error, name
    assert (None if d.event is None else d.event[:2]) == event, name
    if worst is not None:  # the message carries both numbers
        assert "predicted 16,000 tokens" in d.condition[2] and f"{worst.actual_tokens:,} tokens" in d.condition[2]
        assert d.event is not None and d.event[2] == d.condition[2]
    for r in readings:  # why a pod could not be read is said
        if r.problem and d.condition[1]:
            assert f"{r.pod}: {r.problem}" in d.condition[2], d.condition


def test_the_status_of_a_decision() -> None:
    d = decide(PREDICTION, "h1", None, (PodReading("a", blocks(1000)), PodReading("b", blocks(960))),
               vllm_version="0.32.0", now=NOW)
    status = VerificationStatus.of_pods(d.results, plan_hash="h1")
    assert status is not None
    dumped = status.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert dumped["planHash"] == "h1" and dumped["actualBlocks"] == 960 and dumped["errorPercent"] == -4.0
    assert [(p["pod"], p["actualBlocks"], p["errorPercent"]) for p in dumped["pods"]] == [
        ("a", 1000, 0.0), ("b", 960, -4.0)]
    assert VerificationStatus.model_validate(dumped) == status
    assert VerificationStatus.of_pods((), plan_hash="h1") is None


# ---- the shell: what is read, from where ----------------------------------------------------------------

def pod(name: str, plan_hash: str, ready: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": {"llm-autopilot.io/plan-hash": plan_hash}},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_ready_pods_of_the_plan_only() -> None:
    kube = FakeCluster(pod_list=[pod("b", "h1"), pod("a", "h1"), pod("c", "h1", ready=False), pod("d", "h0")])
    assert Gatherer(kube).ready_plan_pods("ns", "x", "h1") == ("a", "b")


def test_prometheus_first_then_the_log() -> None:
    kube = FakeCluster(current_logs={"b": "INFO ... " + CPU_LINE})
    labels = Labels([{**INFO, "namespace": "ns", "pod": "a"}])
    readings = Gatherer(kube, labels=labels).kv_figures("ns", ("a", "b"))
    assert labels.queries == ['vllm:cache_config_info{namespace="ns",pod=~"a|b"}']
    a, b = readings
    assert a.observed is not None and a.observed.source is Source.METRICS and a.observed.num_blocks == 64
    assert b.observed is not None and b.observed.source is Source.LOG and b.observed.kv_cache_tokens == 8192
    assert kube.start_log_reads == ["b"]  # the pod Prometheus gave is not read from its log


def test_several_engines_of_one_pod_give_the_smallest_pool() -> None:
    labels = Labels([{**INFO, "pod": "a", "engine": "0", "num_gpu_blocks": "64"},
                     {**INFO, "pod": "a", "engine": "1", "num_gpu_blocks": "60"}])
    (a,) = Gatherer(FakeCluster(), labels=labels).kv_figures("ns", ("a",))
    assert a.observed is not None and a.observed.num_blocks == 60


@pytest.mark.parametrize(("name", "labels", "log", "problem"), [
    ("no Prometheus, no log", None, LogUnavailable("403 Forbidden: pods/log"),
     "no Prometheus configured; log: 403 Forbidden: pods/log"),
    ("Prometheus down, the log still loading", Labels(MetricsUnavailable("Prometheus query failed: timeout")),
     "Loading weights took 1.0 GiB", "Prometheus query failed: timeout; log: the log has no KV-cache line"),
    ("no series yet, the log gone", Labels([]), LogUnavailable("404 Not Found"),
     "no vllm:cache_config_info series in Prometheus at test; log: 404 Not Found"),
    ("a forged label, the log unreadable", Labels([{**INFO, "pod": "a", "num_gpu_blocks": "lots"}]),
     RuntimeError("kubelet gone"), "num_gpu_blocks='lots' is not a whole number; log: RuntimeError: kubelet gone"),
])
def test_what_cannot_be_read_is_said(name: str, labels: Labels | None, log: str | Exception, problem: str) -> None:
    kube = FakeCluster(current_logs={"a": log})
    (a,) = Gatherer(kube, labels=labels).kv_figures("ns", ("a",))
    first, then = problem.split("; log: ")
    assert a.observed is None and first in a.problem and a.problem.index(first) < a.problem.index(then), (name,
                                                                                                      a.problem)


def test_the_log_is_read_from_its_start_and_bounded() -> None:
    kube = FakeCluster(current_logs={"a": CPU_LINE + "\n" + "x" * (2 * START_LOG_BYTES)})
    (a,) = Gatherer(kube).kv_figures("ns", ("a",))
    assert a.observed is not None and a.observed.kv_cache_tokens == 8192
    assert Gatherer(kube).kv_figures("ns", ()) == ()


# ---- the reconcile's hook ------------------------------------------------------------------------------

QWEN_H100 = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-h100-80gb"},
             "serving": {"maxModelLen": 16384, "minMaxModelLen": 4096}}


def _serving(run: Run, name: str = "x-1") -> None:
    run.cluster.pod_list = [pod(name, run.cluster.plan_hash())]


def test_a_plan_is_read_once_and_judged() -> None:
    run = Run(QWEN_H100)
    run.once()
    assert run.condition("PlanVerified")["reason"] == AWAITING_PODS and "verification" not in run.status
    # the pod is Ready: its log's KV line (Prometheus is not configured) is 100 tokens: far below the plan
    _serving(run)
    run.cluster.current_logs["x-1"] = "INFO GPU KV cache size: 100 tokens, Maximum concurrency ..."
    out = run.once()
    verification = run.status["verification"]
    assert verification["planHash"] == run.cluster.plan_hash() and verification["source"] == "log"
    assert verification["actualTokens"] == 100 and verification["predictedTokens"] > 100_000
    assert verification["verified"] is False and verification["errorPercent"] < -2
    assert [p["pod"] for p in verification["pods"]] == ["x-1"]
    condition = run.condition("PlanVerified")
    assert (condition["status"], condition["reason"]) == ("False", OUTSIDE_TOLERANCE)
    assert f"{verification['predictedTokens']:,} tokens" in condition["message"]
    assert next(e for e in out.events if e[1] == "PlanNotVerified")[0] == "Warning"
    # the same plan, the same pod: nothing is read again, nothing written, no second Event
    for _ in range(2):
        out = run.once()
        assert run.cluster.start_log_reads == ["x-1"] and out.status == {} and out.events == []


def test_prometheus_first_and_a_verified_plan() -> None:
    run = Run(QWEN_H100)
    run.once()
    _serving(run)
    predicted = None

    class Exact(Labels):
        def series(self, query: str) -> list[dict[str, str]]:
            self.queries.append(query)
            assert predicted is not None
            return [{"namespace": NAMESPACE, "pod": "x-1", "num_gpu_blocks": str(predicted["predictedBlocks"]),
                     "block_size": "16", "kv_cache_size_tokens": str(predicted["predictedTokens"])}]

    # first from the log, to learn the plan's figures; then a new pod of the plan, read from Prometheus
    run.cluster.current_logs["x-1"] = "GPU KV cache size: 100 tokens"
    run.once()
    predicted = run.status["verification"]
    labels = Exact([])
    run.gatherer = Gatherer(run.cluster, labels=labels)
    run.cluster.pod_list.append(pod("x-2", run.cluster.plan_hash()))
    out = run.once()
    verification = run.status["verification"]
    assert labels.queries == [f'vllm:cache_config_info{{namespace="{NAMESPACE}",pod=~"x-1|x-2"}}']
    assert verification["source"] == "metrics" and verification["verified"] is True
    assert verification["actualBlocks"] == predicted["predictedBlocks"] and abs(verification["errorPercent"]) < 0.1
    assert run.condition("PlanVerified")["status"] == "True"
    assert [e[:2] for e in out.events if "Verif" in e[1]] == [("Normal", "PlanVerified")]


def test_an_unreadable_pod_is_read_again_and_said_once() -> None:
    run = Run(QWEN_H100)
    run.once()
    _serving(run)
    run.cluster.current_logs["x-1"] = LogUnavailable("403 Forbidden: pods/log")
    first, second = run.once(), run.once()
    assert run.cluster.start_log_reads == ["x-1", "x-1"] and "verification" not in run.status
    assert run.condition("PlanVerified")["reason"] == UNREADABLE and "403 Forbidden" in run.condition(
        "PlanVerified")["message"]
    assert [e[1] for e in first.events if "Verif" in e[1]] == ["VerificationUnreadable"]
    assert [e for e in second.events if "Verif" in e[1]] == [] and not second.settled


def test_the_spec_sets_the_tolerance_and_a_new_tolerance_judges_again() -> None:
    run = Run({**QWEN_H100, "verification": {"tolerancePercent": 20}})
    run.once()
    _serving(run)
    run.cluster.current_logs["x-1"] = "GPU KV cache size: 100 tokens"
    run.once()
    predicted = run.status["verification"]["predictedTokens"]
    # vLLM has 10 % fewer tokens than planned: a few percent of the H100's memory
    run.cluster.current_logs["x-1"] = f"GPU KV cache size: {predicted * 9 // 10} tokens"
    run.cluster.pod_list.append(pod("x-2", run.cluster.plan_hash()))  # a new pod: the plan's pods are read again
    run.once()
    verification = run.status["verification"]
    assert -20 < verification["errorPercent"] < -2, verification
    assert verification["tolerancePercent"] == 20 and verification["verified"] is True
    assert run.condition("PlanVerified")["status"] == "True"
    assert "tolerance ±20 %" in run.condition("PlanVerified")["message"]
    # the spec tightens the tolerance: the same plan and pods are read and judged again with it
    reads = len(run.cluster.start_log_reads)
    run.spec = {**QWEN_H100, "verification": {"tolerancePercent": 2}}
    out = run.once()
    assert len(run.cluster.start_log_reads) == reads + 2
    assert run.status["verification"]["tolerancePercent"] == 2 and run.status["verification"]["verified"] is False
    assert (run.condition("PlanVerified")["status"], run.condition("PlanVerified")["reason"]) == (
        "False", OUTSIDE_TOLERANCE)
    assert [e[1] for e in out.events if "Verif" in e[1]] == ["PlanNotVerified"]


def test_the_default_tolerance_is_the_plans_own_headroom() -> None:
    assert LLMDeploymentSpec.model_validate(QWEN_H100).verification.tolerance_percent == TOLERANCE_PERCENT


# ---- the version the pods' vLLM reports ------------------------------------------------------------------------

@pytest.mark.parametrize(("reported", "version", "mismatch"), [
    ((None,), "0.33.0", None),  # not read: the plan's target is written
    (("0.33.0+cu128",), "0.33.0", None),  # a build of the same release
    (("0.32.0+cpu",), "0.32.0", "the pods run vLLM 0.32.0 but the plan was made for vLLM 0.33.0"),
    (("0.33.0", "0.32.1"), "0.33.0", "the pods run vLLM 0.32.1 but"),  # one pod of another release is enough
    (("not a version",), "0.33.0", None),
], ids=["not read", "same release", "another release", "one pod of another", "unreadable"])
def test_the_running_version_is_written_and_another_release_is_said(
        reported: tuple[str | None, ...], version: str, mismatch: str | None) -> None:
    readings = tuple(PodReading(f"p{i}", blocks(1000), vllm_version=v) for i, v in enumerate(reported))
    d = decide(PREDICTION, "h1", None, readings, vllm_version="0.33.0", now=NOW)
    assert d.results[0][1].vllm_version == version
    if mismatch is None:
        assert d.mismatch is None and "plan was made for" not in d.condition[2]
    else:
        assert d.mismatch is not None and d.mismatch.startswith(mismatch) and mismatch in d.condition[2]
        assert "spec.vllm.version" in d.mismatch


@pytest.mark.parametrize(("name", "moving_from", "known", "reported", "read", "mismatch"), [
    ("a release change: the fleet's old pods of the same plan hash are set aside, the canary judged alone",
     "0.32.0", Known("h1", frozenset({"old-1", "old-2"})), ("0.32.0+cpu", "0.33.0"), ("p1",), False),
    ("then nothing new of the new release: the canary's reading is kept, not made again",
     "0.32.0", Known("h1", frozenset({"p1"})), ("0.32.0", "0.33.0"), None, False),
    ("only the old release's pods Ready, none read yet: awaiting the new release's",
     "0.32.0", None, ("0.32.0", "0.32.0"), (), False),
    ("a pod that did not say its release is kept", "0.32.0", None, (None, "0.33.0"), ("p0", "p1"), False),
    ("no release change: a pod of another release is said, not set aside", None, None, ("0.33.0", "0.32.1"),
     ("p0", "p1"), True),
    ("a change of image at the same release: nothing to tell apart", "0.33.0", None, ("0.33.0", "0.33.0"),
     ("p0", "p1"), False),
])
def test_a_release_change_reads_only_the_new_releases_pods(
        name: str, moving_from: str | None, known: Known | None, reported: tuple[str | None, ...],
        read: tuple[str, ...] | None, mismatch: bool) -> None:
    """Issue #30 item 2: while the fleet moves from ``moving_from`` (status.canary) to the plan's release, a plan
    whose hash the release change did not move has the old release's pods among its Ready pods."""
    readings = tuple(PodReading(f"p{i}", blocks(1000), vllm_version=v) for i, v in enumerate(reported))
    d = decide(PREDICTION, "h1", known, readings, vllm_version="0.33.0", now=NOW, moving_from=moving_from)
    if read is None:
        assert d.keep and d.condition == (None, "", ""), name
        return
    assert tuple(pod for pod, _ in d.results) == read, name
    assert (d.mismatch is not None) == mismatch, name
    if not read:
        assert d.condition[1] == AWAITING_PODS, name


def test_the_gatherer_asks_each_pods_vllm_its_version() -> None:
    cluster = FakeCluster()
    cluster.pod_list = [{**pod("x-1", "h1"), "status": {**pod("x-1", "h1")["status"], "podIP": "10.0.0.7"}},
                        pod("x-2", "h1")]  # x-2 has no IP yet: not asked
    cluster.current_logs.update({"x-1": "GPU KV cache size: 100 tokens", "x-2": "GPU KV cache size: 100 tokens"})
    asked: list[str] = []

    def version(address: str) -> str | None:
        asked.append(address)
        return "0.32.0+cpu"

    readings = Gatherer(cluster, versions=version).kv_figures(NAMESPACE, ("x-1", "x-2"), instance="x")
    assert asked == ["10.0.0.7"] and [r.vllm_version for r in readings] == ["0.32.0+cpu", None]
    # without the object's name nothing is asked
    assert [r.vllm_version for r in Gatherer(cluster, versions=version).kv_figures(NAMESPACE, ("x-1",))] == [None]


@pytest.mark.parametrize(("answer", "expected"), [
    (httpx.Response(200, json={"version": "0.32.0+cpu"}), "0.32.0+cpu"),
    (httpx.Response(500, text="boom"), None),
    (httpx.Response(200, text="<html>"), None),
    (httpx.Response(200, json=["0.32.0"]), None),
    (httpx.ConnectError("refused"), None),
], ids=["answers", "500", "not JSON", "not an object", "unreachable"])
def test_read_vllm_version_never_raises(answer: httpx.Response | Exception, expected: str | None) -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert read_vllm_version("10.0.0.7", transport=httpx.MockTransport(handler)) == expected
    assert seen == ["http://10.0.0.7:8000/version"]
    assert read_vllm_version("fd00::7", transport=httpx.MockTransport(handler)) == expected
    assert seen[-1] == "http://[fd00::7]:8000/version"
