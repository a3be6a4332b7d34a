"""Kopf handlers: thin wiring from Kubernetes events to reconcile() and review().

Importing this module registers the handlers; `llm-autopilot operator` runs them.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from pathlib import Path
from typing import Any

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from llm_autopilot.api import GROUP, PLURAL, VERSION
from llm_autopilot.api.conditions import READY, get_condition, set_condition
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.controller import telemetry
from llm_autopilot.controller.access import referenced_secrets, unreadable_secrets_message
from llm_autopilot.controller.admission import review
from llm_autopilot.controller.certs import self_signed
from llm_autopilot.controller.gather import Gatherer
from llm_autopilot.controller.kube import Kube, load_config
from llm_autopilot.controller.reconcile import Outcome, gatherer_for, now, ready_condition, reconcile
from llm_autopilot.controller.settings import OperatorSettings
from llm_autopilot.render.kubernetes import OWNER_LABEL

SETTINGS = OperatorSettings.from_env()
_state: dict[str, Any] = {}


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


def _report(out: Outcome, body: kopf.Body, patch: kopf.Patch) -> None:
    for key, value in out.status.items():
        patch.status[key] = value
    for type_, reason, message in out.events:
        kopf.event(body, type=type_, reason=reason, message=message[:1000])


def _reconcile(body: kopf.Body, patch: kopf.Patch) -> None:
    meta = body.get("metadata", {})
    try:
        out = reconcile(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"],
                        generation=meta.get("generation"), spec_body=dict(body.get("spec") or {}),
                        status=dict(body.get("status") or {}), kube=kube(), settings=SETTINGS, gatherer=gatherer())
    except Exception:
        telemetry.RECONCILES.labels("error").inc()
        raise
    telemetry.RECONCILES.labels("retry" if out.retry else "ok").inc()
    telemetry.WRITES.inc(out.writes + (1 if out.status else 0))
    _report(out, body, patch)
    if out.retry:
        raise kopf.TemporaryError("model could not be resolved yet; retrying", delay=30)


@kopf.on.create(GROUP, VERSION, PLURAL, id="reconcile-on-create")
@kopf.on.update(GROUP, VERSION, PLURAL, id="reconcile-on-update", field="spec")
def reconcile_on_change(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    _reconcile(body, patch)


# Deletion never waits for the operator. Kopf gives every timer a finalizer, so that it can stop the timer
# before the object goes: with the operator stopped, `kubectl delete` then hangs (and the Deployment keeps its
# GPUs), and during a running resync it waits up to Kopf's 60 s cancellation polling. The resync needs no
# clean-up (owner references collect the children), so its finalizer is dropped below and Kopf removes the one
# older versions put on objects when it next sees them. Without the finalizer Kopf learns of a deletion only
# from the DELETED event, which would leave the timer running for an object that is gone: the event marks the
# object's memo, and the timer's filter then no longer matches, which makes Kopf stop it.
RESYNC = "resync"


@kopf.on.event(GROUP, VERSION, PLURAL, id="deletion-stops-resync")
def deletion_stops_resync(type: str | None, memo: kopf.Memo, **_: Any) -> None:
    if type == "DELETED":
        memo["deleted"] = True


def _not_deleted(memo: kopf.Memo, **_: Any) -> bool:
    return not memo.get("deleted")


@kopf.timer(GROUP, VERSION, PLURAL, id=RESYNC, interval=SETTINGS.resync_seconds, initial_delay=1, when=_not_deleted)
def resync(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    """Also runs first thing after an operator (re)start: resume without writing when nothing changed."""
    _reconcile(body, patch)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _without_finalizer(handler_id: str, registry: kopf.OperatorRegistry) -> None:
    """Let a timer run without holding its objects' deletion (Kopf's decorators offer no option for it)."""
    spawning = registry._spawning
    spawning._handlers = [dataclasses.replace(h, requires_finalizer=False) if h.id == handler_id else h
                          for h in spawning._handlers]


_without_finalizer(RESYNC, kopf.get_default_registry())


@kopf.on.event("apps", "v1", "deployments", labels={OWNER_LABEL: kopf.PRESENT}, id="deployment-readiness")
def deployment_changed(body: kopf.Body, namespace: str | None, type: str | None, **_: Any) -> None:
    """Mirror the vLLM Deployment's availability into the LLMDeployment's Ready condition."""
    if type == "DELETED" or namespace is None:
        return
    owner = (body.get("metadata", {}).get("labels") or {}).get(OWNER_LABEL)
    k = kube()
    for _attempt in range(3):  # the status moved under us (409): read it again
        parent = k.get(f"{GROUP}/{VERSION}", "LLMDeployment", owner, namespace) if owner else None
        if parent is None:
            return
        spec, status = parent.get("spec") or {}, parent.get("status") or {}
        ready, reason, message = ready_condition(
            dict(body), spec_replicas=_count(spec.get("replicas", 1)) or 0,
            max_replicas=_count((spec.get("remediation") or {}).get("maxReplicas")),
            remediation=status.get("remediation"))
        current = get_condition(status.get("conditions"), READY)
        if current and (current.get("status"), current.get("reason"), current.get("message")) == (
                "True" if ready else "False", reason, message):
            return
        conditions = set_condition(status.get("conditions"), READY, ready, reason, message,
                                   generation=parent["metadata"].get("generation"), now=now())
        try:
            # with the resourceVersion read, so a reconcile's newer conditions are never overwritten
            k.patch_llmd_status(namespace, parent["metadata"]["name"], {"conditions": conditions},
                                resource_version=parent["metadata"].get("resourceVersion"))
        except ApiException as exc:
            if exc.status != 409:
                raise
            continue
        return


def _secret_refusal(spec: kopf.Spec, userinfo: kopf.UserInfo, namespace: str | None) -> str | None:
    """Why the requesting user may not hand the referenced Secrets to pods (None: they may, or none are named)."""
    names = referenced_secrets(LLMDeploymentSpec.model_validate(dict(spec)))
    if not names:
        return None
    if not namespace:
        return "cannot check access to the referenced Secrets: the request names no namespace"
    return unreadable_secrets_message(client.AuthorizationV1Api(kube().api), userinfo, namespace, names)


def validate(spec: kopf.Spec, name: str, warnings: list[str], userinfo: kopf.UserInfo, namespace: str | None,
             **_: Any) -> None:
    verdict = review(dict(spec), SETTINGS.default_vllm_version, name=name,
                     nodes=lambda: [(n.labels, n.allocatable_gpus) for n in kube().gpu_nodes()])
    refusal = verdict.message if not verdict.allowed else _secret_refusal(spec, userinfo, namespace)
    telemetry.ADMISSION.labels("rejected" if refusal is not None else "allowed").inc()
    warnings.extend(verdict.warnings)
    if refusal is not None:
        # 403 for access, 422 for a spec that cannot work
        raise kopf.AdmissionError(refusal, code=422 if not verdict.allowed else 403)


if SETTINGS.webhook_enabled:  # Kopf refuses to start with admission handlers but no server
    kopf.on.validate(GROUP, VERSION, PLURAL, id="validate-llmdeployment",
                     operations=["CREATE", "UPDATE"])(validate)
