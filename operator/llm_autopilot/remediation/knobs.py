"""Remediation's knobs, each declared once: its field on ``Overrides``, its alias in ``status.remediation.
applied``, the bounds a status read from the cluster is clamped into, and the planner target it sets. Pure.

``Overrides``' status form (ladder.py), the defensive reader of a status (state.py) and the planner mapping
(evidence.apply_overrides) are derived from this table; a test checks the status model
(api/v1alpha1.RemediationOverrides) against it. Knobs whose reading or mapping is not a plain bound or copy
(replicas, max_model_len, fp8 KV cache, max_loras) say so with ``special``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llm_autopilot.remediation.state import Limits


class Kind(StrEnum):
    INTEGER = "integer"
    NUMBER = "number"
    FLAG = "flag"


def _none(_: Limits) -> float | None:
    return None


@dataclass(frozen=True)
class Knob:
    #: the field of ``Overrides`` (and of ``RemediationOverrides``)
    field: str
    #: its name in status.remediation.applied[]
    alias: str
    kind: Kind
    #: the bounds a value read from the status is clamped into (low None: the kind's own check only)
    low: Callable[[Limits], float | None] = _none
    high: Callable[[Limits], float | None] = _none
    #: a number that must be above zero (a memory limit, a utilization)
    positive: bool = False
    #: the planner target (``planner.plan.Targets``) it sets as it is; None: mapped by hand (``special``)
    target: str | None = None
    #: read or mapped by its own code (state.py, evidence.apply_overrides), not from the bounds and target
    special: bool = False


KNOBS: tuple[Knob, ...] = (
    Knob("max_model_len", "maxModelLen", Kind.INTEGER, low=lambda lim: lim.floor_max_model_len, special=True),
    Knob("max_num_batched_tokens", "maxNumBatchedTokens", Kind.INTEGER,
         low=lambda lim: lim.floor_max_num_batched_tokens, target="max_num_batched_tokens"),
    Knob("max_num_seqs", "maxNumSeqs", Kind.INTEGER, low=lambda lim: lim.floor_max_num_seqs, target="max_num_seqs"),
    Knob("enforce_eager", "enforceEager", Kind.FLAG, target="enforce_eager"),
    Knob("gpu_memory_utilization", "gpuMemoryUtilization", Kind.NUMBER,
         low=lambda lim: lim.floor_gpu_memory_utilization, high=lambda _: 1.0, positive=True,
         target="gpu_memory_utilization"),
    Knob("fp8_kv_cache", "fp8KVCache", Kind.FLAG, special=True),
    Knob("min_gpus", "minGPUs", Kind.INTEGER, low=lambda _: 1, high=lambda lim: lim.max_gpus, target="min_gpus"),
    Knob("replicas", "replicas", Kind.INTEGER, special=True),
    Knob("memory_limit_gib", "memoryLimitGiB", Kind.NUMBER, low=lambda _: 1.0,
         high=lambda lim: lim.node_memory_gib if lim.node_memory_gib > 0 else None, positive=True),
    # LoRA adapter slots: mapped into the plan's LoRA request, never below its pinned adapters (evidence.py)
    Knob("max_loras", "maxLoras", Kind.INTEGER, low=lambda _: 1, high=lambda _: 64, special=True),
)

ALIASES: dict[str, str] = {k.field: k.alias for k in KNOBS}


def to_status(values: dict[str, Any]) -> dict[str, Any]:
    """The status form of a knob -> value mapping: aliases, unset (None) and off (False) knobs left out."""
    return {ALIASES[name]: value for name, value in values.items() if value not in (None, False)}


def from_status(data: dict[str, Any] | None) -> dict[str, Any]:
    """Knob -> value from a status entry (flags as booleans; nothing checked: see state.py for the reader)."""
    d = data or {}
    return {k.field: bool(d.get(k.alias)) if k.kind is Kind.FLAG else d.get(k.alias) for k in KNOBS}
