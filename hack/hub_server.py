"""A Hub-shaped HTTP server on 127.0.0.1 (standard library only), for the Hub client's tests and for the tiny
models of the end-to-end tests and `make demo`.

It speaks the part of the Hub protocol huggingface_hub uses to download a file:
``HEAD``/``GET /{org}/{name}/resolve/{revision}/{filename}`` answered with ``X-Repo-Commit``,
``ETag`` and ``Content-Length`` (LFS files: a redirect carrying ``X-Linked-Size``/``X-Linked-Etag``),
and errors tagged with ``X-Error-Code`` (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import signal
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

#: the token a gated repo accepts
TOKEN = "hf_local_test_token"


def git_blob_sha(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass
class Repo:
    files: dict[str, bytes]
    #: Large weight files, served as the Hub serves LFS files: a redirect to a CDN carrying their size.
    lfs_sizes: dict[str, int] = field(default_factory=dict)
    #: Plain files known by size only (HEAD answers Content-Length).
    plain_sizes: dict[str, int] = field(default_factory=dict)
    gated: bool = False
    #: Other revisions and the files that differ there.
    revisions: dict[str, dict[str, bytes]] = field(default_factory=dict)
    #: Files whose requests the server drops without an answer (a flaky mirror).
    hang_up: set[str] = field(default_factory=set)

    def commit(self, revision: str) -> str:
        return hashlib.sha1(revision.encode()).hexdigest()


@dataclass
class Seen:
    method: str
    path: str
    authorization: str | None


class FakeHub:
    """A Hub on 127.0.0.1 serving :class:`Repo` objects, and (with ``cache``) every model of a Hugging Face
    cache folder (``models--ORG--NAME/refs/main`` -> snapshot, looked up per request, so models made after
    the start are served too); records the most recent requests it answers."""

    def __init__(self, port: int = 0, cache: Path | None = None) -> None:
        self.repos: dict[str, Repo] = {}
        self.cache = cache
        self.requests: list[Seen] = []
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:
                hub.answer(self, body=False)

            def do_GET(self) -> None:
                hub.answer(self, body=True)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def paths(self, method: str | None = None) -> list[str]:
        return [r.path for r in self.requests if method is None or r.method == method]

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, headers: dict[str, str], content: bytes,
              body: bool) -> None:
        handler.send_response(status)
        for name, value in headers.items():
            handler.send_header(name, value)
        if "Content-Length" not in headers:
            handler.send_header("Content-Length", str(len(content)))
        handler.end_headers()
        if body:
            handler.wfile.write(content)

    def _error(self, handler: BaseHTTPRequestHandler, status: int, code: str, message: str, body: bool,
               commit: str | None = None) -> None:
        headers = {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}
        if commit:
            headers["X-Repo-Commit"] = commit
        self._send(handler, status, headers, json.dumps({"error": message}).encode(), body)

    def _cached(self, repo_id: str) -> Repo | None:
        if self.cache is None or repo_id.count("/") != 1 or ".." in repo_id:
            return None
        folder = self.cache / ("models--" + repo_id.replace("/", "--"))
        ref = folder / "refs" / "main"
        if not ref.is_file():
            return None
        snapshot = folder / "snapshots" / ref.read_text().strip()
        return repo_from_snapshot(snapshot) if snapshot.is_dir() else None

    def answer(self, handler: BaseHTTPRequestHandler, *, body: bool) -> None:
        auth = handler.headers.get("Authorization")
        with self._lock:
            self.requests = [*self.requests[-999:], Seen(handler.command, handler.path, auth)]
        if handler.path == "/healthz":
            self._send(handler, 200, {"Content-Type": "text/plain"}, b"ok", body)
            return
        parts = handler.path.split("?", 1)[0].lstrip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":
            self._error(handler, 404, "RepoNotFound", "Repository not found", body)
            return
        repo_id, revision, filename = f"{parts[0]}/{parts[1]}", unquote(parts[3]), "/".join(parts[4:])
        repo = self.repos.get(repo_id) or self._cached(repo_id)
        if repo is None:
            self._error(handler, 401 if auth is None else 404, "RepoNotFound", "Repository not found", body)
            return
        if repo.gated and auth != f"Bearer {TOKEN}":
            status = 401 if auth is None else 403
            self._error(handler, status, "GatedRepo", f"Access to model {repo_id} is restricted.", body)
            return
        if revision != "main" and revision not in repo.revisions:
            self._error(handler, 404, "RevisionNotFound", f"Invalid rev id: {revision}", body)
            return
        if filename in repo.hang_up:
            handler.close_connection = True
            return
        commit = repo.commit(revision)
        files = {**repo.files, **repo.revisions.get(revision, {})}
        if filename in repo.lfs_sizes:
            size, sha256 = repo.lfs_sizes[filename], hashlib.sha256(filename.encode()).hexdigest()
            self._send(handler, 302, {
                # another host name: huggingface_hub does not follow redirects off the Hub
                "Location": f"http://localhost:{self.port}/cdn/{sha256}",
                "X-Repo-Commit": commit, "ETag": f'"{git_blob_sha(sha256.encode())}"',
                "X-Linked-Etag": f'"{sha256}"', "X-Linked-Size": str(size), "Content-Length": "0",
            }, b"", body)
            return
        if filename in repo.plain_sizes and not body:
            self._send(handler, 200, {
                "X-Repo-Commit": commit, "ETag": f'"{git_blob_sha(filename.encode())}"',
                "Content-Length": str(repo.plain_sizes[filename]),
            }, b"", body)
            return
        if filename not in files:
            self._error(handler, 404, "EntryNotFound", f"{filename} does not exist on {revision!r}", body,
                        commit=commit)
            return
        content = files[filename]
        self._send(handler, 200, {
            "X-Repo-Commit": commit, "ETag": f'"{git_blob_sha(content)}"',
            "Content-Type": "application/json" if filename.endswith(".json") else "application/octet-stream",
        }, content, body)


def repo_from_snapshot(snapshot: Path, *, lfs_files: tuple[str, ...] = ("model.safetensors",)) -> Repo:
    """A repo serving the files of a Hugging Face cache snapshot; weights by size only, as LFS files."""
    files = {p.name: p.read_bytes() for p in sorted(snapshot.iterdir()) if p.is_file() and p.name not in lfs_files}
    sizes = {name: (snapshot / name).stat().st_size for name in lfs_files if (snapshot / name).is_file()}
    return Repo(files, lfs_sizes=sizes)


def main(argv: list[str] | None = None) -> int:
    """``hack/hub_server.py --port P --cache DIR``: serve a Hugging Face cache folder until SIGTERM."""
    parser = argparse.ArgumentParser(description="A Hub-shaped server for the models of a Hugging Face cache.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cache", type=Path, required=True)
    args = parser.parse_args(argv)
    hub = FakeHub(args.port, args.cache)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    hub.start()
    print(f"serving {args.cache} on {hub.endpoint}", flush=True)
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    hub.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
