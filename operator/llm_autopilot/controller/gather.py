"""Shell: gather what the reconcile decides on before anything is decided, one module per job: the World
(world_reads.py), remediation's evidence (evidence.py) and what the pods say of themselves, their KV-cache
figures and vLLM versions (pod_reads.py). This module names them for the reconcile and the handlers.
"""

from __future__ import annotations

from llm_autopilot.controller.evidence import REMEMBERED_CRASHES, Gatherer
from llm_autopilot.controller.pod_reads import (
    REMEMBERED_VERSIONS,
    START_LOG_BYTES,
    VERSION_SECONDS,
    LabelSource,
    PodReader,
    PodSource,
    read_vllm_version,
)
from llm_autopilot.controller.world_reads import (
    LazyTokenHubClient,
    SecretUnreadable,
    WorldSource,
    crd_installed,
    hub_token,
    read_adapters,
    read_live,
    read_model,
    read_model_source,
    read_nodes,
    read_world,
    secret,
)
from llm_autopilot.desired.world import Target

__all__ = ["REMEMBERED_CRASHES", "REMEMBERED_VERSIONS", "START_LOG_BYTES", "VERSION_SECONDS", "Gatherer",
           "LabelSource", "LazyTokenHubClient", "PodReader", "PodSource", "SecretUnreadable", "Target", "WorldSource",
           "crd_installed", "hub_token", "read_adapters", "read_live", "read_model",
           "read_model_source", "read_nodes", "read_vllm_version", "read_world", "secret"]
