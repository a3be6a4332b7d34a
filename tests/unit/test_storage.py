"""Model sources and the S3 client: SigV4 against AWS's published examples, the client against a local handler."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from llm_autopilot.api.sources import HubSource, PVCSource, S3Source, SourceError, parse_source
from llm_autopilot.storage import sigv4
from llm_autopilot.storage.s3 import S3Client, S3Error, model_objects, read_model_files

# --- SigV4: the examples AWS publishes ------------------------------------------------------------------

#: docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html ("Example: GET Object")
S3_DOC_KEY = sigv4.Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
S3_DOC_TIME = datetime(2013, 5, 24, tzinfo=UTC)


def test_sigv4_s3_get_object_example() -> None:
    headers = {"Host": "examplebucket.s3.amazonaws.com", "Range": "bytes=0-9",
               "x-amz-content-sha256": sigv4.EMPTY_SHA256, "x-amz-date": "20130524T000000Z"}
    request, signed = sigv4.canonical_request("GET", "/test.txt", {}, headers, sigv4.EMPTY_SHA256)
    assert signed == "host;range;x-amz-content-sha256;x-amz-date"
    assert hashlib.sha256(request.encode()).hexdigest() == (
        "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972")
    auth = sigv4.authorization(S3_DOC_KEY, "GET", "/test.txt", {}, headers, sigv4.EMPTY_SHA256, S3_DOC_TIME,
                               "us-east-1")
    assert auth == ("AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
                    "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
                    "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")


def test_sigv4_s3_list_objects_example() -> None:
    """The same page's "GET Bucket (List Objects)": a query string, sorted and encoded."""
    headers = {"Host": "examplebucket.s3.amazonaws.com", "x-amz-content-sha256": sigv4.EMPTY_SHA256,
               "x-amz-date": "20130524T000000Z"}
    auth = sigv4.authorization(S3_DOC_KEY, "GET", "/", {"prefix": "J", "max-keys": "2"}, headers,
                               sigv4.EMPTY_SHA256, S3_DOC_TIME, "us-east-1")
    assert auth.endswith("Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7")


def test_sigv4_test_suite_get_vanilla() -> None:
    """AWS's Signature Version 4 test suite, get-vanilla (service "service", no payload header)."""
    key = sigv4.Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    when = datetime(2015, 8, 30, 12, 36, tzinfo=UTC)
    headers = {"Host": "example.amazonaws.com", "X-Amz-Date": "20150830T123600Z"}
    request, _ = sigv4.canonical_request("GET", "/", {}, headers, sigv4.EMPTY_SHA256)
    assert hashlib.sha256(request.encode()).hexdigest() == (
        "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63")
    auth = sigv4.authorization(key, "GET", "/", {}, headers, sigv4.EMPTY_SHA256, when, "us-east-1", "service")
    assert auth.endswith("Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31")


def test_sigv4_encodes_keys_once_and_query_values_fully() -> None:
    request, _ = sigv4.canonical_request("GET", "/b/a b/c+d", {"prefix": "x/y z"}, {"host": "h"},
                                         sigv4.EMPTY_SHA256)
    assert request.splitlines()[1:3] == ["/b/a%20b/c%2Bd", "prefix=x%2Fy%20z"]


# --- source URIs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("uri", "parsed"), [
    ("hf://Qwen/Qwen3-8B", HubSource("Qwen/Qwen3-8B")),
    ("pvc://models/qwen/Qwen3-8B", PVCSource("models", "qwen/Qwen3-8B")),
    ("pvc://models", PVCSource("models", "")),
    ("s3://my-models/qwen3-8b/", S3Source("my-models", "qwen3-8b")),
    ("s3://my-models", S3Source("my-models", "")),
])
def test_sources_parse(uri: str, parsed: object) -> None:
    assert parse_source(uri) == parsed


@pytest.mark.parametrize(("uri", "says"), [
    ("gs://bucket/x", "hf://org/name, pvc://claim/path or s3://bucket/prefix"),
    ("hf://Qwen", "not a Hugging Face Hub source"),
    ("pvc://Models/x", "not a PersistentVolumeClaim name"),
    ("pvc://models/../etc", "without empty, '.' or '..' segments"),
    ("pvc://models/a//b", "without empty"),
    ("s3://ab/x", "not an S3 bucket name"),
    ("s3://bucket/a b", "must not contain spaces"),
    ("s3://bucket/a/$x", "may only hold"),
])
def test_bad_sources_say_what_a_good_one_looks_like(uri: str, says: str) -> None:
    with pytest.raises(SourceError, match=None) as raised:
        parse_source(uri)
    assert says in str(raised.value)


# --- the S3 client, against a handler that checks every signature -----------------------------------------

KEY = sigv4.Credentials("AKIDTEST", "secret/TEST")
NOW = datetime(2026, 12, 1, 20, 0, tzinfo=UTC)


class Store:
    """An in-memory bucket behind an httpx MockTransport that verifies each request's SigV4 signature."""

    def __init__(self, objects: dict[str, bytes], bucket: str = "models") -> None:
        self.objects = objects
        self.bucket = bucket
        self.requests: list[httpx.Request] = []

    def _error(self, status: int, code: str) -> httpx.Response:
        return httpx.Response(status, content=f"<Error><Code>{code}</Code></Error>".encode())

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        headers = {k: v for k, v in request.headers.items()
                   if k in ("host", "x-amz-date", "x-amz-content-sha256", "range")}
        query = dict(request.url.params)
        expected = sigv4.authorization(KEY, request.method, request.url.path, query, headers,
                                       sigv4.EMPTY_SHA256, NOW, "us-east-1")
        if request.headers.get("authorization") != expected:  # as S3: a HEAD's answer has no body, so no code
            return httpx.Response(403) if request.method == "HEAD" else self._error(403, "SignatureDoesNotMatch")
        bucket, _, key = request.url.path.lstrip("/").partition("/")
        if bucket != self.bucket:
            return self._error(404, "NoSuchBucket")
        if not key and "list-type" in query:
            prefix = query.get("prefix", "")
            items = "".join(f"<Contents><Key>{k}</Key><Size>{len(v)}</Size><ETag>\"{hashlib.md5(v).hexdigest()}\""
                            "</ETag></Contents>" for k, v in sorted(self.objects.items()) if k.startswith(prefix))
            body = ('<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
                    f"<IsTruncated>false</IsTruncated>{items}</ListBucketResult>")
            return httpx.Response(200, content=body.encode())
        if not key:
            return httpx.Response(200)
        data = self.objects.get(key)
        if data is None:
            return self._error(404, "NoSuchKey")
        etag = {"etag": f'"{hashlib.md5(data).hexdigest()}"'}
        if request.method == "HEAD":
            return httpx.Response(200, headers={"content-length": str(len(data)), **etag})
        start = int(request.headers["range"].removeprefix("bytes=").rstrip("-")) if "range" in request.headers else 0
        return httpx.Response(206 if start else 200, content=data[start:], headers=etag)


def client(store: Store, credentials: sigv4.Credentials = KEY) -> S3Client:
    return S3Client("http://s3.local:8333", "us-east-1", credentials, transport=httpx.MockTransport(store),
                    clock=lambda: NOW)


CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128,
          "vocab_size": 1000, "max_position_embeddings": 2048, "torch_dtype": "bfloat16"}


def test_the_planner_reads_config_and_index_from_s3() -> None:
    store = Store({"tiny/config.json": json.dumps(CONFIG).encode(),
                   "tiny/model.safetensors.index.json": json.dumps({"metadata": {"total_size": 123456}}).encode()})
    files = read_model_files(client(store), S3Source("models", "tiny"))
    assert files.config["hidden_size"] == 64
    assert files.checkpoint_bytes == 123456
    assert all(r.url.host == "s3.local" and r.url.path.startswith("/models") for r in store.requests)
    assert store.requests[0].url.path == "/models/tiny/config.json"


def test_the_objects_read_are_found_by_head_and_read_once() -> None:
    """model_objects HEADs what read_model_files reads (a missing hf_quant_config.json costs no bucket HEAD);
    given them, read_model_files GETs each JSON once and HEADs nothing."""
    store = Store({"tiny/config.json": json.dumps(CONFIG).encode(),
                   "tiny/model.safetensors.index.json": json.dumps({"metadata": {"total_size": 123456}}).encode()})
    s3, source = client(store), S3Source("models", "tiny")
    objects = model_objects(s3, source)
    assert [(o.key, o.size, o.etag) for o in objects] == [
        (f"tiny/{name}", len(store.objects[f"tiny/{name}"]), hashlib.md5(store.objects[f"tiny/{name}"]).hexdigest())
        for name in ("config.json", "model.safetensors.index.json")]
    assert [r.method for r in store.requests] == ["HEAD"] * 3
    store.requests.clear()
    files = read_model_files(s3, source, objects)
    assert [(r.method, r.url.path) for r in store.requests] == [
        ("GET", "/models/tiny/config.json"), ("GET", "/models/tiny/model.safetensors.index.json")]
    assert (files.config["hidden_size"], files.checkpoint_bytes) == (64, 123456)


def test_without_an_index_the_single_file_size_counts() -> None:
    store = Store({"tiny/config.json": json.dumps(CONFIG).encode(), "tiny/model.safetensors": b"x" * 777})
    assert read_model_files(client(store), S3Source("models", "tiny")).checkpoint_bytes == 777


@pytest.mark.parametrize(("source", "credentials", "says"), [
    (S3Source("models", "nothing-here"), KEY, "has no config.json"),
    (S3Source("missing-bucket", "tiny"), KEY, "does not exist"),
    (S3Source("models", "tiny"), sigv4.Credentials("AKIDTEST", "wrong"),
     "denied (403): check the access key id and secret access key in spec.model.s3.credentialsSecretRef"),
])
def test_s3_failures_say_what_to_do(source: S3Source, credentials: sigv4.Credentials, says: str) -> None:
    store = Store({"tiny/config.json": json.dumps(CONFIG).encode()})
    with pytest.raises(S3Error) as raised:
        read_model_files(client(store, credentials), source)
    assert says in str(raised.value)


def test_an_unreachable_endpoint_names_the_field() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    s3 = S3Client("http://nowhere:1", "us-east-1", KEY, transport=httpx.MockTransport(down), clock=lambda: NOW)
    with pytest.raises(S3Error, match=r"spec\.model\.s3\.endpoint"):
        read_model_files(s3, S3Source("models", "tiny"))


def test_listing_and_ranged_reads(tmp_path: Path) -> None:
    store = Store({"tiny/a": b"0123456789", "tiny/b/c": b"abc", "other/x": b"no"})
    s3 = client(store)
    listed = s3.list("models", "tiny")
    assert [(o.key, o.size) for o in listed] == [("tiny/a", 10), ("tiny/b/c", 3)]
    assert listed[0].md5 == hashlib.md5(b"0123456789").hexdigest()
    assert b"".join(s3.stream("models", "tiny/a", offset=4)) == b"456789"
    assert store.requests[-1].headers["range"] == "bytes=4-"
