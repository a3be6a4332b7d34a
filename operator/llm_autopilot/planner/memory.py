"""The vLLM memory model: what one configuration leaves for the KV cache on the busiest GPU.

vLLM (V1 engine) sizes the KV cache as::

    budget    = total_gpu_memory x gpu_memory_utilization
    available = budget - weights - activation_peak - non_torch - cuda_graphs
    tokens    = available // bytes_per_token   (in whole blocks)

``activation_peak`` is the transient peak of the profile run (a forward pass over
``max_num_batched_tokens`` tokens, then a sampler warm-up over ``max_num_seqs`` rows of logits);
``non_torch`` is memory outside PyTorch's allocator (CUDA context growth, NCCL and custom
all-reduce buffers, growing with TP); CUDA graphs are estimated and subtracted since vLLM 0.21,
earlier they were captured after sizing, outside the budget. The constants below were fitted to
the figures vLLM prints (tests/data/golden_vllm_logs.json).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llm_autopilot.domain.precision import GIB, WeightFormat
from llm_autopilot.planner import lora as lora_memory
from llm_autopilot.planner.config import ServingConfig
from llm_autopilot.planner.kv_cache import kv_bytes_per_request, kv_bytes_per_token, kv_capacity
from llm_autopilot.planner.weights import (
    stage_layers,
    stage_partition,
    stage_weight_bytes,
    weight_bytes_per_gpu,
)
from llm_autopilot.vllm.versions import dtype_problem

MIB = 1024**2

# Activation peak of the profile forward pass, in 16-bit elements per token: the residual
# stream and norm outputs (~6 x hidden), the QKV projection output, and the dense MLP's gate/up
# output plus the activated product (3 x intermediate per rank).
_HIDDEN_COPIES = 6
_MLP_COPIES = 3
# The sampler warm-up over max_num_seqs rows of float32 logits (full vocabulary on every rank)
# peaks at ~15.5 bytes per logit: the logits and three same-sized temporaries (fitted: Llama-3.1-8B,
# Qwen2.5-7B, Gemma 2/3 at 1024 sequences, vLLM 0.19).
_SAMPLER_BYTES_PER_LOGIT = 15.5
# Before vLLM 0.17 the warm-up's top-k/top-p sorts the logits (values, int64 indices and the sort's scratch) and
# peaks at ~38.9 bytes per logit (VLLMBehaviour.sampler_sorts_logits; fitted: Llama-3.1-8B 4.76 GiB and Qwen3-32B
# 5.64 GiB of peak activation at 1024 sequences in llm-d-benchmark's H100 runs of autumn 2025).
_SORTING_SAMPLER_BYTES_PER_LOGIT = 38.9

# Memory outside PyTorch's allocator: CUDA context growth on one GPU; with TP, NCCL and the custom
# all-reduce buffers add about 2 GiB (fitted: 2.07-2.21 GiB at TP 2 and 4, 0.24-0.27 GiB at TP 1).
_NON_TORCH_SINGLE_GPU = 0.25 * GIB
_NON_TORCH_MULTI_GPU_BASE = 2.0 * GIB
_NON_TORCH_PER_RANK = 0.04 * GIB

# CUDA graphs: a fixed pool plus a per-layer cost for each captured batch size (fitted on vLLM's
# own estimates: 0.61-1.09 GiB for 24-42 layers, 1.05-1.24 GiB for 48-62, 1.6-1.8 GiB for 80; the
# fit leans high, which only costs KV cache).
_CUDA_GRAPH_BASE = 0.45 * GIB
_CUDA_GRAPH_PER_LAYER_PER_SIZE = 0.31 * MIB  # 51 sizes at the usual largest size of 512


@dataclass(frozen=True)
class MemoryEstimate:
    """Per GPU, for the busiest GPU, in bytes (``*_gib`` properties for display)."""

    total_bytes: float
    budget_bytes: float
    weights_bytes: float
    activation_peak_bytes: float
    non_torch_bytes: float
    cuda_graph_bytes: float
    kv_cache_bytes: float  # negative when the budget is overdrawn
    kv_bytes_per_token: int
    kv_cache_tokens: int
    max_concurrency: float
    max_model_len_capacity: int
    max_model_len: int
    problems: tuple[str, ...] = field(default=())
    #: ``--enable-lora``: the adapter slots (with the punica metadata) and the profile run's extra peak
    lora_slots_bytes: float = 0.0
    lora_profile_bytes: float = 0.0
    #: what the KV calibration added to (negative: took from) the KV room, already in ``kv_cache_bytes``
    kv_calibration_bytes: float = 0.0

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def uncalibrated_kv_bytes(self) -> float:
        """The KV room the arithmetic alone gives, before any calibration moved it."""
        return self.kv_cache_bytes - self.kv_calibration_bytes

    def gib(self, value: float) -> float:
        return round(value / GIB, 2)

    def as_dict(self) -> dict[str, float | int | bool | list[str]]:
        """The ``estimate`` JSON contract (keys are stable; external benchmarks read them; the LoRA keys only
        with LoRA)."""
        lora: dict[str, float | int | bool | list[str]] = {
            "lora_slots_gib": self.gib(self.lora_slots_bytes), "lora_profile_gib": self.gib(self.lora_profile_bytes),
        } if self.lora_slots_bytes else {}
        return {**lora,
            "gpu_total_gib": self.gib(self.total_bytes),
            "budget_gib": self.gib(self.budget_bytes),
            "weights_gib": self.gib(self.weights_bytes),
            "activation_peak_gib": self.gib(self.activation_peak_bytes),
            "non_torch_gib": self.gib(self.non_torch_bytes),
            "cuda_graph_gib": self.gib(self.cuda_graph_bytes),
            "kv_cache_gib": self.gib(self.kv_cache_bytes),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_cache_tokens": self.kv_cache_tokens,
            "max_concurrency": round(self.max_concurrency, 2),
            "max_model_len": self.max_model_len,
            "max_model_len_capacity": self.max_model_len_capacity,
            "fits": self.fits,
            "problems": list(self.problems),
        }


@dataclass(frozen=True)
class StageMemory:
    """One pipeline stage's GPU (each GPU of a stage holds the same), in bytes."""

    stage: int
    layers: int
    weights_bytes: float
    cuda_graph_bytes: float
    kv_cache_bytes: float
    kv_bytes_per_token: int
    kv_cache_tokens: int
    #: what a KV calibration added to ``kv_cache_bytes`` (planner/calibration.py; the plan's as a whole does)
    kv_calibration_bytes: float = 0.0


def gpu_weight_bytes(c: ServingConfig) -> float:
    """Weights on the busiest GPU, less what ``--cpu-offload-gb`` keeps in host memory."""
    if c.pipeline_parallel_size > 1:
        weights = max(stage_weight_bytes(c.model, c.weight_format, c.tensor_parallel_size, c.pipeline_parallel_size,
                                         dtype_bytes=c.dtype_bytes))
    else:
        weights = weight_bytes_per_gpu(c.model, c.weight_format, c.tensor_parallel_size, dtype_bytes=c.dtype_bytes)
    return max(0.0, weights - c.cpu_offload_gib * GIB)


def stage_breakdown(c: ServingConfig) -> tuple[StageMemory, ...]:
    """The memory of every pipeline stage's GPUs. vLLM gives every stage as many KV blocks as the one with the
    fewest (``get_kv_cache_configs``), so the plan's KV cache is the smallest stage's. A KV calibration moves
    each stage's room as it moves the plan's (capped the same way)."""
    m, tp, pp = c.model, c.tensor_parallel_size, c.pipeline_parallel_size
    total = float(c.gpu.total_bytes)
    budget = total * c.gpu_memory_utilization
    fixed = activation_peak_bytes(c) + non_torch_bytes(c)
    per_layer = kv_bytes_per_token(m, tp, pp, c.kv_cache_dtype, c.dtype_bytes) / max(1, stage_layers(m.num_layers, pp))
    block = c.block_size
    stages = []
    offload = c.cpu_offload_gib * GIB
    first = 0
    for i, (layers, weights) in enumerate(zip(stage_partition(m.num_layers, pp),
                                              stage_weight_bytes(m, c.weight_format, tp, pp,
                                                                 dtype_bytes=c.dtype_bytes), strict=True)):
        graphs = _graph_bytes(c, layers)
        on_gpu = max(0.0, weights - offload)
        lora = lora_slots_bytes(c, layers, first) + lora_profile_bytes(c)
        first += layers
        available = budget - on_gpu - fixed - lora - (graphs if c.vllm.cuda_graphs_in_budget else 0.0)
        calibration = c.kv_calibration.delta_bytes(available, total) if c.kv_calibration is not None else 0.0
        available += calibration
        token_bytes = round(per_layer * layers)
        tokens = int(max(available, 0) // (token_bytes * block)) * block if token_bytes else 0
        stages.append(StageMemory(i, layers, on_gpu, graphs, available, token_bytes, tokens, calibration))
    return tuple(stages)


def lora_slots_bytes(c: ServingConfig, layers: int | None = None, first_layer: int = 0) -> float:
    """The adapter slots and punica metadata on one GPU of a stage (default: the busiest stage), planner/lora.py."""
    if c.lora is None:
        return 0.0
    m = c.model
    if layers is None:
        layers = stage_layers(m.num_layers, c.pipeline_parallel_size)
    slots = lora_memory.slot_bytes(m, c.tensor_parallel_size, layers, first_layer, c.lora, dtype_bytes=c.dtype_bytes)
    return float(slots + lora_memory.punica_metadata_bytes(c.max_num_batched_tokens, c.max_num_seqs,
                                                           c.lora.max_loras))


def lora_profile_bytes(c: ServingConfig) -> float:
    """What the profile run with dummy adapters adds to the activation peak (planner/lora.py)."""
    return float(lora_memory.profile_bytes(c.model, c.max_num_batched_tokens, c.lora)) if c.lora else 0.0


def activation_peak_bytes(c: ServingConfig) -> float:
    """Peak of the profile run: the larger of the forward pass and the sampler warm-up.

    Fused MoE kernels keep an intermediate cache of ``tokens x top_k x (2 x intermediate / tp + hidden)``
    that is still held when the sampler runs. The forward pass's tensors are in the serving dtype (twice the bytes
    under ``--dtype float32``: 2.25 GiB against vLLM 0.19.0's 2.21 for Llama-3.1-8B); the sampler's logits are
    float32 either way.
    """
    m, tp = c.model, c.tensor_parallel_size
    kv_heads_per_rank = max(1, m.num_kv_heads // tp)
    qkv = (m.num_attention_heads // tp + 2 * kv_heads_per_rank) * m.head_dim
    per_token: float = _HIDDEN_COPIES * m.hidden_size + qkv
    moe_workspace = 0.0
    if m.moe is None:
        per_token += _MLP_COPIES * m.intermediate_size / tp
    else:
        e = m.moe
        moe_workspace = (c.max_num_batched_tokens * e.experts_per_token
                         * (2 * e.expert_intermediate_size / tp + m.hidden_size) * c.dtype_bytes)
    forward = c.max_num_batched_tokens * per_token * c.dtype_bytes
    per_logit = _SORTING_SAMPLER_BYTES_PER_LOGIT if c.vllm.sampler_sorts_logits else _SAMPLER_BYTES_PER_LOGIT
    sampler = c.max_num_seqs * m.vocab_size * per_logit
    return max(forward, sampler) + moe_workspace


def non_torch_bytes(c: ServingConfig) -> float:
    if c.tensor_parallel_size == 1:  # pipeline stages only exchange activations point to point
        return _NON_TORCH_SINGLE_GPU
    return _NON_TORCH_MULTI_GPU_BASE + _NON_TORCH_PER_RANK * c.tensor_parallel_size


def cuda_graph_bytes(c: ServingConfig) -> float:
    return _graph_bytes(c, stage_layers(c.model.num_layers, c.pipeline_parallel_size))


def _graph_bytes(c: ServingConfig, layers: int) -> float:
    if c.enforce_eager:
        return 0.0
    sizes = c.vllm.cuda_graph_capture_sizes(c.max_num_seqs, c.max_num_batched_tokens, c.max_cudagraph_capture_size)
    if c.lora is not None:  # captured for no adapter and for max_loras + 1 (planner/lora.py)
        sizes *= 2
    return _CUDA_GRAPH_BASE + layers * sizes * _CUDA_GRAPH_PER_LAYER_PER_SIZE


def structural_problems(c: ServingConfig) -> list[str]:
    """Configurations vLLM refuses before it looks at memory."""
    m, tp, pp = c.model, c.tensor_parallel_size, c.pipeline_parallel_size
    problems = []
    if tp < 1 or pp < 1:
        problems.append("tensor and pipeline parallel sizes must be at least 1")
        return problems
    if m.num_attention_heads % tp:
        problems.append(f"{m.num_attention_heads} attention heads are not divisible by tensor parallel size {tp}")
    if m.mla is None and m.num_kv_heads < tp and tp % m.num_kv_heads:
        problems.append(f"tensor parallel size {tp} is not a multiple of the {m.num_kv_heads} KV heads")
    if m.mla is None and m.num_kv_heads >= tp and m.num_kv_heads % tp:
        problems.append(f"{m.num_kv_heads} KV heads are not divisible by tensor parallel size {tp}")
    if c.dtype != "auto":
        refused = dtype_problem(c.dtype, m.model_type, c.gpu, mla=m.mla is not None)
        if refused:
            problems.append(refused)
        elif c.serving_dtype == "float32" and c.weight_format is not WeightFormat.NONE:
            problems.append(f"--dtype float32 is planned for unquantized weights only, not {c.weight_format} "
                            "(vLLM 0.33.0's fp8, mxfp4 and modelopt methods refuse float32 activations; the "
                            "others are not measured)")
    elif c.serving_dtype == "float32" and m.torch_dtype != "float32":
        problems.append(f"vLLM runs {m.model_type} in float32 on {c.gpu.display_name} (no bfloat16 there, and it "
                        "refuses float16 for this model: numerical instability), twice the memory of the 16-bit "
                        "weights and KV cache planned for; use a GPU of compute capability 8.0 or newer, or set "
                        "dtype float32 to plan it at 4 bytes")
    if pp > m.num_layers:
        problems.append(f"pipeline parallel size {pp} exceeds the {m.num_layers} layers")
    if c.nodes < 1 or c.pipeline_parallel_size % c.nodes:
        problems.append(f"{c.nodes} nodes cannot hold {pp} pipeline stages (one or more whole stages per node)")
    if c.cpu_offload_gib < 0:
        problems.append("cpu_offload_gb must not be negative")
    if not 0 < c.gpu_memory_utilization <= 1:
        problems.append(f"gpu_memory_utilization must be in (0, 1], got {c.gpu_memory_utilization}")
    if c.max_model_len < 1:
        problems.append("max_model_len must be at least 1")
    if c.lora is not None:
        unsupported = lora_memory.supported(m)
        if unsupported:
            problems.append(unsupported)
        if c.lora.max_loras < 1 or c.lora.max_lora_rank not in lora_memory.VLLM_LORA_RANKS:
            problems.append(f"max_loras must be at least 1 and max_lora_rank one of "
                            f"{', '.join(map(str, lora_memory.VLLM_LORA_RANKS))}")
    if c.max_num_seqs < 1 or c.max_num_batched_tokens < 1:
        problems.append("max_num_seqs and max_num_batched_tokens must be at least 1")
    elif c.max_num_batched_tokens < c.max_num_seqs:
        problems.append(f"max_num_batched_tokens ({c.max_num_batched_tokens}) must be at least "
                        f"max_num_seqs ({c.max_num_seqs})")
    return problems


def estimate(c: ServingConfig) -> MemoryEstimate:
    """Evaluate one configuration the way vLLM sizes its KV cache at startup."""
    m, tp, pp = c.model, c.tensor_parallel_size, c.pipeline_parallel_size
    problems = structural_problems(c)
    if problems:
        return MemoryEstimate(c.gpu.total_bytes, 0, 0, 0, 0, 0, 0, 0, 0, 0.0, 0, c.max_model_len,
                              tuple(problems))
    total = float(c.gpu.total_bytes)
    budget = total * c.gpu_memory_utilization
    weights = gpu_weight_bytes(c)
    activation = activation_peak_bytes(c)
    non_torch = non_torch_bytes(c)
    graphs = cuda_graph_bytes(c)
    graphs_in_budget = graphs if c.vllm.cuda_graphs_in_budget else 0.0
    lora_slots, lora_profile = lora_slots_bytes(c), lora_profile_bytes(c)
    available = budget - weights - activation - non_torch - graphs_in_budget - lora_slots - lora_profile
    # a calibration from earlier deployments moves the KV room (capped) before any fit check: a plan it pushes
    # past the budget gets the same problems as an uncalibrated one (planner/calibration.py)
    calibration = c.kv_calibration.delta_bytes(available, total) if c.kv_calibration is not None else 0.0
    available += calibration

    per_token = kv_bytes_per_token(m, tp, pp, c.kv_cache_dtype, c.dtype_bytes)
    window_tokens = c.max_num_batched_tokens * c.vllm.in_flight_batches(pipeline_parallel_size=pp)
    per_request = kv_bytes_per_request(m, tp, pp, c.kv_cache_dtype, max_model_len=c.max_model_len,
                                       max_num_batched_tokens=window_tokens, block_size=c.block_size,
                                       model_dtype_bytes=c.dtype_bytes)
    concurrency = max(available, 0) / per_request if per_request else 0.0
    room = kv_capacity(m, tp, pp, c.kv_cache_dtype, available_bytes=available, max_model_len=c.max_model_len,
                       max_num_batched_tokens=window_tokens, block_size=c.block_size, limit=m.max_position_embeddings,
                       reserve_null_block=c.vllm.reserves_null_block, group_aware_size=c.vllm.group_aware_kv_size,
                       model_dtype_bytes=c.dtype_bytes)
    tokens, capacity = room.tokens, room.largest_len

    if weights <= budget and available <= 0 and lora_slots:
        problems.append(f"no memory left for the KV cache: the budget of {budget / GIB:.1f} GiB is overdrawn by "
                        f"{-available / GIB:.1f} GiB, {(lora_slots + lora_profile) / GIB:.2f} GiB of it for "
                        f"{c.lora.max_loras if c.lora else 0} LoRA slots at rank "
                        f"{c.lora.max_lora_rank if c.lora else 0}")
    elif weights > budget:
        problems.append(f"weights need {weights / GIB:.1f} GiB per GPU but the budget is "
                        f"{budget / GIB:.1f} GiB ({c.gpu_memory_utilization:g} x {total / GIB:.1f} GiB)")
    elif available <= 0:
        problems.append(f"no memory left for the KV cache: the budget of {budget / GIB:.1f} GiB is overdrawn "
                        f"by {-available / GIB:.1f} GiB")
    elif capacity < c.max_model_len:
        problems.append(f"max_model_len {c.max_model_len} needs {per_request / GIB:.2f} GiB of KV cache but "
                        f"{available / GIB:.2f} GiB is available; the largest that fits is {capacity}")
    elif tokens < (1 if m.num_sliding_window_layers else c.max_model_len):
        # A sequence pins max_model_len tokens in every full-attention layer (sliding-window layers need fewer,
        # which the per-request check above already counts): a cache that holds fewer serves nothing.
        problems.append(f"the KV cache holds {tokens} tokens, less than one sequence of max_model_len "
                        f"{c.max_model_len}")
    if c.max_model_len > m.max_position_embeddings:
        problems.append(f"max_model_len {c.max_model_len} exceeds the model's maximum "
                        f"{m.max_position_embeddings}")
    if not c.vllm.cuda_graphs_in_budget and graphs > total - budget:
        problems.append(f"CUDA graphs need about {graphs / GIB:.2f} GiB outside the budget, but only "
                        f"{(total - budget) / GIB:.2f} GiB is left; lower gpu_memory_utilization or enforce eager")
    return MemoryEstimate(
        total_bytes=total,
        budget_bytes=budget,
        weights_bytes=weights,
        activation_peak_bytes=activation,
        non_torch_bytes=non_torch,
        cuda_graph_bytes=graphs,
        kv_cache_bytes=available,
        kv_bytes_per_token=per_token,
        kv_cache_tokens=tokens,
        max_concurrency=concurrency,
        max_model_len_capacity=capacity,
        max_model_len=c.max_model_len,
        problems=tuple(problems),
        lora_slots_bytes=lora_slots,
        lora_profile_bytes=lora_profile,
        kv_calibration_bytes=calibration,
    )
