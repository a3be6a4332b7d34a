"""One local cluster's state directory and port block (persisted in ``cluster.json``)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from .binaries import BINARIES
from .paths import state_dir

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
    # KEDA (hack/localcluster/keda.py)
    "keda-operator-metrics": 60,
    "keda-operator-probe": 61,
    "keda-metrics-service": 62,  # the operator's gRPC metrics service (mTLS), read by the metrics API server
    "keda-adapter": 63,  # the metrics API server (external.metrics.k8s.io), https
    "keda-adapter-metrics": 64,
}

SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"  # first address of SERVICE_CIDR: the kubernetes svc
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

    @classmethod
    def load(cls, *, fresh: bool = False) -> Cluster:
        """The cluster in the state dir; `fresh` ignores its saved ports."""
        root = state_dir()
        meta = root / "cluster.json"
        base = int(os.environ.get("LLM_AUTOPILOT_PORT_BASE", DEFAULT_PORT_BASE))
        defaults = {k: base + off for k, off in PORT_OFFSETS.items()}
        if meta.exists() and not fresh:
            data = json.loads(meta.read_text())
            # a state dir from before a port key existed gets it from the same base
            saved_base = int(data["ports"].get("apiserver", base + PORT_OFFSETS["apiserver"])) - PORT_OFFSETS[
                "apiserver"
            ]
            ports = {k: saved_base + off for k, off in PORT_OFFSETS.items()}
            ports.update({k: int(v) for k, v in data["ports"].items()})
            return cls(root=root, ports=ports, disabled=list(data.get("disabled", [])))
        return cls(root=root, ports=defaults)

    def save(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        data = {
            "ports": self.ports,
            "versions": {n: b.version for n, b in BINARIES.items()},
            "disabled": self.disabled,
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
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['prometheus']}"
