"""Operator configuration from the environment (the Helm chart and `make dev` set these)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from llm_autopilot.api.errors import validation_message
from llm_autopilot.api.v1alpha1 import NetworkPeer
from llm_autopilot.domain.egress import ALLOW_ENV, Allowlist, AllowlistError, parse_allowlist
from llm_autopilot.render.network_policy import NetworkPolicySettings
from llm_autopilot.render.rollout import DEFAULT_LEARNED_FLOOR_SECONDS
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION

#: the chart's networkPolicy switch, and the two peers every model's NetworkPolicy admits (JSON NetworkPolicyPeers)
NETWORK_POLICY_ENV = "LLM_AUTOPILOT_NETWORK_POLICY"
NETWORK_POLICY_OPERATOR_ENV = "LLM_AUTOPILOT_NETWORK_POLICY_OPERATOR"
NETWORK_POLICY_MONITORING_ENV = "LLM_AUTOPILOT_NETWORK_POLICY_MONITORING"


class SettingsError(ValueError):
    """An operator setting in the environment is malformed; the message names it and what it takes."""


def _number(env: dict[str, str], key: str, default: float, *, minimum: float, whole: bool = False) -> float:
    raw = env.get(key)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= minimum or value == float("inf") or (whole and not value.is_integer()):
        kind = "a whole number" if whole else "a number"
        raise SettingsError(f"{key}={raw!r}: must be {kind} >= {minimum:g}")
    return value


def _list(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


def _tls(value: str) -> bool | str:
    lowered = value.strip().lower()
    if lowered in ("false", "0", "no", "off"):
        return False
    if lowered in ("true", "1", "yes", "on", ""):
        return True
    return value  # a CA bundle path


def _switch(env: dict[str, str], key: str) -> bool:
    raw = env.get(key, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise SettingsError(f"{key}={env[key]!r}: must be true or false")


def _peer(env: dict[str, str], key: str) -> NetworkPeer | None:
    raw = env.get(key, "").strip()
    if not raw:
        return None
    try:
        return NetworkPeer.model_validate(json.loads(raw))
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{key}: not JSON ({exc.msg}); it takes a NetworkPolicy peer, e.g. "
                            '{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}'
                            ) from None
    except ValidationError as exc:
        raise SettingsError(validation_message(exc, root=key)) from None


def _network_policy(env: dict[str, str]) -> NetworkPolicySettings | None:
    """The chart's networkPolicy switch (off: None, and the peers are not read)."""
    if not _switch(env, NETWORK_POLICY_ENV):
        return None
    return NetworkPolicySettings(operator=_peer(env, NETWORK_POLICY_OPERATOR_ENV),
                                 monitoring=_peer(env, NETWORK_POLICY_MONITORING_ENV))


def _allowlist(value: str) -> Allowlist:
    try:
        return parse_allowlist(value)
    except AllowlistError as exc:
        raise SettingsError(str(exc)) from None


@dataclass(frozen=True)
class OperatorSettings:
    #: namespaces to watch; empty means all (cluster-wide)
    namespaces: tuple[str, ...] = ()
    default_image: str = f"vllm/vllm-openai:v{DEFAULT_VLLM_VERSION}"
    default_vllm_version: str = str(DEFAULT_VLLM_VERSION)
    #: how often every LLMDeployment is re-checked (no writes when nothing changed)
    resync_seconds: float = 60.0
    #: the longest a quiet object goes without a full reconcile (planned, rendered and compared anew)
    full_check_seconds: float = 600.0
    #: threads for reconciles (Kopf's executor; None: Kopf's default, min(32, CPUs + 4))
    max_workers: int | None = None
    #: threads for the admission webhook's reviews, apart from the reconciles so that it never queues behind them
    admission_workers: int = 2
    prometheus_url: str | None = None
    #: extra HTTP headers for Prometheus, e.g. {"Authorization": "Bearer ..."}
    prometheus_headers: dict[str, str] | None = None
    #: verify Prometheus' TLS certificate (True), skip it (False), or a CA bundle path
    prometheus_verify_tls: bool | str = True
    #: how long one round of KV-saturation answers (asked per namespace) serves every object there
    #: (None: half the resync interval)
    prometheus_round: float | None = None
    #: admission webhook: where Kopf serves it and the host the API server calls
    webhook_enabled: bool = False
    webhook_addr: str = "127.0.0.1"
    webhook_host: str | None = None
    webhook_port: int = 9443
    webhook_cert_dir: str | None = None
    #: a mounted certificate (cert-manager or the chart) instead of a generated self-signed one
    webhook_certfile: str | None = None
    webhook_keyfile: str | None = None
    webhook_cafile: str | None = None
    #: how often the certificate files are re-read; a renewed certificate (cert-manager, a rotated Secret) is
    #: served from then on without a restart
    webhook_cert_check_seconds: float = 60.0
    #: Kopf creates/patches the ValidatingWebhookConfiguration (local clusters); false when the chart ships it
    webhook_managed: bool = True
    #: the operator's own /metrics (None: not served); the chart sets 9090 on 0.0.0.0
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    #: Hub look-ups for models outside the catalog
    hub_timeout_seconds: float = 10.0
    #: the operator's own image: the model cache's download Job runs `llm-autopilot fetch` in it
    operator_image: str = "ghcr.io/llm-autopilot/llm-autopilot:latest"
    #: a Hub mirror the download Job uses (the operator's own HF_ENDPOINT)
    hub_endpoint: str | None = None
    #: Kopf peering: how long a replica's keep-alive counts (refreshed 5-10 s before it expires), so how soon
    #: a standby takes over from a replica that died without saying goodbye (SIGKILL, node loss)
    peering_lifetime_seconds: int = 60
    #: where the KV calibration store (ConfigMap llm-autopilot-calibration) is kept; None: no store
    calibration_namespace: str | None = None
    #: how often the store is read again (an edit by hand is seen within this)
    calibration_read_seconds: float = 60.0
    #: the least a learned startup probe may be (render/rollout.py probe_budget): the slowest start the cluster
    #: must let pass even after fast ones were observed
    startup_probe_floor_seconds: int = DEFAULT_LEARNED_FLOOR_SECONDS
    #: private and cluster addresses (and hosts) the operator's own clients may reach, e.g. an in-cluster S3
    #: store (domain/egress.py; storage/egress_http.py reads the same variable where it connects)
    egress_allow: Allowlist = field(default_factory=Allowlist)
    #: the chart's networkPolicy switch: on, one NetworkPolicy per LLMDeployment admitting its clients, Prometheus
    #: and the operator (render/network_policy.py); None: none rendered, and one left from before deleted
    network_policy: NetworkPolicySettings | None = None

    @property
    def prometheus_round_seconds(self) -> float:
        return self.prometheus_round if self.prometheus_round is not None else self.resync_seconds / 2

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> OperatorSettings:
        e = dict(os.environ if env is None else env)
        defaults = cls()
        workers = _number(e, "LLM_AUTOPILOT_MAX_WORKERS", 0, minimum=1, whole=True) if e.get(
            "LLM_AUTOPILOT_MAX_WORKERS", "").strip() else None
        prometheus_round = _number(e, "LLM_AUTOPILOT_PROMETHEUS_ROUND_SECONDS", 0, minimum=0) if e.get(
            "LLM_AUTOPILOT_PROMETHEUS_ROUND_SECONDS", "").strip() else None
        return cls(
            namespaces=_list(e.get("LLM_AUTOPILOT_NAMESPACES")),
            default_image=e.get("LLM_AUTOPILOT_DEFAULT_IMAGE", defaults.default_image),
            default_vllm_version=e.get("LLM_AUTOPILOT_DEFAULT_VLLM_VERSION", defaults.default_vllm_version),
            resync_seconds=resync_seconds_from_env(e),
            full_check_seconds=_number(e, "LLM_AUTOPILOT_FULL_CHECK_SECONDS", defaults.full_check_seconds,
                                       minimum=1),
            max_workers=int(workers) if workers is not None else None,
            admission_workers=int(_number(e, "LLM_AUTOPILOT_ADMISSION_WORKERS", defaults.admission_workers,
                                          minimum=1, whole=True)),
            prometheus_round=prometheus_round,
            prometheus_url=e.get("LLM_AUTOPILOT_PROMETHEUS_URL") or None,
            prometheus_headers=({"Authorization": e["LLM_AUTOPILOT_PROMETHEUS_AUTHORIZATION"]}
                                if e.get("LLM_AUTOPILOT_PROMETHEUS_AUTHORIZATION") else None),
            prometheus_verify_tls=_tls(e.get("LLM_AUTOPILOT_PROMETHEUS_TLS_VERIFY", "true")),
            webhook_enabled=webhook_enabled_from_env(e),
            webhook_addr=e.get("LLM_AUTOPILOT_WEBHOOK_ADDR", defaults.webhook_addr),
            webhook_host=e.get("LLM_AUTOPILOT_WEBHOOK_HOST") or None,
            webhook_port=int(e.get("LLM_AUTOPILOT_WEBHOOK_PORT", defaults.webhook_port)),
            webhook_cert_dir=e.get("LLM_AUTOPILOT_WEBHOOK_CERT_DIR") or None,
            webhook_certfile=e.get("LLM_AUTOPILOT_WEBHOOK_CERT_FILE") or None,
            webhook_keyfile=e.get("LLM_AUTOPILOT_WEBHOOK_KEY_FILE") or None,
            webhook_cafile=e.get("LLM_AUTOPILOT_WEBHOOK_CA_FILE") or None,
            webhook_cert_check_seconds=float(e.get("LLM_AUTOPILOT_WEBHOOK_CERT_CHECK_SECONDS",
                                                   defaults.webhook_cert_check_seconds)),
            webhook_managed=e.get("LLM_AUTOPILOT_WEBHOOK_MANAGED", "true").lower() not in ("0", "false", "no", "off"),
            metrics_port=int(e["LLM_AUTOPILOT_METRICS_PORT"]) if e.get("LLM_AUTOPILOT_METRICS_PORT") else None,
            metrics_addr=e.get("LLM_AUTOPILOT_METRICS_ADDR", defaults.metrics_addr),
            hub_timeout_seconds=float(e.get("LLM_AUTOPILOT_HUB_TIMEOUT_SECONDS", defaults.hub_timeout_seconds)),
            operator_image=e.get("LLM_AUTOPILOT_OPERATOR_IMAGE") or defaults.operator_image,
            hub_endpoint=e.get("HF_ENDPOINT") or None,
            peering_lifetime_seconds=int(e.get("LLM_AUTOPILOT_PEERING_LIFETIME_SECONDS",
                                               defaults.peering_lifetime_seconds)),
            calibration_namespace=_calibration_namespace(e.get("LLM_AUTOPILOT_CALIBRATION_NAMESPACE", "")),
            calibration_read_seconds=_number(e, "LLM_AUTOPILOT_CALIBRATION_READ_SECONDS",
                                             defaults.calibration_read_seconds, minimum=1),
            startup_probe_floor_seconds=int(_number(e, "LLM_AUTOPILOT_STARTUP_PROBE_FLOOR_SECONDS",
                                                    defaults.startup_probe_floor_seconds, minimum=10, whole=True)),
            egress_allow=_allowlist(e.get(ALLOW_ENV, "")),
            network_policy=_network_policy(e),
        )


def resync_seconds_from_env(env: dict[str, str] | None = None) -> float:
    """LLM_AUTOPILOT_RESYNC_SECONDS alone: Kopf takes the resync timer's interval when the handlers register."""
    e = dict(os.environ if env is None else env)
    return _number(e, "LLM_AUTOPILOT_RESYNC_SECONDS", OperatorSettings.resync_seconds, minimum=0.1)


def webhook_enabled_from_env(env: dict[str, str] | None = None) -> bool:
    """LLM_AUTOPILOT_WEBHOOK alone: the admission handler registers only with it (Kopf refuses to start with an
    admission handler but no webhook server)."""
    e = dict(os.environ if env is None else env)
    return e.get("LLM_AUTOPILOT_WEBHOOK", "").lower() in ("1", "true", "yes", "on")


#: the namespace of the pod the operator runs in (in a cluster)
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _calibration_namespace(value: str) -> str | None:
    """LLM_AUTOPILOT_CALIBRATION_NAMESPACE; unset: the operator's own namespace in a cluster, none outside one;
    ``off``: no store."""
    value = value.strip()
    if value.lower() in ("off", "none", "false"):
        return None
    if value:
        return value
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or None
    except OSError:
        return None
