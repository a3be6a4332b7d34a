"""The canary of a vLLM release change (desired/canary.py), case by case, and its Deployments (render/canary.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from llm_autopilot.api.status import BurnInStatus, CanaryStatus, PodBurnInStatus, PodVerification, VerificationStatus
from llm_autopilot.desired import canary
from llm_autopilot.desired.canary import CanaryDecision, CanaryInputs, CanaryPod, Release
from llm_autopilot.desired.status_read import ATTESTED, read_status
from llm_autopilot.render import canary as render_canary
from llm_autopilot.render.kubernetes import INPUT_HASH, content_hash, deployment
from tests.unit.test_render import inputs as render_inputs

NOW = datetime(2026, 12, 5, 22, 0, tzinfo=UTC)
OLD = Release("0.31.0", "vllm-cpu:0.31.0")
NEW = Release("0.32.0", "vllm-cpu:0.32.0")
PLAN = "newplan"
POD = "qwen-canary-abc"


def base(**changes: object) -> CanaryInputs:
    i = CanaryInputs(fleet=OLD, wanted=NEW, plan_hash=PLAN, enabled=True, replicas=2, fleet_ready=True,
                     surge_room=True, startup_seconds=600, now=NOW)
    return dataclasses.replace(i, **changes)  # type: ignore[arg-type]


def record(phase: str, *, reason: str | None = None, replaces: bool = False, plan: str = PLAN,
           message: str = "m") -> CanaryStatus:
    return CanaryStatus(vllm_version=NEW.version, image=NEW.image, from_vllm_version=OLD.version,
                        from_image=OLD.image, plan_hash=plan, phase=phase,  # type: ignore[arg-type]
                        replaces_replica=replaces, pod=POD, reason=reason, since=NOW - timedelta(minutes=5),
                        message=message)


def reading(error_percent: float, *, pod: str = POD, plan: str = PLAN) -> VerificationStatus:
    return VerificationStatus(predicted_tokens=20_000, actual_tokens=12_345, predicted_blocks=1250,
                              actual_blocks=771, predicted_kv_gib=5.0, actual_kv_gib=3.1,
                              error_percent=error_percent, tolerance_percent=2.0, verified=abs(error_percent) <= 2,
                              source="metrics", vllm_version=NEW.version, time=NOW, plan_hash=plan,
                              pods=(PodVerification(pod=pod, actual_tokens=12_345, error_percent=error_percent),))


READY = CanaryPod(POD, ready=True, age_seconds=120)
STARTING = CanaryPod(POD, ready=False, age_seconds=30)


@dataclass(frozen=True)
class Case:
    name: str
    inputs: CanaryInputs
    fleet: str
    fleet_replicas: int
    canary: bool
    phase: str | None
    held: str | None = None
    event: str | None = None
    #: words the UpgradeHeld message must quote
    quotes: tuple[str, ...] = ()


CASES = [
    Case("no change: no canary", base(fleet=NEW), "new", 2, False, None),
    Case("first deployment: nothing to guard", base(fleet=None), "new", 2, False, None),
    Case("opted out: the fleet rolls at once", base(enabled=False), "new", 2, False, None),
    Case("version change, free GPU: a canary surges", base(), "old", 2, True, "Pending", event=canary.CANARY_STARTED),
    Case("no free GPU, 2 replicas: fleet 1 + canary", base(surge_room=False), "old", 1, True, "Pending"),
    Case("no free GPU, 1 replica: the canary waits", base(surge_room=False, replicas=1), "old", 1, False,
         "Pending", held=canary.NO_ROOM_FOR_CANARY, quotes=("no free GPU",)),
    Case("replaced replica kept once decided (room seen later)",
         base(surge_room=True, known=record("Pending", replaces=True)), "old", 1, True, "Pending"),
    Case("canary starting: judged later", base(pod=STARTING), "old", 2, True, "Running"),
    Case("canary Ready, not read yet: running", base(pod=READY), "old", 2, True, "Running"),
    Case("canary Ready and verified: the fleet rolls into its GPU", base(pod=READY, verification=reading(-0.4)),
         "new", 2, False, "Passed", event=canary.CANARY_PASSED),
    Case("canary with more KV room than planned: passes", base(pod=READY, verification=reading(+6.0)), "new", 2,
         False, "Passed"),
    Case("canary KV below the tolerance: UpgradeHeld with vLLM's figures",
         base(pod=READY, verification=reading(-4.2)), "old", 2, True, "Failed", held=canary.CANARY_KV_BELOW_PLAN,
         event=canary.UPGRADE_HELD, quotes=("vLLM 0.32.0", "12,345 KV-cache tokens", "3.1 GiB", "20,000",
                                            "-4.20 %", "2 % tolerance")),
    Case("a reading of another plan judges nothing", base(pod=READY, verification=reading(-4.2, plan="other")),
         "old", 2, True, "Running"),
    Case("canary crash-looping: held", base(pod=CanaryPod(POD, False, 90, restarts=4,
                                                           waiting_reason="CrashLoopBackOff")),
         "old", 2, True, "Failed", held=canary.CANARY_NOT_READY, quotes=("crash-looping",)),
    Case("canary not Ready within its startup probe: held", base(pod=CanaryPod(POD, False, 700)), "old", 2, True,
         "Failed", held=canary.CANARY_NOT_READY, quotes=("600 s",)),
    Case("burn-in asked, not run yet: running", base(pod=READY, verification=reading(0.1), burn_in_wanted=True),
         "old", 2, True, "Running"),
    Case("burn-in passed: the fleet rolls",
         base(pod=READY, verification=reading(0.1), burn_in_wanted=True, burn_in=BurnInStatus(
             plan_hash=PLAN, pods=(PodBurnInStatus(pod=POD, passed=True, reason="BurnInPassed", message="ok",
                                                   gpu_seconds=3),))), "new", 2, False, "Passed"),
    Case("burn-in failed: held",
         base(pod=READY, verification=reading(0.1), burn_in_wanted=True, burn_in=BurnInStatus(
             plan_hash=PLAN, pods=(PodBurnInStatus(pod=POD, passed=False, reason="KVCacheTooSmall",
                                                   message="vLLM preempted 7 times", gpu_seconds=3),))),
         "old", 2, True, "Failed", held=canary.CANARY_BURN_IN_FAILED, quotes=("preempted 7 times",)),
    Case("a failed canary holds the fleet on later passes",
         base(pod=READY, known=record("Failed", reason=canary.CANARY_KV_BELOW_PLAN, message="below")),
         "old", 2, True, "Failed", held=canary.CANARY_KV_BELOW_PLAN),
    Case("a failed canary of another plan (a remediation step) is judged afresh",
         base(pod=STARTING, known=record("Failed", reason=canary.CANARY_KV_BELOW_PLAN, plan="before")),
         "old", 2, True, "Running"),
    Case("passed: the fleet rolls, the canary gone (its GPU is the roll's), Passed until the fleet is Ready",
         base(fleet=NEW, known=record("Passed"), canary_exists=True, fleet_ready=False), "new", 2, False, "Passed"),
    Case("passed and the fleet Ready: the canary is deleted",
         base(fleet=NEW, known=record("Passed"), canary_exists=True, fleet_ready=True), "new", 2, False, None),
    Case("revert: the canary is deleted, the condition cleared",
         base(fleet=OLD, wanted=OLD, known=record("Failed", reason=canary.CANARY_KV_BELOW_PLAN), canary_exists=True,
              pod=READY), "new", 2, False, None, event=canary.UPGRADE_REVERTED),
    # status_read sets an unattested status.canary aside: the decision sees none, and judges the pod itself
    Case("forged status.canary Passed, set aside: no roll", base(known=None, pod=STARTING), "old", 2, True, "Running"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_canary_decision(case: Case) -> None:
    got: CanaryDecision = canary.decide(case.inputs)
    assert (got.fleet, got.fleet_replicas, got.canary) == (case.fleet, case.fleet_replicas, case.canary)
    assert (got.status.phase if got.status else None) == case.phase
    assert (got.held[1] if got.held else None) == case.held
    if case.held is not None:
        assert got.held is not None and got.held[0] is True
        assert got.status is not None and got.status.reason == case.held
    if case.event is not None:
        assert got.event is not None and got.event[1] == case.event
    for words in case.quotes:
        assert got.held is not None and words in got.held[2], got.held[2]


def test_a_phase_keeps_its_since() -> None:
    kept = canary.decide(base(pod=STARTING, known=record("Running")))
    assert kept.status is not None and kept.status.since == NOW - timedelta(minutes=5)
    moved = canary.decide(base(pod=READY, verification=reading(0.0), known=record("Running")))
    assert moved.status is not None and moved.status.phase == "Passed" and moved.status.since == NOW


def test_a_forged_canary_passed_is_set_aside_by_the_status_read() -> None:
    """status.canary is attested: one the operator did not write never reaches the decision."""
    assert "canary" in ATTESTED
    forged = record("Passed").model_dump(by_alias=True, mode="json")
    read = read_status({"canary": forged}, attested=frozenset())
    assert read.forged == ("canary",) and read.status.canary is None
    assert read_status({"canary": forged}, attested=frozenset({"canary"})).status.canary is not None
    held = canary.decide(base(known=read.status.canary, pod=STARTING))
    assert held.fleet == "old"


def test_canary_deployment_one_labelled_pod_of_the_new_plan() -> None:
    fleet = deployment(render_inputs())
    c = render_canary.canary_deployment(fleet)
    assert c["metadata"]["name"] == fleet["metadata"]["name"] + "-canary"
    assert c["spec"]["replicas"] == 1 and c["spec"]["strategy"] == {"type": "Recreate"}
    assert c["spec"]["selector"]["matchLabels"][render_canary.CANARY_LABEL] == "true"
    labels = c["spec"]["template"]["metadata"]["labels"]
    # the Service's selector (the fleet's) matches the canary's pods: it serves traffic
    assert fleet["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert c["spec"]["template"]["spec"] == fleet["spec"]["template"]["spec"]
    assert c["metadata"]["ownerReferences"] == fleet["metadata"]["ownerReferences"]
    _hash_is_its_own(c)


def test_held_fleet_keeps_the_live_template() -> None:
    new = deployment(render_inputs())
    live = {"spec": {"template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [
        {"name": "vllm", "image": OLD.image}]}}}}
    held = render_canary.held_fleet(new, live["spec"]["template"], 1, version=OLD.version)
    assert held["spec"]["template"] == live["spec"]["template"] and held["spec"]["replicas"] == 1
    assert render_canary.deployment_version(held) == OLD.version
    assert render_canary.deployment_version(new) == str(render_inputs().plan.config.vllm.version)
    assert render_canary.template_image(held) == OLD.image
    assert render_canary.template_image(new) != OLD.image
    _hash_is_its_own(held)
    assert held["metadata"]["annotations"][INPUT_HASH] != new["metadata"]["annotations"][INPUT_HASH]


def _hash_is_its_own(obj: dict[str, Any]) -> None:
    """The input hash is the object's own (the shell skips a write whose hash the live object has)."""
    meta = dict(obj["metadata"])
    annotations = {k: v for k, v in meta.pop("annotations").items() if k != INPUT_HASH}
    if annotations:
        meta["annotations"] = annotations
    assert obj["metadata"]["annotations"][INPUT_HASH] == content_hash({**obj, "metadata": meta})
