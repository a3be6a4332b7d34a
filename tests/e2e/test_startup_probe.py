"""The startup probe learns (issue #29 item 4), on the local cluster: the first deployment's pod starts (the vLLM
stand-in, about a second), its start lands attested in the calibration store's ConfigMap, and a second
deployment of the same model, image and GPU gets the learned probe in its pod template and its status; the first
one's pod is not replaced for it (learning rolls nothing). Plumbing only: the stand-in's start is what is learned,
so no real vLLM is needed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_autopilot.render import rollout
from tests.e2e.conftest import Kubectl, Operator, wait_for
from tests.e2e.real_vllm import (
    STAND_IN,
    STAND_IN_START_SECONDS,
    operator_for,
    ready_pods,
    real_vllm_fixture,  # noqa: F401 - a fixture
    tiny,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(name="store_operator")
def store_operator_fixture(kubectl: Kubectl, namespace: str, tmp_path: Path,
                           real_vllm: list[dict[str, Any]]) -> Iterator[Operator]:
    """An operator with the calibration store in the test's namespace, on the vllm-cpu nodes' lane."""
    with operator_for(kubectl, namespace, tmp_path, calibration=True) as op:
        yield op
    kubectl("delete", "llmd", "--all", "-n", namespace, "--wait=true", "--timeout=90s", check=False)


def probe_seconds(kubectl: Kubectl, namespace: str, name: str) -> int:
    deployment = kubectl.json("deployment", name, "-n", namespace)
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    return int(probe["periodSeconds"] * probe["failureThreshold"])


def status_of(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    return dict(kubectl.json("llmd", name, "-n", namespace).get("status") or {})


def test_a_second_deployment_gets_the_probe_the_first_ones_start_taught(
        kubectl: Kubectl, namespace: str, store_operator: Operator) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(tiny("first", vllm=STAND_IN)))
    (first,) = wait_for("the first deployment's pod Ready", lambda: ready_pods(kubectl, namespace, "first") or None,
                        timeout=STAND_IN_START_SECONDS + 120)
    formula = probe_seconds(kubectl, namespace, "first")
    assert status_of(kubectl, namespace, "first")["startupProbe"]["starts"] == 0
    pod = f"{namespace}/{first['metadata']['name']}"

    def recorded() -> dict[str, Any] | None:
        found = kubectl.maybe("configmap", "llm-autopilot-calibration", "-n", namespace)
        store = json.loads(found["data"]["calibration.json"]) if found else {}
        return next((s for e in store.get("starts") or [] for s in e["starts"] if s["pod"] == pod), None)

    start = wait_for("the first pod's start in the calibration store", recorded, timeout=60)
    assert 0 < start["seconds"] < STAND_IN_START_SECONDS and start["attestation"], start

    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(tiny("second", vllm=STAND_IN)))
    learned = wait_for("the second deployment's learned probe", lambda: (
        status_of(kubectl, namespace, "second").get("startupProbe") or {}).get("starts") or None, timeout=120)
    pin = status_of(kubectl, namespace, "second")["startupProbe"]
    assert learned >= 1 and pin["formulaSeconds"] == formula, pin
    # the stand-in starts in seconds: 3x its median is under the floor, and the floor under the first guess
    assert probe_seconds(kubectl, namespace, "second") == pin["seconds"] == rollout.DEFAULT_LEARNED_FLOOR_SECONDS
    assert pin["seconds"] < formula and "learned from" in pin["message"], pin
    wait_for("the second deployment's pod Ready", lambda: ready_pods(kubectl, namespace, "second") or None,
             timeout=STAND_IN_START_SECONDS + 120)
    # the first learned from its own pod and is not rolled by it: the same pod, the first guess as pinned
    assert [p["metadata"]["name"] for p in ready_pods(kubectl, namespace, "first")] == [first["metadata"]["name"]]
    assert probe_seconds(kubectl, namespace, "first") == formula
    assert status_of(kubectl, namespace, "first")["startupProbe"]["starts"] == 0
