"""vLLM versions and the version-dependent behaviour the planner and renderer rely on."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering

from llm_autopilot.domain.gpu import GPUSpec
from llm_autopilot.domain.precision import GIB, KVCacheDtype

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

#: Model types vLLM refuses to run in float16 ("Numerical instability"; config/model.py
#: _FLOAT16_NOT_SUPPORTED_MODELS, 0.32.0): without bfloat16 they run in float32.
FLOAT16_REFUSED_MODEL_TYPES = frozenset({"gemma2", "gemma3", "gemma3_text", "glm4"})


#: ``--dtype``'s values (config/model.py ``ModelDType``, 0.33.0) and the dtype each names (``half`` and ``float``
#: are vLLM's other spellings).
DTYPE_NAMES = {"auto": "auto", "bfloat16": "bfloat16", "float16": "float16", "half": "float16",
               "float32": "float32", "float": "float32"}


def serving_dtype(torch_dtype: str, model_type: str, gpu: GPUSpec, requested: str = "auto") -> str:
    """The dtype vLLM runs a checkpoint in on ``gpu``. ``requested`` is ``--dtype``: anything but ``auto`` is taken
    as given (config/model.py ``_get_and_verify_dtype``; :func:`dtype_problem` says what vLLM refuses). ``auto``
    (``_resolve_auto_dtype``): a bfloat16 checkpoint falls back to float16 on a GPU without bfloat16 (compute
    capability below 8.0), or to float32 for a model float16 is refused for; a float32 checkpoint is served in the
    preferred of those (bfloat16 where the GPU has it)."""
    named = DTYPE_NAMES.get(requested, requested)
    if named != "auto":
        return named
    preferred = ("bfloat16" if gpu.supports_bfloat16()
                 else "float32" if model_type in FLOAT16_REFUSED_MODEL_TYPES else "float16")
    if torch_dtype == "float32":  # "Downcast for float32 models"
        return preferred
    if torch_dtype != "bfloat16" or gpu.supports_bfloat16():
        return torch_dtype
    return preferred


def dtype_problem(requested: str, model_type: str, gpu: GPUSpec, *, mla: bool) -> str | None:
    """Why vLLM refuses ``--dtype requested`` for this model on ``gpu`` (read in 0.33.0), or None.

    - float16 for a model in ``_FLOAT16_NOT_SUPPORTED_MODELS``: ``_check_valid_dtype`` raises;
    - bfloat16 below compute capability 8.0: ``CudaPlatform.check_if_supports_dtype`` raises;
    - float32 with MLA: no CUDA MLA attention backend lists float32 in ``supported_dtypes``
      (v1/attention/backends/mla/); for other attention only TRITON_ATTN and FLEX_ATTENTION do (FLASH_ATTN and
      FLASHINFER do not), and vLLM picks TRITON_ATTN (vLLM 0.19.0's log of Llama-3.1-8B at ``--dtype float32``).
    """
    named = DTYPE_NAMES.get(requested, requested)
    if named == "float16" and model_type in FLOAT16_REFUSED_MODEL_TYPES:
        return f"vLLM refuses --dtype float16 for {model_type} (numerical instability); use bfloat16 or float32"
    if named == "bfloat16" and not gpu.supports_bfloat16():
        return (f"vLLM refuses --dtype bfloat16 on {gpu.display_name}: bfloat16 needs compute capability 8.0 or "
                "newer; use float16")
    if named == "float32" and mla:
        return "vLLM has no float32 attention backend for MLA models on CUDA; use bfloat16 or float16"
    return None
OLDEST_SUPPORTED = VLLMVersion(0, 10, 2)

#: The first release whose GPU engine turns async scheduling on when ``--async-scheduling`` is not given
#: (``VllmConfig.__post_init__``: ``scheduler_config.async_scheduling is None`` becomes True unless a pooling
#: model, an executor without support, ROCm DeepEP high-throughput DBO, an unsupported speculative method or
#: pipeline parallelism on the V1 model runner rules it out; config/vllm.py). Read in the 0.32.0 and 0.33.0
#: wheels, both on; releases before 0.32 were not read for it and keep one batch in flight, as the planner
#: assumed before.
ASYNC_SCHEDULING_DEFAULT_SINCE = VLLMVersion(0, 32, 0)


#: Releases whose source was read for runtime LoRA updating, all with the same contract: with
#: ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` set to ``1``/``true`` (envs.py; off by default) the API server attaches
#: ``POST /v1/load_lora_adapter`` (``{"lora_name", "lora_path", "load_inplace"}``: 400 when the name is already
#: served and ``load_inplace`` is false, 404 when the path is not found) and ``POST /v1/unload_lora_adapter``
#: (``{"lora_name"}``: 404 when not served) (entrypoints/serve/lora/api_router.py,
#: entrypoints/openai/models/serving.py); ``/v1/models`` lists each served adapter with ``root`` = its path and
#: ``parent`` = the base model; ``vllm serve`` refuses the variable with ``--api-server-count`` above 1
#: (entrypoints/cli/serve.py). Read in the 0.32.0 and 0.33.0 wheels; releases before 0.32 were not read for it,
#: so the operator rolls their pods out on an adapter change.
RUNTIME_LORA_UPDATING_READ = (VLLMVersion(0, 32, 0), VLLMVersion(0, 33, 0))
RUNTIME_LORA_UPDATING_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"

@dataclass(frozen=True)
class BatchDefaults:
    max_num_batched_tokens: int
    max_num_seqs: int


@dataclass(frozen=True)
class VLLMBehaviour:
    """Facts about one vLLM release that change memory or the command line.

    Read from each release's source (wheels on PyPI); the version where each changed is noted.
    """

    version: VLLMVersion

    @property
    def default_gpu_memory_utilization(self) -> float:
        """``CacheConfig.gpu_memory_utilization``: 0.9 until 0.19, 0.92 from 0.20.0."""
        return 0.92 if self.version >= VLLMVersion(0, 20, 0) else 0.9

    @property
    def cuda_graphs_in_budget(self) -> bool:
        """CUDA-graph memory is estimated and subtracted from the KV budget by default from 0.20.0
        (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``); before, graphs used the (1 - utilization) headroom."""
        return self.version >= VLLMVersion(0, 20, 0)

    @property
    def sampler_sorts_logits(self) -> bool:
        """The profile run's sampler warm-up (``top_k = vocab - 1``, ``top_p = 0.9`` over ``max_num_seqs`` rows,
        ``_dummy_sampler_run`` in v1/worker/gpu_model_runner.py) sorts the whole float32 logits tensor, which peaks
        at about 2.5 times the memory of the sort-free kernels, before 0.17.0: ``apply_top_k_top_p`` calls
        ``logits.sort`` (v1/sample/ops/topk_topp_sampler.py, 0.10.2 to 0.16.0); from 0.17.0 it takes the Triton
        kernel ``apply_top_k_top_p_triton`` for 8 rows or more. FlashInfer's sort-free sampler is opt-in
        (``VLLM_USE_FLASHINFER_SAMPLER=1``) from 0.12.0; in 0.10 and 0.11 it is taken whenever ``flashinfer``
        imports, which the pip wheel does not install (an optional extra), so those are planned with the sort,
        which never gives vLLM less room than planned."""
        return self.version < VLLMVersion(0, 17, 0)

    @property
    def online_fp8_quantization(self) -> str:
        """``--quantization`` for FP8 computed while loading a bf16 checkpoint: ``fp8_per_tensor`` exists
        from 0.20.0 and plain ``fp8`` refuses unquantized checkpoints from 0.31.0."""
        return "fp8_per_tensor" if self.version >= VLLMVersion(0, 20, 0) else "fp8"

    @property
    def async_scheduling_by_default(self) -> bool:
        """Whether ``--async-scheduling`` left unset turns on on a GPU (see :data:`ASYNC_SCHEDULING_DEFAULT_SINCE`)."""
        return self.version >= ASYNC_SCHEDULING_DEFAULT_SINCE

    def in_flight_batches(self, *, pipeline_parallel_size: int = 1, on_cpu: bool = False) -> int:
        """Batches scheduled but not yet settled, which a sliding-window layer keeps blocks for
        (``VllmConfig.max_concurrent_batches`` x ``max_num_batched_tokens`` = ``max_in_flight_tokens``,
        config/vllm.py in 0.32.0 and 0.33.0).

        With async scheduling on, the model runner V2 (the default on a GPU with Triton:
        ``VllmConfig.use_v2_model_runner``) keeps ``pp + 1``, two without pipeline parallelism; without it,
        ``pp``. The CPU build turns async scheduling off (``CpuPlatform.check_and_update_config``,
        platforms/cpu.py), so the CPU goldens keep one batch.
        """
        if on_cpu or not self.async_scheduling_by_default:
            return pipeline_parallel_size
        return pipeline_parallel_size + 1

    @property
    def runtime_lora_updating(self) -> bool:
        """Whether adapters can be loaded and unloaded on a running server (:data:`RUNTIME_LORA_UPDATING_READ`):
        the releases read, and a later one (the contract was the same in both read)."""
        return self.version >= min(RUNTIME_LORA_UPDATING_READ)

    @property
    def reserves_null_block(self) -> bool:
        """The block pool keeps one block back (the null block); from 0.29.0 the start-up capacity check and
        its "estimated maximum model length" count only the usable blocks (vLLM #47272), so the largest
        length that fits is one block shorter than the cache (8,064 of 8,192 tokens at block size 128)."""
        return self.version >= VLLMVersion(0, 29, 0)

    @property
    def group_aware_kv_size(self) -> bool:
        """"KV cache size: N tokens" is, from 0.24.0, ``int(max_concurrency x max_model_len)`` with the
        concurrency counted per KV-cache group (``get_kv_cache_capacity``); before, blocks // groups x block.
        The two differ for sliding-window models and lengths that are not a multiple of the block size."""
        return self.version >= VLLMVersion(0, 24, 0)

    def batch_defaults(self, gpu: GPUSpec) -> BatchDefaults:
        """``vllm serve`` defaults (``engine/arg_utils.py::get_batch_defaults``); the >= 160 GiB tier
        exists from 0.28.0."""
        memory_gib = gpu.total_bytes / GIB
        if memory_gib >= 160 and self.version >= VLLMVersion(0, 28, 0):
            return BatchDefaults(16384, 1024)
        if memory_gib >= 70 and not gpu.is_a100:
            return BatchDefaults(8192, 1024)
        return BatchDefaults(2048, 256)

    def max_cuda_graph_capture_size(self, max_num_seqs: int, max_num_batched_tokens: int,
                                    pinned: int | None = None) -> int:
        """The largest batch (in tokens) captured in a CUDA graph: ``pinned`` when the command line sets it
        (``--max-cudagraph-capture-size``, from 0.11; ``--cuda-graph-sizes`` with one value before), else twice
        ``max_num_seqs`` up to 512; never above ``max_num_batched_tokens`` (``VllmConfig._set_cudagraph_sizes``,
        config/vllm.py, 0.33.0; the 0.10 ``SchedulerConfig.cuda_graph_sizes`` docstring)."""
        return min(pinned if pinned is not None else min(2 * max_num_seqs, 512), max_num_batched_tokens)

    def cuda_graph_capture_sizes(self, max_num_seqs: int, max_num_batched_tokens: int,
                                 pinned: int | None = None) -> int:
        """How many batch sizes are captured: 1, 2, 4, then every 8 (every 16 from 256, since 0.11)."""
        largest = self.max_cuda_graph_capture_size(max_num_seqs, max_num_batched_tokens, pinned)
        small = [s for s in (1, 2, 4) if s <= largest]
        if self.version < VLLMVersion(0, 11, 0):
            return len(small) + largest // 8
        return len(small) + len(range(8, min(largest + 1, 256), 8)) + len(range(256, largest + 1, 16))

    def supports_kv_cache_dtype(self, gpu: GPUSpec, dtype: KVCacheDtype) -> bool:
        """fp8 KV: from 0.11 the backend selector falls through to FlashInfer or Triton, so any GPU
        from Turing on takes it; 0.10 always picked FlashAttention, which takes fp8 only on Hopper+."""
        if dtype is KVCacheDtype.AUTO:
            return True
        if self.version < VLLMVersion(0, 11, 0):
            return gpu.compute_capability.at_least(9, 0)
        return gpu.compute_capability.at_least(7, 5)


def behaviour_of(version: VLLMVersion) -> VLLMBehaviour:
    if version < OLDEST_SUPPORTED:
        raise VersionError(f"vLLM {version} is older than the oldest supported release {OLDEST_SUPPORTED}")
    return VLLMBehaviour(version)
