"""Pure builders for a vLLM release change's canary (desired/canary.py decides): the ``<name>-canary`` Deployment
(one pod of the new plan) and the fleet's Deployment held on the pod template it runs.

The canary's pods carry the fleet's labels plus CANARY_LABEL, so the Service (which selects the fleet's labels)
sends them traffic too and the operator's pod readers (by instance label and plan hash) read them as the new
plan's pods; the canary's own selector adds CANARY_LABEL, so its ReplicaSet never counts a fleet pod. The fleet's
selector (immutable) matches the canary's pods, but a ReplicaSet only adopts pods no controller owns.
"""

from __future__ import annotations

import copy
from typing import Any

from llm_autopilot.api import GROUP
from llm_autopilot.render.kubernetes import CONTAINER, INPUT_HASH, VLLM_VERSION, with_hash

CANARY_LABEL = f"{GROUP}/canary"
CANARY_SUFFIX = "-canary"


def canary_name(owner_name: str) -> str:
    return f"{owner_name}{CANARY_SUFFIX}"


def _rehashed(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with its input hash made again for what it now is (made as render/kubernetes.py makes it: over the
    object without the hash, and without an annotations map the hash alone filled)."""
    meta = obj["metadata"]
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != INPUT_HASH}
    meta.pop("annotations", None)
    if annotations:
        meta["annotations"] = annotations
    return with_hash(obj)


def canary_deployment(fleet: dict[str, Any]) -> dict[str, Any]:
    """The canary: the fleet's Deployment as the new plan renders it, renamed, one replica, its pods labelled.
    Recreate: a change of its settings (a remediation step) replaces its one pod rather than needing a second
    GPU for a surge."""
    obj = copy.deepcopy(fleet)
    meta = obj["metadata"]
    meta["name"] = canary_name(meta["name"])
    meta["labels"] = {**meta.get("labels", {}), CANARY_LABEL: "true"}
    spec = obj["spec"]
    spec["replicas"] = 1
    spec["strategy"] = {"type": "Recreate"}
    spec["selector"] = {"matchLabels": {**spec["selector"]["matchLabels"], CANARY_LABEL: "true"}}
    template = spec["template"]["metadata"]
    template["labels"] = {**template.get("labels", {}), CANARY_LABEL: "true"}
    return _rehashed(obj)


def held_fleet(new_fleet: dict[str, Any], template: dict[str, Any], replicas: int, *, version: str) -> dict[str, Any]:
    """The fleet's Deployment as the new plan renders it, but with ``template``, the pod template the live one runs
    (the old release's, ``version``: its pods are not rolled), and ``replicas``."""
    obj = copy.deepcopy(new_fleet)
    obj["spec"]["template"] = copy.deepcopy(template)
    obj["spec"]["replicas"] = replicas
    obj["metadata"].setdefault("annotations", {})[VLLM_VERSION] = version
    return _rehashed(obj)


def with_replicas(deployment: dict[str, Any], replicas: int) -> dict[str, Any]:
    """``deployment`` with ``replicas`` (the fleet beside a canary that took one replica's GPU)."""
    if deployment["spec"].get("replicas") == replicas:
        return deployment
    obj = copy.deepcopy(deployment)
    obj["spec"]["replicas"] = replicas
    return _rehashed(obj)


def template_image(deployment: dict[str, Any] | None) -> str | None:
    """The image the vLLM container of a Deployment's pod template runs (None: no such Deployment or container)."""
    if deployment is None:
        return None
    containers = (((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or []
    return next((str(c.get("image")) for c in containers if c.get("name") == CONTAINER and c.get("image")), None)


def deployment_version(deployment: dict[str, Any] | None) -> str | None:
    """The vLLM version a Deployment's pod template was rendered for (its VLLM_VERSION annotation)."""
    annotations = ((deployment or {}).get("metadata") or {}).get("annotations") or {}
    version = annotations.get(VLLM_VERSION)
    return str(version) if version else None
