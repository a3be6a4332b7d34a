"""Shell: gather what the reconcile decides on before anything is decided -- the World (the model's
architecture from its source, the GPU nodes, the optional CRDs, the live workload shapes) and remediation's
evidence (pods, the previous container's log, Prometheus); desired/ and remediation/decide.py decide, without
I/O.

Every read is narrow and bounded: the pods of one deployment (from the pod watch in the operator), the last
lines of one previous log (read once per crash), the saturation rule's instant queries with a timeout (in the
operator asked once per namespace and round, see metrics.SaturationRounds). A log that cannot be read (403
without ``pods/log``, no previous container, the kubelet gone, a timeout; a simulated node) is not an error:
the evidence falls back to the termination message and says so.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx
from kubernetes.client.exceptions import ApiException

from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec, SourceStatus
from llm_autopilot.controller.adapters import read_adapter_configs
from llm_autopilot.controller.inspect_step import AdapterInspections
from llm_autopilot.controller.kube import LogUnavailable, NodeGPUs, api_message
from llm_autopilot.controller.metrics import (
    MetricsSource,
    MetricsUnavailable,
    PerObjectSaturation,
    QueryRejected,
    SaturationSource,
)
from llm_autopilot.controller.observed import burn_in_gate, containers_ready, pod_ready
from llm_autopilot.controller.settings import OperatorSettings
from llm_autopilot.controller.sources import resolve_spec_source
from llm_autopilot.desired.world import (
    AdapterReading,
    BurnInReading,
    GPUNode,
    PodBurnIn,
    SourceView,
    Target,
    World,
)
from llm_autopilot.domain.architecture import ModelArchitecture
from llm_autopilot.domain.burn_in import BurnInMeasurement
from llm_autopilot.hub.client import HubClient, ModelFiles
from llm_autopilot.hub.resolve import ModelResolutionError
from llm_autopilot.planner.verify import (
    ObservationError,
    Observed,
    PodReading,
    observed_from_cache_config_info,
    observed_from_log,
)
from llm_autopilot.remediation.classify import Classification
from llm_autopilot.remediation.decide import Evidence, Metrics
from llm_autopilot.remediation.evidence import (
    LOG_LIMIT_BYTES,
    LOG_TAIL_LINES,
    Crash,
    LogRead,
    Termination,
    classify_crash,
    latest_termination,
    rollout_complete,
)
from llm_autopilot.remediation.lora_slots import LoRAActivity, lora_query, read_activity, with_lora
from llm_autopilot.remediation.saturation import KV_SATURATION, SaturationRule, pod_selector
from llm_autopilot.remediation.text import clean_line
from llm_autopilot.render import groups
from llm_autopilot.render.autoscaling import KEDA_CRD
from llm_autopilot.render.kubernetes import CONTAINER, PLAN_HASH
from llm_autopilot.render.vllm_args import VLLM_PORT
from llm_autopilot.render.workload import Live
from llm_autopilot.vllm.metrics import CACHE_CONFIG_INFO
from llm_autopilot.vllm.startup import LABEL_NUM_BLOCKS

#: crashes whose log was read, per process (a resync must not read a log twice)
REMEMBERED_CRASHES = 512


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


__all__ = ["Gatherer", "PodSource", "SecretUnreadable", "Target", "WorldSource", "crd_installed", "hub_token",
           "read_adapters", "read_live", "read_model", "read_nodes", "read_vllm_version", "read_world", "secret"]


class Gatherer:
    """``metrics`` is asked per object (tools, tests); the operator gives ``saturation``, which batches."""

    def __init__(self, pods: PodSource, metrics: MetricsSource | None = None, *,
                 saturation: SaturationSource | None = None, rule: SaturationRule = KV_SATURATION,
                 remembered: int = REMEMBERED_CRASHES, labels: LabelSource | None = None,
                 versions: Callable[[str], str | None] | None = None) -> None:
        self.pods = pods
        #: a pod IP -> the version its vLLM reports (None: the pods' versions are not asked)
        self.versions = versions
        self._known_versions: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._versions_lock = threading.Lock()
        #: Prometheus for vLLM's info metrics: cache_config_info (verification; None: the pods' logs only) and
        #: lora_requests_info (a KV saturation's LoRA adapters; None: the evidence says nothing of them)
        self.labels = labels
        self.saturation = saturation or (PerObjectSaturation(metrics, rule) if metrics is not None else None)
        self.rule = rule
        self._crashes: OrderedDict[tuple[str, str], Crash] = OrderedDict()
        self._remembered = remembered

    def reading(self, pods: PodSource) -> Gatherer:
        """This gatherer reading pods (and their logs) from ``pods``, one reconcile's view of the cluster (in the
        operator: its watches, so no LIST of pods); what it remembers (crashes read, vLLM versions) is shared."""
        if pods is self.pods:
            return self
        view = copy.copy(self)
        view.pods = pods
        return view

    def kv_saturation(self, namespace: str, pods: list[str], *, window: int,
                      threshold: float) -> tuple[Metrics, str, Classification | None]:
        """What Prometheus says about these pods: (availability, where or why not, the signal if any)."""
        if self.saturation is None:
            return Metrics.NOT_CONFIGURED, "", None
        if not pods:  # nothing to ask about: Prometheus said nothing, so MetricsAvailable keeps what it says
            return Metrics.NOT_ASKED, "", None
        try:
            found = self.saturation.saturation(namespace, pods, window=window, threshold=threshold)
        except QueryRejected as exc:
            return Metrics.REJECTED, str(exc), None
        except MetricsUnavailable as exc:
            return Metrics.UNAVAILABLE, str(exc), None
        return Metrics.AVAILABLE, self.saturation.where, found

    def gather(self, target: Target) -> Evidence:
        pods = self.pods.pods(target.namespace, f"app.kubernetes.io/instance={target.name}")
        current = [str(p["metadata"]["name"]) for p in pods
                   if ((p.get("metadata") or {}).get("annotations") or {}).get(PLAN_HASH) == target.plan_hash]
        rollout = rollout_complete(target.deployment, plan_hash=target.plan_hash, plan_hash_annotation=PLAN_HASH,
                                   replicas=target.replicas)
        metrics, detail, saturation = self.kv_saturation(target.namespace, current, window=target.kv_window,
                                                         threshold=target.kv_threshold)
        if metrics in (Metrics.UNAVAILABLE, Metrics.REJECTED):
            return Evidence(None, None, metrics, detail, rollout, target.plan_hash)
        if saturation is not None and target.lora:
            saturation = with_lora(saturation, self.lora_activity(target.namespace, current))
        termination = latest_termination(pods, container=CONTAINER, plan_hash=target.plan_hash,
                                         plan_hash_annotation=PLAN_HASH)
        crash = self._crash(target, termination) if termination is not None else None
        return Evidence(crash, saturation, metrics, detail, rollout, target.plan_hash)

    def lora_activity(self, namespace: str, pods: list[str]) -> tuple[LoRAActivity, ...]:
        """Each pod's newest LORA_REQUESTS_INFO series (one instant query for all). Never raises: Prometheus
        down or no series is no activity, and the saturation evidence stays as the rule gave it."""
        if self.labels is None or not pods:
            return ()
        try:
            found = self.labels.series(lora_query(pod_selector(namespace, pods)))
        except MetricsUnavailable:
            return ()
        return tuple(read_activity(labels) for labels in found)

    def ready_plan_pods(self, namespace: str, name: str, plan_hash: str) -> tuple[str, ...]:
        """The Ready pods that run the plan ``plan_hash`` (sorted: one order for the status)."""
        return tuple(sorted(str(p["metadata"]["name"]) for p in self.pods.pods(
            namespace, f"app.kubernetes.io/instance={name}") if _runs(p, plan_hash) and pod_ready(p)))

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
                listed = self.pods.pods(namespace, f"app.kubernetes.io/instance={instance}")
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

    def _crash(self, target: Target, t: Termination) -> Crash:
        if t.key == target.last_evidence or not t.needs_log:
            return classify_crash(t)  # already acted on, or the pod status says all
        seen = (target.namespace, t.key)
        if seen in self._crashes:
            self._crashes.move_to_end(seen)
            return self._crashes[seen]
        try:
            log = LogRead(text=self.pods.previous_log(target.namespace, t.pod, CONTAINER, tail_lines=LOG_TAIL_LINES,
                                                      limit_bytes=LOG_LIMIT_BYTES))
        except LogUnavailable as exc:
            log = LogRead(unavailable=str(exc))
        except Exception as exc:  # best-effort evidence: any other failure falls back the same way
            log = LogRead(unavailable=f"{type(exc).__name__}: {exc}")
        crash = classify_crash(t, log)
        self._crashes[seen] = crash
        while len(self._crashes) > self._remembered:
            self._crashes.popitem(last=False)
        return crash


class BurnIns(Protocol):
    """The burn-in runs the operator keeps (controller/burn_in_load.py's BurnInRunner)."""

    def result(self, uid: str) -> BurnInMeasurement | None: ...

    def running(self, uid: str) -> bool: ...


def read_burn_in(pods: PodSource, runs: BurnIns, namespace: str, name: str, plan_hash: str) -> BurnInReading:
    """The plan ``plan_hash``'s pods as the burn-in sees them (not those being deleted), sorted by name."""
    found = []
    for pod in pods.pods(namespace, f"app.kubernetes.io/instance={name}"):
        meta = pod.get("metadata") or {}
        if not _runs(pod, plan_hash) or meta.get("deletionTimestamp"):
            continue
        uid = str(meta.get("uid") or "")
        group, rank = groups.rank_of(meta.get("labels") or {}) or (None, None)
        found.append(PodBurnIn(pod=str(meta.get("name")), uid=uid,
                               ip=(pod.get("status") or {}).get("podIP") or None,
                               containers_ready=containers_ready(pod), gate=burn_in_gate(pod),
                               measurement=runs.result(uid) if uid else None, running=bool(uid) and runs.running(uid),
                               group=group, rank=rank, oom_killed_at=_oom_killed_at(pod)))
    return BurnInReading(plan_hash, tuple(sorted(found, key=lambda p: p.pod)))


def _oom_killed_at(pod: dict[str, Any]) -> datetime | None:
    """When the kubelet last recorded the vLLM container OOM-killed (None: never, or no readable time)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") != CONTAINER:
            continue
        for state in (cs.get("state") or {}, cs.get("lastState") or {}):
            terminated = state.get("terminated") or {}
            if terminated.get("reason") == "OOMKilled":
                try:
                    at = datetime.fromisoformat(str(terminated.get("finishedAt")))
                except ValueError:
                    return None
                return at if at.tzinfo is not None else at.replace(tzinfo=UTC)  # the kubelet's times are UTC
    return None


def _runs(pod: dict[str, Any], plan_hash: str) -> bool:
    return bool(((pod.get("metadata") or {}).get("annotations") or {}).get(PLAN_HASH) == plan_hash)


def _blocks(labels: dict[str, str]) -> int:
    value = labels.get(LABEL_NUM_BLOCKS, "")
    return int(value) if value.isdigit() else 0


# ---- the World -------------------------------------------------------------------------------------------

#: how long the operator waits for a pod's /version in all (best effort: a pod that does not answer says nothing)
VERSION_SECONDS = 2.0
#: pods whose vLLM version is remembered (by uid and IP)
REMEMBERED_VERSIONS = 4096


def read_vllm_version(address: str, *, transport: httpx.BaseTransport | None = None) -> str | None:
    """The version the vLLM at ``address`` reports on its /version (None: it did not say). Never raises."""
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


class WorldSource(Protocol):
    """The Kubernetes reads of the World (Kube, the watches' WatchedCluster; in-memory fakes in tests)."""

    def gpu_nodes(self) -> list[NodeGPUs]: ...

    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None: ...

    def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        """None when the Secret or key does not exist; raises ApiException otherwise."""
        ...


class SecretUnreadable(RuntimeError):
    """The Hub token Secret exists (or may) but could not be read, e.g. 403 without `get secrets`."""


def secret(kube: WorldSource, namespace: str, name: str, key: str, what: str) -> str:
    """A Secret's value the operator needs itself (the Hub token, S3 keys); raises with what to do."""
    try:
        value = kube.secret_value(namespace, name, key)
    except ApiException as exc:
        hint = ("; grant the operator `get` on secrets (the chart: rbac.readSecrets=true)"
                if exc.status == 403 else "")
        raise SecretUnreadable(f"cannot read Secret {name!r} (key {key!r}) for {what} in namespace "
                               f"{namespace}: {api_message(exc)}{hint}") from exc
    if value is None:
        raise ModelResolutionError(f"Secret {name!r} (key {key!r}) for {what} was not found in "
                                   f"namespace {namespace}")
    return value


def hub_token(spec: LLMDeploymentSpec, namespace: str, kube: WorldSource) -> str | None:
    ref = spec.model.hub_token_secret_ref
    if ref is None:
        return None
    return secret(kube, namespace, ref.name, ref.key, "the Hub token")


class LazyTokenHubClient(HubClient):
    """Reads the token Secret only when the Hub is really called: never for catalog or inline models."""

    def __init__(self, token: Callable[[], str | None], *, timeout: float) -> None:
        super().__init__(timeout=timeout)
        self._token_source = token
        self._timeout_seconds = timeout

    def fetch(self, repo_id: str, revision: str | None = None) -> ModelFiles:
        return HubClient(token=self._token_source(), timeout=self._timeout_seconds).fetch(repo_id, revision)


def read_model(spec: LLMDeploymentSpec, namespace: str, kube: WorldSource, settings: OperatorSettings,
               volume: ModelFiles | None = None) -> ModelArchitecture:
    """The model's architecture from its source (``volume``: what a pvc:// source's inspect Job read); raises
    ModelResolutionError (and its kinds) or SecretUnreadable."""
    return read_model_source(spec, namespace, kube, settings, volume)[0]


def read_model_source(spec: LLMDeploymentSpec, namespace: str, kube: WorldSource, settings: OperatorSettings,
                      volume: ModelFiles | None = None, recorded: SourceStatus | None = None,
                      ) -> tuple[ModelArchitecture, SourceStatus | None]:
    """:func:`read_model`, and what an s3:// source's reading leaves for status.source (``recorded``: the one
    kept there, so unchanged objects are not read again)."""
    return resolve_spec_source(
        spec, hub=LazyTokenHubClient(lambda: hub_token(spec, namespace, kube), timeout=settings.hub_timeout_seconds),
        secret=lambda name, key, what: secret(kube, namespace, name, key, what),
        timeout=settings.hub_timeout_seconds, volume=volume, recorded=recorded)


def read_live(kube: WorldSource, name: str, namespace: str, lws_available: bool) -> Live:
    """The shapes that exist: one GET each (a LeaderWorkerSet only where its CRD is installed)."""
    found: list[int] = []
    while kube.get("apps/v1", "StatefulSet", groups.group_name(name, len(found)), namespace) is not None:
        found.append(len(found))
    lws = lws_available and kube.get(groups.LWS_API_VERSION, "LeaderWorkerSet", name, namespace) is not None
    return Live(lws_available=lws_available, deployment=kube.get("apps/v1", "Deployment", name, namespace) is not None,
                leader_worker_set=lws, groups=tuple(found))


def read_nodes(kube: WorldSource) -> tuple[GPUNode, ...]:
    return tuple(GPUNode(dict(n.labels), n.allocatable_gpus, n.allocatable_memory_gib) for n in kube.gpu_nodes())


def crd_installed(kube: WorldSource, name: str) -> bool:
    return kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name, "") is not None


def read_adapters(spec: LLMDeploymentSpec, namespace: str, kube: WorldSource, settings: OperatorSettings,
                  inspected: AdapterInspections | None = None) -> AdapterReading:
    """The LoRA adapters' adapter_config.json files (on every pass: the Hub client's cache answers an unchanged
    file with one HEAD request; an s3:// adapter's is one HEAD and one GET; a pvc:// adapter's is what its inspect
    Job read, ``inspected``); nothing to read without adapters."""
    return read_adapter_configs(spec, lambda: hub_token(spec, namespace, kube), timeout=settings.hub_timeout_seconds,
                                secret=lambda name, key, what: secret(kube, namespace, name, key, what),
                                inspected=inspected)


def read_world(spec: LLMDeploymentSpec, name: str, namespace: str, kube: WorldSource,
               settings: OperatorSettings, volume: ModelFiles | None = None,
               recorded: SourceStatus | None = None, adapters: AdapterInspections | None = None) -> World:
    """Everything one reconcile of namespace/name decides on, read once before deciding: the model first (its
    failure is the reconcile's answer; ``recorded``: status.source, an s3:// source's kept reading, which the
    World's ``source`` then carries), then the GPU nodes, the CRDs (KEDA's only when spec.autoscaling asks for it),
    the live shapes and the LoRA adapters' configs (``adapters``: what the pvc:// adapters' inspect Jobs read)."""
    (model, reading), nodes = read_model_source(spec, namespace, kube, settings, volume, recorded), read_nodes(kube)
    asked = (groups.LWS_CRD, *((KEDA_CRD,) if spec.autoscaling is not None else ()))
    crds = frozenset(c for c in asked if crd_installed(kube, c))
    return World(model, nodes, crds, read_live(kube, name, namespace, groups.LWS_CRD in crds),
                 adapters=read_adapters(spec, namespace, kube, settings, adapters),
                 source=SourceView(reading) if reading is not None else None)
