"""The vLLM stand-in (hack/vllm_standin.py) of the plumbing tests, and how the process kubelet picks it: by the
container image's repository. Run as the kubelet runs it (``vllm serve ...`` on the image's PATH), on hand-made
checkpoints: what vLLM's parser refuses exits 2, a missing or partial checkpoint exits 1 with the reason, and a
complete one serves vLLM's endpoints."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hack.localcluster import kubelet
from hack.localcluster.podworker import Environment, Image, StandIns, repository

VLLM = kubelet.STANDIN_BIN / "vllm"
PATH = f"{kubelet.STANDIN_BIN}:{Path(sys.executable).parent}:/usr/bin:/bin"
#: the tiny model's shape: 2 layers x 2 KV heads x head_dim 16 x K and V x 2 bytes = 256 bytes a token
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2, "max_position_embeddings": 4096,
          "torch_dtype": "bfloat16"}


def safetensors(path: Path, values: bytes = b"\1" * 16, truncate: int = 0) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [len(values) // 4], "data_offsets": [0, len(values)]}})
    data = struct.pack("<Q", len(header)) + header.encode() + values
    path.write_bytes(data[: len(data) - truncate])


def checkpoint(folder: Path, config: dict[str, Any] | None = None, name: str = "model.safetensors",
               **weights: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ("adapter_config.json" if name.startswith("adapter") else "config.json")).write_text(
        json.dumps(config if config is not None else CONFIG))
    safetensors(folder / name, **weights)
    return folder


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VLLM), *args], env={"PATH": PATH, "HOME": "/nonexistent", **(env or {})},
                          capture_output=True, text=True, timeout=60, check=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        body = response.read().decode()
    return json.loads(body) if body.startswith(("{", "[")) else body


def post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    return json.loads(text) if text.startswith("{") else text


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    started: list[subprocess.Popen[bytes]] = []

    def start(*args: str, env: dict[str, str] | None = None) -> tuple[str, float]:
        port = free_port()
        begun = time.monotonic()
        process = subprocess.Popen([str(VLLM), "serve", *args, "--port", str(port), "--host", "127.0.0.1"],
                                   env={"PATH": PATH, "HOME": str(tmp_path), **(env or {})},
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started.append(process)
        url = f"http://127.0.0.1:{port}"
        while time.monotonic() - begun < 30:
            assert process.poll() is None, "the stand-in exited"
            try:
                get(f"{url}/health")
                return url, time.monotonic() - begun
            except OSError:
                time.sleep(0.05)
        raise AssertionError("the stand-in did not answer /health in 30 s")

    yield start
    for process in started:
        process.terminate()
        process.wait(10)


# --- the kubelet's choice ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("image", "expected"), [
    ("llm-autopilot.local/vllm-stand-in:v0.32.0", "llm-autopilot.local/vllm-stand-in"),
    ("llm-autopilot.local/vllm-stand-in", "llm-autopilot.local/vllm-stand-in"),
    ("registry:5000/org/vllm", "registry:5000/org/vllm"),
    ("registry:5000/org/vllm:v1@sha256:abc", "registry:5000/org/vllm"),
    ("vllm/vllm-openai:v0.32.0", "vllm/vllm-openai")])
def test_an_images_repository_is_its_name_without_tag_or_digest(image: str, expected: str) -> None:
    assert repository(image) == expected


def test_the_stand_in_image_runs_the_stand_in_and_every_other_vllm_image_the_cpu_build() -> None:
    env = Environment(images={"": Image("/vllm/bin", None), "llm-autopilot": Image("/repo/.venv/bin", None),
                              kubelet.STANDIN_IMAGE: Image("/stand-in/bin", None)},
                      base_env={}, stand_ins=lambda pod, spec, node: StandIns())
    serve = {"command": ["vllm"], "args": ["serve", "m"]}
    assert env.image({**serve, "image": f"{kubelet.STANDIN_IMAGE}:v0.32.0"}).path == "/stand-in/bin"
    assert env.image({**serve, "image": "vllm/vllm-openai:v0.32.0"}).path == "/vllm/bin"
    assert env.image({**serve, "image": "llm-autopilot.local/vllm-stand-in-not:v1"}).path == "/vllm/bin"
    # a command of the operator's image wins over the container's image (the cache's fetch Job)
    fetch = {"command": ["llm-autopilot"], "args": ["fetch"], "image": f"{kubelet.STANDIN_IMAGE}:v0.32.0"}
    assert env.image(fetch).path == "/repo/.venv/bin"
    assert os.access(VLLM, os.X_OK)


# --- vLLM's flags and files ------------------------------------------------------------------------------------


def test_a_flag_vllms_release_does_not_have_exits_2_as_its_parser_does(tmp_path: Path) -> None:
    model = checkpoint(tmp_path / "m")
    result = run("serve", str(model), "--max-model-len", "1024", "--not-a-vllm-flag", "1")
    assert result.returncode == 2 and "unrecognized arguments: --not-a-vllm-flag" in result.stderr, result
    result = run("serve", str(model), "--max-model-len")
    assert result.returncode == 2 and "expected at least one argument" in result.stderr, result


@pytest.mark.parametrize(("case", "expected"), [
    ("no-config", "No config.json found"),
    ("no-weights", "Cannot find any model weights"),
    ("truncated", "MetadataIncompleteBuffer"),
    ("missing-shard", "No such file or directory"),
    ("not-a-folder", "Invalid repository ID or local directory")])
def test_a_missing_or_partial_checkpoint_fails_the_start_with_the_reason(tmp_path: Path, case: str,
                                                                         expected: str) -> None:
    folder = tmp_path / "m"
    if case == "no-config":
        folder.mkdir()
        safetensors(folder / "model.safetensors")
    elif case == "no-weights":
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(CONFIG))
    elif case == "truncated":
        checkpoint(folder, truncate=5)
    elif case == "missing-shard":
        checkpoint(folder, name="model-00001-of-00002.safetensors")
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
            "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    else:
        folder = tmp_path / "absent"
    result = run("serve", str(folder))
    assert result.returncode == 1 and expected in result.stderr, result


def test_a_max_model_len_above_the_kv_room_fails_as_the_cpu_build_does(tmp_path: Path) -> None:
    model = checkpoint(tmp_path / "m")
    # 1 MiB of 128-token blocks of 256 bytes: 32 blocks, 4,096 tokens; one block is vLLM's null block
    result = run("serve", str(model), "--max-model-len", "4096", "--kv-cache-memory-bytes", str(2**20 - 1))
    assert result.returncode == 1, result
    assert "the estimated maximum model length is 3840" in result.stderr, result.stderr
    assert "CPU KV cache size: 3,968 tokens" in result.stdout, result.stdout


def test_lora_flags_without_enable_lora_and_a_rank_above_the_maximum_fail(tmp_path: Path) -> None:
    model = checkpoint(tmp_path / "m")
    adapter = checkpoint(tmp_path / "a", {"r": 16, "base_model_name_or_path": "m"}, name="adapter_model.safetensors")
    result = run("serve", str(model), "--lora-modules", f"a={adapter}")
    assert result.returncode == 1 and "without --enable-lora" in result.stderr, result
    result = run("serve", str(model), "--enable-lora", "--max-lora-rank", "8", "--lora-modules", f"a={adapter}")
    assert result.returncode == 1 and "LoRA rank 16 is greater than max_lora_rank 8" in result.stderr, result


# --- serving ---------------------------------------------------------------------------------------------------


def test_a_complete_checkpoint_serves_vllms_endpoints_in_about_a_second(tmp_path: Path, serve: Any) -> None:
    model = checkpoint(tmp_path / "m")
    adapters = {name: checkpoint(tmp_path / name, {"r": 8}, name="adapter_model.safetensors", values=bytes([i]) * 16)
                for i, name in enumerate(("a1", "a2", "a3"), start=1)}
    url, seconds = serve(str(model), "--served-model-name", "org/tiny", "--max-model-len", "2048",
                         "--kv-cache-memory-bytes", str(4 * 2**20), "--enable-lora", "--max-loras", "2",
                         "--max-lora-rank", "16", "--lora-modules", f"a1={adapters['a1']}", f"a2={adapters['a2']}",
                         "--enforce-eager", env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    assert seconds < 15, seconds  # about a second; bounded for a loaded machine
    assert get(f"{url}/version") == {"version": "0.32.0"}
    cards = {m["id"]: m for m in get(f"{url}/v1/models")["data"]}
    assert set(cards) == {"org/tiny", "a1", "a2"}
    assert (cards["a1"]["root"], cards["a1"]["parent"], cards["org/tiny"]["max_model_len"]) == (
        str(adapters["a1"]), "org/tiny", 2048)
    texts = {}
    for name in ("org/tiny", "a1", "a2"):
        answer = post(f"{url}/v1/completions", {"model": name, "prompt": "The operator plans", "max_tokens": 8})
        assert answer["model"] == name and answer["usage"]["completion_tokens"] == 8, answer
        texts[name] = answer["choices"][0]["text"]
    assert len(set(texts.values())) == 3, texts  # each adapter's weights make its own text
    with pytest.raises(urllib.error.HTTPError) as unknown:
        post(f"{url}/v1/completions", {"model": "other", "prompt": "x", "max_tokens": 1})
    assert unknown.value.code == 404
    # 4 MiB of 128-token blocks of 256 bytes: 128 blocks
    exposition = get(f"{url}/metrics")
    assert 'num_gpu_blocks="128"' in exposition and 'block_size="128"' in exposition, exposition
    assert "vllm:kv_cache_usage_perc" in exposition and "vllm:num_requests_waiting" in exposition
    # runtime LoRA updates: load reads the adapter's files, unload forgets it
    assert "added successfully" in post(f"{url}/v1/load_lora_adapter",
                                        {"lora_name": "a3", "lora_path": str(adapters["a3"])})
    assert "removed successfully" in post(f"{url}/v1/unload_lora_adapter", {"lora_name": "a1"})
    assert {m["id"] for m in get(f"{url}/v1/models")["data"]} == {"org/tiny", "a2", "a3"}
    with pytest.raises(urllib.error.HTTPError) as broken:
        post(f"{url}/v1/load_lora_adapter", {"lora_name": "a4", "lora_path": str(tmp_path / "absent")})
    assert broken.value.code == 400
