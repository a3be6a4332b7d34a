"""Shell: instant queries to Prometheus (through prometheus-api-client only), each bounded in time.

What to ask and what the answers mean is the pure saturation rule's (remediation/saturation.py). The operator
asks the rule's queries once per namespace and round for all the namespace's pods (``SaturationRounds``) and
hands each LLMDeployment's share of the answers to the rule, instead of asking per object and resync.
"""

from __future__ import annotations

import ast
import json
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from llm_autopilot.controller import telemetry
from llm_autopilot.domain.timestamps import timestamp
from llm_autopilot.remediation.classify import Classification
from llm_autopilot.remediation.saturation import (  # the last two re-exported for the reaction-time benchmark
    KV_SATURATION,
    USAGE_METRICS,
    SaturationRule,
    pod_selector,
    saturated_query,
)
from llm_autopilot.remediation.text import clean_line

__all__ = ["USAGE_METRICS", "MetricsSource", "MetricsUnavailable", "PerObjectSaturation", "PrometheusClient",
           "PrometheusSettings", "PrometheusSignals", "QueryRejected", "SaturationRounds", "SaturationSource",
           "VectorSource", "failure_text", "grouped", "query_saturation", "saturated_query"]

#: a hung Prometheus must not hold a handler thread: each query gives up after this (then MetricsUnavailable)
QUERY_TIMEOUT_SECONDS = 5.0


class MetricsUnavailable(RuntimeError):
    """Prometheus could not be queried; remediation holds still."""


class QueryRejected(MetricsUnavailable):
    """Prometheus is up but refused the query (HTTP 400 bad_data, 422 execution): the spec makes the operator's
    query invalid (e.g. a KV window whose duration PromQL cannot hold). Not an outage; the message is
    Prometheus's own error, cleaned and bounded."""


#: how much of Prometheus's error text a condition carries
ERROR_TEXT_LIMIT = 300
_HTTP_ERROR = re.compile(r"^HTTP Status Code (\d{3}) \((.*)\)$", re.DOTALL)
#: Python object addresses and the query in a URL: they change from one failure to the next, the outage does not
_ADDRESS = re.compile(r" (?:object )?at 0x[0-9a-fA-F]+")
_QUERY_STRING = re.compile(r"(/api/v1/query)\?\S*?(?=[\s'\")]|$)")


def _prometheus_error(exc: Exception) -> tuple[int, str, str] | None:
    """(HTTP status, errorType, error) of a non-200 answer as prometheus-api-client reports it, else None."""
    found = _HTTP_ERROR.match(str(exc))
    if found is None:
        return None
    status, raw = int(found.group(1)), found.group(2)
    try:
        content = ast.literal_eval(raw) if raw[:2] in ("b'", 'b"') else raw
        body = json.loads(content.decode("utf-8", errors="replace") if isinstance(content, bytes) else content)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return status, "", ""
    if not isinstance(body, dict):
        return status, "", ""
    return status, str(body.get("errorType") or ""), str(body.get("error") or "")


def failure_text(exc: Exception) -> str:
    """A failed query said the same way for the same cause: no object addresses, no query string, bounded."""
    text = _QUERY_STRING.sub(r"\1", _ADDRESS.sub("", f"{type(exc).__name__}: {exc}"))
    return clean_line(text, ERROR_TEXT_LIMIT)


def query_failure(exc: Exception) -> MetricsUnavailable:
    """What a failed query means: Prometheus refused it (400/422: QueryRejected), or it could not answer."""
    answer = _prometheus_error(exc)
    if answer is not None and answer[0] in (400, 422):
        status, kind, error = answer
        detail = clean_line(error or "no error text", ERROR_TEXT_LIMIT)
        return QueryRejected(f"Prometheus refused the query (HTTP {status}{', ' + kind if kind else ''}): "
                             f"{detail}")
    if answer is not None:
        status, kind, error = answer
        return MetricsUnavailable(f"Prometheus query failed: HTTP {status}"
                                  f"{', ' + clean_line(kind + ': ' + error, ERROR_TEXT_LIMIT) if kind else ''}")
    return MetricsUnavailable(f"Prometheus query failed: {failure_text(exc)}")


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


class VectorSource(Protocol):
    """Instant queries answered per pod (PrometheusClient; an in-memory fake in tests)."""

    where: str

    def vector(self, query: str) -> dict[tuple[str, str], float]:
        """(namespace, pod) -> value of each series the query returns; raises MetricsUnavailable."""
        ...


class SaturationSource(Protocol):
    """KV saturation of some pods of a namespace, judged by the saturation rule."""

    @property
    def where(self) -> str: ...

    def saturation(self, namespace: str, pods: list[str], *, window: int,
                   threshold: float) -> Classification | None:
        """Raises MetricsUnavailable."""
        ...


def _now_stamp() -> str:
    return timestamp(datetime.now(UTC))


def query_saturation(metrics: MetricsSource, rule: SaturationRule, selector: str, *, window: int,
                     threshold: float) -> Classification | None:
    """Ask Prometheus what ``rule`` needs, and let the rule judge the answers."""
    queries = rule.queries(selector, window=window, threshold=threshold)
    values = {name: metrics.scalar(query) for name, query in queries.items()}
    return rule.judge(values, queries, window=window, threshold=threshold, observed_at=_now_stamp())


@dataclass
class PerObjectSaturation:
    """The rule's queries for exactly these pods, every time (tools, tests; the operator batches)."""

    metrics: MetricsSource
    rule: SaturationRule = KV_SATURATION

    @property
    def where(self) -> str:
        return self.metrics.where

    def saturation(self, namespace: str, pods: list[str], *, window: int,
                   threshold: float) -> Classification | None:
        return query_saturation(self.metrics, self.rule, pod_selector(namespace, pods), window=window,
                                threshold=threshold)


def grouped(query: str) -> str:
    """One of the rule's queries, ``max(EXPR)``, answered per pod: ``max by (namespace, pod) (EXPR)``.

    The rule keeps namespace and pod on every series inside the ``max`` (its joins are ``on(namespace, pod)``),
    so the largest per-pod answer among some pods is what ``max`` over a selector naming those pods gives.
    """
    if not (query.startswith("max(") and query.endswith(")")):
        raise ValueError(f"not a max(...) query, cannot be asked per pod: {query!r}")
    return f"max by (namespace, pod) ({query[len('max('):]}"


@dataclass
class _Round:
    started: float
    values: dict[str, dict[str, float]] | None = None  # query name -> pod -> value
    error: MetricsUnavailable | None = None
    done: threading.Event = field(default_factory=threading.Event)


class SaturationRounds:
    """The rule's queries asked once per round for all pods of a namespace, shared by every LLMDeployment
    there: each gets the largest answer among its own pods, which the rule judges as before.

    A round lasts ``round_seconds``; one thread asks, the others wait for its answers. A failure (Prometheus
    down, a timeout) is kept for the round too, so a hung Prometheus costs one timeout per namespace and round,
    not one per object.
    """

    def __init__(self, source: VectorSource, rule: SaturationRule = KV_SATURATION, *, round_seconds: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self.rule = rule
        self.round_seconds = round_seconds
        self.clock = clock
        self._rounds: dict[tuple[str, int, float], _Round] = {}
        self._lock = threading.Lock()

    @property
    def where(self) -> str:
        return self.source.where

    def _ask(self, namespace: str, window: int, threshold: float) -> dict[str, dict[str, float]]:
        queries = self.rule.queries(f'namespace="{namespace}"', window=window, threshold=threshold)
        answers: dict[str, dict[str, float]] = {}
        for name, query in queries.items():
            answers[name] = {pod: value for (ns, pod), value in self.source.vector(grouped(query)).items()
                             if ns == namespace}
        return answers

    def values(self, namespace: str, *, window: int, threshold: float) -> Mapping[str, Mapping[str, float]]:
        """This round's answers for the namespace's pods (query name -> pod -> value)."""
        key = (namespace, window, threshold)
        now = self.clock()
        with self._lock:
            current = self._rounds.get(key)
            mine = current is None or (current.done.is_set() and now - current.started >= self.round_seconds)
            if mine:
                current = self._rounds[key] = _Round(started=now)
                for stale in [k for k, r in self._rounds.items() if r.done.is_set()
                              and now - r.started >= 2 * self.round_seconds]:
                    del self._rounds[stale]  # namespaces nobody asks about any more
        assert current is not None
        if mine:
            try:
                current.values = self._ask(namespace, window, threshold)
            except MetricsUnavailable as exc:
                current.error = exc
            finally:
                current.done.set()
        else:
            current.done.wait()
        if current.error is not None:
            raise current.error
        assert current.values is not None
        return current.values

    def saturation(self, namespace: str, pods: list[str], *, window: int,
                   threshold: float) -> Classification | None:
        answers = self.values(namespace, window=window, threshold=threshold)
        values: dict[str, float | None] = {}
        for name, per_pod in answers.items():
            found = [per_pod[pod] for pod in pods if pod in per_pod]
            values[name] = max(found) if found else None
        # the evidence names the query for this deployment's pods, which is what the batch answered for them
        queries = self.rule.queries(pod_selector(namespace, pods), window=window, threshold=threshold)
        return self.rule.judge(values, queries, window=window, threshold=threshold, observed_at=_now_stamp())


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

    def _query(self, query: str) -> list[dict[str, Any]]:
        telemetry.PROMETHEUS_QUERIES.inc()
        try:
            result: list[dict[str, Any]] = self._prom.custom_query(
                query, params={"timeout": f"{self._timeout:g}s"})
        except Exception as exc:  # the client raises several unrelated types on network and HTTP errors
            telemetry.PROMETHEUS_ERRORS.inc()
            raise query_failure(exc) from exc
        return result

    def scalar(self, query: str) -> float | None:
        """The largest value the query returns; None when it returns nothing."""
        result = self._query(query)
        if not result:
            return None
        try:
            return max(float(r["value"][1]) for r in result)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise MetricsUnavailable(f"Prometheus answered an unexpected shape: {exc}") from exc

    def series(self, query: str) -> list[dict[str, str]]:
        """The labels of each series the query returns (an info metric's figures are its labels)."""
        try:
            return [{str(k): str(v) for k, v in r["metric"].items()} for r in self._query(query)]
        except (KeyError, TypeError, AttributeError) as exc:
            raise MetricsUnavailable(f"Prometheus answered an unexpected shape: {exc}") from exc

    def vector(self, query: str) -> dict[tuple[str, str], float]:
        """(namespace, pod) -> value of each series the query returns."""
        try:
            return {(str(r["metric"]["namespace"]), str(r["metric"]["pod"])): float(r["value"][1])
                    for r in self._query(query)}
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
