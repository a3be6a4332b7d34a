#!/usr/bin/env python3
"""Record what the real CPU vLLM allocates for LoRA, for the planner's golden test (``make golden-lora``).

Tiny PEFT adapters are made locally (``hack/tiny_adapters.py``: random weights, ranks 8-64, attention-only,
MLP-only, q/v-only and all-linear target sets). For each tiny model, one process (``hack/vllm_lora_probe.py``)
starts vLLM's engine once without LoRA and once per (``max_loras``, ``max_lora_rank``) with ``--enable-lora``,
all at the same KV room (``--kv-cache-memory-bytes``), and records:

- the KV tokens vLLM prints ("CPU KV cache size: N tokens"), with and without LoRA;
- the bytes of every LoRA slot tensor vLLM allocated (by wrapped module) and of the punica wrapper's tensors;
- the tokens generated greedily by the base model and by each adapter, and vLLM's refusal of an adapter whose
  rank is above ``max_lora_rank``.

The result goes to ``tests/data/vllm_cpu_lora_golden.json``, replayed by ``tests/unit/test_vllm_lora_golden.py``
through ``planner/lora.py``. About 2 minutes per engine start on a busy 2-core machine.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from localcluster import vllm_cpu

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "tests" / "data" / "vllm_cpu_lora_golden.json"
MIB = 2**20
COMMON = {"max_model_len": 2048, "kv_cache_memory_bytes": 4 * MIB, "max_num_batched_tokens": 2048,
          "max_num_seqs": 16}

#: model -> [(max_loras, max_lora_rank, adapters tried)]; (None, None) is the start without --enable-lora
CASES: dict[str, list[tuple[int | None, int | None, tuple[str, ...]]]] = {
    "tiny-llama-gqa": [(None, None, ()), (1, 8, ("gqa-r8-attn", "gqa-r16-all")),
                       (2, 16, ("gqa-r8-attn", "gqa-r16-all", "gqa-r64-mlp")),
                       (4, 64, ("gqa-r8-attn", "gqa-r16-all", "gqa-r64-mlp"))],
    "tiny-llama-mqa": [(None, None, ()), (3, 32, ("mqa-r32-qv",))],
    "tiny-llama-tied": [(None, None, ()), (2, 8, ("tied-r8-all",))],
}

_TOKENS = re.compile(r"CPU KV cache size: ([\d,]+) tokens")


def run_model(model: str, adapters: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    cases = []
    for max_loras, rank, names in CASES[model]:
        case: dict[str, Any] = {"model": f"llm-autopilot/{model}", **COMMON, "max_loras": max_loras,
                                "max_lora_rank": rank,
                                "adapters": [{k: adapters[n][k] for k in ("name", "path", "rank", "target_modules")}
                                             for n in names]}
        cases.append(case)
    env = vllm_cpu.offline_env()
    env.update({"HF_HUB_CACHE": str(vllm_cpu.models_cache()), "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"})
    started = time.monotonic()
    process = subprocess.run([str(vllm_cpu.python()), str(ROOT / "hack" / "vllm_lora_probe.py"), json.dumps(cases)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False,
                             timeout=3600)
    if process.returncode != 0:
        raise SystemExit(f"{model}: the probe failed:\n{process.stdout[-4000:]}")
    current = -1
    for line in process.stdout.splitlines():
        if line.startswith("CASE "):
            current = int(line.split()[1])
        elif match := _TOKENS.search(line):
            cases[current].update(kv_cache_tokens=int(match[1].replace(",", "")), line=line.strip())
        elif line.startswith("PROBE "):
            _, index, payload = line.split(" ", 2)
            cases[int(index)]["measured"] = json.loads(payload)
    for case in cases:
        if "kv_cache_tokens" not in case or "measured" not in case:
            raise SystemExit(f"{model}: a case lacks vLLM's KV line or the probe's result:\n{process.stdout[-4000:]}")
        if case["kv_cache_tokens"] != case["measured"]["engine_kv_tokens"]:
            raise SystemExit(f"{model}: the printed KV tokens differ from the engine's blocks: {case}")
        for adapter in case["adapters"]:
            adapter["path"] = f"<adapters>/{adapter['name']}"
    print(f"{model}: {len(cases)} engine starts in {time.monotonic() - started:.0f} s", flush=True)
    return cases


def main() -> int:
    vllm_cpu.install()
    models = {m["id"]: m for m in vllm_cpu.make_models(list(CASES))}
    adapters = {a["name"]: a for a in vllm_cpu.make_adapters()}
    records = []
    for model in CASES:
        for case in run_model(model, adapters):
            case["config"] = models[case["model"]]["config"]
            records.append(case)
    OUTPUT.write_text(json.dumps({
        "source": f"vllm-cpu {vllm_cpu.VLLM_CPU_VERSION} on this project's CPU machine; recorded by "
                  "`make golden-lora` (hack/record_vllm_lora.py)",
        "vllm_version": vllm_cpu.VLLM_CPU_VERSION, "device": "cpu", "cases": records}, indent=1) + "\n")
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
