"""Graceful drain: how a vLLM pod that is being replaced or removed finishes what it is generating.

The order on a pod's deletion, as Kubernetes runs it: the EndpointSlice controller marks the pod terminating
(not ready) at once, and kube-proxy or a gateway then stops sending it requests, a few seconds later; the
kubelet meanwhile runs the preStop hook (a wait of :data:`PRE_STOP_SECONDS`, longer than that update), then
sends SIGTERM to the container's main process, and SIGKILL once ``terminationGracePeriodSeconds`` (counted from
the deletion) is over. vLLM (0.18 and later) given ``--shutdown-timeout N`` answers SIGTERM by refusing new
requests and finishing the ones in flight for up to N seconds (docs/users/rollouts.md has what its source says).
"""

from __future__ import annotations

#: spec.vllm.drainSeconds when unset: a long generation (thousands of tokens at tens of tokens a second) ends
DRAIN_SECONDS_DEFAULT = 120
#: spec.vllm.drainSeconds at most: one hour
DRAIN_SECONDS_MAX = 3600
#: the preStop hook's wait: the endpoint update reaches kube-proxy and gateways in a few seconds, so nothing new
#: is routed to the pod once vLLM, on SIGTERM, stops accepting requests
PRE_STOP_SECONDS = 10
#: vLLM's own teardown after the drain (the engine's processes freeing the device) before the kubelet's SIGKILL
DRAIN_MARGIN_SECONDS = 15


def pre_stop_seconds(drain_seconds: int) -> int:
    """The preStop wait: none without a drain (the pod stops as it always did)."""
    return PRE_STOP_SECONDS if drain_seconds > 0 else 0


def termination_grace_seconds(drain_seconds: int) -> int:
    """The pod's terminationGracePeriodSeconds: the preStop wait, the drain, and vLLM's teardown."""
    return pre_stop_seconds(drain_seconds) + drain_seconds + DRAIN_MARGIN_SECONDS
