"""Bringing the whole local cluster up and down: ``up``, ``down``, ``status``, ``env``, one component."""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence

from . import s3
from .api import Api
from .binaries import BINARIES, build
from .components import COMPONENTS, Component, check_system_binary, component, enabled_components
from .nodes import create_nodes, node_ready, process_nodes_registered
from .paths import ClusterError, fmt_duration, log
from .pki import CLIENT_IDENTITIES, ensure_pki, write_kubeconfig
from .process import check_ports_free, read_pid, start_component, stop_pid, wait_for, wait_healthy
from .state import Cluster

UNHEALTHY_GRACE_SECONDS = 15.0  # before `up` restarts a running, unhealthy component


def up(with_nodes: bool, disabled: Sequence[str] = ()) -> None:
    start = time.monotonic()
    cluster = Cluster.load()
    cluster.disabled = list(disabled)
    wanted = enabled_components(cluster)
    for comp in wanted:
        check_system_binary(comp)
    running = [c for c in COMPONENTS if read_pid(cluster, c) and c.healthy(cluster)]
    if all(c in running for c in wanted):
        log(f"cluster is already up at {cluster.server} (state {cluster.root})")
        cluster.save()
        if with_nodes:
            create_nodes(Api(cluster))
        print(f"export KUBECONFIG={cluster.kubeconfig}")
        return
    if not running:  # nothing runs: take ports from the environment again
        cluster = Cluster.load(fresh=True)
        cluster.disabled = list(disabled)
    build(sorted({c.binary for c in wanted if not c.system_binary} | {"kubectl"}))
    cluster.save()
    for sub in ("logs", "run", "kubeconfigs", "data"):
        (cluster.root / sub).mkdir(parents=True, exist_ok=True)
    ensure_pki(cluster.pki)
    write_kubeconfig(cluster.kubeconfig, cluster.server, cluster.pki, "admin", "llm-autopilot-admin")
    for name, (cert, subject) in CLIENT_IDENTITIES.items():
        user = subject.rsplit("CN=", 1)[1]
        write_kubeconfig(cluster.component_kubeconfig(name), cluster.server, cluster.pki, cert, user)
    for comp in wanted:
        if comp in running:
            log(f"{comp.name}: already running (pid {read_pid(cluster, comp)})")
            continue
        stale = read_pid(cluster, comp)
        if stale and not wait_healthy(cluster, comp, UNHEALTHY_GRACE_SECONDS):
            log(f"{comp.name}: running but unhealthy for {UNHEALTHY_GRACE_SECONDS:.0f}s, restarting it")
            stop_pid(comp.name, stale, comp.stop_grace_seconds)
        elif stale:
            log(f"{comp.name}: running (pid {stale})")
            continue
        check_ports_free(cluster, comp)
        if comp.before_start:
            comp.before_start(cluster)
        start_component(cluster, comp)
    api = Api(cluster)
    wait_for("namespace default", lambda: api.ok("/api/v1/namespaces/default"), 60)
    wait_for(
        "serviceaccount default/default",
        lambda: api.ok("/api/v1/namespaces/default/serviceaccounts/default"),
        90,
    )
    if with_nodes:
        create_nodes(api)
    if "process-kubelet" not in cluster.disabled:
        wait_for("vllm-cpu nodes registered by the process kubelet", lambda: process_nodes_registered(api), 60)
    if "prometheus" not in cluster.disabled:
        log(f"prometheus: {cluster.prometheus_url} (vLLM file_sd targets: {cluster.vllm_targets_dir})")
    log(f"cluster up in {fmt_duration(time.monotonic() - start)}; KUBECONFIG={cluster.kubeconfig}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")


def down(keep: bool) -> None:
    cluster = Cluster.load()
    for comp in reversed(COMPONENTS):
        stop_component(cluster, comp)
    if not keep and cluster.root.exists():
        shutil.rmtree(cluster.root)
        log(f"removed {cluster.root}")
    elif keep:
        log(f"kept state in {cluster.root}")


def status() -> int:
    cluster = Cluster.load()
    if not (cluster.root / "cluster.json").exists():
        print(f"no cluster state in {cluster.root}")
        return 1
    all_ok = True
    for comp in COMPONENTS:
        pid = read_pid(cluster, comp)
        if pid is None and comp.name in cluster.disabled:
            state = "disabled"
        elif pid is None:
            state, all_ok = "stopped", False
        elif comp.healthy(cluster):
            state = "healthy"
        else:
            state, all_ok = "unhealthy", False
        print(f"{comp.name:<24} {state:<10} pid={pid or '-':<8} log={cluster.log_file(comp.name)}")
    apiserver = next(c for c in COMPONENTS if c.name == "kube-apiserver")
    if read_pid(cluster, apiserver):
        api = Api(cluster)
        try:
            _, version = api.request("GET", "/version")
            _, nodes = api.request("GET", "/api/v1/nodes")
        except OSError as err:
            print(f"{'api':<24} {cluster.server} unreachable: {err}")
        else:
            items = nodes.get("items", []) if isinstance(nodes, dict) else []
            ready = sum(1 for n in items if node_ready(n))
            git = version.get("gitVersion") if isinstance(version, dict) else version
            print(f"{'api':<24} {cluster.server} version={git} nodes={ready}/{len(items)} Ready")
    print(f"{'kubeconfig':<24} {cluster.kubeconfig}")
    if "prometheus" not in cluster.disabled:
        print(f"{'prometheus url':<24} {cluster.prometheus_url}")
        print(f"{'vllm targets (file_sd)':<24} {cluster.vllm_targets_dir}")
        print(f"{'extra targets (file_sd)':<24} {cluster.extra_targets_dir}")
        print(f"{'prometheus rules':<24} {cluster.prometheus_rules_dir} (POST {cluster.prometheus_url}/-/reload)")
    return 0 if all_ok else 1


def env() -> None:
    cluster = Cluster.load()
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    print(f"export PATH={BINARIES['kubectl'].path.parent}:$PATH")
    if "prometheus" not in cluster.disabled:
        print(f"export LLM_AUTOPILOT_PROMETHEUS_URL={cluster.prometheus_url}")
        print(f"export LLM_AUTOPILOT_VLLM_TARGETS_DIR={cluster.vllm_targets_dir}")
        print(f"export LLM_AUTOPILOT_EXTRA_TARGETS_DIR={cluster.extra_targets_dir}")
        print(f"export LLM_AUTOPILOT_PROMETHEUS_RULES_DIR={cluster.prometheus_rules_dir}")
    if "hub" not in cluster.disabled:
        print(f"export LLM_AUTOPILOT_LOCAL_HUB={cluster.hub_url}")
        print(f"export LLM_AUTOPILOT_HUB_LOG={cluster.log_file('hub')}")
    if "seaweedfs" not in cluster.disabled:
        for line in s3.env_lines(cluster):
            print(line)


def stop_one(name: str) -> None:
    """Stop one component (e.g. Prometheus, to simulate an outage); state is kept."""
    cluster = Cluster.load()
    comp = component(name)
    if not read_pid(cluster, comp):
        log(f"{comp.name}: not running")
    stop_component(cluster, comp)


def stop_component(cluster: Cluster, comp: Component) -> None:
    pid = read_pid(cluster, comp)
    if pid:
        stop_pid(comp.name, pid, comp.stop_grace_seconds)
    cluster.pid_file(comp.name).unlink(missing_ok=True)
    if comp.after_stop and cluster.root.exists():
        comp.after_stop(cluster)


def start_one(name: str) -> None:
    """Start one stopped component again and wait until it is healthy."""
    cluster = Cluster.load()
    comp = component(name)
    if not (cluster.root / "cluster.json").exists():
        raise ClusterError(f"no cluster state in {cluster.root}: run `cluster.py up` first")
    check_system_binary(comp)
    pid = read_pid(cluster, comp)
    if pid and comp.healthy(cluster):
        log(f"{comp.name}: already running (pid {pid})")
        return
    if pid:
        log(f"{comp.name}: running but unhealthy, restarting it")
        stop_pid(comp.name, pid, comp.stop_grace_seconds)
    if comp.name in cluster.disabled:
        cluster.disabled.remove(comp.name)
        cluster.save()
    check_ports_free(cluster, comp)
    if comp.before_start:
        comp.before_start(cluster)
    start_component(cluster, comp)
