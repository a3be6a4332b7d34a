"""spec.autoscaling -> a KEDA ScaledObject that drives the LLMDeployment's scale subresource. Pure.

KEDA keeps an HPA on ``llm-autopilot.io/v1alpha1 LLMDeployment NAME``; the HPA writes ``spec.replicas`` through
the scale subresource and the operator renders that many replicas (pods, or groups of pods across nodes). Two
Prometheus triggers on vLLM's own gauges, summed over the deployment's serving pods: with KEDA's default
``AverageValue`` metric type the HPA asks for ``ceil(sum / target)`` replicas, i.e. it keeps the average per
replica at the target; with two triggers it takes the larger answer.
"""

from __future__ import annotations

from typing import Any

from llm_autopilot.api import GROUP, KIND, VERSION
from llm_autopilot.api.v1alpha1 import AutoscalingPolicy
from llm_autopilot.render.kubernetes import Owner, metadata, with_hash
from llm_autopilot.vllm.metrics import KV_CACHE_USAGE_NAMES, REQUESTS_WAITING

KEDA_API_VERSION = "keda.sh/v1alpha1"
KEDA_CRD = "scaledobjects.keda.sh"
WAITING = REQUESTS_WAITING
#: the label the chart's PodMonitor (and the local cluster's scrape targets) give every vLLM series
DEPLOYMENT_LABEL = "llmdeployment"


def _matcher(owner: Owner) -> str:
    return f'namespace="{owner.namespace}",{DEPLOYMENT_LABEL}="{owner.name}"'


def kv_usage_query(owner: Owner) -> str:
    """Summed KV-cache usage of the deployment's pods (every name vLLM has used for the gauge)."""
    m = _matcher(owner)
    return "sum(" + " or ".join(f"{name}{{{m}}}" for name in KV_CACHE_USAGE_NAMES) + ")"


def waiting_query(owner: Owner) -> str:
    return f"sum({WAITING}{{{_matcher(owner)}}})"


def scaled_object(owner: Owner, policy: AutoscalingPolicy, prometheus: str) -> dict[str, Any]:
    def trigger(name: str, query: str, threshold: str) -> dict[str, Any]:
        return {"type": "prometheus", "name": name, "metricType": "AverageValue", "metadata": {
            "serverAddress": prometheus, "query": query, "threshold": threshold,
            "ignoreNullValues": "true",  # no pod yet (or none scraped): 0, not an error
        }}

    return with_hash({
        "apiVersion": KEDA_API_VERSION,
        "kind": "ScaledObject",
        "metadata": metadata(owner),
        "spec": {
            "scaleTargetRef": {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": owner.name},
            "minReplicaCount": policy.min_replicas,
            "maxReplicaCount": policy.max_replicas,
            "pollingInterval": policy.polling_interval_seconds,
            "cooldownPeriod": policy.cooldown_period_seconds,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                # one replica at a time either way: a replica is a whole GPU server (or several)
                "scaleUp": {"stabilizationWindowSeconds": 0,
                            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 15}]},
                "scaleDown": {"stabilizationWindowSeconds": policy.scale_down_stabilization_seconds,
                              "policies": [{"type": "Pods", "value": 1, "periodSeconds": 15}]},
            }}},
            "triggers": [
                trigger("kv-cache-usage", kv_usage_query(owner), f"{policy.target_kv_cache_usage:g}"),
                trigger("waiting-requests", waiting_query(owner), str(policy.target_waiting_requests)),
            ],
        },
    })
