"""Kopf handlers: thin wiring from Kubernetes events to reconcile() and review().

Importing this module registers the handlers; `llm-autopilot operator` runs them. Nodes, the operator's
children and their pods come from the operator's own watches (controller/informers.py), never from a LIST per
reconcile; a resync that finds nothing changed is quiet (controller/quiet.py); the admission webhook has threads
of its own.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import logging
import queue
import random
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import kopf
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from llm_autopilot.api import GROUP, PLURAL, VERSION
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.catalog.gpus import GFD_PRODUCT
from llm_autopilot.controller import reconcile as reconciling
from llm_autopilot.controller import telemetry
from llm_autopilot.controller.access import referenced_secrets, unreadable_secrets_message
from llm_autopilot.controller.adapters import admission_check
from llm_autopilot.controller.admission import NodeView, review
from llm_autopilot.controller.burn_in_load import BurnInRunner
from llm_autopilot.controller.calibration_store import CalibrationBook
from llm_autopilot.controller.certs import self_signed
from llm_autopilot.controller.gather import Gatherer
from llm_autopilot.controller.informers import NotSynced, Watches
from llm_autopilot.controller.kube import Kube, load_config
from llm_autopilot.controller.observed import (
    NODE_SELECTOR,
    Summary,
    Watched,
    WatchedCluster,
    current_pods,
    llmd_summary,
    node_entry,
    operator_watches,
)
from llm_autopilot.controller.quiet import QuietMemory
from llm_autopilot.controller.reconcile import Outcome, gatherer_for
from llm_autopilot.controller.settings import OperatorSettings
from llm_autopilot.desired.world import GPUNode
from llm_autopilot.remediation.text import clean_line
from llm_autopilot.render.kubernetes import OWNER_LABEL

SETTINGS = OperatorSettings.from_env()
_state: dict[str, Any] = {}
logger = logging.getLogger(__name__)
#: the last full reconcile's inputs per LLMDeployment, for the quiet resync
QUIET = QuietMemory()
telemetry.CHECKED.set_function(lambda: len(QUIET))
#: the webhook's reviews run here, never queued behind reconciles in Kopf's executor
ADMISSION_EXECUTOR = ThreadPoolExecutor(max_workers=SETTINGS.admission_workers, thread_name_prefix="admission")
#: after a start, the first resync of each object falls at random within this long (then every interval)
FIRST_RESYNC_SPREAD_SECONDS = 30.0
#: per adapter_config.json read by the webhook (an unread one is admitted with a warning, read again later)
ADAPTER_TIMEOUT_SECONDS = 3.0
#: all of the webhook's adapter reads (a Hub that does not answer: admitted with a warning, read again later)
ADAPTER_BUDGET_SECONDS = 4.0


def kube() -> Kube:
    if "kube" not in _state:
        load_config()
        _state["kube"] = Kube()
    client: Kube = _state["kube"]
    return client


def gatherer() -> Gatherer:
    """One per process: it remembers which crashes' logs were read."""
    if "gatherer" not in _state:
        _state["gatherer"] = gatherer_for(kube(), SETTINGS)
    found: Gatherer = _state["gatherer"]
    return found


def burn_in_runs() -> BurnInRunner:
    """One per process: the burn-in runs on new pods (spec.verification.burnIn), in background threads."""
    if "burn_ins" not in _state:
        _state["burn_ins"] = BurnInRunner()
    runner: BurnInRunner = _state["burn_ins"]
    return runner


def calibration_book() -> CalibrationBook | None:
    """One per process: the KV calibration store as last read (None: LLM_AUTOPILOT_CALIBRATION_NAMESPACE off,
    or outside a cluster without it)."""
    if SETTINGS.calibration_namespace is None:
        return None
    if "calibration" not in _state:
        _state["calibration"] = CalibrationBook(kube(), SETTINGS.calibration_namespace,
                                                ttl_seconds=SETTINGS.calibration_read_seconds)
    book: CalibrationBook = _state["calibration"]
    return book


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, logger: logging.Logger | logging.LoggerAdapter[Any],
              **_: Any) -> None:
    # Our own annotation prefix; the finalizer name lets Kopf recognise, and remove, the finalizer that earlier
    # versions put on every LLMDeployment (no handler needs one now: see RESYNC below).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.level = logging.WARNING  # explicit events only; no event per handler log line
    settings.networking.error_backoffs = [1, 2, 5, 10, 30]
    settings.watching.server_timeout = 300
    settings.peering.lifetime = SETTINGS.peering_lifetime_seconds
    # Kopf's node watch (the webhook's index): only GPU nodes, filtered by the API server
    settings.watching.label_selectors["v1", "nodes"] = NODE_SELECTOR
    # the LLMDeployments are listed in pages, not parsed all at once
    settings.watching.chunk_size = WATCH_PAGE_SIZE
    _state["peering"] = not settings.peering.standalone
    if SETTINGS.max_workers is not None:
        settings.execution.max_workers = SETTINGS.max_workers
    if SETTINGS.webhook_enabled:
        host = SETTINGS.webhook_host or SETTINGS.webhook_addr
        if SETTINGS.webhook_certfile and SETTINGS.webhook_keyfile:
            certfile, keyfile = Path(SETTINGS.webhook_certfile), Path(SETTINGS.webhook_keyfile)
            cafile = Path(SETTINGS.webhook_cafile) if SETTINGS.webhook_cafile else certfile
        else:
            cert_dir = Path(SETTINGS.webhook_cert_dir or tempfile.mkdtemp(prefix="llm-autopilot-webhook-"))
            certfile, keyfile = self_signed(cert_dir, [host, "localhost"])
            cafile = certfile
        # Kopf re-reads the files every file_check_interval and restarts its listener when they change, so
        # cert-manager renewals (the kubelet swaps the mounted Secret's files) need no operator restart.
        settings.admission.server = kopf.WebhookServer(
            addr=SETTINGS.webhook_addr, port=SETTINGS.webhook_port, host=host,
            certfile=str(certfile), pkeyfile=str(keyfile), cafile=str(cafile),
            file_check_interval=SETTINGS.webhook_cert_check_seconds)
        if SETTINGS.webhook_managed:  # otherwise the Helm chart ships the ValidatingWebhookConfiguration
            settings.admission.managed = GROUP
        logger.info("admission webhook on https://%s:%s", host, SETTINGS.webhook_port)
    if SETTINGS.metrics_port:
        telemetry.serve(SETTINGS.metrics_port, SETTINGS.metrics_addr)
        logger.info("metrics on http://%s:%s/metrics", SETTINGS.metrics_addr, SETTINGS.metrics_port)
    start_watches(kube())


def start_watches(k: Kube) -> None:
    """The reconciles' watches (nodes, children, pods) and the Deployment watch's triggers, on threads of their
    own; the handlers wait for their first listings (``_watched``)."""
    triggers = OwnerTriggers(owner_changed)
    watches = operator_watches(k, SETTINGS.namespaces, on_deployment=triggers.deployment_changed)
    _state["watches"], _state["triggers"] = watches, triggers
    watches.start()
    triggers.start()


@kopf.on.cleanup()
def stop_watches(**_: Any) -> None:
    for name in ("watches", "triggers"):
        if (running := _state.pop(name, None)) is not None:
            running.stop()


@kopf.on.probe(id="kubernetes-api")
def api_reachable(**_: Any) -> bool:
    """Liveness detail at /healthz: the operator can still talk to the API server."""
    kube().core.get_api_resources()
    return True


# ---- the watches -----------------------------------------------------------------------------------------------
# The reconciles read the operator's own watches (controller/informers.py, started above). Kopf keeps one index,
# the GPU nodes the admission webhook plans on: its few nodes keep Kopf's index-readiness wait short.

#: objects per page when Kopf lists the LLMDeployments and the GPU nodes
WATCH_PAGE_SIZE = 500
#: how long a handler waits for the watches' first listings before it is retried (a TemporaryError)
SYNC_WAIT_SECONDS = 60.0
SYNC_RETRY_SECONDS = 5.0


@kopf.index("v1", "nodes", labels={GFD_PRODUCT: kopf.PRESENT}, id="gpu_nodes")
async def gpu_nodes(body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return node_entry(body)  # {}: a cordoned node leaves the index


def _watched(namespace: str) -> Watched | None:
    """The watches, once each that covers ``namespace`` holds its first listing (None: not started, as in unit
    tests that call the handlers directly: the reconcile then reads the API server)."""
    watches: Watches | None = _state.get("watches")
    if watches is None:
        return None
    try:
        watches.wait_synced(SYNC_WAIT_SECONDS, namespace)
    except NotSynced as exc:
        raise kopf.TemporaryError(str(exc), delay=SYNC_RETRY_SECONDS) from exc
    return Watched(watches["nodes"], watches["deployments"], watches["services"], watches["disruption_budgets"],
                   watches["pods"], crds=watches["crds"])


def _cluster(watched: Watched | None) -> Any:
    return WatchedCluster(kube(), watched) if watched is not None else kube()


# ---- reconciles ----------------------------------------------------------------------------------------------
# Kopf runs a change handler and a timer of one object at the same time; they and the Deployment watch's reconcile
# (below) all take this lock, so no two reconciles of one object overlap in this process.
#: uid -> (its lock, how many reconciles hold or wait for it); an entry goes with its last user, so the table
#: holds only the objects being reconciled, not every uid ever seen
_LOCKS: dict[str, tuple[threading.Lock, int]] = {}
_LOCKS_GUARD = threading.Lock()


@contextmanager
def object_lock(uid: str) -> Iterator[None]:
    with _LOCKS_GUARD:
        lock, users = _LOCKS.get(uid, (threading.Lock(), 0))
        _LOCKS[uid] = (lock, users + 1)
    try:
        with lock:
            yield
    finally:
        with _LOCKS_GUARD:
            lock, users = _LOCKS[uid]
            if users == 1:
                del _LOCKS[uid]
            else:
                _LOCKS[uid] = (lock, users - 1)


def _report(out: Outcome, body: kopf.Body, patch: kopf.Patch) -> None:
    for key, value in out.status.items():
        patch.status[key] = value
    for type_, reason, message in out.events:
        kopf.event(body, type=type_, reason=reason, message=message[:1000])


def _finish(out: Outcome, body: kopf.Body, patch: kopf.Patch, what: str) -> None:
    meta = body.get("metadata", {})
    # with --verbose: one line per reconcile, naming the object (the end-to-end tests count them)
    logger.debug("reconciled %s/%s (%s%s)", meta.get("namespace"), meta.get("name"), what,
                 "" if out.full else ", quiet")
    telemetry.RECONCILES.labels("retry" if out.retry else "ok").inc()
    telemetry.WRITES.inc(out.writes + (1 if out.status else 0))
    _report(out, body, patch)
    if out.retry:
        raise kopf.TemporaryError(out.retry_reason, delay=out.retry_delay)


#: the API server answers these while it is up but cannot serve (a restart, etcd away)
_UNAVAILABLE_STATUSES = frozenset({502, 503, 504})


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


OUTAGE = Outage()


def attempt(run: Callable[[], Outcome], *, outage: Outage | None = None, reached: bool = True) -> Outcome | None:
    """Run one reconcile; None when the API server could not be reached (said once per outage: the resync
    retries, and a change handler's spec is reconciled by it too). Any other failure is counted and raised.
    ``reached``: a full pass that got an answer ends the outage (a quiet resync asked nothing)."""
    watch = outage if outage is not None else OUTAGE
    try:
        out = run()
    except Exception as exc:
        telemetry.RECONCILES.labels("error").inc()
        if api_unreachable(exc):
            watch.failed(exc)
            return None
        raise
    if reached and out.full:
        watch.reached()
    return out


def _reconcile(body: kopf.Body, patch: kopf.Patch, watched: Watched | None, what: str) -> None:
    meta = body.get("metadata", {})

    def run() -> Outcome:
        with object_lock(str(meta.get("uid"))):
            return reconciling.reconcile(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"],
                                         generation=meta.get("generation"), spec_body=dict(body.get("spec") or {}),
                                         status=dict(body.get("status") or {}), kube=_cluster(watched),
                                         settings=SETTINGS, gatherer=gatherer(),
                                         resource_version=meta.get("resourceVersion"),
                                         calibration=calibration_book(), burn_ins=burn_in_runs())

    if (out := attempt(run)) is not None:
        _finish(out, body, patch, what)


@kopf.on.create(GROUP, VERSION, PLURAL, id="reconcile-on-create")
@kopf.on.update(GROUP, VERSION, PLURAL, id="reconcile-on-update", field="spec")
def reconcile_on_change(body: kopf.Body, patch: kopf.Patch, reason: str | None = None, **_: Any) -> None:
    _reconcile(body, patch, _watched(str(body["metadata"]["namespace"])), str(reason or "change"))


# Deletion never waits for the operator. Kopf gives every timer a finalizer, so that it can stop the timer
# before the object goes: with the operator stopped, `kubectl delete` then hangs (and the Deployment keeps its
# GPUs), and during a running resync it waits up to Kopf's 60 s cancellation polling. The resync needs no
# clean-up (owner references collect the children), so its finalizer is dropped below and Kopf removes the one
# older versions put on objects when it next sees them. Without the finalizer Kopf learns of a deletion only
# from the DELETED event, which would leave the timer running for an object that is gone: the event marks the
# object's memo, and the timer's filter then no longer matches, which makes Kopf stop it.
RESYNC = "resync"


#: (namespace, name) -> the LLMDeployment as the Deployment watch's trigger needs it (llmd_summary): every one
#: Kopf has seen, kept by the event handler below
LLMDEPLOYMENTS: dict[tuple[str, str], Summary] = {}


@kopf.on.event(GROUP, VERSION, PLURAL, id="llmdeployment-event")
async def llmdeployment_event(type: str | None, body: kopf.Body, memo: kopf.Memo, uid: str | None = None,
                              **_: Any) -> None:
    """Every event of an LLMDeployment: what the Deployment watch's trigger reads of it; a deletion stops its
    resync timer and forgets it."""
    meta = body.get("metadata") or {}
    key = (str(meta.get("namespace")), str(meta.get("name")))
    if "kopf" not in _state:  # where kopf.event posts to, for the triggers' own threads
        _state["kopf"] = contextvars.copy_context()
    if type == "DELETED":
        memo["deleted"] = True
        LLMDEPLOYMENTS.pop(key, None)
        if uid:
            QUIET.forget(uid)
            with _LOCKS_GUARD:
                _LOCKS.pop(uid, None)
            if (runs := _state.get("burn_ins")) is not None:
                runs.forget_owner(uid)  # its pods' burn-in results: no reconcile asks for them again
        return
    LLMDEPLOYMENTS[key] = llmd_summary(body)


def _not_deleted(memo: kopf.Memo, **_: Any) -> bool:
    return not memo.get("deleted")


def _first_resync(**_: Any) -> float:
    """Jitter: the objects' resyncs are spread over time instead of all falling due together after a start."""
    return 1.0 + random.uniform(0.0, min(SETTINGS.resync_seconds, FIRST_RESYNC_SPREAD_SECONDS))


@kopf.timer(GROUP, VERSION, PLURAL, id=RESYNC, interval=SETTINGS.resync_seconds, initial_delay=_first_resync,
            when=_not_deleted)
def resync(body: kopf.Body, patch: kopf.Patch, stopped: kopf.DaemonStopped | None = None, **_: Any) -> None:
    """Also runs first thing after an operator (re)start: resume without writing when nothing changed. Quiet
    (nothing planned, rendered or read) when nothing the last full reconcile read has changed."""
    LAST_RESYNC[0] = time.monotonic()
    if stopped is not None:
        RESYNC_STOPPED[0] = stopped
    meta = body.get("metadata", {})
    namespace, name = str(meta["namespace"]), str(meta["name"])
    watched = _watched(namespace)
    if watched is None:  # no indexes (a direct call): a full reconcile
        _reconcile(body, patch, None, "resync")
        return
    pods = watched.pods_of(namespace, name)

    def run() -> Outcome:
        with object_lock(str(meta["uid"])):
            return reconciling.resync(
                name=name, namespace=namespace, uid=meta["uid"], generation=meta.get("generation"),
                resource_version=meta.get("resourceVersion"), spec_body=dict(body.get("spec") or {}),
                status=dict(body.get("status") or {}), observed=watched.digest_of(namespace, name),
                current_pods=functools.partial(current_pods, pods), kube=WatchedCluster(kube(), watched),
                settings=SETTINGS, gatherer=gatherer(), memory=QUIET,
                calibration=calibration_book(), burn_ins=burn_in_runs())

    if (out := attempt(run)) is None:
        return
    telemetry.RESYNCS.labels("full" if out.full else "quiet").inc()
    _finish(out, body, patch, "resync")


def _without_finalizer(handler_id: str, registry: kopf.OperatorRegistry) -> None:
    """Let a timer run without holding its objects' deletion (Kopf's decorators offer no option for it)."""
    spawning = registry._spawning
    spawning._handlers = [dataclasses.replace(h, requires_finalizer=False) if h.id == handler_id else h
                          for h in spawning._handlers]


_without_finalizer(RESYNC, kopf.get_default_registry())


class OwnerTriggers:
    """The Deployment watch's changes as the LLMDeployments to reconcile, on threads of their own: a key queued
    again before its turn is reconciled once (reading the watches as they are then), and one that changes while
    it is reconciled is queued again (client-go's work queue)."""

    def __init__(self, handle: Callable[[str, str], None], workers: int = 2) -> None:
        self.handle = handle
        self.workers = workers
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
            posting = _state.get("kopf")
            try:
                if posting is not None:  # kopf.event posts through Kopf's context
                    posting.copy().run(self.handle, *key)
                else:
                    self.handle(*key)
            except Exception:  # one object's failure must not stop the triggers of the others
                logger.exception("the reconcile of %s/%s after its Deployment changed failed", *key)


#: when this process last ran a resync (time.monotonic(); -inf: never). With peering, Kopf stops every timer of a
#: replica it pauses (a standby), but not the operator's own watches: their triggers act only while this replica's
#: resyncs run. Not 0: the monotonic clock counts from the node's boot, so 0 would read as "a moment ago" on a node
#: up for less than two intervals.
LAST_RESYNC = [float("-inf")]
#: the stop flag Kopf handed the last resync that ran (its timer's): Kopf sets it when it pauses this replica
RESYNC_STOPPED: list[kopf.DaemonStopped | None] = [None]
#: why Kopf stops timers when this replica must not act: paused for a peer, or exiting
_STANDING_DOWN = kopf.DaemonStoppingReason.OPERATOR_PAUSING | kopf.DaemonStoppingReason.OPERATOR_EXITING


def active() -> bool:
    """Whether this replica is the one that reconciles: always, unless it runs with peering; then only while its
    resyncs run, and not once Kopf has stopped their timers to pause it (at once: the stop flag's reason), nor
    two intervals after the last one ran (its timer ended otherwise, e.g. its object was deleted)."""
    if not _state.get("peering"):
        return True
    stopped = RESYNC_STOPPED[0]
    if stopped is not None and stopped.is_set() and stopped.reason is not None and stopped.reason & _STANDING_DOWN:
        return False
    return time.monotonic() - LAST_RESYNC[0] < 2 * SETTINGS.resync_seconds


def owner_changed(namespace: str, owner: str, watched: Watched | None = None) -> None:
    """A change of the vLLM Deployment triggers its LLMDeployment's reconcile, which alone writes Ready (and the
    replica counts with it): this watch decides and writes no condition of its own.

    Nothing is read when the watches show the reconcile's inputs unchanged since its last full pass (the quiet
    resync's test, without asking Prometheus); otherwise the LLMDeployment is read and reconciled as a resync
    would, and the status written with the resourceVersion read (a conflict: read again). One Kopf has not shown
    yet (not listed yet after a start, or deleted) is read. A standby replica (peering) does nothing."""
    if not active():
        return
    if watched is None:
        try:
            watched = _watched(namespace)
        except kopf.TemporaryError:
            return  # not listed yet: the resync reconciles it
    indexed = LLMDEPLOYMENTS.get((namespace, owner))
    if indexed is not None and watched is not None and _quiet(indexed.body, watched, namespace, owner):
        return
    k = kube()
    for _ in range(3):  # the status moved under us (409): read it again
        parent = k.get(f"{GROUP}/{VERSION}", "LLMDeployment", owner, namespace)
        if parent is None:
            return
        meta = parent.get("metadata") or {}
        if (parent.get("status") or {}).get("observedGeneration") != meta.get("generation"):
            return  # this generation's first reconcile has not reported yet: it reads the Deployment itself
        if (out := attempt(functools.partial(_reconcile_parent, parent, namespace, watched),
                           reached=False)) is None:
            return
        telemetry.RECONCILES.labels("retry" if out.retry else "ok").inc()
        telemetry.WRITES.inc(out.writes)
        if out.status:
            try:
                k.patch_llmd_status(namespace, str(meta.get("name")), out.status,
                                    resource_version=meta.get("resourceVersion"))
            except ApiException as exc:
                if exc.status != 409:
                    raise
                continue
            telemetry.WRITES.inc()
        for type_, reason, message in out.events:
            kopf.event(kopf.Body(cast(kopf.RawBody, dict(parent))), type=type_, reason=reason, message=message[:1000])
        return  # a retry the reconcile asks for is the resync's (its timer runs anyway)


def _quiet(indexed: Mapping[str, Any], watched: Watched, namespace: str, name: str) -> bool:
    """Whether the last full reconcile of the indexed LLMDeployment read what the watches show now."""
    meta = indexed.get("metadata") or {}
    seen = QUIET.get(str(meta.get("uid")))
    if seen is None or not meta.get("resourceVersion"):
        return False
    key = reconciling.quiet_key(generation=meta.get("generation"), resource_version=meta.get("resourceVersion"),
                                spec_body={}, status={}, observed=watched.digest_of(namespace, name),
                                settings=SETTINGS)
    return reconciling.unchanged(seen, key)


def _reconcile_parent(parent: Mapping[str, Any], namespace: str, watched: Watched | None) -> Outcome:
    """The reconcile a Deployment event triggers, through the resync's gate (its inputs are remembered)."""
    meta = parent.get("metadata") or {}
    name, uid = str(meta.get("name")), str(meta.get("uid"))
    spec_body, status = dict(parent.get("spec") or {}), dict(parent.get("status") or {})
    with object_lock(uid):
        if watched is None:
            return reconciling.reconcile(name=name, namespace=namespace, uid=uid, generation=meta.get("generation"),
                                         spec_body=spec_body, status=status, kube=kube(), settings=SETTINGS,
                                         gatherer=gatherer(), resource_version=meta.get("resourceVersion"),
                                         calibration=calibration_book(), burn_ins=burn_in_runs())
        return reconciling.resync(
            name=name, namespace=namespace, uid=uid, generation=meta.get("generation"),
            resource_version=meta.get("resourceVersion"), spec_body=spec_body, status=status,
            observed=watched.digest_of(namespace, name),
            current_pods=functools.partial(current_pods, watched.pods_of(namespace, name)),
            kube=WatchedCluster(kube(), watched), settings=SETTINGS, gatherer=gatherer(), memory=QUIET,
                calibration=calibration_book(), burn_ins=burn_in_runs())


def _secret_refusal(spec: dict[str, Any], userinfo: kopf.UserInfo, namespace: str | None) -> str | None:
    """Why the requesting user may not hand the referenced Secrets to pods (None: they may, or none are named)."""
    names = referenced_secrets(LLMDeploymentSpec.model_validate(dict(spec)))
    if not names:
        return None
    if not namespace:
        return "cannot check access to the referenced Secrets: the request names no namespace"
    return unreadable_secrets_message(client.AuthorizationV1Api(kube().api), userinfo, namespace, names)


def listed_gpu_nodes() -> list[GPUNode]:
    """The GPU nodes from one LIST (the webhook's answer while the node index is still filling)."""
    return [GPUNode(n.labels, n.allocatable_gpus, n.allocatable_memory_gib) for n in kube().gpu_nodes()]


def node_view() -> NodeView:
    """One per process: the webhook's view of the GPU nodes (the node index, once it caught up with one LIST). The
    webhook's threads may ask for it at once: setdefault keeps the first view stored, and every thread gets it."""
    view: NodeView | None = _state.get("node_view")
    if view is None:
        view = _state.setdefault("node_view", NodeView(listed_gpu_nodes))
    return view


def review_nodes(index: Any, view: NodeView | None = None) -> tuple[GPUNode, ...]:
    """The GPU nodes the webhook plans on: the node watch's index (each summary as WatchedCluster.gpu_nodes reads
    it); while it is still filling, one LIST's answer (admission.NodeView documents when)."""
    indexed = [GPUNode(dict(s.body["metadata"]["labels"]), int(s.body["gpus"]), float(s.body.get("memoryGiB", 0.0)))
               for s in _values_of(index)]
    return (view or node_view()).nodes(indexed)


def _values_of(index: Any) -> list[Any]:
    store = index.get(None) if index is not None else None
    return list(store) if store is not None else []


def _review(spec: dict[str, Any], name: str, userinfo: kopf.UserInfo,
            namespace: str | None, nodes_index: Any = None) -> tuple[list[str], str | None, int]:
    """(warnings, the refusal or None, its HTTP code: 403 for access, 422 for a spec that cannot work)."""
    verdict = review(spec, SETTINGS.default_vllm_version, name=name, namespace=namespace,
                     nodes=lambda: review_nodes(nodes_index), prometheus_url=SETTINGS.prometheus_url,
                     adapters=lambda s: admission_check(s, timeout=ADAPTER_TIMEOUT_SECONDS,
                                                        budget=ADAPTER_BUDGET_SECONDS))
    refusal = verdict.message if not verdict.allowed else _secret_refusal(spec, userinfo, namespace)
    telemetry.ADMISSION.labels("rejected" if refusal is not None else "allowed").inc()
    return list(verdict.warnings), refusal, 422 if not verdict.allowed else 403


def unchanged_spec(operation: str | None, old: Any, new: Any) -> bool:
    """An update that leaves the spec as it was: the operator's (and Kopf's) own metadata patches."""
    return operation == "UPDATE" and old is not None and new is not None and old.get("spec") == new.get("spec")


async def validate(spec: kopf.Spec, name: str, warnings: list[str], userinfo: kopf.UserInfo,
                   namespace: str | None, operation: str | None = None, old: Any = None, new: Any = None,
                   gpu_nodes: Any = None, **_: Any) -> None:
    """The admission review, on the webhook's own threads (reconciles never hold it up); an update that leaves
    the spec alone (Kopf's own annotations, a label) is admitted at once, as the chart's matchConditions do."""
    if unchanged_spec(operation, old, new):
        telemetry.ADMISSION.labels("unchanged").inc()
        return
    found, refusal, code = await asyncio.get_running_loop().run_in_executor(
        ADMISSION_EXECUTOR, functools.partial(_review, dict(spec), name, userinfo, namespace, gpu_nodes))
    warnings.extend(found)
    if refusal is not None:
        raise kopf.AdmissionError(refusal, code=code)


class RoutineSuccess(logging.Filter):
    """Kopf logs every handler's success at INFO: with 1,000 LLMDeployments that is a line per object per resync
    and one per watch event per index. Those go to DEBUG (shown with --verbose); the rest stay."""

    ROUTINE = re.compile(r"^(Timer 'resync'|Indexer '[a-z_]+'|Handler 'llmdeployment-event') succeeded\.$")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO and self.ROUTINE.match(record.getMessage()):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger().isEnabledFor(logging.DEBUG)
        return True


logging.getLogger("kopf.objects").addFilter(RoutineSuccess())


if SETTINGS.webhook_enabled:  # Kopf refuses to start with admission handlers but no server
    kopf.on.validate(GROUP, VERSION, PLURAL, id="validate-llmdeployment",
                     operations=["CREATE", "UPDATE"])(validate)
