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


#: vLLM renamed gpu_cache_usage_perc to kv_cache_usage_perc in 0.9.2 (both until 0.11): read either
USAGE_METRICS = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def sustained_usage_query(metric: str, selector: str, window: int, threshold: float) -> str:
    """Pods whose usage stayed at or above the threshold for the whole window: the minimum over the window
    and the value at its start (so a series younger than the window does not count)."""
    series = f"{metric}{{{selector}}}"
    return (f"max((min_over_time({series}[{window}s]) >= {threshold}) "
            f"and on(namespace, pod) ({series} offset {window}s >= {threshold}))")


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

    def kv_saturation(self, namespace: str, name: str, *, threshold: float, window: int,
                      pods: list[str] | None = None) -> Classification | None:
        """Saturated: usage at or above the threshold for the whole window, with preemptions or a growing queue.

        ``pods`` narrows the query to the pods that run the current plan (an older plan's pods say nothing
        about the settings in force); by default every pod of the deployment counts.
        """
        if pods is not None and not pods:
            return None
        # pod names are DNS labels ([a-z0-9-]), safe inside a PromQL regex without escaping
        pod_match = "|".join(pods) if pods else f"{name}-[a-z0-9]+-[a-z0-9]+"
        selector = f'namespace="{namespace}",pod=~"{pod_match}"'
        usage = None
        for metric in USAGE_METRICS:
            usage_query = sustained_usage_query(metric, selector, window, threshold)
            usage = self._scalar(usage_query)
            if usage is not None:
                break
        if usage is None:
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
