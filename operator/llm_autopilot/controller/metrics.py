"""Shell: read vLLM's KV-cache signals from Prometheus (through prometheus-api-client only)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_api_client import PrometheusConnect

from llm_autopilot.remediation.classify import Classification, Signal


class MetricsUnavailable(RuntimeError):
    """Prometheus could not be queried; remediation holds still."""


@dataclass(frozen=True)
class PrometheusSettings:
    url: str
    headers: dict[str, str] | None = None
    verify_tls: bool | str = True


def _usage(selector: str, window: int) -> str:
    # vLLM renamed gpu_cache_usage_perc to kv_cache_usage_perc; read both so old and new versions work
    return (f"max(min_over_time(vllm:kv_cache_usage_perc{{{selector}}}[{window}s])"
            f" or min_over_time(vllm:gpu_cache_usage_perc{{{selector}}}[{window}s]))")


class PrometheusSignals:
    def __init__(self, settings: PrometheusSettings) -> None:
        self._prom = PrometheusConnect(url=settings.url, headers=settings.headers, disable_ssl=not settings.verify_tls)
        if isinstance(settings.verify_tls, str):
            self._prom._session.verify = settings.verify_tls

    def _scalar(self, query: str) -> float | None:
        try:
            result: list[dict[str, Any]] = self._prom.custom_query(query)
        except Exception as exc:  # the client raises several unrelated types on network and HTTP errors
            raise MetricsUnavailable(f"Prometheus query failed: {type(exc).__name__}: {exc}") from exc
        if not result:
            return None
        return max(float(r["value"][1]) for r in result)

    def kv_saturation(self, namespace: str, name: str, *, threshold: float, window: int) -> Classification | None:
        """Saturated: usage at or above the threshold for the whole window, with preemptions or a growing queue."""
        selector = f'namespace="{namespace}",pod=~"{name}-[a-z0-9]+-[a-z0-9]+"'
        usage_query = _usage(selector, window)
        usage = self._scalar(usage_query)
        if usage is None or usage < threshold:
            return None
        preemption_query = f"max(increase(vllm:num_preemptions_total{{{selector}}}[{window}s]))"
        waiting_query = f"max(deriv(vllm:num_requests_waiting{{{selector}}}[{window}s]))"
        preemptions = self._scalar(preemption_query) or 0.0
        waiting = self._scalar(waiting_query) or 0.0
        if preemptions <= 0 and waiting <= 0:
            return None
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        evidence = {"query": usage_query, "value": f"{usage:.3f}", "preemptions": f"{preemptions:g}",
                    "waitingTrendPerSecond": f"{waiting:.3g}", "observedAt": now, "source": "prometheus"}
        return Classification(Signal.KV_SATURATION,
                              f"KV cache usage {usage:.0%} for {window}s with "
                              f"{preemptions:g} preemptions / waiting queue growing {waiting:.2g}/s",
                              evidence=evidence)

    def healthy(self) -> bool:
        try:
            return bool(self._prom.check_prometheus_connection())
        except Exception:
            return False
