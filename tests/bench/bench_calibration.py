"""KV calibration against the golden cases: the planner's KV error before and after (`make bench-calibration`).

For every golden case the error is the one ``PlanVerified`` judges (planner/verify.py): what vLLM printed
against the planner's prediction, in percent of one GPU's memory. Then leave-one-out: each case is planned again
with the calibration (planner/calibration.py) that the *other* cases would have left in the store, one sample
per case as if each had been one deployment, all measured within the last day. The plan goes through the real
memory model (planner/memory.py), so calibration's cap and the fit checks apply; a key no other case measured
is "not calibrated", with the reason the planner gives.

Two sets: the published GPU logs (tests/data/golden_vllm_logs.json, through tests/golden.py) and the CPU build
of vLLM (tests/data/vllm_cpu_kv_golden.json: the room is given by ``--kv-cache-memory-bytes``, the planner is
exact, and calibration must leave it so). Deterministic: the time is fixed. Prints Markdown; asserts nothing.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from llm_autopilot.catalog.hf_config import parse_hf_config
from llm_autopilot.domain.precision import GIB, KVCacheDtype
from llm_autopilot.planner.calibration import (
    CalibrationKey,
    CalibrationStore,
    KVCalibration,
    NotCalibrated,
    Sample,
    calibration_for,
    key_of,
    record,
)
from llm_autopilot.planner.config import ServingConfig
from llm_autopilot.planner.kv_cache import kv_block_bytes, kv_capacity
from llm_autopilot.planner.memory import estimate
from llm_autopilot.planner.verify import (
    TOLERANCE_PERCENT,
    Observed,
    Prediction,
    Source,
    observed_from_log,
    predict,
    verify,
)
from llm_autopilot.vllm.versions import VLLMVersion, behaviour_of
from tests.conftest import DATA
from tests.golden import load_cases

#: the bench's clock: every sample is measured before it
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
#: case i of a set was measured this long before NOW times (i + 1): all within the last day
SPACING = timedelta(minutes=45)

#: a plan: the prediction vLLM's figures are compared with, or the planner's refusal (a fit check failed)
Planner = Callable[[KVCalibration | None], Prediction | str]


@dataclass(frozen=True)
class Case:
    id: str
    key: CalibrationKey
    #: what vLLM reported for this case
    observed: Observed
    plan: Planner


@dataclass(frozen=True)
class Row:
    id: str
    key: CalibrationKey
    #: measured / predicted KV memory of the uncalibrated plan: this case's sample
    ratio: float
    before: float
    #: the error of the calibrated plan; None: not calibrated (or the calibrated plan was refused)
    after: float | None
    #: the calibration's reason, NotCalibrated's reason, or the planner's refusal
    note: str
    #: a calibration was found and the plan it gives is refused (a plan calibration pushes past the budget is
    #: refused like an uncalibrated one): not the same as "no calibration"
    refused: bool = False

    @property
    def calibrated(self) -> bool:
        return self.after is not None


def gpu_planner(config: ServingConfig) -> Planner:
    """The memory model on a fixed configuration (the one the log ran), with the calibration applied."""
    def plan(calibration: KVCalibration | None) -> Prediction | str:
        c = dataclasses.replace(config, kv_calibration=calibration)
        est = estimate(c)
        if not est.fits:
            return "refused: " + "; ".join(est.problems)
        return predict(c, est)
    return plan


def golden_gpu_cases() -> list[Case]:
    """The replayable published GPU logs of starts that served. vLLM's figures are tests/golden.py's (its
    "Available KV cache memory" and tokens; for pipeline parallelism the last stage's room, which the log excerpt
    does not print)."""
    cases, raw = load_cases()
    by_id = {c["id"]: c for c in raw}
    result = []
    for case in cases:
        if by_id[case.id].get("started") is False:  # vLLM refused to start: no pod ran to measure and calibrate
            continue
        gpu_product = str(by_id[case.id]["gpu"]).split()[0]  # "H100-80GB (form factor not printed; ...)"
        tokens = case.printed.get("kv_cache_tokens")
        observed = Observed(Source.LOG, kv_cache_tokens=int(tokens) if tokens is not None else None,
                            kv_cache_bytes=round(float(case.printed["kv_cache_gib"]) * GIB))
        result.append(Case(case.id, key_of(gpu_product, case.config.vllm.version, case.config.model), observed,
                           gpu_planner(case.config)))
    return result


def cpu_golden_cases() -> list[Case]:
    """The CPU build's starts that printed a KV cache size. The room is ``--kv-cache-memory-bytes``, which also
    stands for "GPU memory" (as in tests/unit/test_verify.py); calibration moves that room, capped."""
    golden = json.loads((DATA / "vllm_cpu_kv_golden.json").read_text())
    behaviour = behaviour_of(VLLMVersion.parse(golden["vllm_version"]))
    block = int(golden["block_size"])
    result = []
    for i, case in enumerate(c for c in golden["cases"] if "kv_cache_tokens" in c):
        model = parse_hf_config(case["config"], case["model"])
        dtype = KVCacheDtype.FP8 if case["kv_cache_dtype"] == "fp8" else KVCacheDtype.AUTO

        def plan(calibration: KVCalibration | None, case: dict[str, Any] = case, model: Any = model,
                 dtype: KVCacheDtype = dtype) -> Prediction | str:
            room = float(case["kv_cache_memory_bytes"])
            available = room + (calibration.delta_bytes(room, room) if calibration is not None else 0.0)
            capacity = kv_capacity(
                model, 1, 1, dtype, available_bytes=available, max_model_len=case["max_model_len"],
                max_num_batched_tokens=case["max_num_batched_tokens"] * behaviour.in_flight_batches(on_cpu=True),
                block_size=block, limit=case["max_model_len"], reserve_null_block=behaviour.reserves_null_block,
                group_aware_size=behaviour.group_aware_kv_size)
            if capacity.largest_len < case["max_model_len"]:
                return f"refused: max_model_len {case['max_model_len']} does not fit ({capacity.largest_len})"
            page = kv_block_bytes(model, 1, 1, dtype, block)
            return Prediction(capacity.tokens, int(available // page), block, available, page, gpu_total_bytes=room)

        label = f"{case['model'].split('/')[-1]} {case['kv_cache_dtype']} {case['max_model_len']} #{i}"
        result.append(Case(label, key_of("CPU", behaviour.version, model), observed_from_log(case["line"]), plan))
    return result


def _error(case: Case, calibration: KVCalibration | None, now: datetime) -> tuple[float | None, str]:
    planned = case.plan(calibration)
    if isinstance(planned, str):
        return None, planned
    return verify(planned, case.observed, vllm_version=case.key.vllm_version, now=now).error_percent, ""


def leave_one_out(cases: Sequence[Case], now: datetime = NOW) -> list[Row]:
    """Each case's error before, and after the calibration the other cases' samples give its key."""
    measured = []
    for case in cases:
        planned = case.plan(None)
        if isinstance(planned, str):
            raise ValueError(f"{case.id}: the uncalibrated plan is refused: {planned}")
        measured.append((planned, verify(planned, case.observed, vllm_version=case.key.vllm_version, now=now)))
    rows = []
    for i, case in enumerate(cases):
        store = CalibrationStore()
        for j, (other, (_, seen)) in enumerate(zip(cases, measured, strict=True)):
            if j != i:
                store = record(store, other.key, Sample(seen.ratio, now - SPACING * (j + 1), f"golden/{other.id}"),
                               now)
        prediction, seen = measured[i]
        found = calibration_for(store, case.key, now)
        refusal = ""
        if isinstance(found, NotCalibrated):
            after, note = None, found.reason
        else:
            after, refusal = _error(case, found, now)
            note = refusal or found.reason(prediction.kv_cache_bytes, prediction.gpu_total_bytes)
        rows.append(Row(case.id, case.key, seen.ratio, seen.error_percent, after, note, refused=bool(refusal)))
    return rows


@dataclass(frozen=True)
class Summary:
    cases: int
    calibrated: int
    #: cases with a calibration whose calibrated plan is refused (counted apart from "not calibrated")
    refused: int
    #: mean |error| and share within the tolerance, (before, after): among the calibrated cases, and overall
    #: (an uncalibrated case's error after is its error before)
    calibrated_mean: tuple[float, float]
    calibrated_within: tuple[float, float]
    overall_mean: tuple[float, float]
    overall_within: tuple[float, float]


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _within(values: list[float]) -> float:
    return sum(abs(v) <= TOLERANCE_PERCENT for v in values) / len(values) * 100 if values else 0.0


def summarize(rows: Sequence[Row]) -> Summary:
    cal = [r for r in rows if r.after is not None]
    cal_before = [r.before for r in cal]
    cal_after = [r.after for r in cal if r.after is not None]
    before = [r.before for r in rows]
    after = [r.after if r.after is not None else r.before for r in rows]
    return Summary(
        cases=len(rows), calibrated=len(cal), refused=sum(r.refused for r in rows),
        calibrated_mean=(_mean([abs(v) for v in cal_before]), _mean([abs(v) for v in cal_after])),
        calibrated_within=(_within(cal_before), _within(cal_after)),
        overall_mean=(_mean([abs(v) for v in before]), _mean([abs(v) for v in after])),
        overall_within=(_within(before), _within(after)))


def report(title: str, rows: Sequence[Row]) -> str:
    lines = [f"### {title}", "", "| case | key | ratio | error before | error after | calibration |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        after = f"{r.after:+.2f} %" if r.after is not None else "\u2014"
        lines.append(f"| {r.id} | {r.key} | {r.ratio:.4f} | {r.before:+.2f} % | {after} | {r.note} |")
    s = summarize(rows)
    lines += ["", f"{s.cases} cases, {s.calibrated} calibrated, {s.refused} refused once calibrated, "
              f"{s.cases - s.calibrated - s.refused} not calibrated "
              f"(tolerance \u00b1{TOLERANCE_PERCENT:g} % of GPU memory)",
              f"- calibrated cases: mean |error| {s.calibrated_mean[0]:.3f} % \u2192 {s.calibrated_mean[1]:.3f} %, "
              f"within tolerance {s.calibrated_within[0]:.0f} % \u2192 {s.calibrated_within[1]:.0f} %",
              f"- all cases: mean |error| {s.overall_mean[0]:.3f} % \u2192 {s.overall_mean[1]:.3f} %, "
              f"within tolerance {s.overall_within[0]:.0f} % \u2192 {s.overall_within[1]:.0f} %", ""]
    return "\n".join(lines)


def main() -> None:
    print(f"KV error in % of GPU memory (vLLM's figures - the plan's), before and after a leave-one-out "
          f"calibration; samples measured within the day before {NOW.isoformat()}\n")
    print(report("Published GPU logs (tests/data/golden_vllm_logs.json)", leave_one_out(golden_gpu_cases())))
    print(report("CPU build of vLLM (tests/data/vllm_cpu_kv_golden.json; the room stands for GPU memory)",
                 leave_one_out(cpu_golden_cases())))


if __name__ == "__main__":
    main()
