"""KEDA in the local cluster: pinned like the other binaries, loopback only, its ports inside the block."""

from __future__ import annotations

import re
from pathlib import Path

from hack.localcluster import keda
from hack.localcluster.binaries import BINARIES, KEDA_MODULE, KEDA_VERSION, TOOLS_DIR, check_wrapper_pin
from hack.localcluster.components import COMPONENTS
from hack.localcluster.state import PORT_OFFSETS, Cluster


def cluster(tmp_path: Path) -> Cluster:
    return Cluster(root=tmp_path, ports={k: 27000 + v for k, v in PORT_OFFSETS.items()})


def test_both_keda_binaries_come_from_the_pinned_wrapper() -> None:
    for name in ("keda-operator", "keda-adapter"):
        binary = BINARIES[name]
        assert binary.version == KEDA_VERSION and binary.package.startswith(f"{KEDA_MODULE}/cmd/")
        assert check_wrapper_pin(binary) == TOOLS_DIR / "keda"
    gomod = (TOOLS_DIR / "keda" / "go.mod").read_text()
    # KEDA's own replace, which only its main module would see, is repeated in the wrapper
    assert re.search(r"github.com/nexus-rpc/nexus-proto-annotations => github.com/nexus-rpc/nexus-proto-annotations v",
                     gomod)
    tools = (TOOLS_DIR / "keda" / "tools.go").read_text()
    assert f'"{KEDA_MODULE}/cmd/operator"' in tools and f'"{KEDA_MODULE}/cmd/adapter"' in tools


def test_keda_listens_on_loopback_in_its_own_port_block(tmp_path: Path) -> None:
    c = cluster(tmp_path)
    components = {comp.name: comp for comp in COMPONENTS}
    ports = [c.ports[key] for name in ("keda-operator", "keda-adapter") for key in components[name].ports]
    assert len(set(ports)) == len(ports) == 5 and all(27000 <= p < 27100 for p in ports)
    assert len(set(PORT_OFFSETS.values())) == len(PORT_OFFSETS)  # no component shares a port
    for arg in keda.operator_args(c):
        if "address" in arg:
            assert "=127.0.0.1:" in arg, arg
    adapter = keda.adapter_args(c)
    assert "--bind-address=127.0.0.1" in adapter and f"--secure-port={c.ports['keda-adapter']}" in adapter
    assert f"--metrics-service-address=127.0.0.1:{c.ports['keda-metrics-service']}" in keda.adapter_args(c)
    assert components["keda-operator"].optional and components["keda-adapter"].optional
    env = keda.process_env(c)
    assert env["WATCH_NAMESPACE"] == "" and env["KUBECONFIG"] == str(c.kubeconfig)
    # KEDA starts after Prometheus, which it queries, and the operator before the adapter, which dials it
    order = [comp.name for comp in COMPONENTS]
    assert order.index("prometheus") < order.index("keda-operator") < order.index("keda-adapter")
