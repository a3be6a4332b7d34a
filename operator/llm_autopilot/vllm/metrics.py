"""The Prometheus series vLLM exposes, by release: one row per name a release has used. Pure, standard library.

The saturation rule (remediation/saturation.py), the KEDA triggers (render/autoscaling.py), the simulator
(hack/vllm_sim.py) and the chart's alert and dashboard (tests/unit/test_vllm_metrics.py checks them) take
their names from here, so a rename is one row.

Read in each release's wheel from PyPI (``vllm/v1/metrics/loggers.py``; the V0 engine's
``vllm/engine/metrics.py`` for 0.9/0.10), names as ``prometheus_client`` exposes them (a counter ``x`` is
scraped as ``x_total``):

* 0.9.1: ``vllm:gpu_cache_usage_perc`` only (no ``vllm:kv_cache_usage_perc`` in either engine).
* 0.9.2 and 0.10.2: both usage names, the old one "Deprecated in 0.9 - Renamed as vllm:kv_cache_usage_perc".
* 0.11.0: the old name only with ``--show-hidden-metrics-for-version=0.10`` ("Deprecated in 0.9.2").
* 0.12.0 ... 0.33.0: ``vllm:kv_cache_usage_perc`` only.
* every release read (0.9.1, 0.9.2, 0.10.2, 0.11.0, 0.12.0, 0.33.0): ``vllm:num_requests_running``,
  ``vllm:num_requests_waiting``, ``vllm:num_preemptions`` (V1 counter; V0 named it
  ``vllm:num_preemptions_total``: the same series), ``vllm:cache_config_info`` (a gauge at 1, one label
  per CacheConfig field) and ``vllm:lora_requests_info`` (with LoRA enabled).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from llm_autopilot.vllm.versions import VLLMVersion


class Metric(StrEnum):
    """What a series measures, whatever a release calls it."""

    KV_CACHE_USAGE = "kv_cache_usage"  # gauge 0..1, labels model_name, engine
    PREEMPTIONS = "preemptions"  # counter
    REQUESTS_WAITING = "requests_waiting"  # gauge
    REQUESTS_RUNNING = "requests_running"  # gauge
    CACHE_CONFIG_INFO = "cache_config_info"  # gauge at 1; labels: the CacheConfig fields and engine
    LORA_REQUESTS_INFO = "lora_requests_info"  # gauge; labels max_lora, waiting/running_lora_adapters


@dataclass(frozen=True)
class Exposed:
    """One name a metric has had: the releases that expose it by default, and hidden ones."""

    metric: Metric
    name: str
    #: the first release exposing it; None: every release we read (from 0.9.1)
    since: VLLMVersion | None = None
    #: from this release, only with ``--show-hidden-metrics-for-version``
    hidden_from: VLLMVersion | None = None
    #: the first release without it at all
    removed_in: VLLMVersion | None = None

    def exposed_by(self, version: VLLMVersion, *, show_hidden_metrics: bool = False) -> bool:
        if self.since is not None and version < self.since:
            return False
        if self.removed_in is not None and version >= self.removed_in:
            return False
        return self.hidden_from is None or version < self.hidden_from or show_hidden_metrics


#: Newest name first within a metric: the order queries ask in.
TABLE: tuple[Exposed, ...] = (
    Exposed(Metric.KV_CACHE_USAGE, "vllm:kv_cache_usage_perc", since=VLLMVersion(0, 9, 2)),
    Exposed(Metric.KV_CACHE_USAGE, "vllm:gpu_cache_usage_perc",
            hidden_from=VLLMVersion(0, 11, 0), removed_in=VLLMVersion(0, 12, 0)),
    Exposed(Metric.PREEMPTIONS, "vllm:num_preemptions_total"),
    Exposed(Metric.REQUESTS_WAITING, "vllm:num_requests_waiting"),
    Exposed(Metric.REQUESTS_RUNNING, "vllm:num_requests_running"),
    Exposed(Metric.CACHE_CONFIG_INFO, "vllm:cache_config_info"),
    Exposed(Metric.LORA_REQUESTS_INFO, "vllm:lora_requests_info"),
)


def rows(metric: Metric) -> tuple[Exposed, ...]:
    return tuple(row for row in TABLE if row.metric is metric)


def names(metric: Metric, version: VLLMVersion, *, show_hidden_metrics: bool = False) -> list[str]:
    """The name(s) ``version`` exposes ``metric`` under, newest first."""
    return [r.name for r in rows(metric) if r.exposed_by(version, show_hidden_metrics=show_hidden_metrics)]


def every_name(metric: Metric) -> tuple[str, ...]:
    """Every name any release has used for ``metric``, newest first: what a query over mixed releases reads."""
    return tuple(r.name for r in rows(metric))


def current_name(metric: Metric) -> str:
    """The name the newest releases use."""
    return every_name(metric)[0]


#: every vLLM series name the table knows
KNOWN_NAMES: frozenset[str] = frozenset(r.name for r in TABLE)

KV_CACHE_USAGE_NAMES = every_name(Metric.KV_CACHE_USAGE)
KV_CACHE_USAGE = current_name(Metric.KV_CACHE_USAGE)
PREEMPTIONS = current_name(Metric.PREEMPTIONS)
REQUESTS_WAITING = current_name(Metric.REQUESTS_WAITING)
REQUESTS_RUNNING = current_name(Metric.REQUESTS_RUNNING)
CACHE_CONFIG_INFO = current_name(Metric.CACHE_CONFIG_INFO)
LORA_REQUESTS_INFO = current_name(Metric.LORA_REQUESTS_INFO)

#: ``vllm:lora_requests_info``'s labels (``PrometheusStatLogger``, v1/metrics/loggers.py, the same in 0.32.0 and
#: 0.33.0): the adapters with running and with waiting requests (comma-joined names) and ``--max-loras``; the
#: value is the time of the last update (``set_to_current_time``), and every label set seen stays exported, so
#: the newest series of a pod is its current state. In both releases the two adapter labels carry one set: every
#: adapter with a request in flight (v1/metrics/stats.py writes each into both; remediation/lora_slots.py)
LORA_RUNNING_LABEL = "running_lora_adapters"
LORA_WAITING_LABEL = "waiting_lora_adapters"
LORA_MAX_LABEL = "max_lora"
