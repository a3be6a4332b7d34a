"""A small S3 client on httpx: HEAD, GET (whole or from an offset), ListObjectsV2. The shell around sigv4.py.

Path-style addressing (``<endpoint>/<bucket>/<key>``), which every S3-compatible store (SeaweedFS, MinIO, Ceph
RGW) and AWS accept. Unsigned requests when no credentials are given (a public bucket). Every failure becomes
:class:`S3Error` whose message names the bucket, the key and what to do.
"""

from __future__ import annotations

import hashlib
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from llm_autopilot.api.sources import S3Source
from llm_autopilot.hub.client import (
    CONFIG,
    MODELOPT_QUANT_CONFIG,
    SAFETENSORS_INDEX,
    SAFETENSORS_SINGLE,
    ModelFetchError,
    ModelFiles,
    _total_size,
    _with_modelopt,
)
from llm_autopilot.storage.egress_http import EgressRefused
from llm_autopilot.storage.sigv4 import Credentials, signed_headers

_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
#: config.json and the safetensors index are small; anything larger is not what we expect
_JSON_MAX_BYTES = 32 * 2**20
_CHUNK = 2**20
#: an S3 error document is a few hundred bytes
_ERROR_BODY_MAX = 64 * 2**10


class S3Error(ModelFetchError):
    """An S3 request failed; the message is meant for the user."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    #: the ETag without quotes: the MD5 of the content for a single-part upload, ``<md5>-<parts>`` otherwise
    etag: str

    @property
    def md5(self) -> str | None:
        """The content's MD5 when the ETag is one (a single-part upload without SSE-KMS)."""
        return self.etag if len(self.etag) == 32 and "-" not in self.etag else None


def default_endpoint(region: str) -> str:
    return f"https://s3.{region}.amazonaws.com"


#: an S3 error code as S3 spells them (NoSuchBucket, AccessDenied...); anything else is not shown
_ERROR_CODE = re.compile(r"^[A-Za-z][A-Za-z0-9.]{0,63}$")


def _error_code(response: httpx.Response) -> str:
    """The S3 error code of an error's body; never the body itself (the status must not echo what an endpoint
    answered)."""
    try:
        root = ET.fromstring(response.content[:_ERROR_BODY_MAX])
    except ET.ParseError:
        return ""
    code = root.find("Code")
    text = (code.text or "").strip() if code is not None else ""
    return text if _ERROR_CODE.match(text) else ""


class S3Client:
    def __init__(self, endpoint: str, region: str, credentials: Credentials | None = None, *,
                 timeout: float = 10.0, transport: httpx.BaseTransport | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC), field: str = "spec.model.s3") -> None:
        #: the spec's field that configures this store, named in the messages
        self._field = field
        self._endpoint = endpoint.rstrip("/")
        parts = urlsplit(self._endpoint)
        self._host = parts.netloc
        self._base_path = parts.path
        self._region = region
        self._credentials = credentials
        self._clock = clock
        self._http = httpx.Client(timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> S3Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _request(self, method: str, bucket: str, key: str = "", *, query: dict[str, str] | None = None,
                 headers: dict[str, str] | None = None, stream: bool = False) -> httpx.Response:
        path = f"{self._base_path}/{bucket}" + (f"/{key}" if key else "")
        query = query or {}
        extra = dict(headers or {})
        if self._credentials is not None:
            extra = signed_headers(self._credentials, method, self._host, path, query, self._clock(),
                                   self._region, extra)
            extra.pop("host")  # httpx sends it
        url = f"{urlsplit(self._endpoint).scheme}://{self._host}{quote(path, safe='/-_.~')}"
        request = self._http.build_request(method, url, params=query or None, headers=extra)
        where = f"s3://{bucket}/{key}" if key else f"s3://{bucket}"
        try:
            response = self._http.send(request, stream=stream)
        except EgressRefused as exc:  # says which field, why, and what opens it
            raise S3Error(f"not contacted for {where}: {exc}") from None
        except httpx.HTTPError as exc:
            # a connection's own failure says why; a protocol error's text may quote what the endpoint sent
            said = f": {exc}" if isinstance(exc, httpx.ConnectError | httpx.TimeoutException) else ""
            raise S3Error(f"cannot reach the S3 endpoint {self._endpoint} for {where} ({type(exc).__name__}"
                          f"{said}); check {self._field}.endpoint") from exc
        if response.status_code >= 400 and response.status_code not in {404, 416}:
            if stream:
                response.read()
            raise S3Error(self._explain(response, where))
        return response

    def _explain(self, response: httpx.Response, where: str) -> str:
        code = _error_code(response)
        if code == "NoSuchBucket":
            return f"bucket of {where} does not exist at {self._endpoint}"
        if code in ("SignatureDoesNotMatch", "InvalidAccessKeyId"):
            return (f"the S3 store refused the credentials for {where} ({code}): check the access key id and "
                    f"secret access key in {self._field}.credentialsSecretRef")
        if response.status_code == 403:
            if self._credentials is None:
                hint = f"give credentials ({self._field}.credentialsSecretRef)"
            elif code:
                hint = "grant the key s3:GetObject and s3:ListBucket on it"
            else:  # a HEAD's answer has no body, so no code: wrong keys and missing rights look the same
                hint = (f"check the access key id and secret access key in {self._field}.credentialsSecretRef, "
                        "and that the key may s3:GetObject and s3:ListBucket on it")
            return f"access to {where} was denied ({code or 403}): {hint}"
        return f"the S3 store answered {response.status_code} {code} for {where}".rstrip()

    def head(self, bucket: str, key: str, *, bucket_known: bool = False) -> ObjectInfo | None:
        """The object's size and ETag; None when it does not exist (``bucket_known``: the bucket was just seen,
        so a 404 is the object's and needs no second HEAD to say which)."""
        response = self._request("HEAD", bucket, key)
        if response.status_code == 404:
            if not bucket_known and not self.bucket_exists(bucket):
                raise S3Error(f"bucket {bucket!r} does not exist at {self._endpoint}")
            return None
        return ObjectInfo(key, int(response.headers.get("content-length", "0")),
                          response.headers.get("etag", "").strip('"'))

    def bucket_exists(self, bucket: str) -> bool:
        return self._request("HEAD", bucket).status_code != 404

    def get(self, bucket: str, key: str, *, max_bytes: int = _JSON_MAX_BYTES) -> bytes | None:
        """A small object's content; None when it does not exist."""
        info = self.head(bucket, key)
        return self.get_known(bucket, info, max_bytes=max_bytes) if info is not None else None

    def get_known(self, bucket: str, info: ObjectInfo, *, max_bytes: int = _JSON_MAX_BYTES) -> bytes | None:
        """The content of an object a HEAD just found (``info``); None when it went since."""
        if info.size > max_bytes:
            raise S3Error(f"s3://{bucket}/{info.key} is {info.size} bytes, more than the {max_bytes} expected")
        response = self._request("GET", bucket, info.key)
        if response.status_code == 404:
            return None
        return response.content

    def list(self, bucket: str, prefix: str) -> list[ObjectInfo]:
        """Every object under ``prefix/`` (ListObjectsV2, page by page)."""
        found: list[ObjectInfo] = []
        token: str | None = None
        while True:
            query = {"list-type": "2", "prefix": f"{prefix}/" if prefix else ""}
            if token:
                query["continuation-token"] = token
            response = self._request("GET", bucket, query=query)
            if response.status_code == 404:
                raise S3Error(f"bucket {bucket!r} does not exist at {self._endpoint}")
            try:
                root = ET.fromstring(response.content)
            except ET.ParseError:
                raise S3Error(f"the S3 store's listing of s3://{bucket}/{prefix} is not S3's XML; check "
                              f"{self._field}.endpoint") from None
            for item in root.iter(f"{_NS}Contents"):
                found.append(ObjectInfo(item.findtext(f"{_NS}Key") or "", int(item.findtext(f"{_NS}Size") or 0),
                                        (item.findtext(f"{_NS}ETag") or "").strip('"')))
            token = root.findtext(f"{_NS}NextContinuationToken")
            if (root.findtext(f"{_NS}IsTruncated") or "false") != "true" or not token:
                return found

    def stream(self, bucket: str, key: str, offset: int = 0) -> Iterator[bytes]:
        """The object's bytes from ``offset`` on (a Range request, so a download resumes)."""
        headers = {"range": f"bytes={offset}-"} if offset else {}
        response = self._request("GET", bucket, key, headers=headers, stream=True)
        try:
            if response.status_code == 404:
                raise S3Error(f"s3://{bucket}/{key} disappeared while downloading")
            if offset and response.status_code != 206:
                raise S3Error(f"the S3 store ignored the Range request for s3://{bucket}/{key} "
                              f"(answered {response.status_code})")
            yield from response.iter_bytes(_CHUNK)
        finally:
            response.close()


def _json(data: bytes, where: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise S3Error(f"{where} is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise S3Error(f"{where} is not a JSON object")
    return value


def model_objects(client: S3Client, source: S3Source) -> tuple[ObjectInfo, ...]:
    """The objects :func:`read_model_files` reads, found by HEAD: config.json, the safetensors index (else the
    single weights file, whose size it reads), hf_quant_config.json, each when it exists. Their ETags and sizes
    say whether a reading of them is still current (controller/sources.py keeps one in status.source)."""
    config = client.head(source.bucket, source.key(CONFIG))
    if config is None:
        raise S3Error(f"{source.uri} has no config.json (looked for s3://{source.bucket}/{source.key(CONFIG)}); "
                      "check the prefix in spec.model.source")
    index = client.head(source.bucket, source.key(SAFETENSORS_INDEX), bucket_known=True)
    single = client.head(source.bucket, source.key(SAFETENSORS_SINGLE), bucket_known=True) if index is None \
        else None
    modelopt = client.head(source.bucket, source.key(MODELOPT_QUANT_CONFIG), bucket_known=True)
    return tuple(o for o in (config, index, single, modelopt) if o is not None)


def read_model_files(client: S3Client, source: S3Source,
                     objects: tuple[ObjectInfo, ...] | None = None) -> ModelFiles:
    """config.json, the safetensors index (or the single file's size) and hf_quant_config.json from S3
    (``objects``: what :func:`model_objects` just found; HEAD again without)."""
    found = {o.key: o for o in (objects if objects is not None else model_objects(client, source))}

    def content(filename: str) -> bytes | None:
        info = found.get(source.key(filename))
        return client.get_known(source.bucket, info) if info is not None else None

    config = content(CONFIG)
    if config is None:
        raise S3Error(f"{source.uri} has no config.json (looked for s3://{source.bucket}/{source.key(CONFIG)}); "
                      "check the prefix in spec.model.source")
    index = content(SAFETENSORS_INDEX)
    if index is not None:
        size = _total_size(_json(index, f"{source.uri}/{SAFETENSORS_INDEX}"))
    else:
        single = found.get(source.key(SAFETENSORS_SINGLE))
        size = single.size if single is not None else None
    modelopt = content(MODELOPT_QUANT_CONFIG)
    return ModelFiles(_with_modelopt(_json(config, f"{source.uri}/{CONFIG}"),
                                     _json(modelopt, MODELOPT_QUANT_CONFIG) if modelopt else None), size)


def md5_of(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()
