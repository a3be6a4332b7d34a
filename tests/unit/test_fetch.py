"""``llm-autopilot fetch``: a folder filled once, resumed after a restart, checked, and marked complete last."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hack.hub_server import FakeHub, Repo

from llm_autopilot.api.sources import S3Source
from llm_autopilot.storage import fetch
from llm_autopilot.storage.fetch import MARKER, FetchError, Wanted
from llm_autopilot.storage.s3 import S3Client
from tests.unit.test_storage import KEY, NOW, Store

WEIGHTS = bytes(range(256)) * 40  # 10 KiB
FILES = {"tiny/config.json": b'{"hidden_size": 64}', "tiny/model.safetensors": WEIGHTS,
         "tiny/tokenizer/tokenizer.json": b"{}"}
SOURCE = S3Source("models", "tiny")


class Flaky(Store):
    """A store whose GETs of some keys return short or altered content (a dropped or corrupted transfer)."""

    def __init__(self, objects: dict[str, bytes], *, short: set[str] = frozenset(),  # type: ignore[assignment]
                 corrupt: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        super().__init__(objects)
        self.short, self.corrupt = set(short), set(corrupt)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        response = super().__call__(request)
        key = request.url.path.removeprefix("/models/")
        if request.method == "GET" and key in self.short | self.corrupt and response.status_code < 300:
            body = response.content
            body = body[: len(body) // 2] if key in self.short else bytes(b ^ 1 for b in body)
            return httpx.Response(response.status_code, content=body, headers={"etag": response.headers["etag"]})
        return response


def s3(store: Store) -> S3Client:
    return S3Client("http://s3.local:8333", "us-east-1", KEY, transport=httpx.MockTransport(store), clock=lambda: NOW)


def gets(store: Store) -> list[tuple[str, str | None]]:
    return [(r.url.path, r.headers.get("range")) for r in store.requests
            if r.method == "GET" and "list-type" not in r.url.params]


def test_every_file_is_fetched_checked_and_marked_complete(tmp_path: Path) -> None:
    store = Store(dict(FILES))
    lines: list[str] = []
    summary = fetch.fetch_s3(s3(store), SOURCE, tmp_path / "m", progress=fetch.ProgressPrinter(lines.append))
    assert (tmp_path / "m" / "model.safetensors").read_bytes() == WEIGHTS
    assert (tmp_path / "m" / "tokenizer" / "tokenizer.json").read_bytes() == b"{}"
    assert json.loads((tmp_path / "m" / MARKER).read_text()) == {"files": 3, "bytes": sum(map(len, FILES.values()))}
    assert summary.downloaded_bytes == summary.total_bytes == sum(map(len, FILES.values()))
    last = json.loads(lines[-1])
    assert last == {"fetch": "progress", "bytes": summary.total_bytes, "total": summary.total_bytes, "percent": 100.0}
    assert not list((tmp_path / "m").rglob("*.partial"))


def test_a_complete_folder_downloads_nothing(tmp_path: Path) -> None:
    fetch.fetch_s3(s3(Store(dict(FILES))), SOURCE, tmp_path)
    again = Store(dict(FILES))
    summary = fetch.fetch_s3(s3(again), SOURCE, tmp_path)
    assert summary.already_complete and summary.downloaded_bytes == 0
    assert gets(again) == []


def test_a_restart_resumes_where_the_partial_file_stopped(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_bytes(FILES["tiny/config.json"])  # finished before the restart
    (tmp_path / "model.safetensors.partial").write_bytes(WEIGHTS[:4000])
    store = Store(dict(FILES))
    summary = fetch.fetch_s3(s3(store), SOURCE, tmp_path)
    assert (tmp_path / "model.safetensors").read_bytes() == WEIGHTS  # and its MD5 (the ETag) matched
    assert summary.downloaded_bytes == len(WEIGHTS) - 4000 + 2
    assert ("/models/tiny/model.safetensors", "bytes=4000-") in gets(store)
    assert all(path != "/models/tiny/config.json" for path, _ in gets(store))


@pytest.mark.parametrize(("flaw", "says"), [("short", "size mismatch"), ("corrupt", "md5 mismatch")])
def test_a_bad_transfer_is_removed_and_nothing_is_marked(tmp_path: Path, flaw: str, says: str) -> None:
    store = Flaky(dict(FILES), **{flaw: {"tiny/model.safetensors"}})
    with pytest.raises(FetchError, match=says) as raised:
        fetch.fetch_s3(s3(store), SOURCE, tmp_path)
    assert "s3://models/tiny/model.safetensors" in str(raised.value)
    assert not (tmp_path / MARKER).exists()
    assert not (tmp_path / "model.safetensors").exists() and not (tmp_path / "model.safetensors.partial").exists()
    fetch.fetch_s3(s3(Store(dict(FILES))), SOURCE, tmp_path)  # the next try (the Job's retry) completes
    assert (tmp_path / MARKER).is_file()


def test_an_empty_prefix_and_an_escaping_key_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="holds no objects"):
        fetch.fetch_s3(s3(Store(dict(FILES))), S3Source("models", "nothing"), tmp_path)
    with pytest.raises(FetchError, match="outside"):
        fetch.fetch_s3(s3(Store({"tiny/../../etc/x": b"1"})), SOURCE, tmp_path / "d")
    assert not (tmp_path / "etc").exists()


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    server = FakeHub()
    server.repos["acme/tiny"] = Repo({"config.json": b'{"a": 1}', "tokenizer.json": b"{}"})
    server.start()
    yield server
    server.stop()


def test_hub_files_are_fetched_and_their_sha256_checked(hub: FakeHub, tmp_path: Path) -> None:
    """The Hub's file list (sizes, LFS SHA-256) comes from /api/models, which the local Hub-shaped server does
    not serve: the list is given here, the downloads are real HTTP."""
    stream = fetch.hub_stream("acme/tiny", None, token=None, endpoint=hub.endpoint)
    good = [Wanted("config.json", 8, sha256=hashlib.sha256(b'{"a": 1}').hexdigest()), Wanted("tokenizer.json", 2)]
    summary = fetch.fill(tmp_path / "ok", good, stream, describe=lambda w: w.path)
    assert summary.downloaded_bytes == 10 and (tmp_path / "ok" / MARKER).is_file()
    assert "/acme/tiny/resolve/main/config.json" in hub.paths("GET")
    bad = [Wanted("config.json", 8, sha256="0" * 64)]
    with pytest.raises(FetchError, match=r"sha256 mismatch for acme/tiny/config\.json"):
        fetch.fill(tmp_path / "bad", bad, stream, describe=lambda w: f"acme/tiny/{w.path}")
    assert not (tmp_path / "bad" / MARKER).exists()


def test_a_full_volume_is_named_with_the_size_to_raise(tmp_path: Path) -> None:
    dest = tmp_path / "m"
    dest.mkdir()
    # a real ENOSPC: the partial file is /dev/full (the e2e test fills a real loop-mounted volume)
    (dest / "model.safetensors.partial").symlink_to("/dev/full")
    with pytest.raises(FetchError, match=r"the cache volume is full: s3://models/tiny/model.safetensors "
                                         r"\(10240 bytes\) does not fit .*raise spec.model.cache.size"):
        fetch.fetch_s3(s3(Store(dict(FILES))), SOURCE, dest)
    assert not (dest / MARKER).exists()
