"""The GPU catalog: memory and compute capability of the GPUs vLLM is commonly served on.

``memory_mib`` is the NVML total (GPU Feature Discovery's ``nvidia.com/gpu.memory`` label, nvidia-smi).
``torch_total_gib`` is the total PyTorch reports for the same card ("GPU 0 has a total capacity of
X GiB", vLLM's "Free memory on device (free/total GiB)"), the figure vLLM multiplies by
``gpu_memory_utilization``. Observed values (tests/data/gpu_reported_memory.json, with links) vary by
driver and ECC by up to 0.2 GiB; where several were seen, the lowest is used. No public log named the
total of an A10G, L40S or B200: those are the nearest observed card with the same memory (A10, L40) or NVML's
total less the 0.4-0.5 GiB the driver keeps on H100, and are marked ``inferred``. The H200's is measured
(150,109,880,320 bytes: driver 580.159, CUDA 13.0, ECC on), 0.1 GiB below the figure once inferred for it.
"""

from __future__ import annotations

from collections.abc import Iterable

from llm_autopilot.domain.gpu import ComputeCapability, GPUSpec
from llm_autopilot.domain.precision import GIB


def _gpu(
    name: str,
    display: str,
    memory_mib: int,
    torch_total_gib: float,
    cc: str,
    gfd: Iterable[str],
    *,
    is_a100: bool = False,
    inferred: bool = False,
    total_bytes: int | None = None,
) -> GPUSpec:
    return GPUSpec(
        name=name,
        display_name=display,
        memory_mib=memory_mib,
        total_bytes=total_bytes if total_bytes is not None else round(torch_total_gib * GIB),
        compute_capability=ComputeCapability.parse(cc),
        gfd_products=tuple(gfd),
        is_a100=is_a100,
        total_inferred=inferred,
    )


GPUS: tuple[GPUSpec, ...] = (
    _gpu("nvidia-t4", "T4", 15360, 14.56, "7.5", ["Tesla-T4", "NVIDIA-T4"]),
    _gpu("nvidia-a10g", "A10G", 23028, 22.18, "8.6", ["NVIDIA-A10G"], inferred=True),
    _gpu("nvidia-l4", "L4", 23034, 22.03, "8.9", ["NVIDIA-L4"]),
    _gpu("nvidia-l40s", "L40S", 46068, 44.40, "8.9", ["NVIDIA-L40S"], inferred=True),
    _gpu(
        "nvidia-a100-40gb", "A100-40GB", 40960, 39.50, "8.0",
        ["NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB", "A100-SXM4-40GB"], is_a100=True,
    ),
    _gpu(
        "nvidia-a100-80gb", "A100-80GB", 81920, 79.15, "8.0",
        ["NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe", "A100-SXM4-80GB"], is_a100=True,
    ),
    _gpu("nvidia-h100-80gb", "H100-80GB", 81559, 79.19, "9.0", ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe"]),
    _gpu("nvidia-h200-141gb", "H200-141GB", 143771, 139.80, "9.0", ["NVIDIA-H200", "NVIDIA-H200-141GB-HBM3e"],
         total_bytes=150_109_880_320),
    _gpu("nvidia-b200", "B200", 183359, 178.6, "10.0", ["NVIDIA-B200"], inferred=True),
    _gpu("nvidia-rtx-4090", "RTX 4090", 24564, 23.64, "8.9", ["NVIDIA-GeForce-RTX-4090"]),
    _gpu("nvidia-rtx-5090", "RTX 5090", 32607, 31.37, "12.0", ["NVIDIA-GeForce-RTX-5090"]),
)


def _key(text: str) -> str:
    key = text.strip().lower().replace("_", "-").replace(" ", "-")
    return key.removeprefix("nvidia-").removeprefix("tesla-").removeprefix("geforce-")


_BY_KEY: dict[str, GPUSpec] = {}
for _spec in GPUS:
    for _alias in (_spec.name, _spec.display_name, *_spec.gfd_products):
        _BY_KEY[_key(_alias)] = _spec
# Short names people type: "h100", "a100" (the 80 GB card), "4090".
_BY_KEY.update({
    "h100": _BY_KEY["h100-80gb"], "h200": _BY_KEY["h200-141gb"], "a100": _BY_KEY["a100-80gb"],
    "4090": _BY_KEY["rtx-4090"], "5090": _BY_KEY["rtx-5090"],
})


class UnknownGPUError(LookupError):
    pass


def find_gpu(name: str) -> GPUSpec:
    """Look a GPU up by catalog name, display name or GFD product label, forgivingly."""
    spec = _BY_KEY.get(_key(name))
    if spec is None:
        known = ", ".join(g.name for g in GPUS)
        raise UnknownGPUError(
            f"unknown GPU {name!r}; known: {known} (or give its memory in GiB and compute capability)"
        )
    return spec


# --- GPU Feature Discovery labels --------------------------------------------------------------------

GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"
GFD_COUNT = "nvidia.com/gpu.count"
GFD_CC_MAJOR = "nvidia.com/gpu.compute.major"
GFD_CC_MINOR = "nvidia.com/gpu.compute.minor"
#: What the driver keeps of NVML's total (H100: 81559 MiB NVML, 79.19 GiB torch).
_DRIVER_RESERVED_GIB = 0.45


def gpu_from_labels(labels: dict[str, str]) -> GPUSpec | None:
    """The GPU a node's GFD labels describe: the catalog entry, else one built from memory and capability."""
    product = labels.get(GFD_PRODUCT)
    if not product:
        return None
    try:
        return find_gpu(product)
    except UnknownGPUError:
        pass
    try:
        memory_mib = int(labels[GFD_MEMORY])
        capability = f"{int(labels.get(GFD_CC_MAJOR, '8'))}.{int(labels.get(GFD_CC_MINOR, '0'))}"
    except (KeyError, ValueError):
        return None
    spec = GPUSpec.custom(memory_mib / 1024 - _DRIVER_RESERVED_GIB, capability)
    return GPUSpec(name=product.lower(), display_name=product, memory_mib=memory_mib, total_bytes=spec.total_bytes,
                   compute_capability=spec.compute_capability, gfd_products=(product,))
