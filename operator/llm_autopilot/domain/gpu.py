"""A GPU product's memory and capabilities."""

from __future__ import annotations

from dataclasses import dataclass

from llm_autopilot.domain.precision import GIB, WeightFormat


@dataclass(frozen=True)
class ComputeCapability:
    major: int
    minor: int

    @classmethod
    def parse(cls, text: str) -> ComputeCapability:
        major, _, minor = text.strip().partition(".")
        return cls(int(major), int(minor or 0))

    def at_least(self, major: int, minor: int = 0) -> bool:
        return (self.major, self.minor) >= (major, minor)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model.

    ``memory_mib`` is what NVML (and so GPU Feature Discovery's ``nvidia.com/gpu.memory`` label)
    reports. ``total_bytes`` is what ``torch.cuda.mem_get_info`` reports, the base vLLM multiplies
    by ``gpu_memory_utilization``; it is slightly smaller because the driver reserves some memory.
    """

    name: str
    display_name: str
    memory_mib: int
    total_bytes: int
    compute_capability: ComputeCapability
    #: GPU Feature Discovery ``nvidia.com/gpu.product`` values that identify this GPU
    gfd_products: tuple[str, ...] = ()
    is_a100: bool = False
    #: ``total_bytes`` was inferred (no log of this card named it): the nearest observed card, or NVML's total less
    #: what the driver keeps on a sibling; `llm-autopilot catalog gpus` marks it
    total_inferred: bool = False

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB

    def supports_weight_format(self, fmt: WeightFormat) -> bool:
        """Whether vLLM has a kernel for this weight format on this GPU (``get_min_capability``)."""
        cc = self.compute_capability
        if fmt is WeightFormat.NONE:
            return True
        if fmt is WeightFormat.FP8:
            # W8A8 needs 8.9; below that vLLM runs FP8 weight-only through Marlin (needs 8.0).
            return cc.at_least(8, 0)
        if fmt in (WeightFormat.AWQ, WeightFormat.GPTQ):
            return cc.at_least(7, 5)
        if fmt is WeightFormat.MXFP4:
            return cc.at_least(8, 0)
        if fmt is WeightFormat.NVFP4:
            return cc.at_least(10, 0)
        return cc.at_least(7, 5)

    def supports_bfloat16(self) -> bool:
        return self.compute_capability.at_least(8, 0)

    @classmethod
    def custom(cls, memory_gib: float, compute_capability: str = "9.0") -> GPUSpec:
        """A GPU known only by its total memory as torch reports it (``--gpu-memory-gib``)."""
        total = round(memory_gib * GIB)
        return cls(
            name=f"custom-{memory_gib:g}gib",
            display_name=f"{memory_gib:g} GiB GPU",
            memory_mib=total // 2**20,
            total_bytes=total,
            compute_capability=ComputeCapability.parse(compute_capability),
        )
