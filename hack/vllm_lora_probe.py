#!/usr/bin/env python3
"""One start of the real CPU vLLM with (or without) ``--enable-lora``: what it allocates for the adapter slots.

Runs in the CPU vLLM's environment, started by ``hack/record_vllm_lora.py`` (``make golden-lora``), with the
engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that a function can walk the worker's model.
Reads, from vLLM's own objects after start-up:

- every tensor the LoRA wrappers hold (``*WithLoRA`` modules: their ``lora_*`` attributes), by wrapped module;
- the punica wrapper's tensors (``LoRAModelManager.punica_wrapper_mapping``) and its class;
- the LoRA dtype and the model's dtype;

then generates a few tokens greedily with the base model and with each adapter given (``LoRARequest``), and
tries the adapters that must be refused (rank above ``max_lora_rank``), recording vLLM's error. vLLM prints
its KV cache line ("CPU KV cache size: N tokens") on its log; the recorder reads that from this process's output.
Several cases (one engine each, one after the other) in one process: the imports are paid once. Prints
``CASE i`` before case i's engine starts and ``PROBE i {json}`` once it is measured.

    python hack/vllm_lora_probe.py '[{"model": ..., "max_loras": 2, "max_lora_rank": 16, "adapters": [...]}]'
"""

from __future__ import annotations

import json
import sys
from typing import Any

PROMPT = "The operator plans vLLM settings"


def _walk(worker: Any) -> dict[str, Any]:
    import torch  # noqa: PLC0415

    runner = worker.model_runner
    model = runner.model
    by_class: dict[str, int] = {}
    modules: dict[str, int] = {}
    seen: set[int] = set()
    lora_dtype = None
    for name, module in model.named_modules():
        cls = type(module).__name__
        if not cls.endswith("WithLoRA"):
            continue
        total = 0
        for attr, value in vars(module).items():
            if not attr.startswith("lora_") and attr not in ("embeddings_tensors",):
                continue
            values = value if isinstance(value, (list, tuple)) else [value]
            for t in values:
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                    seen.add(t.untyped_storage().data_ptr())
                    total += t.untyped_storage().nbytes()
                    lora_dtype = str(t.dtype)
        modules[name] = total
        by_class[cls] = by_class.get(cls, 0) + total
    manager = runner.lora_manager._adapter_manager
    punica: dict[str, Any] = {}
    for key, wrapper in manager.punica_wrapper_mapping.items():
        nbytes = 0
        tensors = []
        stack = list(vars(wrapper).items())
        while stack:
            attr, value = stack.pop()
            if isinstance(value, torch.Tensor):
                if value.untyped_storage().data_ptr() not in seen:
                    seen.add(value.untyped_storage().data_ptr())
                    nbytes += value.untyped_storage().nbytes()
                    tensors.append([attr, list(value.shape), str(value.dtype)])
            elif hasattr(value, "__dict__") and type(value).__module__.startswith("vllm.lora"):
                stack += [(f"{attr}.{k}", v) for k, v in vars(value).items()]
        punica[key] = {"class": type(wrapper).__name__, "bytes": nbytes, "tensors": sorted(tensors)}
    return {"slot_bytes": sum(modules.values()), "by_class": by_class, "modules": modules, "punica": punica,
            "lora_dtype": lora_dtype, "model_dtype": str(runner.model_config.dtype),
            "max_num_batched_tokens": runner.scheduler_config.max_num_batched_tokens,
            "max_num_seqs": runner.scheduler_config.max_num_seqs}


def probe(llm_class: Any, case: dict[str, Any]) -> dict[str, Any]:
    from vllm.lora.request import LoRARequest  # noqa: PLC0415

    from vllm import SamplingParams  # noqa: PLC0415

    lora = case.get("max_loras") is not None
    kwargs: dict[str, Any] = {"model": case["model"], "max_model_len": case["max_model_len"],
                              "kv_cache_memory_bytes": case["kv_cache_memory_bytes"],
                              "max_num_batched_tokens": case["max_num_batched_tokens"],
                              "max_num_seqs": case["max_num_seqs"], "enforce_eager": True, "seed": 0}
    if lora:
        kwargs.update(enable_lora=True, max_loras=case["max_loras"], max_lora_rank=case["max_lora_rank"])
    llm = llm_class(**kwargs)
    cache = llm.llm_engine.vllm_config.cache_config
    result: dict[str, Any] = {"engine_kv_tokens": (cache.num_gpu_blocks or 0) * (cache.block_size or 0)}
    if lora:
        result.update(llm.collective_rpc(_walk)[0])
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    outputs = {"base": list(llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0].token_ids)}
    refused = {}
    for i, adapter in enumerate(case.get("adapters", []), start=1):
        request = LoRARequest(adapter["name"], i, adapter["path"])
        try:
            out = llm.generate([PROMPT], params, lora_request=request, use_tqdm=False)
            outputs[adapter["name"]] = list(out[0].outputs[0].token_ids)
        except Exception as e:
            refused[adapter["name"]] = f"{type(e).__name__}: {e}"
    result.update(outputs=outputs, refused=refused)
    llm.llm_engine.engine_core.shutdown()
    return result


def main(argv: list[str]) -> int:
    import gc  # noqa: PLC0415

    from vllm import LLM  # noqa: PLC0415
    from vllm import logger as vllm_logger  # noqa: PLC0415

    for i, case in enumerate(json.loads(argv[0])):
        # vLLM prints its KV cache line with info_once: each engine of this process must print its own
        vllm_logger._print_info_once.cache_clear()
        print(f"CASE {i}", flush=True)
        result = probe(LLM, case)
        print(f"PROBE {i} " + json.dumps(result), flush=True)
        gc.collect()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
