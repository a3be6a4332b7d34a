"""One local cluster's state directory and port block (persisted in ``cluster.json``)."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
from pathlib import Path

from .binaries import BINARIES
from .paths import ClusterError, log, state_dir
from .podnet import Bridge

DEFAULT_PORT_BASE = 26400
# Offsets inside the port block; kept stable so logs and docs stay readable.
PORT_OFFSETS: dict[str, int] = {
    "kwok": 10,  # kwok's fake kubelet server (healthz, logs, exec)
    "process-kubelet": 11,  # the vllm-cpu pool's kubelet API (logs), hack/localcluster/kubelet.py
    "apiserver": 43,
    "controller-manager": 57,
    "scheduler": 59,
    "etcd-client": 79,
    "etcd-peer": 80,
    "kube-state-metrics": 81,
    "kube-state-metrics-telemetry": 82,
    "prometheus": 90,
    "hub": 91,  # a Hub-shaped server for the tiny models (hack/hub_server.py)
    "local-path-provisioner": 92,  # its /healthz (hack/localcluster/local_path.py)
    # SeaweedFS, the S3-compatible store (hack/localcluster/s3.py), on the pod bridge's gateway address
    "seaweedfs-s3": 12,
    "seaweedfs-s3-grpc": 13,
    "seaweedfs-master": 14,
    "seaweedfs-master-grpc": 15,
    "seaweedfs-volume": 16,
    "seaweedfs-volume-grpc": 17,
    "seaweedfs-filer": 18,
    "seaweedfs-filer-grpc": 19,
    "seaweedfs-admin": 20,  # weed mini's admin server (no UI), on 127.0.0.1
    "seaweedfs-admin-grpc": 21,
    # KEDA (hack/localcluster/keda.py)
    "keda-operator-metrics": 60,
    "keda-operator-probe": 61,
    "keda-metrics-service": 62,  # the operator's gRPC metrics service (mTLS), read by the metrics API server
    "keda-adapter": 63,  # the metrics API server (external.metrics.k8s.io), https
    "keda-adapter-metrics": 64,
}

# Every Service takes a ClusterIP from here (each LLMDeployment has one). The API server's allocator keeps an
# IPAddress object per allocated address (MultiCIDRServiceAllocator, locked on since 1.34), so unused addresses
# cost nothing: a fresh cluster gets a /16 (65,534 Services). LLM_AUTOPILOT_SERVICE_CIDR (10.0.0.0/12../28) sets
# it for a fresh state dir; an existing one keeps what its etcd data was made with (the API server never
# changes its default ServiceCIDR after the first start), and one from before the setting had a /24.
DEFAULT_SERVICE_CIDR = "10.0.0.0/16"
LEGACY_SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"  # the first address of every allowed range: the kubernetes Service (in the API cert)
# Fake pod IPs handed out by kwok. Nothing is listening there and nothing in
# this cluster connects to them: never `kubectl proxy`/port-forward to a pod.
POD_CIDR = "10.244.0.0/16"
NODE_IP = "127.0.0.1"  # node InternalIP: kubelet traffic stays on loopback


@dataclasses.dataclass
class Cluster:
    """Paths and ports of one local cluster (persisted in cluster.json)."""

    root: Path
    ports: dict[str, int]
    disabled: list[str] = dataclasses.field(default_factory=list)  # e.g. ["prometheus"] (`up --no-prometheus`)
    service_cidr: str = DEFAULT_SERVICE_CIDR

    @classmethod
    def load(cls, *, fresh: bool = False) -> Cluster:
        """The cluster in the state dir; `fresh` ignores its saved ports."""
        root = state_dir()
        meta = root / "cluster.json"
        base = int(os.environ.get("LLM_AUTOPILOT_PORT_BASE", DEFAULT_PORT_BASE))
        defaults = {k: base + off for k, off in PORT_OFFSETS.items()}
        data = json.loads(meta.read_text()) if meta.exists() else None
        cidr = _service_cidr(data, root)
        if data is not None and not fresh:
            # a state dir from before a port key existed gets it from the same base
            saved_base = int(data["ports"].get("apiserver", base + PORT_OFFSETS["apiserver"])) - PORT_OFFSETS[
                "apiserver"
            ]
            ports = {k: saved_base + off for k, off in PORT_OFFSETS.items()}
            ports.update({k: int(v) for k, v in data["ports"].items()})
            return cls(root=root, ports=ports, disabled=list(data.get("disabled", [])), service_cidr=cidr)
        return cls(root=root, ports=defaults, service_cidr=cidr)

    def save(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        data = {
            "ports": self.ports,
            "versions": {n: b.version for n, b in BINARIES.items()},
            "disabled": self.disabled,
            "serviceCIDR": self.service_cidr,
        }
        (self.root / "cluster.json").write_text(json.dumps(data, indent=2) + "\n")

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    def component_kubeconfig(self, name: str) -> Path:
        return self.root / "kubeconfigs" / f"{name}.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['etcd-client']}"

    def log_file(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def pid_file(self, name: str) -> Path:
        return self.root / "run" / f"{name}.pid"

    def data_dir(self, name: str) -> Path:
        return self.root / "data" / name

    @property
    def prometheus_dir(self) -> Path:
        """Generated Prometheus config and the file_sd directory for vLLM targets."""
        return self.root / "prometheus"

    @property
    def vllm_targets_dir(self) -> Path:
        return self.prometheus_dir / "vllm-targets"

    @property
    def extra_targets_dir(self) -> Path:
        """file_sd directory of the ``extra`` scrape job (targets may set their own ``job`` label)."""
        return self.prometheus_dir / "extra-targets"

    @property
    def prometheus_rules_dir(self) -> Path:
        """Prometheus rule files (``*.yaml``), loaded at start and on ``POST <url>/-/reload``."""
        return self.prometheus_dir / "rules"

    @property
    def hub_url(self) -> str:
        """The local Hub-shaped server: point HF_ENDPOINT here to resolve the tiny models' ids."""
        return f"http://127.0.0.1:{self.ports['hub']}"

    @property
    def pod_bridge(self) -> Bridge:
        """The process kubelet's pod bridge; its gateway address is where pods reach the host (the hub, S3)."""
        return Bridge.for_port_base(int(self.ports["apiserver"]) - PORT_OFFSETS["apiserver"])

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['prometheus']}"


def parse_service_cidr(value: str) -> str:
    """A Service range the cluster can use: IPv4 10.0.0.0/N with 12 <= N <= 28, so that its first address is
    SERVICE_IP, which the API server's certificate names."""
    try:
        network = ipaddress.ip_network(value.strip(), strict=True)
    except ValueError as exc:
        raise ClusterError(f"LLM_AUTOPILOT_SERVICE_CIDR={value!r} is not a CIDR: {exc}") from exc
    if network.version != 4 or str(network.network_address) != "10.0.0.0" or not 12 <= network.prefixlen <= 28:
        raise ClusterError(f"LLM_AUTOPILOT_SERVICE_CIDR={value!r}: use 10.0.0.0/N with N from 12 to 28 (the "
                           f"kubernetes Service must keep {SERVICE_IP}, which the API server's certificate names)")
    return str(network)


def _service_cidr(saved: dict[str, object] | None, root: Path) -> str:
    """The saved range while etcd holds data made with it, else the environment's (or the default)."""
    wanted = os.environ.get("LLM_AUTOPILOT_SERVICE_CIDR")
    if saved is not None and (root / "data" / "etcd").exists():
        kept = str(saved.get("serviceCIDR", LEGACY_SERVICE_CIDR))
        if wanted and parse_service_cidr(wanted) != kept:
            log(f"LLM_AUTOPILOT_SERVICE_CIDR={wanted} ignored: {root} keeps {kept}, which its etcd data was made "
                "with (`cluster.py down` first for a fresh cluster)")
        return kept
    return parse_service_cidr(os.environ.get("LLM_AUTOPILOT_SERVICE_CIDR", DEFAULT_SERVICE_CIDR))
