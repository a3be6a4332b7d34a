"""Two models on one ``spec.model.cache.existingClaim``: each in its own folder, each pod serving its own weights
(issue #28, item 4).

Two tiny models of different shapes (hack/tiny_models.py: ``tiny-llama-gqa``, two KV heads, and
``tiny-llama-mqa``, one), from the local Hub (``hf://``, the issue's case) or PUT into the cluster's SeaweedFS
(``s3://``); two LLMDeployments name the same claim of the local-path class (a real file system of its own) as
their cache. Before the fix both downloads went to the claim's ``model`` folder under one
Job name, so the second LLMDeployment found the first one's Job complete and its pods served the first model's
weights under their own name. Now each (source, revision) has its folder (``models/<slug>-<hash>``) and its Job.

Plumbing, so the vLLM pods are the stand-in (hack/vllm_standin.py; tests/README.md, "Tiers"): what is checked is
where each model is downloaded, the path each pod is pointed at and the files there. The stand-in reads the folder
as vLLM does (config.json and complete weights at the rendered path) and its answer is a digest of the weights it
read: another model's weights, another text.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.e2e.conftest import Kubectl, wait_for
from tests.e2e.model_store import Store, fresh_bucket, model_files
from tests.e2e.real_vllm import (
    STAND_IN,
    STAND_IN_START_SECONDS,
    apply,
    complete,
    llmd,
    operator_for,
    ready_pods,
    real_vllm_fixture,  # noqa: F401 - a fixture
    tiny,
)

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("real_vllm")]

CLAIM = "team-models"
#: the LLMDeployment's name -> the tiny model it serves (the Hub id, also the bucket prefix's last part)
MODELS = {"gqa": "llm-autopilot/tiny-llama-gqa", "mqa": "llm-autopilot/tiny-llama-mqa"}
#: a download Job (under 1 MB) and a stand-in start on the loaded 2-core machine
READY_SECONDS = STAND_IN_START_SECONDS + 240
PROMPT = "The operator plans vLLM settings"


@pytest.fixture(name="store")
def store_fixture(kubectl: Kubectl) -> Iterator[Store]:
    with fresh_bucket(kubectl.env, "shared") as store:
        yield store


def deployment_of(name: str, model: str, store: Store, scheme: str) -> dict[str, Any]:
    source: dict[str, Any] = {"name": model, "cache": {"enabled": True, "existingClaim": CLAIM}}
    if scheme == "s3":
        source |= {"source": f"s3://{store.bucket}/{model.split('/')[1]}",
                   "s3": {"endpoint": store.endpoint, "credentialsSecretRef": {"name": "s3-models"}}}
    else:  # hf://<name>, from the local Hub (the operator's HF_ENDPOINT, passed to the download Job)
        source["source"] = f"hf://{model}"
    # the stand-in: where each model's files are is the point here, not what vLLM does with them
    return tiny(name, model=source, vllm=STAND_IN)


def serving(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    """The first Ready pod of ``name``, once its cache is complete."""

    def ready() -> dict[str, Any] | None:
        status = llmd(kubectl, namespace, name).get("status") or {}
        cached = (status.get("cache") or {}).get("state") == "Complete"
        pods = ready_pods(kubectl, namespace, name)
        return pods[0] if cached and pods else None

    found: dict[str, Any] = wait_for(f"{name}: its cache complete and a Ready pod", ready, timeout=READY_SECONDS,
                                     interval=2)
    return found


@pytest.mark.parametrize("scheme", ["hf", "s3"])
def test_two_models_on_one_existing_claim_each_get_their_own_folder_and_serve_their_own_weights(
        kubectl: Kubectl, namespace: str, tmp_path: Path, store: Store, scheme: str) -> None:
    files = {name: model_files(model) for name, model in MODELS.items()}
    assert files["gqa"]["model.safetensors"] != files["mqa"]["model.safetensors"]  # two models, two sets of weights
    for name, model in MODELS.items():
        store.put_model(model.split("/")[1], files[name])
    apply(kubectl, namespace, store.secret_manifest())
    apply(kubectl, namespace, {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM},
                               "spec": {"accessModes": ["ReadWriteMany"],
                                        "resources": {"requests": {"storage": "64Mi"}}}})
    started = time.time()
    pods: dict[str, dict[str, Any]] = {}
    # the operator passes its HF_ENDPOINT to the download Job, so it must be an address pods reach: the local
    # Hub on the pod bridge's gateway (where the store is), not the loopback address the host's tests use
    hub = f"http://{urlsplit(store.endpoint).hostname}:{urlsplit(kubectl.env['LLM_AUTOPILOT_LOCAL_HUB']).port}"
    with operator_for(kubectl, namespace, tmp_path, hub=hub):
        # one after the other: the second model comes to a claim that holds the first one, complete
        for name, model in MODELS.items():
            apply(kubectl, namespace, deployment_of(name, model, store, scheme))
            pods[name] = serving(kubectl, namespace, name)
        ready_s = time.time() - started

        paths = {name: pod["spec"]["containers"][0]["args"][0] for name, pod in pods.items()}
        assert paths["gqa"] != paths["mqa"], f"both pods load {paths['gqa']}: one serves the other's weights"
        statuses = {name: llmd(kubectl, namespace, name)["status"]["cache"] for name in MODELS}
        for name, pod in pods.items():
            container = pod["spec"]["containers"][0]
            served = container["args"][container["args"].index("--served-model-name") + 1]
            assert served == MODELS[name], container["args"]
            assert statuses[name]["claimName"] == CLAIM and paths[name] == f"/model-cache/{statuses[name]['folder']}"
            assert pod["spec"]["initContainers"][0]["name"] == "cache-complete"
            assert f"{paths[name]}/.llm-autopilot-complete" in pod["spec"]["initContainers"][0]["command"][-1]

        # each folder on the claim's volume holds its own model's files, byte for byte
        volume = kubectl.json("pvc", CLAIM, "-n", namespace)["spec"]["volumeName"]
        root = Path(kubectl.json("pv", volume)["spec"]["hostPath"]["path"])
        for name in MODELS:
            folder = root / statuses[name]["folder"]
            on_disk = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
            assert ".llm-autopilot-complete" in on_disk, sorted(on_disk)
            assert {k: v for k, v in on_disk.items() if k in files[name]} == files[name], (name, sorted(on_disk))

        # one download Job per model, each filling its folder
        jobs = kubectl.json("jobs", "-n", namespace, "-l", f"llm-autopilot.io/cache={CLAIM}")["items"]
        filled = sorted(j["metadata"]["annotations"]["llm-autopilot.io/folder"] for j in jobs)
        assert filled == sorted(s["folder"] for s in statuses.values()), filled

        # and what each pod answers is made of the weights it read: two models, two texts
        texts = {name: complete(pod, PROMPT, 120, model=MODELS[name], temperature=0.0)["choices"][0]["text"]
                 for name, pod in pods.items()}
        assert texts["gqa"] != texts["mqa"], texts
    sys.stderr.write(f"\n[shared claim, {scheme}://] both served {ready_s:.0f} s after the first apply; folders "
                     f"{ {n: s['folder'] for n, s in statuses.items()} }; texts {texts}\n")
