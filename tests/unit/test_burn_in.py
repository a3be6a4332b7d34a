"""The burn-in's pure core (desired/burn_in.py): the load a plan gives one pod, and what a measurement means,
as a table of named cases."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import pytest

from llm_autopilot.desired.burn_in import (
    BURN_IN_PASSED,
    BurnInSettings,
    BurnInVerdict,
    condition,
    evidence_key,
    judge,
    load_for,
)
from llm_autopilot.domain.burn_in import BurnInLoad, BurnInMeasurement
from llm_autopilot.planner.config import ServingConfig
from llm_autopilot.remediation.classify import Signal
from llm_autopilot.vllm.versions import VLLMVersion, behaviour_of
from tests.conftest import gpu, model


def _config(max_model_len: int = 2048, max_num_seqs: int = 16) -> ServingConfig:
    return ServingConfig(model=model("meta-llama/Llama-3.1-8B-Instruct"), gpu=gpu("nvidia-h100-80gb"),
                         vllm=behaviour_of(VLLMVersion.parse("0.33.0")), tensor_parallel_size=1,
                         pipeline_parallel_size=1, gpu_memory_utilization=0.9, max_model_len=max_model_len,
                         max_num_seqs=max_num_seqs, max_num_batched_tokens=2048)


def test_the_load_is_the_spec_concurrency_of_prompts_near_max_model_len() -> None:
    load = load_for(_config(), model="tiny", port=8000, settings=BurnInSettings(concurrency=8, max_tokens=16))
    assert (load.requests, load.prompt_tokens, load.max_tokens) == (8, 2032, 16)
    assert load.prompt_tokens + load.max_tokens == 2048  # vLLM refuses more than max_model_len
    assert load.total_tokens == 8 * 2048


def test_the_load_never_sends_more_requests_than_max_num_seqs() -> None:
    load = load_for(_config(max_num_seqs=4), model="tiny", port=8000, settings=BurnInSettings(concurrency=8))
    assert load.requests == 4  # vLLM would queue the others whatever its KV room: that says nothing


def test_the_token_limit_shortens_the_prompts() -> None:
    settings = BurnInSettings(concurrency=10, max_tokens=16, max_total_tokens=10_000)
    load = load_for(_config(), model="tiny", port=8000, settings=settings)
    assert load.total_tokens <= 10_000
    assert load.prompt_tokens == 10_000 // 10 - 16


def test_a_short_context_keeps_room_for_the_prompt() -> None:
    load = load_for(_config(max_model_len=20), model="tiny", port=8000, settings=BurnInSettings(max_tokens=64))
    assert (load.prompt_tokens, load.max_tokens) == (10, 10)


def test_prompts_share_no_cached_prefix_block_and_stay_in_the_vocabulary() -> None:
    load = load_for(_config(), model="tiny", port=8000, settings=BurnInSettings(concurrency=16))
    prompts = [load.prompt(i) for i in range(load.requests)]
    assert len({tuple(p[:1]) for p in prompts}) == load.requests  # differ from the very first token
    assert all(len(p) == load.prompt_tokens for p in prompts)
    assert all(10 <= t < load.vocab_size for p in prompts for t in p)
    assert load.vocab_size == 1000


LOAD = BurnInLoad(model="tiny", port=8000, requests=8, prompt_tokens=1843, max_tokens=16, timeout_seconds=300)
HEALTHY = BurnInMeasurement(completed=8, sent=8, preemptions=0, peak_kv_usage=0.62, peak_waiting=3, peak_running=8,
                            samples=40, generated_tokens=128, wall_seconds=20.0)
STARTED, MINUTE = datetime(2026, 12, 1, 10, 0, tzinfo=UTC), timedelta(minutes=1)
#: the pod's vLLM killed a few seconds into the run: the requests in flight lose their connection
KILLED = replace(HEALTHY, completed=3, errors=5, first_error="RemoteProtocolError: Server disconnected",
                 started_at=STARTED, samples=12, wall_seconds=7.0)
SHORT = BurnInLoad(model="tiny", port=8000, requests=8, prompt_tokens=1851, max_tokens=8, timeout_seconds=300)


@dataclass(frozen=True)
class Case:
    name: str
    measured: BurnInMeasurement
    passed: bool
    reason: str
    signal: Signal | None
    says: str
    #: when the kubelet last recorded the pod's vLLM OOM-killed
    oom_killed_at: datetime | None = None


CASES = [
    Case("healthy: waiting while prefill is chunked is not a full cache", HEALTHY, True, BURN_IN_PASSED, None,
         "8/8 answered in 20s, peak KV usage 62%, 0 preemptions"),
    Case("preempted", replace(HEALTHY, preemptions=5, peak_kv_usage=1.0), False, "KVCacheTooSmall",
         Signal.KV_SATURATION, "vLLM preempted 5 times"),
    Case("full with requests waiting", replace(HEALTHY, peak_kv_usage=1.0, peak_waiting=4, full_while_waiting=3),
         False, "KVCacheTooSmall", Signal.KV_SATURATION,
         "the KV cache was full (at least 95%) with requests waiting in 3 of 40 samples"),
    Case("full at one time, waiting at another: fits", replace(HEALTHY, peak_kv_usage=1.0, peak_waiting=2), True,
         BURN_IN_PASSED, None, "peak KV usage 100%"),
    Case("a request failed", replace(HEALTHY, completed=7, errors=1, first_error="HTTP 500: engine dead"), False,
         "RequestsFailed", None, "1 of 8 requests failed (HTTP 500: engine dead)"),
    Case("out of time", replace(HEALTHY, completed=5, timed_out=True), False, "TimedOut", None,
         "not answered within 300s"),
    Case("metrics unreadable: passed, and said", replace(HEALTHY, samples=0, peak_kv_usage=None, peak_waiting=None),
         True, BURN_IN_PASSED, None, "vLLM's /metrics could not be read"),
    Case("never together: at most 4 of 8 ran, the others waited", replace(HEALTHY, peak_running=4, peak_waiting=4),
         False, "KVCacheTooSmall", Signal.KV_SATURATION, "vLLM never ran the 8 requests together: at most 4 at once"),
    Case("all 8 ran together once: fits", replace(HEALTHY, peak_running=8, peak_waiting=7), True, BURN_IN_PASSED,
         None, "8/8 answered"),
    Case("preemptions outrank a failed request", replace(HEALTHY, preemptions=1, errors=1, completed=7), False,
         "KVCacheTooSmall", Signal.KV_SATURATION, "preempted 1 times"),
    Case("OOM-killed during the run: said, remediation's evidence is the termination", KILLED, False, "OOMKilled",
         None, "vLLM was OOM-killed during the burn-in (at 2026-12-01T10:00:07Z", oom_killed_at=STARTED + MINUTE / 8),
    Case("an OOM kill before the run is not this run's", KILLED, False, "RequestsFailed", None,
         "5 of 8 requests failed (RemoteProtocolError", oom_killed_at=STARTED - MINUTE),
    Case("a run that passed after an earlier OOM kill passed", replace(HEALTHY, started_at=STARTED), True,
         BURN_IN_PASSED, None, "8/8 answered", oom_killed_at=STARTED - MINUTE),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_measurement_judged(case: Case) -> None:
    verdict = judge("pod-a", LOAD, case.measured, gpus=2, oom_killed_at=case.oom_killed_at)
    assert (verdict.passed, verdict.reason) == (case.passed, case.reason)
    assert case.says in verdict.message
    assert verdict.gpu_seconds == case.measured.wall_seconds * 2
    assert (verdict.signal.signal if verdict.signal else None) == case.signal
    if verdict.signal is not None:
        assert verdict.signal.signal.is_memory
        assert verdict.signal.evidence["source"] == "burn-in"
        assert verdict.signal.evidence["pod"] == "pod-a"
        assert "holds fewer than 8 requests of 1859 tokens" in verdict.signal.summary


def test_outputs_too_short_to_overlap_are_not_judged_on_running_together() -> None:
    apart = replace(HEALTHY, peak_running=4, peak_waiting=4)
    assert not judge("pod-a", LOAD, apart, gpus=1).passed
    assert judge("pod-a", SHORT, apart, gpus=1).passed  # 8 tokens each: the first may end before the last starts


def _verdict(pod: str, passed: bool, seconds: float = 10.0) -> BurnInVerdict:
    return BurnInVerdict(pod, passed, BURN_IN_PASSED if passed else "KVCacheTooSmall", f"{pod}: figures", seconds)


def test_burn_in_passed_is_true_only_when_every_pod_passed() -> None:
    assert condition([("a", _verdict("a", True)), ("b", _verdict("b", True, 5.0))])[:2] == (True, BURN_IN_PASSED)
    assert "15 GPU-seconds" in condition([("a", _verdict("a", True)), ("b", _verdict("b", True, 5.0))])[2]
    assert condition([("a", _verdict("a", True)), ("b", None)])[:2] == (None, "BurnInRunning")
    status, reason, message = condition([("a", None), ("b", _verdict("b", False)), ("c", _verdict("c", False))])
    assert (status, reason) == (False, "KVCacheTooSmall")
    assert message == "b: figures (and 1 more pods)"
    assert condition([])[:2] == (None, "BurnInPending")


def test_each_pod_failure_is_its_own_evidence() -> None:
    assert evidence_key("h1", "a") != evidence_key("h1", "b") != evidence_key("h2", "b")
