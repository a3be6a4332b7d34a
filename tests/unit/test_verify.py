"""Verification of a plan against vLLM's own KV-cache figures (planner/verify.py), case by case.

The inputs are what vLLM really prints: the start-up lines of the published GPU logs
(tests/data/golden_vllm_logs.json), of the CPU build (tests/data/vllm_cpu_kv_golden.json), and the labels
vLLM 0.32.0's CacheConfig gives ``vllm:cache_config_info`` (tests/data/vllm_cache_config_info.json).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from llm_autopilot.api.v1alpha1 import VerificationSpec, VerificationStatus
from llm_autopilot.catalog.hf_config import parse_hf_config
from llm_autopilot.domain.precision import GIB, KVCacheDtype
from llm_autopilot.planner.config import ServingConfig
from llm_autopilot.planner.kv_cache import kv_block_bytes, kv_capacity
from llm_autopilot.planner.memory import estimate
from llm_autopilot.planner.verify import (
    TOLERANCE_PERCENT,
    ObservationError,
    Observed,
    Prediction,
    Source,
    observed_from_cache_config_info,
    observed_from_log,
    predict,
    verify,
)
from llm_autopilot.vllm.versions import VLLMVersion, behaviour_of
from tests.conftest import DATA, gpu, model

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
GPU_LOGS = {row["id"]: row for row in json.loads((DATA / "golden_vllm_logs.json").read_text())["cases"]}
CPU_GOLDEN = json.loads((DATA / "vllm_cpu_kv_golden.json").read_text())
INFO = json.loads((DATA / "vllm_cache_config_info.json").read_text())


def _log(row_id: str) -> str:
    return str(GPU_LOGS[row_id]["log_excerpt"])


def _row_with(text: str) -> str:
    return next(i for i, r in GPU_LOGS.items() if text in str(r.get("log_excerpt", "")))


@pytest.mark.parametrize(("name", "text", "tokens", "blocks", "block_size", "gib"), [
    ("v1 GPU log (0.19.0)", _log("h100-llama31-8b-tp1-8k"), 476016, None, None, 58.11),
    ("0.11 prints blocks x block size", _log(_row_with("1,444 blocks x 128")), 184832, 1444, 128, 28.20),
    ("V0 engine's # GPU blocks", _log(_row_with("# GPU blocks: 1478")), None, 1478, None, None),
    ("pipeline stages: the smallest worker's room", _log(_row_with("(Worker_PP0) Available KV cache memory")),
     1075312, None, None, 66.54),
    ("the CPU build", CPU_GOLDEN["cases"][0]["line"], 8192, None, None, None),
    ("GPU + host (HiSparse)", "GPU + host KV cache size: 1,024 tokens, Maximum concurrency", 1024, None, None, None),
], ids=lambda v: v if isinstance(v, str) and len(v) < 60 else "")
def test_start_up_log_lines(name: str, text: str, tokens: int | None, blocks: int | None, block_size: int | None,
                            gib: float | None) -> None:
    seen = observed_from_log(text)
    assert seen.source is Source.LOG
    assert (seen.kv_cache_tokens, seen.num_blocks, seen.block_size) == (tokens, blocks, block_size), name
    assert seen.kv_cache_bytes == (None if gib is None else round(gib * GIB)), name


def test_several_workers_give_the_smallest_room() -> None:
    text = ("(Worker_PP0) Available KV cache memory: 66.54 GiB\n(Worker_PP1) Available KV cache memory: 65.10 GiB\n"
            "GPU KV cache size: 1,075,312 tokens")
    assert observed_from_log(text).kv_cache_bytes == round(65.10 * GIB)


@pytest.mark.parametrize(("name", "text"), [
    ("empty", ""),
    ("vLLM still loading", "Loading model weights took 14.99 GiB\nMemory profiling takes 17.96 seconds."),
    ("garbage", "\x00\xff KV cache size: lots tokens"),
    ("a number that is not one", "Available KV cache memory: 1e3 GiB"),
])
def test_logs_without_kv_lines_are_refused(name: str, text: str) -> None:
    with pytest.raises(ObservationError, match="no KV-cache line"):
        observed_from_log(text)


def test_cache_config_info_labels_of_vllm_032() -> None:
    seen = observed_from_cache_config_info(INFO["labels"])
    assert seen == Observed(Source.METRICS, kv_cache_tokens=8192, num_blocks=64, block_size=128,
                            kv_cache_bytes=4194304, gpu_memory_utilization=0.92, cache_dtype="auto")


@pytest.mark.parametrize(("name", "changes", "message"), [
    ("not sized yet", {"num_gpu_blocks": "None"}, "has no num_gpu_blocks"),
    ("label missing", {"num_gpu_blocks": None}, "has no num_gpu_blocks"),
    ("negative blocks", {"num_gpu_blocks": "-5"}, "is not a whole number"),
    ("zero blocks", {"num_gpu_blocks": "0"}, "is below 1"),
    ("float blocks", {"num_gpu_blocks": "64.5"}, "is not a whole number"),
    ("exponent", {"num_gpu_blocks": "1e3"}, "is not a whole number"),
    ("absurdly long", {"num_gpu_blocks": "9" * 40}, "is not a whole number"),
    ("block size garbage", {"block_size": "abc"}, "block_size='abc'"),
    ("utilization above 1", {"gpu_memory_utilization": "2"}, r"not in \(0, 1\]"),
    ("utilization nan", {"gpu_memory_utilization": "nan"}, r"not in \(0, 1\]"),
    ("utilization text", {"gpu_memory_utilization": "high"}, "is not a number"),
])
def test_bad_cache_config_info_labels_are_refused(name: str, changes: dict[str, str | None], message: str) -> None:
    labels = {k: v for k, v in {**INFO["labels"], **changes}.items() if v is not None}
    with pytest.raises(ObservationError, match=message):
        observed_from_cache_config_info(labels)


def _cpu_prediction(case: dict[str, Any]) -> Prediction:
    """The planner's figures for one CPU golden case (the room is given: no memory model in between)."""
    m = parse_hf_config(case["config"], case["model"])
    behaviour = behaviour_of(VLLMVersion.parse(CPU_GOLDEN["vllm_version"]))
    block = CPU_GOLDEN["block_size"]
    room = kv_capacity(m, 1, 1, KVCacheDtype.AUTO, available_bytes=case["kv_cache_memory_bytes"],
                       max_model_len=case["max_model_len"],
                       max_num_batched_tokens=case["max_num_batched_tokens"] * behaviour.in_flight_batches(on_cpu=True),
                       block_size=block, limit=case["max_model_len"], reserve_null_block=True, group_aware_size=True)
    page = kv_block_bytes(m, 1, 1, KVCacheDtype.AUTO, block)
    # a GPU-sized denominator is not meaningful on CPU: the room itself is the "memory" here
    return Prediction(room.tokens, case["kv_cache_memory_bytes"] // page, block, case["kv_cache_memory_bytes"],
                      page, gpu_total_bytes=case["kv_cache_memory_bytes"])


def test_the_cpu_golden_verifies_from_its_metric_and_its_log() -> None:
    case = CPU_GOLDEN["cases"][0]  # tiny-llama-gqa, 4 MiB, 4096
    assert (case["kv_cache_memory_bytes"], case["max_model_len"]) == (4194304, 4096)
    prediction = _cpu_prediction(case)
    for seen in (observed_from_cache_config_info(INFO["labels"]), observed_from_log(case["line"])):
        result = verify(prediction, seen, vllm_version="0.32.0", now=NOW)
        assert (result.predicted_tokens, result.actual_tokens) == (8192, 8192)
        assert result.error_percent == 0 and result.verified and result.ratio == 1
        assert result.condition()[:2] == (True, "WithinTolerance")


def _h100_prediction() -> Prediction:
    row = GPU_LOGS["h100-llama31-8b-tp1-8k"]
    behaviour = behaviour_of(VLLMVersion.parse(row["vllm_version"]))
    cfg = ServingConfig(model=model(row["model"]), gpu=gpu("nvidia-h100-80gb"), vllm=behaviour,
                        tensor_parallel_size=1, pipeline_parallel_size=1,
                        gpu_memory_utilization=row["gpu_memory_utilization"], max_model_len=row["max_model_len"],
                        max_num_seqs=row["max_num_seqs"], max_num_batched_tokens=row["max_num_batched_tokens"])
    return predict(cfg, estimate(cfg))


def test_a_published_h100_log_against_the_plan() -> None:
    """The planner's plan for the logged H100 run, against the log's "Available KV cache memory"."""
    prediction = _h100_prediction()
    seen = observed_from_log(_log("h100-llama31-8b-tp1-8k"))
    result = verify(prediction, seen, vllm_version="0.19.0", now=NOW)
    expected = (round(58.11 * GIB) - prediction.kv_cache_bytes) / prediction.gpu_total_bytes * 100
    assert result.error_percent == pytest.approx(expected)
    assert result.actual_tokens == 476016 and result.source is Source.LOG
    assert result.verified is (abs(expected) <= TOLERANCE_PERCENT)


@pytest.mark.parametrize(("name", "seen", "error", "verified"), [
    ("blocks as planned", Observed(Source.METRICS, num_blocks=1000, block_size=16), 0.0, True),
    ("blocks 1.5 % short", Observed(Source.METRICS, num_blocks=985, block_size=16), -1.5, True),
    ("blocks 3 % short", Observed(Source.METRICS, num_blocks=970, block_size=16), -3.0, False),
    ("blocks 3 % over", Observed(Source.METRICS, num_blocks=1030, block_size=16), 3.0, False),
    ("a bigger block size: half the blocks are the same memory", Observed(Source.METRICS, num_blocks=500,
                                                                          block_size=32), 0.0, True),
    ("bytes only", Observed(Source.LOG, kv_cache_bytes=int(0.98 * 1000 * 2**20)), -2.0, True),
    ("tokens only", Observed(Source.LOG, kv_cache_tokens=9000), -10.0, False),
])
def test_error_in_percent_of_gpu_memory(name: str, seen: Observed, error: float, verified: bool) -> None:
    # 1,000 blocks of 1 MiB = 1,000 MiB of KV cache on a "GPU" of 1,000 MiB: one block is 0.1 %
    prediction = Prediction(kv_cache_tokens=10000, num_blocks=1000, block_size=16, kv_cache_bytes=1000 * 2**20,
                            block_bytes=2**20, gpu_total_bytes=1000 * 2**20)
    result = verify(prediction, seen, vllm_version="0.33.0", now=NOW)
    assert result.error_percent == pytest.approx(error), name
    assert result.verified is verified, name
    status, reason, message = result.condition()
    assert (status, reason) == (verified, "WithinTolerance" if verified else "OutsideTolerance")
    assert "predicted 10,000 tokens" in message and f"{error:+.2f} % of GPU memory" in message


def test_nothing_to_compare_is_refused() -> None:
    prediction = _cpu_prediction(CPU_GOLDEN["cases"][0])
    with pytest.raises(ObservationError, match="neither blocks, bytes nor tokens"):
        verify(prediction, Observed(Source.LOG), vllm_version="0.32.0", now=NOW)
    with pytest.raises(ObservationError, match="no KV cache to verify"):
        verify(dataclasses.replace(prediction, block_bytes=0), Observed(Source.LOG, kv_cache_tokens=1),
               vllm_version="0.32.0", now=NOW)


def test_the_status_carries_both_numbers_and_round_trips() -> None:
    prediction = _cpu_prediction(CPU_GOLDEN["cases"][0])
    result = verify(prediction, observed_from_cache_config_info(INFO["labels"]), vllm_version="0.32.0", now=NOW)
    status = VerificationStatus.of(result, calibration="KV calibrated +0.0 %")
    dumped = status.model_dump(by_alias=True, mode="json")
    assert {"predictedTokens": 8192, "actualTokens": 8192, "predictedBlocks": 64, "actualBlocks": 64,
            "source": "metrics", "vllmVersion": "0.32.0", "verified": True,
            "time": "2026-12-01T12:00:00Z"}.items() <= dumped.items()
    assert VerificationStatus.model_validate(dumped) == status
    with pytest.raises(ValidationError):  # a forged status is refused, not trusted
        VerificationStatus.model_validate({**dumped, "source": "rumour"})
    with pytest.raises(ValidationError):
        VerificationStatus.model_validate({**dumped, "time": "yesterday"})


@pytest.mark.parametrize(("name", "spec", "ok"), [
    ("defaults", {}, True),
    ("tighter", {"tolerancePercent": 1}, True),
    ("too tight to be met", {"tolerancePercent": 0.1}, False),
    ("too loose to mean anything", {"tolerancePercent": 50}, False),
    ("calibration is not a knob (no in-cluster store yet)", {"calibrate": False}, False),
    ("an unknown field", {"burnin": True}, False),
])
def test_the_verification_spec(name: str, spec: dict[str, Any], ok: bool) -> None:
    if ok:
        parsed = VerificationSpec.model_validate(spec)
        assert parsed.tolerance_percent == spec.get("tolerancePercent", TOLERANCE_PERCENT), name
    else:
        with pytest.raises(ValidationError):
            VerificationSpec.model_validate(spec)
