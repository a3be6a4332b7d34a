"""Parameter counts per component, and the weight bytes held by the busiest GPU.

vLLM splits attention, MLP/expert and vocabulary matrices across tensor-parallel ranks; it
replicates KV projections when there are fewer KV heads than ranks, and replicates MLA's
down-projections and MoE routers. Pipeline stages hold whole layers; the first holds the
embedding and the last the LM head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llm_autopilot.domain.architecture import ModelArchitecture
from llm_autopilot.domain.precision import WeightFormat, weight_bytes_per_parameter

#: vLLM keeps model weights and activations in 16-bit floats unless ``--dtype float32`` says otherwise (fp32
#: configs are served as bf16/fp16); the functions below take the serving dtype's bytes as ``dtype_bytes``.
ACTIVATION_DTYPE_BYTES = 2
_VOCAB_PADDING = 64
#: vLLM's MXFP4 MoE kernels pad each expert's intermediate size to 256-aligned tiles (2880 -> 3072
#: for gpt-oss), so the experts take about 1/15 more memory than the checkpoint.
_MXFP4_EXPERT_PADDING = 3072 / 2880


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one decoder layer on one tensor-parallel rank."""

    attention: float
    dense_mlp: float
    experts: float  # routed + shared experts of a MoE layer
    replicated: float  # routers, norms, MLA down-projections: on every rank in full


def _attention_params(m: ModelArchitecture, tp: int) -> tuple[float, float]:
    """(split across ranks, replicated) attention parameters of one layer, per rank."""
    if m.mla is not None:
        a = m.mla
        q_head = a.qk_nope_head_dim + a.qk_rope_head_dim
        if a.q_lora_rank:
            q_split = a.q_lora_rank * m.num_attention_heads * q_head
            replicated = m.hidden_size * a.q_lora_rank
        else:
            q_split = m.hidden_size * m.num_attention_heads * q_head
            replicated = 0
        replicated += m.hidden_size * (a.kv_lora_rank + a.qk_rope_head_dim)
        kv_b = a.kv_lora_rank * m.num_attention_heads * (a.qk_nope_head_dim + a.v_head_dim)
        o = m.num_attention_heads * a.v_head_dim * m.hidden_size
        return (q_split + kv_b + o) / tp, replicated
    q_and_o = 2 * m.hidden_size * m.num_attention_heads * m.head_dim / tp
    kv_heads_per_rank = max(1, m.num_kv_heads // tp)
    kv = 2 * m.hidden_size * m.head_dim * kv_heads_per_rank
    return q_and_o + kv, 0.0


def layer_params(m: ModelArchitecture, tp: int, *, moe_layer: bool) -> LayerParams:
    split_attention, replicated = _attention_params(m, tp)
    replicated += 2 * m.hidden_size  # the two RMSNorms
    if moe_layer and m.moe is not None:
        e = m.moe
        experts = 3 * m.hidden_size * (e.num_experts * e.expert_intermediate_size
                                       + e.shared_expert_intermediate_size) / tp
        return LayerParams(split_attention, 0.0, experts, replicated + m.hidden_size * e.num_experts)
    return LayerParams(split_attention, 3 * m.hidden_size * m.intermediate_size / tp, 0.0, replicated)


def padded_vocab(m: ModelArchitecture) -> int:
    return math.ceil(m.vocab_size / _VOCAB_PADDING) * _VOCAB_PADDING


def stage_layers(num_layers: int, pp: int) -> int:
    """Layers on the busiest pipeline stage (vLLM gives the remainder to the earlier stages)."""
    return math.ceil(num_layers / pp)


def stage_partition(num_layers: int, pp: int) -> tuple[int, ...]:
    """Layers of each pipeline stage, as vLLM splits them (``distributed/utils.py::get_pp_indices``): evenly,
    the remainder one each to the stages before the last, from the second-to-last backwards."""
    partitions = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        partitions[-i] += 1
    return tuple(partitions)


def _bytes_per_param(m: ModelArchitecture, fmt: WeightFormat, dtype_bytes: int) -> float:
    if fmt is WeightFormat.NONE:
        return dtype_bytes
    q = m.quantization
    if q is not None and q.weight_format is fmt:
        return weight_bytes_per_parameter(fmt, bits=q.bits, group_size=q.group_size)
    return weight_bytes_per_parameter(fmt)


@dataclass(frozen=True)
class _ParamBytes:
    """Bytes per parameter of each class of weight."""

    attention: float
    mlp: float
    unquantized: float


def _param_bytes(m: ModelArchitecture, fmt: WeightFormat, dtype_bytes: int = ACTIVATION_DTYPE_BYTES) -> _ParamBytes:
    """Quantized layers in their format; embeddings, the LM head (a compressed-tensors checkpoint's ``ignore``
    list), norms and routers in the serving dtype."""
    quantized = _bytes_per_param(m, fmt, dtype_bytes)
    experts_only = fmt is WeightFormat.MXFP4 or bool(
        m.quantization and m.quantization.experts_only and m.quantization.weight_format is fmt
    )
    attention = dtype_bytes if experts_only else quantized
    return _ParamBytes(attention, quantized, dtype_bytes)


def _padded_for_kernels(b: _ParamBytes, fmt: WeightFormat) -> _ParamBytes:
    if fmt is WeightFormat.MXFP4:
        return _ParamBytes(b.attention, b.mlp * _MXFP4_EXPERT_PADDING, b.unquantized)
    return b


_ONE_BYTE = _ParamBytes(1.0, 1.0, 1.0)


def _layer_stack(m: ModelArchitecture, tp: int, num_layers: int, b: _ParamBytes, start: int = 0) -> float:
    """Bytes (or, with one byte each, parameters) of ``num_layers`` decoder layers from layer ``start``, on one
    rank (the leading dense layers of a MoE model fall into the first stage)."""
    dense_layers = m.moe.first_dense_layers if m.moe else 0
    first_dense = max(0, min(dense_layers, start + num_layers) - start)
    total = 0.0
    for count, is_moe in ((first_dense, False), (num_layers - first_dense, m.moe is not None)):
        if count > 0:
            p = layer_params(m, tp, moe_layer=is_moe)
            total += count * (p.attention * b.attention + (p.dense_mlp + p.experts) * b.mlp
                              + p.replicated * b.unquantized)
    return total


def _vocab_matrices(m: ModelArchitecture, *, pp: int) -> int:
    """How many vocab x hidden matrices the busiest stage holds (embedding, LM head)."""
    if pp > 1:
        return 1  # the first stage holds the embedding, the last the LM head
    return 1 if m.tie_word_embeddings else 2


def weight_bytes_per_gpu(m: ModelArchitecture, fmt: WeightFormat, tp: int, pp: int = 1, *,
                         dtype_bytes: int = ACTIVATION_DTYPE_BYTES) -> float:
    """Bytes of weights on the busiest GPU when linear layers are stored as ``fmt`` (the rest in ``dtype_bytes``)."""
    b = _padded_for_kernels(_param_bytes(m, fmt, dtype_bytes), fmt)
    layers = _layer_stack(m, tp, stage_layers(m.num_layers, pp), b)
    vocab = _vocab_matrices(m, pp=pp) * padded_vocab(m) * m.hidden_size / tp * b.unquantized
    return (layers + vocab) * _checkpoint_calibration(m, fmt)


def stage_weight_bytes(m: ModelArchitecture, fmt: WeightFormat, tp: int, pp: int, *,
                       dtype_bytes: int = ACTIVATION_DTYPE_BYTES) -> tuple[float, ...]:
    """Bytes of weights on one GPU of each pipeline stage: its layers, the embedding on the first stage and the
    LM head on the last (one matrix on each when tied and split)."""
    b = _padded_for_kernels(_param_bytes(m, fmt, dtype_bytes), fmt)
    calibration = _checkpoint_calibration(m, fmt)
    vocab_matrix = padded_vocab(m) * m.hidden_size / tp * b.unquantized
    result, start = [], 0
    for i, layers in enumerate(stage_partition(m.num_layers, pp)):
        matrices = _vocab_matrices(m, pp=1) if pp == 1 else int(i == 0) + int(i == pp - 1)
        result.append((_layer_stack(m, tp, layers, b, start) + matrices * vocab_matrix) * calibration)
        start += layers
    return tuple(result)


def counted_checkpoint_bytes(m: ModelArchitecture) -> float:
    """The whole checkpoint's counted size in its own format (no split, no calibration)."""
    b = _param_bytes(m, m.weight_format)
    return _layer_stack(m, 1, m.num_layers, b) + _vocab_matrices(m, pp=1) * m.vocab_size * m.hidden_size * 2


def _checkpoint_calibration(m: ModelArchitecture, fmt: WeightFormat) -> float:
    """Scale by the published checkpoint size when we serve it as published and the count agrees.

    The count misses biases and small buffers; a published size corrects that. A disagreement of
    more than 15 % means the checkpoint holds something vLLM does not load (e.g. multi-token
    prediction heads), so the count is kept.
    """
    if not m.checkpoint_bytes or fmt is not m.weight_format:
        return 1.0
    ratio = m.checkpoint_bytes / counted_checkpoint_bytes(m)
    return ratio if 0.85 <= ratio <= 1.15 else 1.0


def total_parameters(m: ModelArchitecture) -> float:
    """Parameter count of the whole model (for display: "8.0 B")."""
    return _layer_stack(m, 1, m.num_layers, _ONE_BYTE) + _vocab_matrices(m, pp=1) * m.vocab_size * m.hidden_size
