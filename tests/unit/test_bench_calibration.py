"""The calibration bench's leave-one-out (tests/bench/bench_calibration.py) on synthetic cases: vLLM's figures
are made up around the planner's own prediction, so the right answer is known."""

from __future__ import annotations

from llm_autopilot.planner.calibration import key_of
from llm_autopilot.planner.config import ServingConfig
from llm_autopilot.planner.verify import Observed, Prediction, Source
from llm_autopilot.vllm.versions import VLLMVersion, behaviour_of
from tests.bench.bench_calibration import (
    Case,
    cpu_golden_cases,
    golden_gpu_cases,
    gpu_planner,
    leave_one_out,
    summarize,
)
from tests.conftest import model
from tests.unit.test_memory import config

VLLM = behaviour_of(VLLMVersion(0, 33, 0))


def _case(name: str, cfg: ServingConfig, ratio: float) -> Case:
    """A deployment whose vLLM reports ``ratio`` x the KV memory the plan predicted."""
    plan = gpu_planner(cfg)
    predicted = plan(None)
    assert isinstance(predicted, Prediction)
    seen = Observed(Source.LOG, kv_cache_bytes=round(predicted.kv_cache_bytes * ratio))
    return Case(name, key_of("H100-80GB", VLLM.version, cfg.model), seen, plan)


def test_same_key_samples_that_agree_calibrate_and_a_lone_key_does_not() -> None:
    cases = [
        _case("llama-8k", config(VLLM, max_model_len=8192), 0.96),
        _case("llama-16k", config(VLLM, max_model_len=16384), 0.961),
        _case("llama-32k", config(VLLM, max_model_len=32768), 0.959),
        _case("qwen", config(VLLM, model=model("Qwen/Qwen2.5-7B-Instruct")), 0.96),
    ]
    rows = {r.id: r for r in leave_one_out(cases)}
    for name in ("llama-8k", "llama-16k", "llama-32k"):
        row = rows[name]
        assert row.before < -2.5  # 4 % of a ~60 GiB room on an 80 GB GPU: outside the tolerance
        assert row.after is not None and abs(row.after) < 0.25 < abs(row.before), row
        # leave-one-out: the case's own sample is not in its calibration
        assert "from 2 deployments on H100-80GB with vLLM 0.33.0" in row.note, row.note
    lone = rows["qwen"]
    assert lone.after is None and not lone.calibrated
    assert lone.note == "not calibrated: no recent deployment measured H100-80GB with vLLM 0.33.0 (qwen2)"
    summary = summarize(list(rows.values()))
    assert (summary.cases, summary.calibrated) == (4, 3)
    assert summary.calibrated_within == (0.0, 100.0)
    assert summary.overall_mean[1] < summary.overall_mean[0]


def test_two_same_key_samples_that_disagree_calibrate_nothing() -> None:
    cases = [
        _case("a", config(VLLM, max_model_len=8192), 0.97),
        _case("b", config(VLLM, max_model_len=16384), 0.97),
        _case("c", config(VLLM, max_model_len=32768), 1.03),
    ]
    rows = {r.id: r for r in leave_one_out(cases)}
    assert rows["c"].after is not None  # a and b agree
    assert rows["a"].after is None and "disagree" in rows["a"].note


def test_the_golden_cases_replay() -> None:
    """The real sets: every GPU log's plan is within the tolerance, and the CPU build's is exact."""
    gpu_rows = leave_one_out(golden_gpu_cases())
    assert gpu_rows and all(abs(r.before) <= 2 for r in gpu_rows)
    assert any(r.calibrated for r in gpu_rows) and any(not r.calibrated for r in gpu_rows)
    cpu_rows = leave_one_out(cpu_golden_cases())
    assert cpu_rows and all(r.before == 0 and r.after in (0, None) for r in cpu_rows)


def test_a_calibration_that_makes_the_plan_refused_is_counted_apart_from_not_calibrated() -> None:
    cases = [
        _case("a", config(VLLM, max_model_len=8192), 0.96),
        _case("b", config(VLLM, max_model_len=16384), 0.96),
    ]
    fits = cases[1].plan

    def refused_once_calibrated(calibration: object) -> Prediction | str:
        return fits(None) if calibration is None else "refused: max_model_len 16384 does not fit"
    cases[1] = Case(cases[1].id, cases[1].key, cases[1].observed, refused_once_calibrated)
    cases.append(_case("lone", config(VLLM, model=model("Qwen/Qwen2.5-7B-Instruct")), 0.96))
    rows = {r.id: r for r in leave_one_out(cases)}
    assert rows["b"].refused and not rows["b"].calibrated
    assert rows["b"].note == "refused: max_model_len 16384 does not fit"
    assert not rows["lone"].refused and not rows["lone"].calibrated
    summary = summarize(list(rows.values()))
    assert (summary.cases, summary.calibrated, summary.refused) == (3, 1, 1)
