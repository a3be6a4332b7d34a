"""The remediation shell with in-memory fakes of Kubernetes and Prometheus: the gatherer (previous logs read
once, falling back quietly), reconcile's status handling, apply failures, the Hub token, and Ready."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
import pytest
import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import NotFoundError
from prometheus_api_client.exceptions import PrometheusApiClientException

from llm_autopilot.api.v1alpha1 import RemediationPolicy
from llm_autopilot.controller.gather import Gatherer, Target
from llm_autopilot.controller.kube import ApplyRejected, Kube, LogUnavailable, NodeGPUs
from llm_autopilot.controller.metrics import (
    MetricsUnavailable,
    PrometheusClient,
    PrometheusSettings,
    QueryRejected,
    failure_text,
    query_failure,
)
from llm_autopilot.controller.quiet import MAX_DELAY_SECONDS, later, next_due
from llm_autopilot.controller.runtime import Operator
from llm_autopilot.remediation.classify import Signal
from llm_autopilot.remediation.decide import Metrics
from llm_autopilot.remediation.saturation import KV_SATURATION
from llm_autopilot.remediation.state import Limits, RemediationState, attestation
from llm_autopilot.render.autoscaling import KEDA_CRD
from llm_autopilot.render.kubernetes import INPUT_HASH, PLAN_HASH
from tests.unit.fakes import (
    L4,
    NAME,
    NAMESPACE,
    FakeCluster,
    FakePrometheus,
    OperatorKilled,
    Run,
    operator_on,
    saturated,
)
from tests.unit.test_remediation import CUDA_STARTUP
from tests.unit.vllm_logs import cpu_kv_capacity_log, termination_message

QWEN_H100 = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-h100-80gb"},
             "serving": {"maxModelLen": 16384, "minMaxModelLen": 4096}, "remediation": {"cooldownSeconds": 0}}


def deployed(spec: dict[str, Any] | None = None, **kwargs: Any) -> Run:
    run = Run(spec or QWEN_H100, **kwargs)
    run.once()
    assert run.condition("Planned")["status"] == "True"
    return run


# --- the gatherer ----------------------------------------------------------------------------------------

def target(cluster: FakeCluster, last_evidence: str | None = None) -> Target:
    return Target(namespace=NAMESPACE, name=NAME, plan_hash=cluster.plan_hash(), replicas=1,
                  deployment=cluster.deployment(), last_evidence=last_evidence, kv_threshold=0.95, kv_window=300)


def test_the_previous_log_is_read_once_per_crash_and_classified() -> None:
    """Issue #9: the termination message alone says "Crashed"; the previous log says KVCapacity, N=8064."""
    run = deployed()
    log = cpu_kv_capacity_log()
    run.cluster.crash(termination_message(log))
    run.cluster.logs["x-1"] = log
    gatherer = Gatherer(run.cluster)
    first = gatherer.gather(target(run.cluster)).crash
    assert first is not None and first.classification.signal is Signal.KV_CAPACITY
    assert first.classification.reported_max_len == 8064
    assert first.classification.evidence["source"].startswith("previous container log")
    for _ in range(3):  # resyncs: the same crash is not read again
        assert gatherer.gather(target(run.cluster)).crash == first
    assert run.cluster.log_reads == ["x-1"]
    run.cluster.crash(termination_message(log), restarts=2, finished_at="2026-12-01T00:01:00Z")  # a new crash
    gatherer.gather(target(run.cluster))
    assert run.cluster.log_reads == ["x-1", "x-1"]


@pytest.mark.parametrize("failure", [
    LogUnavailable('403 Forbidden: pods "x-1" is forbidden: cannot get resource "pods/log"'),
    LogUnavailable("400 Bad Request: previous terminated container \"vllm\" in pod \"x-1\" not found"),
    LogUnavailable("500 Internal Server Error: Get \"https://10.0.0.1:10250/containerLogs/ns/x-1/vllm\": "
                   "dial tcp 10.0.0.1:10250: connect: connection refused"),  # the kubelet gone (or KWOK)
    LogUnavailable("ReadTimeoutError: read timed out"),
    RuntimeError("something unexpected"),
])
def test_an_unreadable_log_falls_back_to_the_termination_message_quietly(failure: Exception) -> None:
    run = deployed()
    run.cluster.crash("ValueError: To serve at least one request with the model's max seq len (16384), (2.0 GiB KV "
                      "cache is needed, which is larger than the available KV cache memory (1.0 GiB). Based on the "
                      "available memory, the estimated maximum model length is 8100.")
    run.cluster.logs["x-1"] = failure
    crash = Gatherer(run.cluster).gather(target(run.cluster)).crash
    assert crash is not None and crash.classification.signal is Signal.KV_CAPACITY
    assert crash.classification.reported_max_len == 8100
    source = crash.classification.evidence["source"]
    assert source.startswith("termination message") and "previous log unavailable" in source


def test_no_log_is_read_for_an_oom_kill_a_clean_exit_or_evidence_already_acted_on() -> None:
    run = deployed()
    gatherer = Gatherer(run.cluster)
    run.cluster.crash(reason="OOMKilled", exit_code=137)
    assert gatherer.gather(target(run.cluster)).crash.classification.signal is Signal.HOST_OOM  # type: ignore[union-attr]
    run.cluster.crash(reason="Completed", exit_code=0, restarts=2)
    gatherer.gather(target(run.cluster))
    run.cluster.crash("boom", restarts=3)
    gatherer.gather(target(run.cluster, last_evidence="x-1/3/2026-12-01T00:00:05Z"))
    assert run.cluster.log_reads == []


def test_prometheus_down_is_metrics_unavailable_and_no_pod_no_query() -> None:
    run = deployed()
    down = FakePrometheus(down=True)
    run.cluster.running()
    evidence = Gatherer(run.cluster, down).gather(target(run.cluster))
    assert evidence.metrics is Metrics.UNAVAILABLE and "connection refused" in evidence.metrics_detail
    run.cluster.pod_list = []
    up = FakePrometheus(answer=saturated())
    evidence = Gatherer(run.cluster, up).gather(target(run.cluster))
    assert evidence.metrics is Metrics.NOT_ASKED and evidence.saturation is None and up.queries == []


def test_kv_saturation_is_asked_for_the_current_plans_pods_only() -> None:
    run = deployed()
    run.cluster.running("x-abc")
    run.cluster.pod_list.append({"metadata": {"name": "x-old", "annotations": {PLAN_HASH: "older-plan"}},
                                 "status": {}})
    prometheus = FakePrometheus(answer=saturated())
    evidence = Gatherer(run.cluster, prometheus).gather(target(run.cluster))
    assert evidence.saturation is not None and evidence.saturation.signal is Signal.KV_SATURATION
    asked = KV_SATURATION.queries('pod=~"x-abc"', window=300, threshold=0.8)
    assert all('pod=~"x-abc"' in q for q in prometheus.queries) and len(prometheus.queries) == len(asked)


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A Prometheus that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in accepted:
        conn.close()
    server.close()


def test_a_hung_prometheus_gives_up_within_the_timeout(silent_server: str) -> None:
    client = PrometheusClient(PrometheusSettings(silent_server, timeout_seconds=0.5))
    started = time.monotonic()
    with pytest.raises(MetricsUnavailable, match="Timeout"):
        client.scalar("up")
    assert time.monotonic() - started < 3  # one bounded attempt, no retries


# --- Kube: all-or-nothing apply, the previous log -----------------------------------------------------------

class _Resource:
    def __init__(self, kind: str, calls: list[tuple[str, str, bool]], reject: set[str]) -> None:
        self.kind, self.calls, self.reject = kind, calls, reject

    def get(self, name: str, namespace: str) -> Any:
        raise NotFoundError(ApiException(status=404, reason="Not Found"))

    def server_side_apply(self, body: dict[str, Any], name: str, namespace: str, field_manager: str,
                          force_conflicts: bool, dry_run: str | None = None) -> None:
        self.calls.append((self.kind, name, dry_run == "All"))
        if self.kind in self.reject:
            exc = ApiException(status=422, reason="Unprocessable Entity")
            exc.body = ('{"kind":"Status","message":"Service \\"1llama\\" is invalid: metadata.name: Invalid value: '
                        '\\"1llama\\": a DNS-1035 label must start with a letter"}')
            raise exc


class _Dynamic:
    def __init__(self, reject: set[str]) -> None:
        self.calls: list[tuple[str, str, bool]] = []
        self.reject = reject
        self.resources = self

    def get(self, api_version: str, kind: str) -> _Resource:
        return _Resource(kind, self.calls, self.reject)


def _objects() -> list[dict[str, Any]]:
    return [{"apiVersion": v, "kind": k, "metadata": {"name": "1llama", "namespace": "ns",
                                                      "annotations": {INPUT_HASH: k}}}
            for v, k in (("apps/v1", "Deployment"), ("v1", "Service"), ("policy/v1", "PodDisruptionBudget"))]


def test_apply_all_writes_nothing_when_the_api_server_refuses_one_object() -> None:
    """D5: a Service the API server refuses must not leave a Deployment on GPUs behind."""
    kube = Kube.__new__(Kube)
    kube._dynamic, kube.writes = _Dynamic({"Service"}), 0  # type: ignore[assignment]
    with pytest.raises(ApplyRejected, match=r"Service 1llama: .*a DNS-1035 label must start with a letter"):
        kube.apply_all(_objects())
    assert all(dry for _, _, dry in kube._dynamic.calls) and kube.writes == 0  # type: ignore[attr-defined]
    kube._dynamic = _Dynamic(set())  # type: ignore[assignment]
    assert kube.apply_all(_objects()) == 3
    assert [dry for _, _, dry in kube._dynamic.calls] == [True, True, True, False, False, False]  # type: ignore[attr-defined]


class _Core:
    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome
        self.asked: dict[str, Any] = {}

    def read_namespaced_pod_log(self, name: str, namespace: str, **kwargs: Any) -> Any:
        self.asked = kwargs
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


class _Response:
    def __init__(self, data: bytes) -> None:
        self.data = data


@pytest.mark.parametrize(("outcome", "message"), [
    (ApiException(status=403, reason="Forbidden"), "403 Forbidden"),
    (ApiException(status=400, reason="Bad Request"), "400 Bad Request"),
    (urllib3.exceptions.ReadTimeoutError(None, "/log", "read timed out"), "ReadTimeoutError"),  # type: ignore[arg-type]
    (ConnectionRefusedError("refused"), "ConnectionRefusedError"),
])
def test_previous_log_failures_become_log_unavailable(outcome: Exception, message: str) -> None:
    kube = Kube.__new__(Kube)
    kube.core = _Core(outcome)  # type: ignore[assignment]
    with pytest.raises(LogUnavailable, match=message):
        kube.previous_log("ns", "x-1", "vllm", tail_lines=500, limit_bytes=1024)


def test_previous_log_asks_for_the_previous_container_bounded() -> None:
    kube = Kube.__new__(Kube)
    core = _Core(_Response("héllo\n".encode() * 400))
    kube.core = core  # type: ignore[assignment]
    text = kube.previous_log("ns", "x-1", "vllm", tail_lines=500, limit_bytes=1024)
    assert core.asked["previous"] is True and core.asked["tail_lines"] == 500 and core.asked["limit_bytes"] == 1024
    assert core.asked["container"] == "vllm" and core.asked["_request_timeout"]
    assert text.startswith("héllo") and len(text.encode()) <= 1024


# --- reconcile -----------------------------------------------------------------------------------------

def test_kv_capacity_from_the_previous_log_steps_to_what_vllm_reported() -> None:
    run = deployed()
    assert run.status["plan"]["maxModelLen"] == 16384
    log = cpu_kv_capacity_log()
    run.cluster.crash(termination_message(log))
    run.cluster.logs["x-1"] = log
    run.once()
    assert run.status["plan"]["maxModelLen"] == 7936  # 8064 rounded down to 256
    history = run.remediation["history"][-1]
    assert history["signal"] == "KVCapacity" and history["evidence"]["source"].startswith("previous container log")
    assert "estimated maximum model length is 8064" in history["evidence"]["message"]


def test_a_cuda_oom_at_start_up_shrinks_the_cuda_graphs_in_the_deployment_before_turning_them_off() -> None:
    """The batched tokens at their floor: each OOM at start-up halves the largest CUDA-graph batch (512, vLLM's
    default here, -> 256 -> 128 -> 64), rendered as --max-cudagraph-capture-size with less graph memory in the plan,
    then eager mode."""
    spec = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-h100-80gb"},
            "serving": {"maxModelLen": 16384},
            "remediation": {"cooldownSeconds": 0, "maxSteps": 5, "floors": {"minMaxNumBatchedTokens": 8192}}}
    run = deployed(spec)

    def serving() -> tuple[str | None, bool, float]:
        args = run.cluster.deployment()["spec"]["template"]["spec"]["containers"][0]["args"]
        flag = "--max-cudagraph-capture-size"
        return (args[args.index(flag) + 1] if flag in args else None, "--enforce-eager" in args,
                run.status["plan"]["memory"]["cudaGraphGiB"])

    seen = [serving()]
    for i in range(1, 5):  # each OOM at start-up is a new crash of the current plan's pod
        run.cluster.crash(CUDA_STARTUP, restarts=i, finished_at=f"2026-12-01T00:0{i}:00Z")
        run.once()
        seen.append(serving())
    assert [(size, eager) for size, eager, _ in seen] == [
        (None, False), ("256", False), ("128", False), ("64", False), (None, True)], seen
    graphs = [gib for _, _, gib in seen]
    assert graphs[0] > graphs[1] > graphs[2] > graphs[3] > graphs[4] == 0, graphs
    assert [e["action"] for e in run.remediation["history"]][:3] == [
        f"CUDA graphs captured up to {a} -> {b} tokens per batch" for a, b in ((512, 256), (256, 128), (128, 64))]
    assert run.remediation["applied"][2]["maxCudagraphCaptureSize"] == 64


def test_a_reported_length_of_1_never_takes_max_model_len_below_the_floor() -> None:
    """D3: with only maxModelLen set, the floor is maxModelLen; nothing else fits on one L4: exhausted."""
    spec = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4"},
            "serving": {"maxModelLen": 32768, "allowedKVCacheDtypes": ["fp8"]}}
    run = deployed(spec)
    one = ("4.5 GiB KV cache is needed, which is larger than the available KV cache memory (0.1 GiB). Based on the "
           "available memory, the estimated maximum model length is 1.")
    run.cluster.crash(one)
    run.once()
    assert run.status["plan"]["maxModelLen"] == 32768
    assert run.condition("Degraded")["reason"] == "RemediationExhausted"
    # with no length in the spec, the floor is min(8192, the model's maximum)
    run = deployed({"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-h100-80gb"}})
    run.cluster.crash(one)
    run.once()
    assert run.status["plan"]["maxModelLen"] == 8192


def test_an_apply_the_api_server_refuses_is_a_condition_not_a_traceback() -> None:
    """D5: Planned=False/ApplyRejected with the API server's message and an Event; nothing half-applied."""
    cluster = FakeCluster(reject={"Service": 'Service "x" is invalid: metadata.name: Invalid value'})
    run = Run(QWEN_H100, cluster=cluster)
    run.once()
    planned = run.condition("Planned")
    assert (planned["status"], planned["reason"]) == ("False", "ApplyRejected")
    assert "Service x: Service \"x\" is invalid" in planned["message"]
    assert "ApplyRejected" in run.reasons() and cluster.objects == {}  # not even the Deployment
    run.once()
    assert run.last is not None and run.last.events == [] and run.last.status == {}  # no event storm, no writes
    cluster.reject.clear()
    run.once()
    assert run.condition("Planned")["status"] == "True" and len(cluster.objects) == 3


def test_a_step_whose_objects_are_refused_is_not_taken() -> None:
    run = deployed()
    run.cluster.crash(reason="OOMKilled", exit_code=137)
    run.cluster.reject["Deployment"] = "admission webhook denied the request: memory limit too high"
    run.once()
    assert run.condition("Planned")["reason"] == "ApplyRejected" and run.remediation.get("rung") == 0
    assert "Remediated" not in run.reasons() and run.condition("Degraded")["reason"] == "AsPlanned"
    run.cluster.reject.clear()
    run.once()
    assert run.remediation["rung"] == 1


def test_the_hub_token_is_read_only_when_the_hub_is_called() -> None:
    """D10: a catalog model never reads its token Secret; an unreadable one is SecretUnreadable, not a 403."""
    forbidden = ApiException(status=403, reason="Forbidden")
    catalog = {**QWEN_H100, "model": {"name": "Qwen/Qwen3-8B", "hubTokenSecretRef": {"name": "hf"}}}
    run = deployed(catalog, cluster=FakeCluster(secrets={("ns", "hf", "token"): forbidden}))
    run.once()
    assert run.cluster.secret_reads == 0
    private = {**QWEN_H100, "model": {"name": "someorg/private-model", "hubTokenSecretRef": {"name": "hf"}}}
    run = Run(private, cluster=FakeCluster(secrets={("ns", "hf", "token"): forbidden}))
    out = run.once()
    planned = run.condition("Planned")
    assert (planned["status"], planned["reason"]) == ("False", "SecretUnreadable") and not out.retry
    assert "cannot read Secret 'hf'" in planned["message"] and "rbac.readSecrets" in planned["message"]
    missing = Run(private)
    assert missing.once().retry and missing.condition("Planned")["reason"] == "ModelUnresolved"


def test_a_status_with_bad_timestamps_is_repaired_once_and_reconcile_goes_on() -> None:
    """D11: fractional seconds and offsets are read; garbage is treated as missing, with a warning Event."""
    run = deployed()
    run.own("remediation", {**run.remediation, "lastStepTime": "2026-12-01T00:00:00.5Z",
                            "lastSignalTime": "2026-12-01T02:00:00+02:00", "lastRelaxTime": "soon"})
    run.once()
    assert run.reasons() == ["StatusRepaired"] and "lastRelaxTime" in run.last.events[0][2]  # type: ignore[union-attr]
    assert "lastRelaxTime" not in run.remediation  # removed by the merge patch
    assert run.remediation["lastSignalTime"] == "2026-12-01T00:00:00Z"
    run.once()
    assert run.last is not None and run.last.status == {} and run.last.events == []


def test_a_step_time_far_in_the_future_does_not_hold_the_cooldown() -> None:
    """D12: with a year-ahead lastStepTime an OOM was answered "Cooldown" for a year."""
    run = deployed()
    run.status["remediation"] = {**run.remediation, "lastStepTime": "9999-01-01T00:00:00Z"}
    run.cluster.crash(reason="OOMKilled", exit_code=137)
    run.once()
    assert run.remediation["state"] == "Step" and run.remediation["rung"] == 1
    assert run.remediation["lastStepTime"] < "9999"


def test_a_rung_written_below_zero_does_not_buy_more_steps() -> None:
    """D13: rung -50 with maxSteps 1 stepped to "-49"; now the budget holds."""
    spec = {**QWEN_H100, "remediation": {"cooldownSeconds": 0, "maxSteps": 1}}
    run = deployed(spec)
    run.status["remediation"] = {**run.remediation, "rung": -50}
    run.cluster.crash(reason="OOMKilled", exit_code=137)
    run.once()
    assert run.remediation["rung"] == 1
    run.cluster.crash(reason="OOMKilled", exit_code=137, restarts=2, finished_at="2026-12-01T00:10:00Z")
    run.once()
    assert run.remediation["rung"] == 1 and run.condition("Degraded")["reason"] == "RemediationExhausted"


def recorded(*entries: dict[str, Any], generation: int = 1) -> list[dict[str, Any]]:
    """Applied entries as the operator records them for Run's object (uid "uid"): attested, chained."""
    chain, previous = [], ""
    for entry in entries:
        previous = attestation("uid", generation, entry, previous)
        chain.append({**entry, "generation": generation, "attestation": previous})
    return chain


def _steps(remediation: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k not in ("generation", "attestation")} for e in remediation["applied"]]


def test_recorded_overrides_are_clamped_before_rendering() -> None:
    """A recorded step the spec no longer allows (maxReplicas lowered) is clamped; the memory limit to the nodes of
    the planned pool (H100 here)."""
    run = deployed({**QWEN_H100, "remediation": {"cooldownSeconds": 0, "maxReplicas": 3}})
    run.own("remediation", {**run.remediation, "rung": 1,
                            "applied": recorded({"replicas": 100000, "memoryLimitGiB": 1e9})})
    run.once()
    container = run.cluster.deployment()["spec"]["template"]["spec"]["containers"][0]
    assert run.cluster.deployment()["spec"]["replicas"] == 3 and container["resources"]["limits"]["memory"] == "2000Gi"
    assert _steps(run.remediation) == [{"replicas": 3, "memoryLimitGiB": 2000.0}]
    assert run.remediation["applied"][0]["attestation"] == recorded({"replicas": 3, "memoryLimitGiB": 2000.0})[0][
        "attestation"]  # attested again as clamped
    run.once()
    assert "StatusRepaired" not in run.reasons() and "UnattributedRemediation" not in run.reasons()  # said once


def _recently() -> str:
    return (datetime.now(UTC) - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")


L4_SPEC = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4"},
           "serving": {"maxModelLen": 4096}, "remediation": {"cooldownSeconds": 0}}


def test_the_memory_limit_is_bounded_by_the_planned_pools_nodes_not_the_largest_node() -> None:
    """The cluster has an H100 node with 2000 GiB and an L4 node with 120 GiB; a plan on L4 never gets a memory
    limit above 120 GiB, neither from the status nor from remediation's own steps."""
    run = deployed(L4_SPEC)
    run.own("remediation", {**run.remediation, "rung": 1, "applied": recorded({"memoryLimitGiB": 1500.0}),
                            "lastSignalTime": _recently()})  # not calm for long: no relax
    run.once()
    assert _steps(run.remediation) == [{"memoryLimitGiB": 120.0}]
    assert _memory_limit(run.cluster) == "120Gi"
    run = deployed({**L4_SPEC, "remediation": {"cooldownSeconds": 0, "maxSteps": 12}})
    for restart in range(1, 12):  # OOM after OOM: the ladder grows the limit up to the node's memory
        run.cluster.crash(reason="OOMKilled", exit_code=137, restarts=restart,
                          finished_at=f"2026-12-01T00:{restart:02d}:00Z")
        run.once()
    limits = [e.get("memoryLimitGiB") for e in run.remediation["applied"]]
    assert limits and max(limit or 0 for limit in limits) <= 120.0
    assert _memory_limit(run.cluster).removesuffix("Gi") and float(_memory_limit(run.cluster)[:-2]) <= 120.0


def test_a_forged_remediation_step_is_dropped_not_applied() -> None:
    """Someone who may write llmdeployments/status plants applied entries: hand-written (no attestation), with
    a made-up one, copied from another object, edited after the operator recorded it, or chained with the step
    digest anyone can compute (remediation/state.py's ``attestation`` is not keyed). Without the operator's
    attestation of the section none is applied, since the workload does not run their plan."""
    run = deployed()
    deployment = run.cluster.deployment()
    step = {"gpuMemoryUtilization": 0.7, "maxNumSeqs": 8}
    other = recorded(step)[0] | {"attestation": attestation("other-uid", 1, step, "")}
    edited = recorded({"maxNumSeqs": 64})[0] | {"maxNumSeqs": 8}
    for forged in ([step], [{**step, "generation": 1, "attestation": "0" * 32}], [other], [edited],
                   [recorded(step, generation=2)[0]], recorded(step)):  # the last: a chain that verifies
        run.status["remediation"] = {**run.remediation, "rung": 1, "applied": forged}
        run.once()
        assert run.reasons() == ["UnattributedRemediation"], forged
        assert "not attested by this operator" in run.last.events[0][2]  # type: ignore[union-attr]
        assert "the workload does not run its plan" in run.last.events[0][2]  # type: ignore[union-attr]
        assert run.remediation["applied"] == [] and run.remediation["rung"] == 0
        assert run.cluster.deployment() == deployment  # the children never moved
    # the operator's own chain with a forged entry appended: the section's attestation no longer holds
    run.own("remediation", {**run.remediation, "rung": 1, "applied": recorded({"memoryLimitGiB": 100.0}),
                            "lastSignalTime": _recently()})
    run.status["remediation"]["applied"] = [*run.remediation["applied"], step]
    run.once()
    assert run.reasons() == ["UnattributedRemediation"] and run.remediation["applied"] == []
    assert run.cluster.deployment() == deployment


def test_an_unattested_state_whose_plan_the_workload_runs_is_kept() -> None:
    """Upgrading from the release before status.remediation was attested (or an operator without a key
    restarted): the state has no attestation, but the workload runs exactly its rungs' plan, so they are kept
    (re-attested), and said once. What the workload cannot prove starts afresh."""
    run = deployed({**QWEN_H100, "remediation": {"cooldownSeconds": 0}})
    run.cluster.crash(reason="OOMKilled", exit_code=137)
    run.once()
    assert run.remediation["rung"] == 1
    deployment = run.cluster.deployment()
    steps = _steps(run.remediation)
    run.status["attestations"].pop("remediation")  # as the release before wrote it
    run.status["remediation"] |= {"lastEvidence": "made-up", "lastStepTime": "2000-01-01T00:00:00Z"}
    run.once()
    assert run.reasons() == ["RemediationAdopted"], run.last
    assert "its 1 applied rung(s) are kept" in run.last.events[0][2]  # type: ignore[union-attr]
    assert _steps(run.remediation) == steps and run.remediation["rung"] == 1
    assert run.remediation.get("lastEvidence") is None and run.remediation["lastStepTime"] > "2000"
    assert run.cluster.deployment() == deployment  # nothing rolled
    run.once()  # attested now: nothing said, nothing written
    assert run.reasons() == [] and run.last is not None and run.last.status == {}
    # a state whose plan the workload does not run: test_a_forged_remediation_step_is_dropped_not_applied


def test_prometheus_down_holds_still_then_the_held_back_step_is_taken() -> None:
    run = deployed(prometheus=FakePrometheus(down=True))
    run.cluster.crash(reason="OOMKilled", exit_code=137)
    before = run.cluster.deployment()["metadata"]["generation"]
    run.once()
    metrics = run.condition("MetricsAvailable")
    assert (metrics["status"], metrics["reason"]) == ("False", "PrometheusUnreachable")
    assert run.cluster.deployment()["metadata"]["generation"] == before and run.remediation.get("rung") == 0
    assert run.prometheus is not None
    run.prometheus.down = False
    run.once()
    assert run.condition("MetricsAvailable")["status"] == "True" and run.remediation["rung"] == 1


def test_quiet_rounds_write_nothing() -> None:
    run = deployed(prometheus=FakePrometheus())
    run.cluster.running()
    run.once()
    for _ in range(3):
        out = run.once()
        assert out.status == {} and out.events == [] and out.writes == 0


# --- Ready: one computation for both writers -----------------------------------------------------------------

@pytest.fixture
def handler_cluster() -> FakeCluster:
    return FakeCluster()


@pytest.fixture
def operator(handler_cluster: FakeCluster) -> Operator:
    """The Operator whose Deployment watch writes Ready, on the handler cluster."""
    return operator_on(handler_cluster)


def test_ready_uses_the_effective_replicas_in_the_reconcile_and_the_deployment_watch(
        handler_cluster: FakeCluster, operator: Operator) -> None:
    """D14: after a "one more replica" rung both writers say 2/2, and quiet rounds write nothing."""
    spec = {**QWEN_H100, "replicas": 1, "remediation": {"maxReplicas": 3, "stableWindowSeconds": 604800}}
    recently = (datetime.now(UTC) - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")  # not calm for long
    run = Run(spec, cluster=handler_cluster)
    run.own("remediation", {"rung": 1, "applied": recorded({"replicas": 2}), "lastSignalTime": recently})
    run.once()
    ready = run.condition("Ready")
    assert (ready["status"], ready["message"]) == ("True", "2/2 replicas are available")
    handler_cluster.llmd = {"metadata": {"name": NAME, "uid": "uid", "generation": 1, "resourceVersion": "7"},
                            "spec": spec, "status": run.status}
    for _ in range(3):  # Deployment events and resyncs in a quiet state
        operator.owner_changed(NAMESPACE, NAME)
        run.status = handler_cluster.llmd["status"]
        assert run.once().status == {}
    assert handler_cluster.status_patches == []
    # mid-rollout: 1 of 2 updated is not Ready (it read "1/1" before)
    handler_cluster.deployment()["status"].update(updatedReplicas=1, availableReplicas=1)
    operator.owner_changed(NAMESPACE, NAME)
    (patch,) = handler_cluster.status_patches
    ready = next(c for c in patch["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["message"]) == ("False", "1/2 replicas run the current plan")


def test_ready_has_one_writer_with_autoscaling_and_a_replica_override_left_from_before(
        handler_cluster: FakeCluster, operator: Operator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #16: the Deployment watch computed Ready from the remediation's replica override (it omitted
    ``autoscaled=``) while the reconcile used spec.replicas (KEDA drives the count): the two flipped Ready back
    and forth. The watch now triggers the reconcile, whose Ready stands."""
    monkeypatch.setattr(kopf, "event", lambda *_, **__: None)  # Events need Kopf's running context
    handler_cluster.nodes = [NodeGPUs(dict(L4), 1, 180.0) for _ in range(4)]
    handler_cluster.objects[("CustomResourceDefinition", KEDA_CRD)] = {"metadata": {"name": KEDA_CRD}}
    spec = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4"}, "replicas": 3,
            "autoscaling": {"maxReplicas": 4, "prometheusAddress": "http://prometheus.test:9090"}}
    recently = (datetime.now(UTC) - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    run = Run(spec, cluster=handler_cluster)
    run.own("remediation", {"rung": 1, "applied": recorded({"replicas": 2}), "lastSignalTime": recently})
    run.once()
    ready = run.condition("Ready")
    assert (ready["status"], ready["message"]) == ("True", "3/3 replicas are available")
    handler_cluster.llmd = {"metadata": {"name": NAME, "uid": "uid", "generation": 1, "resourceVersion": "7"},
                            "spec": spec, "status": run.status}
    for _ in range(3):  # Deployment events and resyncs: neither moves Ready
        operator.owner_changed(NAMESPACE, NAME)
        assert handler_cluster.llmd["status"]["conditions"] == run.status["conditions"]
        run.status = handler_cluster.llmd["status"]
        assert run.once().status == {}
    assert handler_cluster.status_patches == []


def test_the_deployment_watch_retries_a_conflicting_status_write(handler_cluster: FakeCluster,
                                                                 operator: Operator) -> None:
    run = deployed(cluster=handler_cluster)
    handler_cluster.llmd = {"metadata": {"name": NAME, "uid": "uid", "generation": 1, "resourceVersion": "7"},
                            "spec": QWEN_H100, "status": run.status}
    handler_cluster.deployment()["status"]["availableReplicas"] = 0
    handler_cluster.conflicts = 1
    operator.owner_changed(NAMESPACE, NAME)
    assert len(handler_cluster.status_patches) == 1


def test_an_invalid_spec_names_the_field_as_kubectl_does() -> None:
    """The reconciler's InvalidSpec message uses the webhook's field paths (spec.vllm.env[0].name), not
    pydantic's dotted tuple (spec.vllm.env.0.name), nor "spec.spec" for a spec-level rule."""
    run = Run({**QWEN_H100, "vllm": {"env": [{"name": "A=B", "value": "x"}]}})
    run.once()
    planned = run.condition("Planned")
    assert planned["status"] == "False" and planned["reason"] == "InvalidSpec"
    assert planned["message"].startswith("spec.vllm.env[0].name: "), planned["message"]
    run = Run({**QWEN_H100, "serving": {"maxModelLen": 1024}, "remediation": {"floors": {"minMaxModelLen": 2048}}})
    run.once()
    assert "spec.spec" not in run.condition("Planned")["message"], run.condition("Planned")


# --- a step is recorded before it is applied (issue #15, class 3) ---------------------------------------------

def _memory_limit(cluster: FakeCluster) -> str:
    return str(cluster.deployment()["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"])


def _limits() -> Limits:
    return Limits(max_steps=4, spec_replicas=1, max_replicas=None, max_gpus=8, node_memory_gib=2000.0,
                  floor_max_model_len=4096, floor_max_num_seqs=1, floor_max_num_batched_tokens=1,
                  floor_gpu_memory_utilization=0.5)


def test_an_operator_killed_between_the_two_writes_leaves_no_step_applied_but_unrecorded() -> None:
    """The operator dies right after the first write of the reconcile that takes a step. Whatever ran then must
    be recorded in the status; after the restart the children match the recorded step, taken once."""
    run = deployed()
    planned = _memory_limit(run.cluster)
    run.cluster.crash(reason="OOMKilled", exit_code=137)
    run.cluster.die_after_writes = 1
    with pytest.raises(OperatorKilled):
        run.once()
    applied = run.remediation.get("applied") or []
    if _memory_limit(run.cluster) != planned:  # the children changed: the status must say why
        assert applied and f"{applied[-1].get('memoryLimitGiB'):g}Gi" == _memory_limit(run.cluster)
    assert run.remediation.get("rung") == 1 and len(applied) == 1  # recorded first
    run.once()  # the restarted operator (or Kopf's retry) with what the status says
    assert run.remediation["rung"] == 1 and len(run.remediation["history"]) == 1  # not taken twice
    assert _memory_limit(run.cluster) == f"{run.remediation['applied'][-1]['memoryLimitGiB']:g}Gi" != planned


def test_a_huge_cooldown_neither_crashes_the_schedule_nor_loses_the_step() -> None:
    """A cooldown of 10**20 s made next_due raise OverflowError after the children changed, every 60 s, and
    Kopf's retries flipped the children back and forth while the status said nothing."""
    run = deployed()
    run.cluster.crash(reason="OOMKilled", exit_code=137)
    run.once()
    assert run.remediation["rung"] == 1
    policy = RemediationPolicy.model_construct(**{**RemediationPolicy().__dict__, "cooldown_seconds": 10**20,
                                                   "kv_saturation_window_seconds": 10**20,
                                                   "stable_window_seconds": 10**20})
    state, _ = RemediationState.read(run.remediation, _limits(), datetime.now(UTC))
    now = datetime.now(UTC)
    due = next_due(state, policy, now, 60)
    assert now < due <= now + timedelta(seconds=60)
    assert later(now, 10**20) == later(now, MAX_DELAY_SECONDS) and later(datetime.max.replace(tzinfo=UTC), 1) > now


# --- what MetricsAvailable says (issue #15, classes 4 and 5) --------------------------------------------------

def _client_error(status: int, body: bytes) -> Exception:
    """A non-200 answer as prometheus-api-client raises it."""
    return PrometheusApiClientException(f"HTTP Status Code {status} ({body!r})")


def test_a_query_prometheus_refuses_is_query_rejected_not_an_outage() -> None:
    error = 'invalid parameter "query": 1:31: parse error: duration out of range\x1b[31m' + "x" * 1000
    body = json.dumps({"status": "error", "errorType": "bad_data", "error": error}).encode()
    rejected = query_failure(_client_error(400, body))
    assert isinstance(rejected, QueryRejected) and "duration out of range" in str(rejected)
    assert "\x1b" not in str(rejected) and len(str(rejected)) < 400
    unavailable = query_failure(_client_error(503, b'{"status":"error","errorType":"timeout","error":"timed out"}'))
    assert not isinstance(unavailable, QueryRejected) and "503" in str(unavailable)
    assert not isinstance(query_failure(_client_error(502, b"<html>bad gateway</html>")), QueryRejected)
    run = deployed(prometheus=FakePrometheus(refuses="1:31: parse error: duration out of range"))
    run.cluster.running()
    run.once()
    metrics = run.condition("MetricsAvailable")
    assert (metrics["status"], metrics["reason"]) == ("False", "QueryRejected")
    assert "duration out of range" in metrics["message"] and "kvSaturationWindowSeconds" in metrics["message"]


def test_the_same_outage_is_said_the_same_way_every_time() -> None:
    """An unreachable Prometheus's message named a Python object's address and the whole query: each reconcile
    wrote a new message (a status write, a full resync) for the same outage."""
    texts = {failure_text(ConnectionError(
        f"HTTPConnectionPool(host='127.0.0.1', port=9): Max retries exceeded with url: /api/v1/query?query=max"
        f"%28x%29&timeout=5s (Caused by NewConnectionError('<urllib3.connection.HTTPConnection object at "
        f"{address}>: Failed to establish a new connection: [Errno 111] Connection refused'))"))
        for address in ("0x7f1a2b3c4d5e", "0x7f99aa00bb11")}
    (text,) = texts
    assert "Connection refused" in text and "0x" not in text and "max%28" not in text


def test_metrics_available_holds_still_while_no_pod_runs_the_plan() -> None:
    """During an outage a reconcile that found no pod of the current plan (a rollout, a restart) asked
    Prometheus nothing and wrote MetricsAvailable=True/Queried: the condition flickered."""
    run = deployed(prometheus=FakePrometheus(down=True))
    run.cluster.running()
    run.once()
    assert run.condition("MetricsAvailable")["reason"] == "PrometheusUnreachable"
    run.cluster.pod_list = []  # the plan's pods are being replaced
    run.once()
    metrics = run.condition("MetricsAvailable")
    assert (metrics["status"], metrics["reason"]) == ("False", "PrometheusUnreachable")
    assert run.prometheus is not None
    run.prometheus.down = False
    run.cluster.running()
    run.once()
    assert (run.condition("MetricsAvailable")["status"], run.condition("MetricsAvailable")["reason"]) == (
        "True", "Queried")


def test_the_deployment_watch_writes_ready_replicas_with_ready(handler_cluster: FakeCluster,
                                                               operator: Operator) -> None:
    """AVAILABLE (status.readyReplicas) read 0 right after Ready=True, until the next resync."""
    run = Run(QWEN_H100, cluster=handler_cluster)
    handler_cluster.apply_all = lambda objects, before_write=None: FakeCluster.apply_all(  # type: ignore[method-assign]
        handler_cluster, objects, before_write) and _not_available(handler_cluster)
    run.once()  # the Deployment is created; none of its pods is available yet
    assert run.condition("Ready")["status"] == "False" and run.status["readyReplicas"] == 0
    handler_cluster.llmd = {"metadata": {"name": NAME, "uid": "uid", "generation": 1, "resourceVersion": "7"},
                            "spec": QWEN_H100, "status": run.status}
    handler_cluster.deployment()["status"].update(replicas=1, availableReplicas=1)  # the pod became available
    operator.owner_changed(NAMESPACE, NAME)
    (patch,) = handler_cluster.status_patches
    ready = next(c for c in patch["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and (patch["readyReplicas"], patch["replicas"]) == (1, 1)


def _not_available(cluster: FakeCluster) -> int:
    cluster.deployment()["status"]["availableReplicas"] = 0
    return 1
