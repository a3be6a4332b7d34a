"""Search for the cheapest vLLM deployment that fits.

Order of preference: fewest GPUs (power-of-two tensor parallel sizes within one node, then whole nodes with
one pipeline stage each), then best quality (unquantized > FP8 > 4-bit weights; model-dtype KV > fp8 KV),
then the longest ``max_model_len`` within [minimum, desired] that still serves the expected concurrency.
Offloading weights to host memory, when allowed, is the last resort. When nothing fits, the answer names
the smallest change that would.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass

from llm_autopilot.domain.architecture import CheckpointQuantization, ModelArchitecture
from llm_autopilot.domain.precision import GIB, KVCacheDtype, WeightFormat
from llm_autopilot.planner.config import ServingConfig, weights_label
from llm_autopilot.planner.kv_cache import largest_len_that_fits
from llm_autopilot.planner.lora import VLLM_LORA_RANKS, LoRASettings
from llm_autopilot.planner.memory import MemoryEstimate, estimate, gpu_weight_bytes, structural_problems
from llm_autopilot.planner.plan import (
    BUDGET_HEADROOM,
    DEFAULT_MIN_MAX_MODEL_LEN,
    KV_HEADROOM,
    Infeasible,
    Plan,
    PlanRequest,
    PlanResult,
    Reason,
)
from llm_autopilot.planner.weights import stage_partition, total_parameters
from llm_autopilot.vllm.versions import DTYPE_NAMES, dtype_problem

#: Largest tensor-parallel size the suggestions consider (one node of 8 GPUs is the common case).
_SUGGESTION_MAX_GPUS = 8
_LEN_ROUNDING = 256


@dataclass(frozen=True)
class WeightOption:
    """One way to hold the weights: the checkpoint served and the format its linears end up in."""

    weight_format: WeightFormat
    model: ModelArchitecture
    served_model_id: str
    note: str

    @property
    def label(self) -> str:
        return weights_label(self.model, self.weight_format)

    @property
    def rank(self) -> tuple[int, int]:
        online = self.weight_format is not self.model.weight_format
        return (self.weight_format.quality_rank, 1 if online else 0)


def _variant_architecture(req: PlanRequest, fmt: WeightFormat, model_id: str) -> ModelArchitecture:
    known = req.variant_models.get(fmt)
    if known is not None:
        return known
    bits = 8 if fmt is WeightFormat.FP8 else 4
    group = 0 if fmt is WeightFormat.FP8 else 128
    return dataclasses.replace(
        req.model, model_id=model_id, checkpoint_bytes=None, variants={},
        quantization=CheckpointQuantization(fmt.value, fmt, bits, group),
    )


def weight_options(req: PlanRequest, allowed: tuple[WeightFormat, ...]) -> list[WeightOption]:
    """Every way to hold the weights that ``allowed`` permits, best quality first."""
    base = req.model
    native = base.weight_format
    options = [WeightOption(native, base, base.model_id,
                            "as published" if native is WeightFormat.NONE else f"{native} checkpoint as published")]
    for fmt in allowed:
        if fmt is WeightFormat.NONE or fmt is native:
            continue
        variant_id = base.variants.get(fmt)
        if variant_id:
            options.append(WeightOption(fmt, _variant_architecture(req, fmt, variant_id), variant_id,
                                        f"pre-quantized checkpoint {variant_id}"))
        elif fmt is WeightFormat.FP8 and native is WeightFormat.NONE:
            options.append(WeightOption(fmt, base, base.model_id, "quantized to FP8 by vLLM while loading"))
    supported = [o for o in options if req.gpu.supports_weight_format(o.weight_format)]
    return sorted(supported, key=lambda o: o.rank)


@dataclass(frozen=True)
class Layout:
    """How one replica's GPUs are arranged: tensor parallel within a node, one pipeline stage per node."""

    tp: int
    nodes: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.nodes


def _tp_valid(req: PlanRequest, tp: int) -> bool:
    m = req.model
    if m.num_attention_heads % tp:
        return False
    return m.mla is not None or (m.num_kv_heads % tp == 0 if m.num_kv_heads >= tp else tp % m.num_kv_heads == 0)


def _layouts(req: PlanRequest, max_gpus: int, min_gpus: int = 1) -> Iterator[Layout]:
    """Every layout with at most ``max_gpus`` GPUs, fewest first: power-of-two tensor parallel sizes that fit
    one node, then 2, 3, ... nodes of the largest such size the model allows, one pipeline stage each."""
    t = req.targets
    per_node = max(1, t.gpus_per_node)
    tp, node_tp = 1, 0
    while tp <= min(max_gpus, per_node):
        if tp >= min_gpus:
            yield Layout(tp)
        tp *= 2
    tp = 1
    while tp * 2 <= per_node:
        tp *= 2
    while tp > 1 and not _tp_valid(req, tp):
        tp //= 2
    node_tp = tp
    nodes = 2
    while node_tp * nodes <= max_gpus and (t.max_nodes is None or nodes <= t.max_nodes) \
            and nodes <= req.model.num_layers:
        if node_tp * nodes >= min_gpus:
            yield Layout(node_tp, nodes)
        nodes += 1


def _length_bounds(req: PlanRequest) -> tuple[int, int]:
    t, model_max = req.targets, req.model.max_position_embeddings
    desired = model_max if t.max_model_len_auto else (t.max_model_len or model_max)
    minimum = t.min_max_model_len or (desired if t.max_model_len else min(desired, DEFAULT_MIN_MAX_MODEL_LEN))
    return desired, min(minimum, desired)


def _batch_settings(req: PlanRequest) -> tuple[int, int, str, str]:
    t = req.targets
    defaults = req.vllm.batch_defaults(req.gpu)
    gib = f"{req.gpu.total_gib:.0f} GiB"
    if t.max_num_seqs:
        seqs, seqs_why = t.max_num_seqs, "set in the spec"
    elif t.concurrency:
        seqs = min(defaults.max_num_seqs, max(16, 2 * t.concurrency))
        seqs_why = (f"twice the expected concurrency ({t.concurrency}) leaves room for bursts and keeps the "
                    f"sampler warm-up smaller than vLLM's default {defaults.max_num_seqs}")
        if seqs == defaults.max_num_seqs:
            seqs_why = f"vLLM {req.vllm.version}'s default for a {gib} GPU covers twice the expected concurrency"
    else:
        seqs, seqs_why = defaults.max_num_seqs, f"vLLM {req.vllm.version}'s default for a {gib} GPU"
    if t.max_num_batched_tokens:
        tokens, tokens_why = t.max_num_batched_tokens, "set in the spec"
    else:
        tokens = defaults.max_num_batched_tokens
        tokens_why = f"vLLM {req.vllm.version}'s default for a {gib} GPU (chunked prefill)"
    return seqs, max(tokens, seqs), seqs_why, tokens_why


def _config(req: PlanRequest, option: WeightOption, kv: KVCacheDtype, layout: Layout, length: int,
            offload_gib: float = 0.0) -> ServingConfig:
    t = req.targets
    seqs, tokens, _, _ = _batch_settings(req)
    return ServingConfig(
        model=option.model,
        gpu=req.gpu,
        vllm=req.vllm,
        tensor_parallel_size=layout.tp,
        pipeline_parallel_size=layout.nodes,
        nodes=layout.nodes,
        cpu_offload_gib=offload_gib,
        gpu_memory_utilization=t.gpu_memory_utilization or req.vllm.default_gpu_memory_utilization,
        max_model_len=length,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        weight_format=option.weight_format,
        kv_cache_dtype=kv,
        enforce_eager=t.enforce_eager,
        lora=t.lora,
        kv_calibration=req.kv_calibration,
        max_cudagraph_capture_size=t.max_cudagraph_capture_size,
        dtype=t.dtype,
    )


def _longest_len(cfg: ServingConfig, probe: MemoryEstimate, desired: int, concurrency: int) -> int:
    """Longest length ≤ desired whose ``concurrency`` requests fit in the KV cache less the headroom.

    The headroom covers the estimate's own error: a share of the KV cache, and at least a share of
    the whole budget, so that a plan never depends on the last few hundred MiB.
    """
    headroom = max(probe.kv_cache_bytes * KV_HEADROOM, probe.budget_bytes * BUDGET_HEADROOM)
    usable = (probe.kv_cache_bytes - headroom) / concurrency
    fitting = largest_len_that_fits(cfg.model, cfg.tensor_parallel_size, cfg.pipeline_parallel_size,
                                    cfg.kv_cache_dtype, available_bytes=usable, model_dtype_bytes=cfg.dtype_bytes,
                                    max_num_batched_tokens=cfg.max_num_batched_tokens * cfg.vllm.in_flight_batches(
                                        pipeline_parallel_size=cfg.pipeline_parallel_size),
                                    block_size=cfg.block_size, limit=desired)
    if fitting >= desired:
        return desired
    return fitting - fitting % _LEN_ROUNDING if fitting > _LEN_ROUNDING else fitting


@dataclass(frozen=True)
class _Candidate:
    option: WeightOption
    kv: KVCacheDtype
    layout: Layout
    config: ServingConfig
    estimate: MemoryEstimate

    @property
    def tp(self) -> int:
        return self.layout.tp


def _try(req: PlanRequest, option: WeightOption, kv: KVCacheDtype, layout: Layout, concurrency: int,
         offload_gib: float = 0.0) -> _Candidate | None:
    desired, minimum = _length_bounds(req)
    probe_cfg = _config(req, option, kv, layout, minimum, offload_gib)
    if structural_problems(probe_cfg):
        return None
    probe = estimate(probe_cfg)
    if not probe.fits:
        return None
    length = _longest_len(probe_cfg, probe, desired, concurrency)
    if length < minimum:
        return None
    cfg = dataclasses.replace(probe_cfg, max_model_len=length)
    result = estimate(cfg)
    return _Candidate(option, kv, layout, cfg, result) if result.fits else None


def _kv_options(req: PlanRequest, allowed: tuple[KVCacheDtype, ...]) -> list[KVCacheDtype]:
    return sorted((kv for kv in set(allowed) if req.vllm.supports_kv_cache_dtype(req.gpu, kv)),
                  key=lambda k: k.quality_rank)


def _search(req: PlanRequest, *, max_gpus: int, formats: tuple[WeightFormat, ...],
            kv_dtypes: tuple[KVCacheDtype, ...], concurrency: int) -> _Candidate | None:
    options = weight_options(req, formats)
    kvs = _kv_options(req, kv_dtypes)
    for layout in _layouts(req, max_gpus, req.targets.min_gpus):
        for option in options:
            for kv in kvs:
                found = _try(req, option, kv, layout, concurrency)
                if found:
                    return found
    return None


def _search_offload(req: PlanRequest, concurrency: int) -> _Candidate | None:
    """The last resort: the widest layout allowed, the best quality, and the fewest whole GiB of weights per GPU
    in host memory that make it fit (each forward pass streams them over PCIe: slow)."""
    t = req.targets
    layouts = list(_layouts(req, t.max_gpus, t.min_gpus))
    if not layouts:
        return None
    layout = layouts[-1]
    _, minimum = _length_bounds(req)
    for option in weight_options(req, t.allowed_weight_formats):
        for kv in _kv_options(req, t.allowed_kv_cache_dtypes):
            probe = _config(req, option, kv, layout, minimum)
            if structural_problems(probe):
                continue
            most = math.ceil(gpu_weight_bytes(probe) / GIB)
            if most < 1 or _try(req, option, kv, layout, concurrency, float(most)) is None:
                continue
            low, high = 0, most  # invariant: `low` GiB does not fit, `high` does
            while high - low > 1:
                middle = (low + high) // 2
                if _try(req, option, kv, layout, concurrency, float(middle)) is None:
                    low = middle
                else:
                    high = middle
            return _try(req, option, kv, layout, concurrency, float(high))
    return None


def plan(req: PlanRequest) -> PlanResult:
    """The cheapest deployment that fits, with a reason for every choice, or why none does."""
    t = req.targets
    problem = _invalid_targets(req) or _unsupported(req)
    if problem:
        return Infeasible(problem)
    wanted = t.concurrency or 1
    found = _search(req, max_gpus=t.max_gpus, formats=t.allowed_weight_formats,
                    kv_dtypes=t.allowed_kv_cache_dtypes, concurrency=wanted)
    warnings: list[str] = []
    if found is None and wanted > 1:
        found = _search(req, max_gpus=t.max_gpus, formats=t.allowed_weight_formats,
                        kv_dtypes=t.allowed_kv_cache_dtypes, concurrency=1)
        if found is not None:
            warnings.append(
                f"only {found.estimate.max_concurrency:.1f} concurrent sequences of {found.config.max_model_len} "
                f"tokens fit (expected concurrency {wanted}); allow more GPUs, fp8 KV cache or a shorter "
                "minimum maxModelLen to serve more"
            )
    if found is None and t.allow_cpu_offload:
        found = _search_offload(req, wanted) or (_search_offload(req, 1) if wanted > 1 else None)
        if found is not None:
            warnings.append(_offload_warning(req, found))
    if found is None:
        return _explain_infeasible(req)
    return Plan(found.config, found.estimate, found.option.served_model_id,
                tuple(_reasons(req, found)), tuple(warnings))


def _offload_warning(req: PlanRequest, c: _Candidate) -> str:
    return (f"SLOW: {c.config.cpu_offload_gib:g} GiB of weights per GPU are offloaded to host memory "
            f"(--cpu-offload-gb) and cross PCIe on every forward pass, so every token is several times slower; "
            f"nothing fits in the memory of {c.layout.gpus} x {req.gpu.display_name} otherwise")


def _invalid_targets(req: PlanRequest) -> str | None:
    t, m = req.targets, req.model
    if t.max_gpus < 1:
        return "maxGPUs must be at least 1"
    if t.min_gpus > t.max_gpus:
        return f"at least {t.min_gpus} GPUs are needed but maxGPUs is {t.max_gpus}"
    if t.max_model_len and t.max_model_len > m.max_position_embeddings:
        return (f"maxModelLen {t.max_model_len} exceeds {m.model_id}'s maximum context of "
                f"{m.max_position_embeddings} tokens")
    if t.min_max_model_len and t.min_max_model_len > m.max_position_embeddings:
        return (f"minMaxModelLen {t.min_max_model_len} exceeds {m.model_id}'s maximum context of "
                f"{m.max_position_embeddings} tokens")
    if t.min_max_model_len and t.max_model_len and t.min_max_model_len > t.max_model_len:
        return f"minMaxModelLen {t.min_max_model_len} is larger than maxModelLen {t.max_model_len}"
    if t.gpu_memory_utilization is not None and not 0 < t.gpu_memory_utilization <= 1:
        return f"gpuMemoryUtilization must be in (0, 1], got {t.gpu_memory_utilization}"
    return None


def _gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def _first_problem(req: PlanRequest, option: WeightOption, kv: KVCacheDtype, layout: Layout) -> str:
    _, minimum = _length_bounds(req)
    cfg = _config(req, option, kv, layout, minimum)
    problems = estimate(cfg).problems
    return problems[0] if problems else f"it cannot serve {req.targets.concurrency or 1} sequences"


def _describe(layout: Layout, gpu: str) -> str:
    return f"{layout.gpus} x {gpu}" if layout.nodes == 1 else f"{layout.nodes} nodes of {layout.tp} x {gpu}"


def _smaller(req: PlanRequest, layout: Layout) -> Layout | None:
    """The widest layout with fewer GPUs (the one the search tried just before)."""
    fewer = list(_layouts(req, layout.gpus - 1))
    return fewer[-1] if fewer else None


def _layout_reasons(req: PlanRequest, c: _Candidate) -> list[Reason]:
    gpu, t, layout = req.gpu.display_name, req.targets, c.layout
    best = weight_options(req, t.allowed_weight_formats)[-1]
    kv = _kv_options(req, t.allowed_kv_cache_dtypes)[-1]
    smaller = _smaller(req, layout)
    why_not_smaller = (f"{_describe(smaller, gpu)} does not fit even with {best.label} weights and {kv} KV cache: "
                       f"{_first_problem(req, best, kv, smaller)}") if smaller is not None else ""
    if layout.nodes == 1:
        if layout.tp == 1:
            return [Reason("tensorParallelSize", "1", f"fits on a single {gpu}")]
        return [Reason("tensorParallelSize", str(layout.tp), why_not_smaller)]
    stages = " + ".join(str(n) for n in stage_partition(req.model.num_layers, layout.nodes))
    return [
        Reason("tensorParallelSize", str(layout.tp),
               f"tensor parallel within a node ({layout.tp} x {gpu} per node, over NVLink); not across nodes, whose "
               "network is far slower than NVLink"),
        Reason("pipelineParallelSize", str(layout.nodes),
               f"pipeline parallel across {layout.nodes} nodes, one stage of {stages} layers each: {why_not_smaller}"),
    ]


def _length_reason(req: PlanRequest, c: _Candidate) -> Reason:
    cfg, est, t = c.config, c.estimate, req.targets
    desired, minimum = _length_bounds(req)
    fits = (f"the longest that fits {t.concurrency or 1} sequence(s) in the {_gib(est.kv_cache_bytes)} KV cache "
            f"with headroom for estimate error")
    if t.max_model_len_auto:
        why = ("auto: the model's full context fits" if cfg.max_model_len == desired else
               f"auto: {fits} (minimum {minimum}, model maximum {desired})")
    elif cfg.max_model_len == desired:
        why = "the desired length" if t.max_model_len else "the model's full context"
    else:
        why = f"{fits} (desired {desired}, minimum {minimum})"
    return Reason("maxModelLen", str(cfg.max_model_len), why)


def _reasons(req: PlanRequest, c: _Candidate) -> list[Reason]:
    gpu = req.gpu.display_name
    cfg, est, t = c.config, c.estimate, req.targets
    reasons = _layout_reasons(req, c)
    options = weight_options(req, t.allowed_weight_formats)
    note = c.option.note
    if t.dtype != "auto" and cfg.weight_format is WeightFormat.NONE:
        note += f", held in {cfg.serving_dtype} (dtype)"
    if c.option == options[0]:
        reasons.append(Reason("weights", cfg.weights_label, f"{note}; the best quality allowed"))
    else:
        reasons.append(Reason("weights", cfg.weights_label,
                              f"{note}; better formats do not fit on {_describe(c.layout, gpu)}: "
                              f"{_first_problem(req, options[0], KVCacheDtype.AUTO, c.layout)}"))
    if c.kv is KVCacheDtype.AUTO:
        reasons.append(Reason("kvCacheDtype", "auto", "the model's own dtype; the best quality"))
    else:
        reasons.append(Reason("kvCacheDtype", "fp8", "the model-dtype KV cache does not hold the target length "
                                                     "and concurrency; fp8 halves the bytes per token"))
    if t.dtype != "auto":
        reasons.append(Reason("dtype", cfg.serving_dtype,
                              f"set in the spec (--dtype): activations, unquantized weights and an auto KV cache in "
                              f"{cfg.serving_dtype}, {cfg.dtype_bytes} bytes per element"))
    if cfg.cpu_offload_gib:
        reasons.append(Reason("cpuOffloadGB", f"{cfg.cpu_offload_gib:g}",
                              f"SLOW, the last resort (allowCPUOffload): nothing fits in GPU memory on "
                              f"{_describe(c.layout, gpu)}, so {cfg.cpu_offload_gib:g} GiB of weights per GPU stay "
                              "in host memory and cross PCIe on every forward pass; every token is several times "
                              "slower. Allow more GPUs or a quantization to serve at full speed"))
    reasons.append(_length_reason(req, c))
    if req.kv_calibration is not None:
        reasons.append(Reason("kvCalibration", f"{req.kv_calibration.ratio:.4f}",
                              req.kv_calibration.reason(est.uncalibrated_kv_bytes, est.total_bytes)))
    pinned = t.gpu_memory_utilization is not None
    reasons.append(Reason("gpuMemoryUtilization", f"{cfg.gpu_memory_utilization:g}",
                          "set in the spec" if pinned else f"vLLM {req.vllm.version}'s default"))
    _, _, seqs_why, tokens_why = _batch_settings(req)
    reasons.append(Reason("maxNumSeqs", str(cfg.max_num_seqs), seqs_why))
    reasons.append(Reason("maxNumBatchedTokens", str(cfg.max_num_batched_tokens), tokens_why))
    if cfg.lora is not None:
        reasons.append(Reason("lora", f"{cfg.lora.max_loras}x{cfg.lora.max_lora_rank}",
                              f"{cfg.lora.max_loras} adapter slot(s) at rank {cfg.lora.max_lora_rank} reserved on "
                              f"every GPU: {_gib(est.lora_slots_bytes)} per GPU, "
                              f"{_gib(est.lora_profile_bytes)} more profile peak (derived from vLLM 0.33's source)"))
    reasons.append(Reason("enforceEager", str(cfg.enforce_eager).lower(),
                          "set in the spec: no CUDA graphs" if cfg.enforce_eager
                          else f"CUDA graphs on (about {_gib(est.cuda_graph_bytes)} per GPU)"))
    if cfg.max_cudagraph_capture_size is not None and not cfg.enforce_eager:
        default = cfg.vllm.max_cuda_graph_capture_size(cfg.max_num_seqs, cfg.max_num_batched_tokens)
        reasons.append(Reason("maxCudagraphCaptureSize", str(cfg.cuda_graph_capture_size),
                              f"CUDA graphs captured for batches up to {cfg.cuda_graph_capture_size} tokens instead "
                              f"of vLLM's {default}: fewer graphs, less memory; larger batches run without one"))
    return reasons


def _explain_infeasible(req: PlanRequest) -> Infeasible:
    t, gpu = req.targets, req.gpu.display_name
    m = req.model
    size = f"{total_parameters(m) / 1e9:.0f}B" if total_parameters(m) >= 1e9 else f"{total_parameters(m) / 1e6:.0f}M"
    _, minimum = _length_bounds(req)
    options = weight_options(req, t.allowed_weight_formats)
    kvs = _kv_options(req, t.allowed_kv_cache_dtypes)
    closest_layout = _largest_valid_layout(req, t.max_gpus)
    closest = estimate(_config(req, options[-1], kvs[-1], closest_layout, minimum)) if options and kvs else None
    why = closest.problems[0] if closest and closest.problems else "no tensor parallel size is valid"
    suggestions = _suggestions(req, minimum)
    head = (f"{m.model_id} ({size}) does not fit on {t.max_gpus} x {gpu} with maxModelLen >= {minimum}: {why}")
    message = head + (". " + "; or ".join(suggestions) if suggestions else
                      f". It does not fit on up to {_SUGGESTION_MAX_GPUS} x {gpu} with any quantization either")
    return Infeasible(message, tuple(suggestions), closest)


def _native_option(req: PlanRequest) -> WeightOption:
    return WeightOption(req.model.weight_format, req.model, req.model.model_id, "as published")


def _largest_valid_layout(req: PlanRequest, max_gpus: int) -> Layout:
    native = _native_option(req)
    valid = [layout for layout in _layouts(req, max_gpus)
             if not structural_problems(_config(req, native, KVCacheDtype.AUTO, layout, 1))]
    return valid[-1] if valid else Layout(1)


def _unsupported(req: PlanRequest) -> str | None:
    """The GPU cannot run any allowed weight format, or any allowed KV-cache dtype."""
    gpu, t = req.gpu, req.targets
    if not weight_options(req, t.allowed_weight_formats):
        return (f"{req.model.model_id} is a {req.model.weight_format} checkpoint, which vLLM cannot run on "
                f"{gpu.display_name} (compute capability {gpu.compute_capability}); allow another quantization "
                "with a variant checkpoint, or choose a newer GPU")
    if not _kv_options(req, t.allowed_kv_cache_dtypes):
        return (f"vLLM {req.vllm.version} cannot keep an fp8 KV cache on {gpu.display_name} (compute capability "
                f"{gpu.compute_capability}); add auto to allowedKVCacheDtypes")
    if t.dtype != "auto":
        refused = dtype_problem(t.dtype, req.model.model_type, gpu, mla=req.model.mla is not None)
        if refused:
            return f"dtype {t.dtype} for {req.model.model_id}: {refused}"
        formats = [o.weight_format for o in weight_options(req, t.allowed_weight_formats)]
        if DTYPE_NAMES.get(t.dtype) == "float32" and WeightFormat.NONE not in formats:
            return (f"dtype float32 is planned for unquantized weights only, and {req.model.model_id} is served as "
                    f"{', '.join(map(str, formats))}; use dtype auto, or serve an unquantized checkpoint")
    return None


def _suggestions(req: PlanRequest, minimum: int) -> list[str]:
    """The smallest changes that make it fit: more GPUs and/or more quantization, or a shorter minimum."""
    t, gpu = req.targets, req.gpu.display_name
    suggestions: list[str] = []
    widest = max(_SUGGESTION_MAX_GPUS, t.max_gpus)
    same_quality = _search(req, max_gpus=widest, formats=t.allowed_weight_formats,
                           kv_dtypes=t.allowed_kv_cache_dtypes, concurrency=1)
    any_quality = _search(req, max_gpus=widest, formats=tuple(WeightFormat), kv_dtypes=tuple(KVCacheDtype),
                          concurrency=1)
    for found in (same_quality, any_quality):
        if found is None or (found is any_quality and same_quality and same_quality.layout.gpus <= found.layout.gpus):
            continue
        nodes = f" ({found.layout.nodes} nodes)" if found.layout.nodes > 1 else ""
        needs = f"needs at least {found.layout.gpus} x {gpu}{nodes} with {found.option.label} weights"
        if found.kv is KVCacheDtype.FP8:
            needs += " and fp8 KV cache"
        changes = []
        if found.layout.gpus > t.max_gpus:
            changes.append(f"maxGPUs is {t.max_gpus}")
        if found.option.weight_format not in (*t.allowed_weight_formats, req.model.weight_format):
            changes.append(f"add {found.option.weight_format} to allowedQuantizations: {found.option.note}")
        if found.kv not in t.allowed_kv_cache_dtypes:
            changes.append("add fp8 to allowedKVCacheDtypes")
        suggestions.append(f"{needs} ({'; '.join(changes)})" if changes else needs)
    best_len = 0
    for layout in _layouts(req, t.max_gpus):
        for option in weight_options(req, t.allowed_weight_formats):
            for kv in _kv_options(req, t.allowed_kv_cache_dtypes):
                cfg = _config(req, option, kv, layout, 1)
                if structural_problems(cfg):
                    continue
                probe = estimate(cfg)
                if probe.kv_cache_bytes > 0:
                    best_len = max(best_len, _longest_len(cfg, probe, minimum, 1))
    if 0 < best_len < minimum:
        suggestions.append(f"lower minMaxModelLen to {best_len} (the longest that fits on {t.max_gpus} x {gpu})")
    return _lora_suggestions(req) + suggestions


def _lora_suggestions(req: PlanRequest) -> list[str]:
    """With LoRA: the most slots (never below the pinned adapters) or the highest rank that fit as asked."""
    t = req.targets
    if t.lora is None or structural_problems(_config(req, _native_option(req), KVCacheDtype.AUTO, Layout(1), 1)):
        return []
    fits = []
    slots = t.lora.max_loras - 1
    while slots >= max(1, t.lora_min_slots):
        if _fits_with(req, dataclasses.replace(t.lora, max_loras=slots)):
            pinned = f"; never below the {t.lora_min_slots} pinned" if t.lora_min_slots else ""
            fits.append(f"lower spec.lora.maxLoras to {slots} (from {t.lora.max_loras}{pinned})")
            break
        slots -= 1
    lower_ranks = [r for r in reversed(VLLM_LORA_RANKS) if r < t.lora.max_lora_rank]
    for rank in lower_ranks:
        if _fits_with(req, dataclasses.replace(t.lora, max_lora_rank=rank)):
            fits.append(f"lower spec.lora.maxLoraRank to {rank} (from {t.lora.max_lora_rank}; adapters of a higher "
                        "rank are then refused)")
            break
    if KVCacheDtype.FP8 not in t.allowed_kv_cache_dtypes and _search(
            req, max_gpus=t.max_gpus, formats=t.allowed_weight_formats,
            kv_dtypes=(*t.allowed_kv_cache_dtypes, KVCacheDtype.FP8), concurrency=1) is not None:
        fits.append(f"add fp8 to allowedKVCacheDtypes (keeps {t.lora.max_loras} slots at rank {t.lora.max_lora_rank} "
                    f"on {t.max_gpus} x {req.gpu.display_name})")
    return fits


def _fits_with(req: PlanRequest, lora: LoRASettings) -> bool:
    t = dataclasses.replace(req.targets, lora=lora)
    changed = dataclasses.replace(req, targets=t)
    return _search(changed, max_gpus=t.max_gpus, formats=t.allowed_weight_formats,
                   kv_dtypes=t.allowed_kv_cache_dtypes, concurrency=1) is not None
