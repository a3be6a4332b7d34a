"""The NetworkPolicy switch's shell: a policy left from when the operator rendered them, deleted once the switch is
off (desired/sections/network_policy.py decides; with the switch on the policy is a rendered object)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from llm_autopilot.desired.network_policy import DeleteNetworkPolicy
from llm_autopilot.render import network_policy

if TYPE_CHECKING:
    from llm_autopilot.controller.reconcile import Reconciler

logger = logging.getLogger(__name__)


def _owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid and ref.get("controller")
               for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])


def _delete(r: Reconciler, delete: DeleteNetworkPolicy) -> None:
    """Delete the policy if the LLMDeployment owns it (one of the same name someone else wrote stays)."""
    live = r.kube.get(network_policy.API_VERSION, network_policy.KIND, delete.name, delete.namespace)
    if live is None or not _owned_by(live, delete.owner_uid):
        return
    if r.kube.delete(network_policy.API_VERSION, network_policy.KIND, delete.name, delete.namespace,
                     uid=str(live["metadata"].get("uid", ""))):
        r.writes += 1
        logger.info("%s/%s: deleted its NetworkPolicy: the operator renders none now (networkPolicy.enabled is "
                    "off)", delete.namespace, delete.name)


READERS: dict[type, Callable[[Reconciler, Any], object]] = {}
EXECUTORS: dict[type, Callable[[Reconciler, Any], None]] = {DeleteNetworkPolicy: _delete}
