"""The local cluster's S3-compatible store: SeaweedFS (``weed mini``, built from its Go module), with its access log.

``weed mini`` runs SeaweedFS's master, volume server, filer and S3 gateway in one process. It listens on the pod
bridge's gateway address only (pods reach it there, as a real cluster reaches its object store; the host reaches
the same address), on ports of the cluster's port block; WebDAV, the admin UI and the Iceberg/Lance catalogs are
off, and so is its telemetry. Requests are authenticated: one identity (``<state>/s3/credentials.json``, made once
per state dir) with admin rights; ``cluster.py env`` prints the endpoint and the keys.

SeaweedFS writes its S3 access log (one record per request: operation ``REST.GET.OBJECT``, bucket, key, status,
bytes) to a Fluentd endpoint. The ``s3-access-log`` component is that collector (standard library): it reads the
records (``marshal_as_json``: JSON arrays ``[tag, time, record, option]``) from a unix socket and appends one JSON
line per record to ``<state>/logs/s3-access.jsonl``, so a test can count GETs per object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from .api import http_ok
from .state import Cluster

IDENTITY = "llm-autopilot"


def address(cluster: Cluster) -> str:
    return str(cluster.pod_bridge.gateway)


def endpoint(cluster: Cluster) -> str:
    return f"http://{address(cluster)}:{cluster.ports['seaweedfs-s3']}"


def folder(cluster: Cluster) -> Path:
    return cluster.root / "s3"


def access_log(cluster: Cluster) -> Path:
    return cluster.root / "logs" / "s3-access.jsonl"


def access_socket(cluster: Cluster) -> Path:
    return cluster.root / "run" / "s3-access.sock"


def credentials(cluster: Cluster) -> dict[str, str]:
    """The store's access key and secret key, made once per state dir."""
    path = folder(cluster) / "credentials.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        keys = {"accessKey": "LLMA" + secrets.token_hex(8).upper(), "secretKey": secrets.token_urlsafe(30)}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(keys) + "\n")
        tmp.chmod(0o600)
        tmp.replace(path)
    data: dict[str, str] = json.loads(path.read_text())
    return data


def identity_config(keys: dict[str, str]) -> dict[str, Any]:
    """SeaweedFS's ``-s3.config``: the identities it accepts (no anonymous access)."""
    return {"identities": [{"name": IDENTITY, "credentials": [keys],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}


def prepare(cluster: Cluster) -> None:
    """Before ``weed mini`` starts: its folders, identity and audit-log configs, and the bridge address it binds."""
    cluster.pod_bridge.ensure()  # idempotent; the process kubelet keeps it (a listener survives its re-creation)
    root = folder(cluster)
    cluster.data_dir("seaweedfs").mkdir(parents=True, exist_ok=True)
    (root / "identities.json").write_text(json.dumps(identity_config(credentials(cluster)), indent=1) + "\n")
    (root / "identities.json").chmod(0o600)
    (root / "audit.json").write_text(json.dumps({
        "fluent_network": "unix", "fluent_socket_path": str(access_socket(cluster)), "marshal_as_json": True,
        "tag_prefix": "seaweedfs"}) + "\n")


def weed_args(cluster: Cluster) -> list[str]:
    p, root, ip = cluster.ports, folder(cluster), address(cluster)
    return [
        "mini",
        f"-dir={cluster.data_dir('seaweedfs')}",
        f"-ip={ip}", f"-ip.bind={ip}",
        f"-master.port={p['seaweedfs-master']}", f"-master.port.grpc={p['seaweedfs-master-grpc']}",
        f"-volume.port={p['seaweedfs-volume']}", f"-volume.port.grpc={p['seaweedfs-volume-grpc']}",
        f"-filer.port={p['seaweedfs-filer']}", f"-filer.port.grpc={p['seaweedfs-filer-grpc']}",
        f"-s3.port={p['seaweedfs-s3']}", f"-s3.port.grpc={p['seaweedfs-s3-grpc']}",
        "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
        # its admin server still runs (on 127.0.0.1): on this cluster's ports, without the legacy listener
        f"-admin.port={p['seaweedfs-admin']}", f"-admin.port.grpc={p['seaweedfs-admin-grpc']}", "-admin.port.legacy=0",
        "-master.telemetry=false",
        f"-filer.localSocket={cluster.root / 'run' / 'seaweedfs-filer.sock'}",
        f"-s3.localSocket={cluster.root / 'run' / 'seaweedfs-s3.sock'}",
        f"-s3.config={root / 'identities.json'}",
        f"-s3.auditLogConfig={root / 'audit.json'}",
        "-s3.autoCreateBucket=false",  # a bucket that does not exist is an error (NoSuchBucket), as on AWS
    ]


def healthy(cluster: Cluster) -> bool:
    return http_ok(f"{endpoint(cluster)}/healthz")


def process_env(cluster: Cluster) -> dict[str, str]:
    return {"HOME": str(folder(cluster))}  # weed reads ~/.seaweedfs/*.toml: none


def access_log_args(cluster: Cluster) -> list[str]:
    return [str(Path(__file__).resolve().parent.parent / "s3_access_log.py"), f"--socket={access_socket(cluster)}",
            f"--out={access_log(cluster)}"]


def access_log_healthy(cluster: Cluster) -> bool:
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        s.connect(str(access_socket(cluster)))
        return True
    return False


def env_lines(cluster: Cluster) -> list[str]:
    keys = credentials(cluster)
    return [f"export LLM_AUTOPILOT_S3_ENDPOINT={endpoint(cluster)}",
            f"export LLM_AUTOPILOT_S3_ACCESS_KEY={keys['accessKey']}",
            f"export LLM_AUTOPILOT_S3_SECRET_KEY={keys['secretKey']}",
            f"export LLM_AUTOPILOT_S3_ACCESS_LOG={access_log(cluster)}",
            # the store is on the pod bridge's gateway, a private address: the operator's egress policy
            # (domain/egress.py) reaches it only when named, as the chart's egress.allow would
            f"export LLM_AUTOPILOT_EGRESS_ALLOW={address(cluster)}"]


# --- the access-log collector (a Fluentd forward endpoint for JSON-marshalled records) ----------------------


def records(buffer: str) -> tuple[list[dict[str, Any]], str]:
    """The complete ``[tag, time, record, option]`` arrays at the start of ``buffer``, and what is left."""
    decoder = json.JSONDecoder()
    out: list[dict[str, Any]] = []
    index = 0
    while True:
        while index < len(buffer) and buffer[index].isspace():
            index += 1
        if index >= len(buffer):
            return out, ""
        try:
            value, end = decoder.raw_decode(buffer, index)
        except json.JSONDecodeError:
            return out, buffer[index:]
        index = end
        if isinstance(value, list) and len(value) >= 3 and isinstance(value[2], dict):
            out.append({"tag": value[0], "time": value[1], **value[2]})


def collect(sock_path: Path, out_path: Path, stop: threading.Event) -> None:
    sock_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    sock_path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock_path))
    os.chmod(sock_path, 0o600)
    server.listen(16)
    server.settimeout(0.5)
    lock = threading.Lock()
    out = out_path.open("a")

    def serve(conn: socket.socket) -> None:
        buffer = ""
        with conn:
            while chunk := conn.recv(65536):
                found, buffer = records(buffer + chunk.decode(errors="replace"))
                with lock:
                    for record in found:
                        out.write(json.dumps(record) + "\n")
                    out.flush()

    while not stop.is_set():
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        threading.Thread(target=serve, args=(conn,), daemon=True).start()
    server.close()
    sock_path.unlink(missing_ok=True)
    out.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="s3-access-log", description="SeaweedFS's S3 access log, as JSON lines")
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"collecting SeaweedFS's S3 access log on {args.socket} into {args.out}", flush=True)
    collect(args.socket, args.out, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
