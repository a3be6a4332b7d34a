"""Render the exact ``vllm serve`` argument list for a plan and the target vLLM version."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from llm_autopilot.api.serve_flags import OWNED_FLAGS, extra_args_problems, owned_options
from llm_autopilot.domain.precision import KVCacheDtype
from llm_autopilot.planner.plan import Plan
from llm_autopilot.vllm.flags import flag_name, is_option, known_flags, normalise_flag
from llm_autopilot.vllm.versions import VLLMVersion

#: OWNED_FLAGS is the one table (api/serve_flags.py); re-exported for the callers of this module
__all__ = ["OWNED_FLAGS", "SHUTDOWN_TIMEOUT_FLAG", "ExtraArgRefused", "ServeOptions", "command_line",
           "conflicting_extra_args", "cuda_graph_capture_args", "flags_in", "has_shutdown_timeout", "lora_args",
           "render_vllm_args", "shutdown_args", "unknown_flags", "without_shutdown_timeout"]

VLLM_PORT = 8000


class ExtraArgRefused(ValueError):
    """An extra argument that would run something other than the plan (api/serve_flags.py's rules)."""


@dataclass(frozen=True)
class ServeOptions:
    """What the plan does not decide: names, revision, extra flags from the spec.

    Extra flags are checked again here, whoever built the options: no owned flag, ``$(`` or secret flag reaches
    the rendered command line, even from a spec that never passed admission."""

    served_model_name: str | None = None
    revision: str | None = None
    extra_args: tuple[str, ...] = ()
    port: int = VLLM_PORT
    #: a local folder to load instead of the plan's Hub id (a pvc:// source or the model cache)
    model_path: str | None = None
    #: ``--lora-modules`` as (name, path in the pod) pairs (render/lora_volumes.py); empty: none (the operator
    #: loads them at runtime, desired/lora_sync.py); None: the plan's own (name, Hub id) pairs
    lora_modules: tuple[tuple[str, str], ...] | None = None
    #: the spec's fields passed as given (``VLLMSettings.passed_args``), after the planned flags
    spec_args: tuple[str, ...] = ()
    #: spec.vllm.drainSeconds: ``--shutdown-timeout`` where the release has it (:func:`shutdown_args`)
    drain_seconds: int = 0

    def __post_init__(self) -> None:
        problems = [f"extraArgs[{i}]: {p}" for i, p in extra_args_problems(self.extra_args)]
        if problems:
            raise ExtraArgRefused("; ".join(problems))


def render_vllm_args(plan: Plan, options: ServeOptions = ServeOptions()) -> list[str]:
    """Arguments after ``vllm serve``: the model first, then one flag per planned setting."""
    c = plan.config
    args = [options.model_path or plan.served_model_id]
    if options.served_model_name:
        args += ["--served-model-name", options.served_model_name]
    if options.revision:
        args += ["--revision", options.revision]
    args += ["--tensor-parallel-size", str(c.tensor_parallel_size)]
    if c.pipeline_parallel_size > 1:
        args += ["--pipeline-parallel-size", str(c.pipeline_parallel_size)]
    args += [
        "--max-model-len", str(c.max_model_len),
        "--gpu-memory-utilization", f"{c.gpu_memory_utilization:g}",
        "--max-num-seqs", str(c.max_num_seqs),
        "--max-num-batched-tokens", str(c.max_num_batched_tokens),
    ]
    if c.dtype != "auto":
        args += ["--dtype", c.dtype]
    if c.online_fp8:
        args += ["--quantization", c.vllm.online_fp8_quantization]
    if c.kv_cache_dtype is KVCacheDtype.FP8:
        args += ["--kv-cache-dtype", "fp8"]
    if c.enforce_eager:
        args.append("--enforce-eager")
    elif c.max_cudagraph_capture_size is not None:
        args += cuda_graph_capture_args(c.max_cudagraph_capture_size, c.vllm.version)
    if c.cpu_offload_gib:
        args += ["--cpu-offload-gb", f"{c.cpu_offload_gib:g}"]
    args += lora_args(plan, modules=options.lora_modules)
    args += list(options.spec_args)
    args += shutdown_args(options.drain_seconds, c.vllm.version)
    args += ["--port", str(options.port)]
    args += list(options.extra_args)
    return args


#: vLLM's drain on SIGTERM (vllm/engine/arg_utils.py; in the flag table from 0.18.0 on)
SHUTDOWN_TIMEOUT_FLAG = "--shutdown-timeout"


def has_shutdown_timeout(version: str | VLLMVersion) -> bool:
    return SHUTDOWN_TIMEOUT_FLAG in known_flags(version)


def shutdown_args(drain_seconds: int, version: str | VLLMVersion) -> list[str]:
    """``--shutdown-timeout N``: on SIGTERM vLLM refuses new requests and finishes those in flight for up to N
    seconds (docs/users/rollouts.md). None for 0 (vLLM's own default: abort them) or a release without the flag
    (older than 0.18: it aborts them, whatever it is told)."""
    if drain_seconds <= 0 or not has_shutdown_timeout(version):
        return []
    return [SHUTDOWN_TIMEOUT_FLAG, str(drain_seconds)]


def without_shutdown_timeout(args: Sequence[str]) -> list[str]:
    """The arguments less ``--shutdown-timeout`` and its value: how long a stopping pod drains says nothing about
    what the plan serves (the plan hash). The flag is owned, so the renderer's is the only one."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == SHUTDOWN_TIMEOUT_FLAG:
            skip = True
        else:
            kept.append(arg)
    return kept


def lora_args(plan: Plan, *, modules: tuple[tuple[str, str], ...] | None = None) -> list[str]:
    """``--enable-lora`` and its sizes, and ``--lora-modules name=path ...`` (one flag, nargs='+'; ``modules``:
    the adapters and their paths in the pod, else the plan's; left out when empty: the adapters are loaded at
    runtime); only the flags the target version knows (all of them since 0.10.2, the oldest release in the flag
    table)."""
    lora = plan.config.lora
    if lora is None:
        return []
    known = known_flags(plan.config.vllm.version)
    wanted: list[tuple[str, list[str]]] = [
        ("--enable-lora", []),
        ("--max-loras", [str(lora.max_loras)]),
        ("--max-lora-rank", [str(lora.max_lora_rank)]),
    ]
    if lora.max_cpu_loras is not None:
        wanted.append(("--max-cpu-loras", [str(lora.max_cpu_loras)]))
    served = lora.modules if modules is None else modules
    if served:
        wanted.append(("--lora-modules", [f"{name}={path}" for name, path in served]))
    missing = [flag for flag, _ in wanted if flag not in known]
    if missing:
        raise ValueError(f"vLLM {plan.config.vllm.version} has no {', '.join(missing)}: it cannot serve LoRA adapters "
                         "as planned; choose a newer vllm.version")
    return [part for flag, values in wanted for part in (flag, *values)]


#: the flag that caps the CUDA-graph capture sizes, newest first: ``--max-cudagraph-capture-size`` from 0.11;
#: before, ``--cuda-graph-sizes`` with one value N captures 1, 2, 4 and every 8 up to N
_CUDA_GRAPH_CAPTURE_FLAGS = ("--max-cudagraph-capture-size", "--cuda-graph-sizes")


def cuda_graph_capture_args(largest: int, version: VLLMVersion) -> list[str]:
    """The largest batch captured in a CUDA graph, in the flag the release knows (the flag table decides)."""
    known = known_flags(version)
    flag = next((f for f in _CUDA_GRAPH_CAPTURE_FLAGS if f in known), None)
    if flag is None:
        raise ValueError(f"vLLM {version} has none of {', '.join(_CUDA_GRAPH_CAPTURE_FLAGS)}: it cannot cap the "
                         "CUDA-graph capture sizes as planned; choose a newer vllm.version")
    return [flag, str(largest)]


def command_line(plan: Plan, options: ServeOptions = ServeOptions()) -> str:
    return shlex.join(["vllm", "serve", *render_vllm_args(plan, options)])


def _options(args: Sequence[str]) -> list[str]:
    return [a for a in args if is_option(a)]


def flags_in(args: Sequence[str]) -> list[str]:
    """The option names in an argument list as written (``--x=1`` counts as ``--x``)."""
    return [flag_name(a) for a in _options(args)]


def unknown_flags(args: Sequence[str], version: str) -> list[str]:
    """Flags that the given vLLM version's ``vllm serve`` does not accept."""
    known = known_flags(version)
    return [flag_name(a) for a in _options(args) if normalise_flag(a) not in known]


def conflicting_extra_args(extra_args: Sequence[str]) -> list[str]:
    """Flags in extraArgs that override what the planner decides, as written (any spelling vLLM accepts:
    ``--max_model_len``, ``--compilation-config.mode=3``, ``-O3``)."""
    return sorted({flag_name(a) for a in _options(extra_args) if owned_options(a)})
