"""The control plane's components as a table (``COMPONENTS``, started in order) and their arguments.

To add one: write its ``*_args`` function, give it a health check and the ``PORT_OFFSETS`` keys it listens
on, and append it to ``COMPONENTS``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from . import keda, local_path, s3, vllm_cpu
from .api import Api, http_ok
from .binaries import BINARIES
from .kubelet import cleanup_host
from .paths import HACK_DIR, ClusterError, log
from .state import NODE_IP, POD_CIDR, Cluster

STAGES_FILE = HACK_DIR / "kwok" / "stages.yaml"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"


# Prometheus comes from Debian (`apt-get install -y prometheus`, 2.42), not
# from a Go build: its web UI assets make a module build impractical.
PROMETHEUS_BINARY = Path("/usr/bin/prometheus")
PROMTOOL_BINARY = Path("/usr/bin/promtool")
PROMETHEUS_SCRAPE_SECONDS = 2
PROMETHEUS_RETENTION = "6h"
VLLM_TARGETS_REFRESH = "5s"
CONTROLLER_MANAGER_QPS = 200


def etcd_args(c: Cluster) -> list[str]:
    peer = f"http://127.0.0.1:{c.ports['etcd-peer']}"
    return [
        "--name=llm-autopilot",
        f"--data-dir={c.data_dir('etcd')}",
        f"--listen-client-urls={c.etcd_url}",
        f"--advertise-client-urls={c.etcd_url}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=llm-autopilot={peer}",
        "--initial-cluster-state=new",
        "--auto-compaction-retention=1",
        "--quota-backend-bytes=2147483648",
        "--unsafe-no-fsync=true",  # throwaway test data: trade durability for speed
        "--log-level=warn",
    ]


def apiserver_args(c: Cluster) -> list[str]:
    pki = c.pki
    return [
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={c.ports['apiserver']}",
        f"--etcd-servers={c.etcd_url}",
        f"--cert-dir={c.data_dir('kube-apiserver')}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--authorization-mode=RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={c.service_cidr}",
        "--allow-privileged=true",
        # The lease reconciler would publish 127.0.0.1 as the endpoint of the
        # `kubernetes` Service, which endpoint validation rejects (loopback).
        "--endpoint-reconciler-type=none",
        # kwok's fake kubelet endpoint (logs/exec) is on loopback too.
        "--kubelet-preferred-address-types=InternalIP",
        f"--kubelet-certificate-authority={pki / 'ca.crt'}",
        f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
        f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
        "--profiling=false",
    ]


def controller_manager_args(c: Cluster) -> list[str]:
    kc = c.component_kubeconfig("controller-manager")
    return [
        f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1",
        f"--secure-port={c.ports['controller-manager']}",
        f"--cert-dir={c.data_dir('kube-controller-manager')}",
        "--leader-elect=false",
        "--controllers=*",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={c.pki / 'sa.key'}",
        f"--root-ca-file={c.pki / 'ca.crt'}",
        f"--cluster-signing-cert-file={c.pki / 'ca.crt'}",
        f"--cluster-signing-key-file={c.pki / 'ca.key'}",
        f"--service-cluster-ip-range={c.service_cidr}",
        # The garbage collector deletes an LLMDeployment's Deployment, ReplicaSet, Service and PodDisruptionBudget
        # with the controller-manager's client, whose default 20 requests/s (burst 30) made deleting 1,000
        # LLMDeployments take minutes (tests/bench/bench_scale.py); a real control plane is sized by its operator.
        f"--kube-api-qps={CONTROLLER_MANAGER_QPS}",
        f"--kube-api-burst={2 * CONTROLLER_MANAGER_QPS}",
        "--profiling=false",
    ]


def scheduler_args(c: Cluster) -> list[str]:
    kc = c.component_kubeconfig("scheduler")
    config = c.root / "kube-scheduler.yaml"
    config.write_text(
        "apiVersion: kubescheduler.config.k8s.io/v1\n"
        "kind: KubeSchedulerConfiguration\n"
        f"clientConnection:\n  kubeconfig: {kc}\n"
        "leaderElection:\n  leaderElect: false\n"
    )
    return [
        f"--config={config}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1",
        f"--secure-port={c.ports['scheduler']}",
        f"--cert-dir={c.data_dir('kube-scheduler')}",
        "--profiling=false",
    ]


def kwok_args(c: Cluster) -> list[str]:
    port = c.ports["kwok"]
    return [
        f"--kubeconfig={c.kubeconfig}",
        f"--config={STAGES_FILE}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
        f"--cidr={POD_CIDR}",
        f"--node-ip={NODE_IP}",
        f"--node-port={port}",
        f"--server-address=127.0.0.1:{port}",  # default would be 0.0.0.0
        f"--tls-cert-file={c.pki / 'kwok.crt'}",
        f"--tls-private-key-file={c.pki / 'kwok.key'}",
        "--node-lease-duration-seconds=40",
    ]


def kube_state_metrics_args(c: Cluster) -> list[str]:
    return [
        f"--kubeconfig={c.kubeconfig}",
        "--host=127.0.0.1",  # default would be ::
        f"--port={c.ports['kube-state-metrics']}",
        "--telemetry-host=127.0.0.1",
        f"--telemetry-port={c.ports['kube-state-metrics-telemetry']}",
        # kube_node_labels with the GFD labels, kube_pod_labels, ...
        "--metric-labels-allowlist=nodes=[*],pods=[*],deployments=[*]",
    ]


def prometheus_config(c: Cluster) -> str:
    """prometheus.yml: kube-state-metrics and the file_sd-listed vLLM pods, every 2 s.

    A vLLM target in ``<state>/prometheus/vllm-targets/*.json`` looks like
    ``{"targets": ["127.0.0.1:PORT"], "labels": {"namespace": NS, "pod": POD,
    "__metrics_path__": "/metrics/NS/POD"}}``: the ``namespace``/``pod``
    target labels are what a ServiceMonitor's standard relabelling gives, so
    queries written for a real cluster work unchanged (extra labels, e.g. the
    PodMonitor's ``llmdeployment``, can be set per pod by the simulator).

    Job ``extra`` scrapes whatever ``<state>/prometheus/extra-targets/*.json``
    lists; a target group may set ``job`` (and ``namespace``, ...) itself, as
    target-group labels win over the job name, e.g.
    ``{"targets": ["127.0.0.1:PORT"], "labels": {"job": "llm-autopilot",
    "namespace": "llm-autopilot-system"}}`` for an operator's /metrics.

    Rules: every ``<state>/prometheus/rules/*.yaml`` (evaluated every 2 s).
    Prometheus reads them at start; after adding, changing or removing a
    file, ``POST <prometheus url>/-/reload`` (``--web.enable-lifecycle``)
    loads the new set, and ``GET /api/v1/rules`` shows each group's health.
    """
    every = f"{PROMETHEUS_SCRAPE_SECONDS}s"
    cfg = {
        "global": {"scrape_interval": every, "scrape_timeout": every, "evaluation_interval": every},
        "scrape_configs": [
            {
                "job_name": "kube-state-metrics",
                "scrape_interval": every,
                "scrape_timeout": every,
                "honor_labels": True,  # keep KSM's own namespace/pod/container labels
                "static_configs": [{"targets": [f"127.0.0.1:{c.ports['kube-state-metrics']}"]}],
            },
            {
                "job_name": "vllm",
                "scrape_interval": every,
                "scrape_timeout": every,
                "file_sd_configs": [
                    {"files": [str(c.vllm_targets_dir / "*.json")], "refresh_interval": VLLM_TARGETS_REFRESH}
                ],
            },
            {
                "job_name": "extra",
                "scrape_interval": every,
                "scrape_timeout": every,
                "file_sd_configs": [
                    {"files": [str(c.extra_targets_dir / "*.json")], "refresh_interval": VLLM_TARGETS_REFRESH}
                ],
            },
        ],
        "rule_files": [str(c.prometheus_rules_dir / "*.yaml")],
    }
    # JSON is valid YAML; Prometheus reads it as its YAML config.
    return "# generated by hack/cluster.py; rewritten on every start\n" + json.dumps(cfg, indent=2) + "\n"


def prepare_prometheus(c: Cluster) -> None:
    """Write prometheus.yml (validated by promtool) and create the file_sd and rules dirs."""
    c.vllm_targets_dir.mkdir(parents=True, exist_ok=True)
    c.extra_targets_dir.mkdir(parents=True, exist_ok=True)
    c.prometheus_rules_dir.mkdir(parents=True, exist_ok=True)
    c.data_dir("prometheus").mkdir(parents=True, exist_ok=True)
    config = c.prometheus_dir / "prometheus.yml"
    config.write_text(prometheus_config(c))
    if PROMTOOL_BINARY.exists():
        check = subprocess.run(
            [str(PROMTOOL_BINARY), "check", "config", str(config)], capture_output=True, text=True, check=False
        )
        if check.returncode != 0:
            raise ClusterError(f"promtool check config {config} failed:\n{check.stdout}{check.stderr}")
    else:
        log(f"prometheus: {PROMTOOL_BINARY} missing, config not validated")


def prometheus_args(c: Cluster) -> list[str]:
    return [
        f"--config.file={c.prometheus_dir / 'prometheus.yml'}",
        f"--storage.tsdb.path={c.data_dir('prometheus')}",
        f"--storage.tsdb.retention.time={PROMETHEUS_RETENTION}",
        f"--web.listen-address=127.0.0.1:{c.ports['prometheus']}",
        "--web.enable-lifecycle",  # POST /-/reload
        # POST /api/v1/admin/tsdb/delete_series: tests drop series left by earlier runs (e.g. counters an
        # alert's increase() window would still see); loopback-only, throwaway data
        "--web.enable-admin-api",
        "--log.level=warn",
    ]


def release_node_leases(c: Cluster) -> None:
    """Delete node Leases left by a previous kwok process.

    kwok's lease holder identity is random per process, so a restarted kwok
    would leave the nodes alone until its predecessor's leases expire (40 s).
    """
    code, body = Api(c).request("DELETE", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")
    if code != 200:
        raise ClusterError(f"deleting stale node leases: {code} {body}")


@dataclasses.dataclass(frozen=True)
class Component:
    """A process of the local cluster; `COMPONENTS` is started in this order.

    To add one (kube-state-metrics, Prometheus, ...): write its `*_args`
    function, give it a health check and the `PORT_OFFSETS` keys it listens
    on, and append it to `COMPONENTS`.
    """

    name: str
    binary: str  # key of BINARIES (built from Go modules), unless `system_binary`
    args: Callable[[Cluster], list[str]]
    healthy: Callable[[Cluster], bool]
    ports: tuple[str, ...]  # keys of Cluster.ports it listens on
    start_timeout: float = 90.0
    before_start: Callable[[Cluster], None] | None = None
    system_binary: Path | None = None  # an OS package's binary instead of a built one
    optional: bool = False  # `up --no-<name>` skips it
    after_stop: Callable[[Cluster], None] | None = None  # cleans up what the process leaves on the host
    stop_grace_seconds: float = 10.0  # SIGTERM, then SIGKILL after this long
    env: Callable[[Cluster], dict[str, str]] | None = None  # added to the process's environment

    @property
    def executable(self) -> Path:
        return self.system_binary if self.system_binary else BINARIES[self.binary].path


def https_healthz(port_key: str) -> Callable[[Cluster], bool]:
    return lambda c: http_ok(f"https://127.0.0.1:{c.ports[port_key]}/healthz")


COMPONENTS: tuple[Component, ...] = (
    Component(
        "etcd",
        "etcd",
        etcd_args,
        lambda c: http_ok(f"{c.etcd_url}/health"),
        ports=("etcd-client", "etcd-peer"),
    ),
    Component(
        "kube-apiserver",
        "kube-apiserver",
        apiserver_args,
        lambda c: Api(c).ok("/readyz"),
        ports=("apiserver",),
        start_timeout=120.0,
    ),
    Component(
        "kube-controller-manager",
        "kube-controller-manager",
        controller_manager_args,
        https_healthz("controller-manager"),
        ports=("controller-manager",),
    ),
    Component(
        "kube-scheduler",
        "kube-scheduler",
        scheduler_args,
        https_healthz("scheduler"),
        ports=("scheduler",),
    ),
    Component(
        "local-path-provisioner",
        "local-path-provisioner",
        lambda c: [str(HACK_DIR / "local_path_provisioner.py"), f"--port={c.ports['local-path-provisioner']}"],
        lambda c: http_ok(f"http://127.0.0.1:{c.ports['local-path-provisioner']}/healthz"),
        ports=("local-path-provisioner",),
        system_binary=Path(sys.executable).resolve(),
        optional=True,
        after_stop=local_path.detach_all,
    ),
    Component(
        "kwok",
        "kwok",
        kwok_args,
        lambda c: http_ok(f"http://127.0.0.1:{c.ports['kwok']}/healthz"),
        ports=("kwok",),
        before_start=release_node_leases,
    ),
    Component(
        "process-kubelet",
        "process-kubelet",
        lambda c: [str(HACK_DIR / "process_kubelet.py"), f"--port={c.ports['process-kubelet']}"],
        lambda c: http_ok(f"https://127.0.0.1:{c.ports['process-kubelet']}/healthz"),
        ports=("process-kubelet",),
        system_binary=Path(sys.executable).resolve(),
        optional=True,
        after_stop=cleanup_host,
        stop_grace_seconds=60.0,  # it stops its pods' containers first, each within its grace period
    ),
    Component(
        "hub",
        "hub",
        # on loopback and on the pod bridge's gateway, where pods reach it (their HF_ENDPOINT)
        lambda c: [str(HACK_DIR / "hub_server.py"), f"--port={c.ports['hub']}", f"--cache={vllm_cpu.models_cache()}",
                   "--listen=127.0.0.1", f"--listen={c.pod_bridge.gateway}"],
        lambda c: http_ok(f"{c.hub_url}/healthz"),
        ports=("hub",),
        system_binary=Path(sys.executable).resolve(),
        optional=True,
    ),
    Component(
        "s3-access-log",
        "s3-access-log",
        s3.access_log_args,
        s3.access_log_healthy,
        ports=(),
        system_binary=Path(sys.executable).resolve(),
        optional=True,
    ),
    Component(
        "seaweedfs",
        "seaweedfs",
        s3.weed_args,
        s3.healthy,
        ports=("seaweedfs-s3", "seaweedfs-s3-grpc", "seaweedfs-master", "seaweedfs-master-grpc", "seaweedfs-volume",
               "seaweedfs-volume-grpc", "seaweedfs-filer", "seaweedfs-filer-grpc", "seaweedfs-admin",
               "seaweedfs-admin-grpc"),
        start_timeout=120.0,
        before_start=s3.prepare,
        optional=True,
        env=s3.process_env,
    ),
    Component(
        "kube-state-metrics",
        "kube-state-metrics",
        kube_state_metrics_args,
        lambda c: http_ok(f"http://127.0.0.1:{c.ports['kube-state-metrics']}/healthz"),
        ports=("kube-state-metrics", "kube-state-metrics-telemetry"),
    ),
    Component(
        "prometheus",
        "prometheus",
        prometheus_args,
        lambda c: http_ok(f"{c.prometheus_url}/-/ready"),
        ports=("prometheus",),
        start_timeout=60.0,
        before_start=prepare_prometheus,
        system_binary=PROMETHEUS_BINARY,
        optional=True,
    ),
    # KEDA: ScaledObjects -> HPAs, and the external metrics API the HPA reads (keda.py)
    Component(
        "keda-operator",
        "keda-operator",
        keda.operator_args,
        keda.operator_healthy,
        ports=("keda-operator-metrics", "keda-operator-probe", "keda-metrics-service"),
        before_start=keda.prepare_operator,
        optional=True,
        env=keda.process_env,
    ),
    Component(
        "keda-adapter",
        "keda-adapter",
        keda.adapter_args,
        keda.adapter_healthy,
        ports=("keda-adapter", "keda-adapter-metrics"),
        start_timeout=120.0,
        before_start=keda.register_metrics_api,
        optional=True,
        env=keda.process_env,
    ),
)
COMPONENT_NAMES = tuple(c.name for c in COMPONENTS)


def component(name: str) -> Component:
    for comp in COMPONENTS:
        if comp.name == name:
            return comp
    raise ClusterError(f"unknown component {name!r}; known: {', '.join(COMPONENT_NAMES)}")


def enabled_components(cluster: Cluster) -> list[Component]:
    return [c for c in COMPONENTS if c.name not in cluster.disabled]


def check_system_binary(comp: Component) -> None:
    if comp.system_binary and not os.access(comp.system_binary, os.X_OK):
        hint = f" (or `up --no-{comp.name}`)" if comp.optional else ""
        raise ClusterError(
            f"{comp.name}: {comp.system_binary} not found. Install it with "
            f"`apt-get install -y {comp.name}`{hint}"
        )
