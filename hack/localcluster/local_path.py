"""Dynamic volume provisioning for the local cluster: the default StorageClass ``local-path`` and its provisioner.

A real cluster has a CSI driver or an external provisioner; this one is a small process (standard library) in
the same role as Rancher's local-path-provisioner, with the real controller-manager's PersistentVolume controller
doing the binding:

* ``up`` starts it as the ``local-path-provisioner`` component; it makes sure the StorageClass exists (default
  class, ``reclaimPolicy: Delete``, ``volumeBindingMode: Immediate``);
* a claim of that class (``storageClassName`` unset is filled in by the DefaultStorageClass admission plugin) that
  is Pending without a volume gets a PersistentVolume ``pvc-<claim uid>`` of the requested size and access modes,
  ``claimRef`` set to the claim: the PV controller binds the two. Its source is a ``hostPath`` folder on this
  machine, so both vllm-cpu nodes reach it (as a network volume; no node affinity);
* the size is real: each volume is its own ext4 file system, on a sparse image file (``<state>/volumes/<pv>.img``)
  loop-mounted at ``<state>/volumes/<pv>``; writing more than the request gives ENOSPC;
* a PersistentVolume of this provisioner that is Released (its claim was deleted) or deleted is unmounted, its
  image removed and the PV deleted (its finalizer ``llm-autopilot.io/local-path`` keeps it until then).

Pre-created (static) PersistentVolumes need no provisioner: any ``hostPath``/``local`` PV bound to a claim is
mounted by the process kubelet.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .api import Api
from .paths import ClusterError
from .state import Cluster

CLASS_NAME = "local-path"
PROVISIONER = "llm-autopilot.io/local-path"
FINALIZER = "llm-autopilot.io/local-path"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
#: ext4 needs some room for its own metadata: a smaller request gets this much (still a hard limit)
MIN_BYTES = 2 * 2**20
SYNC_SECONDS = 1.0

_QUANTITY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def quantity_bytes(text: str) -> int:
    value = str(text).strip()
    for suffix, factor in _QUANTITY.items():
        if value.endswith(suffix):
            return int(float(value[: -len(suffix)]) * factor)
    return int(float(value))


def storage_class() -> dict[str, Any]:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": CLASS_NAME, "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
            "provisioner": PROVISIONER, "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate",
            "allowVolumeExpansion": False}


def volume_name(claim: dict[str, Any]) -> str:
    return f"pvc-{claim['metadata']['uid']}"


def requested_bytes(claim: dict[str, Any]) -> int:
    storage = (((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}).get("storage")
    return max(MIN_BYTES, quantity_bytes(storage)) if storage else MIN_BYTES


def wants_volume(claim: dict[str, Any]) -> bool:
    spec, meta = claim.get("spec") or {}, claim["metadata"]
    return (spec.get("storageClassName") == CLASS_NAME and not spec.get("volumeName")
            and (claim.get("status") or {}).get("phase", "Pending") == "Pending" and not meta.get("deletionTimestamp")
            and spec.get("volumeMode", "Filesystem") == "Filesystem")


def to_provision(claims: list[dict[str, Any]], volumes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The claims of the class that need a new volume (none made for them yet)."""
    existing = {v["metadata"]["name"] for v in volumes}
    return [c for c in claims if wants_volume(c) and volume_name(c) not in existing]


def ours(volume: dict[str, Any]) -> bool:
    return (volume["metadata"].get("annotations") or {}).get(PROVISIONED_BY) == PROVISIONER


def to_delete(volumes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Our volumes whose storage goes: released by their claim (reclaimPolicy Delete) or being deleted."""
    out = []
    for v in volumes:
        if not ours(v):
            continue
        released = (v.get("status") or {}).get("phase") in ("Released", "Failed") and (
            (v.get("spec") or {}).get("persistentVolumeReclaimPolicy", "Delete") == "Delete")
        deleted = v["metadata"].get("deletionTimestamp") and (v.get("status") or {}).get("phase") != "Bound"
        if released or deleted:
            out.append(v)
    return out


def volume_manifest(claim: dict[str, Any], path: Path) -> dict[str, Any]:
    meta, spec = claim["metadata"], claim.get("spec") or {}
    return {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": volume_name(claim), "annotations": {PROVISIONED_BY: PROVISIONER},
                     "finalizers": [FINALIZER]},
        "spec": {
            "capacity": {"storage": str(requested_bytes(claim))},
            "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": CLASS_NAME,
            "volumeMode": "Filesystem",
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": meta["namespace"],
                         "name": meta["name"], "uid": meta["uid"]},
            "hostPath": {"path": str(path), "type": "Directory"},
        },
    }


# --- the storage: one loop-mounted ext4 image per volume ----------------------------------------------------


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=False)


def mounted(path: Path) -> bool:
    return _run("mountpoint", "-q", str(path)).returncode == 0


class Store:
    """Volumes under ``root``: ``<name>.img`` (sparse) mounted at ``<name>/``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, name: str) -> Path:
        return self.root / name

    def image(self, name: str) -> Path:
        return self.root / f"{name}.img"

    def create(self, name: str, size_bytes: int) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        image, path = self.image(name), self.path(name)
        if not image.exists():
            tmp = image.with_suffix(".img.tmp")
            with tmp.open("wb") as f:
                f.truncate(size_bytes)
            made = _run("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "lazy_itable_init=1",
                        "-L", name[:16], str(tmp))
            if made.returncode != 0:
                tmp.unlink(missing_ok=True)
                raise ClusterError(f"mkfs.ext4 for {name}: {made.stderr.strip()}")
            tmp.replace(image)
        self.attach(name)
        return path

    def attach(self, name: str) -> None:
        path = self.path(name)
        path.mkdir(parents=True, exist_ok=True)
        if not mounted(path):
            done = _run("mount", "-o", "loop,nosuid,nodev", str(self.image(name)), str(path))
            if done.returncode != 0:
                raise ClusterError(f"mounting {self.image(name)}: {done.stderr.strip()}")
            path.chmod(0o777)  # a pod of any user may write, as local-path-provisioner's folders

    def detach(self, name: str) -> None:
        path = self.path(name)
        if mounted(path) and _run("umount", str(path)).returncode != 0:
            _run("umount", "-l", str(path))  # a container's mount namespace may still hold it: it goes with it

    def remove(self, name: str) -> None:
        self.detach(name)
        with contextlib.suppress(OSError):
            self.path(name).rmdir()
        self.image(name).unlink(missing_ok=True)

    def names(self) -> list[str]:
        return sorted(p.name.removesuffix(".img") for p in self.root.glob("*.img")) if self.root.is_dir() else []


def detach_all(cluster: Cluster) -> None:
    """After the provisioner stops (and before ``down`` removes the state): unmount every volume, keep the images."""
    store = Store(volumes_dir(cluster))
    for name in store.names():
        store.detach(name)


def volumes_dir(cluster: Cluster) -> Path:
    return cluster.root / "volumes"


# --- the controller loop ------------------------------------------------------------------------------------


class Provisioner:
    def __init__(self, cluster: Cluster, port: int) -> None:
        self.api = Api(cluster)
        self.store = Store(volumes_dir(cluster))
        self.port = port
        self._stop = threading.Event()

    def log(self, message: str) -> None:
        print(f"[local-path-provisioner {time.strftime('%H:%M:%S')}] {message}", flush=True)

    def ensure_class(self) -> None:
        code, body = self.api.request("GET", f"/apis/storage.k8s.io/v1/storageclasses/{CLASS_NAME}")
        if code == 404:
            code, body = self.api.request("POST", "/apis/storage.k8s.io/v1/storageclasses", storage_class())
            if code not in (201, 409):
                raise ClusterError(f"creating StorageClass {CLASS_NAME}: {code} {body}")
            self.log(f"StorageClass {CLASS_NAME} created (default, provisioner {PROVISIONER})")
        elif code != 200:
            raise ClusterError(f"reading StorageClass {CLASS_NAME}: {code} {body}")

    def _list(self, path: str) -> list[dict[str, Any]]:
        code, body = self.api.request("GET", path)
        if code != 200 or not isinstance(body, dict):
            raise ClusterError(f"listing {path}: {code}")
        return list(body.get("items") or [])

    def event(self, claim: dict[str, Any], type_: str, reason: str, message: str) -> None:
        meta = claim["metadata"]
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.api.request("POST", f"/api/v1/namespaces/{meta['namespace']}/events", {
            "apiVersion": "v1", "kind": "Event", "metadata": {"generateName": f"{meta['name']}.",
                                                               "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "reason": reason, "message": message[:1024], "type": type_, "count": 1,
            "firstTimestamp": now, "lastTimestamp": now, "source": {"component": PROVISIONER},
            "reportingComponent": PROVISIONER, "reportingInstance": PROVISIONER})

    def sync(self) -> None:
        claims = self._list("/api/v1/persistentvolumeclaims")
        volumes = self._list("/api/v1/persistentvolumes")
        for claim in to_provision(claims, volumes):
            self.provision(claim)
        for volume in to_delete(volumes):
            self.delete(volume)
        for volume in volumes:  # after a restart (or `down --keep`): mount what exists again
            name = volume["metadata"]["name"]
            if ours(volume) and volume not in to_delete(volumes) and self.store.image(name).exists():
                self.store.attach(name)

    def provision(self, claim: dict[str, Any]) -> None:
        name, size = volume_name(claim), requested_bytes(claim)
        where = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
        try:
            path = self.store.create(name, size)
        except ClusterError as exc:
            self.log(f"{where}: {exc}")
            self.event(claim, "Warning", "ProvisioningFailed", str(exc))
            return
        code, body = self.api.request("POST", "/api/v1/persistentvolumes", volume_manifest(claim, path))
        if code not in (201, 409):
            self.store.remove(name)
            self.log(f"{where}: creating PV {name}: {code} {body}")
            self.event(claim, "Warning", "ProvisioningFailed", f"creating PV {name}: {code}")
            return
        self.log(f"{where}: provisioned {name} ({size} bytes, ext4 at {path})")
        self.event(claim, "Normal", "ProvisioningSucceeded", f"Successfully provisioned volume {name}")

    def delete(self, volume: dict[str, Any]) -> None:
        meta = volume["metadata"]
        name = meta["name"]
        self.store.remove(name)
        if not meta.get("deletionTimestamp"):
            code, body = self.api.request("DELETE", f"/api/v1/persistentvolumes/{name}")
            if code not in (200, 202, 404):
                self.log(f"deleting PV {name}: {code} {body}")
                return
        finalizers = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
        if FINALIZER in (meta.get("finalizers") or []):
            self.api.request("PATCH", f"/api/v1/persistentvolumes/{name}",
                             [{"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
                              {"op": "replace", "path": "/metadata/finalizers", "value": finalizers}],
                             content_type="application/json-patch+json")
        self.log(f"deleted {name} and its storage")

    def run(self) -> None:
        server = serve_health(self.port)
        self.log(f"watching claims of StorageClass {CLASS_NAME}; volumes in {self.store.root}")
        while not self._stop.is_set():
            try:
                self.ensure_class()
                self.sync()
            except (ClusterError, OSError) as exc:
                self.log(f"sync: {exc}")
            self._stop.wait(SYNC_SECONDS)
        server.shutdown()

    def stop(self) -> None:
        self._stop.set()


def serve_health(port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = urllib.parse.urlsplit(self.path).path == "/healthz"
            body = b"ok" if ok else b"not found"
            self.send_response(200 if ok else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.2,), daemon=True, name="health").start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="local-path-provisioner", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="health port (GET /healthz), on 127.0.0.1")
    args = parser.parse_args(argv)
    provisioner = Provisioner(Cluster.load(), args.port)
    signal.signal(signal.SIGTERM, lambda *_: provisioner.stop())
    signal.signal(signal.SIGINT, lambda *_: provisioner.stop())
    try:
        provisioner.run()
    except ClusterError as exc:
        print(f"local-path-provisioner: {exc}", file=sys.stderr)
        return 1
    return 0
