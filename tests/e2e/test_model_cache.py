"""The operator's model cache end to end on the local cluster's real parts (issue #14, items 5 a, b, c, e).

The tiny model is PUT into the cluster's SeaweedFS; an LLMDeployment with an ``s3://`` source and
``spec.model.cache`` gets a PVC from the local-path provisioner (its own ext4 loop volume), a download Job that
runs ``llm-autopilot fetch`` as a real process on the vllm-cpu pool, and real CPU vLLM pods that mount the PVC
read-only. Every count comes from the store's own access log or the local Hub's log.

One namespace, one store and one operator for the module (vLLM starts are what costs: a few per module):

- bad input: a missing Secret, a Secret without its key, keys the store refuses, a bucket that does not exist,
  a corrupted partial file (an MD5 mismatch), a full volume (a real ENOSPC) -> a condition that says so, nothing
  half-applied, no vLLM pod on a partial cache;
- (a) the cache filled once, two replicas serving from it, each file GET once;
- (b) a KV-capacity step on the cached model: 0 bytes from the store and the Hub;
- (c) a KV-saturation step on a serving deployment with a free node: a surge rollout, a client loop throughout.

The bad-input cases check the cache's Job and volume (plumbing): their deployments name the vLLM stand-in
(hack/vllm_standin.py; tests/README.md, "Tiers"), which reads the cache as vLLM does and serves in a second, so a
pod serving before the cache is complete would be seen at once. (a), (b) and (c) claim vLLM's start on the cached
model, its KV figures and its saturation: the real CPU build (``real_vllm``).
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_autopilot.render.cache import shared_folder
from tests.e2e.conftest import NAMESPACE_DRAIN_SECONDS, Kubectl, _create_namespace, _delete_namespace, wait_for
from tests.e2e.helpers import pod_manifest, run_pod
from tests.e2e.model_store import MODEL, PREFIX, Store, model_files
from tests.e2e.real_vllm import (
    MIB,
    STAND_IN,
    START_SECONDS,
    ClientLoop,
    FollowingLoad,
    arg,
    complete,
    history,
    hub_downloads,
    kv_room_fixture,  # noqa: F401 - a fixture
    llmd,
    operator_for,
    pods,
    ready_pods,
    real_vllm_fixture,  # noqa: F401 - a fixture
    seconds_since,
    tiny,
    wait_steps,
)

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("real_vllm")]

#: a Job pod on the loaded 2-core machine: start, download (under 1 MB), checks
FILL_SECONDS = 180


def report(scenario: str, **figures: Any) -> None:
    sys.stderr.write(f"\n[model cache] {scenario}: " + "; ".join(f"{k}={v}" for k, v in figures.items()) + "\n")


@dataclass
class Cached:
    kubectl: Kubectl
    namespace: str
    store: Store
    files: dict[str, bytes]
    started: float = field(default_factory=time.time)

    def spec(self, name: str, prefix: str = PREFIX, *, cache: dict[str, Any] | None = None,
             secret: str = "s3-models", bucket: str | None = None, **fields: Any) -> dict[str, Any]:
        model = {"name": MODEL, "source": f"s3://{bucket or self.store.bucket}/{prefix}",
                 "s3": {"endpoint": self.store.endpoint, "credentialsSecretRef": {"name": secret}},
                 "cache": {"enabled": True, **(cache or {})}}
        return tiny(name, model=model, **fields)

    def apply(self, *objects: dict[str, Any]) -> None:
        self.kubectl("apply", "-n", self.namespace, "-f", "-", input=yaml.safe_dump_all(objects))

    def delete(self, name: str) -> None:
        self.kubectl("delete", "llmd", name, "-n", self.namespace, "--wait=true", "--timeout=90s",
                     "--ignore-not-found")
        wait_for(f"the pods of {name} to be gone", lambda: not pods(self.kubectl, self.namespace, name),
                 timeout=NAMESPACE_DRAIN_SECONDS, interval=1)

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        status = llmd(self.kubectl, self.namespace, name).get("status") or {}
        return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})

    def owned(self, kind: str, name: str) -> list[str]:
        """The objects of ``kind`` the operator made for LLMDeployment ``name`` (its instance label)."""
        found = self.kubectl.json(kind, "-n", self.namespace, "-l", f"app.kubernetes.io/instance={name}")
        return [o["metadata"]["name"] for o in found["items"]]

    def caches(self) -> dict[str, dict[str, Any]]:
        """Every cache PVC and Job in the namespace, by kind/name."""
        found = self.kubectl.json("pvc,jobs", "-n", self.namespace)
        return {f"{o['kind']}/{o['metadata']['name']}": o for o in found["items"]}


@pytest.fixture(name="cached", scope="module")
def cached_fixture(kubectl: Kubectl, real_vllm: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cached]:
    """A namespace with the S3 keys in a Secret, the tiny model in a fresh bucket, and an operator of its own."""
    namespace = f"e2e-{uuid.uuid4().hex[:8]}"
    store = Store(kubectl.env).create()
    files = model_files()
    _create_namespace(kubectl, namespace, session_operator=False)
    try:
        store.put_model(PREFIX, files)
        context = Cached(kubectl, namespace, store, files)
        context.apply(store.secret_manifest())
        with operator_for(kubectl, namespace, tmp_path_factory.mktemp("model-cache")):
            yield context
    finally:
        _delete_namespace(kubectl, namespace)
        wait_for(f"the pods of namespace {namespace} to be deleted",
                 lambda: not kubectl("get", "pods", "-n", namespace, "-o", "name", check=False).stdout.strip(),
                 timeout=NAMESPACE_DRAIN_SECONDS)
        store.remove()


@pytest.fixture(autouse=True)
def one_deployment_at_a_time(cached: Cached) -> Iterator[None]:
    """Whatever a test ends with, its LLMDeployments and their pods go (the caches stay: they are shared), so
    the next test finds both vllm-cpu nodes free."""
    yield
    cached.kubectl("delete", "llmd", "--all", "-n", cached.namespace, "--wait=true", "--timeout=90s", check=False)
    wait_for("the vLLM pods to be gone", lambda: not cached.kubectl(
        "get", "pods", "-n", cached.namespace, "-l", "!job-name", "-o", "name").stdout.strip(),
        timeout=NAMESPACE_DRAIN_SECONDS, interval=1)


def nothing_applied(cached: Cached, name: str) -> None:
    assert cached.owned("deployments", name) == [] and pods(cached.kubectl, cached.namespace, name) == []
    assert not [k for k in cached.caches() if "refused" in k or name in k], cached.caches()


# --- (e) bad input: a clear condition, nothing half-applied, no pod on a partial cache ----------------------


def test_a_source_the_operator_cannot_read_is_named_and_nothing_is_applied(cached: Cached) -> None:
    before = set(cached.caches())
    cached.apply(cached.store.secret_manifest("s3-no-secret-key", AWS_SECRET_ACCESS_KEY="unused"),
                 cached.store.secret_manifest("s3-wrong-keys", AWS_SECRET_ACCESS_KEY="not-the-secret-key"))
    cached.kubectl("patch", "secret", "s3-no-secret-key", "-n", cached.namespace, "--type=json",
                   "-p", '[{"op": "remove", "path": "/data/AWS_SECRET_ACCESS_KEY"}]')
    cases = {
        "no-secret": (cached.spec("no-secret", secret="absent", vllm=STAND_IN),
                      ["Secret 'absent'", "not found"]),
        "no-key": (cached.spec("no-key", secret="s3-no-secret-key", vllm=STAND_IN),
                   ["Secret 's3-no-secret-key'", "AWS_SECRET_ACCESS_KEY"]),
        "wrong-keys": (cached.spec("wrong-keys", secret="s3-wrong-keys", vllm=STAND_IN),
                       ["denied", "check the access key id and secret access key"]),
        "no-bucket": (cached.spec("no-bucket", bucket=f"e2e-absent-{uuid.uuid4().hex[:8]}", vllm=STAND_IN),
                      ["does not exist at"]),
    }
    cached.apply(*(manifest for manifest, _ in cases.values()))

    def planned_false(name: str) -> dict[str, Any] | None:
        found = cached.condition(name, "Planned")
        return found if found.get("status") == "False" else None

    for name, (_, words) in cases.items():
        found = wait_for(f"{name}: Planned False", lambda n=name: planned_false(n), timeout=60)  # type: ignore[misc]
        message = found["message"]
        report(f"bad input {name}", reason=found["reason"], message=message[:300])
        assert all(word in message for word in words), (name, found)
        assert "Traceback" not in message
        nothing_applied(cached, name)
    assert set(cached.caches()) == before  # no PVC, no Job for a source that was never read
    for name in cases:
        cached.delete(name)
    cached.kubectl("delete", "secret", "s3-no-secret-key", "s3-wrong-keys", "-n", cached.namespace)


def test_a_full_volume_is_a_real_enospc_named_in_the_condition_and_no_pod_starts(cached: Cached) -> None:
    big = dict(cached.files)
    big["padding.bin"] = b"\0" * (24 * MIB)  # more than the 16Mi volume holds
    cached.store.put_model("full", big)
    cached.apply(cached.spec("full", "full", cache={"size": "16Mi"}, vllm=STAND_IN))

    def says_full() -> dict[str, Any] | None:
        found = cached.condition("full", "ModelCached")
        return found if "the cache volume is full" in found.get("message", "") else None

    found = wait_for("ModelCached to say the volume is full", says_full, timeout=FILL_SECONDS, interval=1)
    report("full volume", reason=found["reason"], message=found["message"][:400])
    assert found["status"] == "False" and "spec.model.cache.size" in found["message"], found
    assert "padding.bin" in found["message"], found
    deployment = cached.kubectl.json("deployment", "full", "-n", cached.namespace)
    assert deployment["spec"]["replicas"] == 0  # held: no vLLM pod on a partial cache
    assert pods(cached.kubectl, cached.namespace, "full") == []
    claim = llmd(cached.kubectl, cached.namespace, "full")["status"]["cache"]["claimName"]
    volume = cached.kubectl.json("pvc", claim, "-n", cached.namespace)["spec"]["volumeName"]
    folder = Path(cached.kubectl.json("pv", volume)["spec"]["hostPath"]["path"]) / "model"
    assert not (folder / ".llm-autopilot-complete").exists()
    cached.delete("full")
    cached.kubectl("delete", "job,pvc", "-l", f"llm-autopilot.io/cache={claim}", "-n", cached.namespace,
                   "--wait=true", "--timeout=90s")


def test_a_corrupted_partial_file_fails_its_md5_check_is_fetched_again_and_only_then_served(cached: Cached) -> None:
    """A partial file left corrupt (a node that died mid-write): the resumed download no longer matches the
    MD5 the store's ETag carries; the file is removed and fetched again; the pods wait for the marker."""
    cached.store.put_model("corrupt", cached.files)
    cached.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "seeded"},
                  "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "64Mi"}}}})
    weights = cached.files["model.safetensors"]
    half = len(weights) // 2
    # the model's own folder in the claim (an existing claim holds one folder per source and revision)
    folder = f"/c/{shared_folder(f's3://{cached.store.bucket}/corrupt', None, cached.store.endpoint)}"
    script = (f"import os; os.makedirs('{folder}', exist_ok=True); "
              f"open('{folder}/model.safetensors.partial', 'wb').write(bytes([7]) * {half}); print('{{}}')")
    pod, _ = run_pod(cached.kubectl, cached.namespace, pod_manifest(
        "seed", script, volumes=[{"name": "c", "persistentVolumeClaim": {"claimName": "seeded"}}],
        mounts=[{"name": "c", "mountPath": "/c"}]))
    assert pod["status"]["phase"] == "Succeeded"
    cached.kubectl("delete", "pod", "seed", "-n", cached.namespace, "--wait=true")
    since = time.time()
    # plumbing (the Job's MD5 check, its retry, the marker that holds the pods): the stand-in, which reads the
    # cache as vLLM does and is Ready within seconds of its start, so a pod serving a partial cache shows at once
    cached.apply(cached.spec("corrupt", "corrupt", cache={"existingClaim": "seeded"}, vllm=STAND_IN))
    served_early: list[str] = []  # a ready pod while the cache is not complete: must never happen

    def cached_now() -> dict[str, Any] | None:
        found = cached.condition("corrupt", "ModelCached")
        if found.get("status") == "True":
            return found
        # a pod ready right after a read that said not complete was serving before the cache was
        if early := ready_pods(cached.kubectl, cached.namespace, "corrupt"):
            served_early.append(f"{early[0]['metadata']['name']} while ModelCached said {found.get('message')!r}")
        return None

    # the retrying Job shows the failed try only until the retry ends (seconds, on a small model): the status
    # that completes keeps it, read from the fetch pod's previous termination
    found = wait_for("the retry to complete the cache", cached_now, timeout=FILL_SECONDS, interval=1)
    report("corrupted partial file", message=found["message"][:400])
    assert not served_early, served_early
    assert "md5 mismatch" in found["message"] and "model.safetensors" in found["message"], found
    assert "completed on a retry" in found["message"], found
    gets = cached.store.object_gets(since, "corrupt")
    assert gets["model.safetensors"] == 2, gets  # the resumed (Range) GET that failed its check, then all of it
    cached.delete("corrupt")  # the cache is the point here, not another vLLM start
    cached.kubectl("delete", "job", "-l", "llm-autopilot.io/cache=seeded", "-n", cached.namespace, "--wait=true")
    cached.kubectl("delete", "pvc", "seeded", "-n", cached.namespace, "--wait=true", "--timeout=90s")


# --- (a) filled once, two replicas serve from it -------------------------------------------------------------


@pytest.mark.real_vllm
def test_the_cache_is_filled_once_and_two_replicas_serve_from_it(cached: Cached) -> None:
    since = time.time()
    cached.apply(cached.spec("cached", replicas=2))

    def complete_cache() -> dict[str, Any] | None:
        status = llmd(cached.kubectl, cached.namespace, "cached").get("status") or {}
        found = status.get("cache") or {}
        assert not ready_pods(cached.kubectl, cached.namespace, "cached") or found.get("state") == "Complete"
        return status if found.get("state") == "Complete" else None

    status = wait_for("the cache to be complete", complete_cache, timeout=FILL_SECONDS, interval=1)
    filled = time.time() - since
    total = sum(len(c) for c in cached.files.values())
    assert status["cache"]["totalBytes"] == total and status["cache"]["percent"] == 100, status["cache"]
    claim = status["cache"]["claimName"]
    # two vLLMs start at once on the same two cores: twice one start's bound
    wait_for("two serving pods", lambda: len(ready_pods(cached.kubectl, cached.namespace, "cached")) == 2,
             timeout=2 * START_SECONDS, interval=2)
    serving = time.time() - since
    replicas = ready_pods(cached.kubectl, cached.namespace, "cached")
    assert len({p["spec"]["nodeName"] for p in replicas}) == 2
    for pod in replicas:
        answer = complete(pod)
        assert answer["choices"][0]["text"] and answer["usage"]["completion_tokens"] == 8, answer
        volume = next(v for v in pod["spec"]["volumes"] if v.get("persistentVolumeClaim"))
        assert volume["persistentVolumeClaim"] == {"claimName": claim, "readOnly": True}
        assert pod["spec"]["containers"][0]["args"][0] == "/model-cache/model"
    job_pods = cached.kubectl.json("pods", "-n", cached.namespace, "-l", f"llm-autopilot.io/cache={claim}")["items"]
    fetchers = {p["status"]["podIP"] for p in job_pods if p["status"].get("podIP")}
    assert len(job_pods) == 1 and fetchers, job_pods
    # the store's own log: every file GET once, by the Job's pod; no GET from a vLLM pod; nothing from the Hub
    gets = wait_for("the store's log to hold the Job's GETs", lambda: cached.store.object_gets(
        since, PREFIX, fetchers) if len(cached.store.object_gets(since, PREFIX, fetchers)) == len(cached.files)
        else None, timeout=30)
    assert gets == dict.fromkeys(cached.files, 1), gets
    # besides the Job, only the operator reads the store: config.json for the plan (HEAD the rest), no weights
    others = {k: n for k, n in cached.store.object_gets(since, PREFIX).items() if n > gets.get(k, 0)}
    assert set(others) <= {"config.json"}, others
    vllm_ips = {p["status"]["podIP"] for p in replicas}
    assert cached.store.object_gets(since, PREFIX, vllm_ips) == {}
    assert hub_downloads(cached.kubectl, since, vllm_ips) == []
    shown = cached.kubectl("get", "llmd", "cached", "-n", cached.namespace, "-o", "wide").stdout
    assert "100" in shown.splitlines()[1].split(), shown
    report("(a) filled once, two replicas", bytes=total, files=len(gets), gets_per_file=sorted(set(gets.values())),
           apply_to_cached_s=round(filled), apply_to_two_serving_s=round(serving))
    cached.delete("cached")


# --- (b) a remediation step on the cached model downloads nothing ---------------------------------------------


@pytest.mark.real_vllm
def test_a_kv_capacity_step_on_the_cached_model_downloads_nothing(cached: Cached, kv_room: Any) -> None:
    kv_room(4 * MIB)  # 8,192 tokens of 512 bytes: vLLM admits at most 8,064
    before = cached.caches()
    assert any(k.startswith("Job/") and o["status"].get("succeeded") for k, o in before.items()), before
    since = time.time()
    cached.apply(cached.spec("kv", serving={"maxModelLen": 16384, "minMaxModelLen": 2048}))
    # measured: on the shared 2-core machine the first start took more than START_SECONDS to reach the KV check
    step = wait_steps(cached.kubectl, cached.namespace, "kv", 1, 2 * START_SECONDS)[0]
    assert step["signal"] == "KVCapacity" and "8064" in step["evidence"]["message"], step
    pod = wait_for("a Ready pod with the step's max_model_len", lambda: next(
        (p for p in ready_pods(cached.kubectl, cached.namespace, "kv") if arg(p, "--max-model-len") == "7936"),
        None), timeout=2 * START_SECONDS, interval=2)
    failure_to_serving = seconds_since(step["evidence"]["finishedAt"])
    answer = complete(pod)
    assert answer["usage"]["completion_tokens"] == 8, answer
    status = llmd(cached.kubectl, cached.namespace, "kv")["status"]
    assert status["cache"]["claimName"] in {k.split("/", 1)[1] for k in before}  # the cache of (a), shared
    assert set(cached.caches()) == set(before)  # no new PVC, no new Job
    weights = {k: n for k, n in cached.store.object_gets(since, PREFIX).items() if k != "config.json"}
    hub = hub_downloads(cached.kubectl, since)
    assert weights == {} and hub == [], (weights, hub)
    report("(b) KV capacity on the cached model", step=step["action"],
           failure_to_serving_s=round(failure_to_serving), store_weight_gets=0, hub_bytes=sum(d["bytes"] for d in hub))
    cached.delete("kv")


# --- (c) a saturation step on a serving deployment with a free node: a surge, and the clients keep answers ----


WINDOW = 30  # kvSaturationWindowSeconds: the schema's least, as in test_real_vllm.py


@pytest.mark.real_vllm
def test_a_saturation_step_surges_and_a_client_loop_keeps_getting_answers(cached: Cached, kv_room: Any) -> None:
    kv_room(4 * MIB)
    # fp8 KV cannot be held by this CPU's vLLM and one replica is the most: the ladder's rung is fewer sequences,
    # a change of vLLM's flags, so a rollout; with the second vllm-cpu node free it surges
    cached.apply(cached.spec("busy", serving={"maxModelLen": 4096, "allowedKVCacheDtypes": ["auto"]},
                             remediation={"kvSaturationWindowSeconds": WINDOW, "maxReplicas": 1,
                                          "stableWindowSeconds": 3600}))
    first = wait_for("a serving pod", lambda: next(iter(ready_pods(cached.kubectl, cached.namespace, "busy")), None),
                     timeout=2 * START_SECONDS, interval=2)
    deployment = cached.kubectl.json("deployment", "busy", "-n", cached.namespace)
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}, deployment
    loop = ClientLoop(cached.kubectl, cached.namespace, "busy", "The cache keeps").start()
    load = FollowingLoad(cached.kubectl, cached.namespace, "busy", clients=24, prompt_tokens=1500, max_tokens=2000)
    since = time.time()
    try:
        step = wait_steps(cached.kubectl, cached.namespace, "busy", 1, WINDOW + 2 * START_SECONDS, load=load)[0]
        assert step["signal"] == "KVSaturation" and step["action"].startswith("max_num_seqs"), step
        at_step = loop.ok, loop.failed
        load.stop()  # two cores: a new vLLM cannot start beside an overloaded one; the client loop goes on
        old = first["metadata"]["name"]

        def rolled() -> bool:
            names = [p["metadata"]["name"] for p in pods(cached.kubectl, cached.namespace, "busy")]
            ready = ready_pods(cached.kubectl, cached.namespace, "busy")
            return old not in names and len(ready) == 1 and arg(ready[0], "--max-num-seqs") != arg(
                first, "--max-num-seqs")

        wait_for("the surge rollout to finish (old pod gone, new pod serving)", rolled, timeout=2 * START_SECONDS,
                 interval=2)
        after = loop.ok
        wait_for("the client loop's answers from the new pod", lambda: loop.ok >= after + 3, timeout=120)
    finally:
        load.stop()
        loop.stop()
    weights = {k: n for k, n in cached.store.object_gets(since, PREFIX).items() if k != "config.json"}
    report("(c) KV saturation with a free node", step=step["action"], answered=loop.ok, failed=loop.failed,
           answered_before_step=at_step[0], failed_before_step=at_step[1], by_pod=loop.by_pod,
           errors=loop.errors[:5], store_weight_gets=sum(weights.values()))
    assert weights == {}, weights
    assert len(loop.by_pod) == 2, loop.by_pod  # answers from the old pod and from the new one
    assert loop.failed == 0, loop.errors
    assert history(cached.kubectl, cached.namespace, "busy")[0]["action"] == step["action"]
    cached.delete("busy")
