"""The safety ladder: which settings to change next, for each kind of failure. Pure.

Every candidate only names the knobs to change (an :class:`Overrides`); the reconciler sends each
through the planner in order and takes the first that plans and changes something, so a step
always fits. Floors from the spec are never crossed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from llm_autopilot.domain import knobs
from llm_autopilot.planner.config import ServingConfig
from llm_autopilot.planner.plan import DEFAULT_MIN_MAX_MODEL_LEN
from llm_autopilot.remediation.classify import Classification, Signal

_LEN_ROUNDING = 256
_GMU_STEP = 0.04
_MEMORY_GROWTH = 1.5
#: the smallest largest-batch the CUDA-graph rung keeps: the small decode batches, where a graph saves the most
#: time per token, keep theirs; below it the next rung is eager mode
_MIN_CUDA_GRAPH_CAPTURE = 64


@dataclass(frozen=True)
class Overrides:
    """Settings remediation imposes on top of the spec; None/False means "as the spec and planner say"."""

    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    enforce_eager: bool = False
    gpu_memory_utilization: float | None = None
    fp8_kv_cache: bool = False
    min_gpus: int | None = None
    replicas: int | None = None
    memory_limit_gib: float | None = None
    #: LoRA adapter slots (--max-loras), lowered on an OOM; never below the pinned adapters
    max_loras: int | None = None
    #: the largest batch captured in a CUDA graph, lowered before eager mode turns graphs off
    max_cudagraph_capture_size: int | None = None

    def to_status(self) -> dict[str, Any]:
        return knobs.to_status(dataclasses.asdict(self))

    @classmethod
    def from_status(cls, data: dict[str, Any] | None) -> Overrides:
        return cls(**knobs.from_status(data))


@dataclass(frozen=True)
class Workload:
    """What the renderer made of the plan beyond its config (render/ sits above remediation: the caller reads
    them off the rendered objects)."""

    replicas: int
    #: the container memory limit the objects set (GiB)
    memory_limit_gib: float


@dataclass(frozen=True, kw_only=True)
class Running:
    """What runs now -- a view of the planned config and of the workload rendered from it -- and the limits
    remediation must respect. Each knob's value is read through its row of the knob table (``Knob.current``), so a
    knob the planner sets is read where the planner put it, never copied here; the properties give the rungs typed
    names."""

    config: ServingConfig
    workload: Workload
    # limits
    fp8_kv_allowed: bool
    max_gpus: int
    max_replicas: int
    node_memory_gib: float
    floor_max_model_len: int
    floor_gpu_memory_utilization: float
    floor_max_num_seqs: int
    floor_max_num_batched_tokens: int
    #: spec.autoscaling is set: KEDA owns the replica count, so no rung changes it
    autoscaled: bool = False
    #: the fewest LoRA slots the spec allows (its pinned adapters, at least one)
    floor_max_loras: int = 1

    def now(self, knob: str) -> Any:
        """What runs now for a knob (its field on ``Overrides``), as the table reads it."""
        return knobs.BY_FIELD[knob].current(self)

    @property
    def max_model_len(self) -> int:
        return int(self.now("max_model_len"))

    @property
    def max_num_batched_tokens(self) -> int:
        return int(self.now("max_num_batched_tokens"))

    @property
    def max_num_seqs(self) -> int:
        return int(self.now("max_num_seqs"))

    @property
    def enforce_eager(self) -> bool:
        return bool(self.now("enforce_eager"))

    @property
    def gpu_memory_utilization(self) -> float:
        return float(self.now("gpu_memory_utilization"))

    @property
    def fp8_kv_cache(self) -> bool:
        return bool(self.now("fp8_kv_cache"))

    @property
    def gpus(self) -> int:
        return int(self.now("min_gpus"))

    @property
    def replicas(self) -> int:
        return int(self.now("replicas"))

    @property
    def memory_limit_gib(self) -> float:
        return float(self.now("memory_limit_gib"))

    @property
    def max_loras(self) -> int:
        """--max-loras (0: no LoRA)."""
        return int(self.now("max_loras"))

    @property
    def cuda_graph_capture_size(self) -> int:
        """The largest batch captured in a CUDA graph (0: eager mode)."""
        return int(self.now("max_cudagraph_capture_size"))


def max_model_len_floor(*, floor: int | None, serving_min: int | None, serving_max: int | None,
                        model_max: int) -> int:
    """The shortest context remediation may cut to: ``floors.minMaxModelLen``, else ``serving.minMaxModelLen``,
    else the planner's own minimum (``maxModelLen`` when set, else the smaller of 8192 and the model's maximum)."""
    desired = serving_max or model_max
    return min(floor or serving_min or (desired if serving_max else min(desired, DEFAULT_MIN_MAX_MODEL_LEN)), desired)


def round_up_utilization(value: float) -> float:
    """Two decimals, rounded up (toward safety: never below the floor it came from). The 6-digit rounding keeps
    0.7 - 0.05 at 0.65; a value just above two decimals (a floor of 0.5000000000000001) still goes up to 0.51."""
    rounded = math.ceil(round(value * 100, 6)) / 100
    return rounded if rounded >= value else round(rounded + 0.01, 2)


@dataclass(frozen=True)
class Candidate:
    overrides: Overrides
    action: str


def _round_len(n: int) -> int:
    return n - n % _LEN_ROUNDING if n > _LEN_ROUNDING else n


def _shorter_context(r: Running, o: Overrides, reported: int | None) -> Candidate | None:
    cap = _round_len(reported) if reported else _round_len(r.max_model_len * 3 // 4)
    cap = max(cap, r.floor_max_model_len)
    if cap >= r.max_model_len:
        return None
    note = f" (vLLM estimated {reported})" if reported else ""
    return Candidate(dataclasses.replace(o, max_model_len=cap), f"max_model_len {r.max_model_len} -> {cap}{note}")


def _fp8_kv(r: Running, o: Overrides) -> Candidate | None:
    if r.fp8_kv_cache or not r.fp8_kv_allowed:
        return None
    return Candidate(dataclasses.replace(o, fp8_kv_cache=True),
                     "KV cache dtype auto -> fp8 (half the bytes per token)")


def _more_gpus(r: Running, o: Overrides) -> Candidate | None:
    wanted = r.gpus * 2
    if wanted > r.max_gpus:
        return None
    return Candidate(dataclasses.replace(o, min_gpus=wanted), f"GPUs per replica {r.gpus} -> {wanted}")


def _fewer_batched_tokens(r: Running, o: Overrides) -> Candidate | None:
    # vLLM needs max_num_batched_tokens >= max_num_seqs, so the seqs floor bounds the tokens too
    tokens = max(r.max_num_batched_tokens // 2, r.floor_max_num_batched_tokens, r.floor_max_num_seqs)
    if tokens >= r.max_num_batched_tokens:
        return None
    changed = dataclasses.replace(o, max_num_batched_tokens=tokens)
    if tokens < r.max_num_seqs:  # pinned only when lowered: the planner keeps its own choice otherwise
        changed = dataclasses.replace(changed, max_num_seqs=tokens)
    return Candidate(changed, f"max_num_batched_tokens {r.max_num_batched_tokens} -> {tokens}")


def _fewer_seqs(r: Running, o: Overrides, *, with_tokens: bool) -> Candidate | None:
    seqs = max(r.max_num_seqs // 2, r.floor_max_num_seqs)
    if seqs >= r.max_num_seqs:
        return None
    changed = dataclasses.replace(o, max_num_seqs=seqs)
    action = f"max_num_seqs {r.max_num_seqs} -> {seqs}"
    tokens = max(r.max_num_batched_tokens // 2, r.floor_max_num_batched_tokens, seqs)
    if with_tokens and tokens < r.max_num_batched_tokens:
        changed = dataclasses.replace(changed, max_num_batched_tokens=tokens)
        action += f", max_num_batched_tokens {r.max_num_batched_tokens} -> {tokens}"
    return Candidate(changed, action)


def _on_capture_grid(size: int) -> int:
    """The largest batch vLLM captures at or below ``size`` (8 or more): it captures every 8 tokens, every 16 from
    256 (0.11 on; every 8 before, which every 16 is on too), and truncates a --max-cudagraph-capture-size off that
    grid to it (``VllmConfig._set_cudagraph_sizes``), so a size pinned on the grid is the one that runs."""
    return size - size % (16 if size >= 256 else 8)


def _smaller_cuda_graphs(r: Running, o: Overrides) -> Candidate | None:
    """Half the largest batch captured in a CUDA graph (vLLM's default: 2 x max_num_seqs up to 512, so the first
    halving still covers every decode batch), on vLLM's capture grid, not below ``_MIN_CUDA_GRAPH_CAPTURE``: fewer
    graphs hold less memory, and larger batches run without one instead of every batch (eager mode)."""
    size = max(_on_capture_grid(r.cuda_graph_capture_size // 2), _MIN_CUDA_GRAPH_CAPTURE)
    if size >= r.cuda_graph_capture_size:  # also in eager mode (0): no graphs to shrink
        return None
    return Candidate(dataclasses.replace(o, max_cudagraph_capture_size=size),
                     f"CUDA graphs captured up to {r.cuda_graph_capture_size} -> {size} tokens per batch")


def _eager(r: Running, o: Overrides) -> Candidate | None:
    if r.enforce_eager:
        return None
    return Candidate(dataclasses.replace(o, enforce_eager=True), "enforce eager mode (no CUDA graphs)")


def _lower_utilization(r: Running, o: Overrides) -> Candidate | None:
    gmu = round_up_utilization(max(r.gpu_memory_utilization - _GMU_STEP, r.floor_gpu_memory_utilization))
    if gmu >= r.gpu_memory_utilization:
        return None
    return Candidate(dataclasses.replace(o, gpu_memory_utilization=gmu),
                     f"gpu_memory_utilization {r.gpu_memory_utilization:g} -> {gmu:g}")


def _more_memory(r: Running, o: Overrides) -> Candidate | None:
    # up to the next MiB (toward safety), within what one node can give
    limit = min(math.ceil(r.memory_limit_gib * _MEMORY_GROWTH * 1024) / 1024, r.node_memory_gib)
    if limit <= r.memory_limit_gib:
        return None
    return Candidate(dataclasses.replace(o, memory_limit_gib=limit),
                     f"container memory limit {r.memory_limit_gib:g}Gi -> {limit:g}Gi")


def _fewer_loras(r: Running, o: Overrides) -> Candidate | None:
    """Half the LoRA slots (each holds a rank-``max_lora_rank`` copy of every wrapped module), never below the
    pinned adapters: the others wait for a free slot instead of sharing the batch."""
    slots = max(r.max_loras // 2, r.floor_max_loras, 1)
    if not r.max_loras or slots >= r.max_loras:
        return None
    pinned = f", never below the {r.floor_max_loras} pinned" if r.floor_max_loras > 1 else ""
    return Candidate(dataclasses.replace(o, max_loras=slots),
                     f"max_loras {r.max_loras} -> {slots} (fewer LoRA adapter slots on the GPU{pinned})")


def _more_replicas(r: Running, o: Overrides) -> Candidate | None:
    if r.autoscaled or r.replicas + 1 > r.max_replicas:  # an autoscaler's count is not remediation's to change
        return None
    return Candidate(dataclasses.replace(o, replicas=r.replicas + 1), f"replicas {r.replicas} -> {r.replicas + 1}")


def candidates(c: Classification, r: Running, o: Overrides) -> list[Candidate]:
    """The rungs to try for this failure, safest first (the reconciler takes the first that plans)."""
    options: list[Candidate | None]
    match c.signal:
        case Signal.HOST_OOM:
            options = [_more_memory(r, o)]
        case Signal.KV_CAPACITY:
            # vLLM measured less KV cache than planned: never plan longer than it said fits
            capped = o if not c.reported_max_len else dataclasses.replace(
                o, max_model_len=min(o.max_model_len or r.max_model_len,
                                     max(c.reported_max_len, r.floor_max_model_len)))
            options = [_shorter_context(r, o, c.reported_max_len), _fp8_kv(r, capped), _more_gpus(r, capped)]
        case Signal.NO_KV_MEMORY:
            options = [_fewer_batched_tokens(r, o), _fewer_loras(r, o), _eager(r, o), _more_gpus(r, o)]
        case Signal.CUDA_OOM_STARTUP:
            options = [_fewer_batched_tokens(r, o), _fewer_loras(r, o), _smaller_cuda_graphs(r, o), _eager(r, o),
                       _lower_utilization(r, o)]
        case Signal.CUDA_OOM_RUNTIME:
            options = [_fewer_seqs(r, o, with_tokens=True), _fp8_kv(r, o), _more_gpus(r, o), _lower_utilization(r, o)]
        case Signal.KV_SATURATION:
            # with autoscaling, KEDA adds replicas on the same signal; the ladder changes only vLLM's settings
            options = [_fp8_kv(r, o), _more_replicas(r, o), _more_gpus(r, o), _fewer_seqs(r, o, with_tokens=False)]
        case _:
            options = []
    return [option for option in options if option is not None]
