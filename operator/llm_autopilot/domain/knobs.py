"""Remediation's knobs, each declared once: its field on ``Overrides``, its alias in ``status.remediation.
applied``, its status schema (description, bounds), the bounds a status read from the cluster is clamped into,
the planner target it sets and where its value in what runs now is read. Each bound is stated once: a row's
``low``/``high`` say only what its schema bounds cannot (a bound that depends on the limits, or a tighter one); a
status read is clamped into the tighter of the two, else the schema's (``Knob.clamp_low``/``clamp_high``). Pure,
ground floor (imports only the domain).

``Overrides``' status form (remediation/ladder.py), the status model (api/v1alpha1.RemediationOverrides), the
defensive reader of a status (remediation/state.py), the planner mapping (remediation/evidence.apply_overrides) and
what runs now (remediation/ladder.Running, a view of the planned config) are derived from this table. Knobs whose
reading or mapping is not a plain bound or copy (replicas, max_model_len, fp8 KV cache, max_loras) say so with
``special``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from llm_autopilot.domain.precision import KVCacheDtype


class Limits(Protocol):
    """What the clamping bounds read (remediation.state.Limits)."""

    @property
    def floor_max_model_len(self) -> int: ...
    @property
    def floor_max_num_batched_tokens(self) -> int: ...
    @property
    def floor_max_num_seqs(self) -> int: ...
    @property
    def floor_gpu_memory_utilization(self) -> float: ...
    @property
    def max_gpus(self) -> int: ...
    @property
    def node_memory_gib(self) -> float: ...


class Kind(StrEnum):
    INTEGER = "integer"
    NUMBER = "number"
    FLAG = "flag"


def _none(_: Limits) -> float | None:
    return None


#: a knob's value in what runs now, read from the view (remediation.ladder.Running: ``config``, the planned
#: planner.config.ServingConfig, and ``workload``, what the renderer made of it); Any: both sit above this floor
Reading = Callable[[Any], Any]


@dataclass(frozen=True)
class Knob:
    #: the field of ``Overrides`` (and of ``RemediationOverrides``)
    field: str
    #: its name in status.remediation.applied[]
    alias: str
    kind: Kind
    #: the row's own bounds of a value read from the status, where the schema's (ge/gt/le) are not enough: one
    #: that depends on the limits, or a tighter constant (None: the schema's only; see ``clamp_low``)
    low: Callable[[Limits], float | None] = _none
    high: Callable[[Limits], float | None] = _none
    #: a number that must be above zero (a memory limit, a utilization)
    positive: bool = False
    #: the planner target (``planner.plan.Targets``) it sets as it is; None: mapped by hand (``special``)
    target: str | None = None
    #: read or mapped by its own code (state.py, evidence.apply_overrides), not from the bounds and target
    special: bool = False
    #: what runs now for this knob: the planned config's attribute of this name (None: the field's own name), or
    #: a function of the view where it is not one attribute of the plan (``current``)
    now: str | Reading | None = None
    #: the status schema: its description and the bounds the CRD admits (ge/gt/le)
    description: str = ""
    ge: float | None = None
    gt: float | None = None
    le: float | None = None

    def schema_low(self) -> float | None:
        """The least value the schema admits, as a clamp: for an INTEGER knob ceil(ge) or floor(gt) + 1, for
        a NUMBER ge; None if it has none (an open ``gt`` on a NUMBER has no least value: ``positive``
        refuses what is not above zero)."""
        if self.kind is Kind.INTEGER:
            lows = [b for b in (None if self.ge is None else math.ceil(self.ge),
                                None if self.gt is None else math.floor(self.gt) + 1) if b is not None]
            return max(lows) if lows else None
        return None if self.kind is Kind.FLAG or self.ge is None else float(self.ge)

    def schema_high(self) -> float | None:
        """The greatest value the schema admits: floor(le) for an INTEGER knob, le for a NUMBER."""
        if self.kind is Kind.FLAG or self.le is None:
            return None
        return math.floor(self.le) if self.kind is Kind.INTEGER else float(self.le)

    def clamp_low(self, limits: Limits) -> float | None:
        """The bound a value read from a status is raised to: the row's own (``low``) if it gives one, never
        below the schema's; else the schema's."""
        return _tightest(max, self.low(limits), self.schema_low())

    def clamp_high(self, limits: Limits) -> float | None:
        """The bound a value read from a status is lowered to: the row's own (``high``), never above the
        schema's; else the schema's."""
        return _tightest(min, self.high(limits), self.schema_high())

    def current(self, running: Any) -> Any:
        """This knob's value in what runs now (``running``: remediation.ladder.Running), as ``now`` says."""
        if callable(self.now):
            return self.now(running)
        return getattr(running.config, self.now or self.field)


def _tightest(pick: Callable[[float, float], float], own: float | None, schema: float | None) -> float | None:
    return schema if own is None else own if schema is None else pick(own, schema)


KNOBS: tuple[Knob, ...] = (
    Knob("max_model_len", "maxModelLen", Kind.INTEGER, low=lambda lim: lim.floor_max_model_len, special=True,
         description="Cap on max_model_len.", ge=1),
    Knob("max_num_batched_tokens", "maxNumBatchedTokens", Kind.INTEGER,
         low=lambda lim: lim.floor_max_num_batched_tokens, target="max_num_batched_tokens",
         description="Pinned max_num_batched_tokens.", ge=1),
    Knob("max_num_seqs", "maxNumSeqs", Kind.INTEGER, low=lambda lim: lim.floor_max_num_seqs, target="max_num_seqs",
         description="Pinned max_num_seqs.", ge=1),
    Knob("enforce_eager", "enforceEager", Kind.FLAG, target="enforce_eager", description="CUDA graphs off."),
    Knob("gpu_memory_utilization", "gpuMemoryUtilization", Kind.NUMBER,
         low=lambda lim: lim.floor_gpu_memory_utilization, positive=True,
         target="gpu_memory_utilization", description="Pinned gpu_memory_utilization.", gt=0, le=1),
    Knob("fp8_kv_cache", "fp8KVCache", Kind.FLAG, special=True, description="KV cache forced to fp8.",
         now=lambda run: run.config.kv_cache_dtype is KVCacheDtype.FP8),
    Knob("min_gpus", "minGPUs", Kind.INTEGER, high=lambda lim: lim.max_gpus, target="min_gpus",
         description="At least this many GPUs per replica.", ge=1, le=64, now="num_gpus"),
    # replicas and the memory limit are the rendered workload's, not the plan's
    Knob("replicas", "replicas", Kind.INTEGER, special=True, description="Replicas instead of spec.replicas.",
         ge=1, le=1000, now=lambda run: run.workload.replicas),
    Knob("memory_limit_gib", "memoryLimitGiB", Kind.NUMBER, low=lambda _: 1.0,
         high=lambda lim: lim.node_memory_gib if lim.node_memory_gib > 0 else None, positive=True,
         description="Container memory limit (GiB).", gt=0, now=lambda run: run.workload.memory_limit_gib),
    # LoRA adapter slots: mapped into the plan's LoRA request, never below its pinned adapters (evidence.py)
    Knob("max_loras", "maxLoras", Kind.INTEGER, special=True,
         description="LoRA adapter slots (--max-loras).", ge=1, le=64,
         now=lambda run: run.config.lora.max_loras if run.config.lora is not None else 0),
    Knob("max_cudagraph_capture_size", "maxCudagraphCaptureSize", Kind.INTEGER, target="max_cudagraph_capture_size",
         description="Largest batch captured in a CUDA graph (--max-cudagraph-capture-size).", ge=1,
         now="cuda_graph_capture_size"),
)

ALIASES: dict[str, str] = {k.field: k.alias for k in KNOBS}
BY_FIELD: dict[str, Knob] = {k.field: k for k in KNOBS}


def to_status(values: dict[str, Any]) -> dict[str, Any]:
    """The status form of a knob -> value mapping: aliases, unset (None) and off (False) knobs left out."""
    return {ALIASES[name]: value for name, value in values.items() if value not in (None, False)}


def from_status(data: dict[str, Any] | None) -> dict[str, Any]:
    """Knob -> value from a status entry (flags as booleans; nothing checked: see state.py for the reader)."""
    d = data or {}
    return {k.field: bool(d.get(k.alias)) if k.kind is Kind.FLAG else d.get(k.alias) for k in KNOBS}
