"""Numeric formats: how weights are stored and how the KV cache is stored."""

from __future__ import annotations

from enum import StrEnum

GIB = 1024**3


class WeightFormat(StrEnum):
    """How the linear-layer weights of a served checkpoint are stored on the GPU.

    ``NONE`` means "as published, unquantized" (bf16/fp16/fp32 from ``torch_dtype``).
    """

    NONE = "none"
    FP8 = "fp8"
    AWQ = "awq"
    GPTQ = "gptq"
    MXFP4 = "mxfp4"
    NVFP4 = "nvfp4"
    INT8 = "int8"

    @property
    def quality_rank(self) -> int:
        """Lower is better quality: unquantized > 8-bit > 4-bit."""
        return _QUALITY_RANK[self]

    @property
    def is_four_bit(self) -> bool:
        return self in (WeightFormat.AWQ, WeightFormat.GPTQ, WeightFormat.MXFP4, WeightFormat.NVFP4)


_QUALITY_RANK = {
    WeightFormat.NONE: 0,
    WeightFormat.FP8: 1,
    WeightFormat.INT8: 1,
    WeightFormat.MXFP4: 2,
    WeightFormat.NVFP4: 2,
    WeightFormat.AWQ: 2,
    WeightFormat.GPTQ: 2,
}


class KVCacheDtype(StrEnum):
    """The KV-cache storage type (vLLM ``--kv-cache-dtype``). ``auto`` follows the model dtype."""

    AUTO = "auto"
    FP8 = "fp8"

    @property
    def quality_rank(self) -> int:
        return 0 if self is KVCacheDtype.AUTO else 1


TORCH_DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
}


def dtype_bytes(torch_dtype: str) -> int:
    """Bytes per element of a Hugging Face ``torch_dtype`` string (unknown → 2, the common case)."""
    return TORCH_DTYPE_BYTES.get(torch_dtype.lower(), 2)


#: the input width a per-output-channel scale is spread over (a 7-8B model's hidden size; wider models pay less)
_TYPICAL_INPUT_WIDTH = 4096


def weight_bytes_per_parameter(fmt: WeightFormat, *, bits: int = 4, group_size: int = 128) -> float:
    """Average bytes per parameter of a quantized linear weight, including its scales.

    - FP8: one byte, scales are per tensor/channel/128x128 block (≤ 0.03 %, ignored).
    - INT8 per output channel (compressed-tensors W8A8, ``CompressedTensorsW8A8Int8``, read in vLLM 0.33.0): an
      int8 weight and one float32 scale per output channel (about 4 bytes per 4,096 inputs); dynamic per-token
      activation scales hold no memory, a static one is one float32 per layer.
    - INT8 in groups (GPTQ 8-bit): one byte plus an fp16 scale and an 8-bit zero point per group.
    - AWQ/GPTQ 4-bit: half a byte, plus an fp16 scale and a packed 4-bit zero point per group.
    - MXFP4: half a byte plus one e8m0 scale byte per 32 elements.
    - NVFP4: half a byte plus one fp8 scale per 16 elements (and a negligible global scale).
    """
    if fmt is WeightFormat.FP8:
        return 1.0
    if fmt is WeightFormat.MXFP4:
        return 0.5 + 1 / 32
    if fmt is WeightFormat.NVFP4:
        return 0.5 + 1 / 16
    if fmt is WeightFormat.INT8:
        return 1 + (4 / _TYPICAL_INPUT_WIDTH if group_size <= 0 else 3 / group_size)
    if fmt in (WeightFormat.AWQ, WeightFormat.GPTQ):
        group = max(group_size, 1) if group_size > 0 else 4096  # -1 means per-channel
        return bits / 8 + (2 + bits / 8) / group
    raise ValueError(f"{fmt} is not a quantized format")
