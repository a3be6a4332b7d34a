"""The KV-saturation rule: which PromQL to ask, and what the answers mean. Pure.

The shell runs :meth:`SaturationRule.queries` against Prometheus and hands the values to
:meth:`SaturationRule.judge`, so a better rule (e.g. one fitted on real vLLM traces) replaces this one
without touching the gatherer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from llm_autopilot.remediation.classify import Classification, Signal

#: vLLM renamed gpu_cache_usage_perc to kv_cache_usage_perc in 0.9.2 (both until 0.11): read either
USAGE_METRICS = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def sustained_usage_query(metric: str, selector: str, window: int, threshold: float) -> str:
    """Pods whose usage stayed at or above the threshold for the whole window: the minimum over the window
    and the value at its start (so a series younger than the window does not count)."""
    series = f"{metric}{{{selector}}}"
    return (f"max((min_over_time({series}[{window}s]) >= {threshold}) "
            f"and on(namespace, pod) ({series} offset {window}s >= {threshold}))")


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
class SustainedUsageRule:
    """Usage at or above the threshold for the whole window, with preemptions or a growing waiting queue."""

    def queries(self, selector: str, *, window: int, threshold: float) -> dict[str, str]:
        usage = {metric: sustained_usage_query(metric, selector, window, threshold) for metric in USAGE_METRICS}
        return {**usage,
                "preemptions": f"max(increase(vllm:num_preemptions_total{{{selector}}}[{window}s]))",
                "waiting": f"max(deriv(vllm:num_requests_waiting{{{selector}}}[{window}s]))"}

    def judge(self, values: Mapping[str, float | None], queries: Mapping[str, str], *, window: int,
              threshold: float, observed_at: str) -> Classification | None:
        metric = next((m for m in USAGE_METRICS if values.get(m) is not None), None)
        if metric is None:
            return None
        usage = values[metric] or 0.0
        preemptions = values.get("preemptions") or 0.0
        waiting = values.get("waiting") or 0.0
        if preemptions <= 0 and waiting <= 0:
            return None
        evidence = {"query": queries[metric], "value": f"{usage:.3f}", "preemptions": f"{preemptions:g}",
                    "waitingTrendPerSecond": f"{waiting:.3g}", "observedAt": observed_at, "source": "prometheus"}
        return Classification(Signal.KV_SATURATION,
                              f"KV cache usage {usage:.0%} for {window}s with "
                              f"{preemptions:g} preemptions / waiting queue growing {waiting:.2g}/s",
                              evidence=evidence)


SUSTAINED_USAGE = SustainedUsageRule()
