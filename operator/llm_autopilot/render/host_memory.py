"""Host memory a vLLM pod needs beyond its default: what vLLM keeps in RAM on purpose. Pure.

Each of these is added to the pod's memory request and limit, so a deliberate use of host memory never trips
the OOMKilled rung:

- ``--cpu-offload-gb`` (the planner's last resort): GiB of weights per GPU kept in pinned host memory;
- ``--kv-offloading-size`` (set in extraArgs): a host buffer extending the prefix cache, in GiB for the whole
  instance (summed over the TP ranks); it adds no room for more running sequences, so the planner ignores it;
- the multimodal processor cache (``--mm-processor-cache-gb``, 4 GiB by default for a multimodal model), held by
  every API server process and every engine core: ``size x (api_server_count + data_parallel_size)``
  (``vllm/config/multimodal.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llm_autopilot.domain.architecture import ModelArchitecture
from llm_autopilot.planner.plan import Plan
from llm_autopilot.vllm.flags import normalise_flag

#: vLLM 0.33's default --mm-processor-cache-gb
MM_PROCESSOR_CACHE_GIB = 4.0


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of the last ``flag`` in ``args`` (``--flag=v`` or ``--flag v``, any spelling vLLM accepts)."""
    found = None
    for i, arg in enumerate(args):
        if not arg.startswith("-") or normalise_flag(arg) != flag:
            continue
        if "=" in arg:
            found = arg.split("=", 1)[1]
        elif i + 1 < len(args):
            found = args[i + 1]
    return found


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and value >= 0 else None


def multimodal(model: ModelArchitecture) -> bool:
    """vLLM names its multimodal model classes ``...ForConditionalGeneration`` (Gemma 3, LLaVA, Qwen2-VL...)."""
    return model.architecture.endswith("ForConditionalGeneration")


@dataclass(frozen=True)
class HostMemory:
    """GiB of host memory per pod, by what holds it."""

    cpu_offload_gib: float = 0.0
    kv_offloading_gib: float = 0.0
    mm_cache_gib: float = 0.0

    @property
    def total_gib(self) -> float:
        return self.cpu_offload_gib + self.kv_offloading_gib + self.mm_cache_gib


def host_memory(plan: Plan, extra_args: Sequence[str]) -> HostMemory:
    c = plan.config
    offload = c.cpu_offload_gib * c.gpus_per_pod
    kv_offload = _number(flag_value(extra_args, "--kv-offloading-size")) or 0.0
    size = _number(flag_value(extra_args, "--mm-processor-cache-gb"))
    if size is None:
        size = MM_PROCESSOR_CACHE_GIB if multimodal(c.model) else 0.0
    api_servers = _number(flag_value(extra_args, "--api-server-count")) or 1.0
    data_parallel = _number(flag_value(extra_args, "--data-parallel-size")) or 1.0
    return HostMemory(offload, kv_offload, size * (api_servers + data_parallel))
