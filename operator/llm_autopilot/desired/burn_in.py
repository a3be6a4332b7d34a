"""The burn-in before traffic: which bounded load a new pod is given, and what its measurement means. Pure.

A pod of a plan with a burn-in has a readiness gate (domain/burn_in.py ``BURN_IN_GATE``), so no Service sends
it traffic until the operator has run the load on the pod's own IP (controller/burn_in_load.py) and judged it
here. The load is the plan's worst case the spec asks to hold: ``requests`` prompts near max_model_len at
once (never more than max_num_seqs, which vLLM would queue whatever the KV room), each with a short output,
bounded in time and in tokens. A KV cache too small for that shows as vLLM's own preemptions, or a full cache
with requests waiting; that failure is remediation evidence (the KV-saturation signal) before any user sees
it. A request that fails or a run out of time fails the burn-in without being a memory signal (an OOM kill
during the run is the pod's termination, which remediation reads from the pod status).

Burn-in's words live here too -- its ask, its reading, its effects -- for its section (desired/sections/burn_in.py)
and its shell (controller/features/burn_in.py), which may not import a section.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from llm_autopilot.api.status import BurnInStatus
from llm_autopilot.desired.status_fields import StatusField
from llm_autopilot.domain.burn_in import BURN_IN_GATE, FULL_KV_USAGE, BurnInLoad, BurnInMeasurement
from llm_autopilot.planner.config import ServingConfig
from llm_autopilot.remediation.classify import Classification, Signal

#: status.burnIn, as this feature decides it
BURN_IN = StatusField[BurnInStatus]("burn_in")

BURN_IN_PASSED = "BurnInPassed"
#: token ids are drawn from the first ids of the vocabulary (every tokenizer has them)
PROMPT_VOCAB = 1000


# ---- burn-in's words: its ask, its reading, its effects (controller/features/burn_in.py reads and executes) ----

@dataclass(frozen=True)
class BurnInAsk:
    """The plan whose pods' burn-in to read (their gate condition, and what the operator's runs measured)."""

    namespace: str
    name: str
    plan_hash: str


@dataclass(frozen=True)
class PodBurnIn:
    """One pod of the plan in force as the burn-in sees it: whether its containers are ready (the load can
    start), its gate condition (None: not written yet), and what the operator's run measured (None: none yet)."""

    pod: str
    uid: str
    ip: str | None
    containers_ready: bool
    gate: bool | None
    measurement: BurnInMeasurement | None = None
    running: bool = False
    #: a pod of a group across nodes: its group and its rank (0: the leader, which serves the API)
    group: str | None = None
    rank: int | None = None
    #: when the pod's vLLM container was last OOM-killed (None: never), as the kubelet recorded it
    oom_killed_at: datetime | None = None


@dataclass(frozen=True)
class BurnInReading:
    """The burn-in of the plan ``plan_hash``'s pods (controller/burn_in_load.py runs it)."""

    plan_hash: str
    pods: tuple[PodBurnIn, ...] = ()


@dataclass(frozen=True)
class BurnInStart:
    """A burn-in run to start on a pod (controller/burn_in_load.py), on its own IP."""

    uid: str
    ip: str
    load: BurnInLoad


@dataclass(frozen=True)
class BurnInKeep:
    """The pods (uids) whose burn-in runs the operator still needs: the plan in force's whose verdict the status
    does not record yet; the object's other runs are dropped."""

    uids: tuple[str, ...]


@dataclass(frozen=True)
class BurnInGateWrite:
    """The burn-in's readiness-gate condition to write on a pod (its status, strategic merge by type)."""

    pod: str
    condition: dict[str, Any]


# ---- the load and its judgement ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BurnInSettings:
    """The load's bounds (spec.verification.burnIn)."""

    #: requests sent at once (the spec's expectedConcurrency; at most the plan's max_num_seqs)
    concurrency: int = 1
    #: tokens generated per request: short, the load is about the KV room the prompts take
    max_tokens: int = 16
    #: the whole run's time limit
    timeout_seconds: float = 300.0
    #: the most tokens (prompts and outputs) one run may cost; prompts are shortened to stay within it
    max_total_tokens: int = 2_000_000


def load_for(config: ServingConfig, *, model: str, port: int, settings: BurnInSettings) -> BurnInLoad:
    """The load one pod of ``config`` is given: ``settings.concurrency`` requests (at most max_num_seqs) of
    max_model_len tokens, prompt and output together, unless the token limit needs shorter prompts."""
    requests = max(1, min(settings.concurrency, config.max_num_seqs))
    max_tokens = max(1, min(settings.max_tokens, config.max_model_len // 2))
    prompt = config.max_model_len - max_tokens
    prompt = max(1, min(prompt, settings.max_total_tokens // requests - max_tokens))
    return BurnInLoad(model=model, port=port, requests=requests, prompt_tokens=prompt, max_tokens=max_tokens,
                      timeout_seconds=settings.timeout_seconds,
                      vocab_size=max(11, min(config.model.vocab_size, PROMPT_VOCAB)))


@dataclass(frozen=True)
class BurnInVerdict:
    """One pod's burn-in judged: passed or why not, its figures, and the remediation signal when the KV cache
    was too small."""

    pod: str
    passed: bool
    reason: str
    message: str
    gpu_seconds: float
    signal: Classification | None = None


def _share(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.0%}"


def _count(value: float | None) -> str:
    return "unknown" if value is None else f"{value:g}"


def judge(pod: str, load: BurnInLoad, m: BurnInMeasurement, *, gpus: int,
          oom_killed_at: datetime | None = None) -> BurnInVerdict:
    """What one pod's measurement says (``gpus``: the GPUs the pod holds, for the run's cost; ``oom_killed_at``:
    when the kubelet last recorded its vLLM OOM-killed)."""
    gpu_seconds = round(m.wall_seconds * gpus, 1)
    shape = f"{load.requests} requests of {load.prompt_tokens}+{load.max_tokens} tokens at once"
    figures = (f"{shape}: {m.completed}/{m.sent} answered in {m.wall_seconds:.0f}s, peak KV usage "
               f"{_share(m.peak_kv_usage)}, {m.preemptions:g} preemptions, peak waiting {_count(m.peak_waiting)}, "
               f"{gpu_seconds:g} GPU-seconds")
    apart = never_together(load, m)
    if m.preemptions > 0 or m.full_while_waiting > 0 or apart:
        what = (f"vLLM preempted {m.preemptions:g} times" if m.preemptions > 0
                else f"the KV cache was full (at least {FULL_KV_USAGE:.0%}) with requests waiting in "
                     f"{m.full_while_waiting} of {m.samples} samples" if m.full_while_waiting > 0
                else f"vLLM never ran the {load.requests} requests together: at most {m.peak_running:g} at once, "
                     f"up to {m.peak_waiting:g} waiting")
        summary = (f"burn-in on {pod}: {shape}, {what}; the KV cache holds fewer than {load.requests} "
                   f"requests of {load.prompt_tokens + load.max_tokens} tokens")
        evidence = {"source": "burn-in", "pod": pod, "requests": str(load.requests),
                    "promptTokens": str(load.prompt_tokens), "maxTokens": str(load.max_tokens),
                    "preemptions": f"{m.preemptions:g}", "peakUsage": _share(m.peak_kv_usage),
                    "peakWaiting": _count(m.peak_waiting), "peakRunning": _count(m.peak_running),
                    "fullWhileWaiting": f"{m.full_while_waiting}/{m.samples}",
                    "wallSeconds": f"{m.wall_seconds:.1f}"}
        return BurnInVerdict(pod, False, "KVCacheTooSmall", f"{pod}: {what}; {figures}", gpu_seconds,
                             Classification(Signal.KV_SATURATION, summary, evidence=evidence))
    if oom_killed_at is not None and m.started_at is not None and oom_killed_at >= m.started_at and (
            m.errors or m.timed_out or m.completed < load.requests):
        # the kill is remediation's evidence already (the pod's termination); the burn-in says it stopped the run
        return BurnInVerdict(pod, False, "OOMKilled",
                             f"{pod}: vLLM was OOM-killed during the burn-in (at {oom_killed_at:%Y-%m-%dT%H:%M:%SZ}; "
                             f"remediation acts on the termination); {figures}", gpu_seconds)
    if m.errors:
        return BurnInVerdict(pod, False, "RequestsFailed",
                             f"{pod}: {m.errors} of {m.sent} requests failed ({m.first_error}); {figures}",
                             gpu_seconds)
    if m.timed_out or m.completed < load.requests:
        return BurnInVerdict(pod, False, "TimedOut",
                             f"{pod}: not answered within {load.timeout_seconds:g}s; {figures}", gpu_seconds)
    unread = "" if m.samples else " (vLLM's /metrics could not be read: no preemption or KV figures)"
    return BurnInVerdict(pod, True, BURN_IN_PASSED, f"{pod}: {figures}{unread}", gpu_seconds)


def recorded_on_gate(pod: str, passed: bool) -> BurnInVerdict:
    """The verdict a pod's readiness gate holds when status.burnIn lost it (the status write after the gate's
    failed, and the run's figures went with the operator that restarted since): passed or not, no figures, no
    remediation signal (a step the failure led to was recorded before its objects, the gate written after)."""
    return BurnInVerdict(pod, passed, BURN_IN_PASSED if passed else "BurnInFailed",
                         f"{pod}: judged by an earlier pass (its readiness gate {BURN_IN_GATE} is "
                         f"{'True' if passed else 'False'}); its figures were not recorded", 0.0)


def never_together(load: BurnInLoad, m: BurnInMeasurement) -> bool:
    """vLLM kept requests waiting and never ran them all at once although their outputs overlap: each output
    (``max_tokens`` decode steps) outlasts the prefills of the others (at most one a step), so a KV cache that
    holds them all runs them all together. With shorter outputs the first ones may finish first: not judged."""
    overlap = load.max_tokens >= 2 * load.requests
    return (overlap and m.samples >= 3 and m.peak_running is not None and m.peak_running < load.requests
            and (m.peak_waiting or 0) >= 1 and m.completed == load.requests)


def units(pods: Sequence[PodBurnIn], *, grouped: bool) -> list[tuple[PodBurnIn | None, tuple[PodBurnIn, ...]]]:
    """What each burn-in run covers: (the pod the load goes to, the pods its verdict is written on). A
    Deployment's pod is its own. A group across nodes is one engine: one run on its leader (rank 0, the only pod
    that serves the API; None while it is not there), its verdict on every pod of the group. A pod of a grouped
    plan whose group or rank is not known is its own unit."""
    if not grouped:
        return [(p, (p,)) for p in pods]
    groups: dict[str, list[PodBurnIn]] = {}
    found: list[tuple[PodBurnIn | None, tuple[PodBurnIn, ...]]] = []
    for p in pods:
        if p.group is None or p.rank is None:
            found.append((p, (p,)))
        else:
            groups.setdefault(p.group, []).append(p)
    for name in sorted(groups):
        members = tuple(sorted(groups[name], key=lambda p: (p.rank or 0, p.pod)))
        found.append((next((p for p in members if p.rank == 0), None), members))
    return found


def evidence_key(plan_hash: str, pod: str) -> str:
    """Identifies one pod's burn-in failure, so remediation acts on it once."""
    return f"burn-in/{plan_hash}/{pod}"


def condition(pods: Sequence[tuple[str, BurnInVerdict | None]]) -> tuple[bool | None, str, str]:
    """BurnInPassed over the plan's new pods: False when one failed (the first failure said), unknown while one
    still runs, True when every one passed."""
    failed = [v for _, v in pods if v is not None and not v.passed]
    if failed:
        more = f" (and {len(failed) - 1} more pods)" if len(failed) > 1 else ""
        return False, failed[0].reason, failed[0].message + more
    running = [pod for pod, v in pods if v is None]
    if running:
        return None, "BurnInRunning", f"the burn-in runs on {', '.join(running[:5])}; no traffic until it passes"
    if not pods:
        return None, "BurnInPending", "no pod of the plan has started yet"
    total = sum(v.gpu_seconds for _, v in pods if v is not None)
    last = pods[-1][1]
    assert last is not None
    return True, BURN_IN_PASSED, f"{len(pods)} pods passed, {total:g} GPU-seconds; last: {last.message}"
