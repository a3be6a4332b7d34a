#!/usr/bin/env python3
"""Simulated vLLM ``/metrics`` endpoints for the local cluster's Prometheus.

Pods in the local cluster (hack/cluster.py) never run anything, so nothing
exports vLLM's metrics. This server plays the metrics endpoint of any number
of simulated vLLM pods: one process, one port, one path per pod::

    GET    /metrics/<namespace>/<pod>   Prometheus text exposition (0.0.4)
    PUT    /pods/<namespace>/<pod>      create/update the pod's values (JSON)
    DELETE /pods/<namespace>/<pod>      forget the pod (and its scrape target)
    GET    /pods                        every pod's values (JSON)
    GET    /healthz                     "ok"

``PUT`` takes a JSON object; on update, omitted keys keep their value::

    {"model_name": "Qwen/Qwen2.5-7B-Instruct",   # required when creating
     "vllm_version": "0.33.0",                    # default DEFAULT_VLLM_VERSION
     "kv_cache_usage_perc": 0.97,                 # 0..1
     "num_requests_running": 12, "num_requests_waiting": 4,
     "num_preemptions_total": 7,                  # counter: a decrease is a 400
     "num_gpu_blocks": 2048, "block_size": 16, "cache_dtype": "auto",
     "gpu_memory_utilization": 0.92, "enable_prefix_caching": true,
     "engine": 0, "show_hidden_metrics": false,
     "labels": {"llmdeployment": "qwen"}}         # extra file_sd target labels

Scrape discovery: with a targets directory (``--targets-dir``), the server
keeps ``<dir>/vllm-sim-<port>.json`` (Prometheus file_sd) listing one target
per pod, labelled ``namespace``/``pod`` (as a ServiceMonitor's usual
relabelling would) with ``__metrics_path__=/metrics/<ns>/<pod>``, plus the
pod's optional ``labels`` (e.g. ``llmdeployment``, the target label the
chart's PodMonitor copies from ``app.kubernetes.io/instance``; ``container``;
``job``, which overrides the scrape job's name). The file is replaced
atomically (temporary file + rename) on every change and removed on
``stop()``. hack/cluster.py's Prometheus reads ``<state>/prometheus/
vllm-targets/*.json`` every 5 s and scrapes every 2 s.

Other scrape targets (e.g. the operator's own /metrics, for the chart's
alerts on ``up`` and ``llm_autopilot_*``): :func:`add_scrape_target` writes a
one-target file_sd file into hack/cluster.py's ``<state>/prometheus/
extra-targets`` (``cluster.py env`` exports LLM_AUTOPILOT_EXTRA_TARGETS_DIR),
:func:`remove_scrape_target` deletes it.

Metric names, types and labels follow vLLM's V1 Prometheus logger
(``vllm/v1/metrics/loggers.py``, read in the unpacked releases 0.10.2 ...
0.33.0), as exposed by ``prometheus_client``:

* gauges ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc`` with labels ``model_name`` (the served model
  name) and ``engine`` (engine index, ``"0"`` for a single engine);
* counter ``vllm:num_preemptions`` exposed as ``vllm:num_preemptions_total``
  (plus the ``vllm:num_preemptions_created`` gauge prometheus_client adds);
* info gauge ``vllm:cache_config_info`` (value 1): one label per field of
  ``CacheConfig.__dict__`` (``str()`` of each value) plus ``engine`` and no
  ``model_name``. The simulator uses the field set of 0.33.0
  (``vllm/config/cache.py``) from 0.12.0 on and that of 0.10.2 before;
  releases in between differ in rarely used fields only.

Which names each release exposes (the KV-cache usage rename: before 0.9.2
only ``vllm:gpu_cache_usage_perc``, 0.9.2-0.10.x both names, 0.11.x the new
name and the old one only with ``show_hidden_metrics``, from 0.12.0 only
``vllm:kv_cache_usage_perc``) comes from the operator's table,
``llm_autopilot.vllm.metrics``, with the sources it was read in; the default
version is the operator's ``DEFAULT_VLLM_VERSION``.

Standard library and ``llm_autopilot.vllm`` (itself standard library only,
found in ``operator/`` when the package is not installed). Run as ``python3 hack/vllm_sim.py --port N
--targets-dir DIR`` or use :class:`VllmSimulator` (``start()``/``stop()``,
server in a daemon thread) from tests.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

try:
    import llm_autopilot.vllm.metrics as vllm_metrics
except ImportError:  # run as a script outside the venv: the package's source folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
    import llm_autopilot.vllm.metrics as vllm_metrics
from llm_autopilot.vllm.metrics import Metric
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION as _DEFAULT_VERSION
from llm_autopilot.vllm.versions import VLLMVersion

Version = tuple[int, int, int]


def _as_tuple(version: VLLMVersion | None) -> Version:
    assert version is not None, "vllm/metrics.py: the KV-cache usage rows name their releases"
    return version.major, version.minor, version.patch


_KV_USAGE_NEW, _KV_USAGE_OLD = vllm_metrics.rows(Metric.KV_CACHE_USAGE)
#: First release exposing ``vllm:kv_cache_usage_perc`` (old name deprecated).
KV_CACHE_RENAME_VERSION: Version = _as_tuple(_KV_USAGE_NEW.since)
#: From this release the old name is hidden unless ``show_hidden_metrics``.
GPU_CACHE_NAME_HIDDEN_VERSION: Version = _as_tuple(_KV_USAGE_OLD.hidden_from)
#: From this release ``vllm:gpu_cache_usage_perc`` is gone.
GPU_CACHE_NAME_REMOVED_VERSION: Version = _as_tuple(_KV_USAGE_OLD.removed_in)

DEFAULT_VLLM_VERSION = str(_DEFAULT_VERSION)
CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"

# CacheConfig fields in __dict__ order (vllm/config/cache.py), in two epochs.
_CACHE_FIELDS_0_33 = (
    "block_size", "user_specified_block_size", "kv_cache_layout", "prefix_match_unit",
    "gpu_memory_utilization", "cache_dtype", "is_attention_free", "num_gpu_blocks_override",
    "sliding_window", "enable_prefix_caching", "prefix_caching_hash_algo", "prefix_cache_retention_interval",
    "kv_cache_dtype_skip_layers", "mamba_page_size_padded", "skip_page_size_padded", "mamba_block_size",
    "mamba_cache_dtype", "mamba_ssm_cache_dtype", "mamba_cache_mode", "enable_mamba_shared_prefix_checkpoint",
    "replayssm_buffer_len", "use_replayssm", "use_kda_recoverssm", "num_gpu_blocks", "num_cpu_blocks",
    "simple_cpu_offload_num_blocks", "effective_attention_block_size", "kv_cache_size_tokens",
    "kv_cache_max_concurrency", "hash_block_size", "cache_hit_alignment_tokens", "kv_sharing_fast_prefill",
    "swa_bounded_replay", "kv_cache_memory_bytes", "kv_offloading_size", "kv_offloading_backend",
)  # fmt: skip
_CACHE_FIELDS_0_10 = (
    "block_size", "gpu_memory_utilization", "swap_space", "cache_dtype", "is_attention_free",
    "num_gpu_blocks_override", "sliding_window", "enable_prefix_caching", "prefix_caching_hash_algo",
    "cpu_offload_gb", "calculate_kv_scales", "cpu_kvcache_space_bytes", "mamba_page_size_padded",
    "mamba_cache_dtype", "mamba_ssm_cache_dtype", "num_gpu_blocks", "num_cpu_blocks", "kv_sharing_fast_prefill",
    "kv_cache_memory_bytes",
)  # fmt: skip
# str() of the defaults vLLM would report for fields the simulator does not drive.
_CACHE_DEFAULTS: dict[str, str] = {
    "user_specified_block_size": "False",
    "is_attention_free": "False",
    "prefix_caching_hash_algo": "sha256",
    "prefix_cache_retention_interval": "0",
    "kv_cache_dtype_skip_layers": "[]",
    "mamba_cache_dtype": "auto",
    "mamba_ssm_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "replayssm_buffer_len": "16",
    "use_replayssm": "False",
    "use_kda_recoverssm": "False",
    "kv_sharing_fast_prefill": "False",
    "swa_bounded_replay": "True",
    "kv_offloading_backend": "native",
    "swap_space": "4",
    "cpu_offload_gb": "0",
    "calculate_kv_scales": "False",
    "num_cpu_blocks": "0",
}

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")  # DNS-1123 names (namespace, pod)
_LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")  # Prometheus label names
#: target labels the simulator sets itself
_OWN_LABELS = frozenset({"namespace", "pod", "__metrics_path__"})
_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


class SimulatorError(ValueError):
    """A bad request (HTTP 400) or an unknown pod (HTTP 404)."""

    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(message)
        self.status = status


def parse_version(version: str) -> Version:
    """``"0.33.0"``, ``"v0.9.1"``, ``"0.11.2rc1"`` -> (major, minor, patch)."""
    match = _VERSION_RE.match(version.strip())
    if not match:
        raise SimulatorError(f"bad vllm_version {version!r}")
    return int(match[1]), int(match[2]), int(match[3] or 0)


def kv_usage_metric_names(version: str, *, show_hidden_metrics: bool = False) -> list[str]:
    """The KV-cache usage gauge name(s) vLLM ``version`` exposes (``llm_autopilot.vllm.metrics``)."""
    v = VLLMVersion(*parse_version(version))
    return vllm_metrics.names(Metric.KV_CACHE_USAGE, v, show_hidden_metrics=show_hidden_metrics)


@dataclasses.dataclass
class PodMetrics:
    """The driven values of one simulated vLLM pod."""

    namespace: str
    pod: str
    model_name: str
    vllm_version: str = DEFAULT_VLLM_VERSION
    kv_cache_usage_perc: float = 0.0
    num_requests_running: int = 0
    num_requests_waiting: int = 0
    num_preemptions_total: int = 0
    num_gpu_blocks: int = 2048
    block_size: int = 16
    cache_dtype: str = "auto"
    gpu_memory_utilization: float = 0.92
    enable_prefix_caching: bool = True
    engine: int = 0
    show_hidden_metrics: bool = False
    created: float = dataclasses.field(default_factory=time.time)
    #: extra file_sd target labels (e.g. ``llmdeployment``), not part of the exposition
    labels: dict[str, str] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# key -> accepted JSON types (bool is an int in Python: checked separately)
_FIELDS: dict[str, tuple[type, ...]] = {
    "model_name": (str,),
    "vllm_version": (str,),
    "kv_cache_usage_perc": (int, float),
    "num_requests_running": (int,),
    "num_requests_waiting": (int,),
    "num_preemptions_total": (int, float),
    "num_gpu_blocks": (int,),
    "block_size": (int,),
    "cache_dtype": (str,),
    "gpu_memory_utilization": (int, float),
    "enable_prefix_caching": (bool,),
    "engine": (int,),
    "show_hidden_metrics": (bool,),
}


def _validate(values: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(values) - set(_FIELDS))
    if unknown:
        raise SimulatorError(f"unknown field(s) {unknown}; known: {sorted(_FIELDS)}")
    clean: dict[str, Any] = {}
    for key, value in values.items():
        types = _FIELDS[key]
        is_bool = isinstance(value, bool)
        if (is_bool and bool not in types) or not isinstance(value, types):
            raise SimulatorError(f"{key}: expected {'/'.join(t.__name__ for t in types)}, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise SimulatorError(f"{key}: must be finite, got {value!r}")
        if isinstance(value, int | float) and not is_bool and value < 0:
            raise SimulatorError(f"{key}: must be >= 0, got {value!r}")
        clean[key] = value
    if "kv_cache_usage_perc" in clean and clean["kv_cache_usage_perc"] > 1:
        raise SimulatorError(f"kv_cache_usage_perc is a fraction 0..1, got {clean['kv_cache_usage_perc']!r}")
    if "gpu_memory_utilization" in clean and not 0 < clean["gpu_memory_utilization"] <= 1:
        raise SimulatorError("gpu_memory_utilization must be in (0, 1]")
    if "vllm_version" in clean:
        parse_version(clean["vllm_version"])
    if "model_name" in clean and not clean["model_name"]:
        raise SimulatorError("model_name must not be empty")
    return clean


def _validate_labels(labels: Any) -> dict[str, str]:
    """Extra target labels: a JSON object of Prometheus label names to strings."""
    if not isinstance(labels, Mapping):
        raise SimulatorError(f"labels: expected an object, got {labels!r}")
    clean: dict[str, str] = {}
    for key, value in labels.items():
        if not isinstance(key, str) or not _LABEL_RE.match(key) or key.startswith("__") or key in _OWN_LABELS:
            raise SimulatorError(f"labels: bad or reserved label name {key!r}")
        if not isinstance(value, str):
            raise SimulatorError(f"labels: value of {key!r} must be a string, got {value!r}")
        clean[key] = value
    return clean


def _check_name(kind: str, name: str) -> None:
    if not _NAME_RE.match(name) or len(name) > 253:
        raise SimulatorError(f"bad {kind} name {name!r}")


def _fmt(value: float) -> str:
    """A sample value the way prometheus_client writes it (``12.0``, ``0.97``)."""
    value = float(value)
    if value == math.inf:
        return "+Inf"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:  # large values in Go's exponent notation, e.g. 1.7e+09
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _labels(labels: Mapping[str, str]) -> str:
    # prometheus_client writes labels sorted by name
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items())) + "}"


def _family(name: str, kind: str, help_text: str, labels: Mapping[str, str], value: float) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name}{_labels(labels)} {_fmt(value)}"]


def render_metrics(pod: PodMetrics) -> str:
    """Prometheus text exposition of ``pod`` as its vLLM version would serve it."""
    labels = {"model_name": pod.model_name, "engine": str(pod.engine)}
    lines: list[str] = []
    lines += _family(
        vllm_metrics.REQUESTS_RUNNING, "gauge", "Number of requests in model execution batches.",
        labels, pod.num_requests_running,
    )  # fmt: skip
    lines += _family(
        vllm_metrics.REQUESTS_WAITING, "gauge", "Number of requests waiting to be processed.",
        labels, pod.num_requests_waiting,
    )  # fmt: skip
    for name in kv_usage_metric_names(pod.vllm_version, show_hidden_metrics=pod.show_hidden_metrics):
        if name == vllm_metrics.KV_CACHE_USAGE:
            help_text = "KV-cache usage. 1 means 100 percent usage."
        elif parse_version(pod.vllm_version) >= KV_CACHE_RENAME_VERSION:
            help_text = (
                "GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use vllm:kv_cache_usage_perc instead."
            )
        else:
            help_text = "GPU KV-cache usage. 1 means 100 percent usage."
        lines += _family(name, "gauge", help_text, labels, pod.kv_cache_usage_perc)
    preempt_help = "Cumulative number of preemption from the engine."
    preemptions = vllm_metrics.PREEMPTIONS
    lines += _family(preemptions, "counter", preempt_help, labels, pod.num_preemptions_total)
    # prometheus_client's companion of a counter: <name without _total>_created
    lines += _family(preemptions.removesuffix("_total") + "_created", "gauge", preempt_help, labels, pod.created)
    lines += _family(
        vllm_metrics.CACHE_CONFIG_INFO, "gauge", "Information of the LLMEngine CacheConfig", cache_config_labels(pod), 1
    )
    return "\n".join(lines) + "\n"


def cache_config_labels(pod: PodMetrics) -> dict[str, str]:
    """Labels of ``vllm:cache_config_info``: ``str()`` of each CacheConfig field, plus ``engine``."""
    new = parse_version(pod.vllm_version) >= GPU_CACHE_NAME_REMOVED_VERSION
    fields = _CACHE_FIELDS_0_33 if new else _CACHE_FIELDS_0_10
    driven = {
        "block_size": str(pod.block_size),
        "gpu_memory_utilization": str(float(pod.gpu_memory_utilization)),
        "cache_dtype": pod.cache_dtype,
        "enable_prefix_caching": str(pod.enable_prefix_caching),
        "num_gpu_blocks": str(pod.num_gpu_blocks),
        "kv_cache_size_tokens": str(pod.num_gpu_blocks * pod.block_size),
        "effective_attention_block_size": str(pod.block_size),
        "hash_block_size": str(pod.block_size),
    }
    labels = {f: driven.get(f, _CACHE_DEFAULTS.get(f, "None")) for f in fields}
    labels["engine"] = str(pod.engine)
    return labels


class VllmSimulator:
    """The simulator: pod registry, HTTP server (in a daemon thread), file_sd file.

    Example::

        sim = VllmSimulator(targets_dir="/tmp/targets").start()
        sim.set_pod("ns", "qwen-5d8f7c9b6d-abcde", model_name="qwen", kv_cache_usage_perc=0.95)
        sim.stop()
    """

    def __init__(
        self, port: int = 0, targets_dir: str | os.PathLike[str] | None = None, host: str = "127.0.0.1"
    ) -> None:
        self._requested_port = port
        self.host = host
        self.targets_dir = Path(targets_dir) if targets_dir is not None else None
        self._pods: dict[tuple[str, str], PodMetrics] = {}
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> VllmSimulator:
        """Bind the port, write the (empty) targets file, serve in a daemon thread."""
        if self._server is not None:
            return self
        server = ThreadingHTTPServer((self.host, self._requested_port), _handler_for(self))
        server.daemon_threads = True
        self._server = server
        if self.targets_dir is not None:
            self.targets_dir.mkdir(parents=True, exist_ok=True)
        self._write_targets()
        self._thread = threading.Thread(
            target=server.serve_forever, args=(0.1,), name=f"vllm-sim-{self.port}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and remove the targets file (Prometheus then drops the targets)."""
        server, self._server = self._server, None
        if server is None:
            return
        path = self._targets_path(server)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> VllmSimulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("simulator not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def targets_file(self) -> Path | None:
        """``<targets_dir>/vllm-sim-<port>.json``, or None without a targets dir."""
        return self._targets_path(self._server) if self._server is not None else None

    def _targets_path(self, server: ThreadingHTTPServer) -> Path | None:
        if self.targets_dir is None:
            return None
        return self.targets_dir / f"vllm-sim-{server.server_address[1]}.json"

    def metrics_path(self, namespace: str, pod: str) -> str:
        return f"/metrics/{namespace}/{pod}"

    # -- pods --------------------------------------------------------------
    def set_pod(
        self, namespace: str, pod: str, labels: Mapping[str, str] | None = None, **values: Any
    ) -> PodMetrics:
        """Create or update a pod (same rules as ``PUT /pods/<ns>/<pod>``); raises SimulatorError.

        ``labels``: extra file_sd target labels of the pod (e.g. ``{"llmdeployment": "qwen"}``, as the
        chart's PodMonitor relabelling gives); None keeps the current ones (none for a new pod).
        """
        _check_name("namespace", namespace)
        _check_name("pod", pod)
        clean = _validate(values)
        if labels is not None:
            clean["labels"] = _validate_labels(labels)
        with self._lock:
            current = self._pods.get((namespace, pod))
            if current is None:
                if "model_name" not in clean:
                    raise SimulatorError("model_name is required when creating a pod")
                created = PodMetrics(namespace=namespace, pod=pod, **clean)
                self._pods[(namespace, pod)] = created
                self._write_targets()
                return dataclasses.replace(created)
            new_total = clean.get("num_preemptions_total", current.num_preemptions_total)
            if new_total < current.num_preemptions_total:
                raise SimulatorError(
                    f"num_preemptions_total is a counter: {new_total} < {current.num_preemptions_total}"
                )
            updated = dataclasses.replace(current, **clean)
            self._pods[(namespace, pod)] = updated
            if updated.labels != current.labels:
                self._write_targets()
            return dataclasses.replace(updated)

    def delete_pod(self, namespace: str, pod: str) -> bool:
        """Forget a pod; True if it existed."""
        with self._lock:
            existed = self._pods.pop((namespace, pod), None) is not None
            if existed:
                self._write_targets()
            return existed

    def get_pod(self, namespace: str, pod: str) -> PodMetrics | None:
        with self._lock:
            found = self._pods.get((namespace, pod))
            return dataclasses.replace(found) if found else None

    def pods(self) -> list[PodMetrics]:
        with self._lock:
            return [dataclasses.replace(p) for _, p in sorted(self._pods.items())]

    def render(self, namespace: str, pod: str) -> str:
        with self._lock:
            found = self._pods.get((namespace, pod))
            if found is None:
                raise SimulatorError(f"no pod {namespace}/{pod}", HTTPStatus.NOT_FOUND)
            return render_metrics(found)

    # -- file_sd -----------------------------------------------------------
    def targets(self) -> list[dict[str, Any]]:
        """The file_sd target groups: one per pod."""
        if self._server is None:
            return []
        address = f"{self.host}:{self.port}"
        with self._lock:
            return [
                {
                    "targets": [address],
                    "labels": {
                        **p.labels,
                        "namespace": ns,
                        "pod": pod,
                        "__metrics_path__": self.metrics_path(ns, pod),
                    },
                }
                for (ns, pod), p in sorted(self._pods.items())
            ]

    def _write_targets(self) -> None:
        path = self.targets_file
        if path is None:
            return
        with self._lock:
            _write_file_sd(path, self.targets())


def _write_file_sd(path: Path, groups: list[dict[str, Any]]) -> None:
    """Replace a file_sd file atomically (a reader sees the old or the new list, never half of one)."""
    data = json.dumps(groups, indent=2) + "\n"
    # the temporary name does not match Prometheus' `*.json` glob
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def add_scrape_target(
    targets_dir: str | os.PathLike[str],
    name: str,
    address: str,
    labels: Mapping[str, str] | None = None,
    metrics_path: str = "/metrics",
) -> Path:
    """Write ``<targets_dir>/<name>.json``: one file_sd target ``address`` (``host:port``) with ``labels``.

    For hack/cluster.py's ``extra`` scrape job (``<state>/prometheus/extra-targets``): ``labels`` may set
    ``job`` (target-group labels win over the job name) and ``namespace``, e.g. to mimic the chart's
    ServiceMonitor: ``add_scrape_target(dir, "operator", "127.0.0.1:8080", {"job": "llm-autopilot",
    "namespace": "llm-autopilot-system"})``. Writing the same name again replaces the target (e.g. with a
    closed port, to make it ``up == 0``). Prometheus picks the file up within its 5 s refresh.
    """
    _check_name("target", name)
    directory = Path(targets_dir)
    directory.mkdir(parents=True, exist_ok=True)
    group_labels = dict(labels or {})
    for key, value in group_labels.items():
        if not _LABEL_RE.match(key) or not isinstance(value, str):
            raise SimulatorError(f"bad target label {key}={value!r}")
    if metrics_path != "/metrics":
        group_labels["__metrics_path__"] = metrics_path
    path = directory / f"{name}.json"
    _write_file_sd(path, [{"targets": [address], "labels": group_labels}])
    return path


def remove_scrape_target(targets_dir: str | os.PathLike[str], name: str) -> bool:
    """Delete ``<targets_dir>/<name>.json``; True if it existed.

    Prometheus drops the target at its next file_sd refresh (5 s). Wait for that (``/api/v1/targets``)
    before a ``POST /-/reload``: Prometheus 2.42 restarts file_sd on reload and then keeps the targets of a
    file deleted just before, scraping them (``up == 0``) until the next change in that directory.
    """
    path = Path(targets_dir) / f"{name}.json"
    existed = path.exists()
    path.unlink(missing_ok=True)
    return existed


def _handler_for(sim: VllmSimulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "vllm-sim/1"
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: Prometheus scrapes every 2 s

        def _send(self, status: HTTPStatus, body: str, content_type: str = "application/json") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _json(self, status: HTTPStatus, payload: Any) -> None:
            self._send(status, json.dumps(payload) + "\n")

        def _route(self) -> tuple[str, str, str] | None:
            parts = [unquote(p) for p in self.path.split("?", 1)[0].strip("/").split("/")]
            if len(parts) == 3 and parts[0] in ("metrics", "pods"):
                return parts[0], parts[1], parts[2]
            return None

        def _dispatch(self) -> None:
            try:
                self._handle()
            except SimulatorError as err:
                self._json(err.status, {"error": str(err)})

        def _handle(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/")
            route = self._route()
            if self.command in ("GET", "HEAD") and path == "/healthz":
                self._send(HTTPStatus.OK, "ok\n", "text/plain; charset=utf-8")
            elif self.command == "GET" and path == "/pods":
                self._json(HTTPStatus.OK, [p.to_json() for p in sim.pods()])
            elif self.command in ("GET", "HEAD") and route and route[0] == "metrics":
                self._send(HTTPStatus.OK, sim.render(route[1], route[2]), CONTENT_TYPE_METRICS)
            elif self.command == "GET" and route and route[0] == "pods":
                found = sim.get_pod(route[1], route[2])
                if found is None:
                    raise SimulatorError(f"no pod {route[1]}/{route[2]}", HTTPStatus.NOT_FOUND)
                self._json(HTTPStatus.OK, found.to_json())
            elif self.command == "PUT" and route and route[0] == "pods":
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError as err:
                    raise SimulatorError(f"body is not JSON: {err}") from err
                if not isinstance(body, dict):
                    raise SimulatorError("body must be a JSON object")
                self._json(HTTPStatus.OK, sim.set_pod(route[1], route[2], **body).to_json())
            elif self.command == "DELETE" and route and route[0] == "pods":
                if not sim.delete_pod(route[1], route[2]):
                    raise SimulatorError(f"no pod {route[1]}/{route[2]}", HTTPStatus.NOT_FOUND)
                self._json(HTTPStatus.OK, {"deleted": f"{route[1]}/{route[2]}"})
            else:
                raise SimulatorError(f"no route {self.command} {self.path}", HTTPStatus.NOT_FOUND)

        def do_GET(self) -> None:
            self._dispatch()

        def do_HEAD(self) -> None:
            self._dispatch()

        def do_PUT(self) -> None:
            self._dispatch()

        def do_DELETE(self) -> None:
            self._dispatch()

    return Handler


@contextlib.contextmanager
def running(port: int = 0, targets_dir: str | os.PathLike[str] | None = None) -> Iterator[VllmSimulator]:
    """``with running(targets_dir=...) as sim:`` a started simulator, stopped afterwards."""
    sim = VllmSimulator(port, targets_dir).start()
    try:
        yield sim
    finally:
        sim.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument(
        "--targets-dir",
        type=Path,
        default=None,
        help="Prometheus file_sd directory, e.g. <cluster state>/prometheus/vllm-targets "
        "(`cluster.py env` exports it as LLM_AUTOPILOT_VLLM_TARGETS_DIR)",
    )
    args = parser.parse_args(argv)
    targets_dir = args.targets_dir or os.environ.get("LLM_AUTOPILOT_VLLM_TARGETS_DIR")
    sim = VllmSimulator(args.port, targets_dir).start()
    print(f"vllm-sim listening on {sim.url} (targets file: {sim.targets_file})", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
