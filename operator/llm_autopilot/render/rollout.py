"""How pods are replaced, and how long a new one may take to start. Pure.

**Surge.** When the GPU pool holds one more replica of the plan than are asked for, a rollout starts the new pod
first (``maxSurge: 1, maxUnavailable: 0``): the old pods serve until it is ready, so a step on a deployment that
still serves never drops it to zero. Otherwise pods are replaced one at a time (``maxSurge: 0,
maxUnavailable: 1``), and a one-replica deployment is down until the new pod is ready. The count is the pool's
(its nodes x GPUs per node, every replica sized as the new plan); GPUs other workloads hold are not counted. A
surge pod that finds no GPU stays Pending while the old pods keep serving.

**Startup probe.** Sized from the bytes of the checkpoint, not a flat 30 minutes: a fixed engine start (CUDA
graph capture, torch.compile, the KV-cache profile run), the weights read from disk at
:data:`LOAD_BYTES_PER_SECOND`, and, when the pod downloads them itself (an hf:// source without a cache),
the download at :data:`DOWNLOAD_BYTES_PER_SECOND`. Both rates are deliberately low (a network volume, a shared
uplink) so a slow node is not killed mid-load; the probe only bounds how long a pod that never becomes healthy
is kept.
"""

from __future__ import annotations

import math
from typing import Any

from llm_autopilot.planner.config import ServingConfig
from llm_autopilot.planner.pools import GPUPool, replicas_that_fit
from llm_autopilot.planner.weights import counted_checkpoint_bytes

#: safetensors from a volume into GPU memory (a network volume; local NVMe is several times faster)
LOAD_BYTES_PER_SECOND = 200 * 10**6
#: a download from the Hub or an S3 store (the issue's 200 MB/s, halved for a shared uplink)
DOWNLOAD_BYTES_PER_SECOND = 100 * 10**6
#: engine start besides reading weights: imports, CUDA graphs, torch.compile, the profile run
ENGINE_START_SECONDS = 300
#: never less: vLLM's CPU build on a busy two-core machine takes minutes for a tiny model
MIN_STARTUP_SECONDS = 600
STARTUP_PERIOD_SECONDS = 10

REPLACE = {"maxSurge": 0, "maxUnavailable": 1}
SURGE = {"maxSurge": 1, "maxUnavailable": 0}


def checkpoint_bytes(config: ServingConfig) -> int:
    """Bytes of the checkpoint served: the published size, else the planner's count."""
    return int(config.model.checkpoint_bytes or counted_checkpoint_bytes(config.model))


def startup_seconds(config: ServingConfig, *, downloads: bool) -> int:
    """How long a pod may take to become healthy: each pod loads its pipeline stage's share of the weights; a
    pod that downloads fetches the whole checkpoint."""
    total = checkpoint_bytes(config)
    seconds = ENGINE_START_SECONDS + total / config.nodes / LOAD_BYTES_PER_SECOND
    if downloads:
        seconds += total / DOWNLOAD_BYTES_PER_SECOND
    seconds = max(MIN_STARTUP_SECONDS, seconds)
    return math.ceil(seconds / STARTUP_PERIOD_SECONDS) * STARTUP_PERIOD_SECONDS


def startup_probe_failures(seconds: int) -> int:
    return max(1, seconds // STARTUP_PERIOD_SECONDS)


def can_surge(config: ServingConfig, pool: GPUPool, replicas: int) -> bool:
    """Whether the pool holds one replica more than ``replicas`` (single-node replicas on a pool seen on nodes)."""
    if pool.nodes < 1 or config.nodes > 1 or replicas < 1:
        return False
    return replicas_that_fit(config, pool) >= replicas + 1


def strategy(surge: bool) -> dict[str, Any]:
    return {"type": "RollingUpdate", "rollingUpdate": dict(SURGE if surge else REPLACE)}


def outage_note(replicas: int) -> str:
    """Added to a remediation step's Event when the rollout cannot surge."""
    if replicas <= 1:
        return ("; no free GPU for a surge pod: the only pod is replaced, so the model does not serve until the "
                "new pod is ready (an outage)")
    return ("; no free GPU for a surge pod: pods are replaced one at a time, so capacity drops by one replica "
            "during the rollout")
