"""desired()'s names where they were before it was split into sections, for the modules that import them from
here; new code imports the vocabulary, the sections or the pipeline directly."""

from __future__ import annotations

from llm_autopilot.desired.pipeline import desired
from llm_autopilot.desired.planning import Context, Rendered, context_of, limits, plan_with, render
from llm_autopilot.desired.sections.cache import cache_condition
from llm_autopilot.desired.sections.lora import AdapterRefusal, adapter_refusal
from llm_autopilot.desired.sections.plan import observed_replicas, ready_condition
from llm_autopilot.desired.vocabulary import (
    DETERMINISTIC_FAILURES,
    INSPECTING,
    MODEL_CACHED,
    Asks,
    Intent,
    WorkloadAsk,
)

__all__ = ["DETERMINISTIC_FAILURES", "INSPECTING", "MODEL_CACHED", "AdapterRefusal", "Asks", "Context", "Intent",
           "Rendered", "WorkloadAsk", "adapter_refusal", "cache_condition", "context_of", "desired", "limits",
           "observed_replicas", "plan_with", "ready_condition", "render"]
