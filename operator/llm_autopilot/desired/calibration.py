"""Which KV calibration a reconcile plans with, and the sample its verification adds. Pure.

The store (planner/calibration.py) changes whenever any deployment is verified. A deployment must not roll
because another one was measured, so the calibration is chosen once per spec -- when a spec is first planned,
for every GPU pool it is planned on -- and kept in ``status.kvCalibration`` with the spec's hash: remediation
steps, resyncs and replica changes (``/scale``, an HPA, KEDA) of that spec plan with the same choices; the next
change of the spec (other than replicas) takes the store as it is then. A new choice is recorded before the
children that plan with it (``Intent.pin``, written with remediation's step), so a status write lost after them
does not make it again from a store that has changed meanwhile. A deployment planned before this field
existed keeps planning uncalibrated until its spec changes.

A sample is the measured / predicted KV memory of the plan *before* calibration, so a calibrated deployment
adds what the planner's arithmetic missed, not its own correction again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from llm_autopilot.api.v1alpha1 import KVCalibrationChoice, KVCalibrationStatus
from llm_autopilot.desired.status_read import read_section
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

#: said when a spec planned before the calibration was chosen per spec keeps planning without it
PLANNED_BEFORE = ("not calibrated: this spec was planned before the operator chose calibrations; the next "
                  "spec change takes the calibration store as it is then")
#: the spec fields that do not change what is planned per replica
_NOT_PLANNED = frozenset({"replicas"})
_CANDIDATES = 16
_NAME_MAX = 253


def spec_hash(spec: Mapping[str, Any]) -> str:
    """The hash of the spec as written, without replicas (a scale is not a new plan)."""
    planned = {k: v for k, v in spec.items() if k not in _NOT_PLANNED}
    return hashlib.sha256(json.dumps(planned, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_pin(raw: Any) -> KVCalibrationStatus | None:
    """status.kvCalibration as read (None: absent or malformed: chosen again)."""
    return read_section(KVCalibrationStatus, raw)


def _as_choice(pin: KVCalibrationStatus) -> KVCalibrationChoice:
    return KVCalibrationChoice(**{name: getattr(pin, name) for name in KVCalibrationChoice.model_fields})


def _choice_key(choice: KVCalibrationChoice) -> CalibrationKey:
    return CalibrationKey(choice.gpu_product, choice.vllm_version, choice.family)


@dataclass
class Calibrations:
    """The calibration each candidate plan takes in one reconcile of the spec whose hash is ``spec``."""

    store: CalibrationStore | None
    #: the choices already fixed for this spec (None: none yet, they are made now)
    pinned: dict[CalibrationKey, KVCalibrationChoice] | None
    spec: str
    now: datetime
    #: the spec was planned before pins existed (status.plan, no status.kvCalibration): it stays uncalibrated
    planned_before: bool = False
    #: why the store could not be read this time (None: read, or the operator keeps none)
    unreadable: str | None = None
    _found: dict[CalibrationKey, KVCalibration | NotCalibrated] = field(default_factory=dict)

    @classmethod
    def of(cls, spec: Mapping[str, Any], status: Mapping[str, Any], store: CalibrationStore | None, now: datetime,
           unreadable: str | None = None, *, chosen_again: bool = False) -> Calibrations:
        """``chosen_again``: the pin read was set aside (not the operator's): chosen as for a new spec, not taken
        for a spec planned before pins existed."""
        digest = spec_hash(spec)
        raw = status.get("kvCalibration")
        pin = read_pin(raw)
        pinned = ({_choice_key(c): c for c in (*pin.candidates, _as_choice(pin))}
                  if pin is not None and pin.spec_hash == digest else None)
        planned_before = raw is None and status.get("plan") is not None and not chosen_again
        return cls(store, pinned, digest, now, planned_before, unreadable)

    @property
    def kept(self) -> bool:
        """Whether the operator keeps a store (read or not): without one every choice is the same "not
        calibrated", with one the next pass may choose otherwise."""
        return self.store is not None or self.unreadable is not None

    def lookup(self, key: CalibrationKey) -> KVCalibration | NotCalibrated:
        if key not in self._found:
            self._found[key] = self._choose(key)
        return self._found[key]

    def applied(self, key: CalibrationKey) -> KVCalibration | None:
        """What a plan for ``key`` applies (None: nothing)."""
        found = self.lookup(key)
        return found if isinstance(found, KVCalibration) else None

    def _choose(self, key: CalibrationKey) -> KVCalibration | NotCalibrated:
        if self.pinned is not None:
            choice = self.pinned.get(key)
            if choice is None:  # a GPU this spec was not planned on when its choices were fixed
                return NotCalibrated(key, "not calibrated: the spec's calibrations were fixed before it was "
                                          f"planned on {key.gpu_product}")
            if choice.ratio is None:
                return NotCalibrated(key, choice.message)
            return KVCalibration(key, choice.ratio, choice.deployments)
        if self.planned_before:
            return NotCalibrated(key, PLANNED_BEFORE)
        if max(len(key.gpu_product), len(key.family)) > _NAME_MAX or len(key.vllm_version) > 64:
            return NotCalibrated(key, "not calibrated: the GPU product or the model's family name is too long "
                                      "to keep as a calibration key")
        if self.unreadable is not None:
            return NotCalibrated(key, f"not calibrated: the calibration store could not be read "
                                      f"({self.unreadable})"[:400])
        if self.store is None:
            return NotCalibrated(key, "not calibrated: the operator keeps no calibration store")
        return calibration_for(self.store, key, self.now)

    def _choice(self, key: CalibrationKey, estimate: MemoryEstimate | None) -> KVCalibrationChoice:
        found = self.lookup(key)
        if isinstance(found, KVCalibration):
            if estimate is not None:
                message = found.reason(estimate.uncalibrated_kv_bytes, estimate.total_bytes)
            else:
                message = (f"KV calibrated x{found.ratio:.4f} from {found.deployments} deployment(s) on "
                           f"{key.gpu_product} with vLLM {key.vllm_version}")
            ratio: float | None = found.ratio
            deployments = found.deployments
        else:
            message, ratio, deployments = found.reason, None, 0
        return KVCalibrationChoice(gpu_product=key.gpu_product[:_NAME_MAX], vllm_version=key.vllm_version[:64],
                                   family=key.family[:_NAME_MAX], ratio=ratio, deployments=deployments,
                                   message=message[:400])

    def pin_for(self, key: CalibrationKey, estimate: MemoryEstimate) -> KVCalibrationStatus:
        """status.kvCalibration: the plan in force's choice (key ``key``, its estimate) on top, and every GPU's
        choice this spec has been planned with (the pinned ones, then those made now)."""
        chosen = self._choice(key, estimate)
        known = {**(self.pinned or {}), key: chosen}
        for other in self._found:
            known.setdefault(other, self._choice(other, None))
        candidates = tuple(known[k] for k in sorted(known, key=str))[:_CANDIDATES]
        return KVCalibrationStatus(**chosen.model_dump(), spec_hash=self.spec, candidates=candidates)


@dataclass(frozen=True)
class SampleToRecord:
    """What the shell adds to the calibration store after a verification read new figures."""

    key: CalibrationKey
    sample: Sample


def sample_of(key: CalibrationKey, results: tuple[tuple[str, Verification], ...], uncalibrated: float,
              deployment: str, now: datetime) -> SampleToRecord | None:
    """One sample per deployment: the median pod's measured / uncalibrated-predicted KV memory (None: nothing
    read, or no KV room predicted). ``uncalibrated``: the predicted room the arithmetic alone gives (the plan's;
    for groups across nodes the bounding stage's, whose blocks the engine reports)."""
    if not results or uncalibrated <= 0:
        return None
    ratios = sorted(v.actual_kv_bytes / uncalibrated for _, v in results)
    return SampleToRecord(key, Sample(ratios[len(ratios) // 2], now, deployment))
