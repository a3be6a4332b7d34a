"""A model's architecture: the ``config.json`` facts that decide its GPU memory."""

from __future__ import annotations

from dataclasses import dataclass, field

from llm_autopilot.domain.precision import TORCH_DTYPE_BYTES, WeightFormat


class InvalidArchitecture(ValueError):
    """The numbers cannot describe a model vLLM could build; the message names each broken rule."""

    def __init__(self, model_id: str, problems: list[str]) -> None:
        super().__init__(f"{model_id}: {'; '.join(problems)}")
        self.problems = problems


@dataclass(frozen=True)
class MoE:
    """Mixture-of-experts feed-forward layers."""

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    #: leading layers that keep a dense MLP (DeepSeek ``first_k_dense_replace``)
    first_dense_layers: int = 0


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention (DeepSeek V2/V3): the KV cache holds one compressed latent."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None


@dataclass(frozen=True)
class CheckpointQuantization:
    """How a published checkpoint is already quantized (its ``quantization_config``)."""

    method: str  # the config's quant_method, e.g. "awq", "fp8", "mxfp4", "compressed-tensors"
    weight_format: WeightFormat
    bits: int = 4
    group_size: int = 128
    #: only the MoE experts are quantized (gpt-oss MXFP4); attention stays in the model dtype
    experts_only: bool = False


@dataclass(frozen=True)
class ModelArchitecture:
    """Memory-relevant facts of one model; every count is for the whole model (before any split)."""

    model_id: str
    architecture: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    torch_dtype: str = "bfloat16"
    tie_word_embeddings: bool = False
    #: window of the sliding-window layers, None when every layer is full attention
    sliding_window: int | None = None
    #: how many of ``num_layers`` use the sliding window
    num_sliding_window_layers: int = 0
    moe: MoE | None = None
    mla: MLA | None = None
    quantization: CheckpointQuantization | None = None
    #: checkpoint size in bytes (safetensors ``metadata.total_size``), when published
    checkpoint_bytes: int | None = None
    #: pre-quantized variants of the same model: weight format → Hub id
    variants: dict[WeightFormat, str] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        problems = structural_problems(self)
        if problems:
            raise InvalidArchitecture(self.model_id, problems)

    @property
    def num_full_attention_layers(self) -> int:
        return self.num_layers - self.num_sliding_window_layers

    @property
    def weight_format(self) -> WeightFormat:
        return self.quantization.weight_format if self.quantization else WeightFormat.NONE


def _at_least_one(**values: int | None) -> list[str]:
    return [f"{name} must be at least 1, got {value}" for name, value in values.items()
            if value is not None and value < 1]


def structural_problems(m: ModelArchitecture) -> list[str]:
    """What makes these numbers impossible as a model (empty when they are consistent).

    Every count must be positive, attention heads must split evenly over the KV heads (GQA groups),
    and the weight dtype must be one whose size we know; otherwise head_dim or the KV cache would
    silently come out as zero.
    """
    problems = _at_least_one(
        hidden_size=m.hidden_size, num_hidden_layers=m.num_layers, num_attention_heads=m.num_attention_heads,
        num_key_value_heads=m.num_kv_heads, head_dim=m.head_dim, intermediate_size=m.intermediate_size,
        vocab_size=m.vocab_size, max_position_embeddings=m.max_position_embeddings, sliding_window=m.sliding_window)
    if m.num_kv_heads > m.num_attention_heads >= 1:
        problems.append(f"num_key_value_heads ({m.num_kv_heads}) exceeds num_attention_heads "
                        f"({m.num_attention_heads})")
    elif m.num_kv_heads >= 1 and m.num_attention_heads % m.num_kv_heads:
        problems.append(f"num_attention_heads ({m.num_attention_heads}) is not divisible by num_key_value_heads "
                        f"({m.num_kv_heads})")
    if not 0 <= m.num_sliding_window_layers <= max(m.num_layers, 0):
        problems.append(f"{m.num_sliding_window_layers} sliding-window layers in a model of {m.num_layers} layers")
    if m.torch_dtype.lower() not in TORCH_DTYPE_BYTES:
        problems.append(f"torch_dtype {m.torch_dtype!r} is not a weight dtype; known: {', '.join(TORCH_DTYPE_BYTES)}")
    if m.moe is not None:
        e = m.moe
        problems += _at_least_one(num_experts=e.num_experts, num_experts_per_tok=e.experts_per_token,
                                  moe_intermediate_size=e.expert_intermediate_size)
        if e.experts_per_token > e.num_experts >= 1:
            problems.append(f"num_experts_per_tok ({e.experts_per_token}) exceeds the {e.num_experts} experts")
        if e.num_shared_experts < 0 or e.shared_expert_intermediate_size < 0 or e.first_dense_layers < 0:
            problems.append("shared experts and dense layers cannot be negative")
    if m.mla is not None:
        problems += _at_least_one(kv_lora_rank=m.mla.kv_lora_rank, qk_rope_head_dim=m.mla.qk_rope_head_dim,
                                  qk_nope_head_dim=m.mla.qk_nope_head_dim, v_head_dim=m.mla.v_head_dim,
                                  q_lora_rank=m.mla.q_lora_rank)
    return problems
