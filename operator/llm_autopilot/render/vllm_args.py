"""Render the exact ``vllm serve`` argument list for a plan and the target vLLM version."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from llm_autopilot.api.serve_flags import normalised_flag
from llm_autopilot.domain.precision import KVCacheDtype
from llm_autopilot.planner.plan import Plan
from llm_autopilot.vllm.flags import known_flags

VLLM_PORT = 8000

#: Flags the operator derives from the plan; setting them in extraArgs fights the planner. (--port and
#: the other flags that break the pod are refused outright: api/serve_flags.py.)
OPERATOR_OWNED_FLAGS = frozenset({
    "--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp", "--max-model-len",
    "--gpu-memory-utilization", "--max-num-seqs", "--max-num-batched-tokens", "--kv-cache-dtype",
    "--quantization", "-q", "--enforce-eager", "--served-model-name", "--revision", "--model",
    "--kv-cache-memory-bytes", "--num-gpu-blocks-override", "--cpu-offload-gb", "--block-size",
})


@dataclass(frozen=True)
class ServeOptions:
    """What the plan does not decide: names, revision, extra flags from the spec."""

    served_model_name: str | None = None
    revision: str | None = None
    extra_args: tuple[str, ...] = ()
    port: int = VLLM_PORT


def render_vllm_args(plan: Plan, options: ServeOptions = ServeOptions()) -> list[str]:
    """Arguments after ``vllm serve``: the model first, then one flag per planned setting."""
    c = plan.config
    args = [plan.served_model_id]
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
    if c.online_fp8:
        args += ["--quantization", c.vllm.online_fp8_quantization]
    if c.kv_cache_dtype is KVCacheDtype.FP8:
        args += ["--kv-cache-dtype", "fp8"]
    if c.enforce_eager:
        args.append("--enforce-eager")
    args += ["--port", str(options.port)]
    args += list(options.extra_args)
    return args


def command_line(plan: Plan, options: ServeOptions = ServeOptions()) -> str:
    return shlex.join(["vllm", "serve", *render_vllm_args(plan, options)])


def flags_in(args: Sequence[str]) -> list[str]:
    """The option names in an argument list, as vLLM reads them (``--max_model_len=1`` is ``--max-model-len``)."""
    return [flag for a in args if (flag := normalised_flag(a)) is not None]


def unknown_flags(args: Sequence[str], version: str) -> list[str]:
    """Flags that the given vLLM version's ``vllm serve`` does not accept."""
    known = known_flags(version)
    return [f for f in flags_in(args) if f not in known]


def conflicting_extra_args(extra_args: Sequence[str]) -> list[str]:
    """Flags in extraArgs that override what the planner decides."""
    return sorted({f for f in flags_in(extra_args) if f in OPERATOR_OWNED_FLAGS})
