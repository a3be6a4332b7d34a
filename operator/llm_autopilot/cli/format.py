"""Plain-text and structured renderings of plans and estimates for the CLI."""

from __future__ import annotations

import json
from typing import Any

import yaml

from llm_autopilot.planner.memory import MemoryEstimate
from llm_autopilot.planner.plan import Plan
from llm_autopilot.render.vllm_args import ServeOptions, command_line, render_vllm_args


def plan_dict(plan: Plan, options: ServeOptions) -> dict[str, Any]:
    c = plan.config
    return {
        "feasible": True,
        "model": c.model.model_id,
        "served_model": plan.served_model_id,
        "gpu": c.gpu.name,
        "gpus": c.num_gpus,
        "summary": plan.summary,
        "tensor_parallel_size": c.tensor_parallel_size,
        "pipeline_parallel_size": c.pipeline_parallel_size,
        "quantization": c.weights_label,
        "kv_cache_dtype": str(c.kv_cache_dtype),
        "max_model_len": c.max_model_len,
        "max_num_seqs": c.max_num_seqs,
        "max_num_batched_tokens": c.max_num_batched_tokens,
        "gpu_memory_utilization": c.gpu_memory_utilization,
        "enforce_eager": c.enforce_eager,
        "vllm_version": str(c.vllm.version),
        "memory": plan.estimate.as_dict(),
        "reasons": [str(r) for r in plan.reasons],
        "warnings": list(plan.warnings),
        "vllm_args": render_vllm_args(plan, options),
        "command": command_line(plan, options),
    }


def dump(data: dict[str, Any], output: str) -> str:
    if output == "json":
        return json.dumps(data, indent=2)
    return yaml.safe_dump(data, sort_keys=False, width=120).rstrip()


def memory_table(e: MemoryEstimate, gmu: float) -> list[str]:
    rows = [
        ("GPU total", f"{e.gib(e.total_bytes):8.2f} GiB"),
        (f"budget (x {gmu:g})", f"{e.gib(e.budget_bytes):8.2f} GiB"),
        ("  weights", f"{e.gib(e.weights_bytes):8.2f} GiB"),
        ("  activation peak", f"{e.gib(e.activation_peak_bytes):8.2f} GiB"),
        ("  non-torch (CUDA, NCCL)", f"{e.gib(e.non_torch_bytes):8.2f} GiB"),
        ("  CUDA graphs", f"{e.gib(e.cuda_graph_bytes):8.2f} GiB"),
        *([("  LoRA slots", f"{e.gib(e.lora_slots_bytes):8.2f} GiB"),
           ("  LoRA profile peak", f"{e.gib(e.lora_profile_bytes):8.2f} GiB")] if e.lora_slots_bytes else []),
        ("  KV cache", f"{e.gib(e.kv_cache_bytes):8.2f} GiB"),
        ("KV bytes per token", f"{e.kv_bytes_per_token:,}"),
        ("KV cache tokens", f"{e.kv_cache_tokens:,}"),
        (f"max concurrency @ {e.max_model_len}", f"{e.max_concurrency:.2f}x"),
        ("largest max_model_len", f"{e.max_model_len_capacity:,}"),
    ]
    return [f"  {name:<28}{value}" for name, value in rows]


def plan_table(plan: Plan, options: ServeOptions) -> str:
    c = plan.config
    lines = [
        f"Plan for {c.model.model_id} on {plan.summary} (vLLM {c.vllm.version})",
        f"  {'served checkpoint':<28}{plan.served_model_id}",
        f"  {'tensor parallel size':<28}{c.tensor_parallel_size}",
        f"  {'weights':<28}{c.weights_label}",
        f"  {'KV cache dtype':<28}{c.kv_cache_dtype}",
        f"  {'max_model_len':<28}{c.max_model_len}",
        f"  {'max_num_seqs':<28}{c.max_num_seqs}",
        f"  {'max_num_batched_tokens':<28}{c.max_num_batched_tokens}",
        f"  {'gpu_memory_utilization':<28}{c.gpu_memory_utilization:g}",
        "",
        "Memory per GPU (busiest GPU)",
        *memory_table(plan.estimate, c.gpu_memory_utilization),
        "",
        "Reasons",
        *[f"  - {r}" for r in plan.reasons],
    ]
    if plan.warnings:
        lines += ["", "Warnings", *[f"  ! {w}" for w in plan.warnings]]
    lines += ["", "Command", f"  {command_line(plan, options)}"]
    return "\n".join(lines)
