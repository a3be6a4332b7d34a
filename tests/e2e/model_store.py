"""The tiny model in the local cluster's real S3 store (SeaweedFS) and what its own access log says about it.

Shared by the model-cache end-to-end tests (tests/e2e/test_model_cache.py) and ``make bench-cache``
(tests/bench/bench_cache.py). Requests are SigV4-signed with the cluster's keys (``cluster.py env``); counts come
from SeaweedFS's access log (``LLM_AUTOPILOT_S3_ACCESS_LOG``), never from the client's own bookkeeping.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hack.localcluster import vllm_cpu

from tests.e2e.helpers import s3_request

MODEL = "llm-autopilot/tiny-llama-gqa"
PREFIX = "tiny-llama-gqa"


def model_files(model: str = MODEL) -> dict[str, bytes]:
    """The files of a tiny model's snapshot (made by ``vllm_cpu.make_models``), by name."""
    found = next((m for m in vllm_cpu.make_models() if m["id"] == model), None)
    assert found is not None, f"{model} is not one of the tiny models"
    return {p.name: p.read_bytes() for p in sorted(Path(found["snapshot"]).iterdir()) if p.is_file()}


@dataclass
class Store:
    env: dict[str, str]
    bucket: str = field(default_factory=lambda: f"e2e-cache-{uuid.uuid4().hex[:8]}")
    keys: list[str] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return self.env["LLM_AUTOPILOT_S3_ENDPOINT"]

    @property
    def access_key(self) -> str:
        return self.env["LLM_AUTOPILOT_S3_ACCESS_KEY"]

    @property
    def secret_key(self) -> str:
        return self.env["LLM_AUTOPILOT_S3_SECRET_KEY"]

    def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        return s3_request(method, f"{self.endpoint}/{path}", self.access_key, self.secret_key, body)

    def create(self) -> Store:
        status, body = self.request("PUT", self.bucket)
        assert status == 200, (status, body[:300])
        return self

    def put(self, key: str, content: bytes) -> None:
        status, body = self.request("PUT", f"{self.bucket}/{key}", content)
        assert status == 200, (key, status, body[:300])
        self.keys.append(key)

    def put_model(self, prefix: str, files: dict[str, bytes]) -> None:
        for name, content in files.items():
            self.put(f"{prefix}/{name}", content)

    def remove(self) -> None:
        for key in self.keys:
            self.request("DELETE", f"{self.bucket}/{key}")
        self.request("DELETE", self.bucket)

    def secret_manifest(self, name: str = "s3-models", **override: str) -> dict[str, Any]:
        data = {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key, **override}
        return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": data}

    def log(self, since: float) -> list[dict[str, Any]]:
        """This bucket's records in SeaweedFS's access log from ``since`` (epoch seconds; the log has whole ones)."""
        path = Path(self.env["LLM_AUTOPILOT_S3_ACCESS_LOG"])
        records = []
        for text in path.read_text(errors="replace").splitlines():
            if text.startswith("{"):
                record = json.loads(text)
                if record.get("bucket") == self.bucket and float(record.get("time", 0)) >= int(since):
                    records.append(record)
        return records

    def object_gets(self, since: float, prefix: str, clients: set[str] | None = None) -> dict[str, int]:
        """Successful GETs of each object under ``prefix`` since ``since``, from ``clients`` (IPs) if given."""
        counts: dict[str, int] = {}
        for record in self.log(since):
            key = str(record.get("key", "")).lstrip("/")
            ip = str(record.get("remote_ip", "")).split(":")[0]
            if (record.get("operation") == "REST.GET.OBJECT" and record.get("status") in (200, 206)
                    and key.startswith(f"{prefix}/") and (clients is None or ip in clients)):
                counts[key.removeprefix(f"{prefix}/")] = counts.get(key.removeprefix(f"{prefix}/"), 0) + 1
        return counts


def store_from_environment() -> Store:
    return Store(dict(os.environ))


def main() -> None:
    """``python -m tests.e2e.model_store [BUCKET]``: put the tiny model under s3://BUCKET/tiny-llama-gqa (default
    bucket ``models``, what examples/tiny-llama-s3.yaml reads) with the keys of ``hack/cluster.py env``."""
    import sys  # noqa: PLC0415

    store = Store(dict(os.environ), bucket=sys.argv[1] if len(sys.argv) > 1 else "models")
    status, _ = store.request("PUT", store.bucket)  # 200, or 409 when it exists already
    assert status in (200, 409), status
    files = model_files()
    store.put_model(PREFIX, files)
    print(f"put {len(files)} files ({sum(map(len, files.values()))} bytes) under s3://{store.bucket}/{PREFIX} "
          f"at {store.endpoint}")


if __name__ == "__main__":
    main()


@contextlib.contextmanager
def fresh_bucket(env: dict[str, str], purpose: str) -> Iterator[Store]:
    """A bucket of its own for one test (``e2e-<purpose>-<hex>``), removed with everything in it afterwards."""
    store = Store(env, bucket=f"e2e-{purpose}-{uuid.uuid4().hex[:8]}").create()
    try:
        yield store
    finally:
        store.remove()
