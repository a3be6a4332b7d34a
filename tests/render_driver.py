"""Render what the operator would apply for a spec, without a cluster: the reconciler's own context/plan/render.

``FakeKube`` answers the two reads the render path makes (GPU nodes, the Hub-token Secret) with the local
cluster's simulated GPU nodes (hack/cluster.py's node manifests), so a plan here is the plan the operator
would make on that cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hack.localcluster.nodes import node_manifests

from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.catalog.gpus import UnknownGPUError
from llm_autopilot.controller.kube import NodeGPUs
from llm_autopilot.controller.reconcile import context, render, timed_plan
from llm_autopilot.controller.settings import OperatorSettings
from llm_autopilot.hub.resolve import ModelResolutionError
from llm_autopilot.planner.plan import Plan
from llm_autopilot.remediation.ladder import Overrides
from llm_autopilot.render.kubernetes import Owner, quantity_gib
from llm_autopilot.vllm.versions import VersionError


class FakeKube:
    """The reads of one reconcile's render path; everything else is not needed to render."""

    def gpu_nodes(self) -> list[NodeGPUs]:
        nodes = []
        for node in node_manifests():
            allocatable = node["status"]["allocatable"]
            nodes.append(NodeGPUs(dict(node["metadata"]["labels"]), int(allocatable["nvidia.com/gpu"]),
                                  quantity_gib(allocatable["memory"])))
        return nodes

    def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        return "hf_fake_token"


@dataclass(frozen=True)
class NotRendered:
    """Why the reconciler would set Planned=False instead of applying objects."""

    reason: str
    message: str


def render_objects(spec_body: dict[str, Any], *, name: str, namespace: str,
                   overrides: Overrides | None = None) -> list[dict[str, Any]] | NotRendered:
    """The Deployment, Service and PDB reconcile() would apply for this spec (and remediation overrides)."""
    settings = OperatorSettings()
    spec = LLMDeploymentSpec.model_validate(spec_body)
    try:
        ctx = context(spec, namespace, FakeKube(), settings)  # type: ignore[arg-type]
    except (UnknownGPUError, VersionError, ModelResolutionError) as exc:
        return NotRendered(type(exc).__name__, str(exc))
    applied = overrides or Overrides()
    choice = timed_plan(ctx, applied)
    if not isinstance(choice.result, Plan) or choice.pool is None:
        return NotRendered("Infeasible", getattr(choice.result, "message", "no GPU pool"))
    return render(ctx, choice, applied, Owner(name, namespace, "00000000-0000-0000-0000-000000000000"),
                  settings).objects
