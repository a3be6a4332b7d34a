"""A Hub-shaped HTTP server (standard library only), for the Hub client's tests and for the tiny models of the
end-to-end tests and `make demo`: the local cluster's stand-in for huggingface.co.

It speaks the part of the Hub protocol that huggingface_hub's ``hf_hub_download``/``snapshot_download``,
transformers and vLLM's loader use:

* ``GET /api/models/{org}/{name}[/revision/{rev}]``: the repo's info (``sha``, ``siblings``);
* ``GET /api/models/{org}/{name}/tree/{rev}[/{path}]``: the file list with sizes, git blob ids and, for weight
  files, the LFS ``sha256`` (``POST .../paths-info/{rev}`` for named paths);
* ``HEAD``/``GET /{org}/{name}/resolve/{revision}/{filename}`` answered with ``X-Repo-Commit``, ``ETag`` and
  ``Content-Length``, and ``Range`` requests (``206``, how a download resumes). Weight files (``.safetensors``
  ...) are LFS files as on the Hub: their ``ETag``/``X-Linked-Etag`` is the content's sha256, which
  huggingface_hub checks. Files of a :class:`Repo` known by size only get a redirect carrying
  ``X-Linked-Size``/``X-Linked-Etag``, as the Hub's LFS redirect to its CDN;
* errors tagged with ``X-Error-Code`` (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo).

It may listen on several addresses (``--listen``, default 127.0.0.1; the local cluster adds its pod bridge's
gateway, which pods reach as a real cluster reaches huggingface.co). With ``--log`` (or ``log=``) every
request is one JSON line (``method``, ``path``, ``status``, ``bytes`` of body sent, ``download``: true for a
file's content), so tests can count downloads and bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qs, unquote, urlsplit

#: the token a gated repo accepts
TOKEN = "hf_local_test_token"
#: files the Hub stores in LFS (by name): their ETag is the content's sha256
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".onnx", ".msgpack", ".h5")
#: Linux's IP_FREEBIND: bind an address that is not (yet) on an interface (the pod bridge comes and goes)
IP_FREEBIND = 15
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


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
    #: The commit of ``main`` (a snapshot's folder name); by default a hash of the revision's name.
    main_commit: str | None = None

    def commit(self, revision: str) -> str:
        if revision in ("main", self.main_commit) and self.main_commit:
            return self.main_commit
        return hashlib.sha1(revision.encode()).hexdigest()

    def knows(self, revision: str) -> bool:
        return revision in ("main", self.commit("main")) or revision in self.revisions

    def files_at(self, revision: str) -> dict[str, bytes]:
        return {**self.files, **self.revisions.get(revision, {})}


def is_lfs(filename: str) -> bool:
    return filename.endswith(LFS_SUFFIXES)


_SHA256: dict[tuple[int, int], str] = {}


def sha256_of(content: bytes) -> str:
    key = (id(content), len(content))  # the same bytes object is hashed once
    if key not in _SHA256:
        _SHA256[key] = hashlib.sha256(content).hexdigest()
    return _SHA256[key]


def tree_entry(filename: str, content: bytes) -> dict[str, Any]:
    """One file of ``/api/models/.../tree`` (and ``paths-info``), as the Hub lists it."""
    entry: dict[str, Any] = {"type": "file", "oid": git_blob_sha(content), "size": len(content), "path": filename}
    if is_lfs(filename):
        entry["lfs"] = {"oid": sha256_of(content), "size": len(content), "pointerSize": 134}
    return entry


@dataclass
class Seen:
    method: str
    path: str
    authorization: str | None


class FakeHub:
    """A Hub on 127.0.0.1 serving :class:`Repo` objects, and (with ``cache``) every model of a Hugging Face
    cache folder (``models--ORG--NAME/refs/main`` -> snapshot, looked up per request, so models made after
    the start are served too); records the most recent requests it answers."""

    def __init__(self, port: int = 0, cache: Path | None = None, *, hosts: tuple[str, ...] = ("127.0.0.1",),
                 log: IO[str] | None = None) -> None:
        self.repos: dict[str, Repo] = {}
        self.cache = cache
        self.requests: list[Seen] = []
        self.log = log
        self._lock = threading.Lock()
        self._snapshots: dict[Path, Repo] = {}
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the Hub: huggingface_hub reuses its connections

            def do_HEAD(self) -> None:
                hub.answer(self, body=False)

            def do_GET(self) -> None:
                hub.answer(self, body=True)

            def do_POST(self) -> None:
                hub.answer(self, body=True)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def server_bind(self) -> None:
                if not str(self.server_address[0]).startswith("127."):
                    self.socket.setsockopt(socket.SOL_IP, IP_FREEBIND, 1)
                super().server_bind()

        self.servers = [Server((hosts[0], port), Handler)]
        self.port = self.servers[0].server_address[1]
        self.servers += [Server((host, self.port), Handler) for host in hosts[1:]]
        self.endpoint = f"http://{hosts[0]}:{self.port}"
        self._threads = [threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
                         for s in self.servers]

    @property
    def server(self) -> ThreadingHTTPServer:
        return self.servers[0]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)

    def record(self, handler: BaseHTTPRequestHandler, status: int, sent: int, download: bool) -> None:
        if self.log is None:
            return
        line = {"time": round(time.time(), 3), "client": handler.client_address[0], "method": handler.command,
                "path": handler.path, "status": status, "bytes": sent, "download": download}
        if handler.headers.get("Range"):
            line["range"] = handler.headers["Range"]
        with self._lock:
            self.log.write(json.dumps(line) + "\n")
            self.log.flush()

    def paths(self, method: str | None = None) -> list[str]:
        return [r.path for r in self.requests if method is None or r.method == method]

    def _send(self, handler: BaseHTTPRequestHandler, status: int, headers: dict[str, str], content: bytes,
              body: bool, download: bool = False) -> None:
        handler.send_response(status)
        for name, value in headers.items():
            handler.send_header(name, value)
        if "Content-Length" not in headers:
            handler.send_header("Content-Length", str(len(content)))
        handler.end_headers()
        sent = 0
        if body:
            try:
                handler.wfile.write(content)
                sent = len(content)
            except OSError:  # the client went away (a test's interrupted download): log what it asked for
                handler.close_connection = True
        self.record(handler, status, sent, download and body)

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
        if not snapshot.is_dir():
            return None
        with self._lock:  # a snapshot folder is immutable (named by its commit): read and hash it once
            if snapshot not in self._snapshots:
                self._snapshots[snapshot] = repo_from_snapshot(snapshot, lfs_files=())
            return self._snapshots[snapshot]

    def _repo(self, handler: BaseHTTPRequestHandler, repo_id: str, revision: str, body: bool) -> Repo | None:
        """The repo, or None after answering the error (unknown, gated, unknown revision)."""
        auth = handler.headers.get("Authorization")
        repo = self.repos.get(repo_id) or self._cached(repo_id)
        if repo is None:
            self._error(handler, 401 if auth is None else 404, "RepoNotFound", "Repository not found", body)
            return None
        if repo.gated and auth != f"Bearer {TOKEN}":
            status = 401 if auth is None else 403
            self._error(handler, status, "GatedRepo", f"Access to model {repo_id} is restricted.", body)
            return None
        if not repo.knows(revision):
            self._error(handler, 404, "RevisionNotFound", f"Invalid rev id: {revision}", body)
            return None
        return repo

    def answer(self, handler: BaseHTTPRequestHandler, *, body: bool) -> None:
        auth = handler.headers.get("Authorization")
        with self._lock:
            self.requests = [*self.requests[-999:], Seen(handler.command, handler.path, auth)]
        length = int(handler.headers.get("Content-Length") or 0)
        form = handler.rfile.read(length) if length else b""  # paths-info's form; drained for keep-alive
        url = urlsplit(handler.path)
        if url.path == "/healthz":
            self._send(handler, 200, {"Content-Type": "text/plain"}, b"ok", body)
            return
        parts = [unquote(p) for p in url.path.lstrip("/").split("/")]
        if parts[0] == "api" and len(parts) >= 4 and parts[1] == "models":
            self._api(handler, f"{parts[2]}/{parts[3]}", parts[4:], parse_qs(url.query), form, body)
            return
        if len(parts) < 5 or parts[2] != "resolve" or handler.command == "POST":
            self._error(handler, 404, "RepoNotFound", "Repository not found", body)
            return
        repo_id, revision, filename = f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:])
        repo = self._repo(handler, repo_id, revision, body)
        if repo is None:
            return
        if filename in repo.hang_up:
            handler.close_connection = True
            return
        commit = repo.commit(revision)
        files = repo.files_at(revision)
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
        headers = {"X-Repo-Commit": commit, "Accept-Ranges": "bytes",
                   "Content-Type": "application/json" if filename.endswith(".json") else "application/octet-stream"}
        if is_lfs(filename):  # the Hub's LFS file: its ETag is the content's sha256 (huggingface_hub checks it)
            sha256 = sha256_of(content)
            headers.update({"ETag": f'"{sha256}"', "X-Linked-Etag": f'"{sha256}"', "X-Linked-Size": str(len(content))})
        else:
            headers["ETag"] = f'"{git_blob_sha(content)}"'
        status, part = 200, content
        wanted = _RANGE.match(handler.headers.get("Range", "").strip())
        if handler.headers.get("Range") and wanted is None:
            self._send(handler, 416, {"Content-Range": f"bytes */{len(content)}"}, b"", body)
            return
        if wanted is not None:
            first_text, last_text = wanted.groups()
            if first_text:
                first, last = int(first_text), min(int(last_text) if last_text else len(content) - 1, len(content) - 1)
            else:  # bytes=-N: the last N bytes
                first, last = max(0, len(content) - int(last_text or 0)), len(content) - 1
            if first >= len(content) or first > last:
                self._send(handler, 416, {"Content-Range": f"bytes */{len(content)}"}, b"", body)
                return
            status, part = 206, content[first:last + 1]
            headers["Content-Range"] = f"bytes {first}-{last}/{len(content)}"
        self._send(handler, status, headers, part, body, download=True)

    def _api(self, handler: BaseHTTPRequestHandler, repo_id: str, rest: list[str], query: dict[str, list[str]],
             form: bytes, body: bool) -> None:
        """``/api/models/{repo}``, ``.../revision/{rev}``, ``.../tree/{rev}[/{path}]``, ``.../paths-info/{rev}``."""
        kind = rest[0] if rest else "revision"
        revision = rest[1] if len(rest) >= 2 else "main"
        if kind not in ("revision", "tree", "paths-info"):
            self._error(handler, 404, "EntryNotFound", f"unknown endpoint {handler.path}", body)
            return
        repo = self._repo(handler, repo_id, revision, body)
        if repo is None:
            return
        commit = repo.commit(revision)
        files = repo.files_at(revision)
        json_headers = {"Content-Type": "application/json", "X-Repo-Commit": commit}
        if kind == "revision":
            siblings = []
            for name in sorted(files):
                sibling: dict[str, Any] = {"rfilename": name}
                if query.get("blobs") == ["true"]:
                    entry = tree_entry(name, files[name])
                    sibling.update({"size": entry["size"], "blobId": entry["oid"]})
                    if "lfs" in entry:
                        sibling["lfs"] = {"sha256": entry["lfs"]["oid"], "size": entry["size"], "pointerSize": 134}
                siblings.append(sibling)
            info = {"_id": commit[:24], "id": repo_id, "modelId": repo_id, "sha": commit, "private": False,
                    "gated": "auto" if repo.gated else False, "disabled": False, "downloads": 0, "likes": 0,
                    "tags": [], "library_name": "transformers", "lastModified": "2026-12-01T00:00:00.000Z",
                    "createdAt": "2026-12-01T00:00:00.000Z", "siblings": siblings}
            self._send(handler, 200, json_headers, json.dumps(info).encode(), body)
            return
        if kind == "paths-info":
            wanted = parse_qs(form.decode(errors="replace")).get("paths", [])
            if not wanted and form.strip().startswith(b"{"):
                wanted = list(json.loads(form).get("paths", []))
            entries = [tree_entry(p, files[p]) for p in wanted if p in files]
            entries += [{"type": "directory", "oid": commit, "size": 0, "path": p} for p in wanted
                        if p not in files and any(f.startswith(p.rstrip("/") + "/") for f in files)]
            self._send(handler, 200, json_headers, json.dumps(entries).encode(), body)
            return
        prefix = "/".join(rest[2:]).strip("/")
        recursive = query.get("recursive") == ["true"]
        entries, folders = [], set()
        for name in sorted(files):
            if prefix and not name.startswith(prefix + "/"):
                continue
            relative = name[len(prefix) + 1:] if prefix else name
            if "/" in relative and not recursive:
                folders.add((f"{prefix}/" if prefix else "") + relative.split("/", 1)[0])
                continue
            entries.append(tree_entry(name, files[name]))
        if prefix and not entries and not folders:
            self._error(handler, 404, "EntryNotFound", f"{prefix} does not exist on {revision!r}", body,
                        commit=commit)
            return
        entries += [{"type": "directory", "oid": commit, "size": 0, "path": f} for f in sorted(folders)]
        self._send(handler, 200, json_headers, json.dumps(entries).encode(), body)


def repo_from_snapshot(snapshot: Path, *, lfs_files: tuple[str, ...] = ("model.safetensors",)) -> Repo:
    """A repo serving the files of a Hugging Face cache snapshot (its commit is the snapshot's name).

    Files in ``lfs_files`` are known by size only (a redirect carrying their size, their content never
    served); with ``lfs_files=()`` every file is served, weights with their sha256 as LFS files are."""
    found = sorted(p for p in snapshot.rglob("*") if p.is_file())
    files = {str(p.relative_to(snapshot)): p.read_bytes() for p in found if p.name not in lfs_files}
    sizes = {name: (snapshot / name).stat().st_size for name in lfs_files if (snapshot / name).is_file()}
    return Repo(files, lfs_sizes=sizes, main_commit=snapshot.name)


def main(argv: list[str] | None = None) -> int:
    """``hack/hub_server.py --port P --cache DIR [--listen ADDR ...] [--log FILE]``: serve a Hugging Face cache
    folder until SIGTERM."""
    parser = argparse.ArgumentParser(description="A Hub-shaped server for the models of a Hugging Face cache.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--listen", action="append", default=[],
                        help="an address to listen on (repeatable; default 127.0.0.1)")
    parser.add_argument("--log", default="-", help="request log, one JSON line per request (default: stdout)")
    args = parser.parse_args(argv)
    log = sys.stdout if args.log == "-" else open(args.log, "a")  # noqa: SIM115 (open for the process's life)
    hub = FakeHub(args.port, args.cache, hosts=tuple(args.listen or ["127.0.0.1"]), log=log)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    hub.start()
    where = ", ".join(f"{host}:{hub.port}" for host in args.listen or ["127.0.0.1"])
    print(f"serving {args.cache} on {where}", flush=True)
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    hub.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
