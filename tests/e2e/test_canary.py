"""The release canary (issue #30 item 1) on the local cluster, with the vLLM stand-in on the vllm-cpu nodes:
plumbing only -- the objects (the ``<name>-canary`` Deployment beside the fleet's, the fleet's pod template kept
until the canary passed, the canary deleted after), status.canary, UpgradeHeld and the Events. The stand-in
measures nothing: its KV figures are what the node's KV room annotation makes of the plan, so "below the plan" is
set by the test. The release change is a change of the stand-in's image tag at the same vLLM version (the stand-in
serves 0.32.0's flags whatever its tag, so a version change would test its flag table, not the canary); the real
two-release upgrade is the real-vLLM lane's (issue #30's proof)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Kubectl, Operator, wait_for
from tests.e2e.real_vllm import (
    STAND_IN,
    STAND_IN_START_SECONDS,
    apply,
    kv_room_fixture,  # noqa: F401 - a fixture
    llmd,
    operator_for,
    ready_pods,
    real_vllm_fixture,  # noqa: F401 - a fixture
    tiny,
)

pytestmark = pytest.mark.e2e

#: the same release rebuilt: another image, the same vLLM version
REBUILT = {**STAND_IN, "image": f"{STAND_IN['image']}-rebuilt"}
#: the tiny model's KV cache: 512 bytes a token, in blocks of 128 tokens (the CPU build's, the stand-in's)
TOKEN_BYTES = 512
BLOCK = 128


@pytest.fixture(name="standin_operator")
def standin_operator_fixture(kubectl: Kubectl, namespace: str, tmp_path: Path,
                             real_vllm: list[dict[str, Any]]) -> Iterator[Operator]:
    """An operator on the vllm-cpu nodes' lane (``real_vllm``: the tiny models, never beside another test there)."""
    with operator_for(kubectl, namespace, tmp_path) as op:
        yield op
    kubectl("delete", "llmd", "--all", "-n", namespace, "--wait=true", "--timeout=90s", check=False)


def image(deployment: dict[str, Any]) -> str:
    return str(deployment["spec"]["template"]["spec"]["containers"][0]["image"])


def status_of(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    return dict(llmd(kubectl, namespace, name).get("status") or {})


def condition(kubectl: Kubectl, namespace: str, name: str, kind: str) -> dict[str, Any] | None:
    return next((c for c in status_of(kubectl, namespace, name).get("conditions") or [] if c["type"] == kind), None)


def events(kubectl: Kubectl, namespace: str, name: str) -> list[str]:
    found = kubectl.json("events", "-n", namespace, "--field-selector", f"involvedObject.name={name}")["items"]
    return [str(e.get("reason")) for e in found]


def serving(kubectl: Kubectl, namespace: str, name: str, kv_room: Any) -> dict[str, Any]:
    """One replica of the stand-in Ready and verified (PlanVerified=True): what an upgrade starts from. The nodes'
    KV room is set to the plan's first (the stand-in's KV cache is what the room makes of it)."""
    apply(kubectl, namespace, tiny(name, vllm=STAND_IN, replicas=0))
    plan = wait_for(f"{name}'s plan", lambda: status_of(kubectl, namespace, name).get("plan"), timeout=60)
    blocks = int(plan["memory"]["kvCacheTokens"]) // BLOCK + 1  # whole blocks, not below the plan
    kv_room(blocks * BLOCK * TOKEN_BYTES)
    apply(kubectl, namespace, tiny(name, vllm=STAND_IN, replicas=1))
    (pod,) = wait_for(f"{name}'s pod Ready", lambda: ready_pods(kubectl, namespace, name) or None,
                      timeout=STAND_IN_START_SECONDS + 120)
    wait_for(f"{name}'s PlanVerified=True", lambda: (
        (condition(kubectl, namespace, name, "PlanVerified") or {}).get("status") == "True") or None, timeout=120)
    return dict(pod)


def upgrade(kubectl: Kubectl, namespace: str, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The spec moved to REBUILT; the canary's Deployment as first seen, and the fleet's then."""
    apply(kubectl, namespace, tiny(name, vllm=REBUILT, replicas=1))
    canary = wait_for(f"{name}-canary", lambda: kubectl.maybe("deployment", f"{name}-canary", "-n", namespace),
                      timeout=60)
    return canary, kubectl.json("deployment", name, "-n", namespace)


def test_a_release_change_runs_a_canary_first_then_rolls_the_fleet(
        kubectl: Kubectl, namespace: str, standin_operator: Operator, kv_room: Any) -> None:
    before = serving(kubectl, namespace, "up", kv_room)
    canary, fleet = upgrade(kubectl, namespace, "up")
    assert image(canary) == REBUILT["image"] and canary["spec"]["replicas"] == 1
    assert image(fleet) == STAND_IN["image"]  # the fleet waits for the canary
    started = status_of(kubectl, namespace, "up")["canary"]
    assert started["image"] == REBUILT["image"] and started["fromImage"] == STAND_IN["image"], started
    assert started["replacesReplica"] is False, started  # two vllm-cpu nodes: a free one for a surge
    # the canary is verified on its own pod, then the fleet rolls; the canary goes once the fleet is Ready
    wait_for("the fleet's Deployment on the new image", lambda: image(kubectl.json(
        "deployment", "up", "-n", namespace)) == REBUILT["image"] or None, timeout=STAND_IN_START_SECONDS + 120)
    wait_for("the canary deleted and status.canary gone", lambda: (
        kubectl.maybe("deployment", "up-canary", "-n", namespace) is None
        and "canary" not in status_of(kubectl, namespace, "up")) or None, timeout=STAND_IN_START_SECONDS + 120)
    reasons = events(kubectl, namespace, "up")
    assert "CanaryStarted" in reasons and "CanaryPassed" in reasons, reasons
    assert condition(kubectl, namespace, "up", "UpgradeHeld") is None
    after = wait_for("the fleet's pod Ready on the new image", lambda: [
        p for p in ready_pods(kubectl, namespace, "up") if image({"spec": {"template": p}}) == REBUILT["image"]]
        or None, timeout=STAND_IN_START_SECONDS + 120)
    assert before["metadata"]["name"] not in {p["metadata"]["name"] for p in after}


def test_a_canary_below_the_plan_holds_the_fleet_and_a_revert_clears_it(
        kubectl: Kubectl, namespace: str, standin_operator: Operator, kv_room: Any) -> None:
    before = serving(kubectl, namespace, "held", kv_room)
    plan = status_of(kubectl, namespace, "held")["plan"]
    tokens = int(plan["memory"]["kvCacheTokens"]) // 2  # half the plan's room, still above its max_model_len
    assert tokens > int(plan["maxModelLen"]), plan
    kv_room(tokens * TOKEN_BYTES)  # read by the kubelet when a container starts: the canary's, not the fleet's
    canary, fleet = upgrade(kubectl, namespace, "held")
    assert image(canary) == REBUILT["image"]
    assert image(fleet) == STAND_IN["image"]
    held = wait_for("UpgradeHeld=True", lambda: (
        c if (c := condition(kubectl, namespace, "held", "UpgradeHeld")) and c["status"] == "True" else None),
        timeout=STAND_IN_START_SECONDS + 120)
    assert held["reason"] == "CanaryKVBelowPlan", held
    assert "KV-cache tokens" in held["message"] and "the plan needs" in held["message"], held
    assert status_of(kubectl, namespace, "held")["canary"]["phase"] == "Failed"
    assert "UpgradeHeld" in events(kubectl, namespace, "held")
    # the old pod serves on, untouched
    assert image(kubectl.json("deployment", "held", "-n", namespace)) == STAND_IN["image"]
    assert [p["metadata"]["name"] for p in ready_pods(kubectl, namespace, "held")
            if not p["metadata"].get("labels", {}).get("llm-autopilot.io/canary")] == [before["metadata"]["name"]]
    apply(kubectl, namespace, tiny("held", vllm=STAND_IN, replicas=1))  # reverted
    wait_for("the canary deleted and UpgradeHeld cleared", lambda: (
        kubectl.maybe("deployment", "held-canary", "-n", namespace) is None
        and condition(kubectl, namespace, "held", "UpgradeHeld") is None
        and "canary" not in status_of(kubectl, namespace, "held")) or None, timeout=60)
    assert "UpgradeReverted" in events(kubectl, namespace, "held")
    assert [p["metadata"]["name"] for p in ready_pods(kubectl, namespace, "held")] == [before["metadata"]["name"]]
