"""A plan against what the running vLLM says about its KV cache. Pure: the shell hands in the
``cache_config_info`` sample's labels (Prometheus) or the start-up log (``pods/log``), and the time.

What vLLM prints is in vllm/startup.py. The comparison is in KV memory, in percent of one GPU's memory, because
that is the unit the plan's budget and headroom are in: a token count alone hides the bytes per token.

Tolerance (:data:`TOLERANCE_PERCENT`): 2 % of GPU memory either way. Every plan keeps at least
``BUDGET_HEADROOM`` (2 % of the budget, planner/plan.py) of KV memory unused for its own error, so a real room
smaller than predicted by more than that may not hold the plan's requests; a larger room is wasted memory the
plan could have given to a longer context or more requests. ``PlanVerified`` is False past it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from llm_autopilot.domain.precision import GIB
from llm_autopilot.planner.config import ServingConfig
from llm_autopilot.planner.kv_cache import kv_block_bytes, kv_capacity
from llm_autopilot.planner.memory import MemoryEstimate, stage_breakdown
from llm_autopilot.vllm import startup
from llm_autopilot.vllm.metrics import CACHE_CONFIG_INFO
from llm_autopilot.vllm.versions import VersionError, VLLMVersion

#: |measured - predicted| KV memory, in percent of one GPU's memory, beyond which a plan is not verified
TOLERANCE_PERCENT = 2.0
#: the condition verification sets
PLAN_VERIFIED = "PlanVerified"
#: the reasons of the PlanVerified condition
AWAITING_PODS = "AwaitingPods"
UNREADABLE = "FiguresUnreadable"
WITHIN_TOLERANCE = "WithinTolerance"
OUTSIDE_TOLERANCE = "OutsideTolerance"


class ObservationError(ValueError):
    """What vLLM gave cannot be read (no KV line, a label that is not a number...); the message says which."""


class Source(StrEnum):
    METRICS = "metrics"  # the ``cache_config_info`` sample (Prometheus)
    LOG = "log"  # the start-up log lines (pods/log)


@dataclass(frozen=True)
class Observed:
    """vLLM's own KV-cache figures for one engine (None: that release or source does not give it)."""

    source: Source
    kv_cache_tokens: int | None = None
    num_blocks: int | None = None
    block_size: int | None = None
    #: "Available KV cache memory" (to 0.01 GiB) or a ``--kv-cache-memory-bytes`` room
    kv_cache_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    cache_dtype: str | None = None


def _label_int(labels: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    value = labels.get(name)
    if value is None or value in (startup.UNSET, ""):
        return None
    if not isinstance(value, str) or not value.isdigit() or len(value) > 18:
        raise ObservationError(f"{CACHE_CONFIG_INFO} label {name}={value!r} is not a whole number")
    number = int(value)
    if number < minimum:
        raise ObservationError(f"{CACHE_CONFIG_INFO} label {name}={value!r} is below {minimum}")
    return number


def _label_fraction(labels: Mapping[str, str], name: str) -> float | None:
    value = labels.get(name)
    if value is None or value in (startup.UNSET, ""):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ObservationError(f"{CACHE_CONFIG_INFO} label {name}={value!r} is not a number") from None
    if not math.isfinite(number) or not 0 < number <= 1:
        raise ObservationError(f"{CACHE_CONFIG_INFO} label {name}={value!r} is not in (0, 1]")
    return number


def observed_from_cache_config_info(labels: Mapping[str, str]) -> Observed:
    """The figures of one ``cache_config_info`` sample; at least the block count must be there."""
    blocks = _label_int(labels, startup.LABEL_NUM_BLOCKS, minimum=1)
    if blocks is None:
        raise ObservationError(f"{CACHE_CONFIG_INFO} has no num_gpu_blocks: the engine has not sized its "
                               "KV cache yet")
    dtype = labels.get(startup.LABEL_CACHE_DTYPE)
    return Observed(
        source=Source.METRICS,
        kv_cache_tokens=_label_int(labels, startup.LABEL_KV_CACHE_TOKENS, minimum=0),
        num_blocks=blocks,
        block_size=_label_int(labels, startup.LABEL_BLOCK_SIZE, minimum=1),
        kv_cache_bytes=_label_int(labels, startup.LABEL_KV_CACHE_MEMORY_BYTES, minimum=1),
        gpu_memory_utilization=_label_fraction(labels, startup.LABEL_GPU_MEMORY_UTILIZATION),
        cache_dtype=dtype if isinstance(dtype, str) and dtype not in ("", startup.UNSET) else None,
    )


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def observed_from_log(text: str) -> Observed:
    """The figures of a start-up log: the last "KV cache size" (and blocks) line, and the smallest
    "Available KV cache memory" over the workers (vLLM sizes every worker's pool by the smallest)."""
    tokens = blocks = block_size = None
    for match in startup.KV_CACHE_SIZE.finditer(text):
        tokens = _number(match["tokens"])
        if match["blocks"]:
            blocks, block_size = _number(match["blocks"]), int(match["block_size"])
    if blocks is None:
        for match in startup.V0_BLOCKS.finditer(text):
            blocks = int(match["blocks"])
    rooms = [round(float(m["gib"]) * GIB) for m in startup.AVAILABLE_KV_MEMORY.finditer(text)]
    if tokens is None and blocks is None and not rooms:
        raise ObservationError("the log has no KV-cache line (\"KV cache size: N tokens\", \"# GPU blocks\" or "
                               "\"Available KV cache memory\"): vLLM has not finished starting")
    if (blocks is not None and blocks < 1) or (block_size is not None and block_size < 1):
        raise ObservationError(f"the log gives {blocks} blocks of {block_size} tokens")
    return Observed(source=Source.LOG, kv_cache_tokens=tokens, num_blocks=blocks, block_size=block_size,
                    kv_cache_bytes=min(rooms) if rooms else None)


@dataclass(frozen=True)
class Prediction:
    """What the plan expects vLLM to report, on the busiest GPU."""

    kv_cache_tokens: int
    num_blocks: int
    block_size: int
    kv_cache_bytes: float
    #: bytes of one block: a page of every layer of one KV-cache group
    block_bytes: int
    gpu_total_bytes: float


def predict(config: ServingConfig, estimate: MemoryEstimate) -> Prediction:
    block_bytes = kv_block_bytes(config.model, config.tensor_parallel_size, config.pipeline_parallel_size,
                                 config.kv_cache_dtype, config.block_size, model_dtype_bytes=config.dtype_bytes)
    blocks = int(max(estimate.kv_cache_bytes, 0) // block_bytes) if block_bytes else 0
    return Prediction(kv_cache_tokens=estimate.kv_cache_tokens, num_blocks=blocks, block_size=config.block_size,
                      kv_cache_bytes=max(estimate.kv_cache_bytes, 0.0), block_bytes=block_bytes,
                      gpu_total_bytes=estimate.total_bytes)


@dataclass(frozen=True)
class Verification:
    """A plan's KV cache against vLLM's: ``error_percent`` is (actual - predicted) KV memory in percent of one
    GPU's memory (positive: vLLM has more room than planned)."""

    predicted_tokens: int
    actual_tokens: int | None
    predicted_blocks: int
    actual_blocks: int | None
    predicted_kv_bytes: float
    actual_kv_bytes: float
    error_percent: float
    source: Source
    vllm_version: str
    time: datetime
    tolerance_percent: float = TOLERANCE_PERCENT

    @property
    def verified(self) -> bool:
        return abs(self.error_percent) <= self.tolerance_percent

    @property
    def ratio(self) -> float:
        """Measured / predicted KV memory: what calibration keeps (planner/calibration.py)."""
        return self.actual_kv_bytes / self.predicted_kv_bytes if self.predicted_kv_bytes > 0 else math.nan

    def condition(self) -> tuple[bool, str, str]:
        """``PlanVerified`` (status, reason, message), with both numbers."""
        if self.actual_tokens is not None:
            tokens = f"{self.actual_tokens:,} tokens of KV cache "
        elif self.actual_blocks is not None:
            tokens = f"{self.actual_blocks:,} blocks of KV cache "
        else:
            tokens = "a KV cache "
        message = (f"vLLM {self.vllm_version} reports {tokens}({self.actual_kv_bytes / GIB:.2f} GiB, "
                   f"from its {self.source}); the plan predicted {self.predicted_tokens:,} tokens "
                   f"({self.predicted_kv_bytes / GIB:.2f} GiB): {self.error_percent:+.2f} % of GPU memory, "
                   f"tolerance ±{self.tolerance_percent:g} %")
        if self.verified:
            return True, WITHIN_TOLERANCE, message
        return False, OUTSIDE_TOLERANCE, message


def verify(prediction: Prediction, observed: Observed, *, vllm_version: str, now: datetime,
           tolerance_percent: float = TOLERANCE_PERCENT) -> Verification:
    """Compare; the KV memory vLLM has is, in order of precision: its blocks x the plan's block bytes (scaled to
    vLLM's block size), its "Available KV cache memory", its tokens at the plan's bytes per token."""
    if prediction.gpu_total_bytes <= 0 or prediction.block_bytes <= 0:
        raise ObservationError("the plan has no KV cache to verify")
    if observed.num_blocks is not None:
        block_size = observed.block_size or prediction.block_size
        actual = observed.num_blocks * prediction.block_bytes * block_size / prediction.block_size
    elif observed.kv_cache_bytes is not None:
        actual = float(observed.kv_cache_bytes)
    elif observed.kv_cache_tokens is not None and prediction.kv_cache_tokens > 0:
        actual = observed.kv_cache_tokens * prediction.kv_cache_bytes / prediction.kv_cache_tokens
    else:
        raise ObservationError("vLLM's figures give neither blocks, bytes nor tokens of KV cache")
    error = (actual - prediction.kv_cache_bytes) / prediction.gpu_total_bytes * 100
    return Verification(
        predicted_tokens=prediction.kv_cache_tokens, actual_tokens=observed.kv_cache_tokens,
        predicted_blocks=prediction.num_blocks, actual_blocks=observed.num_blocks,
        predicted_kv_bytes=prediction.kv_cache_bytes, actual_kv_bytes=actual, error_percent=error,
        source=observed.source, vllm_version=vllm_version, time=now, tolerance_percent=tolerance_percent)


# ---- the decision the controller takes on what it read ---------------------------------------------------

@dataclass(frozen=True)
class PodReading:
    """What one Ready pod of the plan gave: vLLM's figures, or why neither source could be read.

    A pod of a group across nodes also names its group and rank (its pipeline stage) and gives its stage's own KV
    room, the "Available KV cache memory" of its own log (every node's first GPU prints it); only the group's
    leader (rank 0) runs the engine, so only its ``observed`` is the engine's."""

    pod: str
    observed: Observed | None = None
    problem: str = ""
    #: the version the pod's vLLM reports (its /version; None: not read)
    vllm_version: str | None = None
    group: str | None = None
    stage: int | None = None
    #: the stage's KV room in bytes, as its log gives it (None: not read, ``stage_problem`` says why)
    stage_room: int | None = None
    stage_problem: str = ""


@dataclass(frozen=True)
class Known:
    """What status.verification already holds: the plan it verified and the pods it read."""

    plan_hash: str
    pods: frozenset[str]


def pods_to_read(known: Known | None, plan_hash: str, ready: tuple[str, ...]) -> tuple[str, ...]:
    """The Ready pods of the current plan to read: none once every one of them was read for this plan (a
    plan's KV figures do not change while it runs), else all of them (so the status stays one consistent
    reading of the plan's pods)."""
    if known is not None and known.plan_hash == plan_hash and all(p in known.pods for p in ready):
        return ()
    return ready


@dataclass(frozen=True)
class StageResult:
    """One pipeline stage of one group: its own KV room against the plan's for that stage (None: not read,
    ``problem`` says why). ``bounds``: the stage whose block count vLLM gives every stage of the group."""

    pod: str
    stage: int
    prediction: Prediction
    verification: Verification | None = None
    problem: str = ""
    bounds: bool = False
    group: str = ""

    @property
    def blocks(self) -> int | None:
        """The blocks its room holds at its own block size (what vLLM compares across stages)."""
        v = self.verification
        return None if v is None else int(v.actual_kv_bytes // self.prediction.block_bytes)


@dataclass(frozen=True)
class Decision:
    """What to write. ``keep``: status.verification stays as it is; else ``results`` replace it (empty: it is
    removed). ``condition`` is PlanVerified's (status, reason, message); ``event`` goes out when the condition
    changes. For groups across nodes ``results`` are the engines (one per group, its leader's pod) and
    ``stages`` every stage read."""

    condition: tuple[bool | None, str, str]
    keep: bool = False
    results: tuple[tuple[str, Verification], ...] = ()
    event: tuple[str, str, str] | None = None
    #: the pods run another vLLM than the plan was made for (the sentence; None: the same, or not known)
    mismatch: str | None = None
    stages: tuple[StageResult, ...] = ()

    @property
    def worst(self) -> Verification | None:
        """The pod furthest from the plan: the status's figures."""
        return max((v for _, v in self.results), key=lambda v: abs(v.error_percent), default=None)


def of_the_new_release(readings: tuple[PodReading, ...], *, planned: str,
                       moving_from: str | None) -> tuple[PodReading, ...]:
    """The readings that measure the plan's release while the fleet moves from ``moving_from`` to it (a release
    change, status.canary): a change that moves no flag keeps the plan's hash, so the fleet's pods of the old release
    are Ready pods of "the plan" beside the canary (and beside the new pods while the fleet rolls). They measured the
    old engine: set aside, so the canary is judged on its own figures and its reading is the new release's sample.
    Outside a release change (``moving_from`` None, or the same release) nothing is set aside: a pod of another
    release is then a mismatch to say (a mutable tag pulled again)."""
    old, new = _release(moving_from), _release(planned)
    if old is None or old == new:
        return readings
    return tuple(r for r in readings if _release(r.vllm_version) != old)


def decide(prediction: Prediction, plan_hash: str, known: Known | None, readings: tuple[PodReading, ...], *,
           vllm_version: str, now: datetime, tolerance_percent: float = TOLERANCE_PERCENT,
           moving_from: str | None = None) -> Decision:
    """PlanVerified and status.verification from the readings of the plan's Ready pods (none: nothing was
    read this time). ``moving_from``: the release the fleet moves from (:func:`of_the_new_release`)."""
    same_plan = known is not None and known.plan_hash == plan_hash
    kept = of_the_new_release(readings, planned=vllm_version, moving_from=moving_from)
    if len(kept) < len(readings) and same_plan and known is not None and all(r.pod in known.pods for r in kept):
        # only the old release's pods were new to read (pods_to_read reads all once one is new): nothing changed
        return Decision(condition=(None, "", ""), keep=True)
    readings = kept
    if not readings:
        if same_plan:
            return Decision(condition=(None, "", ""), keep=True)
        return Decision(condition=(None, AWAITING_PODS, "no Ready pod of the current plan yet: vLLM's KV-cache "
                                                        "figures are read once one serves"))
    results: list[tuple[str, Verification]] = []
    problems: list[str] = []
    mismatch = version_mismatch(vllm_version, [r.vllm_version for r in readings])
    for reading in readings:
        if reading.observed is None:
            problems.append(f"{reading.pod}: {reading.problem}")
            continue
        try:
            results.append((reading.pod, verify(prediction, reading.observed, now=now,
                                                vllm_version=_release(reading.vllm_version) or vllm_version,
                                                tolerance_percent=tolerance_percent)))
        except ObservationError as exc:
            problems.append(f"{reading.pod}: {exc}")
    if not results:
        message = "vLLM's KV-cache figures could not be read (Prometheus, then the pod's log): " + "; ".join(
            problems)
        return Decision(condition=(None, UNREADABLE, message), keep=same_plan,
                        event=("Warning", "VerificationUnreadable", message))
    decision = Decision(condition=(None, "", ""), results=tuple(results))
    worst = decision.worst
    assert worst is not None
    verified, reason, message = worst.condition()
    if len(results) > 1:
        message = f"{len(results)} pods read, the furthest from the plan: {message}"
    if problems:
        message += f" ({len(problems)} pod(s) unreadable: {'; '.join(problems)})"
    if mismatch is not None:
        message += f"; {mismatch}"
    event = ("Normal", "PlanVerified", message) if verified else ("Warning", "PlanNotVerified", message)
    return Decision(condition=(verified, reason, message), results=tuple(results), event=event, mismatch=mismatch)


# ---- groups across nodes: one engine over pipeline stages ---------------------------------------------------

@dataclass(frozen=True)
class GroupPrediction:
    """What a plan whose replicas span nodes (one pipeline stage per node) expects of each group.

    Each stage's GPUs have their own KV room (its weights, layers and graphs differ), which that stage's pod
    prints ("Available KV cache memory", per node). vLLM then gives every stage the block count of the stage
    with the fewest (``get_kv_cache_configs``: ``min_num_blocks``, 0.32.0 and 0.33.0), so the engine's cache
    -- its ``num_gpu_blocks`` and "KV cache size" on the leader -- is that stage's: ``bound``."""

    stages: tuple[Prediction, ...]
    bound: int
    #: the engine's prediction: the bounding stage's room, blocks and block bytes, with vLLM's printed size
    engine: Prediction
    #: the bounding stage's room before a KV calibration moved it (what a calibration sample is measured against)
    uncalibrated_kv_bytes: float


def predict_group(config: ServingConfig) -> GroupPrediction:
    """Each stage's prediction (planner/memory.py ``stage_breakdown``; its block bytes from its own layers) and
    the engine's, the stage with the fewest blocks (the first of equals)."""
    m, tp, pp = config.model, config.tensor_parallel_size, config.pipeline_parallel_size
    total = float(config.gpu.total_bytes)
    stages, bounds, uncalibrated = [], [], []
    for s in stage_breakdown(config):
        block_bytes = kv_block_bytes(m, tp, pp, config.kv_cache_dtype, config.block_size, layers=s.layers,
                                     model_dtype_bytes=config.dtype_bytes)
        room = max(s.kv_cache_bytes, 0.0)
        blocks = int(room // block_bytes) if block_bytes else 0
        stages.append(Prediction(kv_cache_tokens=blocks * config.block_size, num_blocks=blocks,
                                 block_size=config.block_size, kv_cache_bytes=room, block_bytes=block_bytes,
                                 gpu_total_bytes=total))
        bounds.append(s.layers)
        uncalibrated.append(s.kv_cache_bytes - s.kv_calibration_bytes)
    bound = min(range(len(stages)), key=lambda i: stages[i].num_blocks)
    b = stages[bound]
    window = config.max_num_batched_tokens * config.vllm.in_flight_batches(pipeline_parallel_size=pp)
    printed = kv_capacity(m, tp, pp, config.kv_cache_dtype, available_bytes=b.kv_cache_bytes,
                          max_model_len=config.max_model_len, max_num_batched_tokens=window,
                          block_size=config.block_size, limit=m.max_position_embeddings,
                          reserve_null_block=config.vllm.reserves_null_block, model_dtype_bytes=config.dtype_bytes,
                          group_aware_size=config.vllm.group_aware_kv_size, layers=bounds[bound])
    engine = dataclasses.replace(b, kv_cache_tokens=printed.tokens)
    return GroupPrediction(tuple(stages), bound, engine, uncalibrated[bound])


def decide_groups(prediction: GroupPrediction, plan_hash: str, known: Known | None,
                  readings: tuple[PodReading, ...], *, vllm_version: str, now: datetime,
                  tolerance_percent: float = TOLERANCE_PERCENT) -> Decision:
    """:func:`decide` for groups across nodes: each group's engine (its leader's figures: vLLM's blocks, which
    are the bounding stage's) against the plan's bounding stage judges PlanVerified, as a replica's pod does;
    every stage's own room against the plan's for that stage is one more figure per stage, and the stage that
    bounds the cache is named (measured when every stage of the group was read, else the plan's). A group whose
    leader gave no engine figures is judged on the fewest blocks of its stages' rooms when every one was read."""
    engines: list[PodReading] = []
    stages: list[StageResult] = []
    measured = True  # every group's bound from its stages' rooms (else, for some, the plan's)
    by_group: dict[str, list[PodReading]] = {}
    for r in readings:
        by_group.setdefault(r.group if r.group is not None else f"pod {r.pod}", []).append(r)
    for name in sorted(by_group):
        members = sorted(by_group[name], key=lambda r: (r.stage is None, r.stage or 0, r.pod))
        results = [_stage_result(prediction, r, now=now, vllm_version=vllm_version,
                                 tolerance_percent=tolerance_percent) for r in members if r.stage is not None]
        read = {s.stage: s.blocks for s in results if s.blocks is not None}
        complete = sorted(read) == list(range(len(prediction.stages)))
        bound = min(read, key=lambda i: (read[i], i)) if complete else prediction.bound
        measured = measured and complete
        stages += [dataclasses.replace(s, bounds=s.stage == bound, group=name) for s in results]
        leader = next((r for r in members if r.stage in (0, None)), None)
        if leader is not None and leader.observed is not None:
            engines.append(leader)
        elif complete:  # the engine's blocks are the fewest of its stages' (vLLM's rule)
            engines.append(PodReading(members[0].pod, Observed(Source.LOG, num_blocks=min(read.values())),
                                      vllm_version=leader.vllm_version if leader else None))
        elif leader is not None:
            engines.append(leader)
    decision = decide(prediction.engine, plan_hash, known, tuple(engines), vllm_version=vllm_version, now=now,
                      tolerance_percent=tolerance_percent)
    if not stages or not decision.results:
        return dataclasses.replace(decision, stages=tuple(stages))
    status, reason, message = decision.condition
    message += "; " + stage_summary(prediction, stages, measured=measured)
    event = (decision.event[0], decision.event[1], message) if decision.event is not None else None
    return dataclasses.replace(decision, condition=(status, reason, message), event=event, stages=tuple(stages))


def _stage_result(prediction: GroupPrediction, r: PodReading, *, now: datetime, vllm_version: str,
                  tolerance_percent: float) -> StageResult:
    assert r.stage is not None
    if not 0 <= r.stage < len(prediction.stages):
        return StageResult(r.pod, r.stage, prediction.engine,
                           problem=f"rank {r.stage} is not one of the plan's {len(prediction.stages)} stages")
    planned = prediction.stages[r.stage]
    if r.stage_room is None:
        return StageResult(r.pod, r.stage, planned, problem=r.stage_problem or "no \"Available KV cache memory\" "
                                                                              "line in its log")
    v = verify(planned, Observed(Source.LOG, kv_cache_bytes=r.stage_room), now=now,
               vllm_version=_release(r.vllm_version) or vllm_version, tolerance_percent=tolerance_percent)
    return StageResult(r.pod, r.stage, planned, v)


def stage_summary(prediction: GroupPrediction, stages: list[StageResult], *, measured: bool = True) -> str:
    """The sentence on the stages: which bounds the KV cache (``measured``: from every stage's room as read;
    else the plan's for a group whose rooms were not all read), and each one's own room against the plan's."""
    bounding = sorted({s.stage for s in stages if s.bounds})
    planned = prediction.bound
    which = (f"stage {bounding[0]} bounds the KV cache (vLLM gives every stage the blocks of the stage with the "
             f"fewest)" if len(bounding) == 1 else
             f"stages {', '.join(map(str, bounding))} bound the KV cache of their groups")
    if not measured:
        which += " by the plan: not every stage's room could be read"
    if len(bounding) == 1 and prediction.stages[bounding[0]].num_blocks > prediction.stages[planned].num_blocks:
        which += f"; the plan expected stage {planned} to bound it"
    figures = ", ".join(
        f"{s.stage} {s.verification.error_percent:+.2f} %" if s.verification is not None else f"{s.stage} unread"
        for s in sorted(stages, key=lambda s: (s.stage, s.pod))[:8])
    unread = [f"{s.pod}: {s.problem}" for s in stages if s.verification is None]
    more = f" (unread: {'; '.join(unread[:3])})" if unread else ""
    return f"{which}; each stage's own room against the plan's, in % of GPU memory: {figures}{more}"


def _release(text: str | None) -> str | None:
    """The release a pod reports ("0.32.0+cpu" is 0.32.0; None: not read, or not a version)."""
    if not text:
        return None
    try:
        return str(VLLMVersion.parse(text))
    except VersionError:
        return None


def version_mismatch(planned: str, reported: list[str | None]) -> str | None:
    """The sentence when a pod's vLLM is not the release the plan was made for (its memory arithmetic, flags and
    defaults are that release's); None when every pod that said agrees, or none said."""
    running = sorted({r for r in map(_release, reported) if r is not None and r != _release(planned)})
    if not running:
        return None
    return (f"the pods run vLLM {', '.join(running)} but the plan was made for vLLM {planned}: set "
            "spec.vllm.version to the image's release (the plan's arithmetic, flags and defaults are per release)")
