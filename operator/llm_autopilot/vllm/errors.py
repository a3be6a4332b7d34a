"""What vLLM writes to its log when it fails, by failure: the patterns remediation/classify.py matches. Pure.

Strings as vLLM writes them (read in the 0.33.0 wheel, and 0.10.2's for the V0 engine's sentence;
shared/notes/vllm-memory.md). A release that rewords one of them changes this file only.
"""

from __future__ import annotations

import re

#: ``v1/core/kv_cache_planning.py::_check_enough_kv_cache_memory`` (``kv_cache_utils.py`` before): max_model_len
#: does not fit the KV cache; the line goes on "Based on the available memory, the estimated maximum model length
#: is N." when some length would fit
KV_NEEDED = "KV cache is needed, which is larger than the available KV cache memory"
ESTIMATED_MAX_LEN = re.compile(r"estimated maximum model length is (\d+)")
#: the V0 engine's sentence (``worker/worker.py::raise_if_cache_size_invalid``, 0.10.2): group 2 is the tokens
#: that fit
OLD_KV_CAPACITY = "is larger than the maximum number of tokens that can be stored in KV cache"
OLD_KV_CAPACITY_TOKENS = re.compile(
    r"max seq len \((\d+)\) is larger than the maximum number of tokens that can be stored in KV cache \((\d+)\)")
#: the same check, when nothing at all is left for the cache
NO_CACHE_BLOCKS = "No available memory for the cache blocks"
#: the CPU build's form of it (``v1/worker/cpu_worker.py::determine_available_memory``, 0.32.0): the host memory
#: left is below the KV cache asked for ("Available memory on node 0 (x/y GiB) on kv cache allocation is less than
#: requested memory for kv (-0.07/1.17 GiB)"), with --kv-cache-memory-bytes or without it
CPU_NO_KV_MEMORY = "allocation is less than requested memory for kv"
#: CUDA OOMs: torch's messages, and vLLM's own while loading (``gpu_model_runner.py``) and warming up the sampler
CUDA_OOM = ("CUDA out of memory", "torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError", "CUDA error: out of memory",
            "Failed to load model - not enough GPU memory", "CUDA out of memory occurred when warming up sampler")
#: the failure happened before serving: loading, profiling, sampler warm-up, graph capture (vLLM's messages and the
#: functions a traceback names: ``v1/worker/gpu_worker.py``, ``gpu_model_runner.py``, ``v1/engine/core.py``)
STARTUP_MARKERS = ("Engine core initialization failed", "Failed to load model", "warming up sampler",
                   "determine_available_memory", "profile_run", "load_model", "capture_model",
                   "initialize_engine", "_initialize_kv_caches", "Loading model weights")
#: uvicorn's line once vLLM's API server serves: a later CUDA OOM happened under load, whatever start-up lines
#: (e.g. "Loading model weights took ...") a whole log holds above it
SERVING = "Application startup complete"
#: ``v1/engine/core.py``: the engine core died (with exit code 0 and no message: vLLM issue #48966)
ENGINE_DEAD = "EngineCore encountered a fatal error"
