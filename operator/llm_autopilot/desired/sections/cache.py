"""Section: status.cache and ModelCached (spec.model.cache): the cache's objects still to create, asked for
first when the cache's state for these inputs is not read yet."""

from __future__ import annotations

from typing import Any

from llm_autopilot.api.v1alpha1 import CacheStatus, LLMDeploymentSpec
from llm_autopilot.desired.status_fields import CACHE
from llm_autopilot.desired.vocabulary import MODEL_CACHED, Asks, Draft
from llm_autopilot.planner.plan import Plan
from llm_autopilot.render import cache, rollout


def cache_condition(status: CacheStatus) -> tuple[bool, str, str]:
    """ModelCached: (status, reason, message). The status's message (why a try failed) follows what is said."""
    retrying = f"; {status.message}" if status.message else ""
    if status.state == "Complete":
        return True, "Cached", f"{status.total_bytes or status.bytes} bytes in PVC {status.claim_name}{retrying}"
    if status.state == "Failed":
        return False, "CacheFailed", status.message or f"the download into PVC {status.claim_name} failed"
    if status.state == "Downloading":
        shown = f"{status.percent}%" if status.percent is not None else f"{status.bytes} bytes"
        return False, "Downloading", (f"{shown} into PVC {status.claim_name}; no vLLM pod starts before it "
                                      f"completes{retrying}")
    return False, "Pending", f"waiting for the download Job of PVC {status.claim_name} to start{retrying}"


def observe_cache(d: Draft, spec: LLMDeploymentSpec, plan: Plan) -> list[dict[str, Any]] | Asks:
    """The cache's objects still to create (its state kept in ``d.cache_status``); nothing without a cache; the
    Asks when the cache's state for these inputs is not read yet."""
    if not cache.enabled(spec):
        return []
    inputs = cache.CacheInputs(spec, d.owner.namespace, d.settings.operator_image,
                               rollout.checkpoint_bytes(plan.config), hub_endpoint=d.settings.hub_endpoint)
    seen = d.world.cache
    if seen is None or seen.inputs != inputs:
        return Asks(cache=inputs, known_cache=d.read.cache)
    d.cache_status = seen.status
    return list(seen.objects)


def report_cache(d: Draft) -> None:
    """status.cache and ModelCached, a Warning when the download failed; unsettled until complete."""
    status = d.cache_status
    if status is None:
        return
    d.put(CACHE, status)
    before = d.conditions
    d.condition(MODEL_CACHED, *cache_condition(status))
    if status.state == "Failed" and before != d.conditions:
        d.event("Warning", "CacheFailed", status.message)
    if status.state != "Complete":
        d.out.settled = False  # the next resync reads the download's progress again
