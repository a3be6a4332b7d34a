"""In-memory fakes of the Kubernetes and Prometheus calls the reconciler and the gatherer make.

They behave as the real services do where it matters here: objects keep their input hash, a changed
Deployment gets a new generation and is "rolled out" at once, a rejected object rejects the whole set before
anything is written (as the shell's dry run does), the status is updated with JSON merge-patch semantics.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from llm_autopilot.controller.calibration_store import CalibrationBook
from llm_autopilot.controller.gather import Gatherer
from llm_autopilot.controller.kube import ApplyRejected, LogUnavailable, NodeGPUs
from llm_autopilot.controller.lora_runtime import LoRAAnswers
from llm_autopilot.controller.metrics import MetricsUnavailable, QueryRejected
from llm_autopilot.controller.reconcile import Outcome, reconcile
from llm_autopilot.controller.runtime import Operator
from llm_autopilot.controller.settings import OperatorSettings
from llm_autopilot.controller.status_attestation import attestations_patch, status_key
from llm_autopilot.render.kubernetes import INPUT_HASH, PLAN_HASH

H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.compute.major": "9", "nvidia.com/gpu.compute.minor": "0"}
L4 = {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.memory": "23034",
      "nvidia.com/gpu.compute.major": "8", "nvidia.com/gpu.compute.minor": "9"}
NAME, NAMESPACE = "x", "ns"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what Kopf sends for the status): null deletes, objects merge."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class OperatorKilled(BaseException):
    """The operator process died here (a BaseException: no handler of the code under test catches it)."""


@dataclass
class FakeCluster:
    nodes: list[NodeGPUs] = field(default_factory=lambda: [NodeGPUs(dict(H100), 8, 2000.0),
                                                           NodeGPUs(dict(L4), 1, 120.0)])
    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pod_list: list[dict[str, Any]] = field(default_factory=list)
    #: pod name -> the previous log, or the exception reading it raises
    logs: dict[str, str | Exception] = field(default_factory=dict)
    log_reads: list[str] = field(default_factory=list)
    #: Job name -> its pods (the model cache's download)
    job_pod_list: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: pod name -> the running container's log (the cache download's progress)
    current_logs: dict[str, str | Exception] = field(default_factory=dict)
    #: the pods whose start-up log was read (verification's fallback)
    start_log_reads: list[str] = field(default_factory=list)
    #: (namespace, name, key) -> the value, or the exception reading it raises
    secrets: dict[tuple[str, str, str], str | Exception] = field(default_factory=dict)
    secret_reads: int = 0
    #: kind -> the API server's message refusing it
    reject: dict[str, str] = field(default_factory=dict)
    #: LLMDeployment status patches (handlers' Ready writer)
    status_patches: list[dict[str, Any]] = field(default_factory=list)
    #: (pod, condition) written on pods' status (the burn-in's readiness gate)
    pod_conditions: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    llmd: dict[str, Any] | None = None
    conflicts: int = 0
    #: (kind, name) of the objects deleted
    deleted: list[tuple[str, str]] = field(default_factory=list)
    #: the operator "dies" (OperatorKilled) right after this many more writes (status patches, object applies)
    die_after_writes: int | None = None

    def _wrote(self) -> None:
        if self.die_after_writes is not None:
            self.die_after_writes -= 1
            if self.die_after_writes <= 0:
                self.die_after_writes = None
                raise OperatorKilled("the operator was killed after this write")

    def gpu_nodes(self) -> list[NodeGPUs]:
        return list(self.nodes)

    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        if kind == "LLMDeployment":
            return copy.deepcopy(self.llmd)
        return copy.deepcopy(self.objects.get((kind, name)))

    def get_whole(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        return self.get(api_version, kind, name, namespace)

    def apply_all(self, objects: list[dict[str, Any]], before_write: Callable[[], None] | None = None) -> int:
        stale = [o for o in objects if (self.objects.get((o["kind"], o["metadata"]["name"])) or {}).get(
            "metadata", {}).get("annotations", {}).get(INPUT_HASH) != o["metadata"]["annotations"][INPUT_HASH]]
        for obj in stale:
            if obj["kind"] in self.reject:
                raise ApplyRejected(f"{obj['kind']} {obj['metadata']['name']}: {self.reject[obj['kind']]}")
        if before_write is not None:
            before_write()
        for obj in stale:
            live = self.objects.get((obj["kind"], obj["metadata"]["name"]))
            new = copy.deepcopy(obj)
            generation = int((live or {}).get("metadata", {}).get("generation", 0)) + 1
            new["metadata"]["generation"] = generation
            # the API server gives each object its uid at creation and keeps it (a delete by uid names that one)
            new["metadata"]["uid"] = ((live or {}).get("metadata", {}).get("uid")
                                      or f"uid-{obj['kind']}-{obj['metadata']['name']}")
            replicas = new["spec"].get("replicas", 0) if new["kind"] == "Deployment" else 0
            new["status"] = {"observedGeneration": generation, "updatedReplicas": replicas,
                             "availableReplicas": replicas}
            self.objects[(obj["kind"], obj["metadata"]["name"])] = new
            self._wrote()
        return len(stale)

    def delete(self, api_version: str, kind: str, name: str, namespace: str, *, uid: str) -> bool:
        live = self.objects.get((kind, name))
        if live is None or str(live["metadata"].get("uid", "")) != uid:
            return False
        del self.objects[(kind, name)]
        self.deleted.append((kind, name))
        self._wrote()
        return True

    def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.pod_list)

    def patch_pod_condition(self, namespace: str, pod: str, condition: dict[str, Any]) -> None:
        """A strategic merge of one condition by type, as the API server does it."""
        self.pod_conditions.append((pod, copy.deepcopy(condition)))
        for found in self.pod_list:
            if found["metadata"]["name"] == pod:
                status = found.setdefault("status", {})
                status["conditions"] = [c for c in status.get("conditions") or [] if c.get("type") != condition[
                    "type"]] + [copy.deepcopy(condition)]

    def previous_log(self, namespace: str, pod: str, container: str, *, tail_lines: int, limit_bytes: int) -> str:
        self.log_reads.append(pod)
        found = self.logs.get(pod, LogUnavailable("400 Bad Request: previous terminated container not found"))
        if isinstance(found, Exception):
            raise found
        return "\n".join(found.splitlines()[-tail_lines:])[-limit_bytes:]

    def job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.job_pod_list.get(job, []))

    def current_log(self, namespace: str, pod: str, container: str, *, tail_lines: int, limit_bytes: int) -> str:
        found = self.current_logs.get(pod, "")
        if isinstance(found, Exception):
            raise found
        return "\n".join(found.splitlines()[-tail_lines:])[-limit_bytes:]

    def start_log(self, namespace: str, pod: str, container: str, *, limit_bytes: int) -> str:
        self.start_log_reads.append(pod)
        found = self.current_logs.get(pod, LogUnavailable("404 Not Found: no log in the fake"))
        if isinstance(found, Exception):
            raise found
        return found[:limit_bytes]

    def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        self.secret_reads += 1
        found = self.secrets.get((namespace, name, key))
        if isinstance(found, Exception):
            raise found
        return found

    def patch_llmd_status(self, namespace: str, name: str, status: dict[str, Any],
                          resource_version: str | None = None) -> None:
        if self.conflicts:
            self.conflicts -= 1
            raise ApiException(status=409, reason="Conflict")
        self.status_patches.append(status)
        if self.llmd is not None:
            self.llmd["status"] = merge_patch(self.llmd.get("status") or {}, status)
        self._wrote()

    # --- helpers for tests ---------------------------------------------------------------------------

    def deployment(self, name: str = NAME) -> dict[str, Any]:
        return self.objects[("Deployment", name)]

    def plan_hash(self, name: str = NAME) -> str:
        return str(self.deployment(name)["spec"]["template"]["metadata"]["annotations"][PLAN_HASH])

    def crash(self, message: str = "", *, reason: str = "Error", exit_code: int = 1, restarts: int = 1,
              pod: str = "x-1", finished_at: str = "2026-12-01T00:00:05Z") -> None:
        """A termination of the current plan's pod, as the kubelet writes it."""
        terminated: dict[str, Any] = {"reason": reason, "exitCode": exit_code, "finishedAt": finished_at}
        if message:
            terminated["message"] = message
        self.pod_list = [{"metadata": {"name": pod, "annotations": {PLAN_HASH: self.plan_hash()}},
                          "status": {"containerStatuses": [{"name": "vllm", "restartCount": restarts,
                                                            "lastState": {"terminated": terminated}}]}}]

    def running(self, pod: str = "x-1") -> None:
        self.pod_list = [{"metadata": {"name": pod, "annotations": {PLAN_HASH: self.plan_hash()}},
                          "status": {"containerStatuses": [{"name": "vllm", "restartCount": 0}]}}]


@dataclass
class FakePrometheus:
    """Answers instant queries from ``answer(query)``; ``down`` makes every query fail."""

    answer: Callable[[str], float | None] = lambda _query: None
    down: bool = False
    #: Prometheus's error for a query it refuses (HTTP 400 bad_data), None: it accepts them
    refuses: str | None = None
    where: str = "Prometheus at http://prometheus.test"
    queries: list[str] = field(default_factory=list)

    def scalar(self, query: str) -> float | None:
        self.queries.append(query)
        if self.down:
            raise MetricsUnavailable("Prometheus query failed: ConnectionError: connection refused")
        if self.refuses is not None:
            raise QueryRejected(f"Prometheus refused the query (HTTP 400, bad_data): {self.refuses}")
        return self.answer(query)


def saturated(usage: float = 0.97, preemptions: float = 12.0, waiting: float = 8.0) -> Callable[[str], float | None]:
    """Prometheus answers for a KV cache at ``usage`` over the window, with preemptions and a queue."""
    def answer(query: str) -> float | None:
        if "kv_cache_usage_perc" in query:  # the combined saturation query starts with the usage
            return usage
        if "num_preemptions_total" in query:
            return preemptions
        return waiting if "num_requests_waiting" in query else None
    return answer


class FakeLabels:
    """The label reader (PrometheusClient.series) in memory: ``answer`` for every query, or raised."""

    where = "Prometheus at test"

    def __init__(self, answer: list[dict[str, str]] | Exception) -> None:
        self.answer = answer
        self.queries: list[str] = []

    def series(self, query: str) -> list[dict[str, str]]:
        self.queries.append(query)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@dataclass
class Run:
    """Successive reconciles of one object, its status carried over as the API server would."""

    spec: dict[str, Any]
    cluster: FakeCluster = field(default_factory=FakeCluster)
    prometheus: FakePrometheus | None = None
    status: dict[str, Any] = field(default_factory=dict)
    gatherer: Gatherer | None = None
    last: Outcome | None = None
    #: the KV calibration store (None: none), the object's name and its spec generation
    calibration: CalibrationBook | None = None
    name: str = NAME
    uid: str = "uid"
    generation: int = 1
    #: the burn-in runs (None: none)
    burn_ins: Any = None
    #: vLLM's answers to the LoRA calls, kept between the passes as the Operator keeps them
    lora_answers: LoRAAnswers = field(default_factory=LoRAAnswers)
    #: the operator's settings (the chart's switches)
    settings: OperatorSettings = field(default_factory=OperatorSettings)

    def __post_init__(self) -> None:
        self.gatherer = Gatherer(self.cluster, self.prometheus)

    def once(self) -> Outcome:
        """One reconcile; the status it writes directly (a remediation step, before the children) and the one
        Kopf writes after the handler are merged in order. An OperatorKilled leaves only the direct writes."""
        written = len(self.cluster.status_patches)
        try:
            out = reconcile(name=self.name, namespace=NAMESPACE, uid=self.uid, generation=self.generation,
                            spec_body=self.spec, status=copy.deepcopy(self.status), kube=self.cluster,
                            settings=self.settings, gatherer=self.gatherer, calibration=self.calibration,
                            burn_ins=self.burn_ins, lora_answers=self.lora_answers)
        finally:
            for patch in self.cluster.status_patches[written:]:
                self.status = merge_patch(self.status, patch)
        self.status = merge_patch(self.status, out.status)
        self.last = out
        return out

    def once_losing_status(self) -> Outcome:
        """One reconcile whose status write after the handler is lost (the operator died right after the children
        were written, or the patch failed): only what the reconcile wrote to the status itself stays."""
        before, written = copy.deepcopy(self.status), len(self.cluster.status_patches)
        out = self.once()
        self.status = before
        for patch in self.cluster.status_patches[written:]:
            self.status = merge_patch(self.status, patch)
        return out

    def condition(self, type_: str) -> dict[str, Any]:
        return next(c for c in self.status.get("conditions", []) if c["type"] == type_)

    @property
    def remediation(self) -> dict[str, Any]:
        return dict(self.status.get("remediation") or {})

    def own(self, section: str, value: Any) -> None:
        """status[section] as the operator records it: with its attestation (the reconcile's default key)."""
        self.status = merge_patch({**self.status, section: value},
                                  attestations_patch(status_key(), self.uid, {section: value}))

    def reasons(self) -> list[str]:
        return [reason for _, reason, _ in (self.last.events if self.last else [])]


def operator_on(cluster: Any, settings: OperatorSettings | None = None) -> Operator:
    """The Operator Kopf's startup builds, on an in-memory cluster and the environment's settings, without its
    watches (each reconcile reads the cluster). Handed to a handler in its memo: ``kopf.Memo(operator=...)``."""
    return Operator(settings or OperatorSettings.from_env(), cluster)
