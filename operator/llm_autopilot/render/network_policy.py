"""The NetworkPolicy of one LLMDeployment's vLLM pods, when the operator renders them (the Helm value
``networkPolicy.enabled``). Pure.

Ingress only (vLLM still downloads weights and reaches what it reached before). Four rules, each a source:

- the clients ``spec.network.allowedClients`` names (unset: the pods of the LLMDeployment's namespace), on vLLM's
  port;
- Prometheus (the chart's monitoring peer), on vLLM's port, where ``/metrics`` is;
- the operator's own pods, on vLLM's port: verification reads ``/metrics``, burn-in sends its load, runtime LoRA
  updates call the API;
- the model's own pods, on every port: the pods of one replica across nodes talk to each other (torch distributed,
  NCCL, Ray) on ports vLLM chooses.

A rule with no ``from`` would admit every source, so a source with no peer gets no rule at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec, NetworkPeer
from llm_autopilot.render.kubernetes import Owner, metadata, selector, with_hash
from llm_autopilot.render.vllm_args import VLLM_PORT

API_VERSION = "networking.k8s.io/v1"
KIND = "NetworkPolicy"


@dataclass(frozen=True)
class NetworkPolicySettings:
    """The chart's switch is on: what every policy admits besides the spec's clients."""

    #: the operator's own pods (None: the operator runs outside the cluster, e.g. `make dev`)
    operator: NetworkPeer | None = None
    #: Prometheus' pods (None: nothing scrapes vLLM)
    monitoring: NetworkPeer | None = None


def _same_namespace() -> dict[str, Any]:
    """Every pod of the policy's own namespace (a podSelector without a namespaceSelector)."""
    return {"podSelector": {}}


def clients(spec: LLMDeploymentSpec) -> list[dict[str, Any]]:
    """The spec's clients as NetworkPolicy peers: unset, the LLMDeployment's namespace; ``[]``, none."""
    network = spec.network
    if network is None or network.allowed_clients is None:
        return [_same_namespace()]
    return [peer.to_kubernetes() for peer in network.allowed_clients]


def _port() -> list[dict[str, Any]]:
    return [{"port": VLLM_PORT, "protocol": "TCP"}]


def network_policy(owner: Owner, spec: LLMDeploymentSpec, settings: NetworkPolicySettings) -> dict[str, Any]:
    """The LLMDeployment's NetworkPolicy (named after it, owned by it) over its vLLM pods."""
    on_port = [peers for peers in (
        clients(spec),
        [settings.monitoring.to_kubernetes()] if settings.monitoring is not None else [],
        [settings.operator.to_kubernetes()] if settings.operator is not None else [],
    ) if peers]  # never an empty `from`: it would admit every source
    ingress = [{"from": peers, "ports": _port()} for peers in on_port]
    ingress.append({"from": [{"podSelector": {"matchLabels": selector(owner)}}]})
    return with_hash({
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata(owner),
        "spec": {
            "podSelector": {"matchLabels": selector(owner)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    })
