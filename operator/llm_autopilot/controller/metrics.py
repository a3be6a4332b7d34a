"""Shell: instant queries to Prometheus (through prometheus-api-client only), each bounded in time.

What to ask and what the answers mean is the pure saturation rule's (remediation/saturation.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from llm_autopilot.remediation.classify import Classification
from llm_autopilot.remediation.saturation import (  # the last two re-exported for the reaction-time benchmark
    KV_SATURATION,
    USAGE_METRICS,
    SaturationRule,
    pod_selector,
    saturated_query,
)

__all__ = ["USAGE_METRICS", "MetricsSource", "MetricsUnavailable", "PrometheusClient", "PrometheusSettings",
           "PrometheusSignals", "query_saturation", "saturated_query"]

#: a hung Prometheus must not hold a handler thread: each query gives up after this (then MetricsUnavailable)
QUERY_TIMEOUT_SECONDS = 5.0


class MetricsUnavailable(RuntimeError):
    """Prometheus could not be queried; remediation holds still."""


@dataclass(frozen=True)
class PrometheusSettings:
    url: str
    headers: dict[str, str] | None = None
    verify_tls: bool | str = True
    timeout_seconds: float = QUERY_TIMEOUT_SECONDS


class MetricsSource(Protocol):
    """The Prometheus calls remediation makes (PrometheusClient; an in-memory fake in tests)."""

    where: str

    def scalar(self, query: str) -> float | None:
        """The largest value an instant query returns, None when it returns nothing; raises MetricsUnavailable."""
        ...


def query_saturation(metrics: MetricsSource, rule: SaturationRule, selector: str, *, window: int,
                     threshold: float) -> Classification | None:
    """Ask Prometheus what ``rule`` needs, and let the rule judge the answers."""
    queries = rule.queries(selector, window=window, threshold=threshold)
    values = {name: metrics.scalar(query) for name, query in queries.items()}
    observed_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return rule.judge(values, queries, window=window, threshold=threshold, observed_at=observed_at)


class PrometheusClient:
    """One connection pool for the process; every query is bounded by ``timeout_seconds`` and not retried
    (the next resync is the retry)."""

    def __init__(self, settings: PrometheusSettings) -> None:
        self.where = f"Prometheus at {settings.url}"
        self._timeout = settings.timeout_seconds
        self._prom = PrometheusConnect(url=settings.url, headers=settings.headers,
                                       disable_ssl=not settings.verify_tls, retry=Retry(total=0),
                                       timeout=settings.timeout_seconds)
        if isinstance(settings.verify_tls, str):
            self._prom._session.verify = settings.verify_tls

    def scalar(self, query: str) -> float | None:
        """The largest value the query returns; None when it returns nothing."""
        try:
            result: list[dict[str, Any]] = self._prom.custom_query(
                query, params={"timeout": f"{self._timeout:g}s"})
        except Exception as exc:  # the client raises several unrelated types on network and HTTP errors
            raise MetricsUnavailable(f"Prometheus query failed: {type(exc).__name__}: {exc}") from exc
        if not result:
            return None
        try:
            return max(float(r["value"][1]) for r in result)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise MetricsUnavailable(f"Prometheus answered an unexpected shape: {exc}") from exc

    def healthy(self) -> bool:
        try:
            return bool(self._prom.check_prometheus_connection())
        except Exception:
            return False


class PrometheusSignals:
    """KV saturation of one deployment's pods, by name (for tools and tests; the operator's gatherer narrows
    the query to the current plan's pods)."""

    def __init__(self, settings: PrometheusSettings, rule: SaturationRule = KV_SATURATION) -> None:
        self.client = PrometheusClient(settings)
        self.rule = rule

    def kv_saturation(self, namespace: str, name: str, *, threshold: float, window: int,
                      pods: list[str] | None = None) -> Classification | None:
        if pods is not None and not pods:
            return None
        by_name = f'namespace="{namespace}",pod=~"{name}-[a-z0-9]+-[a-z0-9]+"'
        selector = pod_selector(namespace, pods) if pods else by_name
        return query_saturation(self.client, self.rule, selector, window=window, threshold=threshold)

    def healthy(self) -> bool:
        return self.client.healthy()
