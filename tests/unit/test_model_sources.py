"""spec.model.source: admission, planning from S3 without the Hub, and pods that load a volume read-only."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec, S3Options
from llm_autopilot.controller import sources
from llm_autopilot.controller.access import referenced_secrets
from llm_autopilot.controller.admission import review
from llm_autopilot.storage.s3 import S3Client
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION
from tests.unit.fakes import FakeCluster, Run
from tests.unit.test_storage import CONFIG, KEY, NOW, Store

V = str(DEFAULT_VLLM_VERSION)
H100 = {"product": "nvidia-h100-80gb"}
PVC_QWEN = {"model": {"name": "Qwen/Qwen3-8B", "source": "pvc://models/qwen/Qwen3-8B"}, "gpu": H100,
            "serving": {"maxModelLen": 16384}}
S3_TINY_MODEL: dict[str, Any] = {
    "name": "acme/tiny-llama", "source": "s3://models/tiny",
    "s3": {"endpoint": "http://s3.local:8333", "credentialsSecretRef": {"name": "s3-keys"}}, "cache": {"enabled": True}}
S3_TINY = {"model": S3_TINY_MODEL, "gpu": H100}
S3_SECRETS = {("ns", "s3-keys", "AWS_ACCESS_KEY_ID"): KEY.access_key_id,
              ("ns", "s3-keys", "AWS_SECRET_ACCESS_KEY"): KEY.secret_access_key}


def test_pvc_pods_mount_the_claim_read_only_and_load_the_local_path() -> None:
    run = Run(PVC_QWEN)
    run.once()
    assert run.condition("Planned")["status"] == "True"
    pod = run.cluster.deployment()["spec"]["template"]["spec"]
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in pod["volumes"]
    vllm = pod["containers"][0]
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in vllm["volumeMounts"]
    assert vllm["args"][0] == "/models/qwen/Qwen3-8B"
    assert vllm["args"][vllm["args"].index("--served-model-name") + 1] == "Qwen/Qwen3-8B"
    assert "--revision" not in vllm["args"]


def test_hub_pods_mount_no_model_volume() -> None:
    run = Run({**PVC_QWEN, "model": {"name": "Qwen/Qwen3-8B"}})
    run.once()
    pod = run.cluster.deployment()["spec"]["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["dshm", "home"]
    assert pod["containers"][0]["args"][0] == "Qwen/Qwen3-8B"


def test_a_pvc_model_outside_the_catalog_is_read_from_its_volume_not_refused() -> None:
    body = {**PVC_QWEN, "model": {"name": "acme/private", "source": "pvc://models/private"}}
    verdict = review(body, V)
    assert verdict.allowed and any("by a short inspect Job" in w for w in verdict.warnings)
    run = Run(body)
    out = run.once()
    assert run.condition("Planned")["reason"] == "SourceNotFound" and out.retry  # no claim 'models' here
    assert run.cluster.objects == {}


def test_a_pvc_model_described_inline_is_admitted_and_planned() -> None:
    arch = {k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type")}
    body = {"gpu": H100, "model": {"name": "acme/private", "source": "pvc://models/private",
                                   "architecture": {_camel(k): v for k, v in arch.items()} | {"weightBytes": 10**9}}}
    assert review(body, V).allowed
    run = Run(body)
    run.once()
    assert run.condition("Planned")["status"] == "True"


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


@pytest.mark.parametrize(("model", "says"), [
    ({"source": "pvc://models/x", "revision": "v2"}, "revision applies to the Hub"),
    ({"source": "s3://models/x", "hubTokenSecretRef": {"name": "hf"}}, "hubTokenSecretRef applies to the Hub"),
    ({"source": "s3://models/x"}, "an s3:// source needs cache.enabled: true"),
    ({"source": "pvc://models/x", "s3": {}}, "s3 only applies to an s3:// source"),
    ({"s3": {"region": "eu-west-1"}}, "s3 only applies to an s3:// source"),
    ({"source": "s3://models/x", "s3": {"endpoint": "s3.local:8333"}, "cache": {"enabled": True}},
     "spec.model.s3.endpoint"),
    ({"source": "nfs://server/x"}, "spec.model.source: 'nfs://server/x' is not a model source"),
])
def test_source_mistakes_are_refused_at_apply_time(model: dict[str, Any], says: str) -> None:
    verdict = review({"model": {"name": "acme/x", **model}, "gpu": H100}, V)
    assert not verdict.allowed and says in verdict.message, verdict.message


@pytest.fixture
def s3_store(monkeypatch: pytest.MonkeyPatch) -> Store:
    """sources.s3_client against an in-memory store that checks signatures (the real one: engineer C's SeaweedFS)."""
    store = Store({"tiny/config.json": json.dumps(CONFIG).encode(),
                   "tiny/model.safetensors.index.json": json.dumps({"metadata": {"total_size": 4 * 10**8}}).encode()})

    def client(options: S3Options | None, secret: sources.SecretReader, *, timeout: float) -> S3Client:
        assert options is not None and options.endpoint == "http://s3.local:8333"
        credentials = sources.s3_credentials(options, secret)  # reads the Secret, as the operator does
        return S3Client(options.endpoint, options.region, credentials, transport=httpx.MockTransport(store),
                        clock=lambda: NOW)

    monkeypatch.setattr(sources, "s3_client", client)
    return store


def test_an_s3_model_is_planned_from_its_own_config_without_the_hub(s3_store: Store) -> None:
    verdict = review(S3_TINY, V)
    assert verdict.allowed and any("read from s3://models/tiny" in w for w in verdict.warnings)
    run = Run(S3_TINY, cluster=FakeCluster(secrets=dict(S3_SECRETS)))
    run.once()
    assert run.condition("Planned")["status"] == "True"
    assert run.condition("ModelCached")["reason"] == "Pending"  # the download Job is created
    assert [(r.method, r.url.path) for r in s3_store.requests] == [
        ("HEAD", "/models/tiny/config.json"), ("HEAD", "/models/tiny/model.safetensors.index.json"),
        ("HEAD", "/models/tiny/hf_quant_config.json"),
        ("GET", "/models/tiny/config.json"), ("GET", "/models/tiny/model.safetensors.index.json")]
    assert all(r.url.host == "s3.local" for r in s3_store.requests)
    assert run.cluster.secret_reads == 2


def _calls(store: Store) -> list[tuple[str, str]]:
    calls = [(r.method, r.url.path.removeprefix("/models/tiny/")) for r in store.requests]
    store.requests.clear()
    return calls


HEADS = [("HEAD", "config.json"), ("HEAD", "model.safetensors.index.json"), ("HEAD", "hf_quant_config.json")]


def test_an_unchanged_s3_source_is_not_read_again(s3_store: Store) -> None:
    """Each full reconcile HEADs the objects; config.json and the index are GET again only when an ETag or size
    changes (status.source keeps the reading, as it keeps a pvc:// inspection with the claim's uid)."""
    run = Run(S3_TINY, cluster=FakeCluster(secrets=dict(S3_SECRETS)))
    run.once()
    assert _calls(s3_store) == [*HEADS, ("GET", "config.json"), ("GET", "model.safetensors.index.json")]
    source = run.status["source"]
    etag = hashlib.md5(s3_store.objects["tiny/config.json"]).hexdigest()
    assert (source["uri"], source["endpoint"], source["state"]) == ("s3://models/tiny", "http://s3.local:8333",
                                                                    "Inspected")
    assert source["objects"][0] == {"key": "tiny/config.json", "etag": etag,
                                    "size": len(s3_store.objects["tiny/config.json"])}
    assert (source["config"]["hidden_size"], source["checkpointBytes"]) == (64, 4 * 10**8)
    kv_per_token = run.status["plan"]["memory"]["kvBytesPerToken"]
    for _ in range(2):
        run.once()
        assert _calls(s3_store) == HEADS
        assert run.condition("Planned")["status"] == "True"
    assert run.status["source"] == source

    # replaced in place: config.json's ETag changes, so the files are read again and the plan follows
    s3_store.objects["tiny/config.json"] = json.dumps({**CONFIG, "num_hidden_layers": 4}).encode()
    run.once()
    assert _calls(s3_store) == [*HEADS, ("GET", "config.json"), ("GET", "model.safetensors.index.json")]
    assert run.status["plan"]["memory"]["kvBytesPerToken"] == 2 * kv_per_token
    run.once()
    assert _calls(s3_store) == HEADS
    # the weights replaced: the index's ETag and size change
    s3_store.objects["tiny/model.safetensors.index.json"] = json.dumps({"metadata": {"total_size": 8 * 10**8}}).encode()
    run.once()
    assert _calls(s3_store) == [*HEADS, ("GET", "config.json"), ("GET", "model.safetensors.index.json")]
    assert run.status["source"]["checkpointBytes"] == 8 * 10**8


@pytest.mark.parametrize("tamper", [
    {"endpoint": "http://elsewhere:8333"},  # read from another store
    {"uri": "s3://models/other"},  # another source
    {"claimUID": "uid-1"},  # a pvc:// inspection
    {"state": "Failed"},
    {"objects": []},
])
def test_a_kept_s3_reading_counts_only_for_the_same_objects_at_the_same_endpoint(
        s3_store: Store, tamper: dict[str, Any]) -> None:
    run = Run(S3_TINY, cluster=FakeCluster(secrets=dict(S3_SECRETS)))
    run.once()
    _calls(s3_store)
    run.status["source"] = {**run.status["source"], **tamper}
    run.once()
    assert ("GET", "config.json") in _calls(s3_store)
    assert run.status["source"]["uri"] == "s3://models/tiny" and "claimUID" not in run.status["source"]


def test_a_store_without_etags_is_read_each_time(s3_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = Store.__call__

    def without_etags(self: Store, request: httpx.Request) -> httpx.Response:
        answer = plain(self, request)
        return httpx.Response(answer.status_code, content=answer.content,
                              headers={k: v for k, v in answer.headers.items() if k != "etag"})

    monkeypatch.setattr(Store, "__call__", without_etags)
    run = Run(S3_TINY, cluster=FakeCluster(secrets=dict(S3_SECRETS)))
    for _ in range(2):
        run.once()
        assert run.condition("Planned")["status"] == "True"
        assert ("GET", "config.json") in _calls(s3_store)


def test_an_s3_source_described_inline_keeps_no_reading(s3_store: Store) -> None:
    arch = {_camel(k): v for k, v in CONFIG.items() if k not in ("architectures", "model_type")}
    run = Run(S3_TINY, cluster=FakeCluster(secrets=dict(S3_SECRETS)))
    run.once()
    assert "source" in run.status
    _calls(s3_store)
    model = {**S3_TINY_MODEL, "architecture": arch | {"weightBytes": 10**9}}
    run.spec = {**S3_TINY, "model": model}
    run.once()
    assert run.condition("Planned")["status"] == "True", run.condition("Planned")
    assert "source" not in run.status and _calls(s3_store) == []


def test_a_missing_s3_secret_says_which(s3_store: Store) -> None:
    run = Run(S3_TINY)
    run.once()
    planned = run.condition("Planned")
    assert planned["reason"] == "ModelUnresolved"
    assert "Secret 's3-keys' (key 'AWS_ACCESS_KEY_ID') for the S3 access key id was not found" in planned["message"]
    assert not s3_store.requests


def test_an_unreadable_s3_secret_says_what_to_grant(s3_store: Store) -> None:
    forbidden = ApiException(status=403, reason="Forbidden")
    run = Run(S3_TINY, cluster=FakeCluster(secrets={("ns", "s3-keys", "AWS_ACCESS_KEY_ID"): forbidden}))
    run.once()
    planned = run.condition("Planned")
    assert planned["reason"] == "SecretUnreadable" and "rbac.readSecrets=true" in planned["message"]


def test_the_s3_secret_goes_through_the_access_review() -> None:
    assert referenced_secrets(LLMDeploymentSpec.model_validate(S3_TINY)) == ["s3-keys"]


@pytest.mark.parametrize("example", ["qwen3-8b-cached.yaml", "tiny-llama-s3.yaml", "qwen3-8b-airgapped-pvc.yaml"])
def test_the_source_and_cache_examples_are_admitted(example: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the operator the examples are written for (`make dev`, hack/localcluster/s3.py) names its store's address
    monkeypatch.setenv("LLM_AUTOPILOT_EGRESS_ALLOW", "10.214.0.1")
    obj = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / example).read_text())
    verdict = review(obj["spec"], V, name=obj["metadata"]["name"])
    assert verdict.allowed, verdict.message
