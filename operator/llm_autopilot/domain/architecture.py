"""A model's architecture: the ``config.json`` facts that decide its GPU memory."""

from __future__ import annotations

from dataclasses import dataclass, field

from llm_autopilot.domain.precision import WeightFormat


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

    @property
    def num_full_attention_layers(self) -> int:
        return self.num_layers - self.num_sliding_window_layers

    @property
    def weight_format(self) -> WeightFormat:
        return self.quantization.weight_format if self.quantization else WeightFormat.NONE
