"""Classify what a vLLM container died of, from what the kubelet recorded (reason, exit code, message).

The message is the container's termination message; with ``FallbackToLogsOnError`` it is the log tail
(at most 80 lines / 2 KiB), so the root cause may be cut off and the wrapper lines are matched too.
Messages are vLLM's own (shared/notes/vllm-memory.md; vLLM 0.10-0.33 source).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum


class Signal(StrEnum):
    HOST_OOM = "OOMKilled"  # the cgroup killed the container: host memory
    KV_CAPACITY = "KVCapacity"  # max_model_len does not fit in the KV cache vLLM found
    NO_KV_MEMORY = "NoKVCacheMemory"  # nothing left for the KV cache at all
    CUDA_OOM_STARTUP = "CudaOOMAtStartup"  # while loading, profiling or capturing graphs
    CUDA_OOM_RUNTIME = "CudaOOMUnderLoad"
    ENGINE_DIED = "EngineDied"  # exit 0 without a message: vLLM issue #48966
    OTHER_CRASH = "Crashed"  # not a memory problem
    KV_SATURATION = "KVSaturation"

    @property
    def is_memory(self) -> bool:
        return self not in (Signal.ENGINE_DIED, Signal.OTHER_CRASH)


@dataclass(frozen=True)
class Classification:
    signal: Signal
    summary: str
    #: the largest max_model_len vLLM said would fit (KV_CAPACITY only)
    reported_max_len: int | None = None
    evidence: dict[str, str] = field(default_factory=dict)


_ESTIMATED_LEN = re.compile(r"estimated maximum model length is (\d+)")
_OLD_KV_CAPACITY = re.compile(
    r"max seq len \((\d+)\) is larger than the maximum number of tokens that can be stored in KV cache \((\d+)\)")
_KV_NEEDED = "KV cache is needed, which is larger than the available KV cache memory"
_NO_KV = "No available memory for the cache blocks"
_CUDA_OOM = ("CUDA out of memory", "torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError", "CUDA error: out of memory",
             "Failed to load model - not enough GPU memory", "CUDA out of memory occurred when warming up sampler")
#: the failure happened before serving: loading, profiling, sampler warm-up, graph capture
_STARTUP_MARKERS = ("Engine core initialization failed", "Failed to load model", "warming up sampler",
                    "determine_available_memory", "profile_run", "load_model", "capture_model",
                    "initialize_engine", "_initialize_kv_caches", "Loading model weights")
_ENGINE_DEAD = "EngineCore encountered a fatal error"


def classify_termination(reason: str | None, exit_code: int | None, message: str | None) -> Classification:
    text = message or ""
    evidence = {"reason": reason or "", "exitCode": "" if exit_code is None else str(exit_code),
                "message": text[-300:]}
    if reason == "OOMKilled":
        return Classification(Signal.HOST_OOM, "the container exceeded its memory limit (OOMKilled)",
                              evidence=evidence)
    if (match := _ESTIMATED_LEN.search(text)) and _KV_NEEDED in text:
        n = int(match[1])
        return Classification(Signal.KV_CAPACITY, f"max_model_len does not fit the KV cache; vLLM estimated {n}",
                              n, evidence)
    if match := _OLD_KV_CAPACITY.search(text):
        n = int(match[2])
        return Classification(Signal.KV_CAPACITY, f"max_model_len {match[1]} exceeds the KV cache's {n} tokens",
                              n, evidence)
    if _KV_NEEDED in text:
        return Classification(Signal.KV_CAPACITY, "max_model_len does not fit the KV cache", None, evidence)
    if _NO_KV in text:
        return Classification(Signal.NO_KV_MEMORY, "no memory was left for the KV cache", evidence=evidence)
    if any(marker in text for marker in _CUDA_OOM):
        if any(marker in text for marker in _STARTUP_MARKERS):
            return Classification(Signal.CUDA_OOM_STARTUP, "CUDA out of memory while starting (load/profile)",
                                  evidence=evidence)
        return Classification(Signal.CUDA_OOM_RUNTIME, "CUDA out of memory while serving", evidence=evidence)
    if exit_code == 0 and (not text.strip() or _ENGINE_DEAD in text):
        return Classification(Signal.ENGINE_DIED, "the engine exited with code 0 and no message (vLLM #48966); "
                              "check the previous container's logs", evidence=evidence)
    return Classification(Signal.OTHER_CRASH, f"exited with code {exit_code} ({reason or 'no reason'}); not a "
                          "memory failure", evidence=evidence)
