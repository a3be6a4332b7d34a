"""Where a model's files live: ``hf://org/name``, ``pvc://claim/path`` or ``s3://bucket/prefix``. Pure.

The URI scheme follows KServe's ``storageUri`` (``hf://``, ``pvc://``, ``s3://``), so manifests read the same.
Each parse error is one line that says what a valid URI looks like.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llm_autopilot.api import kubernetes_rules as rules

SCHEMES = ("hf", "pvc", "s3")
#: an S3 bucket name (the rules of AWS's general purpose buckets, which S3-compatible stores share)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_IP_FORMAT = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")
_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
#: S3's longest key, and the longest file name under a prefix the operator reads (model.safetensors.index.json)
_KEY_MAX = 1024
_LONGEST_FILE = len("model.safetensors.index.json")
_SEGMENT_CHARS = re.compile(r"^[A-Za-z0-9._~+=,@:-]+$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class HubSource:
    repo: str

    @property
    def uri(self) -> str:
        return f"hf://{self.repo}"


@dataclass(frozen=True)
class PVCSource:
    claim: str
    #: a relative folder inside the volume ("" for its root)
    path: str

    @property
    def uri(self) -> str:
        return f"pvc://{self.claim}/{self.path}".rstrip("/")


@dataclass(frozen=True)
class S3Source:
    bucket: str
    #: the key prefix of the model's folder, without a trailing '/' ("" for the whole bucket)
    prefix: str

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def key(self, filename: str) -> str:
        return f"{self.prefix}/{filename}" if self.prefix else filename


Source = HubSource | PVCSource | S3Source


class SourceError(ValueError):
    """Not a model source URI; the message says what one looks like."""


_FORMS = "hf://org/name, pvc://claim/path or s3://bucket/prefix"


def _path_problem(path: str, what: str) -> str | None:
    """A relative path of plain segments: no '..', no empty segment, no control characters or spaces."""
    if not path:
        return None
    for segment in path.split("/"):
        if segment in ("", ".", ".."):
            return f"{what} {path!r} must be a relative path without empty, '.' or '..' segments"
        if not _SEGMENT_CHARS.match(segment):
            return (f"{what} {path!r}: segment {segment!r} may only hold letters, digits and . _ ~ + = , @ : -")
    return None


def _hub(rest: str, uri: str) -> HubSource:
    org, _, name = rest.partition("/")
    if (_HUB_ID.match(rest) and ".." not in rest and "--" not in rest and len(name) <= 96
            and all(part[0] not in ".-" and part[-1] not in ".-" for part in (org, name))):
        return HubSource(rest)
    raise SourceError(f"{uri!r} is not a Hugging Face Hub source: hf://org/name, e.g. hf://Qwen/Qwen3-8B")


def _pvc(rest: str, uri: str) -> PVCSource:
    claim, _, path = rest.partition("/")
    path = path.rstrip("/")
    if not claim or rules.subdomain_problem(claim) is not None:
        raise SourceError(f"{uri!r}: {claim!r} is not a PersistentVolumeClaim name (lower-case letters, digits, "
                          "'-' and '.'); write pvc://claim/path/to/model")
    problem = _path_problem(path, "the path")
    if problem is not None:
        raise SourceError(f"{uri!r}: {problem}")
    return PVCSource(claim, path)


def _bucket_problem(bucket: str) -> str | None:
    """Why S3 refuses a bucket name (AWS's rules for general purpose buckets, which S3-compatible stores share)."""
    if not _BUCKET.match(bucket) or ".." in bucket:
        return (f"{bucket!r} is not an S3 bucket name (3 to 63 lower-case letters, digits, '.' and '-', starting "
                "and ending with a letter or digit)")
    if _IP_FORMAT.match(bucket):
        return f"{bucket!r} is formatted as an IP address, which S3 refuses as a bucket name"
    for reserved in _RESERVED_PREFIXES:
        if bucket.startswith(reserved):
            return f"{bucket!r} starts with {reserved!r}, which S3 reserves"
    for reserved in _RESERVED_SUFFIXES:
        if bucket.endswith(reserved):
            return f"{bucket!r} ends with {reserved!r}, which S3 reserves"
    return None


def _s3(rest: str, uri: str) -> S3Source:
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.rstrip("/")
    if (problem := _bucket_problem(bucket)) is not None:
        raise SourceError(f"{uri!r}: {problem}; write s3://bucket/prefix")
    problem = _path_problem(prefix, "the prefix")
    if problem is not None:
        raise SourceError(f"{uri!r}: {problem}")
    if len(prefix.encode()) + 1 + _LONGEST_FILE > _KEY_MAX:
        raise SourceError(f"{uri[:40]!r}...: the prefix is {len(prefix.encode())} bytes; S3 keys are at most "
                          f"{_KEY_MAX} bytes, so its files (<prefix>/model.safetensors.index.json) could not be "
                          f"read: keep the prefix at most {_KEY_MAX - 1 - _LONGEST_FILE} bytes")
    return S3Source(bucket, prefix)


def parse_source(uri: str) -> Source:
    """The source a URI names; raises SourceError with a one-line message."""
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme not in SCHEMES:
        raise SourceError(f"{uri!r} is not a model source: write {_FORMS}")
    if any(c.isspace() or ord(c) < 32 for c in rest):
        raise SourceError(f"{uri!r} must not contain spaces or control characters")
    if scheme == "hf":
        return _hub(rest, uri)
    if scheme == "pvc":
        return _pvc(rest, uri)
    return _s3(rest, uri)


def source_problem(uri: str) -> str | None:
    try:
        parse_source(uri)
    except SourceError as exc:
        return str(exc)
    return None


def parse_adapter_source(value: str) -> Source:
    """A LoRA adapter's source: one of the model's URIs, or a bare Hub id (``org/name``) as before they were."""
    unknown = SourceError(f"{value!r} is not an adapter source: write org/name or hf://org/name (the Hub), "
                          "pvc://claim/path or s3://bucket/prefix")
    if "://" in value:
        if value.partition("://")[0] not in SCHEMES:
            raise unknown
        return parse_source(value)
    try:
        return _hub(value, value)
    except SourceError:
        raise unknown from None


def adapter_source_problem(value: str) -> str | None:
    try:
        parse_adapter_source(value)
    except SourceError as exc:
        return str(exc)
    return None
