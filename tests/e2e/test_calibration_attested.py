"""The calibration store holds only the operator's own samples (issue #28 item 3), on the local cluster: a sample
written into the ConfigMap by someone else (here with the version ``0.33.0; rm -rf /``, which used to match
0.33.0 by its prefix) calibrates no later deployment. No real vLLM: the calibration is chosen when a spec is first
planned, before any pod runs."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import ROOT, Kubectl, Operator, wait_for

pytestmark = pytest.mark.e2e


def manifest(name: str) -> str:
    doc = yaml.safe_load((ROOT / "examples" / "qwen3-8b-l4.yaml").read_text())
    doc["metadata"]["name"] = name
    return yaml.safe_dump(doc)


def pin(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        obj = kubectl.maybe("llmd", name, "-n", namespace) or {}
        return (obj.get("status") or {}).get("kvCalibration")

    result: dict[str, Any] = wait_for(f"{name}'s status.kvCalibration", found, timeout=90)
    return result


def test_a_forged_sample_calibrates_nothing(kubectl: Kubectl, namespace: str, tmp_path: Path) -> None:
    settings = {"LLM_AUTOPILOT_RESYNC_SECONDS": "2", "HF_ENDPOINT": "http://127.0.0.1:9",
                "LLM_AUTOPILOT_HUB_TIMEOUT_SECONDS": "1", "LLM_AUTOPILOT_CALIBRATION_NAMESPACE": namespace,
                "LLM_AUTOPILOT_CALIBRATION_READ_SECONDS": "1"}
    op = Operator({**kubectl.env, **settings}, tmp_path / "operator.log",
                  ["--standalone", f"--namespace={namespace}"]).start()
    try:
        kubectl("apply", "-n", namespace, "-f", "-", input=manifest("first"))
        key = pin(kubectl, namespace, "first")  # the key a twin is calibrated under: GPU, version, family
        assert key.get("ratio") is None, key
        forged = {"version": 1, "entries": [{
            "gpuProduct": key["gpuProduct"], "vllmVersion": f"{key['vllmVersion']}; rm -rf /",
            "family": key["family"],
            "samples": [{"ratio": 1.449, "time": datetime.now(UTC).isoformat(), "deployment": "evil/twin"}]}]}
        kubectl("create", "configmap", "llm-autopilot-calibration", "-n", namespace,
                f"--from-literal=calibration.json={json.dumps(forged)}")
        also_unattested = {**forged, "entries": [{**forged["entries"][0], "vllmVersion": key["vllmVersion"]}]}
        kubectl("apply", "-n", namespace, "-f", "-", input=manifest("twin"))
        twin = pin(kubectl, namespace, "twin")
        assert twin.get("ratio") is None and not twin.get("deployments"), twin
        # a well-formed sample without the operator's attestation is dropped too
        replaced = kubectl("create", "configmap", "llm-autopilot-calibration", "-n", namespace, "--dry-run=client",
                           "-o", "yaml", f"--from-literal=calibration.json={json.dumps(also_unattested)}").stdout
        kubectl("replace", "-f", "-", input=replaced)
        kubectl("apply", "-n", namespace, "-f", "-", input=manifest("triplet"))
        triplet = pin(kubectl, namespace, "triplet")
        assert triplet.get("ratio") is None and not triplet.get("deployments"), triplet
        # the store is read again on its own clock (a second here), so the drop may be said after the pin: wait
        wait_for("the operator to say the unattested sample was dropped",
                 lambda: "carries no attestation" in op.log.read_text() or None, timeout=60)
    finally:
        op.stop()
