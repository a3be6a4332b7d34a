"""Pod networking for the process kubelet: a network namespace per pod on a host bridge, like a CNI plugin.

Each pod gets its own namespace (so every vLLM listens on the port its Deployment names, 8000, as in a
cluster) with a veth pair onto a bridge on the host; the host reaches pod IPs directly, which is how the
kubelet probes them and Prometheus scrapes them. Names derive from the cluster's port base, so two
clusters on one machine do not share a bridge or a subnet. Needs root and iproute2 (``ip``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import shutil
import subprocess

from .paths import ClusterError


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise ClusterError(f"ip {' '.join(args)}: {result.stderr.strip() or result.returncode}")
    return result


@dataclasses.dataclass(frozen=True)
class Bridge:
    """The host side: one bridge and one /16 per cluster."""

    name: str
    subnet: ipaddress.IPv4Network

    @classmethod
    def for_port_base(cls, port_base: int) -> Bridge:
        block = (port_base // 100) % 100  # 26400 -> 64: 10.214.0.0/16
        return cls(f"llmab{port_base}"[:15], ipaddress.IPv4Network(f"10.{150 + block}.0.0/16"))

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        return self.subnet.network_address + 1

    def free_address(self, taken: set[ipaddress.IPv4Address]) -> ipaddress.IPv4Address:
        """The lowest pod address not in use (the gateway is the bridge's own)."""
        for address in self.subnet.hosts():
            if address != self.gateway and address not in taken:
                return address
        raise ClusterError(f"no free pod address left in {self.subnet}")

    @property
    def prefix(self) -> str:
        """What every pod namespace and host veth of this cluster is named after."""
        return f"p{self.name.removeprefix('llmab')}"

    def ensure(self) -> None:
        if shutil.which("ip") is None:
            raise ClusterError("`ip` (iproute2) is not installed: apt-get install -y iproute2")
        if _ip("link", "show", self.name, check=False).returncode != 0:
            _ip("link", "add", self.name, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.name)
        _ip("link", "set", self.name, "up")

    def remove(self) -> None:
        """The bridge and every pod namespace and veth of this cluster (after a crash, too)."""
        for namespace in _ip("netns", "list", check=False).stdout.split("\n"):
            name = namespace.split(" ", 1)[0]
            if name.startswith(self.prefix + "-"):
                _ip("netns", "delete", name, check=False)
        if _ip("link", "show", self.name, check=False).returncode == 0:
            _ip("link", "delete", self.name, check=False)


@dataclasses.dataclass(frozen=True)
class PodNetwork:
    """One pod's namespace, veth pair and address; ``setup`` and ``teardown`` are idempotent."""

    bridge: Bridge
    uid: str
    ip: ipaddress.IPv4Address

    @property
    def _short(self) -> str:
        return hashlib.sha256(self.uid.encode()).hexdigest()[:8]

    @property
    def namespace(self) -> str:
        return f"{self.bridge.prefix}-{self._short}"

    @property
    def host_veth(self) -> str:
        return f"vh{self._short}"

    def setup(self) -> None:
        if _ip("netns", "list", check=False).stdout.find(self.namespace) < 0:
            _ip("netns", "add", self.namespace)
        inside = ["netns", "exec", self.namespace, "ip"]
        _ip(*inside, "link", "set", "lo", "up")
        if _ip("link", "show", self.host_veth, check=False).returncode != 0:
            _ip("link", "add", self.host_veth, "type", "veth", "peer", "name", "eth0", "netns", self.namespace)
        _ip("link", "set", self.host_veth, "master", self.bridge.name)
        _ip("link", "set", self.host_veth, "up")
        address = f"{self.ip}/{self.bridge.subnet.prefixlen}"
        if address not in _ip(*inside, "-4", "addr", "show", "eth0").stdout:
            _ip(*inside, "addr", "add", address, "dev", "eth0")
        _ip(*inside, "link", "set", "eth0", "up")
        _ip(*inside, "route", "replace", "default", "via", str(self.bridge.gateway))

    def exec_prefix(self) -> list[str]:
        """Prefix of a command that runs inside the pod's network namespace."""
        return ["ip", "netns", "exec", self.namespace]

    def teardown(self) -> None:
        _ip("netns", "delete", self.namespace, check=False)  # takes eth0 and so its host peer along
        _ip("link", "delete", self.host_veth, check=False)
