"""What one gather step read of the world for one LLMDeployment; the decisions take it as their only input
besides the spec, the status and the clock. Pure data."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llm_autopilot.api.v1alpha1 import SourceStatus
from llm_autopilot.domain.architecture import ModelArchitecture
from llm_autopilot.render.workload import Live


@dataclass(frozen=True)
class GPUNode:
    """A schedulable GPU node as the node watch shows it."""

    labels: Mapping[str, str]
    gpus: int
    memory_gib: float = 0.0


@dataclass(frozen=True)
class World:
    """The model's architecture (from the Hub, an S3 bucket, the catalog or the spec), the GPU nodes, which of
    the optional CRDs are installed, and which workload shapes exist."""

    model: ModelArchitecture
    nodes: tuple[GPUNode, ...] = ()
    #: the names of the CustomResourceDefinitions asked about that are installed
    crds: frozenset[str] = frozenset()
    #: the shapes that exist; ``live.deployment`` is whether a Deployment of the object's name exists at all
    live: Live = dataclasses.field(default_factory=Live)
    #: what an s3:// source's reading leaves for status.source (None for the other sources)
    source: SourceStatus | None = None

    def node_pairs(self) -> Iterable[tuple[Mapping[str, str], int]]:
        """(labels, allocatable GPUs) per node: what the pool computation reads."""
        return ((n.labels, n.gpus) for n in self.nodes)

    def live_for(self, multi_node: bool) -> Live:
        """The live shapes as the renderer reads them: a Deployment counts only beside a multi-node plan (one
        to park); a single-node plan's Deployment is its own."""
        return dataclasses.replace(self.live, deployment=multi_node and self.live.deployment)
