"""Shell: an httpx transport that resolves a request's host once, checks every address against the egress policy
(domain/egress.py) and connects to the address it checked, so a second lookup cannot answer differently (DNS
rebinding). The Host header and, over TLS, the SNI name and the certificate check stay the URL's host.

Used for the endpoints a spec names (S3 for models and adapters). Redirects are not followed (httpx's default),
and proxies from the environment are not used: the operator connects to what it checked, itself.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from functools import lru_cache

import httpx

from llm_autopilot.domain import egress

#: (host, port) -> every address the host resolves to, as text
Resolver = Callable[[str, int], Sequence[str]]


class EgressRefused(httpx.TransportError):
    """The operator does not connect to this endpoint; the message says why and what opens it."""


def resolve(host: str, port: int) -> list[str]:
    """Every address of ``host`` (one lookup)."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in found))


@lru_cache(maxsize=1)
def _env_allowlist(value: str) -> egress.Allowlist:
    return egress.parse_allowlist(value)


def operator_allowlist() -> egress.Allowlist:
    """The allowlist the operator was started with (checked at start-up by controller/settings.py)."""
    return _env_allowlist(os.environ.get(egress.ALLOW_ENV, ""))


class CheckedTransport(httpx.BaseTransport):
    """Connects only to addresses the policy allows, and to the very address it checked."""

    def __init__(self, allow: egress.Allowlist | None = None, *, field: str = "the endpoint",
                 resolver: Resolver = resolve, inner: httpx.BaseTransport | None = None) -> None:
        self._allow = allow
        self._field = field
        self._resolver = resolver
        self._inner = inner or httpx.HTTPTransport()

    def _address(self, url: httpx.URL) -> str:
        host = url.host
        allow = self._allow if self._allow is not None else operator_allowlist()
        literal = egress.parse_address(host)
        if literal is not None:
            addresses = [str(literal)]
        else:
            try:
                addresses = list(self._resolver(host, url.port or (443 if url.scheme == "https" else 80)))
            except OSError as exc:
                raise httpx.ConnectError(f"cannot resolve {host}: {exc.strerror or exc}") from None
        if not addresses:
            raise httpx.ConnectError(f"cannot resolve {host}: no address")
        for text in addresses:  # one refused answer refuses them all: a rebinding resolver mixes them
            parsed = egress.parse_address(text)
            problem = egress.refusal(host, parsed, allow) if parsed is not None else f"{text!r} is not an address"
            if problem is not None:
                raise EgressRefused(f"{self._field}: {problem}")
        return addresses[0].split("%", 1)[0]

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        address = self._address(request.url)
        if address != host:
            request.url = request.url.copy_with(host=address)
            if request.url.scheme == "https":
                request.extensions = {**request.extensions, "sni_hostname": host}
        # the Host header was set from the URL when the request was built: it still names the host
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()
