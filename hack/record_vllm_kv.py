#!/usr/bin/env python3
"""Record what a real vLLM (the CPU build) prints about its KV cache, for the planner's golden tests.

For each case, ``vllm serve`` starts a tiny model (``hack/tiny_models.py``) with a given KV room
(``--kv-cache-memory-bytes``) and ``--max-model-len``, and this script reads the engine's own lines:

- ``CPU KV cache size: N tokens`` (the length fits: the KV cache's size; the process is stopped then), or
- ``... the estimated maximum model length is N ...`` (the length does not fit: vLLM's largest length).

The results go to ``tests/data/vllm_cpu_kv_golden.json``, replayed by ``tests/unit/test_vllm_kv_golden.py``
through the planner's KV arithmetic. ``make golden-vllm`` runs it (about a minute per case on 2 cores;
``--missing`` starts vLLM only for cases the file does not hold yet;
``--enforce-eager`` skips torch.compile, which does not change the KV cache's size).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from localcluster import vllm_cpu

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "tests" / "data" / "vllm_cpu_kv_golden.json"
MIB = 2**20
BATCHED_TOKENS = 2048

#: (model, KV-cache dtype, KV room in bytes, max_model_len); each length is either below or above the room
CASES: tuple[tuple[str, str, int, int], ...] = (
    ("tiny-llama-gqa", "auto", 4 * MIB, 4096),
    ("tiny-llama-gqa", "auto", 4 * MIB, 16384),
    ("tiny-llama-gqa", "auto", 3_000_000, 2048),
    ("tiny-llama-gqa", "auto", 3_000_000, 16384),
    ("tiny-llama-gqa", "fp8", 4 * MIB, 8192),
    ("tiny-llama-gqa", "fp8", 4 * MIB, 32768),
    ("tiny-llama-mqa", "auto", 4 * MIB, 8192),
    ("tiny-llama-mqa", "auto", 4 * MIB, 32768),
    ("tiny-llama-tied", "auto", 4 * MIB, 1024),
    ("tiny-llama-tied", "auto", 4 * MIB, 8192),
    ("tiny-mistral-swa", "auto", 4 * MIB, 32768),
    # issue #18's exactness gaps: a window longer than the context keeps one block more per request...
    ("tiny-phi3-longwindow", "auto", 4 * MIB, 4096),
    ("tiny-phi3-longwindow", "auto", 4 * MIB, 16384),
    # ...Gemma 2 without layer_types slides ceil(n/2) layers, and near-equal counts are grouped by the larger
    ("tiny-gemma2-9", "auto", 4 * MIB, 1024),
    ("tiny-gemma2-9", "auto", 4 * MIB, 8192),
    # ...counts 1.5x apart or more are grouped by the smaller
    ("tiny-gemma2-3f5s", "auto", 4 * MIB, 1024),
)

_TOKENS = re.compile(r"CPU KV cache size: ([\d,]+) tokens")
_ESTIMATE = re.compile(r"KV cache is needed, which is larger than the available KV cache memory.*"
                       r"estimated maximum model length is (\d+)")


def run(model: str, dtype: str, room: int, length: int, port: int) -> dict[str, Any]:
    args = [f"llm-autopilot/{model}", "--max-model-len", str(length), "--kv-cache-memory-bytes", str(room),
            "--max-num-batched-tokens", str(BATCHED_TOKENS), "--max-num-seqs", "16", "--enforce-eager",
            "--port", str(port)]
    if dtype != "auto":
        args += ["--kv-cache-dtype", dtype]
    env = vllm_cpu.offline_env()
    env.update({"HF_HUB_CACHE": str(vllm_cpu.models_cache()), "PATH": f"{vllm_cpu.home() / 'bin'}:{env['PATH']}"})
    started = time.monotonic()
    process = subprocess.Popen(["vllm", "serve", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    assert process.stdout is not None
    result: dict[str, Any] = {"model": f"llm-autopilot/{model}", "kv_cache_dtype": dtype, "kv_cache_memory_bytes": room,
                              "max_model_len": length, "max_num_batched_tokens": BATCHED_TOKENS,
                              "command": "vllm serve " + " ".join(args)}
    for line in process.stdout:
        if match := _TOKENS.search(line):
            result.update(kv_cache_tokens=int(match[1].replace(",", "")), line=line.strip())
            break
        if match := _ESTIMATE.search(line):
            result.update(estimated_max_model_len=int(match[1]), line=line.strip())
            break
    os.killpg(process.pid, 9)
    process.wait()
    result["seconds"] = round(time.monotonic() - started, 1)
    if "line" not in result:
        raise SystemExit(f"{model} {dtype} {room} {length}: vLLM printed neither line")
    return result


def _key(record: dict[str, Any]) -> tuple[str, str, int, int]:
    return (record["model"].removeprefix("llm-autopilot/"), record["kv_cache_dtype"],
            record["kv_cache_memory_bytes"], record["max_model_len"])


def main(argv: list[str]) -> int:
    """``--missing``: start vLLM only for the cases the file does not hold yet, and keep the recorded ones."""
    missing_only = argv == ["--missing"]
    if argv and not missing_only:
        print("usage: record_vllm_kv.py [--missing]", file=sys.stderr)
        return 2
    recorded: dict[tuple[str, str, int, int], dict[str, Any]] = {}
    if missing_only and OUTPUT.is_file():
        recorded = {_key(c): c for c in json.loads(OUTPUT.read_text())["cases"]}
    vllm_cpu.install()
    models = {m["id"]: m for m in vllm_cpu.make_models()}
    records = []
    for i, (model, dtype, room, length) in enumerate(CASES):
        if (model, dtype, room, length) in recorded:
            records.append(recorded[(model, dtype, room, length)])
            continue
        record = run(model, dtype, room, length, int(os.environ.get("LLM_AUTOPILOT_PORT_BASE", "18000")) + 100 + i)
        record["config"] = models[record["model"]]["config"]
        print(json.dumps({k: v for k, v in record.items() if k not in ("config", "line")}), flush=True)
        records.append(record)
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps({
        "source": f"vllm-cpu {vllm_cpu.VLLM_CPU_VERSION} on this project's CPU machine; recorded by "
                  "`make golden-vllm` (hack/record_vllm_kv.py)",
        "vllm_version": vllm_cpu.VLLM_CPU_VERSION, "block_size": 128, "cases": records}, indent=1) + "\n")
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
