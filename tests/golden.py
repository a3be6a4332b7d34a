"""Golden cases: figures vLLM printed in public logs (tests/data/golden_vllm_logs.json), and how to replay them.

Each in-scope case maps the logged model onto a catalog architecture and the weight format the
log shows; the configuration is taken from the log's own engine-config line.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from llm_autopilot.catalog.hf_config import parse_quantization_config
from llm_autopilot.catalog.models import find_catalog_model
from llm_autopilot.domain.gpu import GPUSpec
from llm_autopilot.domain.precision import KVCacheDtype, WeightFormat
from llm_autopilot.planner.config import ServingConfig
from llm_autopilot.planner.memory import MemoryEstimate, estimate
from llm_autopilot.vllm.versions import VLLMVersion, behaviour_of
from tests.conftest import DATA

#: logged model -> catalog architecture with the same shapes
ARCHITECTURE_OF = {
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "mistralai/Mixtral-8x7B-v0.1",
    "RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic": "meta-llama/Llama-3.3-70B-Instruct",
    "RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16": "meta-llama/Llama-3.1-8B-Instruct",
    "RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a8": "meta-llama/Llama-3.1-8B-Instruct",
    "RedHatAI/Qwen2.5-7B-Instruct-quantized.w8a8": "Qwen/Qwen2.5-7B-Instruct",
    "redhatai/Llama-3.3-70B-Instruct-quantized.w8a8": "meta-llama/Llama-3.3-70B-Instruct",
}
FORMAT_OF = {None: None, "fp8": WeightFormat.FP8, "gptq": WeightFormat.GPTQ, "mxfp4": WeightFormat.MXFP4,
             "int8": WeightFormat.INT8}

#: Cases not replayed, and why.
OUT_OF_SCOPE = {
    "h100-deepseek-v2-lite-tp1": "DeepSeek-V2-Lite is not in the catalog",
    "h100-llama4-scout-tp4": "Llama 4 (chunked attention, interleaved MoE) is not in the catalog",
    "llmd-h100-mistral-small-32-24b": "Mistral-Small-3.2 is not in the catalog",
    "llmd-h100-llama31-8b-16k": "summary of a run with unknown version and batch settings",
    "llmd-h100-gptoss-120b-tp1": "summary of a run with unknown version and batch settings",
    "llmd-h100-qwen3-32b-tp1": "summary of a run with unknown version and batch settings",
    "llmd-h100-qwen3-32b-tp2": "summary of a run with unknown version and batch settings",
    "rtx3090-llama31-8b-20k": "V0 engine (before 0.10): different profiling",
    "rtx3090-llama31-8b-29k-fail": "V0 engine (before 0.10): different profiling",
    "pr10511-llama3-8b-tp1": "V0 engine, GPU and max_model_len not given",
    "pr10511-llama3-8b-tp2": "V0 engine, GPU and max_model_len not given",
    "l40s-llama31-8b-32k": "total GPU memory and utilization not given",
    "a100-gptoss-20b-131k": "GPU variant and total memory not given",
    "a100-gemma4-26b-a4b-131k-eager": "Gemma 4 is not in the catalog",
    "h100-mistral-small-31-24b-w8a8-tp1": "Mistral-Small-3.1 (Mistral3 with a Pixtral vision tower) is not in the "
                                          "catalog",
    "h100-mistral-small-31-24b-w8a8-tp2": "Mistral-Small-3.1 (Mistral3 with a Pixtral vision tower) is not in the "
                                          "catalog",
    "h100-gptoss-120b-v0101-defaults": "vLLM 0.10.1 is older than the oldest supported release (0.10.2), and the "
                                       "GPU's total is not printed",
}


@dataclass(frozen=True)
class GoldenCase:
    id: str
    source_url: str
    config: ServingConfig
    printed: dict[str, Any]


def load_cases() -> tuple[list[GoldenCase], list[dict[str, Any]]]:
    """(replayable cases, all raw cases)."""
    raw = json.loads((DATA / "golden_vllm_logs.json").read_text())["cases"]
    cases = []
    for c in raw:
        if c["id"] in OUT_OF_SCOPE:
            continue
        m = find_catalog_model(ARCHITECTURE_OF.get(c["model"], c["model"]))
        assert m is not None, c["model"]
        fmt = FORMAT_OF[c.get("quantization")] or m.weight_format
        if "checkpoint_quantization_config" in c:  # a pre-quantized checkpoint: read its config as the operator does
            m = dataclasses.replace(m, quantization=parse_quantization_config(c["checkpoint_quantization_config"]))
        if fmt is not m.weight_format or "checkpoint_quantization_config" in c:
            m = dataclasses.replace(m, checkpoint_bytes=None)
        gpu = GPUSpec.custom(c["gpu_total_gib"])
        printed = dict(c["printed"])
        if "pp_stage1_activation_peak_gib" in printed:  # vLLM sizes for the last (busiest) stage
            printed["activation_peak_gib"] = printed["pp_stage1_activation_peak_gib"]
            printed["kv_cache_gib"] = printed["requested_memory_gib"] - printed["pp_stage1_total_non_kv_cache_gib"]
            for key in ("kv_cache_tokens", "max_concurrency", "non_torch_gib"):
                printed.pop(key, None)
        config = ServingConfig(
            model=m, gpu=gpu, vllm=behaviour_of(VLLMVersion.parse(c["vllm_version"])),
            tensor_parallel_size=c["tensor_parallel_size"], pipeline_parallel_size=c["pipeline_parallel_size"],
            gpu_memory_utilization=c["gpu_memory_utilization"], max_model_len=c["max_model_len"],
            max_num_seqs=c["max_num_seqs"], max_num_batched_tokens=c["max_num_batched_tokens"],
            weight_format=fmt, kv_cache_dtype=KVCacheDtype(c["kv_cache_dtype"]),
            enforce_eager=bool(c["enforce_eager"]), dtype=c.get("dtype_override") or "auto",
        )
        cases.append(GoldenCase(c["id"], c["source_url"], config, printed))
    return cases, raw


#: field -> (estimate key, relative tolerance, absolute tolerance); a value passes either.
TOLERANCES = {
    "weights_gib": (0.05, 0.1),
    "activation_peak_gib": (0.20, 0.3),
    "non_torch_gib": (0.10, 0.3),
    "cuda_graph_estimated_gib": (0.35, 0.4),
    "kv_cache_gib": (0.03, 0.5),
    "kv_cache_tokens": (0.05, 0),
    "max_concurrency": (0.05, 0),
}
ESTIMATE_KEY = {"cuda_graph_estimated_gib": "cuda_graph_gib"}

#: Figures the model does not reproduce, with the reason (reported in the README's accuracy table).
KNOWN_MISSES = {
    ("h100-llama31-8b-tp2", "cuda_graph_estimated_gib"):
        "vLLM estimated 1.69 GiB of graphs at TP 2 against 0.84 GiB at TP 1 for the same model; "
        "other TP 2/4 runs do not double, so the model does not follow this one",
    ("h100-gptoss-120b-v011-1024-batched", "kv_cache_gib"):
        "planned 2.90 GiB of KV cache where vLLM 0.11.0 had 1.71; the log pastes no weights or profiling figures, so "
        "the 1.2 GiB left after the sorting sampler is unexplained (weights through the Marlin MXFP4 path were "
        "65.97 GiB at 0.10.1 against the 64.55 planned, which would close it, but this log does not show the path)",
}


def compare(case: GoldenCase) -> dict[str, tuple[float, float]]:
    """printed field -> (printed, estimated)."""
    result: MemoryEstimate = estimate(case.config)
    ours = result.as_dict()
    return {f: (float(case.printed[f]), float(ours[ESTIMATE_KEY.get(f, f)]))  # type: ignore[arg-type]
            for f in TOLERANCES if case.printed.get(f) is not None}


def within(field: str, printed: float, estimated: float, case_id: str = "") -> bool:
    if (case_id, field) in KNOWN_MISSES:
        return True
    rel, abs_ = TOLERANCES[field]
    return abs(estimated - printed) <= max(rel * abs(printed), abs_)
