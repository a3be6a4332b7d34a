"""Failure evidence from pod statuses (what the kubelet wrote), and overrides -> planner targets. Pure."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from llm_autopilot.domain.precision import KVCacheDtype
from llm_autopilot.planner.plan import Targets
from llm_autopilot.remediation.classify import Classification, classify_termination
from llm_autopilot.remediation.ladder import Overrides


@dataclass(frozen=True)
class Evidence:
    classification: Classification
    #: identifies this failure, so a restarted operator never acts on it twice
    key: str
    pod: str
    observed_at: str


def latest_crash(pods: list[dict[str, Any]], *, container: str, plan_hash: str,
                 plan_hash_annotation: str) -> Evidence | None:
    """The newest termination of ``container`` in pods running the current plan."""
    found: list[Evidence] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (meta.get("annotations") or {}).get(plan_hash_annotation) != plan_hash:
            continue  # an older plan's pod: its failure is not about what runs now
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if cs.get("name") != container:
                continue
            terminated = (cs.get("lastState") or {}).get("terminated") or (cs.get("state") or {}).get("terminated")
            if not terminated:
                continue
            when = str(terminated.get("finishedAt") or terminated.get("startedAt") or "")
            c = classify_termination(terminated.get("reason"), terminated.get("exitCode"), terminated.get("message"))
            evidence = {**c.evidence, "pod": str(meta.get("name")), "restartCount": str(cs.get("restartCount", 0)),
                        "finishedAt": when, "source": "pod status (lastState.terminated)"}
            key = f"{meta.get('name')}/{cs.get('restartCount', 0)}/{when}"
            found.append(Evidence(dataclasses.replace(c, evidence=evidence), key, str(meta.get("name")), when))
    return max(found, key=lambda e: e.observed_at) if found else None


def apply_overrides(targets: Targets, o: Overrides) -> Targets:
    """Planner targets with remediation's overrides on top (they only ever make the plan safer)."""
    changes: dict[str, Any] = {}
    if o.max_model_len is not None:
        desired = min(targets.max_model_len or o.max_model_len, o.max_model_len)
        changes["max_model_len"] = desired
        changes["min_max_model_len"] = min(targets.min_max_model_len or desired, desired)
    if o.max_num_batched_tokens is not None:
        changes["max_num_batched_tokens"] = o.max_num_batched_tokens
    if o.max_num_seqs is not None:
        changes["max_num_seqs"] = o.max_num_seqs
    if o.enforce_eager:
        changes["enforce_eager"] = True
    if o.gpu_memory_utilization is not None:
        changes["gpu_memory_utilization"] = o.gpu_memory_utilization
    if o.fp8_kv_cache:
        changes["allowed_kv_cache_dtypes"] = (KVCacheDtype.FP8,)
    if o.min_gpus is not None:
        changes["min_gpus"] = o.min_gpus
    return dataclasses.replace(targets, **changes)
