"""vLLM versions and the version-dependent behaviour the planner and renderer rely on."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering

from llm_autopilot.domain.gpu import GPUSpec
from llm_autopilot.domain.precision import GIB

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


class VersionError(ValueError):
    pass


@total_ordering
@dataclass(frozen=True)
class VLLMVersion:
    major: int
    minor: int
    patch: int = 0

    @classmethod
    def parse(cls, text: str) -> VLLMVersion:
        match = _VERSION.match(text.strip())
        if not match:
            raise VersionError(f"cannot read vLLM version {text!r}; expected e.g. 0.33.0")
        return cls(int(match[1]), int(match[2]), int(match[3] or 0))

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, VLLMVersion):
            return NotImplemented
        return (self.major, self.minor, self.patch) < (other.major, other.minor, other.patch)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


DEFAULT_VLLM_VERSION = VLLMVersion(0, 33, 0)
OLDEST_SUPPORTED = VLLMVersion(0, 10, 0)


@dataclass(frozen=True)
class BatchDefaults:
    max_num_batched_tokens: int
    max_num_seqs: int


@dataclass(frozen=True)
class VLLMBehaviour:
    """Facts about one vLLM release that change memory or the command line."""

    version: VLLMVersion
    default_gpu_memory_utilization: float
    #: CUDA-graph memory is estimated and subtracted from the KV budget (otherwise it lands outside it)
    cuda_graphs_in_budget: bool
    #: how ``--quantization`` spells FP8 computed on the fly from a bf16 checkpoint
    online_fp8_quantization: str
    has_swap_space: bool

    def batch_defaults(self, gpu: GPUSpec) -> BatchDefaults:
        """vLLM's defaults for the OpenAI server (``engine/arg_utils.py::get_batch_defaults``)."""
        memory_gib = gpu.total_bytes / GIB
        if memory_gib >= 160:
            return BatchDefaults(16384, 1024)
        if memory_gib >= 70 and not gpu.is_a100:
            return BatchDefaults(8192, 1024)
        return BatchDefaults(2048, 256)


def behaviour_of(version: VLLMVersion) -> VLLMBehaviour:
    if version < OLDEST_SUPPORTED:
        raise VersionError(f"vLLM {version} is older than the oldest supported release {OLDEST_SUPPORTED}")
    return VLLMBehaviour(
        version=version,
        default_gpu_memory_utilization=0.92 if version >= VLLMVersion(0, 33, 0) else 0.9,
        cuda_graphs_in_budget=version >= VLLMVersion(0, 21, 0),
        online_fp8_quantization="fp8_per_tensor" if version >= VLLMVersion(0, 33, 0) else "fp8",
        has_swap_space=version < VLLMVersion(0, 33, 0),
    )
