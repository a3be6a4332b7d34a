"""Which KV calibration a reconcile plans with, and the sample its verification adds. Pure.

The store (planner/calibration.py) changes whenever any deployment is verified. A deployment must not roll
because another one was measured, so the calibration is chosen once per spec generation, when the generation is
first planned, and kept in ``status.kvCalibration``: the remediation steps and resyncs of that generation plan
with the same one; the next spec change takes the store as it is then. A deployment planned before this field
existed keeps planning uncalibrated until its spec changes.

A sample is the measured / predicted KV memory of the plan *before* calibration, so a calibrated deployment
adds what the planner's arithmetic missed, not its own correction again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from llm_autopilot.api.v1alpha1 import KVCalibrationStatus
from llm_autopilot.planner.calibration import (
    CalibrationKey,
    CalibrationStore,
    KVCalibration,
    NotCalibrated,
    Sample,
    calibration_for,
)
from llm_autopilot.planner.memory import MemoryEstimate
from llm_autopilot.planner.verify import Verification

#: said when a generation planned before the calibration was chosen per generation keeps planning without it
PLANNED_BEFORE = ("not calibrated: this generation was planned before the operator chose calibrations; the next "
                  "spec change takes the calibration store as it is then")


def read_pin(raw: Any) -> KVCalibrationStatus | None:
    """status.kvCalibration as read (None: absent or malformed, then chosen again)."""
    if not isinstance(raw, Mapping):
        return None
    try:
        return KVCalibrationStatus.model_validate(raw)
    except ValidationError:
        return None


@dataclass
class Calibrations:
    """The calibration each candidate plan takes in one reconcile of generation ``generation``."""

    store: CalibrationStore | None
    pin: KVCalibrationStatus | None
    generation: int
    now: datetime
    #: the generation was planned before (status.plan for it) with no pin: it stays uncalibrated
    planned_before: bool = False
    _found: dict[CalibrationKey, KVCalibration | NotCalibrated] = field(default_factory=dict)

    @classmethod
    def of(cls, status: Mapping[str, Any], store: CalibrationStore | None, generation: int | None,
           now: datetime) -> Calibrations:
        pin = read_pin(status.get("kvCalibration"))
        gen = generation or 0
        planned_before = (pin is None and status.get("plan") is not None
                          and status.get("observedGeneration") == generation)
        return cls(store, pin if pin is not None and pin.generation == gen else None, gen, now, planned_before)

    def lookup(self, key: CalibrationKey) -> KVCalibration | NotCalibrated:
        if key not in self._found:
            self._found[key] = self._choose(key)
        return self._found[key]

    def applied(self, key: CalibrationKey) -> KVCalibration | None:
        """What a plan for ``key`` applies (None: nothing)."""
        found = self.lookup(key)
        return found if isinstance(found, KVCalibration) else None

    def _choose(self, key: CalibrationKey) -> KVCalibration | NotCalibrated:
        pin = self.pin
        if pin is not None:
            if (pin.gpu_product, pin.vllm_version, pin.family) != (key.gpu_product, key.vllm_version, key.family):
                return NotCalibrated(key, f"not calibrated: this generation was calibrated for {pin.gpu_product} "
                                          f"with vLLM {pin.vllm_version} ({pin.family})")
            if pin.ratio is None:
                return NotCalibrated(key, pin.message)
            return KVCalibration(key, pin.ratio, pin.deployments)
        if self.planned_before:
            return NotCalibrated(key, PLANNED_BEFORE)
        if self.store is None:
            return NotCalibrated(key, "not calibrated: the operator keeps no calibration store")
        return calibration_for(self.store, key, self.now)

    def pin_for(self, key: CalibrationKey, estimate: MemoryEstimate) -> KVCalibrationStatus:
        """status.kvCalibration for the plan chosen (key ``key``, its estimate)."""
        found = self.lookup(key)
        if isinstance(found, KVCalibration):
            room = estimate.kv_cache_bytes - estimate.kv_calibration_bytes
            message = found.reason(room, estimate.total_bytes)
            ratio: float | None = found.ratio
            deployments = found.deployments
        else:
            message, ratio, deployments = found.reason, None, 0
        return KVCalibrationStatus(generation=self.generation, gpu_product=key.gpu_product,
                                   vllm_version=key.vllm_version, family=key.family, ratio=ratio,
                                   deployments=deployments, message=message[:400])


@dataclass(frozen=True)
class SampleToRecord:
    """What the shell adds to the calibration store after a verification read new figures."""

    key: CalibrationKey
    sample: Sample


def sample_of(key: CalibrationKey, results: tuple[tuple[str, Verification], ...], estimate: MemoryEstimate,
              deployment: str, now: datetime) -> SampleToRecord | None:
    """One sample per deployment: the median pod's measured / uncalibrated-predicted KV memory (None: nothing
    read, or no KV room predicted)."""
    uncalibrated = estimate.kv_cache_bytes - estimate.kv_calibration_bytes
    if not results or uncalibrated <= 0:
        return None
    ratios = sorted(v.actual_kv_bytes / uncalibrated for _, v in results)
    return SampleToRecord(key, Sample(ratios[len(ratios) // 2], now, deployment))
