"""The ``llm-autopilot`` console script, run as a user runs it (a subprocess), with no network.

``HF_ENDPOINT`` points at a closed port: every model here comes from the built-in catalog or a local
config, so a Hub call would fail (slowly) and show up as a failing test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import pytest

HUB_DATA = Path(__file__).resolve().parent.parent / "data" / "hub"
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"
H100 = "nvidia-h100-80gb"

#: The keys external benchmarks read from ``estimate``'s JSON.
ESTIMATE_KEYS = {
    "weights_gib", "activation_peak_gib", "non_torch_gib", "cuda_graph_gib", "kv_cache_gib",
    "kv_bytes_per_token", "kv_cache_tokens", "max_concurrency", "max_model_len_capacity", "fits",
}


def _command() -> list[str]:
    script = shutil.which("llm-autopilot", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "llm_autopilot.cli.main"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "LLM_AUTOPILOT_DEBUG", "HF_HUB_OFFLINE")}
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # closed: nothing may reach the network
    return env


@cache
def run(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI once per distinct argument list (the results are reused across tests)."""
    result = subprocess.run([*_command(), *args], capture_output=True, text=True, env=_env(), timeout=60,
                            check=False)
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    return result


def run_all(*commands: tuple[str, ...]) -> list[subprocess.CompletedProcess[str]]:
    """Several runs at once (each is mostly interpreter start-up)."""
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        return list(pool.map(lambda args: run(*args), commands))


def ok(*args: str) -> subprocess.CompletedProcess[str]:
    result = run(*args)
    assert result.returncode == 0, result.stderr
    return result


def estimate(*args: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(ok("estimate", *args).stdout)
    return data


# --- plan -----------------------------------------------------------------------------------------------


def test_plan_prints_memory_breakdown_and_command() -> None:
    out = ok("plan", "--model", LLAMA_70B, "--gpu", H100).stdout
    assert out.startswith(f"Plan for {LLAMA_70B} on ")
    assert "H100-80GB" in out
    for row in ("Memory per GPU", "weights", "activation peak", "non-torch", "CUDA graphs", "KV cache",
                "KV cache tokens", "Reasons", "Command"):
        assert row in out
    command = next(line.strip() for line in out.splitlines() if line.strip().startswith("vllm serve"))
    assert command.startswith(f"vllm serve {LLAMA_70B} ")
    assert "--max-model-len" in command


def test_plan_json_has_the_deployment_and_its_memory() -> None:
    data = json.loads(ok("plan", "--model", LLAMA_70B, "--gpu", H100, "--output", "json").stdout)
    for key in ("feasible", "model", "gpu", "gpus", "tensor_parallel_size", "quantization", "kv_cache_dtype",
                "max_model_len", "gpu_memory_utilization", "memory", "reasons", "vllm_args", "command"):
        assert key in data
    assert data["feasible"] is True
    assert data["model"] == LLAMA_70B
    assert data["gpu"] == H100
    assert data["gpus"] == data["tensor_parallel_size"] * data["pipeline_parallel_size"]
    assert data["gpus"] > 1  # 70B bf16 weights (~131 GiB) cannot fit one 80 GB GPU
    assert f"--tensor-parallel-size {data['tensor_parallel_size']}" in data["command"]
    assert data["command"].startswith("vllm serve ")
    memory = data["memory"]
    assert memory.keys() >= ESTIMATE_KEYS
    assert memory["fits"] is True
    assert memory["kv_cache_gib"] > 0
    assert memory["max_model_len_capacity"] >= data["max_model_len"]
    parts = ("weights_gib", "activation_peak_gib", "non_torch_gib", "cuda_graph_gib", "kv_cache_gib")
    assert sum(memory[p] for p in parts) == pytest.approx(memory["budget_gib"], abs=0.05)


def test_plan_yaml_output() -> None:
    out = ok("plan", "--model", LLAMA_8B, "--gpu", H100, "-o", "yaml").stdout
    assert "feasible: true" in out
    assert f"model: {LLAMA_8B}" in out


def test_infeasible_plan_names_the_smallest_change() -> None:
    result = run("plan", "--model", "meta-llama/Llama-3.1-405B", "--gpu", H100, "--max-gpus", "4")
    assert result.returncode == 1
    assert result.stdout == ""
    assert "8 x H100-80GB" in result.stderr
    assert "fp8" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_infeasible_plan_as_json() -> None:
    result = run("plan", "--model", "meta-llama/Llama-3.1-405B", "--gpu", H100, "--max-gpus", "4", "-o", "json")
    assert result.returncode == 1
    data = json.loads(result.stdout)
    assert data["feasible"] is False
    assert "8 x H100-80GB" in data["message"]
    assert data["suggestions"]


# --- estimate -------------------------------------------------------------------------------------------


def test_estimate_json_contract() -> None:
    data = estimate("--model", LLAMA_8B, "--gpu", H100)
    assert data.keys() >= ESTIMATE_KEYS
    assert data["fits"] is True
    assert data["weights_gib"] == pytest.approx(14.96, abs=0.05)  # 16,060,522,496 bytes of bf16 weights
    assert data["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2  # K and V x layers x kv heads x head dim x bf16
    assert data["kv_cache_tokens"] > 0
    assert data["max_concurrency"] > 0
    assert data["max_model_len_capacity"] == data["max_model_len"] == 131072


def test_estimate_from_a_config_folder_matches_the_catalog() -> None:
    from_folder = estimate("--model-config", str(HUB_DATA / "meta-llama--Llama-3.1-8B-Instruct"), "--gpu", H100)
    assert from_folder == estimate("--model", LLAMA_8B, "--gpu", H100)


def test_estimate_from_a_config_file(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    shutil.copy(HUB_DATA / "meta-llama--Llama-3.1-8B-Instruct" / "config.json", config)
    data = estimate("--model-config", str(config), "--gpu-memory-gib", "79.19")
    # without the index the weights are counted from the architecture: close to the published size
    assert data["weights_gib"] == pytest.approx(14.96, rel=0.02)
    assert data["fits"] is True


def test_fp8_kv_cache_doubles_the_tokens() -> None:
    auto = estimate("--model", LLAMA_8B, "--gpu", H100)
    fp8 = estimate("--model", LLAMA_8B, "--gpu", H100, "--kv-cache-dtype", "fp8")
    assert fp8["kv_bytes_per_token"] * 2 == auto["kv_bytes_per_token"]
    assert fp8["kv_cache_gib"] == auto["kv_cache_gib"]
    assert fp8["kv_cache_tokens"] == pytest.approx(2 * auto["kv_cache_tokens"], abs=32)  # whole blocks
    assert fp8["max_concurrency"] == pytest.approx(2 * auto["max_concurrency"], rel=0.01)


def test_enforce_eager_frees_the_cuda_graph_memory() -> None:
    graphs = estimate("--model", LLAMA_8B, "--gpu", H100)
    eager = estimate("--model", LLAMA_8B, "--gpu", H100, "--enforce-eager")
    assert graphs["cuda_graph_gib"] > 0
    assert eager["cuda_graph_gib"] == 0
    assert eager["kv_cache_gib"] == pytest.approx(graphs["kv_cache_gib"] + graphs["cuda_graph_gib"], abs=0.02)
    assert eager["kv_cache_tokens"] > graphs["kv_cache_tokens"]


def test_more_gpu_memory_means_more_kv_cache() -> None:
    run_all(("estimate", "--model", LLAMA_8B, "--gpu-memory-gib", "40"),
            ("estimate", "--model", LLAMA_8B, "--gpu-memory-gib", "80"))
    small = estimate("--model", LLAMA_8B, "--gpu-memory-gib", "40")
    large = estimate("--model", LLAMA_8B, "--gpu-memory-gib", "80")
    assert small["gpu_total_gib"] == 40
    assert small["weights_gib"] == large["weights_gib"]
    assert large["kv_cache_gib"] > small["kv_cache_gib"] > 0
    assert large["kv_cache_tokens"] > small["kv_cache_tokens"]


def test_fp8_weights_and_tensor_parallelism_shrink_the_weights() -> None:
    run_all(("estimate", "--model", LLAMA_8B, "--gpu", H100, "--quantization", "fp8"),
            ("estimate", "--model", LLAMA_8B, "--gpu", H100, "-tp", "2"))
    base = estimate("--model", LLAMA_8B, "--gpu", H100)
    fp8 = estimate("--model", LLAMA_8B, "--gpu", H100, "--quantization", "fp8")
    tp2 = estimate("--model", LLAMA_8B, "--gpu", H100, "-tp", "2")
    assert fp8["weights_gib"] < 0.6 * base["weights_gib"]
    assert fp8["kv_cache_gib"] > base["kv_cache_gib"]
    assert tp2["weights_gib"] == pytest.approx(base["weights_gib"] / 2, rel=0.05)
    assert tp2["kv_bytes_per_token"] * 2 == base["kv_bytes_per_token"]


def test_overdrawn_budget_does_not_fit() -> None:
    data = estimate("--model", LLAMA_8B, "--gpu-memory-gib", "17")
    assert data["fits"] is False
    assert data["kv_cache_gib"] < 0
    assert data["kv_cache_tokens"] == 0
    assert data["max_concurrency"] == 0
    assert any("overdrawn" in p for p in data["problems"])


def test_weights_larger_than_the_gpu_do_not_fit() -> None:
    data = estimate("--model", LLAMA_70B, "--gpu", H100)
    assert data["fits"] is False
    assert data["weights_gib"] > data["budget_gib"]
    assert data["kv_cache_gib"] < 0


def test_estimate_table_output() -> None:
    out = ok("estimate", "--model", LLAMA_8B, "--gpu", H100, "-o", "table").stdout
    assert "KV cache tokens" in out
    assert "budget (x 0.92)" in out


# --- catalog --------------------------------------------------------------------------------------------


def test_catalog_models() -> None:
    run_all(("catalog", "models", "-o", "json"), ("catalog", "models"))
    rows = json.loads(ok("catalog", "models", "-o", "json").stdout)
    ids = {r["id"] for r in rows}
    assert len(ids) >= 20
    assert {LLAMA_8B, LLAMA_70B, "meta-llama/Llama-3.1-405B"} <= ids
    table = ok("catalog", "models").stdout.splitlines()
    assert table[0].startswith("MODEL")
    assert len(table) - 1 == len(rows)


def test_catalog_gpus() -> None:
    run_all(("catalog", "gpus", "-o", "json"), ("catalog", "gpus"))
    rows = json.loads(ok("catalog", "gpus", "-o", "json").stdout)
    names = {r["name"] for r in rows}
    assert len(names) >= 11
    assert H100 in names
    table = ok("catalog", "gpus").stdout.splitlines()
    assert table[0].startswith("NAME") and table[-1].startswith("GIB:")
    assert len(table) - 2 == len(rows)
    # issue #30: the H200's total is the one measured on a real card; every inferred figure says so
    by_name = {r["name"]: r for r in rows}
    assert by_name["nvidia-h200-141gb"]["torch_total_gib"] == 139.8
    assert not by_name["nvidia-h200-141gb"]["torch_total_inferred"] and not by_name[H100]["torch_total_inferred"]
    inferred = {r["name"] for r in rows if r["torch_total_inferred"]}
    assert inferred == {"nvidia-a10g", "nvidia-l40s", "nvidia-b200"}
    assert {line.split()[0] for line in table[1:-1] if line.split()[2].startswith("~")} == inferred


# --- user mistakes --------------------------------------------------------------------------------------

MODEL = ("--model", LLAMA_8B)
GPU = ("--gpu", H100)


def _mistakes(tmp: Path) -> list[tuple[tuple[str, ...], str]]:
    bad_json = tmp / "bad" / "config.json"
    bad_json.parent.mkdir()
    bad_json.write_text('{"hidden_size": 4096,', encoding="utf-8")
    not_an_object = tmp / "list.json"
    not_an_object.write_text("[1, 2, 3]", encoding="utf-8")
    incomplete = tmp / "incomplete.json"
    incomplete.write_text('{"hidden_size": 4096}', encoding="utf-8")
    return [
        (("estimate", *MODEL, "--gpu", "nvidia-h900"), "unknown GPU 'nvidia-h900'"),
        (("estimate", *GPU), "exactly one of --model ID or --model-config PATH"),
        (("plan", *MODEL, "--model-config", str(incomplete), *GPU), "exactly one of --model"),
        (("estimate", *MODEL), "exactly one of --gpu NAME or --gpu-memory-gib"),
        (("estimate", *MODEL, *GPU, "--gpu-memory-gib", "80"), "exactly one of --gpu NAME or --gpu-memory-gib"),
        (("estimate", *MODEL, "--gpu-memory-gib", "0"), "--gpu-memory-gib must be positive"),
        (("estimate", *MODEL, *GPU, "--quantization", "int3"), "unknown --quantization 'int3'"),
        (("estimate", *MODEL, *GPU, "--kv-cache-dtype", "fp4"), "unknown --kv-cache-dtype 'fp4'"),
        (("plan", *MODEL, *GPU, "--allow-quantization", "fp8,int3"), "--allow-quantization takes"),
        (("plan", *MODEL, *GPU, "--variant", "awq"), "--variant takes FORMAT=ID"),
        (("estimate", "--model-config", str(tmp / "missing"), *GPU), "no config.json at"),
        (("estimate", "--model-config", str(bad_json.parent), *GPU), "cannot read"),
        (("estimate", "--model-config", str(not_an_object), *GPU), "is not a JSON object"),
        (("estimate", "--model-config", str(incomplete), *GPU), "num_hidden_layers"),
        (("estimate", *MODEL, *GPU, "--vllm-version", "latest"), "vLLM version 'latest'"),
    ]


def test_user_mistakes_get_one_line_and_exit_2(tmp_path: Path) -> None:
    mistakes = _mistakes(tmp_path)
    for (args, message), result in zip(mistakes, run_all(*(args for args, _ in mistakes)), strict=True):
        assert result.returncode == 2, args
        assert result.stdout == "", args
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, (args, result.stderr)
        assert lines[0].startswith("error: "), args
        assert message in lines[0], (args, lines[0])
        assert len(lines[0]) < 400, args


def test_unknown_option_is_a_usage_error() -> None:
    result = run("estimate", *MODEL, *GPU, "--tensor-parallel", "2")
    assert result.returncode == 2
    assert "No such option" in result.stderr
    assert result.stdout == ""


# --- nonsense input and internal errors (the review's D18/D19) ------------------------------------------

LLAMA_CONFIG = '"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, ' \
    '"num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256'


def _nonsense_configs(tmp: Path) -> list[tuple[str, str]]:
    """(config.json text, what the one-line error must say): each was planned, or crashed, before."""
    cases = [
        ('"architectures": 5', "'architectures' must be a list of class names"),  # was TypeError
        ('"num_attention_heads": 0.5', "'num_attention_heads' must be a whole number >= 1, got 0.5"),  # ZeroDivision
        ('"hidden_size": 1e400', "'hidden_size' must be a whole number >= 1, got inf"),  # was OverflowError
        ('"quantization_config": {"quant_method": "awq", "bits": [4]}', "'bits' must be a whole number"),  # TypeError
        ('"quantization_config": {"quant_method": "gptq", "group_size": "128"}', "'group_size' must be a whole"),
        ('"quantization_config": "awq"', "'quantization_config' must be an object"),
        ('"hidden_size": 16', "head_dim must be at least 1, got 0"),  # was planned: 0 KV bytes, fits true
        ('"hidden_size": 0.5', "'hidden_size' must be a whole number >= 1, got 0.5"),
        ('"num_key_value_heads": 64', "num_key_value_heads (64) exceeds num_attention_heads (32)"),
        ('"num_key_value_heads": 0', "'num_key_value_heads' must be a whole number >= 1, got 0"),  # was silently MHA
        ('"num_key_value_heads": 5', "num_attention_heads (32) is not divisible by num_key_value_heads (5)"),
        ('"torch_dtype": "int4"', "torch_dtype 'int4' is not a weight dtype"),
        ('"torch_dtype": ["bfloat16"]', "'torch_dtype' must be a dtype name"),
        ('"head_dim": -128', "'head_dim' must be a whole number >= 1, got -128"),
        ('"max_position_embeddings": -4096', "'max_position_embeddings' must be a whole number >= 1"),
        ('"tie_word_embeddings": "yes"', "'tie_word_embeddings' must be true or false"),
        ('"num_experts": 8, "num_experts_per_tok": 9, "moe_intermediate_size": 1408',
         "num_experts_per_tok (9) exceeds the 8 experts"),
        ('"num_experts": 8, "num_experts_per_tok": 2.5, "moe_intermediate_size": 1408',
         "'num_experts_per_tok' must be a whole number"),
        ('"kv_lora_rank": 512, "qk_rope_head_dim": 0, "qk_nope_head_dim": 128, "v_head_dim": 128',
         "'qk_rope_head_dim' must be a whole number >= 1, got 0"),
    ]
    result = []
    for index, (fields, message) in enumerate(cases):
        path = tmp / f"nonsense-{index}.json"
        # later keys win in json.loads, so each case overrides the valid Llama fields
        path.write_text(f"{{{LLAMA_CONFIG}, {fields}}}", encoding="utf-8")
        result.append((str(path), message))
    return result


def test_nonsense_architectures_are_user_mistakes_not_plans_or_crashes(tmp_path: Path) -> None:
    cases = _nonsense_configs(tmp_path)
    commands = [(command, "--model-config", path, *GPU) for path, _ in cases for command in ("plan", "estimate")]
    results = run_all(*commands)
    for args, result in zip(commands, results, strict=True):
        message = next(m for path, m in cases if path == args[2])
        assert result.returncode == 2, (args, result.stderr, result.stdout)
        assert result.stdout == "", args
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr)
        assert message in lines[0], (args, lines[0])


@pytest.mark.parametrize(("options", "message"), [
    (("--gpu-memory-gib", "inf"), "--gpu-memory-gib must be positive and finite"),  # was OverflowError
    (("--gpu-memory-gib", "1e300"), "--gpu-memory-gib must be positive and finite"),  # was OverflowError
    (("--gpu-memory-gib", "nan"), "--gpu-memory-gib must be positive and finite"),  # was "cannot convert NaN"
    (("--gpu-memory-gib", "-1"), "--gpu-memory-gib must be positive and finite"),
    (("--gpu-memory-gib", "80", "--compute-capability", "-1.-1"), "--compute-capability takes MAJOR.MINOR"),
    (("--gpu-memory-gib", "80", "--compute-capability", "9"), "--compute-capability takes MAJOR.MINOR"),
    (("--gpu-memory-gib", "80", "--compute-capability", "x.y"), "--compute-capability takes MAJOR.MINOR"),
    (("--gpu", H100, "--gpu-memory-utilization", "nan"), "'nan' is not a finite number"),
])
def test_nonsense_gpu_options_are_user_mistakes(options: tuple[str, ...], message: str) -> None:
    for command in ("plan", "estimate"):
        result = run(command, *MODEL, *options)
        assert result.returncode == 2, (command, options, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert message in lines[0], lines[0]


def test_usage_errors_are_one_line_too() -> None:
    result = run("estimate", *MODEL, *GPU, "--tensor-parallel", "2")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: No such option '--tensor-parallel'. (Did you mean one of: '--pipeline-parallel-size', "
        "'--tensor-parallel-size'?) (see llm-autopilot estimate --help)"]


def test_internal_errors_exit_3_with_one_line() -> None:
    """A failure that is not the user's input (here: stdout cannot be written) is told apart from a mistake
    (2) and from "no plan fits" (1)."""
    with open("/dev/full", "w", encoding="utf-8") as full:
        result = subprocess.run([*_command(), "catalog", "models", "-o", "json"], stdout=full, stderr=subprocess.PIPE,
                                text=True, env=_env(), timeout=60, check=False)
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("internal error: OSError: [Errno 28]") and "LLM_AUTOPILOT_DEBUG=1" in lines[0]


# --- plan --calibration ------------------------------------------------------------------------------------


def _calibration_files(tmp: Path) -> dict[str, Path]:
    now = datetime.now(UTC).isoformat()
    sample = {"ratio": 0.97, "time": now, "deployment": "ns/a"}
    store = {"version": 1, "entries": [{"gpuProduct": "H100-80GB", "vllmVersion": "0.33.0", "family": "llama",
                                        "samples": [sample, {**sample, "deployment": "ns/b", "ratio": 0.975}]}]}
    forged = {"version": 1, "entries": [{"gpuProduct": "H100-80GB", "vllmVersion": "0.33.0", "family": "llama",
                                         "samples": [{**sample, "ratio": 40}]}]}
    files = {"store": store, "forged": forged,
             "configmap": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
                           "data": {"calibration.json": json.dumps(store)}}}
    paths = {}
    for name, data in files.items():
        paths[name] = tmp / f"{name}.json"
        paths[name].write_text(json.dumps(data))
    paths["garbage"] = tmp / "garbage.json"
    paths["garbage"].write_bytes(b"\x00{{not: [json")
    return paths


def test_plan_reads_a_calibration_store(tmp_path: Path) -> None:
    files = _calibration_files(tmp_path)
    base = ("plan", "--model", LLAMA_8B, "--gpu", H100, "--max-model-len", "8192", "-o", "json")
    plain, store, configmap, forged, other = run_all(
        base, (*base, "--calibration", str(files["store"])), (*base, "--calibration", str(files["configmap"])),
        (*base, "--calibration", str(files["forged"])),
        (*base, "--vllm-version", "0.32.0", "--calibration", str(files["store"])))
    for result in (plain, store, configmap, forged, other):
        assert result.returncode == 0, result.stderr
    reasons = [r for r in json.loads(store.stdout)["reasons"] if r.startswith("kvCalibration")]
    assert len(reasons) == 1 and "from 2 deployments on H100-80GB with vLLM 0.33.0" in reasons[0], reasons
    assert json.loads(configmap.stdout)["reasons"] == json.loads(store.stdout)["reasons"]
    tokens = [json.loads(r.stdout)["memory"]["kv_cache_tokens"] for r in (plain, store)]
    assert tokens[1] < tokens[0]
    # a forged sample is dropped with a warning, and nothing is calibrated
    assert "sample 0 dropped: ratio must be a number in [0.5, 1.5]" in forged.stderr
    assert not any(r.startswith("kvCalibration") for r in json.loads(forged.stdout)["reasons"])
    # a store for 0.33.0 does not calibrate a plan for 0.32.0
    assert "the calibration covers vLLM 0.33.0 only" in other.stderr
    assert not any(r.startswith("kvCalibration") for r in json.loads(other.stdout)["reasons"])


def test_plan_refuses_an_unreadable_calibration_file(tmp_path: Path) -> None:
    files = _calibration_files(tmp_path)
    result = run("plan", "--model", LLAMA_8B, "--gpu", H100, "--calibration", str(files["garbage"]))
    assert result.returncode != 0 and "--calibration" in result.stderr and "cannot read it" in result.stderr
