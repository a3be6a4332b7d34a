"""The model cache's figures on the local cluster's real parts (issue #14, item 6). `make bench-cache`.

The tiny model (tests/e2e/model_store.py) in the cluster's SeaweedFS, the real CPU vLLM on the vllm-cpu pool,
an operator of its own in a namespace of its own. Prints, asserts nothing:

1. first start, cached: apply -> the cache filled by its Job -> a serving pod (s3:// source);
2. cached start: the serving pod deleted -> its replacement serves (the cache is already filled);
3. a remediation step (KV capacity -> a lower max_model_len) with the cache: failure -> serving;
4. the same step without the cache (hf:// from the local Hub-shaped server, the pod downloads the model);

(``python -m tests.bench.bench_cache hub-step`` measures only the parts named) and for each, the bytes
downloaded: GETs in SeaweedFS's own access log (object sizes, for the objects GET with a
200) and downloads in the local Hub's log. The tiny model is 0.87 MB, so these times are vLLM's start on a
busy 2-core machine, not a download; the bytes are what scales with the model.
"""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from hack.localcluster import kubelet

from tests.e2e.conftest import CRD, Kubectl, _cluster_env, wait_for
from tests.e2e.model_store import MODEL, PREFIX, Store, model_files
from tests.e2e.real_vllm import (
    MIB,
    START_SECONDS,
    arg,
    complete,
    hub_downloads,
    operator_for,
    ready_pods,
    seconds_since,
    tiny,
    wait_steps,
)

ROWS: list[tuple[str, str, str, str]] = []
#: what to measure (arguments; default all): starts, cached-step, hub-step
PARTS = set(sys.argv[1:]) or {"starts", "cached-step", "hub-step"}


def row(step: str, seconds: float, store_bytes: int, hub_bytes: int) -> None:
    ROWS.append((step, f"{seconds:.0f}", str(store_bytes), str(hub_bytes)))
    print(f"  {step}: {seconds:.0f} s, {store_bytes} bytes from the S3 store, {hub_bytes} bytes from the Hub",
          file=sys.stderr, flush=True)


class Bench:
    def __init__(self, k: Kubectl, namespace: str, store: Store, files: dict[str, bytes]) -> None:
        self.k, self.namespace, self.store, self.files = k, namespace, store, files

    def apply(self, obj: dict[str, Any]) -> None:
        self.k("apply", "-n", self.namespace, "-f", "-", input=yaml.safe_dump(obj))

    def delete(self, name: str) -> None:
        self.k("delete", "llmd", name, "-n", self.namespace, "--wait=true", "--timeout=90s")
        wait_for(f"the pods of {name} to go", lambda: not self.k.json(
            "pods", "-n", self.namespace, "-l", f"app.kubernetes.io/instance={name}")["items"], timeout=120)

    def cached(self, name: str, **fields: Any) -> dict[str, Any]:
        model = {"name": MODEL, "source": f"s3://{self.store.bucket}/{PREFIX}", "cache": {"enabled": True},
                 "s3": {"endpoint": self.store.endpoint, "credentialsSecretRef": {"name": "s3-models"}}}
        return tiny(name, model=model, **fields)

    def serving(self, name: str, where: Callable[[dict[str, Any]], bool] = lambda p: True,
                not_named: str = "") -> dict[str, Any]:
        pod: dict[str, Any] = wait_for(f"a serving pod of {name}", lambda: next(
            (p for p in ready_pods(self.k, self.namespace, name)
             if where(p) and p["metadata"]["name"] != not_named), None), timeout=2 * START_SECONDS, interval=1)
        complete(pod)
        return pod

    def store_bytes(self, since: float) -> int:
        """Bytes of the weights' objects GET from the store since ``since`` (config.json reads are the plan's)."""
        gets = self.store.object_gets(since, PREFIX)
        return sum(len(self.files[name]) * count for name, count in gets.items() if name != "config.json")

    def hub_bytes(self, since: float) -> int:
        return sum(int(d["bytes"]) for d in hub_downloads(self.k, since))

    def set_kv_room(self, value: int | None) -> None:
        annotation = f"{kubelet.KV_BYTES_ANNOTATION}={value}" if value else f"{kubelet.KV_BYTES_ANNOTATION}-"
        for node in kubelet.node_names():
            self.k("annotate", "node", node, annotation, "--overwrite")

    def starts(self) -> None:
        since = time.time()
        self.apply(self.cached("first"))
        pod = self.serving("first")
        row("first start, s3:// with the cache (fill + vLLM start)", time.time() - since, self.store_bytes(since),
            self.hub_bytes(since))
        since = time.time()
        old = pod["metadata"]["name"]
        self.k("delete", "pod", old, "-n", self.namespace, "--wait=false")
        self.serving("first", not_named=old)
        row("cached start (pod replaced, cache filled)", time.time() - since, self.store_bytes(since),
            self.hub_bytes(since))
        self.delete("first")

    def step(self, label: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        self.apply(obj)
        step = wait_steps(self.k, self.namespace, name, 1, 2 * START_SECONDS)[0]
        failed_at = time.time() - seconds_since(step["evidence"]["finishedAt"])
        self.serving(name, where=lambda p: arg(p, "--max-model-len") != "16384")
        row(f"remediation step ({step['action']}), {label}: failure -> serving", time.time() - failed_at,
            self.store_bytes(failed_at), self.hub_bytes(failed_at))
        self.delete(name)


def main() -> None:
    env = _cluster_env()
    k = Kubectl(env)
    k("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    namespace = f"bench-cache-{uuid.uuid4().hex[:6]}"
    store = Store(env, bucket=f"bench-cache-{uuid.uuid4().hex[:8]}").create()
    files = model_files()
    k("create", "namespace", namespace)
    bench = Bench(k, namespace, store, files)
    try:
        store.put_model(PREFIX, files)
        k("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(store.secret_manifest()))
        print(f"{MODEL}: {sum(map(len, files.values()))} bytes in {len(files)} files", file=sys.stderr)
        with operator_for(k, namespace, Path(tempfile.mkdtemp(prefix="bench-cache-"))):
            if "starts" in PARTS:
                bench.starts()
            bench.set_kv_room(4 * MIB)
            try:
                kv = {"serving": {"maxModelLen": 16384, "minMaxModelLen": 2048}}
                if "cached-step" in PARTS:
                    bench.step("with the cache", bench.cached("kv-cached", **kv))
                if "hub-step" in PARTS:
                    bench.step("without the cache (hf://, the pod downloads)", tiny("kv-hub", **kv))
            finally:
                bench.set_kv_room(None)
    finally:
        k("delete", "llmd", "--all", "-n", namespace, "--wait=false", check=False)
        k("delete", "namespace", namespace, "--wait=true", "--timeout=180s", check=False)
        store.remove()
    width = max(len(r[0]) for r in ROWS)
    print(f"{'step':<{width}}  {'seconds':>7}  {'S3 bytes':>9}  {'Hub bytes':>9}")
    for step, seconds, s3_bytes, hub in ROWS:
        print(f"{step:<{width}}  {seconds:>7}  {s3_bytes:>9}  {hub:>9}")


if __name__ == "__main__":
    main()
