"""KV calibration (planner/calibration.py), case by case: what applies, what is ignored, what a forged store
does, and that the planner refuses a plan calibration pushes past the budget as it would an uncalibrated one."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from llm_autopilot.planner.calibration import (
    CAP_PERCENT,
    MAX_SAMPLES,
    CalibrationError,
    CalibrationKey,
    CalibrationStore,
    KVCalibration,
    NotCalibrated,
    Sample,
    calibration_for,
    key_of,
    parse_store,
    record,
    store_to_json,
)
from llm_autopilot.planner.memory import estimate
from llm_autopilot.planner.plan import Plan, PlanRequest, Targets
from llm_autopilot.planner.search import plan
from llm_autopilot.vllm.versions import VLLMVersion, behaviour_of
from tests.conftest import gpu, model
from tests.unit.test_memory import config

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
KEY = CalibrationKey("H100-80GB", "0.33.0", "llama")
OTHER_VERSION = CalibrationKey("H100-80GB", "0.32.0", "llama")


def samples(*ratios: float, age: timedelta = timedelta(hours=1)) -> tuple[Sample, ...]:
    return tuple(Sample(r, NOW - age, f"ns/d{i}") for i, r in enumerate(ratios))


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    entries: dict[CalibrationKey, tuple[Sample, ...]]
    ratio: float | None  # None: not calibrated
    deployments: int = 0
    why: str = ""
    key: CalibrationKey = KEY


CASES = [
    Case("one deployment applies", {KEY: samples(0.97)}, 0.97, 1),
    Case("agreeing deployments: their mean", {KEY: samples(0.97, 0.98, 0.99)}, 0.98, 3),
    Case("two that disagree calibrate nothing", {KEY: samples(0.97, 1.30)}, None, why="disagree"),
    Case("an outlier among three is ignored", {KEY: samples(0.97, 0.975, 1.40)}, 0.9725, 2),
    Case("an outlier among many is ignored", {KEY: samples(0.98, 0.99, 0.985, 0.98, 0.60)}, 0.98375, 4),
    Case("a 14-day-old calibration applies half", {KEY: samples(0.90, age=timedelta(days=14))}, 0.95, 1),
    Case("older than 90 days: gone", {KEY: samples(0.90, age=timedelta(days=91))}, None, why="no recent"),
    Case("another vLLM version is not covered", {OTHER_VERSION: samples(0.95)}, None, why="covers vLLM 0.32.0 only"),
    Case("another GPU is not covered", {dataclasses.replace(KEY, gpu_product="L4"): samples(0.95)}, None,
         why="no recent"),
    Case("another family is not covered", {dataclasses.replace(KEY, family="qwen3"): samples(0.95)}, None,
         why="no recent"),
    Case("an empty store", {}, None, why="no recent"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_calibration_for_a_key(case: Case) -> None:
    found = calibration_for(CalibrationStore(case.entries), case.key, NOW)
    if case.ratio is None:
        assert isinstance(found, NotCalibrated), case.name
        assert case.why in found.reason
    else:
        assert isinstance(found, KVCalibration), case.name
        assert found.ratio == pytest.approx(case.ratio, abs=1e-4)
        assert found.deployments == case.deployments


@pytest.mark.parametrize(("name", "ratio", "kv_gib", "delta_gib", "reason"), [
    ("small correction", 0.985, 80.0, -1.2, "KV calibrated \u22121.2 % of GPU memory from 3 deployments on H100-80GB "
                                           "with vLLM 0.33.0"),
    ("capped down", 0.5, 60.0, -CAP_PERCENT / 100 * 100, "(capped)"),
    ("capped up", 1.5, 60.0, CAP_PERCENT / 100 * 100, "+5.0 % of GPU memory (capped)"),
    ("no room, no correction", 0.9, 0.0, 0.0, "+0.0 %"),
])
def test_applied_capped_and_named(name: str, ratio: float, kv_gib: float, delta_gib: float, reason: str) -> None:
    gib, total = 2**30, 100 * 2**30  # a GPU of 100 GiB: 1 GiB is 1 %
    cal = KVCalibration(KEY, ratio, 3)
    assert cal.delta_bytes(kv_gib * gib, total) == pytest.approx(delta_gib * gib), name
    assert reason in cal.reason(kv_gib * gib, total), name


def test_record_keeps_one_sample_per_deployment_and_refuses_broken_ones() -> None:
    store = record(CalibrationStore(), KEY, Sample(0.97, NOW - timedelta(days=1), "ns/a"), NOW)
    store = record(store, KEY, Sample(0.99, NOW, "ns/a"), NOW)
    assert store.entries[KEY] == (Sample(0.99, NOW, "ns/a"),)
    assert record(store, KEY, Sample(3.0, NOW, "ns/b"), NOW) == store  # a broken measurement
    assert record(store, KEY, Sample(float("nan"), NOW, "ns/b"), NOW) == store
    aged = record(CalibrationStore({KEY: samples(0.9, age=timedelta(days=100))}), KEY, Sample(0.98, NOW, "ns/z"),
                  NOW)
    assert [s.deployment for s in aged.entries[KEY]] == ["ns/z"]


def test_the_store_round_trips() -> None:
    store = CalibrationStore({KEY: samples(0.97, 0.98), OTHER_VERSION: samples(1.01)})
    parsed, problems = parse_store(json.loads(json.dumps(store_to_json(store))), NOW)
    assert parsed == store and problems == ()


def _store(*entries: Any) -> dict[str, Any]:
    return {"version": 1, "entries": list(entries)}


def _entry(*raw_samples: Any, **changes: Any) -> dict[str, Any]:
    return {"gpuProduct": "H100-80GB", "vllmVersion": "0.33.0", "family": "llama", "samples": list(raw_samples),
            **changes}


GOOD = {"ratio": 0.98, "time": "2026-12-01T10:00:00+00:00", "deployment": "ns/a"}


@pytest.mark.parametrize(("name", "data", "problem"), [
    ("ratio as a string", _store(_entry({**GOOD, "ratio": "0.98"})), "ratio must be a number"),
    ("ratio NaN (Python's json reads it)", json.loads('{"version": 1, "entries": [{"gpuProduct": "H100-80GB", '
                                                      '"vllmVersion": "0.33.0", "family": "llama", "samples": '
                                                      '[{"ratio": NaN, "time": "2026-12-01T10:00:00+00:00", '
                                                      '"deployment": "ns/a"}]}]}'), "ratio must be a number"),
    ("ratio true", _store(_entry({**GOOD, "ratio": True})), "ratio must be a number"),
    ("a forged 10x ratio", _store(_entry({**GOOD, "ratio": 10})), "ratio must be a number in [0.5, 1.5]"),
    ("a time in the future", _store(_entry({**GOOD, "time": "2027-01-01T00:00:00+00:00"})), "is in the future"),
    ("a time without a zone", _store(_entry({**GOOD, "time": "2026-12-01T10:00:00"})), "time zone"),
    ("a time that is not one", _store(_entry({**GOOD, "time": "yesterday"})), "RFC 3339"),
    ("no deployment", _store(_entry({**GOOD, "deployment": ""})), "deployment must be a non-empty string"),
    ("a sample that is a list", _store(_entry([0.98])), "a sample must be an object"),
    ("a version that is not one", _store(_entry(GOOD, vllmVersion="latest")), "cannot read vLLM version"),
    ("a GPU of 10,000 characters", _store(_entry(GOOD, gpuProduct="H" * 10000)), "at most 253 characters"),
    ("samples not a list", _store(_entry(GOOD) | {"samples": {"a": 1}}), "samples must be a list"),
    ("an entry that is a string", _store("H100=0.5"), "must be an object"),
])
def test_forged_or_garbage_entries_are_dropped_with_a_message(name: str, data: Any, problem: str) -> None:
    store, problems = parse_store(data, NOW)
    assert store.entries.get(KEY, ()) == (), name
    assert len(problems) == 1 and problem in problems[0], problems


def test_good_samples_beside_bad_ones_are_kept() -> None:
    data = _store(_entry(GOOD, {**GOOD, "ratio": 99, "deployment": "ns/evil"},
                         {**GOOD, "ratio": 0.99, "time": "2026-12-01T11:00:00+00:00"}))  # ns/a again, newer
    store, problems = parse_store(data, NOW)
    assert store.entries[KEY] == (Sample(0.99, datetime(2026, 12, 1, 11, tzinfo=UTC), "ns/a"),)
    assert len(problems) == 1 and "sample 1 dropped" in problems[0]


def test_a_flood_of_samples_keeps_the_newest() -> None:
    flood = [{"ratio": 0.9 + i / 10000, "time": (NOW - timedelta(minutes=i)).isoformat(), "deployment": f"ns/{i}"}
             for i in range(1000)]
    store, _ = parse_store(_store(_entry(*flood)), NOW)
    assert len(store.entries[KEY]) == MAX_SAMPLES
    assert max(s.time for s in store.entries[KEY]) == NOW


@pytest.mark.parametrize(("name", "data", "message"), [
    ("not an object", [1, 2], "must be a JSON object"),
    ("no version", {"entries": []}, "format version None"),
    ("another version", {"version": 2, "entries": []}, "format version 2"),
    ("entries not a list", {"version": 1, "entries": {"a": 1}}, "must be a list"),
])
def test_an_unreadable_store_is_an_error(name: str, data: Any, message: str) -> None:
    with pytest.raises(CalibrationError, match=message):
        parse_store(data, NOW)


def test_a_version_change_uncalibrates() -> None:
    store = CalibrationStore({key_of("H100-80GB", "0.32.0", model("meta-llama/Llama-3.1-8B-Instruct")):
                              samples(0.95)})
    llama = model("meta-llama/Llama-3.1-8B-Instruct")
    assert isinstance(calibration_for(store, key_of("H100-80GB", "0.32.0", llama), NOW), KVCalibration)
    assert isinstance(calibration_for(store, key_of("H100-80GB", "0.32.1", llama), NOW), NotCalibrated)
    assert isinstance(calibration_for(store, key_of("H100-80GB", VLLMVersion(0, 33, 0), llama), NOW), NotCalibrated)


def test_the_estimate_moves_the_kv_room_by_the_capped_calibration() -> None:
    vllm = behaviour_of(VLLMVersion(0, 33, 0))
    plain = estimate(config(vllm))
    cal = KVCalibration(KEY, 0.97, 2)
    calibrated = estimate(config(vllm, kv_calibration=cal))
    assert calibrated.kv_calibration_bytes == pytest.approx(-0.03 * plain.kv_cache_bytes)
    assert calibrated.kv_cache_bytes == pytest.approx(0.97 * plain.kv_cache_bytes)
    assert calibrated.kv_cache_tokens < plain.kv_cache_tokens


def test_a_plan_calibration_pushes_past_the_budget_is_refused_like_an_uncalibrated_one() -> None:
    """Llama-3.1-70B on 2 x H100 at the longest length that fits: calibrated down, it no longer fits, with the
    problem an uncalibrated plan with that much less budget gets, and the same KV room."""
    vllm = behaviour_of(VLLMVersion(0, 33, 0))
    base = config(vllm, model=model("meta-llama/Llama-3.1-70B-Instruct"), tensor_parallel_size=2,
                  gpu_memory_utilization=0.92)
    longest = dataclasses.replace(base, max_model_len=estimate(base).max_model_len_capacity)
    assert estimate(longest).fits
    calibrated = estimate(dataclasses.replace(longest, kv_calibration=KVCalibration(KEY, 0.8, 3)))
    shortfall = -calibrated.kv_calibration_bytes
    assert shortfall > 0
    less_budget = estimate(dataclasses.replace(longest, gpu_memory_utilization=0.92 - shortfall / h100_bytes()))
    assert calibrated.kv_cache_bytes == pytest.approx(less_budget.kv_cache_bytes)
    assert not calibrated.fits and not less_budget.fits
    assert calibrated.problems == less_budget.problems
    assert "the largest that fits is" in calibrated.problems[0]


def test_the_cap_bounds_what_calibration_takes() -> None:
    vllm = behaviour_of(VLLMVersion(0, 33, 0))
    plain = estimate(config(vllm))  # Llama-3.1-8B on one H100: tens of GiB of KV cache
    calibrated = estimate(config(vllm, kv_calibration=KVCalibration(KEY, 0.5, 3)))
    assert calibrated.kv_calibration_bytes == pytest.approx(-CAP_PERCENT / 100 * h100_bytes())
    assert calibrated.kv_cache_bytes == pytest.approx(plain.kv_cache_bytes - CAP_PERCENT / 100 * h100_bytes())


def h100_bytes() -> float:
    return gpu("nvidia-h100-80gb").total_bytes


def test_the_planner_names_the_calibration_in_its_reasons() -> None:
    vllm = behaviour_of(VLLMVersion(0, 33, 0))
    llama = model("meta-llama/Llama-3.1-8B-Instruct")
    request = PlanRequest(model=llama, gpu=gpu("nvidia-h100-80gb"), vllm=vllm, targets=Targets(max_model_len=8192))
    cal = KVCalibration(key_of("H100-80GB", "0.33.0", llama), 0.985, 3)
    plain, calibrated = plan(request), plan(dataclasses.replace(request, kv_calibration=cal))
    assert isinstance(plain, Plan) and isinstance(calibrated, Plan)
    reasons = [str(r) for r in calibrated.reasons]
    assert any(r.startswith("kvCalibration=0.9850: KV calibrated \u2212") and "from 3 deployments on H100-80GB "
               "with vLLM 0.33.0" in r for r in reasons), reasons
    assert not any(str(r).startswith("kvCalibration") for r in plain.reasons)
    assert calibrated.estimate.kv_cache_tokens < plain.estimate.kv_cache_tokens
