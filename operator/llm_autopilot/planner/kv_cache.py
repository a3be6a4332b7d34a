"""KV-cache bytes per token and per request, per GPU, following vLLM's KV-cache specs.

- Full attention (MHA/GQA): ``2 x head_dim x bytes x max(1, kv_heads // tp)`` per layer and token;
  with fewer KV heads than ranks each rank keeps a replica of one head.
- MLA: one latent of ``kv_lora_rank + qk_rope_head_dim`` per layer and token, on every rank.
- Sliding-window layers keep at most ``cdiv(min(window - 1 + in_flight_tokens, len), block) + 1``
  blocks per request (``SlidingWindowSpec.max_admission_blocks_per_request``, ``v1/kv_cache_interface.py``),
  also when the window is longer than the request: one block more than full attention. The callers pass
  ``max_num_batched_tokens x`` :meth:`VLLMBehaviour.in_flight_batches` as ``max_num_batched_tokens``.
Only the busiest pipeline stage matters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llm_autopilot.domain.architecture import ModelArchitecture
from llm_autopilot.domain.precision import KVCacheDtype
from llm_autopilot.planner.weights import ACTIVATION_DTYPE_BYTES, stage_layers


def kv_element_bytes(dtype: KVCacheDtype, model_dtype_bytes: int = ACTIVATION_DTYPE_BYTES) -> int:
    """``auto`` follows the model's serving dtype (``get_kv_cache_torch_dtype``: float32 under ``--dtype float32``)."""
    return 1 if dtype is KVCacheDtype.FP8 else model_dtype_bytes


def kv_bytes_per_token_per_layer(m: ModelArchitecture, tp: int, dtype: KVCacheDtype,
                                 model_dtype_bytes: int = ACTIVATION_DTYPE_BYTES) -> int:
    element = kv_element_bytes(dtype, model_dtype_bytes)
    if m.mla is not None:
        return (m.mla.kv_lora_rank + m.mla.qk_rope_head_dim) * element
    return 2 * m.head_dim * element * max(1, m.num_kv_heads // tp)


def kv_cache_group_size(full: int, sliding: int) -> int:
    """Layers per KV-cache group of a model with ``full`` full-attention and ``sliding`` sliding-window layers.

    vLLM's ``_get_kv_cache_groups_uniform_page_size`` (``v1/core/kv_cache_utils.py`` in 0.32.0,
    ``v1/core/kv_cache_planning.py`` in 0.33.0, the same rule in both): the smaller count, unless the larger is
    less than 1.5 times it; then the larger, and the smaller type is padded ("Add N padding layers").
    One attention type: one group of all layers.
    """
    if full == 0 or sliding == 0:
        return full or sliding
    smaller, larger = min(full, sliding), max(full, sliding)
    return larger if larger < smaller * 1.5 else smaller


def stage_layer_split(m: ModelArchitecture, pp: int, layers: int | None = None) -> tuple[int, int]:
    """(full-attention, sliding-window) layer slots on the busiest pipeline stage (``layers``: on a stage of that
    many layers instead).

    vLLM's hybrid KV-cache manager puts layers into groups of equal size (:func:`kv_cache_group_size`)
    and gives every group its own blocks, so a partly filled last group costs a full one:
    Gemma 3's 10 full + 52 sliding layers occupy 10 + 60 slots, a 9-layer Gemma 2's 4 full + 5 sliding 5 + 5.
    """
    if pp == 1:
        full, sliding = m.num_full_attention_layers, m.num_sliding_window_layers
    else:
        layers = stage_layers(m.num_layers, pp) if layers is None else layers
        sliding = math.ceil(m.num_sliding_window_layers * layers / m.num_layers)
        full = layers - sliding
    if full == 0 or sliding == 0:
        return full, sliding
    group = kv_cache_group_size(full, sliding)
    return math.ceil(full / group) * group, math.ceil(sliding / group) * group


def kv_block_bytes(m: ModelArchitecture, tp: int, pp: int, dtype: KVCacheDtype, block_size: int, *,
                   layers: int | None = None, model_dtype_bytes: int = ACTIVATION_DTYPE_BYTES) -> int:
    """Bytes of one block of vLLM's pool (``num_gpu_blocks`` counts these): a page of ``block_size`` tokens for
    every layer of one KV-cache group (of the busiest stage; ``layers``: of a stage with that many layers)."""
    full, sliding = stage_layer_split(m, pp, layers)
    per_layer = kv_bytes_per_token_per_layer(m, tp, dtype, model_dtype_bytes)
    return kv_cache_group_size(full, sliding) * per_layer * block_size


def kv_bytes_per_token(m: ModelArchitecture, tp: int, pp: int, dtype: KVCacheDtype,
                       model_dtype_bytes: int = ACTIVATION_DTYPE_BYTES) -> int:
    """Bytes one token costs on the busiest GPU if every layer keeps it (the figure vLLM divides by)."""
    full, sliding = stage_layer_split(m, pp)
    return kv_bytes_per_token_per_layer(m, tp, dtype, model_dtype_bytes) * (full + sliding)


def kv_bytes_per_request(
    m: ModelArchitecture,
    tp: int,
    pp: int,
    dtype: KVCacheDtype,
    *,
    max_model_len: int,
    max_num_batched_tokens: int,
    block_size: int,
    model_dtype_bytes: int = ACTIVATION_DTYPE_BYTES,
) -> int:
    """KV bytes one request of ``max_model_len`` tokens pins on the busiest GPU."""
    full, sliding = stage_layer_split(m, pp)
    block_bytes = kv_bytes_per_token_per_layer(m, tp, dtype, model_dtype_bytes) * block_size
    full_blocks = math.ceil(max_model_len / block_size)
    total = full * full_blocks * block_bytes
    if sliding and m.sliding_window:
        window_tokens = min(m.sliding_window - 1 + max_num_batched_tokens, max_model_len)
        total += sliding * (math.ceil(window_tokens / block_size) + 1) * block_bytes
    return total


def largest_len_that_fits(
    m: ModelArchitecture,
    tp: int,
    pp: int,
    dtype: KVCacheDtype,
    *,
    available_bytes: float,
    max_num_batched_tokens: int,
    block_size: int,
    limit: int,
    model_dtype_bytes: int = ACTIVATION_DTYPE_BYTES,
) -> int:
    """The largest max_model_len (≤ limit) whose single request fits in ``available_bytes`` (0 if none)."""

    def fits(length: int) -> bool:
        return kv_bytes_per_request(m, tp, pp, dtype, max_model_len=length,
                                    max_num_batched_tokens=max_num_batched_tokens,
                                    block_size=block_size, model_dtype_bytes=model_dtype_bytes) <= available_bytes

    if available_bytes <= 0 or not fits(1):
        return 0
    low, high = 1, limit
    if fits(high):
        return high
    while high - low > 1:  # invariant: fits(low) and not fits(high)
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


@dataclass(frozen=True)
class KVCapacity:
    """What a KV room holds: the cache's size in tokens (vLLM's "KV cache size: N tokens") and the longest
    request it admits (its "estimated maximum model length is N")."""

    tokens: int
    largest_len: int


def kv_capacity(
    m: ModelArchitecture,
    tp: int,
    pp: int,
    dtype: KVCacheDtype,
    *,
    available_bytes: float,
    max_model_len: int,
    max_num_batched_tokens: int,
    block_size: int,
    limit: int,
    reserve_null_block: bool,
    group_aware_size: bool,
    layers: int | None = None,
    model_dtype_bytes: int = ACTIVATION_DTYPE_BYTES,
) -> KVCapacity:
    """vLLM's arithmetic for one KV room (``v1/core/kv_cache_utils.py``).

    The pool is made of blocks that each hold one page for every layer of a KV-cache group (layers are
    grouped in equal sizes); a request takes ``cdiv(len, block)`` blocks in each full-attention group and a
    window's worth plus one in each sliding-window group. The printed size is, from 0.24, the group-aware
    ``int(pool blocks / blocks per request x max_model_len)``; before, ``pool blocks // groups x block``.
    The largest admitted length leaves out the null block when the version reserves it. ``layers``: the room
    of a pipeline stage with that many layers (the size only; the longest request is the busiest stage's).
    """
    full, sliding = stage_layer_split(m, pp, layers)
    per_layer_block = kv_bytes_per_token_per_layer(m, tp, dtype, model_dtype_bytes) * block_size
    group = kv_cache_group_size(full, sliding)
    if per_layer_block <= 0 or group == 0 or available_bytes <= 0:
        return KVCapacity(0, 0)
    page = group * per_layer_block
    pool_blocks = int(available_bytes // page)
    full_groups, sliding_groups = full // group, sliding // group
    if group_aware_size:
        per_request = full_groups * math.ceil(max_model_len / block_size)
        if sliding_groups and m.sliding_window:
            window = min(m.sliding_window - 1 + max_num_batched_tokens, max_model_len)
            per_request += sliding_groups * (math.ceil(window / block_size) + 1)
        tokens = int(pool_blocks / per_request * max_model_len) if per_request else 0
    else:
        tokens = pool_blocks // (full_groups + sliding_groups) * block_size
    admissible = available_bytes - page if reserve_null_block else available_bytes
    largest = largest_len_that_fits(m, tp, pp, dtype, available_bytes=admissible,
                                    max_num_batched_tokens=max_num_batched_tokens, block_size=block_size,
                                    limit=limit, model_dtype_bytes=model_dtype_bytes)
    return KVCapacity(tokens, largest)
