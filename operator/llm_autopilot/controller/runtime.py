"""The running operator: one `Operator` owns what a process keeps between Kopf's handler calls (settings, the API
client, the gatherer, burn-in runs, the calibration book, the quiet memory, the outage, the last resync, the
operator's own watches and their Deployment triggers, the per-object locks, the webhook's threads), and writes the
calls into controller/reconcile.py once. controller/handlers.py builds it at Kopf's startup and delegates to it.

Nodes, the operator's children and their pods come from the operator's own watches (controller/informers.py),
never from a LIST per reconcile; a resync that finds nothing changed is quiet (controller/quiet.py); the admission
webhook has threads of its own.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, cast

import kopf
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from llm_autopilot.api import GROUP, VERSION
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.controller import reconcile as reconciling
from llm_autopilot.controller import telemetry
from llm_autopilot.controller.access import referenced_secrets, unreadable_secrets_message
from llm_autopilot.controller.adapters import admission_check
from llm_autopilot.controller.admission import NodeView, review
from llm_autopilot.controller.burn_in_load import BurnInRunner
from llm_autopilot.controller.calibration_store import CalibrationBook
from llm_autopilot.controller.gather import Gatherer
from llm_autopilot.controller.informers import NotSynced, Watches
from llm_autopilot.controller.kube import Kube, load_config
from llm_autopilot.controller.lora_runtime import LoRAAnswers
from llm_autopilot.controller.observed import (
    Summary,
    Watched,
    WatchedCluster,
    current_pods,
    llmd_summary,
    operator_watches,
)
from llm_autopilot.controller.quiet import QuietMemory
from llm_autopilot.controller.reconcile import Outcome, gatherer_for
from llm_autopilot.controller.settings import OperatorSettings
from llm_autopilot.desired.world import GPUNode
from llm_autopilot.remediation.text import clean_line
from llm_autopilot.render.kubernetes import OWNER_LABEL

logger = logging.getLogger(__name__)

#: per adapter_config.json read by the webhook (an unread one is admitted with a warning, read again later)
ADAPTER_TIMEOUT_SECONDS = 3.0
#: all of the webhook's adapter reads (a Hub that does not answer: admitted with a warning, read again later)
ADAPTER_BUDGET_SECONDS = 4.0
#: how long a handler waits for the watches' first listings before it is retried (a TemporaryError)
SYNC_WAIT_SECONDS = 60.0
SYNC_RETRY_SECONDS = 5.0
#: the API server answers these while it is up but cannot serve (a restart, etcd away)
_UNAVAILABLE_STATUSES = frozenset({502, 503, 504})
#: why Kopf stops timers when this replica must not act: paused for a peer, or exiting
_STANDING_DOWN = kopf.DaemonStoppingReason.OPERATOR_PAUSING | kopf.DaemonStoppingReason.OPERATOR_EXITING


class ObjectLocks:
    """Kopf runs a change handler and a timer of one object at the same time; they and the Deployment watch's
    reconcile all hold the object's lock, so no two reconciles of one object overlap in this process."""

    def __init__(self) -> None:
        #: uid -> (its lock, how many reconciles hold or wait for it); an entry goes with its last user, so the
        #: table holds only the objects being reconciled, not every uid ever seen
        self.table: dict[str, tuple[threading.Lock, int]] = {}
        self._guard = threading.Lock()

    @contextmanager
    def held(self, uid: str) -> Iterator[None]:
        with self._guard:
            lock, users = self.table.get(uid, (threading.Lock(), 0))
            self.table[uid] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self.table[uid]
                if users == 1:
                    del self.table[uid]
                else:
                    self.table[uid] = (lock, users - 1)

    def forget(self, uid: str) -> None:
        with self._guard:
            self.table.pop(uid, None)


def api_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the Kubernetes API server could not be reached (not what it answered)."""
    if isinstance(exc, ApiException):
        return exc.status in _UNAVAILABLE_STATUSES
    return isinstance(exc, urllib3.exceptions.HTTPError | OSError)


class Outage:
    """An unreachable API server is one log line per outage (and one when it is back), not a traceback per
    resync: every reconcile fails the same way until it returns, and the next resync retries anyway."""

    def __init__(self) -> None:
        self._since: float | None = None
        self._lock = threading.Lock()

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            first, self._since = self._since is None, self._since or time.monotonic()
        if first:
            logger.warning("the Kubernetes API server is unreachable (%s); reconciles wait for it (said once per "
                           "outage)", clean_line(f"{type(exc).__name__}: {exc}", 300))

    def reached(self) -> None:
        with self._lock:
            since, self._since = self._since, None
        if since is not None:
            logger.warning("the Kubernetes API server is reachable again after %.0f s", time.monotonic() - since)


def attempt(run: Callable[[], Outcome], *, outage: Outage, reached: bool = True) -> Outcome | None:
    """Run one reconcile; None when the API server could not be reached (said once per outage: the resync
    retries, and a change handler's spec is reconciled by it too). Any other failure is counted and raised.
    ``reached``: a full pass that got an answer ends the outage (a quiet resync asked nothing)."""
    try:
        out = run()
    except Exception as exc:
        telemetry.RECONCILES.labels("error").inc()
        if api_unreachable(exc):
            outage.failed(exc)
            return None
        raise
    if reached and out.full:
        outage.reached()
    return out


class OwnerTriggers:
    """The Deployment watch's changes as the LLMDeployments to reconcile, on threads of their own: a key queued
    again before its turn is reconciled once (reading the watches as they are then), and one that changes while
    it is reconciled is queued again (client-go's work queue). ``context``: Kopf's, where kopf.event posts to
    (None until Kopf handed over its first event)."""

    def __init__(self, handle: Callable[[str, str], None], workers: int = 2,
                 context: Callable[[], contextvars.Context | None] = lambda: None) -> None:
        self.handle = handle
        self.workers = workers
        self.context = context
        self._queue: queue.SimpleQueue[tuple[str, str] | None] = queue.SimpleQueue()
        self._pending: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def deployment_changed(self, event_type: str, body: Mapping[str, Any]) -> None:
        """A Deployment event from the watch (a deletion: the resync re-creates it; nothing here)."""
        meta = body.get("metadata") or {}
        owner, namespace = (meta.get("labels") or {}).get(OWNER_LABEL), meta.get("namespace")
        if event_type == "DELETED" or not owner or not namespace:
            return
        self.put((str(namespace), str(owner)))

    def put(self, key: tuple[str, str]) -> None:
        with self._lock:
            if key in self._pending:
                return
            self._pending.add(key)
        self._queue.put(key)

    def start(self) -> None:
        self._threads = [threading.Thread(target=self._work, name=f"deployment-trigger-{i}", daemon=True)
                         for i in range(self.workers)]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        for _ in self._threads:
            self._queue.put(None)

    def _work(self) -> None:
        while (key := self._queue.get()) is not None:
            with self._lock:
                self._pending.discard(key)
            posting = self.context()
            try:
                if posting is not None:  # kopf.event posts through Kopf's context
                    posting.copy().run(self.handle, *key)
                else:
                    self.handle(*key)
            except Exception:  # one object's failure must not stop the triggers of the others
                logger.exception("the reconcile of %s/%s after its Deployment changed failed", *key)


def _values_of(index: Any) -> list[Any]:
    store = index.get(None) if index is not None else None
    return list(store) if store is not None else []


class Operator:
    """What one operator process keeps, and the few things Kopf's handlers ask of it. Built once, at Kopf's
    startup (``connect``); the tests build it on an in-memory cluster. Without started watches (the tests) every
    reconcile reads the API server."""

    def __init__(self, settings: OperatorSettings, kube: Kube, *, peering: bool = False) -> None:
        self.settings = settings
        self.kube = kube
        #: whether this replica coordinates with others (Kopf peering): then it acts only while its resyncs run
        self.peering = peering
        #: one per process: it remembers which crashes' logs were read
        self.gatherer: Gatherer = gatherer_for(kube, settings)
        #: the burn-in runs on new pods (spec.verification.burnIn), in background threads
        self.burn_ins = BurnInRunner()
        #: vLLM's answers to the LoRA load and unload calls, for the next pass (in memory: empty after a restart)
        self.lora_answers = LoRAAnswers()
        #: the KV calibration store as last read (None: LLM_AUTOPILOT_CALIBRATION_NAMESPACE off, or outside a
        #: cluster without it)
        self.calibration: CalibrationBook | None = None if settings.calibration_namespace is None else (
            CalibrationBook(kube, settings.calibration_namespace, ttl_seconds=settings.calibration_read_seconds))
        #: the last full reconcile's inputs per LLMDeployment, for the quiet resync
        self.quiet = QuietMemory()
        self.outage = Outage()
        self.locks = ObjectLocks()
        #: (namespace, name) -> the LLMDeployment as the Deployment watch's trigger needs it (llmd_summary): every
        #: one Kopf has shown, kept by its event handler
        self.llmdeployments: dict[tuple[str, str], Summary] = {}
        #: when this process last ran a resync (time.monotonic(); -inf: never). Not 0: the monotonic clock counts
        #: from the node's boot, so 0 would read as "a moment ago" on a node up for less than two intervals.
        self.last_resync = float("-inf")
        #: the stop flag Kopf handed the last resync that ran (its timer's): Kopf sets it when it pauses this replica
        self.resync_stopped: kopf.DaemonStopped | None = None
        self.watches: Watches | None = None
        self.triggers: OwnerTriggers | None = None
        #: Kopf's context, where kopf.event posts to, for the triggers' own threads (set at Kopf's first event)
        self.kopf_context: contextvars.Context | None = None
        #: the webhook's reviews run here, never queued behind reconciles in Kopf's executor
        self.admission_executor = ThreadPoolExecutor(max_workers=settings.admission_workers,
                                                     thread_name_prefix="admission")
        #: the webhook's view of the GPU nodes (the node index, once it caught up with one LIST)
        self.node_view = NodeView(self.listed_gpu_nodes)

    @classmethod
    def connect(cls, settings: OperatorSettings, *, peering: bool = False) -> Operator:
        """The operator on the cluster the kubeconfig (or the pod's service account) names."""
        load_config()
        return cls(settings, Kube(), peering=peering)

    # ---- start and stop ------------------------------------------------------------------------------------

    def start(self) -> None:
        """The reconciles' watches (nodes, children, pods) and the Deployment watch's triggers, on threads of their
        own; the handlers wait for their first listings (``watched``)."""
        telemetry.CHECKED.set_function(lambda: len(self.quiet))
        triggers = OwnerTriggers(self.owner_changed, context=lambda: self.kopf_context)
        watches = operator_watches(self.kube, self.settings.namespaces, on_deployment=triggers.deployment_changed)
        self.watches, self.triggers = watches, triggers
        watches.start()
        triggers.start()

    def stop(self) -> None:
        for running in (self.watches, self.triggers):
            if running is not None:
                running.stop()
        self.watches = self.triggers = None

    def watched(self, namespace: str) -> Watched | None:
        """The watches, once each that covers ``namespace`` holds its first listing (None: not started, as in unit
        tests that call the handlers directly: the reconcile then reads the API server)."""
        if self.watches is None:
            return None
        try:
            self.watches.wait_synced(SYNC_WAIT_SECONDS, namespace)
        except NotSynced as exc:
            raise kopf.TemporaryError(str(exc), delay=SYNC_RETRY_SECONDS) from exc
        w = self.watches
        return Watched(w["nodes"], w["deployments"], w["services"], w["disruption_budgets"], w["pods"],
                       crds=w["crds"])

    # ---- what Kopf shows of the LLMDeployments ---------------------------------------------------------------

    def seen(self, event_type: str | None, body: Mapping[str, Any], uid: str | None) -> None:
        """Every event of an LLMDeployment: what the Deployment watch's trigger reads of it; a deletion forgets it
        (its quiet memory, its lock, its pods' burn-in results and LoRA answers: no reconcile asks for them again)."""
        if self.kopf_context is None:
            self.kopf_context = contextvars.copy_context()
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        if event_type != "DELETED":
            self.llmdeployments[key] = llmd_summary(body)
            return
        self.llmdeployments.pop(key, None)
        if uid:
            self.quiet.forget(uid)
            self.locks.forget(uid)
            self.burn_ins.forget_owner(uid)
            self.lora_answers.forget_owner(uid)

    def resync_ran(self, stopped: kopf.DaemonStopped | None) -> None:
        self.last_resync = time.monotonic()
        if stopped is not None:
            self.resync_stopped = stopped

    def active(self) -> bool:
        """Whether this replica is the one that reconciles: always, unless it runs with peering; then only while its
        resyncs run, and not once Kopf has stopped their timers to pause it (at once: the stop flag's reason), nor
        two intervals after the last one ran (its timer ended otherwise, e.g. its object was deleted). With
        peering, Kopf stops every timer of a replica it pauses (a standby), but not the operator's own watches."""
        if not self.peering:
            return True
        stopped = self.resync_stopped
        if stopped is not None and stopped.is_set() and stopped.reason is not None and stopped.reason & _STANDING_DOWN:
            return False
        return time.monotonic() - self.last_resync < 2 * self.settings.resync_seconds

    # ---- reconciles ------------------------------------------------------------------------------------------

    def reconcile(self, body: Mapping[str, Any], watched: Watched | None) -> Outcome | None:
        """One full reconcile of the object Kopf handed over (None: the API server could not be reached)."""
        meta = body.get("metadata") or {}
        return attempt(functools.partial(self._locked, body, str(meta.get("namespace")), watched, full=True),
                       outage=self.outage)

    def resync(self, body: Mapping[str, Any]) -> Outcome | None:
        """The timer's pass: quiet (nothing planned, rendered or read) when nothing the last full reconcile read
        has changed; a full reconcile without the watches (a direct call)."""
        meta = body.get("metadata") or {}
        namespace = str(meta.get("namespace"))
        watched = self.watched(namespace)
        if watched is None:
            return self.reconcile(body, None)
        out = attempt(functools.partial(self._locked, body, namespace, watched, full=False), outage=self.outage)
        if out is not None:
            telemetry.RESYNCS.labels("full" if out.full else "quiet").inc()
        return out

    def _locked(self, body: Mapping[str, Any], namespace: str, watched: Watched | None, *, full: bool) -> Outcome:
        """The one place the reconcile is called, under the object's lock: a full pass (on the watches when there
        are any), or the resync's gate, whose inputs are remembered."""
        meta = body.get("metadata") or {}
        name, uid = str(meta.get("name")), str(meta.get("uid"))
        spec_body, status = dict(body.get("spec") or {}), dict(body.get("status") or {})
        with self.locks.held(uid):
            if full or watched is None:
                return reconciling.reconcile(
                    name=name, namespace=namespace, uid=uid, generation=meta.get("generation"), spec_body=spec_body,
                    status=status, kube=self.kube if watched is None else WatchedCluster(self.kube, watched),
                    settings=self.settings, gatherer=self.gatherer, resource_version=meta.get("resourceVersion"),
                    calibration=self.calibration, burn_ins=self.burn_ins, lora_answers=self.lora_answers)
            return reconciling.resync(
                name=name, namespace=namespace, uid=uid, generation=meta.get("generation"),
                resource_version=meta.get("resourceVersion"), spec_body=spec_body, status=status,
                observed=watched.digest_of(namespace, name),
                current_pods=functools.partial(current_pods, watched.pods_of(namespace, name)),
                kube=WatchedCluster(self.kube, watched), settings=self.settings, gatherer=self.gatherer,
                memory=self.quiet, calibration=self.calibration, burn_ins=self.burn_ins,
                lora_answers=self.lora_answers)

    def owner_changed(self, namespace: str, owner: str, watched: Watched | None = None) -> None:
        """A change of the vLLM Deployment triggers its LLMDeployment's reconcile, which alone writes Ready (and the
        replica counts with it): this watch decides and writes no condition of its own.

        Nothing is read when the watches show the reconcile's inputs unchanged since its last full pass (the quiet
        resync's test, without asking Prometheus); otherwise the LLMDeployment is read and reconciled as a resync
        would, and the status written with the resourceVersion read (a conflict: read again). One Kopf has not shown
        yet (not listed yet after a start, or deleted) is read. A standby replica (peering) does nothing."""
        if not self.active():
            return
        if watched is None:
            try:
                watched = self.watched(namespace)
            except kopf.TemporaryError:
                return  # not listed yet: the resync reconciles it
        indexed = self.llmdeployments.get((namespace, owner))
        if indexed is not None and watched is not None and self.quiet_for(indexed.body, watched, namespace, owner):
            return
        for _ in range(3):  # the status moved under us (409): read it again
            parent = self.kube.get(f"{GROUP}/{VERSION}", "LLMDeployment", owner, namespace)
            if parent is None:
                return
            meta = parent.get("metadata") or {}
            if (parent.get("status") or {}).get("observedGeneration") != meta.get("generation"):
                return  # this generation's first reconcile has not reported yet: it reads the Deployment itself
            if (out := attempt(functools.partial(self._locked, parent, namespace, watched, full=False),
                               outage=self.outage, reached=False)) is None:
                return
            telemetry.RECONCILES.labels("retry" if out.retry else "ok").inc()
            telemetry.WRITES.inc(out.writes)
            if out.status:
                try:
                    self.kube.patch_llmd_status(namespace, str(meta.get("name")), out.status,
                                                resource_version=meta.get("resourceVersion"))
                except ApiException as exc:
                    if exc.status != 409:
                        raise
                    continue
                telemetry.WRITES.inc()
            # once written (a 409 above decided, and records, again), before the Events: each is a POST
            telemetry.observe_recoveries(out.recoveries)
            for type_, reason, message in out.events:
                kopf.event(kopf.Body(cast(kopf.RawBody, dict(parent))), type=type_, reason=reason,
                           message=message[:1000])
            return  # a retry the reconcile asks for is the resync's (its timer runs anyway)

    def quiet_for(self, indexed: Mapping[str, Any], watched: Watched, namespace: str, name: str) -> bool:
        """Whether the last full reconcile of the indexed LLMDeployment read what the watches show now."""
        meta = indexed.get("metadata") or {}
        seen = self.quiet.get(str(meta.get("uid")))
        if seen is None or not meta.get("resourceVersion"):
            return False
        key = reconciling.quiet_key(generation=meta.get("generation"), resource_version=meta.get("resourceVersion"),
                                    spec_body={}, status={}, observed=watched.digest_of(namespace, name),
                                    settings=self.settings)
        return reconciling.unchanged(seen, key)

    # ---- the admission webhook -------------------------------------------------------------------------------

    def listed_gpu_nodes(self) -> list[GPUNode]:
        """The GPU nodes from one LIST (the webhook's answer while the node index is still filling)."""
        return [GPUNode(n.labels, n.allocatable_gpus, n.allocatable_memory_gib) for n in self.kube.gpu_nodes()]

    def review_nodes(self, index: Any) -> tuple[GPUNode, ...]:
        """The GPU nodes the webhook plans on: the node watch's index (each summary as WatchedCluster.gpu_nodes
        reads it); while it is still filling, one LIST's answer (admission.NodeView documents when)."""
        indexed = [GPUNode(dict(s.body["metadata"]["labels"]), int(s.body["gpus"]),
                           float(s.body.get("memoryGiB", 0.0))) for s in _values_of(index)]
        return self.node_view.nodes(indexed)

    def review(self, spec: dict[str, Any], name: str, userinfo: Mapping[str, Any], namespace: str | None,
               nodes_index: Any = None) -> tuple[list[str], str | None, int]:
        """(warnings, the refusal or None, its HTTP code: 403 for access, 422 for a spec that cannot work)."""
        verdict = review(spec, self.settings.default_vllm_version, name=name, namespace=namespace,
                         nodes=lambda: self.review_nodes(nodes_index), prometheus_url=self.settings.prometheus_url,
                         adapters=lambda s: admission_check(s, timeout=ADAPTER_TIMEOUT_SECONDS,
                                                            budget=ADAPTER_BUDGET_SECONDS))
        refusal = verdict.message if not verdict.allowed else self._secret_refusal(spec, userinfo, namespace)
        telemetry.ADMISSION.labels("rejected" if refusal is not None else "allowed").inc()
        return list(verdict.warnings), refusal, 422 if not verdict.allowed else 403

    def _secret_refusal(self, spec: dict[str, Any], userinfo: Mapping[str, Any], namespace: str | None) -> str | None:
        """Why the requesting user may not hand the referenced Secrets to pods (None: they may, or none are named)."""
        names = referenced_secrets(LLMDeploymentSpec.model_validate(dict(spec)))
        if not names:
            return None
        if not namespace:
            return "cannot check access to the referenced Secrets: the request names no namespace"
        return unreadable_secrets_message(client.AuthorizationV1Api(self.kube.api), userinfo, namespace, names)
