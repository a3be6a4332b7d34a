"""What cannot run is refused at apply (issue #28 item 6), with a message that says what to write instead: a cache
PVC too small to hold a model (0 is refused by the API server), an existingClaim too long for the download Job's
label, S3 bucket names S3 refuses (an IP address, reserved prefixes and suffixes) and prefixes whose keys S3
cannot hold."""

from __future__ import annotations

from typing import Any

import pytest

from llm_autopilot.api.sources import parse_adapter_source, source_problem
from llm_autopilot.controller.admission import review
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION

S3_MODEL = {"name": "Qwen/Qwen3-8B", "source": "s3://models/qwen3-8b", "cache": {"enabled": True}}


def spec(model: dict[str, Any]) -> dict[str, Any]:
    return {"model": model, "gpu": {"product": "nvidia-l4"}}


def admitted(body: dict[str, Any]) -> tuple[bool, str]:
    verdict = review(body, str(DEFAULT_VLLM_VERSION))
    return verdict.allowed, verdict.message


@pytest.mark.parametrize("size", [0, "0", "0Gi", 1, "1", "1k", "500Ki", "1023Ki", "500m"])
def test_a_cache_too_small_for_any_model_is_refused(size: object) -> None:
    allowed, message = admitted(spec({**S3_MODEL, "cache": {"enabled": True, "size": size}}))
    assert not allowed and "cache.size" in message and "1Mi" in message


@pytest.mark.parametrize("size", ["1Mi", "16Mi", "0.5Gi", "64Gi", 2**30])
def test_a_cache_that_can_hold_a_model_is_admitted(size: object) -> None:
    assert admitted(spec({**S3_MODEL, "cache": {"enabled": True, "size": size}}))[0]


def test_an_existing_claim_too_long_for_a_label_is_refused() -> None:
    allowed, message = admitted(spec({**S3_MODEL, "cache": {"enabled": True, "existingClaim": "c" * 64}}))
    assert not allowed and "existingClaim" in message and "63" in message
    assert admitted(spec({**S3_MODEL, "cache": {"enabled": True, "existingClaim": "c" * 63}}))[0]


@pytest.mark.parametrize("uri, says", [
    ("s3://192.168.5.4/model", "IP address"),
    ("s3://10.0.0.1/model", "IP address"),
    ("s3://127.0.0.1", "IP address"),
    ("s3://xn--bcher-kva/model", "reserves"),
    ("s3://sthree-models/model", "reserves"),
    ("s3://amzn-s3-demo-bucket/model", "reserves"),
    ("s3://models-s3alias/model", "reserves"),
    ("s3://models--ol-s3/model", "reserves"),
    ("s3://models.mrap/model", "reserves"),
    ("s3://models--x-s3/model", "reserves"),
    ("s3://models--table-s3/model", "reserves"),
    ("s3://models/" + "p" * 996, "at most 995 bytes"),
])
def test_bucket_names_and_prefixes_s3_refuses(uri: str, says: str) -> None:
    problem = source_problem(uri)
    assert problem is not None and says in problem
    allowed, message = admitted(spec({**S3_MODEL, "source": uri}))
    assert not allowed and says in message
    with pytest.raises(ValueError, match=says):
        parse_adapter_source(uri)


@pytest.mark.parametrize("uri", ["s3://models/qwen", "s3://192.168.5.4x/m", "s3://1.2.3/m", "s3://my.models.v2/m",
                                 "s3://models/" + "p" * 995])
def test_other_buckets_and_prefixes_are_admitted(uri: str) -> None:
    assert source_problem(uri) is None
