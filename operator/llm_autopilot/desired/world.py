"""What one gather step read of the world for one LLMDeployment; the decisions take it as their only input
besides the spec, the status and the clock. Pure data."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from llm_autopilot.api.lora import AdapterConfig
from llm_autopilot.api.v1alpha1 import CacheStatus, LoRASourceStatus, SourceStatus
from llm_autopilot.domain.architecture import ModelArchitecture
from llm_autopilot.planner.calibration import CalibrationStore
from llm_autopilot.planner.verify import PodReading
from llm_autopilot.remediation.decide import Evidence
from llm_autopilot.render.cache import CacheInputs
from llm_autopilot.render.kubernetes import Owner
from llm_autopilot.render.network_policy import NetworkPolicySettings
from llm_autopilot.render.workload import Live

#: a feature's reading (World.readings)
Reading = TypeVar("Reading")


class OperatorDefaults(Protocol):
    """The operator-wide settings the decisions read (controller/settings.py's OperatorSettings has them)."""

    @property
    def default_image(self) -> str: ...

    @property
    def default_vllm_version(self) -> str: ...

    @property
    def operator_image(self) -> str: ...

    @property
    def prometheus_url(self) -> str | None: ...

    @property
    def hub_endpoint(self) -> str | None: ...

    @property
    def full_check_seconds(self) -> float: ...

    @property
    def startup_probe_floor_seconds(self) -> int:
        """The least a learned startup probe may be (render/rollout.py probe_budget)."""
        ...

    @property
    def network_policy(self) -> NetworkPolicySettings | None:
        """The chart's networkPolicy switch: on, what every model's NetworkPolicy admits; None: off."""
        ...


@dataclass(frozen=True)
class Unresolved:
    """The model could not be read: the reconcile's answer is Planned=False with this reason."""

    reason: str
    message: str
    retry: bool = False


@dataclass(frozen=True)
class AdapterReading:
    """The LoRA adapters' adapter_config.json files as read from their sources (controller/adapters.py reads the
    Hub's and S3's; the pvc:// ones' inspect Jobs, controller/inspect_step.py)."""

    #: the adapters' configs read, by adapter name
    configs: dict[str, AdapterConfig] = field(default_factory=dict)
    #: adapters that could not be read (the Hub's or the store's answer), each a sentence with what to do
    errors: list[str] = field(default_factory=list)
    #: adapters read without an adapter_config.json, or left to the reconcile: nothing to check here
    notes: list[str] = field(default_factory=list)
    #: status.loraSources: what the pvc:// adapters' inspect Jobs read (None: there are none)
    sources: tuple[LoRASourceStatus, ...] | None = None
    #: the inspect Jobs still to apply, and while a pvc:// adapter is not read yet, why (reason, message)
    objects: tuple[dict[str, Any], ...] = ()
    inspecting: tuple[str, str] | None = None
    retry_delay: float = 30.0


@dataclass(frozen=True)
class SourceView:
    """What a pvc:// source's inspection found (controller/inspect_step.py): its status, the inspect Job's
    objects still to apply, and its failure (reason, message) while the model cannot be planned on yet."""

    status: SourceStatus | None
    objects: tuple[dict[str, Any], ...] = ()
    failure: tuple[str, str] | None = None
    retry_delay: float = 30.0


@dataclass(frozen=True)
class CacheObservation:
    """The model cache (spec.model.cache) as read for ``inputs``: its objects still to create, its status."""

    inputs: CacheInputs
    objects: tuple[dict[str, Any], ...]
    status: CacheStatus


@dataclass(frozen=True)
class Target:
    """What to gather evidence about: one LLMDeployment's current plan."""

    namespace: str
    name: str
    plan_hash: str
    replicas: int
    #: the live Deployment (None before it exists), for the rollout
    deployment: dict[str, Any] | None
    #: the evidence remediation already acted on (its log is not read again)
    last_evidence: str | None
    kv_threshold: float
    kv_window: int
    #: spec.lora is set: a KV saturation's evidence also says which LoRA adapters were in flight
    lora: bool = False


@dataclass(frozen=True)
class VerificationReading:
    """vLLM's own KV figures of the Ready pods of the plan ``plan_hash`` still to read for it (none: every one was
    read, or none is Ready), read by controller/gather.py."""

    plan_hash: str
    readings: tuple[PodReading, ...] = ()


@dataclass(frozen=True)
class WorkloadView:
    """The serving workload's status as a Deployment's (None: none exists), read for the plan ``plan_hash``."""

    plan_hash: str
    deployment: dict[str, Any] | None


@dataclass(frozen=True)
class Applied:
    """What the apply of an Intent's objects said: refused (the API server's message), or written and the
    workload then read again (``view``)."""

    rejected: str | None = None
    view: dict[str, Any] | None = None


@dataclass(frozen=True)
class GPUNode:
    """A schedulable GPU node as the node watch shows it."""

    labels: Mapping[str, str]
    gpus: int
    memory_gib: float = 0.0


@dataclass(frozen=True)
class World:
    """The model's architecture (from the Hub, an S3 bucket, the catalog or the spec; Unresolved: why not), the
    GPU nodes, which of the optional CRDs are installed, and which workload shapes exist."""

    model: ModelArchitecture | Unresolved
    nodes: tuple[GPUNode, ...] = ()
    #: the names of the CustomResourceDefinitions asked about that are installed
    crds: frozenset[str] = frozenset()
    #: the shapes that exist; ``live.deployment`` is whether a Deployment of the object's name exists at all
    live: Live = dataclasses.field(default_factory=Live)
    #: the rest is read for desired() (desired/pipeline.py): the object, the operator's settings, the LoRA
    #: adapters' configs, the pvc:// inspection, and what an Intent's asks named (cache, workload, evidence)
    owner: Owner = dataclasses.field(default_factory=lambda: Owner("", "", ""))
    generation: int | None = None
    operator: OperatorDefaults | None = None
    adapters: AdapterReading = dataclasses.field(default_factory=AdapterReading)
    source: SourceView | None = None
    cache: CacheObservation | None = None
    workload: WorkloadView | None = None
    evidence: Evidence | None = None
    verification: VerificationReading | None = None
    #: what the after-plan features' asks read (Asks.features), one per reading type
    readings: tuple[object, ...] = ()
    applied: Applied | None = None
    #: the KV calibration store as the operator last read it (None: it keeps none, or could not read it yet:
    #: then ``calibration_unreadable`` says why)
    calibration: CalibrationStore | None = None
    calibration_unreadable: str | None = None
    #: the sections of the status read whose attestation is the operator's (desired/status_read.py's ATTESTED;
    #: the shell checks them with its key). None: not checked, every section taken as the operator's
    attested: frozenset[str] | None = None

    def reading(self, kind: type[Reading]) -> Reading | None:
        """The feature's reading of this type (None: not read)."""
        return next((r for r in self.readings if isinstance(r, kind)), None)

    def with_reading(self, reading: object) -> World:
        """The World with ``reading`` in place of the one of its type."""
        return dataclasses.replace(self, readings=(*(r for r in self.readings if type(r) is not type(reading)),
                                                   reading))

    def node_pairs(self) -> Iterable[tuple[Mapping[str, str], int]]:
        """(labels, allocatable GPUs) per node: what the pool computation reads."""
        return ((n.labels, n.gpus) for n in self.nodes)

    def live_for(self, multi_node: bool) -> Live:
        """The live shapes as the renderer reads them: a Deployment counts only beside a multi-node plan (one
        to park); a single-node plan's Deployment is its own."""
        return dataclasses.replace(self.live, deployment=multi_node and self.live.deployment)
