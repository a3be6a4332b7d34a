"""Shell: what the pods of one LLMDeployment say of themselves -- vLLM's KV-cache figures (its cache_config_info
metric in Prometheus, else its start-up log) and the version each pod's vLLM reports on /version;
planner/verify.py and desired/ judge them, without I/O.

Every read is best effort and bounded: a pod neither source gives is a reading that says why, never an error.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, Self

import httpx

from llm_autopilot.controller.kube import LogUnavailable
from llm_autopilot.controller.metrics import MetricsUnavailable
from llm_autopilot.controller.observed import pod_ready
from llm_autopilot.domain import egress
from llm_autopilot.planner.verify import (
    ObservationError,
    Observed,
    PodReading,
    observed_from_cache_config_info,
    observed_from_log,
)
from llm_autopilot.remediation.saturation import pod_selector
from llm_autopilot.remediation.text import clean_line
from llm_autopilot.render import groups
from llm_autopilot.render.kubernetes import CONTAINER, PLAN_HASH, instance_selector
from llm_autopilot.render.vllm_args import VLLM_PORT
from llm_autopilot.vllm.metrics import CACHE_CONFIG_INFO
from llm_autopilot.vllm.startup import LABEL_NUM_BLOCKS

#: how long the operator waits for a pod's /version in all (best effort: a pod that does not answer says nothing)
VERSION_SECONDS = 2.0
#: pods whose vLLM version is remembered (by uid and IP)
REMEMBERED_VERSIONS = 4096


class PodSource(Protocol):
    """The Kubernetes calls the gatherer makes (Kube; an in-memory fake in tests)."""

    def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]: ...

    def previous_log(self, namespace: str, pod: str, container: str, *, tail_lines: int, limit_bytes: int) -> str:
        """The previous container's log tail; raises LogUnavailable."""
        ...

    def start_log(self, namespace: str, pod: str, container: str, *, limit_bytes: int) -> str:
        """The first bytes of the running container's log (vLLM's start-up lines); raises LogUnavailable."""
        ...


class LabelSource(Protocol):
    """Series of an instant query with their labels (PrometheusClient; an in-memory fake in tests)."""

    where: str

    def series(self, query: str) -> list[dict[str, str]]:
        """The labels of each series the query returns; raises MetricsUnavailable."""
        ...


#: how much of a running vLLM's log is read for its start-up KV-cache lines (they come after the model load,
#: about 20 KiB into the CPU build's log; a GPU's log with its compile lines stays far below this)
START_LOG_BYTES = 512 * 1024


class PodReader:
    """Reads the pods of a deployment (``pods``), Prometheus' info series (``labels``) and the pods' /version
    (``versions``)."""

    def __init__(self, pods: PodSource, *, labels: LabelSource | None = None,
                 versions: Callable[[str], str | None] | None = None) -> None:
        self.pods = pods
        #: a pod IP -> the version its vLLM reports (None: the pods' versions are not asked)
        self.versions = versions
        self._known_versions: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._versions_lock = threading.Lock()
        #: Prometheus for vLLM's info metrics: cache_config_info (verification; None: the pods' logs only) and
        #: lora_requests_info (a KV saturation's LoRA adapters; None: the evidence says nothing of them)
        self.labels = labels

    def reading(self, pods: PodSource) -> Self:
        """This reader reading pods (and their logs) from ``pods``, one reconcile's view of the cluster (in the
        operator: its watches, so no LIST of pods); what it remembers (crashes read, vLLM versions) is shared."""
        if pods is self.pods:
            return self
        view = copy.copy(self)
        view.pods = pods
        return view

    def ready_plan_pods(self, namespace: str, name: str, plan_hash: str) -> tuple[str, ...]:
        """The Ready pods that run the plan ``plan_hash`` (sorted: one order for the status)."""
        return tuple(sorted(str(p["metadata"]["name"]) for p in self.pods.pods(
            namespace, instance_selector(name)) if runs_plan(p, plan_hash) and pod_ready(p)))

    def kv_figures(self, namespace: str, pods: tuple[str, ...], *,
                   instance: str | None = None) -> tuple[PodReading, ...]:
        """vLLM's own KV-cache figures of these pods: its cache_config_info metric from Prometheus (one query for
        all), else the start-up lines of the pod's log (``pods/log``); with ``instance`` (the object's name),
        each pod's vLLM version as it reports it, and for a pod of a group across nodes its group, its rank (its
        pipeline stage) and its stage's own KV room, from its own log. Never raises: a pod neither source gives
        is a reading that says why."""
        if not pods:
            return ()
        listed: list[dict[str, Any]] = []
        if instance is not None:
            try:
                listed = self.pods.pods(namespace, instance_selector(instance))
            except Exception:  # best effort: the versions and ranks are then not known
                listed = []
        ranks = {str(p["metadata"]["name"]): rank for p in listed
                 if (rank := groups.rank_of((p.get("metadata") or {}).get("labels") or {})) is not None}
        readings = self._kv_figures(namespace, pods, ranks)
        if self.versions is None or not listed:
            return readings
        addresses = {str(p["metadata"]["name"]): (str((p.get("metadata") or {}).get("uid") or ""),
                                                  str((p.get("status") or {}).get("podIP") or "")) for p in listed}
        # a worker of a group serves no API: only the leaders (and single pods) are asked
        asked = [addresses[r.pod] for r in readings
                 if addresses.get(r.pod, ("", ""))[1] and r.stage in (None, 0)]
        versions = self._versions_of(asked)
        return tuple(dataclasses.replace(r, vllm_version=versions.get(addresses[r.pod]))
                     if r.pod in addresses and r.stage in (None, 0) else r for r in readings)

    def _versions_of(self, pods: list[tuple[str, str]]) -> dict[tuple[str, str], str | None]:
        """The vLLM version of each (uid, IP): a pod's is asked once (it cannot change while the pod lives),
        the others in parallel, within :data:`VERSION_SECONDS` each."""
        assert self.versions is not None
        ask = self.versions
        with self._versions_lock:
            found: dict[tuple[str, str], str | None] = {
                p: self._known_versions[p] for p in pods if p in self._known_versions}
        new = [p for p in pods if p not in found]
        if not new:
            return found
        with ThreadPoolExecutor(max_workers=min(8, len(new)), thread_name_prefix="vllm-version") as pool:
            answers = list(pool.map(lambda pod: ask(pod[1]), new))
        with self._versions_lock:
            for pod, version in zip(new, answers, strict=True):
                found[pod] = version
                if version is not None:
                    self._known_versions[pod] = version
            while len(self._known_versions) > REMEMBERED_VERSIONS:
                self._known_versions.popitem(last=False)
        return found

    def _kv_figures(self, namespace: str, pods: tuple[str, ...],
                    ranks: dict[str, tuple[str, int]] | None = None) -> tuple[PodReading, ...]:
        found: dict[str, dict[str, str]] = {}
        missing = "no Prometheus configured"
        if self.labels is not None:
            missing = f"no {CACHE_CONFIG_INFO} series in {self.labels.where}"
            try:
                for labels in self.labels.series(f"{CACHE_CONFIG_INFO}{{{pod_selector(namespace, list(pods))}}}"):
                    pod = labels.get("pod", "")
                    if pod not in found or _blocks(labels) < _blocks(found[pod]):
                        found[pod] = labels  # several engines (data parallel): the smallest pool
            except MetricsUnavailable as exc:
                missing = str(exc)
        readings = []
        for pod in pods:
            rank = (ranks or {}).get(pod)
            if rank is not None:
                readings.append(self._group_pod(namespace, pod, rank, found.get(pod), missing))
                continue
            problem = missing
            if pod in found:
                try:
                    readings.append(PodReading(pod, observed_from_cache_config_info(found[pod])))
                    continue
                except ObservationError as exc:
                    problem = str(exc)
            observed, log_problem = self._start_log(namespace, pod)
            if observed is not None:
                readings.append(PodReading(pod, observed))
            else:
                readings.append(PodReading(pod, problem=clean_line(f"{problem}; log: {log_problem}", 300)))
        return tuple(readings)

    def _group_pod(self, namespace: str, pod: str, rank: tuple[str, int], labels: dict[str, str] | None,
                   missing: str) -> PodReading:
        """A pod of a group across nodes: its stage's room from its own log (every node's first GPU prints its
        "Available KV cache memory"); the engine's figures only from the leader (rank 0, which runs the engine and
        serves its /metrics): Prometheus, else the log's "KV cache size" line."""
        group, stage = rank
        logged, log_problem = self._start_log(namespace, pod)
        room = logged.kv_cache_bytes if logged is not None else None
        stage_problem = "" if room is not None else clean_line(
            f"log: {log_problem}" if logged is None else "its log has no \"Available KV cache memory\" line", 300)
        if stage != 0:
            return PodReading(pod, group=group, stage=stage, stage_room=room, stage_problem=stage_problem)
        problem = missing
        if labels is not None:
            try:
                return PodReading(pod, observed_from_cache_config_info(labels), group=group, stage=stage,
                                  stage_room=room, stage_problem=stage_problem)
            except ObservationError as exc:
                problem = str(exc)
        if logged is not None and (logged.kv_cache_tokens is not None or logged.num_blocks is not None):
            # the log's room is this stage's, not the engine's: the engine's figure is its "KV cache size"
            return PodReading(pod, dataclasses.replace(logged, kv_cache_bytes=None), group=group, stage=stage,
                              stage_room=room, stage_problem=stage_problem)
        why = log_problem if logged is None else "no \"KV cache size\" line"
        return PodReading(pod, problem=clean_line(f"{problem}; log: {why}", 300), group=group, stage=stage,
                          stage_room=room, stage_problem=stage_problem)

    def _start_log(self, namespace: str, pod: str) -> tuple[Observed | None, str]:
        """The figures of a pod's start-up log, or why there are none."""
        try:
            return observed_from_log(self.pods.start_log(namespace, pod, CONTAINER, limit_bytes=START_LOG_BYTES)), ""
        except (LogUnavailable, ObservationError) as exc:
            return None, str(exc)
        except Exception as exc:  # best effort, as the crash log: any other failure is said, not raised
            return None, f"{type(exc).__name__}: {exc}"


def runs_plan(pod: dict[str, Any], plan_hash: str) -> bool:
    """Whether the pod runs the plan ``plan_hash`` (its annotation)."""
    return bool(((pod.get("metadata") or {}).get("annotations") or {}).get(PLAN_HASH) == plan_hash)


def _blocks(labels: dict[str, str]) -> int:
    value = labels.get(LABEL_NUM_BLOCKS, "")
    return int(value) if value.isdigit() else 0


#: how long the operator waits for a pod's /version in all (best effort: a pod that does not answer says nothing)
VERSION_SECONDS = 2.0
#: pods whose vLLM version is remembered (by uid and IP)
REMEMBERED_VERSIONS = 4096


def read_vllm_version(address: str, *, transport: httpx.BaseTransport | None = None) -> str | None:
    """The version the vLLM at ``address`` reports on its /version (None: it did not say). Never raises."""
    if egress.pod_address_problem(address) is not None:  # in-cluster by design; never loopback or metadata
        return None
    host = f"[{address}]" if ":" in address else address
    try:  # straight to the pod: no proxy from the environment; plain http, so no CA bundle is loaded (a restart
        # asks every pod, and loading the bundle cost more than the request)
        with httpx.Client(transport=transport, timeout=httpx.Timeout(VERSION_SECONDS / 2), trust_env=False,
                          verify=False) as client:
            response = client.get(f"http://{host}:{VLLM_PORT}/version")
        response.raise_for_status()
        found = response.json().get("version")
    except Exception:  # best effort: whatever fails, the pod did not say
        return None
    return found[:64] if isinstance(found, str) and found else None
