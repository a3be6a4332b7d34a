"""LoRA adapters from a volume (``pvc://``) and from the cluster's S3 store (``s3://``): the operator's plumbing.

No adapter comes from the Hub here. One tiny adapter (hack/tiny_adapters.py) is copied onto a claim of the
local-path class (a real file system of its own), as a user copies an adapter onto a volume; another is PUT into
the cluster's SeaweedFS, beside the tiny model itself (an ``s3://`` model, so the model cache is on). The operator
reads the first one's ``adapter_config.json`` with its inspect Job (a real process on the vllm-cpu pool, the
report through the process kubelet's termination message) and the second one's from the bucket with its own S3
client; it downloads the model and the second adapter into the cache PVC with ``llm-autopilot fetch`` Jobs, mounts
the adapter's claim read-only, and renders ``--lora-modules`` with the paths inside the pod. The vLLM pod answers a
completion under each adapter's name, and three different texts show that each adapter's own files were read.

Plumbing, so the vLLM pod is the stand-in (hack/vllm_standin.py; tests/README.md, "Tiers"): what is checked is
where each adapter is read, fetched and mounted, the paths in ``--lora-modules`` and ``status.lora``. The stand-in
loads each adapter as vLLM does (``adapter_config.json`` and complete weights at the rendered path, its rank within
``--max-lora-rank``), and its text is a digest of the weights it read: a different adapter, a different text. That
vLLM applies an adapter to what it writes, and its slots, are proven on the real CPU build
(test_real_vllm_lora.py).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hack.localcluster import vllm_cpu

from tests.e2e.conftest import Kubectl, wait_for
from tests.e2e.helpers import volume_with
from tests.e2e.model_store import MODEL, PREFIX, Store, fresh_bucket, model_files
from tests.e2e.real_vllm import (
    STAND_IN,
    STAND_IN_START_SECONDS,
    apply,
    complete,
    describe,
    llmd,
    operator_for,
    ready_pods,
    real_vllm_fixture,  # noqa: F401 - a fixture
    tiny,
)

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("real_vllm")]

ON_CLAIM, IN_BUCKET = "gqa-r16-all", "gqa-r8-attn"
CLAIM, FOLDER = "adapters", f"team/{ON_CLAIM}"
#: inspect Job, model and adapter downloads (under 1 MB each) on the loaded 2-core machine
READ_SECONDS = 240
PROMPT = "The operator plans vLLM settings"


@pytest.fixture(name="store")
def store_fixture(kubectl: Kubectl) -> Iterator[Store]:
    with fresh_bucket(kubectl.env, "lora") as store:
        yield store


def completion(pod: dict[str, Any], model: str) -> dict[str, Any]:
    return complete(pod, PROMPT, 120, model=model, temperature=0.0)


def served(pod: dict[str, Any]) -> dict[str, str]:
    """The model cards /v1/models lists: id -> root (an adapter's root is the path vLLM loaded it from)."""
    with urllib.request.urlopen(f"http://{pod['status']['podIP']}:8000/v1/models", timeout=30) as response:
        return {m["id"]: m.get("root") or "" for m in json.load(response)["data"]}


def test_adapters_from_a_claim_and_a_bucket_are_read_where_they_live_and_served_under_their_names(
        kubectl: Kubectl, namespace: str, tmp_path: Path, store: Store) -> None:
    made = {a["name"]: Path(a["path"]) for a in vllm_cpu.make_adapters((ON_CLAIM, IN_BUCKET))}
    volume_with(kubectl, namespace, CLAIM, {f"{FOLDER}/{p.name}": p for p in sorted(made[ON_CLAIM].iterdir())})
    store.put_model(PREFIX, model_files())
    store.put_model(f"adapters/{IN_BUCKET}", {p.name: p.read_bytes() for p in sorted(made[IN_BUCKET].iterdir())})
    apply(kubectl, namespace, store.secret_manifest())
    s3 = {"endpoint": store.endpoint, "credentialsSecretRef": {"name": "s3-models"}}
    lora = {"maxLoras": 2, "s3": s3, "adapters": [
        {"name": "vol", "source": f"pvc://{CLAIM}/{FOLDER}"},
        {"name": "bucket", "source": f"s3://{store.bucket}/adapters/{IN_BUCKET}"}]}
    model = {"name": MODEL, "source": f"s3://{store.bucket}/{PREFIX}", "s3": s3, "cache": {"enabled": True}}
    started = time.time()
    with operator_for(kubectl, namespace, tmp_path):
        # the stand-in: where the adapters come from is the point here, not what vLLM does with them
        apply(kubectl, namespace, tiny("lora-src", model=model, lora=lora, vllm=STAND_IN))

        def inspected() -> list[dict[str, Any]] | None:
            found = (llmd(kubectl, namespace, "lora-src").get("status") or {}).get("loraSources") or []
            return found if found and found[0]["state"] == "Inspected" else None

        [source] = wait_for("the claim's adapter inspected by its Job", inspected, timeout=READ_SECONDS, interval=2)
        inspected_s = time.time() - started
        assert (source["name"], source["uri"], source["rank"], source["baseModel"]) == (
            "vol", f"pvc://{CLAIM}/{FOLDER}", 16, MODEL), source
        assert source["claimUID"] == kubectl.json("pvc", CLAIM, "-n", namespace)["metadata"]["uid"]

        def serving_both() -> dict[str, Any] | None:
            for pod in ready_pods(kubectl, namespace, "lora-src"):
                if {"vol", "bucket"} <= set(served(pod)):
                    return pod
            return None

        pod = wait_for("a Ready pod serving both adapters", serving_both, timeout=STAND_IN_START_SECONDS + READ_SECONDS,
                       interval=3)
        ready_s = time.time() - started
        status = llmd(kubectl, namespace, "lora-src")["status"]
        [cached] = status["cache"]["adapters"]
        assert (cached["name"], cached["state"]) == ("bucket", "Complete"), cached
        in_pod = {"vol": f"/lora-adapters/{CLAIM}/{FOLDER}", "bucket": f"/model-cache/{cached['folder']}"}
        container = pod["spec"]["containers"][0]
        modules = container["args"][container["args"].index("--lora-modules") + 1:][:2]
        assert modules == [f"vol={in_pod['vol']}", f"bucket={in_pod['bucket']}"], container["args"]
        # the max-lora-rank default is the largest rank read: 16 on the volume, 8 in the bucket
        assert container["args"][container["args"].index("--max-lora-rank") + 1] == "16"
        claims = {v["persistentVolumeClaim"]["claimName"]: v["persistentVolumeClaim"].get("readOnly")
                  for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v}
        # the adapters' claim and the model cache read-only; the compile cache (on with the model cache) is vLLM's
        # to write
        assert claims == {CLAIM: True, status["cache"]["claimName"]: True,
                          status["compileCache"]["claimName"]: None}, claims
        roots = served(pod)
        assert (roots["vol"], roots["bucket"]) == (in_pod["vol"], in_pod["bucket"]), roots

        answers = {name: completion(pod, name) for name in (MODEL, "vol", "bucket")}
        texts = {name: a["choices"][0]["text"] for name, a in answers.items()}
        for name, answer in answers.items():
            assert answer["model"] == name and answer["usage"]["completion_tokens"] == 8, answer
        assert len(set(texts.values())) == 3, texts  # each adapter's own weights were read

        def lora_listed() -> list[tuple[str, str, str, list[str]]] | None:
            adapters = ((llmd(kubectl, namespace, "lora-src").get("status") or {}).get("lora") or {}).get(
                "adapters") or []
            found = [(a["name"], a["source"], a.get("path", ""), a.get("pods", [])) for a in adapters]
            return found if all(pods for *_, pods in found) and found else None

        listed = wait_for("status.lora to say where each adapter comes from", lora_listed, timeout=60, interval=2)
        assert listed == [("vol", f"pvc://{CLAIM}/{FOLDER}", in_pod["vol"], [pod["metadata"]["name"]]),
                          ("bucket", f"s3://{store.bucket}/adapters/{IN_BUCKET}", in_pod["bucket"],
                           [pod["metadata"]["name"]])], listed
        text = describe(kubectl, namespace, "lora-src")
        assert f"pvc://{CLAIM}/{FOLDER}" in text and f"s3://{store.bucket}/adapters/{IN_BUCKET}" in text
        gets = store.object_gets(started, f"adapters/{IN_BUCKET}")
        sys.stderr.write(f"\n[LoRA sources] inspected the claim's adapter in {inspected_s:.0f} s, a pod served both "
                         f"{ready_s:.0f} s after apply; --lora-modules {' '.join(modules)}; greedy texts {texts}; "
                         f"S3 GETs of the adapter's objects {gets}\n")
