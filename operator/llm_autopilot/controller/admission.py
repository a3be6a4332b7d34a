"""Admission: the reconcile's own decision, desired(), on the World a webhook can read within its time budget.

The World is read as the reconcile reads it (controller/world_reads.py), narrowed to what answers in milliseconds: the
model from the catalog or the inline architecture (never the Hub, a volume or a bucket: such a model is admitted
with a warning and checked when the operator reconciles it), the GPU nodes from the node watch's index
(:class:`NodeView`), the LoRA adapters' configs within their own budget (controller/adapters.py); no Prometheus,
pods, evidence or KV calibration store. desired() then decides on it as for a new object (an empty status), and
its first round holds the verdict: a Planned=False whose reason the same inputs always give again is the refusal,
with the reconcile's message; one that depends on the cluster is a warning; an Intent that asks to read more
(the cache, the workload, the evidence) has a plan that passed every refusal. What only admission does stays
here: the object's name, vLLM flags the target version lacks, and notes on what the planner chose.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from llm_autopilot.api import convert
from llm_autopilot.api.conditions import PLANNED, get_condition
from llm_autopilot.api.kubernetes_rules import object_name_problem
from llm_autopilot.api.sources import PVCSource, S3Source, Source
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.controller.settings import OperatorSettings
from llm_autopilot.desired.intent import DETERMINISTIC_FAILURES, Intent, desired
from llm_autopilot.desired.world import AdapterReading, GPUNode, Unresolved, World
from llm_autopilot.domain import egress
from llm_autopilot.domain.architecture import ModelArchitecture
from llm_autopilot.hub.resolve import InvalidOverride, resolve_offline
from llm_autopilot.planner.plan import Plan
from llm_autopilot.render.autoscaling import KEDA_CRD
from llm_autopilot.render.kubernetes import Owner
from llm_autopilot.render.vllm_args import unknown_flags
from llm_autopilot.storage.egress_http import operator_allowlist
from llm_autopilot.vllm.versions import VersionError

logger = logging.getLogger(__name__)


@dataclass
class AdmissionVerdict:
    """The webhook's answer: allowed or refused (with why), and warnings either way."""

    allowed: bool
    message: str = ""
    warnings: list[str] = field(default_factory=list)


#: the GPU nodes, read when the answer needs them (the node index's GPUNode, or (labels, allocatable GPUs))
NodeSource = Callable[[], Iterable[GPUNode | tuple[Mapping[str, str], int]]]
#: the LoRA adapters' configs as read within the webhook's budget, and warnings for those it could not read
#: (controller/adapters.py::admission_check)
AdapterSource = Callable[[LLMDeploymentSpec], tuple[AdapterReading, list[str]]]

#: Planned=False reasons that refuse the object: the reconcile's deterministic failures, and more replicas than
#: the GPU pool the node index shows holds (what the reconcile will say of it; nothing is deployed meanwhile)
REFUSED = DETERMINISTIC_FAILURES | {"TooManyReplicas"}
#: refusals that come from the GPU nodes' pools when the spec names no GPU (neither product nor memoryGiB): more
#: or other nodes may come, so they are warnings
POOL_DEPENDENT = frozenset({"Infeasible", "TooManyReplicas"})
#: the optional CRDs the webhook does not read: it judges the spec as if they were installed (the reconcile says
#: NoKEDA when KEDA is missing)
ASSUMED_CRDS = frozenset({KEDA_CRD})
#: the reason a model the webhook does not read carries in its World (desired() then stops there: a warning)
READ_WHEN_RECONCILED = "ModelUnresolved"


def review(spec_body: dict[str, Any], default_vllm_version: str, *, name: str | None = None,
           namespace: str | None = None, nodes: NodeSource | None = None, adapters: AdapterSource | None = None,
           prometheus_url: str | None = None, now: datetime | None = None) -> AdmissionVerdict:
    """The webhook's answer for an LLMDeployment named ``name`` (the name is checked when given): desired() on the
    World below, for a new object. ``nodes``: the GPU nodes (none: planned on the named GPU's catalog figures, as
    8-GPU nodes); ``adapters``: the LoRA adapters' configs; ``default_vllm_version`` and ``prometheus_url``: the
    operator's settings desired() reads for the verdict."""
    if name is not None and (problem := object_name_problem(name)) is not None:
        return AdmissionVerdict(False, f"metadata.name: {problem}")
    owner, settings = Owner(name or "", namespace or "", ""), _settings(default_vllm_version, prometheus_url)
    at = now or datetime.now(UTC)
    try:
        spec = LLMDeploymentSpec.model_validate(spec_body)
    except ValidationError:  # desired() says why, as it does for the reconcile
        unread = World(Unresolved("InvalidSpec", ""), owner=owner, operator=settings)
        return _verdict(None, desired(spec_body, {}, unread, at), [])
    if (refused := _unknown_flags(spec, default_vllm_version)) is not None:
        return AdmissionVerdict(False, refused)
    if (refused := _refused_endpoint(spec)) is not None:
        return AdmissionVerdict(False, refused)
    reading, warnings = adapters(spec) if adapters is not None and spec.lora is not None else (AdapterReading(), [])
    if spec.gpu.memory_gib is not None and not spec.gpu.node_selector:
        warnings.append("spec.gpu.memoryGiB names no GPU product, so the pods may land on any node with "
                        "nvidia.com/gpu; set spec.gpu.nodeSelector to pin them to the GPUs you described")
    model = _model(spec)
    found = tuple(_gpu_node(n) for n in nodes()) if nodes is not None and not isinstance(model, Unresolved) else ()
    world = World(model, found, ASSUMED_CRDS, owner=owner, operator=settings, adapters=reading)
    return _verdict(spec, desired(spec_body, {}, world, at), warnings)


def _refused_endpoint(spec: LLMDeploymentSpec) -> str | None:
    """An S3 endpoint at a literal address the operator's egress policy refuses, with the allowlist it runs with
    (a name is judged where the operator connects: it may resolve elsewhere then)."""
    for options, where in ((spec.model.s3, "spec.model.s3.endpoint"),
                           (spec.lora.s3 if spec.lora is not None else None, "spec.lora.s3.endpoint")):
        host = egress.host_of(options.endpoint) if options is not None and options.endpoint else ""
        address = egress.parse_address(host) if host else None
        if address is not None and (problem := egress.refusal(host, address, operator_allowlist())) is not None:
            return f"{where}: {problem}"
    return None


def _verdict(spec: LLMDeploymentSpec | None, intent: Intent, warnings: list[str]) -> AdmissionVerdict:
    """The first round of desired() as the webhook's answer (see the module's docstring)."""
    planned = get_condition(intent.conditions, PLANNED)
    if intent.asks is None and planned is not None and planned.status == "False":
        reason, message = planned.reason, planned.message
        if refuses(spec, reason):
            return AdmissionVerdict(False, message)
        warnings = [*warnings, message]  # a cause of the cluster: the plan, if one was chosen, still speaks
    if intent.plan is not None and spec is not None:
        warnings = [*warnings, *intent.plan.warnings, *_plan_notes(spec, intent.plan)]
    return AdmissionVerdict(True, warnings=warnings)


def refuses(spec: LLMDeploymentSpec | None, reason: str) -> bool:
    """Whether a Planned=False ``reason`` refuses the object at apply time (else it is a warning)."""
    if reason not in REFUSED:
        return False
    names_gpu = spec is None or spec.gpu.product is not None or spec.gpu.memory_gib is not None
    return names_gpu or reason not in POOL_DEPENDENT


@functools.lru_cache(maxsize=8)
def _settings(default_vllm_version: str, prometheus_url: str | None) -> OperatorSettings:
    return OperatorSettings(default_vllm_version=default_vllm_version, prometheus_url=prometheus_url)


def _unknown_flags(spec: LLMDeploymentSpec, default_vllm_version: str) -> str | None:
    """extraArgs the target vLLM does not accept (the reconcile only warns of them: vLLM would not start)."""
    version = spec.vllm.version or default_vllm_version
    try:
        unknown = unknown_flags(spec.vllm.extra_args, version)
    except VersionError:
        return None  # desired() refuses the version
    return f"spec.vllm.extraArgs: vLLM {version} does not accept {', '.join(unknown)}" if unknown else None


def _model(spec: LLMDeploymentSpec) -> ModelArchitecture | Unresolved:
    """The model's architecture as the reconcile resolves it without reading anything (the catalog, the inline
    architecture), else why it is left to the reconcile (Unresolved)."""
    override = spec.model.architecture
    where = spec.model.location
    try:
        model = resolve_offline(spec.model.hub_repo or spec.model.name, revision=spec.model.revision,
                                override=override.as_hf_config() if override else None,
                                override_checkpoint_bytes=override.weight_bytes if override else None,
                                variants=convert.variants(spec), use_catalog=not isinstance(where, S3Source))
    except InvalidOverride as exc:
        return Unresolved("InvalidArchitecture", str(exc))  # as the reconcile's read (reconcile.py) says it
    if model is None:
        return Unresolved(READ_WHEN_RECONCILED, _fetched_later(spec.model.name, where), retry=True)
    return model


def _gpu_node(node: GPUNode | tuple[Mapping[str, str], int]) -> GPUNode:
    return node if isinstance(node, GPUNode) else GPUNode(node[0], node[1])


def _plan_notes(spec: LLMDeploymentSpec, result: Plan) -> list[str]:
    """What the apply-time answer is, where the spec left it to the planner."""
    notes = []
    if spec.gpu.product is None and spec.gpu.memory_gib is None:
        notes.append(f"spec.gpu.product is not set: planned on the cluster's GPU nodes as {result.summary} (the "
                     "pool with the least GPU memory that fits); name a product to pin it")
    if spec.serving.auto_max_model_len:
        notes.append(f"serving.maxModelLen auto: {result.config.max_model_len} on {result.summary}")
    if result.config.nodes > 1:
        notes.append(f"each replica spans {result.config.nodes} nodes ({result.summary}, tensor parallel "
                     f"{result.config.tensor_parallel_size} within a node, one pipeline stage per node)")
    return notes


def _fetched_later(name: str, where: Source) -> str:
    if isinstance(where, PVCSource):
        return (f"{name} is not in the built-in catalog: its config.json is read from {where.uri} by a short inspect "
                "Job when the operator reconciles it, and the plan checked then")
    if isinstance(where, S3Source):
        return (f"{name}: its config.json and safetensors index are read from {where.uri} and the plan checked "
                "when the operator reconciles it")
    return (f"{name} is not in the built-in catalog: its config is fetched and the plan checked when the "
            "operator reconciles it")


# ---- the GPU nodes ----------------------------------------------------------------------------------------

#: how long one LIST of the GPU nodes answers the webhook while the node index is still filling
NODE_LIST_SECONDS = 30.0


class NodeView:
    """The GPU nodes the webhook plans on: the node watch's index, once it holds as many nodes as one LIST of
    them showed. Kopf tells a webhook nothing of an index still being filled (the operator's first seconds, while
    its watch lists the nodes), and a partial view cannot be told apart from a small cluster; until the index
    catches up, the webhook plans on that LIST, kept :data:`NODE_LIST_SECONDS`. So one LIST is made per operator
    process (another only while the index stays behind, once per period), never one per review: an empty
    cluster is filled at once (0 >= 0), and a LIST that fails leaves the index's view, tried again a period
    later."""

    def __init__(self, list_nodes: Callable[[], Sequence[GPUNode]], *, seconds: float = NODE_LIST_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._list_nodes = list_nodes
        self._seconds = seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._filled = False
        self._listed: tuple[GPUNode, ...] | None = None
        self._due = 0.0
        #: how many LISTs were made (the tests and the bench read it)
        self.lists = 0

    @property
    def filled(self) -> bool:
        return self._filled

    def nodes(self, indexed: Sequence[GPUNode]) -> tuple[GPUNode, ...]:
        if self._filled:
            return tuple(indexed)
        with self._lock:
            if not self._filled and self._clock() >= self._due:
                self._due = self._clock() + self._seconds
                self.lists += 1
                try:
                    self._listed = tuple(self._list_nodes())
                except Exception as exc:  # the index's view, as it is, until the next try
                    logger.warning("the webhook could not list the GPU nodes (%s); it plans on the node watch's "
                                   "%d until it can", exc, len(indexed))
                    self._listed = None
            listed = self._listed
            if listed is None or len(indexed) >= len(listed):
                self._filled = listed is not None
                return tuple(indexed)
            return listed
