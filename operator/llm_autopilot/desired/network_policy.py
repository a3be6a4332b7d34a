"""The NetworkPolicy switch's one effect: a policy left from when the operator rendered them is deleted. Pure words
for its section (desired/sections/network_policy.py) and its shell (controller/features/network_policy.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeleteNetworkPolicy:
    """Delete the LLMDeployment's NetworkPolicy, if it still is the one it owns: the operator renders none now
    (the chart's networkPolicy switch off), and a policy no longer rendered would go on cutting clients."""

    namespace: str
    name: str
    #: the LLMDeployment's uid: a policy it does not own (someone else's of the same name) is left alone
    owner_uid: str
