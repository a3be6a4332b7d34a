"""Kopf's wiring: the handlers, their ids and filters, and Kopf's settings. Each handler delegates to the
`Operator` (controller/runtime.py) that Kopf's startup builds and keeps in Kopf's memo, which Kopf hands, copied,
to every handler.

Importing this module registers the handlers; `llm-autopilot operator` runs them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import random
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kopf

from llm_autopilot.api import GROUP, PLURAL, VERSION
from llm_autopilot.catalog.gpus import GFD_PRODUCT
from llm_autopilot.controller import telemetry
from llm_autopilot.controller.certs import self_signed
from llm_autopilot.controller.observed import NODE_SELECTOR, node_entry
from llm_autopilot.controller.reconcile import Outcome
from llm_autopilot.controller.runtime import Operator
from llm_autopilot.controller.settings import (
    OperatorSettings,
    SettingsError,
    resync_seconds_from_env,
    webhook_enabled_from_env,
)

logger = logging.getLogger(__name__)
#: Kopf takes these two when the handlers register (at import), before any startup handler runs; every other
#: setting is read at startup, into the Operator
RESYNC_SECONDS = resync_seconds_from_env()
WEBHOOK_ENABLED = webhook_enabled_from_env()
#: after a start, the first resync of each object falls at random within this long (then every interval)
FIRST_RESYNC_SPREAD_SECONDS = 30.0
#: objects per page when Kopf lists the LLMDeployments and the GPU nodes
WATCH_PAGE_SIZE = 500
#: the resync timer's id (see _without_finalizer)
RESYNC = "resync"


def running(memo: Mapping[str, Any]) -> Operator:
    """The Operator Kopf's startup put in its memo (every object's memo is a copy of that one)."""
    found = memo.get("operator")
    if not isinstance(found, Operator):
        raise RuntimeError("no Operator in Kopf's memo: configure() (Kopf's startup) builds it")
    return found


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, logger: logging.Logger | logging.LoggerAdapter[Any],
              memo: kopf.Memo, **_: Any) -> None:
    """Kopf's settings, then the Operator, on the settings `llm-autopilot operator` put in the memo (its command
    line applied), else the environment's."""
    given = memo.get("settings")
    try:
        ours = given if isinstance(given, OperatorSettings) else OperatorSettings.from_env()
    except SettingsError as exc:  # as at import before: the operator stops, not retries
        raise kopf.PermanentError(str(exc)) from exc
    # Our own annotation prefix; the finalizer name lets Kopf recognise, and remove, the finalizer that earlier
    # versions put on every LLMDeployment (no handler needs one now: see RESYNC below).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.level = logging.WARNING  # explicit events only; no event per handler log line
    settings.networking.error_backoffs = [1, 2, 5, 10, 30]
    settings.watching.server_timeout = 300
    settings.peering.lifetime = ours.peering_lifetime_seconds
    # Kopf's node watch (the webhook's index): only GPU nodes, filtered by the API server
    settings.watching.label_selectors["v1", "nodes"] = NODE_SELECTOR
    # the LLMDeployments are listed in pages, not parsed all at once
    settings.watching.chunk_size = WATCH_PAGE_SIZE
    if ours.max_workers is not None:
        settings.execution.max_workers = ours.max_workers
    if ours.webhook_enabled:
        settings.admission.server = _webhook_server(ours)
        if ours.webhook_managed:  # otherwise the Helm chart ships the ValidatingWebhookConfiguration
            settings.admission.managed = GROUP
        logger.info("admission webhook on https://%s:%s", ours.webhook_host or ours.webhook_addr, ours.webhook_port)
    if ours.metrics_port:
        telemetry.serve(ours.metrics_port, ours.metrics_addr)
        logger.info("metrics on http://%s:%s/metrics", ours.metrics_addr, ours.metrics_port)
    operator = Operator.connect(ours, peering=not settings.peering.standalone)
    memo["operator"] = operator
    operator.start()


def _webhook_server(ours: OperatorSettings) -> kopf.WebhookServer:
    host = ours.webhook_host or ours.webhook_addr
    if ours.webhook_certfile and ours.webhook_keyfile:
        certfile, keyfile = Path(ours.webhook_certfile), Path(ours.webhook_keyfile)
        cafile = Path(ours.webhook_cafile) if ours.webhook_cafile else certfile
    else:
        cert_dir = Path(ours.webhook_cert_dir or tempfile.mkdtemp(prefix="llm-autopilot-webhook-"))
        certfile, keyfile = self_signed(cert_dir, [host, "localhost"])
        cafile = certfile
    # Kopf re-reads the files every file_check_interval and restarts its listener when they change, so
    # cert-manager renewals (the kubelet swaps the mounted Secret's files) need no operator restart.
    return kopf.WebhookServer(addr=ours.webhook_addr, port=ours.webhook_port, host=host, certfile=str(certfile),
                              pkeyfile=str(keyfile), cafile=str(cafile),
                              file_check_interval=ours.webhook_cert_check_seconds)


@kopf.on.cleanup()
def stop_watches(memo: kopf.Memo, **_: Any) -> None:
    if isinstance(found := memo.get("operator"), Operator):
        found.stop()


@kopf.on.probe(id="kubernetes-api")
def api_reachable(memo: kopf.Memo, **_: Any) -> bool:
    """Liveness detail at /healthz: the operator can still talk to the API server."""
    running(memo).kube.core.get_api_resources()
    return True


# The reconciles read the operator's own watches (controller/informers.py, started at startup). Kopf keeps one
# index, the GPU nodes the admission webhook plans on: its few nodes keep Kopf's index-readiness wait short.
@kopf.index("v1", "nodes", labels={GFD_PRODUCT: kopf.PRESENT}, id="gpu_nodes")
async def gpu_nodes(body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return node_entry(body)  # {}: a cordoned node leaves the index


def _finish(out: Outcome, body: kopf.Body, patch: kopf.Patch, what: str) -> None:
    meta = body.get("metadata", {})
    # with --verbose: one line per reconcile, naming the object (the end-to-end tests count them)
    logger.debug("reconciled %s/%s (%s%s)", meta.get("namespace"), meta.get("name"), what,
                 "" if out.full else ", quiet")
    telemetry.RECONCILES.labels("retry" if out.retry else "ok").inc()
    telemetry.WRITES.inc(out.writes + (1 if out.status else 0))
    for key, value in out.status.items():
        patch.status[key] = value
    telemetry.observe_recoveries(out.recoveries)  # with the status Kopf writes from ``patch``, before its Events
    for type_, reason, message in out.events:
        kopf.event(body, type=type_, reason=reason, message=message[:1000])
    if out.retry:
        raise kopf.TemporaryError(out.retry_reason, delay=out.retry_delay)


@kopf.on.create(GROUP, VERSION, PLURAL, id="reconcile-on-create")
@kopf.on.update(GROUP, VERSION, PLURAL, id="reconcile-on-update", field="spec")
def reconcile_on_change(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, reason: str | None = None,
                        **_: Any) -> None:
    operator = running(memo)
    if (out := operator.reconcile(body, operator.watched(str(body["metadata"]["namespace"])))) is not None:
        _finish(out, body, patch, str(reason or "change"))


# Deletion never waits for the operator. Kopf gives every timer a finalizer, so that it can stop the timer
# before the object goes: with the operator stopped, `kubectl delete` then hangs (and the Deployment keeps its
# GPUs), and during a running resync it waits up to Kopf's 60 s cancellation polling. The resync needs no
# clean-up (owner references collect the children), so its finalizer is dropped below and Kopf removes the one
# older versions put on objects when it next sees them. Without the finalizer Kopf learns of a deletion only
# from the DELETED event, which would leave the timer running for an object that is gone: the event marks the
# object's memo, and the timer's filter then no longer matches, which makes Kopf stop it.
@kopf.on.event(GROUP, VERSION, PLURAL, id="llmdeployment-event")
async def llmdeployment_event(type: str | None, body: kopf.Body, memo: kopf.Memo, uid: str | None = None,
                              **_: Any) -> None:
    """Every event of an LLMDeployment: what the Deployment watch's trigger reads of it; a deletion stops its
    resync timer and forgets it."""
    if type == "DELETED":
        memo["deleted"] = True
    running(memo).seen(type, body, uid)


def _not_deleted(memo: kopf.Memo, **_: Any) -> bool:
    return not memo.get("deleted")


def _first_resync(**_: Any) -> float:
    """Jitter: the objects' resyncs are spread over time instead of all falling due together after a start."""
    return 1.0 + random.uniform(0.0, min(RESYNC_SECONDS, FIRST_RESYNC_SPREAD_SECONDS))


@kopf.timer(GROUP, VERSION, PLURAL, id=RESYNC, interval=RESYNC_SECONDS, initial_delay=_first_resync,
            when=_not_deleted)
def resync(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, stopped: kopf.DaemonStopped | None = None,
           **_: Any) -> None:
    """Also runs first thing after an operator (re)start: resume without writing when nothing changed. Quiet
    (nothing planned, rendered or read) when nothing the last full reconcile read has changed."""
    operator = running(memo)
    operator.resync_ran(stopped)
    if (out := operator.resync(body)) is not None:
        _finish(out, body, patch, "resync")


def _without_finalizer(handler_id: str, registry: kopf.OperatorRegistry) -> None:
    """Let a timer run without holding its objects' deletion (Kopf's decorators offer no option for it)."""
    spawning = registry._spawning
    spawning._handlers = [dataclasses.replace(h, requires_finalizer=False) if h.id == handler_id else h
                          for h in spawning._handlers]


_without_finalizer(RESYNC, kopf.get_default_registry())


def unchanged_spec(operation: str | None, old: Any, new: Any) -> bool:
    """An update that leaves the spec as it was: the operator's (and Kopf's) own metadata patches."""
    return operation == "UPDATE" and old is not None and new is not None and old.get("spec") == new.get("spec")


async def validate(spec: kopf.Spec, name: str, warnings: list[str], userinfo: kopf.UserInfo, memo: kopf.Memo,
                   namespace: str | None, operation: str | None = None, old: Any = None, new: Any = None,
                   gpu_nodes: Any = None, **_: Any) -> None:
    """The admission review, on the webhook's own threads (reconciles never hold it up); an update that leaves
    the spec alone (Kopf's own annotations, a label) is admitted at once, as the chart's matchConditions do."""
    if unchanged_spec(operation, old, new):
        telemetry.ADMISSION.labels("unchanged").inc()
        return
    operator = running(memo)
    found, refusal, code = await asyncio.get_running_loop().run_in_executor(
        operator.admission_executor, functools.partial(operator.review, dict(spec), name, userinfo, namespace,
                                                       gpu_nodes))
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


if WEBHOOK_ENABLED:  # Kopf refuses to start with admission handlers but no server
    kopf.on.validate(GROUP, VERSION, PLURAL, id="validate-llmdeployment",
                     operations=["CREATE", "UPDATE"])(validate)
