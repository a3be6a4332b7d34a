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

**A learned probe.** Once the operator has observed vLLM start for the same image, model and GPU product
(planner/start_times.py, kept in the calibration store), the probe is :func:`probe_budget`:
``max(floor, ceil(LEARNED_MULTIPLIER x median))`` of those starts, plus the download estimate for a pod that
downloads, never above the formula. The median of the last few starts (the higher middle one for an even count) is
robust: one slow first start on a cold node does not make every later probe slack, and it leaves the store after
:data:`~llm_autopilot.planner.start_times.STARTS_KEPT` newer ones. The formula stays the ceiling: every observed
start ran under it (a start past its probe is killed, never observed), so nothing measured speaks for a longer one,
and a slow cold first start is never cut by a learned value. The value is fixed per plan
(desired/startup_probe.py): learning alone never changes a running pod template.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
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


#: a learned probe is this many times the median observed start: a cold compile cache adds about half a warm
#: start (vllm#47356: 21-27 s on a 44 s start), a busy node or a shared volume as much again; 3x covers both
#: while a start that hangs is still failed well before the formula's deliberately slow bandwidths would
LEARNED_MULTIPLIER = 3.0
#: the default floor of a learned probe (the operator's LLM_AUTOPILOT_STARTUP_PROBE_FLOOR_SECONDS): the real CPU
#: vLLM on the loaded 2-core CI machine is given 420 s to start (tests/e2e/real_vllm.py START_SECONDS)
DEFAULT_LEARNED_FLOOR_SECONDS = 420


def download_seconds(config: ServingConfig) -> float:
    """The formula's download estimate of the whole checkpoint."""
    return checkpoint_bytes(config) / DOWNLOAD_BYTES_PER_SECOND


def _whole_periods(seconds: float) -> int:
    return max(1, math.ceil(seconds / STARTUP_PERIOD_SECONDS)) * STARTUP_PERIOD_SECONDS


@dataclass(frozen=True)
class ProbeBudget:
    """The startup probe's length and why: the formula's first guess, or learned from ``starts`` observed."""

    seconds: int
    formula_seconds: int
    #: how many observed starts it was learned from (0: the formula)
    starts: int = 0
    median_seconds: float | None = None

    @property
    def message(self) -> str:
        if not self.starts or self.median_seconds is None:
            return f"the first guess: {self.formula_seconds} s from the checkpoint's size (no start observed yet)"
        plural = "start" if self.starts == 1 else "starts"
        how = ("capped at the first guess" if self.seconds == self.formula_seconds
               else f"the first guess was {self.formula_seconds} s")
        return (f"learned from {self.starts} observed {plural} (median {self.median_seconds:.0f} s): "
                f"{self.seconds} s; {how}")


def probe_budget(formula: int, starts: Sequence[float], *, floor: int, download: float = 0.0) -> ProbeBudget:
    """The probe for a plan whose formula gives ``formula`` seconds, from the starts observed for its image, model
    and GPU product (``download``: the estimate added for a pod that downloads its weights, which the observed
    starts, all from pods that did not, leave out). Never below ``floor`` nor above the formula."""
    if not starts:
        return ProbeBudget(formula, formula)
    median = float(statistics.median_high(starts))
    learned = max(float(floor), LEARNED_MULTIPLIER * median + download)
    return ProbeBudget(min(formula, _whole_periods(learned)), formula, len(starts), round(median, 1))


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
