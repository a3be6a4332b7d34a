"""Calibration of the KV-cache prediction from what earlier deployments measured. Pure.

For each key (GPU product, vLLM version, architecture family) the store keeps one sample per deployment: the
measured / predicted ratio of KV memory (planner/verify.py) and when it was measured. A later plan for the same
key takes the robust mean of the samples, applied to its predicted KV memory and capped at :data:`CAP_PERCENT`
of GPU memory, and names it in its reasons ("KV calibrated -1.2 % from 3 deployments on H100-80GB with
vLLM 0.33.0"). The planner applies it before any fit check (planner/memory.py), so a plan that calibration
pushes past the budget is refused with the same message as an uncalibrated one.

One bad deployment must not poison the others:

- a sample outside :data:`RATIO_BOUNDS` is a broken measurement and is never kept;
- two samples that disagree by more than :data:`DISAGREEMENT` calibrate nothing (which one is right?);
- from three samples on, those further than 3 scaled MADs (at least :data:`DISAGREEMENT`) from the median are
  outliers and ignored;
- a sample's weight halves every :data:`HALF_LIFE` and it is dropped after :data:`MAX_AGE`; the correction
  applied shrinks with the newest sample's weight, so an old calibration fades out;
- the key holds the exact vLLM version: a version no sample covers is not calibrated;
- the store is input (a ConfigMap anyone with write access could forge): every entry is checked, and an entry
  that is not a well-formed sample is dropped with a message, never trusted.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from llm_autopilot.domain.architecture import ModelArchitecture
from llm_autopilot.domain.attestation import keyed_attestation
from llm_autopilot.planner.start_times import Starts, parse_starts, starts_to_json
from llm_autopilot.planner.store_fields import CLOCK_SKEW, NAMESPACED, attested_entries, past_time, text
from llm_autopilot.vllm.versions import VLLMVersion

#: the largest correction, in percent of one GPU's memory, either way
CAP_PERCENT = 5.0
#: measured / predicted KV ratios outside this range are broken measurements, not calibration
RATIO_BOUNDS = (0.5, 1.5)
#: ratios this close always agree (a ratio 2 % apart is the planner's own error, not an outlier)
DISAGREEMENT = 0.02
HALF_LIFE = timedelta(days=14)
MAX_AGE = timedelta(days=90)
#: samples kept per key (the newest)
MAX_SAMPLES = 32
#: store format version
STORE_VERSION = 1
#: the key of the operator's ConfigMap that holds the store's JSON
CONFIGMAP_KEY = "calibration.json"
#: a GPU product (a catalog name or a GPU Feature Discovery label value) and a family (config.json's model_type
#: or architecture), whole
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_NAME_WHAT = "letters, digits, '.', '_' and '-'"
#: bump when the attested content changes (samples attested by an older scheme are then dropped once)
ATTESTATION_SCHEME = "llm-autopilot.io/calibration-sample/v1"


class CalibrationError(ValueError):
    """The store as a whole cannot be read (not an object, unknown format version)."""


@dataclass(frozen=True, order=True)
class CalibrationKey:
    gpu_product: str
    vllm_version: str
    family: str

    def __str__(self) -> str:
        return f"{self.gpu_product} with vLLM {self.vllm_version} ({self.family})"


def family_of(model: ModelArchitecture) -> str:
    """The architecture family a calibration is kept for: config.json's ``model_type``."""
    return model.model_type if model.model_type != "unknown" else model.architecture


def key_of(gpu_product: str, vllm_version: VLLMVersion | str, model: ModelArchitecture) -> CalibrationKey:
    version = vllm_version if isinstance(vllm_version, VLLMVersion) else VLLMVersion.parse(vllm_version)
    return CalibrationKey(gpu_product, str(version), family_of(model))


@dataclass(frozen=True)
class Sample:
    ratio: float
    time: datetime
    #: ``namespace/name`` of the deployment measured: one sample per deployment
    deployment: str


@dataclass(frozen=True)
class CalibrationStore:
    entries: Mapping[CalibrationKey, tuple[Sample, ...]] = field(default_factory=dict)
    #: the vLLM starts observed per (image, model, GPU product): the startup probe's learned budget
    starts: Starts = field(default_factory=dict)


@dataclass(frozen=True)
class KVCalibration:
    """What to apply for one key: ``ratio`` x the predicted KV memory, capped."""

    key: CalibrationKey
    ratio: float
    deployments: int
    cap_percent: float = CAP_PERCENT

    def delta_bytes(self, kv_bytes: float, gpu_total_bytes: float) -> float:
        """The change to a predicted KV room of ``kv_bytes`` (none for a room that is not there)."""
        if kv_bytes <= 0 or gpu_total_bytes <= 0:
            return 0.0
        cap = self.cap_percent / 100 * gpu_total_bytes
        return max(-cap, min(cap, kv_bytes * (self.ratio - 1)))

    def reason(self, kv_bytes: float, gpu_total_bytes: float) -> str:
        percent = self.delta_bytes(kv_bytes, gpu_total_bytes) / gpu_total_bytes * 100 if gpu_total_bytes else 0.0
        capped = " (capped)" if abs(kv_bytes * (self.ratio - 1)) > self.cap_percent / 100 * gpu_total_bytes else ""
        sign = "\u2212" if percent < 0 else "+"
        plural = "deployment" if self.deployments == 1 else "deployments"
        return (f"KV calibrated {sign}{abs(percent):.1f} % of GPU memory{capped} from {self.deployments} {plural} "
                f"on {self.key.gpu_product} with vLLM {self.key.vllm_version}")


@dataclass(frozen=True)
class NotCalibrated:
    key: CalibrationKey
    reason: str


def _weight(sample: Sample, now: datetime) -> float:
    age = max((now - sample.time).total_seconds(), 0.0)
    return float(0.5 ** (age / HALF_LIFE.total_seconds()))


def _current(samples: tuple[Sample, ...], now: datetime) -> list[Sample]:
    return [s for s in samples if now - s.time <= MAX_AGE and s.time <= now + CLOCK_SKEW]


def _inliers(samples: list[Sample]) -> list[Sample]:
    ratios = [s.ratio for s in samples]
    median = statistics.median(ratios)
    spread = max(3 * 1.4826 * statistics.median(abs(r - median) for r in ratios), DISAGREEMENT)
    return [s for s in samples if abs(s.ratio - median) <= spread]


def calibration_for(store: CalibrationStore, key: CalibrationKey, now: datetime) -> KVCalibration | NotCalibrated:
    samples = _current(store.entries.get(key, ()), now)
    if not samples:
        covered = sorted({k.vllm_version for k, v in store.entries.items()
                          if (k.gpu_product, k.family) == (key.gpu_product, key.family) and _current(v, now)})
        if covered and key.vllm_version not in covered:
            return NotCalibrated(key, f"not calibrated: no deployment measured {key}; the calibration covers "
                                      f"vLLM {', '.join(covered)} only")
        return NotCalibrated(key, f"not calibrated: no recent deployment measured {key}")
    if len(samples) == 2 and abs(samples[0].ratio - samples[1].ratio) > DISAGREEMENT:
        return NotCalibrated(key, f"not calibrated: the 2 deployments measured on {key} disagree "
                                  f"(KV ratios {samples[0].ratio:.3f} and {samples[1].ratio:.3f})")
    used = _inliers(samples) if len(samples) >= 3 else samples
    weights = [_weight(s, now) for s in used]
    mean = sum(w * s.ratio for w, s in zip(weights, used, strict=True)) / sum(weights)
    freshness = max(weights)  # an old calibration fades out
    return KVCalibration(key, 1 + (mean - 1) * freshness, len(used))


def record(store: CalibrationStore, key: CalibrationKey, sample: Sample, now: datetime) -> CalibrationStore:
    """A new store with ``sample`` (replacing the deployment's earlier one); aged samples dropped. A sample
    outside :data:`RATIO_BOUNDS` (a broken measurement) leaves the store as it is."""
    if not _valid_ratio(sample.ratio):
        return store
    kept = [s for s in _current(store.entries.get(key, ()), now) if s.deployment != sample.deployment]
    samples = tuple(sorted([*kept, sample], key=lambda s: s.time)[-MAX_SAMPLES:])
    return CalibrationStore({**store.entries, key: samples}, store.starts)


def _valid_ratio(value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            and RATIO_BOUNDS[0] <= value <= RATIO_BOUNDS[1])


def _version(entry: Mapping[str, Any]) -> str:
    written = text(entry, "vllmVersion")
    version = str(VLLMVersion.parse(written))
    if written != version:  # VLLMVersion.parse reads a prefix; the store's key is the version, whole
        raise ValueError(f"vllmVersion must be a version such as 0.33.0, got {written!r:.80}")
    return version


def sample_attestation(key: bytes, calibration: CalibrationKey, sample: Sample) -> str:
    """The operator's attestation of one sample, for its key: who can write the ConfigMap cannot make one."""
    return keyed_attestation(key, ATTESTATION_SCHEME, _attested_content(calibration, sample))


def _attested_content(calibration: CalibrationKey, sample: Sample) -> list[Any]:
    return [calibration.gpu_product, calibration.vllm_version, calibration.family, sample.deployment,
            round(sample.ratio, 6), sample.time.isoformat()]


def _sample(raw: object, now: datetime) -> Sample:
    if not isinstance(raw, Mapping):
        raise ValueError(f"a sample must be an object, got {raw!r:.80}")
    ratio = raw.get("ratio")
    if not _valid_ratio(ratio):
        raise ValueError(f"ratio must be a number in [{RATIO_BOUNDS[0]}, {RATIO_BOUNDS[1]}], got {ratio!r:.40}")
    assert isinstance(ratio, int | float)
    return Sample(float(ratio), past_time(raw, "time", now), text(raw, "deployment", NAMESPACED, "namespace/name"))


def parse_store(data: object, now: datetime, key: bytes | None = None) -> tuple[CalibrationStore, tuple[str, ...]]:
    """The store from its JSON form, and one message per entry or sample dropped for being malformed or, with
    ``key`` (the operator's), for carrying no attestation the key makes: only the operator's own samples count.
    Its ``starts`` section is planner/start_times.py's.

    ``{"version": 1, "entries": [{"gpuProduct": ..., "vllmVersion": ..., "family": ..., "samples":
    [{"ratio": 0.98, "time": "2026-12-01T10:00:00+00:00", "deployment": "ns/name", "attestation": "..."}]}]}``
    """
    if not isinstance(data, Mapping):
        raise CalibrationError("the calibration must be a JSON object with \"version\" and \"entries\"")
    if data.get("version") != STORE_VERSION:
        raise CalibrationError(f"calibration format version {data.get('version')!r} is not {STORE_VERSION}")
    raw_entries = data.get("entries", [])
    if not isinstance(raw_entries, list):
        raise CalibrationError("calibration \"entries\" must be a list")
    read, problems = attested_entries(
        raw_entries, section="calibration", items="samples", item="sample", secret=key, scheme=ATTESTATION_SCHEME,
        key_of=lambda raw: CalibrationKey(text(raw, "gpuProduct", _NAME, _NAME_WHAT), _version(raw),
                                          text(raw, "family", _NAME, _NAME_WHAT)),
        item_of=lambda raw: _sample(raw, now), content=_attested_content)
    entries: dict[CalibrationKey, tuple[Sample, ...]] = {}
    for calibration, found in read.items():
        samples: dict[str, Sample] = {}
        for sample in found:
            if sample.deployment not in samples or samples[sample.deployment].time < sample.time:
                samples[sample.deployment] = sample  # one sample per deployment: the newest
        entries[calibration] = tuple(sorted(samples.values(), key=lambda s: s.time)[-MAX_SAMPLES:])
    starts, dropped = parse_starts(data.get("starts"), now, key)
    return CalibrationStore(entries, starts), (*problems, *dropped)


def store_to_json(store: CalibrationStore, key: bytes | None = None) -> dict[str, Any]:
    """The store's JSON form; with ``key``, each sample carries the operator's attestation."""
    def sample(k: CalibrationKey, s: Sample) -> dict[str, Any]:
        written = {"ratio": round(s.ratio, 6), "time": s.time.isoformat(), "deployment": s.deployment}
        return {**written, "attestation": sample_attestation(key, k, s)} if key is not None else written

    written: dict[str, Any] = {"version": STORE_VERSION, "entries": [
        {"gpuProduct": k.gpu_product, "vllmVersion": k.vllm_version, "family": k.family,
         "samples": [sample(k, s) for s in samples]}
        for k, samples in sorted(store.entries.items())]}
    if store.starts:  # a store without starts keeps the form it always had
        written["starts"] = starts_to_json(store.starts, key)
    return written
