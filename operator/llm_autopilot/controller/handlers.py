"""Kopf handlers: thin wiring from Kubernetes events to reconcile() and review().

Importing this module registers the handlers; `llm-autopilot operator` runs them. Nodes, the operator's
children and their pods come from watches (the indexes below), never from a LIST per reconcile; a resync that
finds nothing changed is quiet (controller/quiet.py); the admission webhook has threads of its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
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
from llm_autopilot.controller.admission import review
from llm_autopilot.controller.burn_in_load import BurnInRunner
from llm_autopilot.controller.calibration_store import CalibrationBook
from llm_autopilot.controller.certs import self_signed
from llm_autopilot.controller.gather import Gatherer
from llm_autopilot.controller.kube import Kube, load_config
from llm_autopilot.controller.observed import (
    INSTANCE_LABEL,
    NODE_SELECTOR,
    OWNED_SELECTOR,
    Watched,
    WatchedCluster,
    child_summary,
    current_pods,
    llmd_summary,
    node_summary,
    owner_key,
    pod_summary,
)
from llm_autopilot.controller.quiet import QuietMemory
from llm_autopilot.controller.reconcile import Outcome, gatherer_for
from llm_autopilot.controller.settings import OperatorSettings
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
    # the watches behind the indexes: only GPU nodes and the operator's own objects, filtered by the API server
    settings.watching.label_selectors["v1", "nodes"] = NODE_SELECTOR
    for resource in (("apps", "v1", "deployments"), ("v1", "services"), ("policy", "v1", "poddisruptionbudgets"),
                     ("v1", "pods")):
        settings.watching.label_selectors[resource] = OWNED_SELECTOR
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
    kube()


@kopf.on.probe(id="kubernetes-api")
def api_reachable(**_: Any) -> bool:
    """Liveness detail at /healthz: the operator can still talk to the API server."""
    kube().core.get_api_resources()
    return True


# ---- the watches: GPU nodes, the operator's children and pods, and its LLMDeployments ----------------------
# Each index keeps a small summary per object (controller/observed.py); indexers are async, so an event costs
# no thread. Kopf starts no other handler before every index holds its first full listing.

@kopf.index("v1", "nodes", labels={GFD_PRODUCT: kopf.PRESENT}, id="gpu_nodes")
async def gpu_nodes(body: kopf.Body, **_: Any) -> dict[Any, Any]:
    summary = node_summary(body)
    return {None: summary} if summary is not None else {}  # {}: a cordoned node leaves the index


def _by_name(body: kopf.Body) -> dict[Any, Any]:
    key = owner_key(body)
    meta = body.get("metadata") or {}
    return {(key[0], str(meta.get("name"))): child_summary(body)} if key is not None else {}


@kopf.index("apps", "v1", "deployments", labels={OWNER_LABEL: kopf.PRESENT}, id="owned_deployments")
async def owned_deployments(body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return _by_name(body)


@kopf.index("v1", "services", labels={OWNER_LABEL: kopf.PRESENT}, id="owned_services")
async def owned_services(body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return _by_name(body)


@kopf.index("policy", "v1", "poddisruptionbudgets", labels={OWNER_LABEL: kopf.PRESENT},
            id="owned_disruption_budgets")
async def owned_disruption_budgets(body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return _by_name(body)


@kopf.index("v1", "pods", labels={OWNER_LABEL: kopf.PRESENT}, id="owned_pods")
async def owned_pods(body: kopf.Body, namespace: str | None, **_: Any) -> dict[Any, Any]:
    instance = ((body.get("metadata") or {}).get("labels") or {}).get(INSTANCE_LABEL)
    return {(namespace, instance): pod_summary(body)} if namespace and instance else {}


@kopf.index(GROUP, VERSION, PLURAL, id="llmdeployment_status")
async def llmdeployment_status(body: kopf.Body, namespace: str | None, name: str | None, **_: Any) -> dict[Any, Any]:
    return {(namespace, name): llmd_summary(body)}


def _watched(kwargs: dict[str, Any]) -> Watched | None:
    """The indexes Kopf handed this call (None when called without them, as unit tests do)."""
    names = ("gpu_nodes", "owned_deployments", "owned_services", "owned_disruption_budgets", "owned_pods")
    if not all(n in kwargs for n in names):
        return None
    return Watched(*(kwargs[n] for n in names))


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
def reconcile_on_change(body: kopf.Body, patch: kopf.Patch, reason: str | None = None, **kwargs: Any) -> None:
    _reconcile(body, patch, _watched(kwargs), str(reason or "change"))


# Deletion never waits for the operator. Kopf gives every timer a finalizer, so that it can stop the timer
# before the object goes: with the operator stopped, `kubectl delete` then hangs (and the Deployment keeps its
# GPUs), and during a running resync it waits up to Kopf's 60 s cancellation polling. The resync needs no
# clean-up (owner references collect the children), so its finalizer is dropped below and Kopf removes the one
# older versions put on objects when it next sees them. Without the finalizer Kopf learns of a deletion only
# from the DELETED event, which would leave the timer running for an object that is gone: the event marks the
# object's memo, and the timer's filter then no longer matches, which makes Kopf stop it.
RESYNC = "resync"


@kopf.on.event(GROUP, VERSION, PLURAL, id="deletion-stops-resync")
async def deletion_stops_resync(type: str | None, memo: kopf.Memo, uid: str | None = None, **_: Any) -> None:
    if type == "DELETED":
        memo["deleted"] = True
        if uid:
            QUIET.forget(uid)
            with _LOCKS_GUARD:
                _LOCKS.pop(uid, None)


def _not_deleted(memo: kopf.Memo, **_: Any) -> bool:
    return not memo.get("deleted")


def _first_resync(**_: Any) -> float:
    """Jitter: the objects' resyncs are spread over time instead of all falling due together after a start."""
    return 1.0 + random.uniform(0.0, min(SETTINGS.resync_seconds, FIRST_RESYNC_SPREAD_SECONDS))


@kopf.timer(GROUP, VERSION, PLURAL, id=RESYNC, interval=SETTINGS.resync_seconds, initial_delay=_first_resync,
            when=_not_deleted)
def resync(body: kopf.Body, patch: kopf.Patch, **kwargs: Any) -> None:
    """Also runs first thing after an operator (re)start: resume without writing when nothing changed. Quiet
    (nothing planned, rendered or read) when nothing the last full reconcile read has changed."""
    watched = _watched(kwargs)
    meta = body.get("metadata", {})
    namespace, name = str(meta["namespace"]), str(meta["name"])
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


@kopf.on.event("apps", "v1", "deployments", labels={OWNER_LABEL: kopf.PRESENT}, id="deployment-readiness")
def deployment_changed(body: kopf.Body, namespace: str | None, type: str | None,
                       llmdeployment_status: Any = None, **kwargs: Any) -> None:
    """A change of the vLLM Deployment triggers its LLMDeployment's reconcile, which alone writes Ready (and the
    replica counts with it): this watch decides and writes no condition of its own.

    Nothing is read when the indexes show the reconcile's inputs unchanged since its last full pass (the quiet
    resync's test, without asking Prometheus); otherwise the LLMDeployment is read and reconciled as a resync
    would, and the status written with the resourceVersion read (a conflict: read again)."""
    if type == "DELETED" or namespace is None:
        return
    owner = (body.get("metadata", {}).get("labels") or {}).get(OWNER_LABEL)
    if not owner:
        return
    watched = _watched({"llmdeployment_status": llmdeployment_status, **kwargs})
    indexed = list(llmdeployment_status.get((namespace, owner)) or []) if llmdeployment_status is not None else None
    if indexed is not None and not indexed:
        return  # not an LLMDeployment the index holds (deleted, or not listed yet): nothing to reconcile
    if indexed and watched is not None and _quiet(indexed[0].body, watched, namespace, str(owner)):
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


def review_nodes(index: Any) -> list[tuple[dict[str, str], int]]:
    """The GPU nodes the webhook plans on: from the node watch's index. While it is empty (the operator has just
    started and Kopf is still listing, or the cluster has no GPU node) they are read from the API server, so a
    review never answers from a partial view it could not tell apart from an empty cluster."""
    indexed = _values_of(index)
    if indexed:
        return [(dict(s.body["metadata"]["labels"]), int(s.body["gpus"])) for s in indexed]
    return [(n.labels, n.allocatable_gpus) for n in kube().gpu_nodes()]


def _values_of(index: Any) -> list[Any]:
    store = index.get(None) if index is not None else None
    return list(store) if store is not None else []


def _review(spec: dict[str, Any], name: str, userinfo: kopf.UserInfo,
            namespace: str | None, nodes_index: Any = None) -> tuple[list[str], str | None, int]:
    """(warnings, the refusal or None, its HTTP code: 403 for access, 422 for a spec that cannot work)."""
    verdict = review(spec, SETTINGS.default_vllm_version, name=name, nodes=lambda: review_nodes(nodes_index),
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

    ROUTINE = re.compile(r"^(Timer 'resync'|Indexer '[a-z_]+'|Handler 'deployment-readiness'|"
                         r"Handler 'deletion-stops-resync') succeeded\.$")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO and self.ROUTINE.match(record.getMessage()):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger().isEnabledFor(logging.DEBUG)
        return True


logging.getLogger("kopf.objects").addFilter(RoutineSuccess())


if SETTINGS.webhook_enabled:  # Kopf refuses to start with admission handlers but no server
    kopf.on.validate(GROUP, VERSION, PLURAL, id="validate-llmdeployment",
                     operations=["CREATE", "UPDATE"])(validate)
