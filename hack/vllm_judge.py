#!/usr/bin/env python3
"""vLLM judges llm-autopilot's plans: its own argument parser and engine-config validation, no GPU needed.

Run by the python of the CPU build of vLLM (``python3 hack/cluster.py vllm path``), never by the project's
virtual environment, which must not import vLLM. Standard library and vLLM only. It reads one JSON object on
stdin and writes one JSON object on stdout (vLLM's own log lines go to stderr)::

    {"cases": [{"id": "Qwen/Qwen3-8B@nvidia-l4",
                "args": ["/tmp/x/Qwen--Qwen3-8B", "--tensor-parallel-size", "1", ...],
                "gpu": {"name": "L4", "compute_capability": "8.9", "total_bytes": 23654318981, "count": 1}}]}

For every case, as ``vllm serve ARGS`` would: the serve parser (FlexibleArgumentParser: ``_``/``-``,
``--flag=value``, dotted keys), the positional model copied into ``model``, ``ServeSubcommand.validate``,
``AsyncEngineArgs.from_cli_args`` and ``create_engine_config()`` with the API server's usage context. The
answer per case is ``accepted`` with what vLLM's ModelConfig read (``facts``), or the ``stage`` that refused
it (``parse``, ``validate``, ``config``) with vLLM's own message.

Judging a GPU plan on a CPU. The plans are for NVIDIA GPUs, so the cases are judged by vLLM's CUDA platform
(``vllm.platforms.cuda.CudaPlatformBase``, shipped in the CPU wheel too), not by the CPU one, whose rules
(CPU quantizations and KV-cache dtypes, block size 128, no CUDA graphs, no compute capability) say nothing
about a GPU. What is not vLLM's own, all of it here:

* the hardware queries NVML would answer -- compute capability, device name, total memory, how many GPUs
  the pod sees (the plan's GPU count), NVLink -- are answered from the case's catalog GPU (``CatalogGPU``);
* the CUDA kernel libraries the CPU build lacks (``vllm._C_stable_libtorch``, ``vllm.vllm_flash_attn``) are
  stand-ins whose every function raises: checking a configuration runs no kernel, and if it did, the case
  would fail with that error instead of passing;
* vLLM's modules are imported, and model classes inspected, under the host's (CPU) platform, in a first pass
  over one case per model: CUDA code paths query kernels at import time. Every module binds one
  ``PlatformSwitch`` as ``current_platform``, so every call made while judging reaches the CUDA platform
  (``platform_leaks`` lists any module holding another platform object: the tests require none); the
  functools caches filled in that pass are emptied and the environment variables it set are restored;
* a model class is inspected in this process, where vLLM starts a fresh one (only to keep CUDA
  uninitialised in its parent; there is no CUDA here, and a fresh import per architecture costs minutes).

Everything that validates the configuration is vLLM's code: the parser, the model's config.json
(architecture, dtype against the GPU's supported dtypes, max_model_len against the derived maximum,
sliding window), parallel sizes against the heads and against the GPUs the pod sees, quantization names and
their minimum compute capability, the KV-cache dtype, the scheduler's limits and the CUDA platform's
``check_and_update_config``. Not judged: what vLLM decides only when it loads the model on a GPU (the
attention backend and the block size it may impose, memory).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
import os
import sys
import time
import types
from typing import Any, ClassVar

#: CUDA kernel libraries the CPU build does not ship, which CUDA code paths import at module level:
#: module -> (the extension that makes it real, the functions it must offer)
_CUDA_KERNELS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "vllm._C_stable_libtorch": (("vllm._C_stable_libtorch",), ()),
    "vllm.vllm_flash_attn": (("vllm.vllm_flash_attn._vllm_fa2_C", "vllm.vllm_flash_attn._vllm_fa3_C"),
                             ("flash_attn_varlen_func", "get_scheduler_metadata",
                              "compile_flash_attn_varlen_func_from_specs", "is_fa_version_supported",
                              "fa_version_unsupported_reason")),
}


def _present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


def _refusing(module: str, name: str) -> Any:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError(f"the judge has no CUDA kernels: {module}.{name} was called while checking a config")
    return refuse


def _install_kernel_stand_ins() -> list[str]:
    """A stand-in for each missing kernel library; its functions raise, so using one fails the case."""
    installed = []
    for module, (extensions, functions) in _CUDA_KERNELS.items():
        if any(_present(ext) for ext in extensions):
            continue
        stand_in = types.ModuleType(module)
        for name in functions:
            setattr(stand_in, name, _refusing(module, name))
        sys.modules[module] = stand_in
        installed.append(module)
    return installed


def _catalog_gpu_platform() -> Any:
    from vllm.platforms.cuda import CudaPlatformBase  # noqa: PLC0415
    from vllm.platforms.interface import DeviceCapability  # noqa: PLC0415

    class CatalogGPU(CudaPlatformBase):  # type: ignore[misc]
        """vLLM's CUDA platform; only what NVML would report comes from the case's catalog GPU."""

        gpu: ClassVar[dict[str, Any]] = {}

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> Any:
            major, _, minor = str(cls.gpu["compute_capability"]).partition(".")
            return DeviceCapability(int(major), int(minor or 0))

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return f"NVIDIA {cls.gpu['name']}"

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return int(cls.gpu["total_bytes"])

        @classmethod
        def device_count(cls) -> int:
            return int(cls.gpu["count"])  # the GPUs the pod requests, as CUDA_VISIBLE_DEVICES would show

        @classmethod
        def is_fully_connected(cls, device_ids: list[int]) -> bool:
            return True

    return CatalogGPU()


class PlatformSwitch:
    """The object every vLLM module binds as ``current_platform``; it answers as the active platform.

    Modules are imported, and model classes inspected, under this machine's own (CPU) platform, whose
    import-time code needs no CUDA kernels; the cases are then judged with the catalog GPU's platform.
    """

    def __init__(self, active: Any) -> None:
        object.__setattr__(self, "active", active)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "active"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "active"), name, value)


def _platform_leaks(switch: PlatformSwitch) -> list[str]:
    """Modules holding a platform object other than the switch (they would not judge with the GPU's rules)."""
    leaks = []
    for name, module in list(sys.modules.items()):
        bound = getattr(module, "__dict__", {}).get("current_platform") if module else None
        if bound is not None and bound is not switch:
            leaks.append(name)
    return leaks


def _short(error: BaseException) -> str:
    """vLLM's message without pydantic's framing."""
    text = str(error)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in lines:
        if line.startswith("Value error, "):
            return line.removeprefix("Value error, ").split(" [type=", 1)[0]
    if lines and "validation error" in lines[0] and len(lines) > 1:
        return " ".join(lines[1:3]).split(" [type=", 1)[0]
    return " ".join(lines)[:1000] or type(error).__name__


def _facts(config: Any) -> dict[str, Any]:
    model, parallel, cache = config.model_config, config.parallel_config, config.cache_config
    text = model.hf_text_config
    layer_types = getattr(text, "layer_types", None)
    window = model.get_sliding_window()
    total_layers = model.get_total_num_hidden_layers()
    if isinstance(layer_types, list | tuple):
        sliding_layers = sum(1 for t in layer_types if t == "sliding_attention")
    else:
        sliding_layers = total_layers if window else 0
    return {
        "architecture": model.architecture,
        "dtype": str(model.dtype).removeprefix("torch."),
        "head_size": model.get_head_size(),
        "use_mla": bool(model.use_mla),
        "total_num_kv_heads": model.get_total_num_kv_heads(),
        "kv_heads_per_rank": model.get_num_kv_heads(parallel),
        "attention_heads_per_rank": model.get_num_attention_heads(parallel),
        "num_layers": total_layers,
        "layers_on_first_stage": model.get_num_layers(parallel),
        "sliding_window": window if sliding_layers else None,
        "sliding_layers": sliding_layers,
        "max_model_len": model.max_model_len,
        "quantization": model.quantization,
        "tensor_parallel_size": parallel.tensor_parallel_size,
        "pipeline_parallel_size": parallel.pipeline_parallel_size,
        "world_size": parallel.world_size,
        "kv_cache_dtype": cache.cache_dtype,
        "block_size": cache.block_size,
        "gpu_memory_utilization": cache.gpu_memory_utilization,
        "max_num_seqs": config.scheduler_config.max_num_seqs,
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "enforce_eager": bool(model.enforce_eager),
    }


def _judge(parser: Any, serve: Any, case: dict[str, Any]) -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: PLC0415
    from vllm.usage.usage_lib import UsageContext  # noqa: PLC0415

    verdict: dict[str, Any] = {"id": case["id"], "accepted": False}
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            args = parser.parse_args(list(case["args"]))
    except SystemExit:  # argparse reports on stderr and exits
        message = [ln for ln in errors.getvalue().splitlines() if "error:" in ln]
        verdict.update(stage="parse", error=(message[-1].split("error: ", 1)[-1] if message
                                             else errors.getvalue().strip()[-500:]))
        return verdict
    if getattr(args, "model_tag", None) is not None:  # what `vllm serve` does with the positional model
        args.model = args.model_tag
    stage = "validate"
    try:
        serve.validate(args)
        stage = "config"
        engine_args = AsyncEngineArgs.from_cli_args(args)
        config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    except Exception as exc:  # vLLM refused: its message is the verdict
        verdict.update(stage=stage, error=_short(exc), error_type=type(exc).__name__)
        return verdict
    verdict.update(accepted=True, facts=_facts(config))
    return verdict


def _parser_options(parser: Any) -> dict[str, Any]:
    options, no_value, groups = set(), set(), []
    for action in parser._actions:
        if not action.option_strings:
            continue
        options.update(action.option_strings)
        if action.nargs == 0:
            no_value.update(action.option_strings)
        if len(action.option_strings) > 1:
            groups.append(sorted(action.option_strings))
    return {"option_strings": sorted(options), "no_value": sorted(no_value), "aliases": sorted(groups)}


def _inspect_in_process() -> None:
    """vLLM inspects a model class in a fresh python only to keep CUDA uninitialised in the parent; there
    is no CUDA here, and a fresh vLLM import per architecture would cost minutes."""
    from vllm.model_executor.models import registry  # noqa: PLC0415

    registry._run_in_subprocess = lambda fn: fn()


def _clear_caches() -> int:
    """Empty every functools cache in vLLM's modules, so that nothing decided under the host platform while
    warming up (a dtype, a backend, a capability) is reused when judging for the GPU."""
    cleared = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith("vllm") or module is None:
            continue
        for value in list(vars(module).values()):
            targets = [value, *vars(value).values()] if isinstance(value, type) else [value]
            for target in targets:
                wrapped = target.__func__ if isinstance(target, classmethod | staticmethod) else target
                if isinstance(wrapped, functools._lru_cache_wrapper):
                    wrapped.cache_clear()
                    cleared += 1
    return cleared


def main() -> int:
    started = time.monotonic()
    request = json.load(sys.stdin)
    answer = sys.stdout
    sys.stdout = sys.stderr  # vLLM logs to stdout; the answer is the only thing written there
    stand_ins = _install_kernel_stand_ins()
    import vllm.platforms  # noqa: PLC0415

    import vllm  # noqa: PLC0415

    host = vllm.platforms.current_platform
    switch = PlatformSwitch(host)
    vllm.platforms.current_platform = switch
    gpu = _catalog_gpu_platform()
    from vllm.entrypoints.cli.serve import ServeSubcommand  # noqa: PLC0415
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: PLC0415

    _inspect_in_process()
    serve = ServeSubcommand()
    parser = serve.subparser_init(FlexibleArgumentParser(prog="vllm").add_subparsers())
    # Import what the cases need (model classes, quantization and attention modules) under the host platform.
    environment = dict(os.environ)
    warm_up: dict[str, dict[str, Any]] = {}
    for case in request["cases"]:
        model = case["args"][0]
        if model not in warm_up:
            warm_up[model] = _judge(parser, serve, case)
    cleared = _clear_caches()
    os.environ.clear()
    os.environ.update(environment)  # the host platform sets some for its workers
    ready = time.monotonic()
    object.__setattr__(switch, "active", gpu)
    verdicts = []
    for case in request["cases"]:
        type(gpu).gpu = case["gpu"]
        began = time.monotonic()
        verdict = _judge(parser, serve, case)
        verdict["seconds"] = round(time.monotonic() - began, 2)
        verdicts.append(verdict)
    result = {
        "vllm_version": vllm.__version__,
        "host_platform": type(host).__name__,
        "judging_platform": f"{type(gpu).__mro__[1].__module__}.{type(gpu).__mro__[1].__name__}",
        "kernel_stand_ins": stand_ins,
        "caches_cleared": cleared,
        "platform_leaks": _platform_leaks(switch),
        "parser": _parser_options(parser),
        "host_verdicts": [{"id": v["id"], "accepted": v["accepted"], "error": v.get("error")}
                          for v in warm_up.values()],
        "verdicts": verdicts,
        "seconds": {"import_and_warm_up": round(ready - started, 1), "judging": round(time.monotonic() - ready, 1)},
    }
    json.dump(result, answer)
    answer.write("\n")
    answer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
