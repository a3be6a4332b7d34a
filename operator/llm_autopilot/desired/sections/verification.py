"""Section: status.kvCalibration (the calibration the plan applies), status.verification with PlanVerified (vLLM's
own KV figures of the plan's Ready pods, read once per plan and judged by planner/verify.py), and status.releases
(each vLLM release's last reading, kept across upgrades)."""

from __future__ import annotations

from llm_autopilot.api.status import ReleaseVerification
from llm_autopilot.api.v1alpha1 import KVCalibrationStatus, VerificationStatus
from llm_autopilot.desired.calibration import Calibrations, sample_of
from llm_autopilot.desired.planning import Rendered, calibration_key
from llm_autopilot.desired.status_fields import KV_CALIBRATION, RELEASES, VERIFICATION
from llm_autopilot.desired.vocabulary import Asks, Draft, VerificationAsk
from llm_autopilot.planner import verify


def known_verification(known: VerificationStatus | None, tolerance_percent: float) -> verify.Known | None:
    """Which plan and pods status.verification read (None: nothing read, or judged with another tolerance than
    the spec's now: read again and judge again)."""
    if known is None or known.plan_hash is None or known.tolerance_percent != tolerance_percent:
        return None
    return verify.Known(known.plan_hash, frozenset(p.pod for p in known.pods) | {s.pod for s in known.stages or ()})


#: status.releases keeps this many releases (the CRD's bound)
RELEASES_KEPT = 8


def releases_seen(previous: tuple[ReleaseVerification, ...],
                  found: VerificationStatus) -> tuple[ReleaseVerification, ...]:
    """status.releases with the reading just made: that release's entry replaced and moved last (the newest last),
    the others kept, at most RELEASES_KEPT."""
    entry = ReleaseVerification(vllm_version=found.vllm_version, predicted_tokens=found.predicted_tokens,
                                actual_tokens=found.actual_tokens, error_percent=found.error_percent,
                                verified=found.verified, plan_hash=found.plan_hash, time=found.time)
    kept = tuple(e for e in previous if e.vllm_version != entry.vllm_version)
    return (*kept, entry)[-RELEASES_KEPT:]


def _moving_from(d: Draft, version: str) -> str | None:
    """The release the fleet moves from while a change to ``version`` is under way (status.canary, attested, of
    that release: from its start until the fleet is Ready on it); None: no release change."""
    change = d.read.canary
    return change.from_vllm_version if change is not None and change.vllm_version == version else None


def report_calibration(d: Draft, r: Rendered, calibrations: Calibrations) -> KVCalibrationStatus:
    """status.kvCalibration: the calibrations this spec plans with (chosen once per spec, replicas aside)."""
    pin = calibrations.pin_for(calibration_key(r), r.plan.estimate)
    d.put(KV_CALIBRATION, pin)
    if calibrations.kept and (patch := d.patch_of(KV_CALIBRATION)) is not None:
        d.out.pin = patch  # recorded before the objects that plan with it (no store: nothing to choose)
    return pin


def report_verification(d: Draft, r: Rendered, tolerance: float, calibration: str | None) -> Asks | None:
    """status.verification and PlanVerified: the plan's Ready pods read once per plan (asked for, then judged);
    what they read is also a calibration sample. ``calibration``: what the plan applied (None: none)."""
    known = known_verification(d.read.verification, tolerance)
    seen = d.world.verification
    if seen is None or seen.plan_hash != r.plan_hash:
        return Asks(verification=VerificationAsk(d.owner.namespace, d.owner.name, r.plan_hash, known))
    config, version = r.plan.config, str(r.plan.config.vllm.version)
    uncalibrated = r.plan.estimate.uncalibrated_kv_bytes
    if config.pipeline_parallel_size > 1:  # groups across nodes: the engine and each stage
        group = verify.predict_group(config)
        uncalibrated = group.uncalibrated_kv_bytes
        decision = verify.decide_groups(group, r.plan_hash, known, seen.readings, vllm_version=version,
                                        now=d.now, tolerance_percent=tolerance)
    else:
        decision = verify.decide(verify.predict(config, r.plan.estimate), r.plan_hash, known, seen.readings,
                                 vllm_version=version, now=d.now, tolerance_percent=tolerance,
                                 moving_from=_moving_from(d, version))
    if not decision.keep:
        found = VerificationStatus.of_pods(decision.results, plan_hash=r.plan_hash, calibration=calibration,
                                           stages=decision.stages)
        # a pod of another release measured another engine than the key's: it calibrates nothing
        d.out.calibration_sample = sample_of(calibration_key(r), decision.results, uncalibrated,
                                             f"{d.owner.namespace}/{d.owner.name}",
                                             d.now) if decision.mismatch is None else None
        d.put(VERIFICATION, found)
        if found is not None and decision.mismatch is None:  # a pod of another release: not this plan's figures
            d.put(RELEASES, releases_seen(d.read.releases or (), found))
    status, reason, message = decision.condition
    if not reason:
        return None
    before = d.conditions
    d.condition(verify.PLAN_VERIFIED, status, reason, message)
    if decision.event is not None and before != d.conditions:
        d.event(*decision.event)
        if decision.mismatch is not None:
            d.event("Warning", "VLLMVersionMismatch", decision.mismatch)
    if reason == verify.UNREADABLE:
        d.out.settled = False  # read again on the next resync
    return None
