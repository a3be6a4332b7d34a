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
from llm_autopilot.planner.plan import DEFAULT_MIN_MAX_MODEL_LEN
from llm_autopilot.remediation.classify import Classification, Signal

_LEN_ROUNDING = 256
_GMU_STEP = 0.04
_MEMORY_GROWTH = 1.5


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

    def to_status(self) -> dict[str, Any]:
        return knobs.to_status(dataclasses.asdict(self))

    @classmethod
    def from_status(cls, data: dict[str, Any] | None) -> Overrides:
        return cls(**knobs.from_status(data))


@dataclass(frozen=True)
class Running:
    """What runs now (the current plan) and the limits remediation must respect."""

    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    enforce_eager: bool
    gpu_memory_utilization: float
    fp8_kv_cache: bool
    gpus: int
    replicas: int
    memory_limit_gib: float
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
    #: --max-loras (0: no LoRA) and the fewest slots the spec allows (its pinned adapters, at least one)
    max_loras: int = 0
    floor_max_loras: int = 1


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
            options = [_fewer_batched_tokens(r, o), _fewer_loras(r, o), _eager(r, o), _lower_utilization(r, o)]
        case Signal.CUDA_OOM_RUNTIME:
            options = [_fewer_seqs(r, o, with_tokens=True), _fp8_kv(r, o), _more_gpus(r, o), _lower_utilization(r, o)]
        case Signal.KV_SATURATION:
            # with autoscaling, KEDA adds replicas on the same signal; the ladder changes only vLLM's settings
            options = [_fp8_kv(r, o), _more_replicas(r, o), _more_gpus(r, o), _fewer_seqs(r, o, with_tokens=False)]
        case _:
            options = []
    return [option for option in options if option is not None]
