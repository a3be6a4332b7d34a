"""An air-gapped cluster (issue 14, e2e (d) and the pvc:// cases of (e)): the operator's plumbing, on the vLLM stand-in.

No Hub is reachable: the operator's and the vLLM pods' ``HF_ENDPOINT`` is a closed port, and the local Hub's
own log must show no request at all during the test. The weights are on a PersistentVolumeClaim of the
local-path StorageClass (a real file system of its own), filled with the tiny model's files as a user fills a
volume. The operator reads config.json there with its inspect Job (a real process on the vllm-cpu pool, whose
report comes back through the process kubelet's termination message), plans on it, and vLLM serves the model
from the read-only mount under the name clients use.

Plumbing, so the vLLM pod is the stand-in (hack/vllm_standin.py; tests/README.md, "Tiers"): what is checked is
where config.json and the weights come from (the claim, read-only, at the rendered path), that nothing asks the
Hub, and the name served. The stand-in reads the folder as vLLM does (no config.json or an incomplete safetensors
file fails its start), serves under --served-model-name, and asks the Hub only for a Hub id, as vLLM would.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hack.localcluster import vllm_cpu

from tests.e2e.conftest import Kubectl, _free_port, wait_for
from tests.e2e.helpers import volume_with
from tests.e2e.real_vllm import (
    MODEL,
    STAND_IN,
    STAND_IN_START_SECONDS,
    apply,
    arg,
    complete,
    llmd,
    operator_for,
    ready_pods,
    real_vllm_fixture,  # noqa: F401 - a fixture
    tiny,
)

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("real_vllm")]

CLAIM, PATH = "weights", "llm-autopilot/tiny-llama-gqa"
INSPECT_SECONDS = 180


def closed_hub() -> str:
    """An HF_ENDPOINT nothing listens on: every Hub request would be refused."""
    return f"http://127.0.0.1:{_free_port()}"


def hub_requests(kubectl: Kubectl, since: float) -> list[dict[str, Any]]:
    """Every request the local Hub logged since ``since`` (downloads or not)."""
    lines = Path(kubectl.env["LLM_AUTOPILOT_HUB_LOG"]).read_text(errors="replace").splitlines()
    return [line for line in map(json.loads, (t for t in lines if t.startswith("{"))) if line["time"] >= since]


def snapshot(model: str = MODEL) -> Path:
    folders = sorted((vllm_cpu.models_cache() / f"models--{model.replace('/', '--')}" / "snapshots").iterdir())
    assert folders, f"the tiny model {model} is not made"
    return folders[-1]


def planned(kubectl: Kubectl, namespace: str, name: str, reason: str | None = None,
            timeout: float = INSPECT_SECONDS) -> dict[str, Any]:
    """The Planned condition once it is True (or has ``reason``)."""
    def check() -> dict[str, Any] | None:
        conditions = (llmd(kubectl, namespace, name).get("status") or {}).get("conditions") or []
        found = next((c for c in conditions if c["type"] == "Planned"), None)
        if found is None:
            return None
        return found if (found["reason"] == reason if reason else found["status"] == "True") else None

    return dict(wait_for(f"Planned {reason or 'True'} on {namespace}/{name}", check, timeout=timeout, interval=1))


def test_air_gapped_a_pvc_model_is_planned_from_its_volume_and_serves(
        kubectl: Kubectl, namespace: str, tmp_path: Path) -> None:
    since = time.time()
    files = {f"{PATH}/{p.name}": p for p in snapshot().iterdir()}
    volume_with(kubectl, namespace, CLAIM, files)
    config = json.loads(files[f"{PATH}/config.json"].read_text())
    weight_bytes = files[f"{PATH}/model.safetensors"].stat().st_size
    hub = closed_hub()
    with operator_for(kubectl, namespace, tmp_path, hub=hub):
        # the stand-in: what this test is about is where config.json and the weights come from, not vLLM
        apply(kubectl, namespace, tiny("airgap", model={"name": MODEL, "source": f"pvc://{CLAIM}/{PATH}"},
                                       vllm={**STAND_IN, "env": [{"name": "HF_ENDPOINT", "value": hub}]}))
        inspecting = planned(kubectl, namespace, "airgap", "InspectingSource", timeout=60)
        assert f"claim '{CLAIM}', path '/model/{PATH}'" in inspecting["message"], inspecting
        started = time.time()
        condition = planned(kubectl, namespace, "airgap")
        inspected_s = time.time() - started
        status = llmd(kubectl, namespace, "airgap")["status"]
        source = status["source"]
        assert source["state"] == "Inspected" and source["uri"] == f"pvc://{CLAIM}/{PATH}", source
        assert source["claimUID"] == kubectl.json("pvc", CLAIM, "-n", namespace)["metadata"]["uid"]
        assert source["checkpointBytes"] == weight_bytes and source["weightFiles"] == 1, source
        assert {k: source["config"][k] for k in ("hidden_size", "num_hidden_layers", "num_key_value_heads")} == {
            k: config[k] for k in ("hidden_size", "num_hidden_layers", "num_key_value_heads")}
        # the planner's numbers are the volume's: K and V x layers x KV heads x head_dim x 2 bytes (bf16)
        kv_bytes = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * config["head_dim"] * 2
        assert status["plan"]["memory"]["kvBytesPerToken"] == kv_bytes, status["plan"]["memory"]
        assert status["plan"]["maxModelLen"] <= config["max_position_embeddings"]
        # the report came through the inspect Job's termination message (the process kubelet's, as a kubelet's)
        job = kubectl.json("jobs", "-n", namespace, "-l", "llm-autopilot.io/inspect=airgap")["items"]
        assert len(job) == 1 and job[0]["status"].get("succeeded") == 1, job
        inspect_pod = kubectl.json("pods", "-n", namespace, "-l", f"job-name={job[0]['metadata']['name']}")["items"][0]
        message = inspect_pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"]
        assert json.loads(message)["checkpointBytes"] == weight_bytes, message

        pod = wait_for("a Ready pod of airgap", lambda: next(iter(ready_pods(kubectl, namespace, "airgap")), None),
                       timeout=STAND_IN_START_SECONDS, interval=2)
        served_s = time.time() - started
        assert arg(pod, "--served-model-name") == MODEL
        assert pod["spec"]["containers"][0]["args"][0] == f"/models/{PATH}"
        answer = complete(pod)  # "model": MODEL, the name clients use
        assert answer["model"] == MODEL and answer["usage"]["completion_tokens"] == 8, answer
    assert hub_requests(kubectl, since) == []  # nothing asked the Hub: not the operator, the Job or vLLM
    sys.stderr.write(f"\n[air-gapped] {condition['message']}; inspected in {inspected_s:.0f} s, serving "
                     f"{served_s:.0f} s after the inspection began; weights {weight_bytes} bytes from "
                     f"pvc://{CLAIM}/{PATH}; 0 Hub requests\n")


def test_air_gapped_bad_volumes_get_a_condition_naming_claim_and_path_and_nothing_is_applied(
        kubectl: Kubectl, namespace: str, tmp_path: Path) -> None:
    since = time.time()
    model = snapshot()
    volume_with(kubectl, namespace, CLAIM, {"good/model.safetensors": model / "model.safetensors",
                                            "garbage/config.json": b"{\"hidden_size\": 128, oops",
                                            "garbage/model.safetensors": model / "model.safetensors"})
    cases = {"no-claim": ("pvc://missing/x", "SourceNotFound", "PersistentVolumeClaim 'missing'"),
             "wrong-path": (f"pvc://{CLAIM}/good", "SourceUnreadable", "no config.json in /model/good"),
             "garbage": (f"pvc://{CLAIM}/garbage", "SourceUnreadable", "/model/garbage/config.json is not valid JSON")}
    with operator_for(kubectl, namespace, tmp_path, hub=closed_hub()):
        for name, (uri, _, _) in cases.items():  # nothing may start; were it to, the stand-in shows it at once
            apply(kubectl, namespace, tiny(name, model={"name": MODEL, "source": uri}, vllm=STAND_IN))
        for name, (uri, reason, expected) in cases.items():
            condition = planned(kubectl, namespace, name, reason)
            assert expected in condition["message"] and uri in condition["message"], condition
            if reason == "SourceUnreadable":
                assert f"claim '{CLAIM}'" in condition["message"] and "kubectl delete job" in condition["message"]
            sys.stderr.write(f"\n[air-gapped bad input] {name}: {reason}: {condition['message']}\n")
        # nothing but the inspect Jobs was applied: no workload, no Service, and no vLLM pod
        for kind in ("deployments", "services", "statefulsets"):
            assert kubectl.json(kind, "-n", namespace)["items"] == [], kind
        assert all(p["metadata"]["labels"].get("app.kubernetes.io/component") == "source-inspection"
                   for p in kubectl.json("pods", "-n", namespace)["items"])
        jobs = {j["metadata"]["labels"]["llm-autopilot.io/inspect"]: j
                for j in kubectl.json("jobs", "-n", namespace)["items"]}
        assert set(jobs) == {"wrong-path", "garbage"}  # none for the missing claim
        for job in jobs.values():  # run once (backoffLimit 0), kept until the TTL controller removes it
            assert job["spec"]["backoffLimit"] == 0 and job["status"].get("failed") == 1, job["status"]
    assert hub_requests(kubectl, since) == []
