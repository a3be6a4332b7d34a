"""Talking to the API server with the standard library (HTTPS, the admin client certificate)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

from .paths import ClusterError
from .state import Cluster


class Api:
    def __init__(self, cluster: Cluster) -> None:
        self.base = cluster.server
        if not (cluster.pki / "admin.crt").exists():
            raise ClusterError(f"no cluster in {cluster.root}: run `cluster.py up`")
        self.ctx = ssl.create_default_context(cafile=str(cluster.pki / "ca.crt"))
        self.ctx.load_cert_chain(str(cluster.pki / "admin.crt"), str(cluster.pki / "admin.key"))

    def request(self, method: str, path: str, body: Any = None, timeout: float = 10.0,
                content_type: str = "application/json") -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=timeout) as resp:
                raw = resp.read()
                status = resp.status
        except urllib.error.HTTPError as err:
            raw, status = err.read(), err.code
        try:
            return status, json.loads(raw) if raw else None
        except json.JSONDecodeError:
            return status, raw.decode(errors="replace")

    def merge_patch(self, path: str, body: Any) -> tuple[int, Any]:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def strategic_patch(self, path: str, body: Any) -> tuple[int, Any]:
        """A strategic merge patch: lists with a merge key (a pod's conditions, by type) merge item by item."""
        return self.request("PATCH", path, body, content_type="application/strategic-merge-patch+json")

    def ok(self, path: str) -> bool:
        try:
            return self.request("GET", path, timeout=3.0)[0] == 200
        except OSError:
            return False


def http_ok(url: str, timeout: float = 3.0) -> bool:
    """GET `url` (no certificate verification: local self-signed endpoints)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False
