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


def weight_bytes_per_parameter(fmt: WeightFormat, *, bits: int = 4, group_size: int = 128) -> float:
    """Average bytes per parameter of a quantized linear weight, including its scales.

    - FP8: one byte, scales are per tensor/channel/128x128 block (≤ 0.03 %, ignored).
    - INT8 (GPTQ/compressed 8-bit): one byte plus an fp16 scale per group.
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
    if fmt in (WeightFormat.AWQ, WeightFormat.GPTQ, WeightFormat.INT8):
        group = max(group_size, 1) if group_size > 0 else 4096  # -1 means per-channel
        return bits / 8 + (2 + bits / 8) / group
    raise ValueError(f"{fmt} is not a quantized format")
