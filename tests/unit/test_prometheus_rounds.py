"""KV saturation asked once per namespace and round (metrics.SaturationRounds): the same verdicts as asking per
object, a fraction of the queries, and a Prometheus outage paid once per round."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field

import pytest

from llm_autopilot.controller.metrics import (
    MetricsUnavailable,
    PerObjectSaturation,
    SaturationRounds,
    grouped,
)
from llm_autopilot.remediation.saturation import KV_SATURATION

NS = "team-a"
#: per pod: (average usage, preemptions, minimum waiting, peak); what each of the rule's queries answers for it
PODS = {"a-1": (0.97, 12.0, 8.0, 1.0), "a-2": (0.50, 0.0, 0.0, 0.6), "b-1": (0.91, 3.0, 2.0, 0.99),
        "c-1": (0.95, 0.0, 5.0, 0.97), "d-1": (0.99, 9.0, 0.0, 1.0)}
THRESHOLD, WINDOW = 0.9, 300


def answer(query: str, pod: str) -> float | None:
    """What Prometheus answers for one pod's series of a query of the rule (a small evaluator of its meaning)."""
    usage, preemptions, waiting, peak = PODS[pod]
    if "and on(namespace, pod)" in query:  # a saturated query: all three conditions on the same pod
        if "gpu_cache_usage_perc" in query:
            return None  # the pre-0.9.2 metric is not served
        ok = usage >= THRESHOLD and preemptions > 0 and waiting >= 1
        return usage if ok else None
    if "max_over_time" in query:
        return peak
    if "num_preemptions_total" in query:
        return preemptions
    return waiting


def pods_of(query: str) -> list[str]:
    selected = re.search(r'pod=~"([^"]+)"', query)
    return selected.group(1).split("|") if selected else list(PODS)


@dataclass
class Prometheus:
    """Answers both forms: max(...) over the selected pods (per object) and max by (namespace, pod) (batched)."""

    queries: list[str] = field(default_factory=list)
    down: bool = False
    delay: float = 0.0
    where: str = "Prometheus at http://prometheus.test"

    def _ask(self, query: str) -> dict[str, float]:
        self.queries.append(query)
        time.sleep(self.delay)
        if self.down:
            raise MetricsUnavailable("Prometheus query failed: ConnectTimeoutError: timed out")
        found = {pod: answer(query, pod) for pod in pods_of(query)}
        return {pod: value for pod, value in found.items() if value is not None}

    def scalar(self, query: str) -> float | None:
        assert query.startswith("max(")
        values = self._ask(query)
        return max(values.values()) if values else None

    def vector(self, query: str) -> dict[tuple[str, str], float]:
        assert query.startswith("max by (namespace, pod) (")
        return {(NS, pod): value for pod, value in self._ask(query).items()}


OBJECTS = {"a": ["a-1", "a-2"], "b": ["b-1"], "c": ["c-1"], "d": ["d-1"], "a-old": ["a-2"]}


def test_batched_verdicts_are_the_per_object_verdicts() -> None:
    per_object = PerObjectSaturation(Prometheus())
    rounds = SaturationRounds(Prometheus(), round_seconds=60)
    for name, pods in OBJECTS.items():
        single = per_object.saturation(NS, pods, window=WINDOW, threshold=THRESHOLD)
        batched = rounds.saturation(NS, pods, window=WINDOW, threshold=THRESHOLD)
        assert (single is None) == (batched is None), name
        if single is not None and batched is not None:
            assert batched.summary == single.summary
            evidence = {k: v for k, v in single.evidence.items() if k != "observedAt"}
            assert {k: v for k, v in batched.evidence.items() if k != "observedAt"} == evidence
    assert {n for n, p in OBJECTS.items()
            if rounds.saturation(NS, p, window=WINDOW, threshold=THRESHOLD) is not None} == {"a", "b"}


def test_one_round_asks_once_per_namespace_whatever_the_number_of_objects() -> None:
    prometheus = Prometheus()
    clock = [0.0]
    rounds = SaturationRounds(prometheus, round_seconds=30, clock=lambda: clock[0])
    asked = len(KV_SATURATION.queries("x", window=WINDOW, threshold=THRESHOLD))
    for _ in range(10):
        for pods in OBJECTS.values():
            rounds.saturation(NS, pods, window=WINDOW, threshold=THRESHOLD)
    assert len(prometheus.queries) == asked
    assert all(q.startswith("max by (namespace, pod) (") and f'namespace="{NS}"' in q for q in prometheus.queries)
    clock[0] = 30.0  # the next round asks again
    rounds.saturation(NS, ["a-1"], window=WINDOW, threshold=THRESHOLD)
    assert len(prometheus.queries) == 2 * asked
    rounds.saturation(NS, ["a-1"], window=60, threshold=THRESHOLD)  # another question is another batch
    assert len(prometheus.queries) == 3 * asked


def test_an_outage_costs_one_attempt_per_round_and_every_object_hears_of_it() -> None:
    prometheus = Prometheus(down=True)
    rounds = SaturationRounds(prometheus, round_seconds=30, clock=lambda: 0.0)
    for pods in OBJECTS.values():
        with pytest.raises(MetricsUnavailable, match="timed out"):
            rounds.saturation(NS, pods, window=WINDOW, threshold=THRESHOLD)
    assert len(prometheus.queries) == 1


def test_objects_of_one_namespace_wait_for_the_round_in_flight() -> None:
    prometheus = Prometheus(delay=0.2)
    rounds = SaturationRounds(prometheus, round_seconds=30)
    results: list[object] = []
    threads = [threading.Thread(target=lambda p=p: results.append(  # type: ignore[misc]
        rounds.saturation(NS, p, window=WINDOW, threshold=THRESHOLD))) for p in OBJECTS.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(results) == len(OBJECTS)
    assert len(prometheus.queries) == len(KV_SATURATION.queries("x", window=WINDOW, threshold=THRESHOLD))


def test_every_query_of_the_rule_can_be_asked_per_pod() -> None:
    for query in KV_SATURATION.queries('namespace="ns"', window=WINDOW, threshold=THRESHOLD).values():
        assert grouped(query).startswith("max by (namespace, pod) (") and grouped(query).endswith(")")
    with pytest.raises(ValueError, match="per pod"):
        grouped("sum(vllm:num_requests_running)")
