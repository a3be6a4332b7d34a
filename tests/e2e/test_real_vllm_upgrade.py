"""An upgrade of the real CPU vLLM, 0.31.0 to 0.32.0, under a client (issue #30's proof of items 1 and 2): a
canary of the new release first, verified on vLLM's own KV figures, then the fleet; no request fails; the
status keeps both releases' figures, and the canary's reading is the new release's first calibration sample.

The process kubelet runs a pod with the release its image's tag names (hack/localcluster/kubelet.py), so each
pod's ``/version`` answers the release its image names (vLLM's own answer, not the image's name). The older
release is installed on first use (the ``vllm_release`` fixture), cached as the default one is. The held path (a
canary that fails) is the stand-in's (tests/e2e/test_canary.py): it claims nothing about vLLM's behaviour."""

from __future__ import annotations

import contextlib
import json
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hack.localcluster import vllm_cpu

from tests.e2e.conftest import Kubectl, wait_for
from tests.e2e.real_vllm import (
    OLDER_RELEASE,
    START_SECONDS,
    ClientLoop,
    apply,
    kv_room_fixture,  # noqa: F401 - a fixture
    llmd,
    operator_for,
    pods,
    ready_pods,
    real_vllm_fixture,  # noqa: F401 - a fixture
    tiny,
    vllm_release_fixture,  # noqa: F401 - a fixture
)

pytestmark = [pytest.mark.e2e, pytest.mark.real_vllm, pytest.mark.usefixtures("real_vllm")]

NEWER_RELEASE = vllm_cpu.VLLM_CPU_VERSION
#: the tiny model's KV cache: 512 bytes a token, in blocks of 128 tokens (the CPU build's)
TOKEN_BYTES = 512
BLOCK = 128
#: a short drain: a replaced pod finishes the client's request in flight (an 8-token answer) and stops; with 0
#: (no preStop, no --shutdown-timeout) a request sent as the pod is deleted would fail
DRAIN_SECONDS = 15
CANARY_LABEL = "llm-autopilot.io/canary"
#: a small planned KV room (a small CPU KV cache in each of the three pods at the canary's time)
SMALL = {"serving": {"maxModelLen": 2048}}


def release(version: str) -> dict[str, Any]:
    """spec.vllm of ``version``: its image (the tag the kubelet runs) and enforceEager (no torch.compile)."""
    return {"image": f"vllm/vllm-openai:v{version}", "version": version, "enforceEager": True,
            "drainSeconds": DRAIN_SECONDS}


def image(deployment: dict[str, Any]) -> str:
    return str(deployment["spec"]["template"]["spec"]["containers"][0]["image"])


def served_version(pod: dict[str, Any], timeout: float = 30) -> str:
    """The release vLLM says it is (``/version``), without a local label such as ``+cpu``."""
    with urllib.request.urlopen(f"http://{pod['status']['podIP']}:8000/version", timeout=timeout) as response:
        return str(json.load(response)["version"]).split("+")[0]


def is_canary(pod: dict[str, Any]) -> bool:
    return (pod["metadata"].get("labels") or {}).get(CANARY_LABEL) == "true"


def stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass
class Watch:
    """What the test saw of the upgrade, polled once per condition check: the order of its phases."""

    kubectl: Kubectl
    namespace: str
    name: str
    #: status.canary's phases in the order seen, with the fleet's template image and replicas at that look
    phases: list[tuple[str, str, int]] = field(default_factory=list)
    #: status.canary.replacesReplica as first seen (None: not seen)
    replaces_replica: bool | None = None
    #: the canary pod's /version, asked once it answers
    canary_version: str | None = None
    canary_pod: str | None = None
    #: the calibration store's samples of the new release when status.canary was first seen Passed (None: not seen)
    new_samples_at_passed: list[dict[str, Any]] | None = None

    def look(self) -> None:
        deployment = self.kubectl.json("deployment", self.name, "-n", self.namespace)
        canary = (llmd(self.kubectl, self.namespace, self.name).get("status") or {}).get("canary")
        seen = (canary["phase"] if canary else "-", image(deployment), int(deployment["spec"]["replicas"]))
        if not self.phases or self.phases[-1] != seen:
            self.phases.append(seen)
        if canary and self.replaces_replica is None:
            self.replaces_replica = bool(canary.get("replacesReplica"))
        if canary and canary["phase"] == "Passed" and self.new_samples_at_passed is None:
            self.new_samples_at_passed = store_samples(self.kubectl, self.namespace).get(NEWER_RELEASE, [])
        if self.canary_version is None:
            # asked until it answers, terminating too: the canary passes a resync or two after it is Ready and goes
            # at once, serving on through its preStop wait (10 s), so a look for a Ready one alone can miss it
            for pod in pods(self.kubectl, self.namespace, self.name):
                if is_canary(pod) and pod["status"].get("podIP"):
                    with contextlib.suppress(OSError, ValueError):  # not serving yet (or any more)
                        self.canary_version, self.canary_pod = served_version(pod, 2), pod["metadata"]["name"]


def condition(kubectl: Kubectl, namespace: str, name: str, kind: str) -> dict[str, Any] | None:
    found = llmd(kubectl, namespace, name).get("status", {}).get("conditions") or []
    return next((c for c in found if c["type"] == kind), None)


def store_samples(kubectl: Kubectl, namespace: str) -> dict[str, list[dict[str, Any]]]:
    """The calibration store's samples by vLLM version (the ConfigMap in the test's namespace)."""
    found = kubectl.maybe("configmap", "llm-autopilot-calibration", "-n", namespace)
    store = json.loads(found["data"]["calibration.json"]) if found else {"entries": []}
    by_version: dict[str, list[dict[str, Any]]] = {}
    for entry in store["entries"]:
        by_version.setdefault(entry["vllmVersion"], []).extend(entry["samples"])
    return by_version


def test_an_upgrade_runs_a_verified_canary_then_rolls_the_fleet_and_no_request_fails(
        kubectl: Kubectl, namespace: str, vllm_release: Any, kv_room: Any, tmp_path: Path) -> None:
    older = vllm_release(OLDER_RELEASE)
    name, started = "up", time.monotonic()
    with operator_for(kubectl, namespace, tmp_path, calibration=True):
        # the KV room the plan counts (whole blocks, not below it), set before any pod starts: vLLM's own figures
        # are then read against the plan, and the canary is judged on them
        apply(kubectl, namespace, tiny(name, vllm=release(older), replicas=0, **SMALL))
        plan = wait_for("the plan of 0.31.0", lambda: llmd(kubectl, namespace, name).get("status", {}).get("plan"),
                        timeout=120)
        kv_room((int(plan["memory"]["kvCacheTokens"]) // BLOCK + 1) * BLOCK * TOKEN_BYTES)
        apply(kubectl, namespace, tiny(name, vllm=release(older), replicas=2, **SMALL))
        before = wait_for("2 Ready pods of 0.31.0", lambda: (
            found if len(found := ready_pods(kubectl, namespace, name)) == 2 else None),
            timeout=START_SECONDS, interval=2)
        assert sorted(p["spec"]["nodeName"] for p in before) == ["vllm-cpu-0", "vllm-cpu-1"], before
        assert {served_version(p) for p in before} == {older}
        wait_for("PlanVerified=True on 0.31.0", lambda: (
            (condition(kubectl, namespace, name, "PlanVerified") or {}).get("status") == "True") or None,
            timeout=120, interval=2)
        wait_for("0.31.0's calibration sample", lambda: store_samples(kubectl, namespace).get(older), timeout=90)
        up_at = time.monotonic()
        client = ClientLoop(kubectl, namespace, name).start()
        try:
            wait_for("the client's first answers", lambda: client.ok >= 3 or None, timeout=60)
            apply(kubectl, namespace, tiny(name, vllm=release(NEWER_RELEASE), replicas=2, **SMALL))
            canary = wait_for(f"{name}-canary", lambda: kubectl.maybe("deployment", f"{name}-canary", "-n",
                                                                       namespace), timeout=60)
            upgrade_at = time.monotonic()
            assert image(canary) == release(NEWER_RELEASE)["image"], canary
            assert image(kubectl.json("deployment", name, "-n", namespace)) == release(older)["image"]
            watch = Watch(kubectl, namespace, name)

            def rolled() -> bool | None:
                watch.look()
                new = [p for p in ready_pods(kubectl, namespace, name)
                       if not is_canary(p) and p["spec"]["containers"][0]["image"] == release(NEWER_RELEASE)["image"]]
                status = llmd(kubectl, namespace, name).get("status") or {}
                return (len(new) == 2 and "canary" not in status
                        and kubectl.maybe("deployment", f"{name}-canary", "-n", namespace) is None) or None

            wait_for("the canary, then the fleet on 0.32.0 and the canary gone", rolled,
                     timeout=3 * START_SECONDS, interval=1)
            rolled_at = time.monotonic()
            wait_for("the client's answers from the new fleet", lambda: client.ok >= 3 + 3 or None, timeout=60)
        finally:
            client.stop()
        after = ready_pods(kubectl, namespace, name)
        status = llmd(kubectl, namespace, name)["status"]
        sys.stderr.write(
            f"\n[real vLLM upgrade] {older} -> {NEWER_RELEASE}: 2 replicas serving {up_at - started:.0f} s after the "
            f"apply; canary to fleet rolled {rolled_at - upgrade_at:.0f} s; phases (status.canary, fleet image, "
            f"replicas) {watch.phases}; canary {watch.canary_pod} /version {watch.canary_version}; client "
            f"{client.ok} answered, {client.failed} failed {client.errors[:5]}, by pod {client.by_pod}; "
            f"status.releases {status.get('releases')}; kvCalibration {status.get('kvCalibration')}\n")
        # 3. no request failed, and both releases answered it
        assert client.failed == 0, client.errors
        assert any(p["metadata"]["name"] in client.by_pod for p in before), client.by_pod
        # 2. the canary first: it ran while the fleet's template was still 0.31.0, passed, and only then did the
        # fleet's template change; the canary answered as 0.32.0
        phases = [phase for phase, _, _ in watch.phases]
        assert "Passed" in phases, watch.phases
        old_until = next(i for i, (_, fleet, _) in enumerate(watch.phases)
                         if fleet == release(NEWER_RELEASE)["image"])
        assert all(fleet == release(older)["image"] for _, fleet, _ in watch.phases[:old_until]), watch.phases
        assert {"Pending", "Running"} & set(phases[:old_until]), watch.phases
        # two vllm-cpu nodes, one simulated GPU each, two replicas: no free GPU for a surge, so the canary took one
        # replica's place (the fleet ran one, never none) and the fleet went back to two on the new release
        assert watch.replaces_replica is True, watch
        assert all(replicas == 1 for _, _, replicas in watch.phases[:old_until]), watch.phases
        assert watch.phases[-1][2] == 2, watch.phases
        assert watch.canary_version == NEWER_RELEASE, watch
        events = kubectl.json("events", "-n", namespace, "--field-selector", f"involvedObject.name={name}")["items"]
        reasons = [e.get("reason") for e in events]
        assert "CanaryStarted" in reasons and "CanaryPassed" in reasons, reasons
        assert "UpgradeHeld" not in reasons and "VLLMVersionMismatch" not in reasons, reasons
        passed = next(e for e in events if e.get("reason") == "CanaryPassed")
        # judged on the canary's own figures (the fleet's 0.31.0 pods carry the same plan hash: set aside), and its
        # reading was the new release's first calibration sample, recorded before the fleet rolled
        assert f"vLLM {NEWER_RELEASE} reports" in str(passed["message"]), passed["message"]
        assert [s["deployment"] for s in watch.new_samples_at_passed or []] == [f"{namespace}/{name}"], watch
        new_sets = [rs for rs in kubectl.json("replicasets", "-n", namespace, "-l",
                                              f"app.kubernetes.io/instance={name}")["items"]
                    if image(rs) == release(NEWER_RELEASE)["image"] and not is_canary(rs["spec"]["template"])]
        passed_at = stamp(passed.get("firstTimestamp") or passed.get("eventTime")
                          or passed["metadata"]["creationTimestamp"])
        # the fleet's new ReplicaSet made after the canary passed (timestamps in whole seconds)
        assert new_sets and all(stamp(rs["metadata"]["creationTimestamp"]) >= passed_at - 1 for rs in new_sets), (
            new_sets, passed)
        # every pod answers the release its image names: 0.32.0, none of the old ones is left
        assert len(after) == 2 and {served_version(p) for p in after} == {NEWER_RELEASE}, after
        assert not {p["metadata"]["name"] for p in before} & {p["metadata"]["name"] for p in pods(
            kubectl, namespace, name)}
        # 4. status.releases: both releases' predicted and measured KV tokens
        releases = {r["vllmVersion"].split("+")[0]: r for r in status["releases"]}
        assert set(releases) == {older, NEWER_RELEASE}, status["releases"]
        for entry in releases.values():
            assert entry["predictedTokens"] > 0 and entry["actualTokens"] > 0 and entry["verified"], entry
        # a calibration measured on 0.31.0 does not move 0.32.0's plan; the canary's reading is 0.32.0's first sample
        pin = status["kvCalibration"]
        assert pin["vllmVersion"] == NEWER_RELEASE and "ratio" not in pin, pin
        assert f"covers vLLM {older} only" in pin["message"], pin
        samples = store_samples(kubectl, namespace)
        assert [s["deployment"] for s in samples.get(NEWER_RELEASE, [])] == [f"{namespace}/{name}"], samples
        assert [s["deployment"] for s in samples[older]] == [f"{namespace}/{name}"], samples
    sys.stderr.write(f"[real vLLM upgrade] the test took {time.monotonic() - started:.0f} s\n")
