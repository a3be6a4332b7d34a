"""The local cluster's Hub (hack/hub_server.py) serves what huggingface_hub's snapshot_download needs, and logs
each download: the end-to-end tests count downloads and bytes from that log."""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hack.hub_server import FakeHub
from huggingface_hub import HfApi, snapshot_download

COMMIT = "0123456789abcdef0123456789abcdef01234567"
WEIGHTS = os.urandom(300_000)
CONFIG = json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}).encode()


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    folder = tmp_path / "models" / "models--org--tiny"
    snapshot = folder / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(COMMIT)
    (snapshot / "config.json").write_bytes(CONFIG)
    (snapshot / "model.safetensors").write_bytes(WEIGHTS)
    return tmp_path / "models"


@pytest.fixture
def hub(cache: Path) -> Iterator[tuple[FakeHub, io.StringIO]]:
    log = io.StringIO()
    server = FakeHub(cache=cache, log=log)
    server.start()
    yield server, log
    server.stop()


def downloads(log: io.StringIO) -> list[dict[str, object]]:
    return [line for line in map(json.loads, log.getvalue().splitlines()) if line["download"]]


def test_snapshot_download_gets_each_file_once_and_logs_it(hub: tuple[FakeHub, io.StringIO], tmp_path: Path) -> None:
    server, log = hub
    folder = Path(snapshot_download("org/tiny", cache_dir=str(tmp_path / "hf"), endpoint=server.endpoint))
    assert folder.name == COMMIT
    assert (folder / "model.safetensors").read_bytes() == WEIGHTS
    assert (folder / "config.json").read_bytes() == CONFIG
    got = {str(d["path"]).rsplit("/", 1)[-1]: d["bytes"] for d in downloads(log)}
    assert got == {"model.safetensors": len(WEIGHTS), "config.json": len(CONFIG)}
    # a second snapshot_download finds everything cached: no file is downloaded again
    snapshot_download("org/tiny", cache_dir=str(tmp_path / "hf"), endpoint=server.endpoint)
    assert len(downloads(log)) == 2


def test_repo_info_and_tree_carry_sizes_and_the_lfs_sha256(hub: tuple[FakeHub, io.StringIO]) -> None:
    server, _ = hub
    api = HfApi(endpoint=server.endpoint)
    info = api.model_info("org/tiny", files_metadata=True)
    assert info.sha == COMMIT
    assert sorted(s.rfilename for s in info.siblings or []) == ["config.json", "model.safetensors"]
    tree = {f.path: f for f in api.list_repo_tree("org/tiny", recursive=True)}
    weights = tree["model.safetensors"]
    assert weights.size == len(WEIGHTS)  # type: ignore[union-attr]
    assert weights.lfs is not None and weights.lfs.sha256 == hashlib.sha256(WEIGHTS).hexdigest()  # type: ignore[union-attr]


def test_a_range_request_resumes_a_download(hub: tuple[FakeHub, io.StringIO]) -> None:
    server, log = hub
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/org/tiny/resolve/main/model.safetensors", headers={"Range": "bytes=100000-"})
    response = conn.getresponse()
    body = response.read()
    assert response.status == 206
    assert response.headers["Content-Range"] == f"bytes 100000-{len(WEIGHTS) - 1}/{len(WEIGHTS)}"
    assert response.headers["ETag"] == f'"{hashlib.sha256(WEIGHTS).hexdigest()}"'
    assert response.headers["X-Repo-Commit"] == COMMIT
    assert body == WEIGHTS[100000:]
    conn.request("GET", "/org/tiny/resolve/main/model.safetensors", headers={"Range": f"bytes={len(WEIGHTS)}-"})
    beyond = conn.getresponse()
    beyond.read()
    assert beyond.status == 416
    assert [d["bytes"] for d in downloads(log)] == [len(WEIGHTS) - 100000]


def test_an_unknown_revision_and_file_get_the_hub_error_codes(hub: tuple[FakeHub, io.StringIO]) -> None:
    server, _ = hub
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    for path, code in (("/org/tiny/resolve/nope/config.json", "RevisionNotFound"),
                       ("/org/tiny/resolve/main/missing.json", "EntryNotFound"),
                       ("/api/models/org/other", "RepoNotFound")):
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        assert response.status in (401, 404), path
        assert response.headers["X-Error-Code"] == code, path
