"""Where the operator's own clients may connect: parse an address in every spelling a resolver accepts, classify
it, and decide against the operator's allowlist. Pure: ipaddress and strings only.

The shell (controller/egress_http.py) resolves a host once, asks :func:`refusal` about every address it got and
connects to the one it checked. A host is an address when ``inet_aton`` would read it as one: ``2852039166``,
``0251.0376.0251.0376``, ``0xa9fe.0xa9fe``, ``127.1`` and ``127.0.0.1.`` all reach a machine without DNS, so they
are classified as the address they spell, never as a name.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import Enum

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: the environment variable (the chart's ``egress.allow``) that names private addresses the operator may reach
ALLOW_ENV = "LLM_AUTOPILOT_EGRESS_ALLOW"
ALLOW_VALUE = "egress.allow"


class Kind(Enum):
    """What an address is, worst first: the first four are never contacted, whatever the allowlist says."""

    UNSPECIFIED = "an unspecified address"
    LINK_LOCAL = "a link-local address (where cloud metadata services answer)"
    MULTICAST = "a multicast address"
    RESERVED = "a reserved address"
    LOOPBACK = "a loopback address"
    PRIVATE = "a private or cluster address"
    PUBLIC = "a public address"


#: refused whatever the allowlist says
NEVER = frozenset({Kind.UNSPECIFIED, Kind.LINK_LOCAL, Kind.MULTICAST, Kind.RESERVED})
_ORDER = list(Kind)
#: never a pod's address the operator reads
_NEVER_A_POD = frozenset({Kind.UNSPECIFIED, Kind.LINK_LOCAL, Kind.MULTICAST, Kind.LOOPBACK})
#: AWS's instance metadata service over IPv6 (Nitro): inside fc00::/7, yet a metadata service
_METADATA_V6 = ipaddress.IPv6Address("fd00:ec2::254")
_THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")  # Linux connects 0.x.y.z to the host itself
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def _ipv4_part(text: str) -> int | None:
    """One dotted part as inet_aton reads it: 0x.. hex, 0.. octal, else decimal."""
    if not text:
        return None
    try:
        if text[:2].lower() == "0x":
            return int(text[2:], 16) if text[2:] else 0
        if len(text) > 1 and text[0] == "0":
            return int(text[1:], 8)
        return int(text, 10) if text.isdigit() else None
    except ValueError:
        return None


def _inet_aton(text: str) -> ipaddress.IPv4Address | None:
    """``a``, ``a.b``, ``a.b.c`` or ``a.b.c.d`` in decimal, octal or hex, the last part filling the rest."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 4 or not all(p.isascii() for p in parts):
        return None
    values = [_ipv4_part(p) for p in parts]
    if any(v is None for v in values):
        return None
    numbers = [v for v in values if v is not None]
    *head, last = numbers
    if any(v > 255 for v in head) or last >= 256 ** (4 - len(head)):
        return None
    value = 0
    for v in head:
        value = value * 256 + v
    return ipaddress.IPv4Address(value * 256 ** (4 - len(head)) + last)


def host_of(url: str) -> str:
    """The host of a URL as written (brackets gone, lower case); "" when it has none."""
    rest = url.partition("://")[2]
    for end in "/?#":
        rest = rest.split(end, 1)[0]
    rest = rest.rpartition("@")[2]  # userinfo
    if rest.startswith("["):
        return rest[1:].partition("]")[0].lower()
    return rest.partition(":")[0].lower()


def parse_address(host: str) -> IPAddress | None:
    """The address ``host`` spells in any form a resolver reads without DNS; None for a name."""
    text = host.strip().lower()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if ":" in text:
        text = text.split("%", 1)[0]  # a zone id (fe80::1%eth0, or %25 in a URL) picks an interface, not a host
        try:
            return ipaddress.IPv6Address(text)
        except ValueError:
            return None
    text = text.removesuffix(".")
    return _inet_aton(text) if text else None


def is_canonical(host: str, address: IPAddress) -> bool:
    """Whether ``host`` writes ``address`` the usual way (a.b.c.d, or an IPv6 address without a zone)."""
    text = host.strip().lower().removeprefix("[").removesuffix("]")
    if isinstance(address, ipaddress.IPv4Address):
        return text == str(address)
    try:
        return "%" not in text and ipaddress.IPv6Address(text) == address
    except ValueError:
        return False


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries: mapped (::ffff:a.b.c.d), compatible (::a.b.c.d), NAT64, 6to4,
    Teredo's client."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    value = int(address)
    if address in _NAT64:
        return ipaddress.IPv4Address(value & 0xFFFFFFFF)
    if value >> 32 == 0 and value > 1:  # IPv4-compatible; :: and ::1 are themselves
        return ipaddress.IPv4Address(value)
    return None


def _kind_of(address: IPAddress) -> Kind:
    if address.is_unspecified or (isinstance(address, ipaddress.IPv4Address) and address in _THIS_NETWORK):
        return Kind.UNSPECIFIED
    if address.is_link_local or address == _METADATA_V6:
        return Kind.LINK_LOCAL
    if address.is_multicast:
        return Kind.MULTICAST
    if address.is_loopback:
        return Kind.LOOPBACK
    if address.is_reserved or address == ipaddress.IPv4Address("255.255.255.255"):
        return Kind.RESERVED
    if not address.is_global:
        return Kind.PRIVATE
    return Kind.PUBLIC


def classify(address: IPAddress) -> Kind:
    """What ``address`` is; an IPv6 address that carries an IPv4 one is the worse of the two."""
    if not isinstance(address, ipaddress.IPv6Address) or (inner := _embedded_ipv4(address)) is None:
        return _kind_of(address)
    if address.ipv4_mapped is not None or int(address) >> 32 == 0 or address in _NAT64:
        # the socket reaches the IPv4 address itself, or DNS64's gateway translates to it (the outer address is
        # "reserved" to Python, yet it is how an IPv6-only cluster reaches any IPv4 store)
        return _kind_of(inner)
    return min((_kind_of(address), _kind_of(inner)), key=_ORDER.index)  # a gateway relays to the IPv4 address


@dataclass(frozen=True)
class Allowlist:
    """The private addresses and hosts the operator may reach (the chart's ``egress.allow``)."""

    networks: tuple[IPNetwork, ...] = ()
    hosts: tuple[str, ...] = ()

    def opens(self, host: str, address: IPAddress, kind: Kind) -> bool:
        if kind in NEVER or kind is Kind.PUBLIC:
            return kind is Kind.PUBLIC
        inner = _embedded_ipv4(address) if isinstance(address, ipaddress.IPv6Address) else None
        candidates = [a for a in (address, inner) if a is not None]
        if kind is Kind.LOOPBACK:  # only an entry that is itself loopback opens it (a local store), not 0.0.0.0/0
            return any(a in n for n in self.networks for a in candidates
                       if n.network_address.is_loopback and n.broadcast_address.is_loopback)
        return (_bare(host) in self.hosts
                or any(a in n for n in self.networks for a in candidates if a.version == n.version))


def _bare(host: str) -> str:
    return host.strip().lower().removeprefix("[").removesuffix("]").removesuffix(".")


class AllowlistError(ValueError):
    """A malformed allowlist entry; the message names it."""


def parse_allowlist(value: str) -> Allowlist:
    """Comma- or space-separated CIDRs (``10.0.0.0/8``), addresses (``10.1.2.3``) and host names."""
    networks: list[IPNetwork] = []
    hosts: list[str] = []
    for entry in value.replace(",", " ").split():
        try:
            networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            continue
        except ValueError:
            pass
        name = _bare(entry)
        if "/" in name or parse_address(name) is not None or not all(
                part and (part.replace("-", "").replace("_", "").isalnum()) for part in name.split(".")):
            raise AllowlistError(f"{ALLOW_ENV}: {entry!r} is neither a CIDR (10.0.0.0/8), an address nor a host "
                                 "name")
        hosts.append(name)
    return Allowlist(tuple(networks), tuple(hosts))


def refusal(host: str, address: IPAddress, allow: Allowlist) -> str | None:
    """Why the operator does not connect to ``address`` (what ``host`` resolved to); None when it may."""
    kind = classify(address)
    if allow.opens(host, address, kind):
        return None
    shown = f"{host} resolves to {address}" if _bare(host) != str(address) else f"{address}"
    if kind in NEVER:
        return f"{shown}, {kind.value}: the operator never connects there"
    return (f"{shown}, {kind.value}: the operator connects there only when its allowlist names it "
            f"(the Helm value {ALLOW_VALUE}, the environment variable {ALLOW_ENV})")


def endpoint_problem(url: str) -> str | None:
    """What the webhook can tell about an endpoint URL without the allowlist or DNS: an address spelled other
    than a.b.c.d, or one the operator never connects to (metadata, link-local, unspecified, multicast,
    reserved). Loopback, private and names are decided where the operator connects."""
    host = host_of(url)
    if not host:
        return f"{url!r} has no host"
    address = parse_address(host)
    if address is None:
        return None
    if not is_canonical(host, address):
        return (f"the host {host!r} is the address {address} spelled another way: write {address} (or a name), "
                "so that what is checked is what is contacted")
    kind = classify(address)
    if kind in NEVER:
        return f"{address} is {kind.value}: the operator never connects there; give the store's own address"
    return None


def pod_address_problem(address: str) -> str | None:
    """A vLLM pod's IP (status.podIP, written by the kubelet) the operator may read: an address written plainly,
    private by design (pods are in-cluster), never loopback, link-local (metadata), unspecified or multicast."""
    parsed = parse_address(address)
    if parsed is None or not is_canonical(address, parsed):
        return f"the pod IP {address!r} is not an address"
    kind = classify(parsed)
    # a reserved range is allowed: GKE gives pods Class E addresses (240.0.0.0/4)
    if kind in _NEVER_A_POD:
        return f"the pod IP {address} is {kind.value}: not read"
    return None

