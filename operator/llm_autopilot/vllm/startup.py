"""What vLLM says about its KV cache once it has started, by release: the ``vllm:cache_config_info`` labels and
the start-up log lines. Pure, standard library; planner/verify.py reads them back against a plan.

Read in the 0.32.0 and 0.33.0 wheels (and the published GPU logs of tests/data/golden_vllm_logs.json for the
older forms). A release that renames a label or rewords a line changes this file only.

* ``vllm:cache_config_info`` (``v1/metrics/loggers.py::log_metrics_info``): a gauge at 1 whose labels are
  ``CacheConfig.metrics_info()``, ``{field: str(value)}`` for every field of ``CacheConfig`` (config/cache.py),
  plus ``engine``. After start-up ``num_gpu_blocks`` is the pool's block count (set in ``v1/engine/core.py``),
  ``block_size`` its tokens per block, ``kv_cache_size_tokens`` the printed size (``update_kv_cache_capacity``,
  ``v1/core/kv_cache_utils.py``; 0.32.0 and 0.33.0), ``gpu_memory_utilization``, ``cache_dtype`` and
  ``kv_cache_memory_bytes`` (``None`` unless set). An unset field is the string ``"None"``.
* "Available KV cache memory: X GiB" (``v1/worker/gpu_worker.py::determine_available_memory``), X rounded to
  0.01 GiB (``utils/mem_utils.py::format_gib``); one line per worker, prefixed ``(Worker_PP0)`` etc. with
  several.
* "GPU KV cache size: N tokens" (``v1/core/kv_cache_utils.py::update_kv_cache_capacity``; the device name is
  ``CPU`` on the CPU build, ``GPU + host`` with HiSparse); 0.11 added "(B blocks x S tokens/block)".
* "# GPU blocks: N, # CPU blocks: M": the V0 engine's line (0.10 and older).
"""

from __future__ import annotations

import re

#: the ``vllm:cache_config_info`` labels verification reads
LABEL_NUM_BLOCKS = "num_gpu_blocks"
LABEL_BLOCK_SIZE = "block_size"
LABEL_KV_CACHE_TOKENS = "kv_cache_size_tokens"
LABEL_GPU_MEMORY_UTILIZATION = "gpu_memory_utilization"
LABEL_CACHE_DTYPE = "cache_dtype"
LABEL_KV_CACHE_MEMORY_BYTES = "kv_cache_memory_bytes"
LABEL_ENGINE = "engine"
#: how ``str(None)`` prints an unset CacheConfig field
UNSET = "None"

#: an optional ``(Worker_PP1)`` / ``(EngineCore pid=12) `` prefix names the worker that printed a line
_WORKER = r"(?:\((?P<worker>Worker[^)]*)\)\s*)?"
AVAILABLE_KV_MEMORY = re.compile(_WORKER + r"Available KV cache memory: (?P<gib>\d+(?:\.\d+)?) GiB")
KV_CACHE_SIZE = re.compile(
    r"(?P<device>\b[A-Z]+(?: \+ host)?) KV cache size: (?P<tokens>\d[\d,]*) tokens"
    r"(?: \((?P<blocks>\d[\d,]*) blocks x (?P<block_size>\d+) tokens/block\))?")
#: the device word is bounded and starts at a word boundary: an unbounded ``[A-Za-z]+`` backtracks over every
#: start of a long run of letters (quadratic: a 512 KiB log of one "word" took minutes)
V0_BLOCKS = re.compile(r"#?\s*\b(?P<device>[A-Za-z]{1,16}) blocks: (?P<blocks>\d+), # CPU blocks: \d+")
#: the precision of "Available KV cache memory": format_gib rounds to 0.01 GiB
AVAILABLE_KV_MEMORY_STEP_GIB = 0.01
