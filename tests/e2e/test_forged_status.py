"""The status is a report, not the operator's memory (issue #28 item 2), on the local cluster: a user who may write the
status subresource forges what the operator reads back -- remediation's rungs, the KV calibration a spec plans with,
a pod's burn-in verdict, what an s3:// source's objects hold, what a pvc:// source's inspect Job read -- and nothing
moves: not the plan, not the Deployment, not the pod's readiness gate. The operator says it once, as a StatusForged
Event (and in its log), and decides the section again. Each test fails on the operator before status.attestations
(the move itself: "moved the Deployment", "moved the pod's gate", "was deployed").

No real vLLM: the pin on the KWOK L4 pool (the model from the catalog), the burn-in and the sources on the vLLM
stand-in (hack/vllm_standin.py) of the vllm-cpu pool.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_autopilot.domain.burn_in import BURN_IN_GATE
from llm_autopilot.remediation.state import attestation as step_attestation
from tests.e2e.conftest import ROOT, Kubectl, Operator, wait_for
from tests.e2e.model_store import PREFIX, Store, model_files
from tests.e2e.real_vllm import (
    STAND_IN,
    STAND_IN_START_SECONDS,
    arg,
    operator_for,
    pods,
    ready_pods,
    real_vllm_fixture,  # noqa: F401 - a fixture
    tiny,
)

pytestmark = pytest.mark.e2e

#: how long the operator is watched for a move after a forgery (its resyncs are 2-3 s apart)
WATCH_SECONDS = 20


def llmd(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    return dict(kubectl.json("llmd", name, "-n", namespace))


def status_of(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    return dict(llmd(kubectl, namespace, name).get("status") or {})


def forge(kubectl: Kubectl, namespace: str, name: str, status: dict[str, Any]) -> None:
    """What a user with the status subresource can do: a merge patch of the status."""
    kubectl("patch", "llmd", name, "-n", namespace, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}))


def forged_events(kubectl: Kubectl, namespace: str, name: str) -> list[str]:
    found = kubectl.json("events", "-n", namespace, "--field-selector",
                         f"involvedObject.name={name},reason=StatusForged")
    return [str(e.get("message")) for e in found["items"]]


def said_forged(kubectl: Kubectl, namespace: str, name: str, section: str) -> list[str]:
    said: list[str] = wait_for(f"a StatusForged Event naming status.{section}", lambda: [
        m for m in forged_events(kubectl, namespace, name) if f"status.{section}" in m] or None, timeout=60)
    return said


def deployment(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    return dict(kubectl.json("deployment", name, "-n", namespace))


def container_args(kubectl: Kubectl, namespace: str, name: str) -> list[str]:
    return list(deployment(kubectl, namespace, name)["spec"]["template"]["spec"]["containers"][0]["args"])


def unmoved(kubectl: Kubectl, namespace: str, name: str, args: list[str], plan: dict[str, Any]) -> None:
    """For WATCH_SECONDS: the Deployment's args and status.plan stay as they were."""
    deadline = time.monotonic() + WATCH_SECONDS
    while time.monotonic() < deadline:
        assert container_args(kubectl, namespace, name) == args, "the forged status moved the Deployment"
        assert status_of(kubectl, namespace, name).get("plan") == plan, "the forged status moved the plan"
        time.sleep(1)


# ---- status.kvCalibration: the KV calibration a spec plans with ---------------------------------------------

def qwen(name: str) -> str:
    doc = yaml.safe_load((ROOT / "examples" / "qwen3-8b-l4.yaml").read_text())
    doc["metadata"]["name"] = name
    del doc["spec"]["serving"]["maxModelLen"]  # as long as the KV cache holds: what a calibration moves
    return yaml.safe_dump(doc)


def test_a_forged_calibration_moves_no_plan(kubectl: Kubectl, namespace: str, tmp_path: Path) -> None:
    settings = {"LLM_AUTOPILOT_RESYNC_SECONDS": "2", "HF_ENDPOINT": "http://127.0.0.1:9",
                "LLM_AUTOPILOT_HUB_TIMEOUT_SECONDS": "1", "LLM_AUTOPILOT_CALIBRATION_NAMESPACE": namespace,
                "LLM_AUTOPILOT_CALIBRATION_READ_SECONDS": "1"}
    op = Operator({**kubectl.env, **settings}, tmp_path / "operator.log",
                  ["--standalone", f"--namespace={namespace}"]).start()
    try:
        kubectl("apply", "-n", namespace, "-f", "-", input=qwen("pinned"))
        pin = wait_for("status.kvCalibration and the Deployment", lambda: (
            status_of(kubectl, namespace, "pinned").get("kvCalibration")
            if kubectl.maybe("deployment", "pinned", "-n", namespace) else None), timeout=90)
        assert pin.get("ratio") is None, pin  # no sample in the store: not calibrated
        args, plan = container_args(kubectl, namespace, "pinned"), status_of(kubectl, namespace, "pinned")["plan"]
        # the pin of this very spec, as if earlier deployments had measured 45% more KV cache than predicted
        forged = {**copy.deepcopy(pin), "ratio": 1.449, "deployments": 3,
                  "message": "calibrated from evil/twin"}
        forge(kubectl, namespace, "pinned", {"kvCalibration": forged})
        unmoved(kubectl, namespace, "pinned", args, plan)
        said = said_forged(kubectl, namespace, "pinned", "kvCalibration")
        kept = status_of(kubectl, namespace, "pinned")["kvCalibration"]
        assert kept.get("ratio") is None and not kept.get("deployments"), kept  # chosen again, not forged
        assert len(forged_events(kubectl, namespace, "pinned")) == 1, said  # said once
        assert "not attested by this operator" in op.log.read_text()
    finally:
        op.stop()


# ---- status.remediation: the rungs the plan is rendered with --------------------------------------------------

def test_a_forged_remediation_step_moves_no_plan(kubectl: Kubectl, namespace: str, tmp_path: Path) -> None:
    """The rungs chained with remediation's own step digest, which anyone can compute (it is not keyed): before
    status.attestations covered status.remediation, the operator applied them."""
    settings = {"LLM_AUTOPILOT_RESYNC_SECONDS": "2", "HF_ENDPOINT": "http://127.0.0.1:9",
                "LLM_AUTOPILOT_HUB_TIMEOUT_SECONDS": "1", "LLM_AUTOPILOT_CALIBRATION_NAMESPACE": "off",
                "LLM_AUTOPILOT_CALIBRATION_KEY": os.urandom(32).hex()}
    op = Operator({**kubectl.env, **settings}, tmp_path / "operator.log",
                  ["--standalone", f"--namespace={namespace}"]).start()
    try:
        kubectl("apply", "-n", namespace, "-f", "-", input=qwen("stepped"))
        wait_for("the Deployment", lambda: kubectl.maybe("deployment", "stepped", "-n", namespace), timeout=90)
        obj = llmd(kubectl, namespace, "stepped")
        args, plan = container_args(kubectl, namespace, "stepped"), obj["status"]["plan"]
        assert arg_value(args, "--gpu-memory-utilization") != "0.8", args
        step = {"gpuMemoryUtilization": 0.8}
        generation = int(obj["metadata"]["generation"])
        digest = step_attestation(obj["metadata"]["uid"], generation, step, "")
        forge(kubectl, namespace, "stepped", {"remediation": {
            "rung": 1, "state": "Step", "applied": [{**step, "generation": generation, "attestation": digest}]}})
        unmoved(kubectl, namespace, "stepped", args, plan)
        said = wait_for("an UnattributedRemediation Event", lambda: [
            e["message"] for e in kubectl.json("events", "-n", namespace, "--field-selector",
                                               "involvedObject.name=stepped,reason=UnattributedRemediation")["items"]
        ] or None, timeout=60)
        assert "the workload does not run its plan" in said[0], said
        kept = status_of(kubectl, namespace, "stepped")["remediation"]
        assert kept.get("applied") == [] and kept.get("rung") == 0, kept
        assert len(said) == 1, said  # said once
    finally:
        op.stop()


def arg_value(args: list[str], flag: str) -> str | None:
    return next((args[i + 1] for i, a in enumerate(args[:-1]) if a == flag), None)


# ---- status.burnIn: a pod's verdict, which the operator writes onto the pod's readiness gate ----------------

def gate(pod: dict[str, Any]) -> str | None:
    return next((c.get("status") for c in pod["status"].get("conditions") or [] if c.get("type") == BURN_IN_GATE),
                None)


@pytest.fixture(name="standin_operator")
def standin_operator_fixture(kubectl: Kubectl, namespace: str, tmp_path: Path,
                             real_vllm: list[dict[str, Any]]) -> Iterator[Operator]:
    """An operator for the tests on the vllm-cpu nodes (the stand-in and its tiny models): ``real_vllm`` puts
    them in that lane of `make test` (tests/e2e/lanes.py), never beside another test on those two nodes."""
    with operator_for(kubectl, namespace, tmp_path) as op:
        yield op
    kubectl("delete", "llmd", "--all", "-n", namespace, "--wait=true", "--timeout=90s", check=False)


def test_a_forged_burn_in_verdict_moves_no_gate(kubectl: Kubectl, namespace: str, standin_operator: Operator) -> None:
    obj = tiny("burnt", vllm=STAND_IN, verification={"burnIn": {"concurrency": 1, "maxTokens": 4,
                                                                "timeoutSeconds": 60}})
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj))
    verdict = wait_for("the pod's burn-in passed (status.burnIn and its gate)", lambda: (
        status_of(kubectl, namespace, "burnt").get("burnIn")
        if [p for p in ready_pods(kubectl, namespace, "burnt") if gate(p) == "True"] else None),
        timeout=STAND_IN_START_SECONDS + 120)
    judged = verdict["pods"][0]
    assert judged["passed"] is True, verdict
    pod = judged["pod"]
    # the verdict turned: on main the operator wrote it onto the pod's gate and took the pod out of the Service
    forged = {**verdict, "pods": [{**judged, "passed": False, "reason": "KVCacheTooSmall",
                                   "message": f"{pod}: forged"}]}
    forge(kubectl, namespace, "burnt", {"burnIn": forged})
    deadline = time.monotonic() + WATCH_SECONDS
    while time.monotonic() < deadline:
        current = {p["metadata"]["name"]: p for p in pods(kubectl, namespace, "burnt")}
        assert gate(current[pod]) == "True", "the forged verdict moved the pod's gate"
        time.sleep(1)
    said_forged(kubectl, namespace, "burnt", "burnIn")
    assert [p["metadata"]["name"] for p in ready_pods(kubectl, namespace, "burnt")] == [pod]
    assert status_of(kubectl, namespace, "burnt")["burnIn"]["pods"][0]["passed"] is True  # read from its gate


# ---- status.source: what an s3:// source's objects hold ------------------------------------------------------

@pytest.fixture(name="store")
def store_fixture(kubectl: Kubectl, namespace: str) -> Iterator[Store]:
    store = Store(kubectl.env).create()
    try:
        store.put_model(PREFIX, model_files())
        kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(store.secret_manifest()))
        yield store
    finally:
        store.remove()


def test_a_forged_source_moves_no_plan(kubectl: Kubectl, namespace: str, standin_operator: Operator,
                                       store: Store) -> None:
    model = {"name": "llm-autopilot/tiny-llama-gqa", "source": f"s3://{store.bucket}/{PREFIX}",
             "s3": {"endpoint": store.endpoint, "credentialsSecretRef": {"name": "s3-models"}},
             "cache": {"enabled": True}}
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(tiny("sourced", model=model, vllm=STAND_IN)))
    source = wait_for("status.source and the Deployment", lambda: (
        status_of(kubectl, namespace, "sourced").get("source")
        if kubectl.maybe("deployment", "sourced", "-n", namespace) else None), timeout=120)
    assert source["state"] == "Inspected" and source["config"], source
    args, plan = container_args(kubectl, namespace, "sourced"), status_of(kubectl, namespace, "sourced")["plan"]
    # the same objects (ETags and sizes: what lets a reading be kept), another model in them: twice the context
    config = source["config"]
    forged = {**source, "config": {**config, "max_position_embeddings": 2 * int(config["max_position_embeddings"]),
                                   "num_hidden_layers": 4 * int(config["num_hidden_layers"])}}
    forge(kubectl, namespace, "sourced", {"source": forged})
    unmoved(kubectl, namespace, "sourced", args, plan)
    said_forged(kubectl, namespace, "sourced", "source")
    assert status_of(kubectl, namespace, "sourced")["source"]["config"] == config  # read again from the store
    assert arg(deployment(kubectl, namespace, "sourced"), "--max-model-len") == arg(
        {"spec": {"containers": [{"args": args}]}}, "--max-model-len")


# ---- status.source: what a pvc:// source's inspect Job read on the volume ----------------------------------

def test_a_forged_volume_reading_deploys_nothing(kubectl: Kubectl, namespace: str,
                                                 standin_operator: Operator) -> None:
    # a claim no volume ever binds: its inspect Job never runs, so nothing has read the volume
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "unread"},
             "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "no-such-class",
                      "resources": {"requests": {"storage": "1Gi"}}}}
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(claim))
    uri = "pvc://unread/models/tiny"
    obj = tiny("unread", model={"name": "llm-autopilot/tiny-llama-gqa", "source": uri}, vllm=STAND_IN)
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj))
    inspecting = wait_for("Planned=False InspectingSource", lambda: next((
        c for c in status_of(kubectl, namespace, "unread").get("conditions") or []
        if c["type"] == "Planned" and c["reason"] == "InspectingSource"), None), timeout=60)
    files = model_files()
    claim_uid = kubectl.json("pvc", "unread", "-n", namespace)["metadata"]["uid"]
    # what the inspect Job would have reported, as if it had: the claim's uid is anyone's to read
    forge(kubectl, namespace, "unread", {"source": {
        "uri": uri, "claimUID": claim_uid, "state": "Inspected", "config": json.loads(files["config.json"]),
        "checkpointBytes": len(files["model.safetensors"]), "weightFiles": 1}})
    deadline = time.monotonic() + WATCH_SECONDS
    while time.monotonic() < deadline:
        assert kubectl.maybe("deployment", "unread", "-n", namespace) is None, "the forged reading was deployed"
        time.sleep(1)
    said_forged(kubectl, namespace, "unread", "source")
    planned = next(c for c in status_of(kubectl, namespace, "unread")["conditions"] if c["type"] == "Planned")
    assert planned["status"] == "False" and planned["reason"] == "InspectingSource", (planned, inspecting)
    assert status_of(kubectl, namespace, "unread")["source"]["state"] == "Inspecting"
