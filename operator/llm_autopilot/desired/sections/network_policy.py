"""The NetworkPolicy's section: with the chart's switch off, a policy left from before is deleted. (With it on, the
policy is one of the rendered objects: render/workload.py.)"""

from __future__ import annotations

from llm_autopilot.desired.network_policy import DeleteNetworkPolicy
from llm_autopilot.desired.vocabulary import Draft


def report_network_policy(d: Draft) -> None:
    """The deletion of a policy left from before, when the operator renders none now."""
    if d.settings.network_policy is None and d.world.live.network_policy:
        d.out.effects.append(DeleteNetworkPolicy(d.owner.namespace, d.owner.name, d.owner.uid))
