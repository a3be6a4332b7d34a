"""LoRA adapters from the model's sources: ``hf://`` (and the bare Hub id), ``pvc://claim/path``, ``s3://bucket/prefix``.

Validation at apply time, where each adapter's adapter_config.json is read (the Hub; an inspect Job on the volume;
the operator's S3 client), and what the pods get: the claim mounted read-only, the s3:// adapter downloaded into the
model cache by its own Job, and the path inside the pod in ``--lora-modules`` and in the runtime loads.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from llm_autopilot.api.inspection import InspectionFailure, ReportError, parse_adapter_report
from llm_autopilot.api.lora import AdapterConfig
from llm_autopilot.api.sources import PVCSource
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec, S3Options
from llm_autopilot.controller import adapters as adapter_reads
from llm_autopilot.controller import cache_step, sources
from llm_autopilot.controller.access import referenced_secrets
from llm_autopilot.controller.admission import review
from llm_autopilot.controller.lora_runtime import ReadyPod
from llm_autopilot.desired import lora_sync
from llm_autopilot.render import inspect, lora_volumes
from llm_autopilot.render.cache import CacheInputs
from llm_autopilot.storage.s3 import S3Client
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION
from tests.unit.fakes import NAMESPACE, FakeCluster, Run
from tests.unit.test_lora_runtime import FakeVLLM, clients, sync
from tests.unit.test_storage import KEY, NOW, Store

V = str(DEFAULT_VLLM_VERSION)
ON_L4 = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4", "maxGPUs": 1},
         "serving": {"maxModelLen": 16384, "allowedKVCacheDtypes": ["auto", "fp8"]}}
CACHED = {**ON_L4, "model": {"name": "Qwen/Qwen3-8B", "cache": {"enabled": True}}}
S3 = {"endpoint": "http://s3.local:8333", "credentialsSecretRef": {"name": "adapter-keys"}}
ADAPTER_CONFIG = {"r": 8, "rank_pattern": {"model.layers.0.mlp.down_proj": 32}, "lora_alpha": 16,
                  "base_model_name_or_path": "Qwen/Qwen3-8B", "peft_type": "LORA",
                  "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"]}


def body(base: dict[str, Any], **lora: object) -> dict[str, Any]:
    return {**base, "lora": lora}


def spec(base: dict[str, Any], **lora: object) -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate(body(base, **lora))


# --- validation at apply time ----------------------------------------------------------------------------


REFUSALS: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "not a source": (ON_L4, {"name": "a", "source": "nfs://server/a"},
                     "'nfs://server/a' is not an adapter source: write org/name or hf://org/name (the Hub), "
                     "pvc://claim/path or s3://bucket/prefix"),
    "not a Hub id either": (ON_L4, {"name": "a", "source": "my adapter"},
                            "'my adapter' is not an adapter source: write org/name or hf://org/name (the Hub), "
                            "pvc://claim/path or s3://bucket/prefix"),
    "not a claim name": (ON_L4, {"name": "a", "source": "pvc://Adapters_X/a"},
                         "'Adapters_X' is not a PersistentVolumeClaim name"),
    "a path that climbs out": (ON_L4, {"name": "a", "source": "pvc://adapters/../other"},
                               "must be a relative path without empty, '.' or '..' segments"),
    "not a bucket": (CACHED, {"name": "a", "source": "s3://B/a"}, "'B' is not an S3 bucket name"),
    "a revision on a claim": (ON_L4, {"name": "a", "source": "pvc://adapters/a", "revision": "main"},
                              "lora adapter a: revision applies to the Hub (hf:// sources), not to pvc://"),
    "s3 without the model cache": (ON_L4, {"name": "a", "source": "s3://adapters/a"},
                                   "lora.adapters[0] (a): an s3:// adapter is downloaded into the model cache's PVC "
                                   "by a Job (vLLM does not load from S3): set model.cache.enabled: true"),
    "s3 beside a pvc:// model": ({**ON_L4, "model": {"name": "Qwen/Qwen3-8B", "source": "pvc://weights/qwen"}},
                                 {"name": "a", "source": "s3://adapters/a"},
                                 "put the adapter on a PersistentVolumeClaim (pvc://claim/path): a pvc:// model has "
                                 "no cache"),
}


@pytest.mark.parametrize(("base", "adapter", "says"), list(REFUSALS.values()), ids=list(REFUSALS))
def test_adapter_source_mistakes_are_refused_at_apply_time(base: dict[str, Any], adapter: dict[str, Any],
                                                           says: str) -> None:
    verdict = review(body(base, maxLoraRank=16, adapters=[adapter]), V)
    assert not verdict.allowed and says in verdict.message, verdict.message


@pytest.mark.parametrize(("lora", "says"), [
    ({"s3": S3, "adapters": [{"name": "a", "source": "pvc://adapters/a"}]},
     "lora.s3 only applies to s3:// adapters, and none is listed: remove it"),
    ({"s3": {"endpoint": "s3.local:8333"}, "adapters": [{"name": "a", "source": "s3://adapters/a"}]},
     "spec.lora.s3.endpoint"),
], ids=["s3 without an s3:// adapter", "an endpoint without a scheme"])
def test_lora_s3_mistakes_are_refused_at_apply_time(lora: dict[str, Any], says: str) -> None:
    verdict = review(body(CACHED, maxLoraRank=16, **lora), V)
    assert not verdict.allowed and says in verdict.message, verdict.message


def test_adapters_on_a_volume_or_in_a_bucket_are_admitted_with_a_warning_the_reconcile_reads_them() -> None:
    adapters = [{"name": "vol", "source": "pvc://adapters/team/vol"},
                {"name": "bucket", "source": "s3://adapters/team/bucket"}]
    verdict = review(body(CACHED, maxLoraRank=16, s3=S3, adapters=adapters), V,
                     adapters=lambda s: adapter_reads.admission_check(s, timeout=1, budget=2))
    assert verdict.allowed, verdict.message
    assert ("lora adapter vol: its adapter_config.json is read from pvc://adapters/team/vol by a short inspect Job "
            "when the operator reconciles it, and checked then") in verdict.warnings
    assert ("lora adapter bucket: its adapter_config.json is read from s3://adapters/team/bucket when the operator "
            "reconciles it, and checked then") in verdict.warnings


def test_an_s3_adapters_secret_goes_through_the_access_review() -> None:
    s = spec(CACHED, s3=S3, adapters=[{"name": "a", "source": "s3://adapters/a"}, {"name": "b", "source": "org/b"}])
    assert referenced_secrets(s) == ["adapter-keys"]


# --- where the pods find them ----------------------------------------------------------------------------


MIXED = [{"name": "hub", "source": "org/hub"},
         {"name": "vol", "source": "pvc://adapters/team/vol"},
         {"name": "vol2", "source": "pvc://adapters/team/vol2"},
         {"name": "beside-model", "source": "pvc://weights/adapters/b"},
         {"name": "other", "source": "pvc://more.adapters"}]
PVC_MODEL = {**ON_L4, "model": {"name": "Qwen/Qwen3-8B", "source": "pvc://weights/qwen"}}


def test_a_claim_is_mounted_once_read_only_and_each_adapter_loaded_from_its_folder() -> None:
    s = spec(PVC_MODEL, adapters=MIXED)
    assert lora_volumes.modules(s, frozenset()) == (
        ("hub", "org/hub"), ("vol", "/lora-adapters/adapters/team/vol"), ("vol2", "/lora-adapters/adapters/team/vol2"),
        ("beside-model", "/models/adapters/b"),  # the model's own claim and mount
        ("other", "/lora-adapters/more.adapters"))  # the claim's root
    assert lora_volumes.claims(s) == ["adapters", "more.adapters"]
    names = [lora_volumes.volume_name(c) for c in ("adapters", "more.adapters")]
    assert lora_volumes.volumes(s) == [
        {"name": names[0], "persistentVolumeClaim": {"claimName": "adapters", "readOnly": True}},
        {"name": names[1], "persistentVolumeClaim": {"claimName": "more.adapters", "readOnly": True}}]
    assert lora_volumes.mounts(s) == [{"name": names[0], "mountPath": "/lora-adapters/adapters", "readOnly": True},
                                      {"name": names[1], "mountPath": "/lora-adapters/more.adapters", "readOnly": True}]


def test_the_pods_mount_the_claims_and_name_the_mounted_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("vol", "vol2", "beside-model", "other"):
        monkeypatch.setitem(PLANNED_CONFIGS, name, AdapterConfig(16, "Qwen/Qwen3-8B"))
    run = inspected_run(body(PVC_MODEL, maxLoraRank=16, adapters=[a for a in MIXED if a["name"] != "hub"]))
    assert run.condition("Planned")["status"] == "True", run.condition("Planned")
    pod = run.cluster.deployment()["spec"]["template"]["spec"]
    vllm = pod["containers"][0]
    modules = vllm["args"][vllm["args"].index("--lora-modules") + 1:][:4]
    assert modules == ["vol=/lora-adapters/adapters/team/vol", "vol2=/lora-adapters/adapters/team/vol2",
                       "beside-model=/models/adapters/b", "other=/lora-adapters/more.adapters"]
    claims = {v["persistentVolumeClaim"]["claimName"]: v["persistentVolumeClaim"]["readOnly"]
              for v in pod["volumes"] if "persistentVolumeClaim" in v}
    assert claims == {"weights": True, "adapters": True, "more.adapters": True}
    assert {m["mountPath"]: m["readOnly"] for m in vllm["volumeMounts"] if m["name"].startswith(("lora", "model"))} \
        == {"/models": True, "/lora-adapters/adapters": True, "/lora-adapters/more.adapters": True}


def test_runtime_loads_give_vllm_the_path_in_the_pod() -> None:
    s = spec(CACHED, maxLoras=2, maxLoraRank=16, runtimeUpdates=True, s3=S3,
             adapters=[{"name": "vol", "source": "pvc://adapters/vol"},
                       {"name": "bucket", "source": "s3://adapters/team/bucket"}])
    folder = lora_volumes.cache_folder(s, s.lora.adapters[1])  # type: ignore[union-attr]
    assert folder.startswith("lora/adapters-team-bucket-") and len(folder) == len("lora/adapters-team-bucket-") + 10
    want = lora_sync.wanted(s)
    assert want == (lora_sync.Served("vol", "/lora-adapters/adapters/vol"),
                    lora_sync.Served("bucket", f"/model-cache/{folder}"))
    vllm = FakeVLLM(exists={w.path for w in want})  # vLLM finds the folders at these paths in the pod
    views, _, _ = sync(lora_sync.Updates(True, "on"), list(want), [ReadyPod("p-0", "10.0.0.1", "u-0")],
                       clients({"10.0.0.1": vllm}))
    assert [(c["lora_name"], c["lora_path"]) for _, c in vllm.calls] == [
        ("vol", "/lora-adapters/adapters/vol"), ("bucket", f"/model-cache/{folder}")]
    status = lora_sync.lora_status(lora_sync.Updates(True, "on"), want, views, sources=lora_sync.sources(s))
    assert [(a.name, a.source, a.path, a.pods) for a in status.adapters] == [
        ("vol", "pvc://adapters/vol", "/lora-adapters/adapters/vol", ("p-0",)),
        ("bucket", "s3://adapters/team/bucket", f"/model-cache/{folder}", ("p-0",))]


def test_an_s3_adapter_still_downloading_is_not_loaded_and_the_status_says_so() -> None:
    s = spec(CACHED, maxLoras=2, maxLoraRank=16, runtimeUpdates=True, s3=S3,
             adapters=[{"name": "hub", "source": "org/hub"}, {"name": "bucket", "source": "s3://adapters/bucket"}])
    waiting = {"bucket": "downloading into PVC c (Job j, Downloading); served once complete"}
    want = lora_sync.wanted(s, tuple(waiting))
    assert want == (lora_sync.Served("hub", "org/hub"),)
    status = lora_sync.lora_status(lora_sync.Updates(True, "on"), want, [lora_sync.PodView("p-0", want)],
                                   sources=lora_sync.sources(s), waiting=waiting)
    bucket = status.adapters[1]
    assert (bucket.name, bucket.source, bucket.path, bucket.pending, bucket.message) == (
        "bucket", "s3://adapters/bucket", "", ("p-0",), waiting["bucket"])
    assert not lora_sync.settled(status)  # the next resync looks again
    assert lora_volumes.modules(s, frozenset()) == (("hub", "org/hub"),)  # nor in --lora-modules (rollout)
    assert lora_volumes.modules(s, frozenset({"bucket"}))[1][1].startswith("/model-cache/lora/")


def test_an_s3_adapter_is_downloaded_into_the_model_cache_by_its_own_job() -> None:
    s = spec(CACHED, maxLoraRank=16, s3=S3, adapters=[{"name": "bucket", "source": "s3://adapters/team/bucket"}])
    inputs = CacheInputs(s, NAMESPACE, "llm-autopilot:test", 16 * 2**30)
    [(adapter, job)] = lora_volumes.download_jobs(inputs)
    folder = lora_volumes.cache_folder(s, adapter)
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["fetch", "--source", "s3://adapters/team/bucket", "--dest", f"/model-cache/{folder}",
                                 "--s3-endpoint", "http://s3.local:8333", "--s3-region", "us-east-1"]
    assert container["command"] == ["llm-autopilot"] and container["image"] == "llm-autopilot:test"
    assert {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]} == {
        "AWS_ACCESS_KEY_ID": {"name": "adapter-keys", "key": "AWS_ACCESS_KEY_ID"},
        "AWS_SECRET_ACCESS_KEY": {"name": "adapter-keys", "key": "AWS_SECRET_ACCESS_KEY"}}
    assert job["spec"]["template"]["spec"]["volumes"] == [
        {"name": "model-cache", "persistentVolumeClaim": {"claimName": inputs.claim}}]
    assert len(job["metadata"]["name"]) <= 63 and job["metadata"]["labels"]["llm-autopilot.io/cache"] == inputs.claim

    cluster = FakeCluster()
    objects, status = cache_step.observe(cluster, inputs)
    assert [o["kind"] for o in objects] == ["PersistentVolumeClaim", "Job", "Job"]
    assert [(a.name, a.state) for a in status.adapters or []] == [("bucket", "Pending")]
    for o in objects:
        cluster.objects[(o["kind"], o["metadata"]["name"])] = o
    name = job["metadata"]["name"]
    cluster.objects[("Job", name)]["status"] = {"failed": 6, "conditions": [{"type": "Failed", "status": "True"}]}
    cluster.job_pod_list[name] = [{"metadata": {"name": "p", "creationTimestamp": "2026-12-01T00:00:00Z"},
                                   "status": {"containerStatuses": [{"name": "fetch", "state": {"terminated": {
                                       "message": "error: s3://adapters/team/bucket holds no objects"}}}]}}]
    objects, status = cache_step.observe(cluster, inputs)
    assert objects == [] and [(a.state, a.message) for a in status.adapters or []] == [
        ("Failed", "error: s3://adapters/team/bucket holds no objects")]
    cluster.objects[("Job", name)]["status"] = {"succeeded": 1}
    _, status = cache_step.observe(cluster, inputs)
    assert [(a.state, a.folder) for a in status.adapters or []] == [("Complete", folder)]


# --- reading adapter_config.json: the Hub as before, S3 through the operator's client -------------------


@pytest.fixture
def adapter_store(monkeypatch: pytest.MonkeyPatch) -> Store:
    """sources.s3_client against an in-memory bucket that checks each request's signature."""
    store = Store({"team/bucket/adapter_config.json": json.dumps(ADAPTER_CONFIG).encode(),
                   "team/bucket/adapter_model.safetensors": b"\0" * 64,
                   "team/garbled/adapter_config.json": b"{not json"}, bucket="adapters")

    def client(options: S3Options | None, secret: sources.SecretReader, *, timeout: float,
               field: str = "spec.model.s3") -> S3Client:
        assert options is not None and options.endpoint == "http://s3.local:8333"
        return S3Client(options.endpoint, options.region, sources.s3_credentials(options, secret),
                        transport=httpx.MockTransport(store), clock=lambda: NOW, field=field)

    monkeypatch.setattr(sources, "s3_client", client)
    return store


SECRETS = {(NAMESPACE, "adapter-keys", "AWS_ACCESS_KEY_ID"): KEY.access_key_id,
           (NAMESPACE, "adapter-keys", "AWS_SECRET_ACCESS_KEY"): KEY.secret_access_key}


def read(s: LLMDeploymentSpec, secrets: dict[tuple[str, str, str], str]) -> adapter_reads.AdapterReading:
    def secret(name: str, key: str, what: str) -> str:
        if (NAMESPACE, name, key) not in secrets:
            raise RuntimeError(f"Secret {name!r} (key {key!r}) for {what} was not found in namespace {NAMESPACE}")
        return secrets[(NAMESPACE, name, key)]

    return adapter_reads.read_adapter_configs(s, lambda: None, timeout=2, secret=secret)


def test_an_s3_adapters_config_is_read_with_its_own_keys(adapter_store: Store) -> None:
    s = spec(CACHED, s3=S3, adapters=[{"name": "bucket", "source": "s3://adapters/team/bucket"}])
    reading = read(s, SECRETS)
    assert reading.configs == {"bucket": AdapterConfig(32, "Qwen/Qwen3-8B")} and not reading.errors
    assert [(r.method, r.url.path) for r in adapter_store.requests] == [
        ("HEAD", "/adapters/team/bucket/adapter_config.json"), ("GET", "/adapters/team/bucket/adapter_config.json")]


@pytest.mark.parametrize(("source", "secrets", "says"), [
    ("s3://adapters/team/missing", SECRETS,
     "lora adapter a: s3://adapters/team/missing has no adapter_config.json (looked for "
     "s3://adapters/team/missing/adapter_config.json): the prefix must be the adapter's folder"),
    ("s3://adapters/team/garbled", SECRETS, "s3://adapters/team/garbled/adapter_config.json is not valid JSON"),
    ("s3://other-bucket/a", SECRETS, "bucket 'other-bucket' does not exist at http://s3.local:8333"),
    ("s3://adapters/team/bucket", {**SECRETS, (NAMESPACE, "adapter-keys", "AWS_SECRET_ACCESS_KEY"): "wrong"},
     "access to s3://adapters/team/bucket/adapter_config.json was denied (403): check the access key id and secret "
     "access key in spec.lora.s3.credentialsSecretRef"),
    ("s3://adapters/team/bucket", {}, "Secret 'adapter-keys' (key 'AWS_ACCESS_KEY_ID') for the S3 access key id was "
                                      "not found"),
], ids=["no config", "garbled", "no bucket", "wrong keys", "no Secret"])
def test_an_unreadable_s3_adapter_says_what_to_fix(adapter_store: Store, source: str,
                                                   secrets: dict[tuple[str, str, str], str], says: str) -> None:
    reading = read(spec(CACHED, s3=S3, adapters=[{"name": "a", "source": source}]), secrets)
    assert not reading.configs and len(reading.errors) == 1 and says in reading.errors[0], reading.errors


def test_an_s3_adapters_rank_decides_the_slots_and_a_higher_rank_is_refused(adapter_store: Store) -> None:
    adapters = [{"name": "bucket", "source": "s3://adapters/team/bucket"}]
    run = Run(body(CACHED, s3=S3, adapters=adapters), cluster=FakeCluster(secrets=dict(SECRETS)))
    run.once()
    assert run.condition("Planned")["status"] == "True", run.condition("Planned")
    assert run.cluster.deployment()["spec"]["template"]["spec"]["containers"][0]["args"].count("32") >= 1
    vllm = run.cluster.deployment()["spec"]["template"]["spec"]["containers"][0]["args"]
    assert vllm[vllm.index("--max-lora-rank") + 1] == "32"  # rank_pattern's largest, read from the bucket
    assert "--lora-modules" not in vllm  # still downloading: not loaded before its Job completed
    refused = Run(body(CACHED, maxLoraRank=16, s3=S3, adapters=adapters), cluster=FakeCluster(secrets=dict(SECRETS)))
    refused.once()
    planned = refused.condition("Planned")
    assert planned["reason"] == "LoRAAdapterRefused" and "rank 32 exceeds maxLoraRank 16" in planned["message"]


# --- reading adapter_config.json on a volume: the inspect Job ------------------------------------------


def run_script(folder: Path, tmp_path: Path) -> tuple[int, str]:
    """The adapter's inspect container as the Job runs it (POSIX sh), on a folder here; (exit code, message)."""
    log = tmp_path / "termination-log"
    done = subprocess.run(["/bin/sh", "-c", inspect.ADAPTER_SCRIPT, "inspect-adapter", str(folder)],
                          env={"PATH": os.environ["PATH"], "TERMINATION_LOG": str(log)}, capture_output=True,
                          text=True, timeout=30, check=False)
    return done.returncode, log.read_text() if log.exists() else ""


def adapter_folder(tmp_path: Path, config: dict[str, Any] | str | None = None, weights: bool = True) -> Path:
    folder = tmp_path / "team" / "vol"
    folder.mkdir(parents=True)
    if config is not None:
        text = config if isinstance(config, str) else json.dumps(config, indent=2)
        (folder / "adapter_config.json").write_text(text)
    if weights:
        (folder / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    return folder


def test_the_inspect_script_hands_back_the_config_and_the_operator_reads_rank_and_base(tmp_path: Path) -> None:
    code, message = run_script(adapter_folder(tmp_path, ADAPTER_CONFIG), tmp_path)
    assert code == 0 and "\n" not in message and json.loads(message) == ADAPTER_CONFIG
    assert parse_adapter_report(message) == AdapterConfig(32, "Qwen/Qwen3-8B")


@pytest.mark.parametrize(("make", "says"), [
    (lambda t: t / "nowhere", "does not exist on the volume"),
    (adapter_folder, "no adapter_config.json in"),
    (lambda t: adapter_folder(t, ADAPTER_CONFIG, weights=False), "no adapter_model.safetensors (or adapter_model.bin)"),
    (lambda t: adapter_folder(t, {**ADAPTER_CONFIG, "rank_pattern": {f"layer.{i}": 8 for i in range(400)}}),
     "more than the 4096 bytes a termination message holds"),
], ids=["no folder", "no config", "no weights", "too large"])
def test_the_inspect_script_says_what_is_wrong_with_the_folder(tmp_path: Path, make: Any, says: str) -> None:
    code, message = run_script(make(tmp_path), tmp_path)
    report = parse_adapter_report(message)
    assert code == 2 and isinstance(report, InspectionFailure) and says in report.error, message


@pytest.mark.parametrize(("message", "says"), [
    ("", "left no termination message"),
    ("{not json", "is not an adapter_config.json"),
    ("[1, 2]", "is not a JSON object"),
    ("x" * 5000, "longer than 4096 bytes"),
])
def test_a_garbled_adapter_report_is_one_line(message: str, says: str) -> None:
    with pytest.raises(ReportError, match=says.replace("(", r"\(")):
        parse_adapter_report(message)


CLAIM = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
         "metadata": {"name": "adapters", "namespace": NAMESPACE, "uid": "claim-uid-1"}}
PVC_ADAPTER = body(ON_L4, adapters=[{"name": "vol", "source": "pvc://adapters/team/vol"}])
#: what inspected_run's Jobs hand back per adapter
PLANNED_CONFIGS: dict[str, AdapterConfig] = {}


def jobs(run: Run) -> dict[str, dict[str, Any]]:
    return {name: o for (kind, name), o in run.cluster.objects.items() if kind == "Job"}


def finish(run: Run, name: str, message: str, *, ok: bool = True) -> None:
    job = run.cluster.objects[("Job", name)]
    job["status"] = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]} if ok else {
        "failed": 1, "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}
    run.cluster.job_pod_list[name] = [{"metadata": {"name": f"{name}-x", "creationTimestamp": "2026-12-01T00:00:00Z"},
                                       "status": {"containerStatuses": [{"name": "inspect", "state": {"terminated": {
                                           "exitCode": 0 if ok else 2, "message": message}}}]}}]


def inspected_run(spec_body: dict[str, Any]) -> Run:
    """A reconcile whose pvc:// adapters' Jobs handed back PLANNED_CONFIGS (the claims exist)."""
    claims = {PVCSource(*a["source"].removeprefix("pvc://").partition("/")[::2]).claim
              for a in spec_body["lora"]["adapters"]}
    objects = {("PersistentVolumeClaim", c): {**CLAIM, "metadata": {**CLAIM["metadata"], "name": c, "uid": f"uid-{c}"}}
               for c in claims | {"weights"}}
    run = Run(spec_body, cluster=FakeCluster(objects=objects))
    run.once()
    for name, job in jobs(run).items():
        adapter = job["metadata"]["annotations"][inspect.ADAPTER_LABEL]
        config = PLANNED_CONFIGS[adapter]
        finish(run, name, json.dumps({"r": config.rank, "base_model_name_or_path": config.base_model}))
    run.once()
    return run


def test_a_pvc_adapter_is_read_by_an_inspect_job_before_anything_is_deployed() -> None:
    run = Run(PVC_ADAPTER, cluster=FakeCluster(objects={("PersistentVolumeClaim", "adapters"): dict(CLAIM)}))
    out = run.once()
    planned = run.condition("Planned")
    assert planned["reason"] == "InspectingSource" and out.retry, planned
    assert ("spec.lora.adapters[0] (vol): reading adapter_config.json from pvc://adapters/team/vol (claim "
            "'adapters', path '/model/team/vol')") in planned["message"]
    [(name, job)] = jobs(run).items()
    assert name.startswith("x-lora-inspect-") and len(name) <= 63
    pod = job["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "model", "persistentVolumeClaim": {"claimName": "adapters", "readOnly": True}}]
    assert pod["containers"][0]["command"][:2] == ["/bin/sh", "-c"]
    assert pod["containers"][0]["args"] == ["/model/team/vol"]
    assert pod["automountServiceAccountToken"] is False and pod["securityContext"]["runAsUser"] == 65534
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid" and job["spec"]["backoffLimit"] == 0
    assert {k for k, _ in run.cluster.objects} == {"PersistentVolumeClaim", "Job"}  # nothing deployed
    assert run.status["loraSources"] == [{"name": "vol", "uri": "pvc://adapters/team/vol", "claimUID": "claim-uid-1",
                                          "state": "Inspecting", "jobName": name, "message": ""}]

    finish(run, name, json.dumps(ADAPTER_CONFIG))
    run.once()
    assert run.condition("Planned")["status"] == "True", run.condition("Planned")
    args = run.cluster.deployment()["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-lora-rank") + 1] == "32"  # the default follows the rank read on the volume
    assert "vol=/lora-adapters/adapters/team/vol" in args
    assert run.status["loraSources"][0] | {"jobName": ""} == {
        "name": "vol", "uri": "pvc://adapters/team/vol", "claimUID": "claim-uid-1", "state": "Inspected",
        "jobName": "", "rank": 32, "baseModel": "Qwen/Qwen3-8B", "message": ""}

    # kept: the next reconciles read neither the Job nor its pod (the TTL controller deletes the Job)
    del run.cluster.objects[("Job", name)]
    run.cluster.job_pod_list.clear()
    run.once()
    assert run.condition("Planned")["status"] == "True" and not jobs(run)


def test_a_pvc_adapter_of_another_model_or_a_higher_rank_is_refused_with_the_fix() -> None:
    run = Run(body(ON_L4, maxLoraRank=16, adapters=[{"name": "vol", "source": "pvc://adapters/team/vol"}]),
              cluster=FakeCluster(objects={("PersistentVolumeClaim", "adapters"): dict(CLAIM)}))
    run.once()
    [name] = jobs(run)
    finish(run, name, json.dumps({**ADAPTER_CONFIG, "base_model_name_or_path": "meta-llama/Llama-3.1-8B"}))
    run.once()
    planned = run.condition("Planned")
    assert planned["reason"] == "LoRAAdapterRefused", planned
    assert "spec.lora.adapters[0] (vol): rank 32 exceeds maxLoraRank 16" in planned["message"]
    assert "trained on meta-llama/Llama-3.1-8B, not Qwen/Qwen3-8B" in planned["message"]
    assert "Deployment" not in {k for k, _ in run.cluster.objects}


def test_a_missing_claim_names_the_adapter_and_the_namespace() -> None:
    run = Run(PVC_ADAPTER)
    out = run.once()
    planned = run.condition("Planned")
    assert planned["reason"] == "SourceNotFound" and out.retry
    assert planned["message"].startswith(
        "spec.lora.adapters[0] (vol): PersistentVolumeClaim 'adapters' of pvc://adapters/team/vol does not exist in "
        "namespace ns (the pods mount claims of their own namespace only): create it there")
    assert run.cluster.objects == {}


@pytest.mark.parametrize(("message", "ok", "says"), [
    ("error: /model/team/vol does not exist on the volume (or is not a folder)", False, "does not exist on the volume"),
    ("{garbled", True, "is not an adapter_config.json"),
    ("", False, "left no termination message"),
])
def test_a_failed_inspection_names_adapter_claim_and_path_and_applies_nothing(message: str, ok: bool,
                                                                             says: str) -> None:
    run = Run(PVC_ADAPTER, cluster=FakeCluster(objects={("PersistentVolumeClaim", "adapters"): dict(CLAIM)}))
    run.once()
    [name] = jobs(run)
    finish(run, name, message, ok=ok)
    out = run.once()
    planned = run.condition("Planned")
    assert planned["reason"] == "SourceUnreadable" and out.retry, planned
    assert "spec.lora.adapters[0] (vol): " in planned["message"] and says in planned["message"]
    assert "(claim 'adapters', path '/model/team/vol')" in planned["message"]
    assert f"kubectl delete job {name}" in planned["message"]
    assert run.status["loraSources"][0]["state"] == "Failed"
    assert {k for k, _ in run.cluster.objects} == {"PersistentVolumeClaim", "Job"}
