"""The KV-saturation rule: which PromQL to ask, and what the answers mean. Pure.

The shell runs :meth:`SaturationRule.queries` against Prometheus and hands the values to
:meth:`SaturationRule.judge`, so the rule can change without touching the gatherer. The rule was built on
metric traces of a real vLLM (saturated, busy but healthy, light, idle: tests/data/vllm_cpu_metric_traces.json,
``make traces-vllm``) and is tested against them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from llm_autopilot.remediation.classify import Classification, Signal
from llm_autopilot.vllm.metrics import KV_CACHE_USAGE, KV_CACHE_USAGE_NAMES, PREEMPTIONS, REQUESTS_WAITING

#: every name vLLM has given the KV-cache usage gauge (vllm/metrics.py), newest first: read either
USAGE_METRICS = KV_CACHE_USAGE_NAMES


def saturated_query(metric: str, selector: str, window: int, threshold: float) -> str:
    """Pods that a saturated vLLM looks like over the whole window (measured on a real one:
    tests/data/vllm_cpu_metric_traces.json): the average usage high, preemptions increasing and a waiting
    queue that never drained, on a series as old as the window. The answer is the highest such average.

    Not "usage stayed above X": preemption frees the preempted sequences' blocks, so a saturated vLLM's
    usage swings (0.73-1.00 sample to sample, mean 0.88, measured), while a busy but healthy one can peak as
    high (0.95) with no preemption and no queue."""
    usage = f"{metric}{{{selector}}}"
    return (f"max((avg_over_time({usage}[{window}s]) >= {threshold})"
            f" and on(namespace, pod) (increase({PREEMPTIONS}{{{selector}}}[{window}s]) > 0)"
            f" and on(namespace, pod) (min_over_time({REQUESTS_WAITING}{{{selector}}}[{window}s]) >= 1)"
            f" and on(namespace, pod) ({usage} offset {window}s))")


def pod_selector(namespace: str, pods: list[str]) -> str:
    # pod names are DNS labels ([a-z0-9-]), safe inside a PromQL regex without escaping
    return f'namespace="{namespace}",pod=~"{"|".join(pods)}"'


class SaturationRule(Protocol):
    def queries(self, selector: str, *, window: int, threshold: float) -> dict[str, str]:
        """Named instant queries; each answers one number (or nothing)."""
        ...

    def judge(self, values: Mapping[str, float | None], queries: Mapping[str, str], *, window: int,
              threshold: float, observed_at: str) -> Classification | None:
        """KV saturation from the answers, or None."""
        ...


@dataclass(frozen=True)
class PreemptionSaturationRule:
    """KV saturation as a real vLLM shows it: high average usage with preemptions and a queue that stays."""

    def queries(self, selector: str, *, window: int, threshold: float) -> dict[str, str]:
        saturated = {metric: saturated_query(metric, selector, window, threshold) for metric in USAGE_METRICS}
        # the evidence: what the pods showed over the same window
        return {**saturated,
                "peak": f"max(max_over_time({KV_CACHE_USAGE}{{{selector}}}[{window}s]))",
                "preemptions": f"max(increase({PREEMPTIONS}{{{selector}}}[{window}s]))",
                "waiting": f"max(min_over_time({REQUESTS_WAITING}{{{selector}}}[{window}s]))"}

    def judge(self, values: Mapping[str, float | None], queries: Mapping[str, str], *, window: int,
              threshold: float, observed_at: str) -> Classification | None:
        metric = next((m for m in USAGE_METRICS if values.get(m) is not None), None)
        if metric is None:
            return None
        average = values[metric] or 0.0
        preemptions = values.get("preemptions") or 0.0
        waiting = values.get("waiting") or 0.0
        peak = values.get("peak")
        evidence = {"query": queries[metric], "value": f"{average:.3f}", "averageUsage": f"{average:.3f}",
                    "peakUsage": "" if peak is None else f"{peak:.3f}", "preemptions": f"{preemptions:.0f}",
                    "minWaiting": f"{waiting:g}", "windowSeconds": str(window), "observedAt": observed_at,
                    "source": "prometheus"}
        return Classification(Signal.KV_SATURATION,
                              f"KV cache usage averaged {average:.0%} over {window}s (threshold {threshold:.0%}) "
                              f"with {preemptions:.0f} preemptions and at least {waiting:g} requests always waiting",
                              evidence=evidence)


KV_SATURATION = PreemptionSaturationRule()
