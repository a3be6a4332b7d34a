"""The release canary through the reconcile (desired/sections/canary.py, controller/features/canary.py), named cases
on the in-memory cluster: what the fleet's and the canary's Deployments become, status.canary and UpgradeHeld.
Each case runs twice: on the API server's whole objects, and on what the operator's watches give a reconcile (the
children's and pods' summaries, controller/observed.py; the pod watch indexed by the instance label alone). The
decision's own cases are tests/unit/test_canary.py's."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from llm_autopilot.controller.calibration_store import CalibrationBook
from llm_autopilot.controller.gather import Gatherer
from llm_autopilot.controller.observed import WATCHED_CHILDREN, child_summary, pod_summary
from llm_autopilot.desired.calibration import SampleToRecord
from llm_autopilot.planner.calibration import CalibrationKey, Sample
from llm_autopilot.render.canary import CANARY_LABEL, canary_name
from llm_autopilot.render.kubernetes import INSTANCE_LABEL, OWNER_LABEL, PLAN_HASH
from tests.unit.fakes import NAME, NAMESPACE, FakeCluster, Run
from tests.unit.test_calibration_store import OPERATOR_NS, ConfigMaps

OLD = {"version": "0.32.0", "image": "vllm/vllm-openai:v0.32.0"}
NEW = {"version": "0.33.0", "image": "vllm/vllm-openai:v0.33.0"}
#: two replicas of an 8B model on a node of 8 H100s: a free GPU for a surge canary
SPEC = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-h100-80gb"}, "replicas": 2,
        "serving": {"maxModelLen": 16384}}
CANARY = canary_name(NAME)


class Reads(FakeCluster):
    """The fake cluster, counting the reads of the canary's Deployment."""

    canary_reads = 0

    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        if kind == "Deployment" and name == CANARY:
            self.canary_reads += 1
        return super().get(api_version, kind, name, namespace)


class Watches(Reads):
    """The cluster as a reconcile reads it through the operator's watches (controller/observed.py's
    WatchedCluster): a child the operator made is its summary, a pod its summary, listed by the instance label
    only; ``get_whole`` reads the API server."""

    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        found = super().get(api_version, kind, name, namespace)
        if found is None or kind not in WATCHED_CHILDREN or OWNER_LABEL not in found["metadata"].get("labels", {}):
            return found
        return child_summary(found).body

    def get_whole(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        return super().get(api_version, kind, name, namespace)

    def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        key, _, instance = label_selector.partition("=")
        if key != INSTANCE_LABEL or "," in instance:
            raise ValueError(f"the pod watch is indexed by {INSTANCE_LABEL}=NAME only, not {label_selector!r}")
        return [pod_summary(p).body for p in super().pods(namespace, label_selector)]


@pytest.fixture(params=[Reads, Watches], ids=["api", "watches"])
def cluster(request: pytest.FixtureRequest) -> Reads:
    made: Reads = request.param()
    return made


def on(release: dict[str, str]) -> dict[str, Any]:
    return {**SPEC, "vllm": dict(release)}


def running_old(cluster: Reads) -> Run:
    """A fleet of two replicas running OLD, then its spec changed to NEW."""
    run = Run(on(OLD), cluster=cluster)
    run.once()
    run.generation, run.spec = 2, on(NEW)
    return run


def template(run: Run, name: str = NAME) -> dict[str, Any]:
    return copy.deepcopy(run.cluster.deployment(name)["spec"]["template"])


def image(run: Run, name: str = NAME) -> str:
    return str(template(run, name)["spec"]["containers"][0]["image"])


def canary_pod(run: Run, tokens: int | None, *, ready: bool = True) -> None:
    """The canary's pod as the kubelet shows it, its vLLM log saying its KV cache holds ``tokens``."""
    pod = f"{CANARY}-1"
    run.cluster.pod_list = [{
        "metadata": {"name": pod, "labels": {CANARY_LABEL: "true"}, "uid": "pod-uid",
                     "creationTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                     "annotations": {PLAN_HASH: run.cluster.plan_hash(CANARY)}},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                   "containerStatuses": [{"name": "vllm", "ready": ready, "restartCount": 0}]}}]
    if tokens is not None:
        run.cluster.current_logs[pod] = f"INFO GPU KV cache size: {tokens:,} tokens, Maximum concurrency ..."


def planned_tokens(run: Run) -> int:
    return int(run.status["plan"]["memory"]["kvCacheTokens"])


def held(run: Run) -> dict[str, Any] | None:
    return next((c for c in run.status.get("conditions", []) if c["type"] == "UpgradeHeld"), None)


def test_a_pass_with_no_release_change_reads_no_canary(cluster: Reads) -> None:
    run = Run(on(OLD), cluster=cluster)
    run.once()
    run.once()
    assert isinstance(run.cluster, Reads) and run.cluster.canary_reads == 0
    assert "canary" not in run.status and held(run) is None
    assert ("Deployment", CANARY) not in run.cluster.objects


def test_a_release_change_with_a_free_gpu_starts_a_canary_and_leaves_the_fleet_as_it_runs(cluster: Reads) -> None:
    run = running_old(cluster)
    fleet = template(run)
    run.once()
    assert template(run) == fleet and run.cluster.deployment()["spec"]["replicas"] == 2
    assert image(run, CANARY) == NEW["image"] and run.cluster.deployment(CANARY)["spec"]["replicas"] == 1
    canary = run.status["canary"]
    assert (canary["phase"], canary["replacesReplica"]) == ("Pending", False), canary
    assert (canary["vllmVersion"], canary["fromVllmVersion"]) == ("0.33.0", "0.32.0")
    assert "CanaryStarted" in run.reasons()
    assert held(run) is None  # waiting on the canary is not a held upgrade


def test_a_verified_canary_rolls_the_fleet_then_goes(cluster: Reads) -> None:
    run = running_old(cluster)
    run.once()
    canary_pod(run, None)
    run.once()  # the canary's figures are read (PlanVerified) for the new plan
    canary_pod(run, planned_tokens(run))
    planned_hash = run.cluster.plan_hash(CANARY)
    run.once()
    assert run.status["verification"]["verified"] is True
    run.once()  # judged on the figures recorded
    assert run.status["canary"]["phase"] == "Passed", run.status["canary"]
    assert "CanaryPassed" in run.reasons() and held(run) is None
    # the fleet rolls to the canary's plan, and the canary goes at once: the roll needs its GPU
    assert image(run) == NEW["image"] and run.cluster.plan_hash() == planned_hash
    assert ("Deployment", CANARY) in run.cluster.deleted and ("Deployment", CANARY) not in run.cluster.objects
    run.once()  # the fleet is Ready on the new release: status.canary goes
    assert "canary" not in run.status and image(run) == NEW["image"]


def beside_an_old_pod(run: Run, tokens: int) -> None:
    """The canary's pod Ready beside a fleet pod of the old release that carries the same plan hash (a release change
    that moves no flag keeps the plan's hash: what the real 0.31.0 -> 0.32.0 upgrade of the tiny model did), each
    pod's vLLM answering its own release, the old one's KV figures the plan's."""
    canary_pod(run, tokens)
    canary = run.cluster.pod_list[0]
    canary["status"]["podIP"] = "10.0.0.2"
    old = copy.deepcopy(canary)
    old["metadata"].update(name=f"{NAME}-old-1", uid="old-uid", labels={})
    old["status"]["podIP"] = "10.0.0.1"
    run.cluster.pod_list = [old, canary]
    run.cluster.current_logs[f"{NAME}-old-1"] = (f"INFO GPU KV cache size: {planned_tokens(run):,} tokens, "
                                                 "Maximum concurrency ...")
    releases = {"10.0.0.1": OLD["version"], "10.0.0.2": NEW["version"]}
    run.gatherer = Gatherer(run.cluster, versions=releases.get)


def test_the_canarys_reading_is_the_new_releases_first_calibration_sample_and_the_old_ones_move_nothing(
        cluster: Reads) -> None:
    """Issue #30 item 2: a calibration measured on the old release never moves the new release's plan (its pin
    says what the store covers), and the canary's own reading -- not the old fleet's pods that carry the same plan
    hash -- judges it and is the first sample keyed by the new release; the old release's sample stays its own."""
    now = datetime.now(UTC)
    book = CalibrationBook(ConfigMaps(), OPERATOR_NS, key=b"k" * 32)
    old_key = CalibrationKey("H100-80GB", OLD["version"], "qwen3")
    book.record(SampleToRecord(old_key, Sample(0.9, now, f"{NAMESPACE}/{NAME}")), now)  # the fleet's measurement
    run = Run(on(OLD), cluster=cluster, calibration=book)
    run.once()
    assert abs(run.status["kvCalibration"]["ratio"] - 0.9) < 0.001  # the old release's plan takes it
    run.generation, run.spec = 2, on(NEW)
    run.once()
    pin = run.status["kvCalibration"]
    assert pin["vllmVersion"] == NEW["version"] and "ratio" not in pin, pin
    assert "covers vLLM 0.32.0 only" in pin["message"], pin
    tokens = round(planned_tokens(run) * 0.99)  # within the tolerance: the canary passes
    beside_an_old_pod(run, tokens)
    run.once()  # PlanVerified reads the plan's Ready pods: the old release's pod is set aside
    verification = run.status["verification"]
    assert [p["pod"] for p in verification["pods"]] == [f"{CANARY}-1"], verification
    assert verification["vllmVersion"] == NEW["version"] and verification["actualTokens"] == tokens
    assert "VLLMVersionMismatch" not in run.reasons()
    entries = book.current(now)[0].entries  # type: ignore[union-attr]
    new_key = CalibrationKey("H100-80GB", NEW["version"], "qwen3")
    assert set(entries) == {old_key, new_key}, entries
    (first,) = entries[new_key]
    assert first.deployment == f"{NAMESPACE}/{NAME}" and abs(first.ratio - 0.99) < 0.005, first
    assert [s.ratio for s in entries[old_key]] == [0.9]
    assert [r["vllmVersion"] for r in run.status["releases"]] == [NEW["version"]]
    run.once()  # judged on the canary's own figures; the reading is not made again for the old pod
    assert run.status["verification"] == verification
    canary = run.status["canary"]
    assert canary["phase"] == "Passed", canary
    assert f"vLLM {NEW['version']} reports {tokens}" in canary["message"], canary["message"]


def test_a_canary_below_the_plans_kv_room_holds_the_fleet_with_vllms_figures(cluster: Reads) -> None:
    run = running_old(cluster)
    run.once()
    fleet = template(run)
    canary_pod(run, None)
    run.once()
    tokens = planned_tokens(run) // 2
    canary_pod(run, tokens)
    run.once()
    run.once()
    condition = held(run)
    assert condition is not None and condition["status"] == "True", run.status.get("conditions")
    assert condition["reason"] == "CanaryKVBelowPlan"
    assert f"reports {tokens:,} KV-cache tokens" in condition["message"], condition["message"]
    assert run.status["canary"]["phase"] == "Failed" and "UpgradeHeld" in run.reasons()
    assert template(run) == fleet and run.cluster.deployment()["spec"]["replicas"] == 2


def test_reverting_the_spec_deletes_the_canary_and_clears_upgrade_held(cluster: Reads) -> None:
    run = running_old(cluster)
    run.once()
    canary_pod(run, None)
    run.once()
    canary_pod(run, planned_tokens(run) // 2)
    run.once()
    run.once()
    assert held(run) is not None
    run.generation, run.spec = 3, on(OLD)
    run.once()
    assert ("Deployment", CANARY) in run.cluster.deleted and ("Deployment", CANARY) not in run.cluster.objects
    assert held(run) is None and "canary" not in run.status
    assert "UpgradeReverted" in run.reasons() and image(run) == OLD["image"]


def test_a_forged_passed_canary_rolls_nothing(cluster: Reads) -> None:
    run = running_old(cluster)
    run.once()
    fleet = template(run)
    forged = {**run.status["canary"], "phase": "Passed", "pod": f"{CANARY}-1", "message": "passed (forged)"}
    run.status = {**run.status, "canary": forged}  # written by someone else: no attestation of the operator's
    canary_pod(run, None, ready=False)
    run.once()
    assert "StatusForged" in run.reasons()
    assert run.status["canary"]["phase"] != "Passed" and template(run) == fleet
