"""``llm-autopilot``: plan and estimate vLLM deployments from the command line.

Exit codes: 0 done, 1 no plan fits (``plan``), 2 a user mistake (one line ``error: ...``), 3 an internal
error (one line ``internal error: ...``; ``LLM_AUTOPILOT_DEBUG=1`` shows the traceback). Never a bare traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import socket
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar

import click
import yaml

from llm_autopilot.api.crd import render as render_crd
from llm_autopilot.catalog.gpus import GPUS, UnknownGPUError, find_gpu
from llm_autopilot.catalog.hf_config import ModelConfigError, parse_hf_config
from llm_autopilot.catalog.models import catalog_models
from llm_autopilot.cli.format import dump, memory_table, plan_dict, plan_table
from llm_autopilot.controller.settings import OperatorSettings, SettingsError
from llm_autopilot.domain.architecture import InvalidArchitecture, ModelArchitecture
from llm_autopilot.domain.gpu import GPUSpec
from llm_autopilot.domain.precision import KVCacheDtype, WeightFormat
from llm_autopilot.hub.client import ModelFetchError, load_local
from llm_autopilot.hub.resolve import ModelResolutionError, resolve_model
from llm_autopilot.planner.calibration import (
    CONFIGMAP_KEY,
    CalibrationError,
    KVCalibration,
    NotCalibrated,
    calibration_for,
    key_of,
    parse_store,
)
from llm_autopilot.planner.config import ServingConfig
from llm_autopilot.planner.lora import DEFAULT_MAX_LORA_RANK, VLLM_LORA_RANKS, LoRASettings
from llm_autopilot.planner.memory import estimate
from llm_autopilot.planner.plan import Infeasible, PlanRequest, Targets
from llm_autopilot.planner.search import plan as make_plan
from llm_autopilot.planner.weights import total_parameters
from llm_autopilot.render.vllm_args import ServeOptions
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION, VersionError, VLLMBehaviour, VLLMVersion, behaviour_of

F = TypeVar("F", bound=Callable[..., Any])

#: what a user can cause with their input; anything else is our bug (exit 3)
USER_ERRORS = (ModelResolutionError, ModelFetchError, ModelConfigError, InvalidArchitecture, UnknownGPUError,
               VersionError, SettingsError)
EXIT_INFEASIBLE, EXIT_USER_ERROR, EXIT_INTERNAL_ERROR = 1, 2, 3
#: far above any GPU, far below where GiB -> bytes overflows a float
MAX_GPU_MEMORY_GIB = 2.0**20
_COMPUTE_CAPABILITY = re.compile(r"\d{1,3}\.\d{1,3}")

# vLLM --quantization spellings (and ours) -> how the weights sit in memory
_QUANTIZATION_FORMATS: dict[str, WeightFormat] = {
    "none": WeightFormat.NONE, "bf16": WeightFormat.NONE, "fp16": WeightFormat.NONE,
    "fp8": WeightFormat.FP8, "fp8_per_tensor": WeightFormat.FP8, "fp8_per_block": WeightFormat.FP8,
    "fp8_per_channel": WeightFormat.FP8, "fbgemm_fp8": WeightFormat.FP8, "modelopt": WeightFormat.FP8,
    "awq": WeightFormat.AWQ, "awq_marlin": WeightFormat.AWQ,
    "gptq": WeightFormat.GPTQ, "gptq_marlin": WeightFormat.GPTQ,
    "mxfp4": WeightFormat.MXFP4, "gpt_oss_mxfp4": WeightFormat.MXFP4,
    "nvfp4": WeightFormat.NVFP4, "modelopt_fp4": WeightFormat.NVFP4,
}
_KV_DTYPES = {"auto": KVCacheDtype.AUTO, "bfloat16": KVCacheDtype.AUTO, "float16": KVCacheDtype.AUTO,
              "fp8": KVCacheDtype.FP8, "fp8_e4m3": KVCacheDtype.FP8, "fp8_e5m2": KVCacheDtype.FP8}


def fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_USER_ERROR)


def _load_model(model: str | None, model_config: str | None, revision: str | None = None) -> ModelArchitecture:
    if bool(model) == bool(model_config):
        fail("give exactly one of --model ID or --model-config PATH")
    if model_config:
        files = load_local(model_config)
        model_id = str(files.config.get("_model_id") or files.config.get("_name_or_path") or model_config)
        return parse_hf_config(files.config, model_id, checkpoint_bytes=files.checkpoint_bytes)
    assert model is not None
    return resolve_model(model, revision=revision)


def _load_gpu(gpu: str | None, memory_gib: float | None, compute_capability: str) -> GPUSpec:
    if bool(gpu) == (memory_gib is not None):
        fail("give exactly one of --gpu NAME or --gpu-memory-gib FLOAT")
    if gpu:
        return find_gpu(gpu)
    assert memory_gib is not None
    if not (math.isfinite(memory_gib) and 0 < memory_gib <= MAX_GPU_MEMORY_GIB):
        fail(f"--gpu-memory-gib must be positive and finite (at most {MAX_GPU_MEMORY_GIB:,.0f} GiB), "
             f"got {memory_gib:g}")
    if not _COMPUTE_CAPABILITY.fullmatch(compute_capability.strip()):
        fail(f"--compute-capability takes MAJOR.MINOR with whole numbers, e.g. 8.9; got {compute_capability!r}")
    return GPUSpec.custom(memory_gib, compute_capability)


class FiniteFloatRange(click.FloatRange):
    """A FloatRange that also refuses nan and inf (nan passes every comparison, so FloatRange lets it in)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


GPU_MEMORY_UTILIZATION = FiniteFloatRange(min=0, max=1, min_open=True)
#: vLLM's --dtype values as spec.vllm.dtype spells them (half and float are vLLM's other names for two of them)
DTYPE = click.Choice(["auto", "bfloat16", "float16", "float32"])


def _csv(values: tuple[str, ...]) -> list[str]:
    return [part.strip().lower() for value in values for part in value.split(",") if part.strip()]


def model_options(func: F) -> F:
    func = click.option("--revision", help="Hub revision (with --model).")(func)
    func = click.option("--model-config", type=click.Path(), help="A config.json file or a folder holding one.")(func)
    func = click.option("--model", help="Hugging Face id (built-in catalog first, then the Hub).")(func)
    return func


def gpu_options(func: F) -> F:
    func = click.option("--compute-capability", default="9.0", show_default=True,
                        help="With --gpu-memory-gib.")(func)
    func = click.option("--gpu-memory-gib", type=float, help="Total memory of one GPU as torch reports it.")(func)
    func = click.option("--gpu", help="GPU from the catalog (see `catalog gpus`).")(func)
    return func


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="llm-autopilot")
def cli() -> None:
    """Plan vLLM deployments that fit their GPUs, and run the llm-autopilot operator."""


@cli.command()
@model_options
@gpu_options
@click.option("--max-model-len", type=click.IntRange(min=1), help="Desired context length.")
@click.option("--min-max-model-len", type=click.IntRange(min=1), help="Shortest acceptable context length.")
@click.option("--concurrency", type=click.IntRange(min=1), help="Concurrent sequences of max-model-len tokens.")
@click.option("--max-gpus", type=click.IntRange(min=1, max=64), default=8, show_default=True,
              help="Most GPUs one replica may use.")
@click.option("--allow-quantization", multiple=True, metavar="LIST",
              help="Weight formats allowed besides the published one: fp8, awq, gptq (comma-separated).")
@click.option("--allow-kv-cache-dtype", multiple=True, metavar="LIST", help="KV dtypes allowed besides auto: fp8.")
@click.option("--variant", multiple=True, metavar="FORMAT=ID", help="Pre-quantized checkpoint, e.g. awq=Org/Model-AWQ.")
@click.option("--gpu-memory-utilization", type=GPU_MEMORY_UTILIZATION, help="Pin it.")
@click.option("--enforce-eager", is_flag=True, help="Plan without CUDA graphs.")
@click.option("--dtype", type=DTYPE, default="auto", show_default=True,
              help="vLLM's --dtype: activations, unquantized weights and an auto KV cache (spec.vllm.dtype).")
@click.option("--vllm-version", default=str(DEFAULT_VLLM_VERSION), show_default=True)
@click.option("--served-model-name", help="Name clients use (defaults to the model id).")
@click.option("--max-loras", type=click.IntRange(min=1, max=64), default=None,
              help="Reserve this many LoRA adapter slots (--enable-lora).")
@click.option("--max-lora-rank", type=click.Choice([str(r) for r in VLLM_LORA_RANKS]), default=None,
              help="Rank of every LoRA slot (default 16, with --max-loras).")
@click.option("--calibration", "calibration_file", type=click.Path(exists=True, dir_okay=False),
              help="KV calibration store (its JSON, or the ConfigMap holding it under calibration.json): plan as "
                   "the cluster would for this GPU, vLLM version and architecture family.")
@click.option("--output", "-o", type=click.Choice(["table", "json", "yaml"]), default="table", show_default=True)
def plan(model: str | None, model_config: str | None, revision: str | None, gpu: str | None,
         gpu_memory_gib: float | None, compute_capability: str, max_model_len: int | None,
         min_max_model_len: int | None, concurrency: int | None, max_gpus: int,
         allow_quantization: tuple[str, ...], allow_kv_cache_dtype: tuple[str, ...], variant: tuple[str, ...],
         gpu_memory_utilization: float | None, enforce_eager: bool, dtype: str, vllm_version: str,
         served_model_name: str | None, max_loras: int | None, max_lora_rank: str | None,
         calibration_file: str | None, output: str) -> None:
    """The cheapest vLLM configuration that fits, its memory breakdown, reasons and command."""
    architecture = _load_model(model, model_config, revision)
    formats = [WeightFormat.NONE]
    for name in _csv(allow_quantization):
        if name not in ("fp8", "awq", "gptq", "none"):
            fail(f"--allow-quantization takes fp8, awq, gptq; got {name!r}")
        formats.append(WeightFormat(name))
    kv_dtypes = [KVCacheDtype.AUTO]
    for name in _csv(allow_kv_cache_dtype):
        if name not in ("fp8", "auto"):
            fail(f"--allow-kv-cache-dtype takes fp8; got {name!r}")
        kv_dtypes.append(KVCacheDtype(name))
    variants = dict(architecture.variants)
    for item in variant:
        fmt_name, sep, variant_id = item.partition("=")
        if not sep or fmt_name.lower() not in ("fp8", "awq", "gptq") or not variant_id:
            fail(f"--variant takes FORMAT=ID with FORMAT fp8, awq or gptq; got {item!r}")
        variants[WeightFormat(fmt_name.lower())] = variant_id
    architecture = dataclasses.replace(architecture, variants=variants)
    targets = Targets(
        max_model_len=max_model_len, min_max_model_len=min_max_model_len, concurrency=concurrency,
        allowed_weight_formats=tuple(formats), allowed_kv_cache_dtypes=tuple(kv_dtypes), max_gpus=max_gpus,
        gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager, dtype=dtype,
        lora=LoRASettings(max_loras or 1, int(max_lora_rank or DEFAULT_MAX_LORA_RANK))
        if max_loras or max_lora_rank else None,
    )
    gpu_spec = _load_gpu(gpu, gpu_memory_gib, compute_capability)
    behaviour = behaviour_of(VLLMVersion.parse(vllm_version))
    request = PlanRequest(architecture, gpu_spec, behaviour, targets,
                          kv_calibration=_load_calibration(calibration_file, gpu_spec, behaviour, architecture)
                          if calibration_file else None)
    result = make_plan(request)
    if isinstance(result, Infeasible):
        if output == "table":
            click.echo(f"No plan: {result.message}", err=True)
        else:
            click.echo(dump({"feasible": False, "message": result.message,
                             "suggestions": list(result.suggestions)}, output))
        sys.exit(EXIT_INFEASIBLE)
    options = ServeOptions(served_model_name=served_model_name or architecture.model_id, revision=revision)
    click.echo(plan_table(result, options) if output == "table" else dump(plan_dict(result, options), output))


def _load_calibration(path: str, gpu_spec: GPUSpec, behaviour: VLLMBehaviour,
                      architecture: ModelArchitecture) -> KVCalibration | None:
    """The calibration for this plan's key from a store file; what is dropped or missing is said on stderr."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        fail(f"--calibration {path}: cannot read it: {str(exc).splitlines()[0]}")
    if isinstance(data, dict) and data.get("kind") == "ConfigMap":
        text = (data.get("data") or {}).get(CONFIGMAP_KEY)
        if not isinstance(text, str):
            fail(f"--calibration {path}: the ConfigMap has no data.{CONFIGMAP_KEY}")
        try:
            data = json.loads(text)
        except ValueError as exc:
            fail(f"--calibration {path}: data.{CONFIGMAP_KEY} is not JSON: {exc}")
    now = datetime.now(UTC)
    try:
        store, problems = parse_store(data, now)
    except CalibrationError as exc:
        fail(f"--calibration {path}: {exc}")
    for problem in problems:
        click.echo(f"warning: {problem}", err=True)
    found = calibration_for(store, key_of(gpu_spec.display_name, behaviour.version, architecture), now)
    if isinstance(found, NotCalibrated):
        click.echo(found.reason, err=True)
        return None
    return found


@cli.command(name="estimate")
@model_options
@gpu_options
@click.option("--tensor-parallel-size", "-tp", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--pipeline-parallel-size", "-pp", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--gpu-memory-utilization", type=GPU_MEMORY_UTILIZATION,
              help="Defaults to the vLLM version's default.")
@click.option("--max-model-len", type=click.IntRange(min=1), help="Defaults to the model's maximum.")
@click.option("--quantization", help="How the weights are stored: as vLLM spells it (fp8, awq, gptq, mxfp4...).")
@click.option("--kv-cache-dtype", default="auto", show_default=True, help="auto, fp8, fp8_e4m3, fp8_e5m2.")
@click.option("--enforce-eager", is_flag=True)
@click.option("--dtype", type=DTYPE, default="auto", show_default=True, help="vLLM's --dtype.")
@click.option("--max-num-seqs", type=click.IntRange(min=1), help="Defaults to vLLM's default for the GPU.")
@click.option("--max-num-batched-tokens", type=click.IntRange(min=1), help="Defaults to vLLM's default.")
@click.option("--vllm-version", default=str(DEFAULT_VLLM_VERSION), show_default=True)
@click.option("--output", "-o", type=click.Choice(["json", "table"]), default="json", show_default=True)
def estimate_command(model: str | None, model_config: str | None, revision: str | None, gpu: str | None,
                     gpu_memory_gib: float | None, compute_capability: str, tensor_parallel_size: int,
                     pipeline_parallel_size: int, gpu_memory_utilization: float | None, max_model_len: int | None,
                     quantization: str | None, kv_cache_dtype: str, enforce_eager: bool, dtype: str,
                     max_num_seqs: int | None,
                     max_num_batched_tokens: int | None, vllm_version: str, output: str) -> None:
    """Evaluate one fixed vLLM configuration, per GPU, for the busiest GPU (stable JSON contract)."""
    architecture = _load_model(model, model_config, revision)
    spec = _load_gpu(gpu, gpu_memory_gib, compute_capability)
    behaviour = behaviour_of(VLLMVersion.parse(vllm_version))
    fmt = architecture.weight_format
    if quantization:
        if quantization.lower() not in _QUANTIZATION_FORMATS:
            fail(f"unknown --quantization {quantization!r}; known: {', '.join(sorted(_QUANTIZATION_FORMATS))}")
        fmt = _QUANTIZATION_FORMATS[quantization.lower()]
    if kv_cache_dtype.lower() not in _KV_DTYPES:
        fail(f"unknown --kv-cache-dtype {kv_cache_dtype!r}; known: {', '.join(_KV_DTYPES)}")
    defaults = behaviour.batch_defaults(spec)
    config = ServingConfig(
        model=architecture, gpu=spec, vllm=behaviour,
        tensor_parallel_size=tensor_parallel_size, pipeline_parallel_size=pipeline_parallel_size,
        gpu_memory_utilization=gpu_memory_utilization or behaviour.default_gpu_memory_utilization,
        max_model_len=max_model_len or architecture.max_position_embeddings,
        max_num_seqs=max_num_seqs or defaults.max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens or defaults.max_num_batched_tokens,
        weight_format=fmt, kv_cache_dtype=_KV_DTYPES[kv_cache_dtype.lower()], enforce_eager=enforce_eager,
        dtype=dtype,
    )
    result = estimate(config)
    if output == "json":
        click.echo(json.dumps(result.as_dict(), indent=2))
    else:
        click.echo("\n".join(memory_table(result, config.gpu_memory_utilization)))
        for problem in result.problems:
            click.echo(f"  ! {problem}")


@cli.group()
def catalog() -> None:
    """The built-in model and GPU catalogs."""


@catalog.command(name="models")
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True)
def catalog_models_command(output: str) -> None:
    """Models whose config.json ships with llm-autopilot (no Hub access needed)."""
    rows = [{
        "id": m.model_id, "parameters_b": round(total_parameters(m) / 1e9, 1), "weights": str(m.weight_format),
        "layers": m.num_layers, "kv_heads": m.num_kv_heads, "max_len": m.max_position_embeddings,
        "attention": "mla" if m.mla else ("sliding+full" if m.num_sliding_window_layers else "full"),
        "moe": f"{m.moe.num_experts}x{m.moe.experts_per_token}" if m.moe else "-",
    } for m in catalog_models()]
    if output == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"{'MODEL':<40} {'PARAMS':>7} {'WEIGHTS':<7} {'LAYERS':>6} {'KV':>4} {'MAXLEN':>7} "
               f"{'ATTENTION':<12} MOE")
    for r in rows:
        click.echo(f"{r['id']:<40} {r['parameters_b']:>6}B {r['weights']:<7} {r['layers']:>6} {r['kv_heads']:>4} "
                   f"{r['max_len']:>7} {r['attention']:<12} {r['moe']}")


@catalog.command(name="gpus")
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True)
def catalog_gpus_command(output: str) -> None:
    """GPUs the planner knows: memory, compute capability and supported formats."""
    vllm = behaviour_of(DEFAULT_VLLM_VERSION)

    def formats(g: GPUSpec) -> tuple[list[str], list[str]]:
        return ([str(f) for f in WeightFormat if g.supports_weight_format(f)],
                [str(k) for k in KVCacheDtype if vllm.supports_kv_cache_dtype(g, k)])

    if output == "json":
        click.echo(json.dumps([{
            "name": g.name, "display": g.display_name, "memory_mib": g.memory_mib,
            "torch_total_gib": round(g.total_gib, 2), "torch_total_inferred": g.total_inferred,
            "compute_capability": str(g.compute_capability),
            "weight_formats": formats(g)[0], "kv_cache_dtypes": formats(g)[1], "gfd_products": list(g.gfd_products),
        } for g in GPUS], indent=2))
        return
    click.echo(f"{'NAME':<20} {'MIB':>7} {'GIB':>8} {'CC':>5}  {'WEIGHTS':<36} KV")
    for g in GPUS:
        weights, kv = formats(g)
        total = f"{'~' if g.total_inferred else ''}{g.total_gib:.2f}"
        click.echo(f"{g.name:<20} {g.memory_mib:>7} {total:>8} {g.compute_capability!s:>5}  "
                   f"{','.join(weights):<36} {','.join(kv)}")
    click.echo("GIB: the total PyTorch reports, which vLLM multiplies by gpu_memory_utilization; "
               "~: inferred (no log of this card named it)")


@cli.command(name="operator")
@click.option("--namespace", "-n", "namespaces", multiple=True,
              help="Namespace to watch (repeatable); default: LLM_AUTOPILOT_NAMESPACES, else all.")
@click.option("--standalone/--peering", default=True, show_default=True,
              help="Run alone, or coordinate with other replicas through Kopf peering.")
@click.option("--priority", type=int, default=None,
              help="Peering priority (the highest runs). Default: derived from the pod name, so replicas differ.")
@click.option("--peering-name", default="llm-autopilot", show_default=True, help="Name of the KopfPeering object.")
@click.option("--peering-lifetime", type=click.IntRange(min=15), default=None, metavar="SECONDS",
              help="How long a replica's peering keep-alive counts, so how soon a standby takes over from a replica "
                   "that died (SIGKILL, node loss). Default: LLM_AUTOPILOT_PEERING_LIFETIME_SECONDS, else 60.")
@click.option("--liveness", default=None, help="Liveness endpoint, e.g. http://0.0.0.0:8080/healthz.")
@click.option("--log-format", type=click.Choice(["plain", "json"]), default="plain", show_default=True)
@click.option("--verbose", is_flag=True)
def operator_command(namespaces: tuple[str, ...], standalone: bool, priority: int | None, peering_name: str,
                     peering_lifetime: int | None, liveness: str | None, log_format: str, verbose: bool) -> None:
    """Run the operator: reconcile LLMDeployments (and serve the admission webhook when enabled)."""
    import kopf  # noqa: PLC0415 - the operator's dependencies load only for this command

    import llm_autopilot.controller.handlers  # noqa: F401, PLC0415 - importing registers the handlers

    settings = OperatorSettings.from_env()
    if peering_lifetime is not None:
        settings = dataclasses.replace(settings, peering_lifetime_seconds=peering_lifetime)
    watched = namespaces or settings.namespaces
    # the operator's own watches (controller/informers.py) cover the namespaces Kopf watches
    settings = dataclasses.replace(settings, namespaces=tuple(watched))
    level = logging.DEBUG if verbose else logging.INFO
    if log_format == "json":
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter())
        logging.basicConfig(level=level, handlers=[handler])
    else:
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if priority is None:  # equal priorities freeze every replica: give each its own
        priority = int(hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8], 16) % 1_000_000
    # a peering name makes peering mandatory in Kopf, so give it only when peering is wanted
    # handlers.configure (Kopf's startup) builds the Operator on these settings
    kopf.run(standalone=standalone, priority=priority, peering_name=None if standalone else peering_name,
             liveness_endpoint=liveness, clusterwide=not watched, namespaces=list(watched),
             memo=kopf.Memo(settings=settings))


class JsonFormatter(logging.Formatter):
    """One JSON object per log line, for log pipelines."""

    def format(self, record: logging.LogRecord) -> str:
        payload = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name,
                   "message": record.getMessage()}
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload)


@cli.command(name="fetch")
@click.option("--source", required=True, help="hf://org/name or s3://bucket/prefix.")
@click.option("--dest", required=True, type=click.Path(file_okay=False), help="Folder to fill (on the cache PVC).")
@click.option("--revision", default=None, help="Hub revision (hf:// only).")
@click.option("--s3-endpoint", default=None, help="S3 endpoint URL (default: AWS for the region).")
@click.option("--s3-region", default="us-east-1", show_default=True, help="Region the S3 requests are signed for.")
@click.option("--termination-log", default="/dev/termination-log", show_default=True,
              help="Where the summary is written for the pod's status (skipped when not writable).")
def fetch_command(source: str, dest: str, revision: str | None, s3_endpoint: str | None, s3_region: str,
                  termination_log: str) -> None:
    """Download a model into DEST once, resuming, checking sizes and hashes; mark it complete last.

    Credentials come from the environment: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (S3), HF_TOKEN and
    HF_ENDPOINT (the Hub). Progress: JSON lines on stdout."""
    from pathlib import Path  # noqa: PLC0415

    from llm_autopilot.api.sources import HubSource, S3Source, SourceError, parse_source  # noqa: PLC0415
    from llm_autopilot.storage import fetch  # noqa: PLC0415
    from llm_autopilot.storage.s3 import S3Client, default_endpoint  # noqa: PLC0415
    from llm_autopilot.storage.sigv4 import Credentials  # noqa: PLC0415

    try:
        where = parse_source(source)
    except SourceError as exc:
        raise click.BadParameter(str(exc), param_hint="--source") from exc
    printer = fetch.ProgressPrinter(click.echo)
    folder = Path(dest)
    if isinstance(where, S3Source):
        key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
        credentials = Credentials(key, secret, os.environ.get("AWS_SESSION_TOKEN")) if key and secret else None
        with S3Client(s3_endpoint or default_endpoint(s3_region), s3_region, credentials) as client:
            summary = fetch.fetch_s3(client, where, folder, progress=printer)
    elif isinstance(where, HubSource):
        token, endpoint = os.environ.get("HF_TOKEN") or None, os.environ.get("HF_ENDPOINT") or None
        wanted = fetch.hub_wanted(where.repo, revision, token=token, endpoint=endpoint)
        summary = fetch.fill(folder, wanted, fetch.hub_stream(where.repo, revision, token=token, endpoint=endpoint),
                             describe=lambda w: f"{where.repo}/{w.path}", progress=printer)
    else:
        raise click.BadParameter("a pvc:// source is already on a volume: nothing to fetch", param_hint="--source")
    click.echo(summary.as_json())
    with contextlib.suppress(OSError):  # not in a pod
        Path(termination_log).write_text(summary.as_json())


@cli.command(name="inspect-volume")
@click.argument("folder", type=click.Path(path_type=str))
@click.option("--termination-log", default="/dev/termination-log", show_default=True,
              help="Where the report is written for the pod's status (skipped when not writable).")
def inspect_volume_command(folder: str, termination_log: str) -> None:
    """Report what the planner needs from the model in FOLDER: config.json's planner fields, the weights' bytes.

    Prints one JSON line and writes it to the termination message; exits 2 when FOLDER holds no model that
    can be planned for (the report then says why)."""
    from pathlib import Path  # noqa: PLC0415

    from llm_autopilot.api.inspection import InspectionFailure, InspectionReport, encode  # noqa: PLC0415
    from llm_autopilot.storage.inspect import InspectError, failure, inspect_folder  # noqa: PLC0415

    report: InspectionReport | InspectionFailure
    try:
        report = inspect_folder(Path(folder))
    except InspectError as exc:
        report = failure(str(exc))
    text = encode(report)
    click.echo(text)
    with contextlib.suppress(OSError):  # not in a pod
        Path(termination_log).write_text(text)
    if isinstance(report, InspectionFailure):
        fail(report.error)


@cli.command()
def crd() -> None:
    """Print the LLMDeployment CustomResourceDefinition."""
    click.echo(render_crd(), nl=False)


def main() -> None:
    # huggingface_hub logs every retry; the CLI reports the outcome in one line instead.
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        fail("aborted")
    except click.ClickException as exc:  # usage errors: bad or missing options and values
        command = f" {exc.ctx.command_path} --help" if isinstance(exc, click.UsageError) and exc.ctx else " --help"
        fail(f"{' '.join(exc.format_message().split())} (see{command})")
    except USER_ERRORS as exc:
        fail(" ".join(str(exc).split()))  # one line, whatever the library's message looked like
    except Exception as exc:
        if os.environ.get("LLM_AUTOPILOT_DEBUG"):
            raise
        first_line = (str(exc).splitlines() or [""])[0][:300]
        click.echo(f"internal error: {type(exc).__name__}: {first_line} (set LLM_AUTOPILOT_DEBUG=1 for a traceback)",
                   err=True)
        sys.exit(EXIT_INTERNAL_ERROR)


if __name__ == "__main__":
    main()
