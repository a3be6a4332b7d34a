"""AWS Signature Version 4 for header-signed requests. Pure: hashlib and hmac only.

Follows https://docs.aws.amazon.com/IAM/latest/UserGuide/create-signed-request.html: the canonical request,
the string to sign, the derived signing key and the ``Authorization`` header. Checked against AWS's published
examples in tests/unit/test_storage.py.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

ALGORITHM = "AWS4-HMAC-SHA256"
#: the SHA-256 of an empty body (every GET and HEAD)
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True)
class Credentials:
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None


_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~")


def _uri_encode(text: str, *, keep_slash: bool) -> str:
    """RFC 3986 unreserved characters stay; every other UTF-8 byte is %XX with upper-case hex."""
    return "".join(chr(b) if b in _UNRESERVED or (keep_slash and b == 0x2F) else f"%{b:02X}"
                   for b in text.encode())


def canonical_query(query: Mapping[str, str]) -> str:
    pairs = sorted((_uri_encode(k, keep_slash=False), _uri_encode(v, keep_slash=False)) for k, v in query.items())
    return "&".join(f"{k}={v}" for k, v in pairs)


def _canonical_headers(headers: Mapping[str, str]) -> tuple[str, str]:
    folded: dict[str, str] = {}
    for name, value in headers.items():
        folded[name.strip().lower()] = " ".join(value.strip().split())
    names = sorted(folded)
    return "".join(f"{n}:{folded[n]}\n" for n in names), ";".join(names)


def canonical_request(method: str, path: str, query: Mapping[str, str], headers: Mapping[str, str],
                      payload_sha256: str, *, encode_path: bool = True) -> tuple[str, str]:
    """(canonical request, signed header names). S3 encodes each path segment once (``encode_path``)."""
    canonical_headers, signed = _canonical_headers(headers)
    uri = _uri_encode(path or "/", keep_slash=True) if encode_path else (path or "/")
    return "\n".join([method.upper(), uri, canonical_query(query), canonical_headers, signed,
                      payload_sha256]), signed


def amz_date(when: datetime) -> str:
    return when.strftime("%Y%m%dT%H%M%SZ")


def scope(when: datetime, region: str, service: str) -> str:
    return f"{when.strftime('%Y%m%d')}/{region}/{service}/aws4_request"


def string_to_sign(request: str, when: datetime, region: str, service: str) -> str:
    return "\n".join([ALGORITHM, amz_date(when), scope(when, region, service),
                      hashlib.sha256(request.encode()).hexdigest()])


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def signing_key(secret_access_key: str, when: datetime, region: str, service: str) -> bytes:
    key = _hmac(f"AWS4{secret_access_key}".encode(), when.strftime("%Y%m%d"))
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    return key


def authorization(credentials: Credentials, method: str, path: str, query: Mapping[str, str],
                  headers: Mapping[str, str], payload_sha256: str, when: datetime, region: str,
                  service: str = "s3") -> str:
    """The ``Authorization`` header for a request whose headers (Host and X-Amz-Date included) are given."""
    request, signed = canonical_request(method, path, query, headers, payload_sha256)
    signature = hmac.new(signing_key(credentials.secret_access_key, when, region, service),
                         string_to_sign(request, when, region, service).encode(), hashlib.sha256).hexdigest()
    return (f"{ALGORITHM} Credential={credentials.access_key_id}/{scope(when, region, service)}, "
            f"SignedHeaders={signed}, Signature={signature}")


def signed_headers(credentials: Credentials, method: str, host: str, path: str, query: Mapping[str, str],
                   when: datetime, region: str, extra: Mapping[str, str] | None = None,
                   payload_sha256: str = EMPTY_SHA256) -> dict[str, str]:
    """Every header an S3 request sends: Host, X-Amz-Date, X-Amz-Content-Sha256, the token, Authorization."""
    headers = {"host": host, "x-amz-date": amz_date(when), "x-amz-content-sha256": payload_sha256,
               **{k.lower(): v for k, v in (extra or {}).items()}}
    if credentials.session_token:
        headers["x-amz-security-token"] = credentials.session_token
    headers["authorization"] = authorization(credentials, method, path, query, headers, payload_sha256, when,
                                             region)
    return headers
