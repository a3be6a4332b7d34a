"""The calibration store holds only the operator's own samples (issue #28 item 3): each sample carries an HMAC
with the operator's key, every field is read whole (``0.33.0; rm -rf /`` is no version), and anything else is
dropped and said once."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

import pytest

from llm_autopilot.controller.calibration_store import CONFIGMAP_NAME, KEY_ENV, CalibrationBook
from llm_autopilot.desired.calibration import SampleToRecord
from llm_autopilot.planner.calibration import (
    CONFIGMAP_KEY,
    CalibrationKey,
    CalibrationStore,
    Sample,
    parse_store,
    sample_attestation,
    store_to_json,
)
from tests.unit.test_calibration_store import OPERATOR_NS, ConfigMaps

NOW = datetime(2031, 5, 17, 8, 30, tzinfo=UTC)
KEY = CalibrationKey("H100-80GB", "0.33.0", "qwen3")
SECRET = b"s" * 32
GOOD = Sample(1.449, NOW, "team/twin")


def store(entry: dict[str, Any] | None = None, **sample: Any) -> dict[str, Any]:
    raw = {"ratio": GOOD.ratio, "time": GOOD.time.isoformat(), "deployment": GOOD.deployment,
           "attestation": sample_attestation(SECRET, KEY, GOOD), **sample}
    return {"version": 1, "entries": [{"gpuProduct": KEY.gpu_product, "vllmVersion": KEY.vllm_version,
                                       "family": KEY.family, **(entry or {}), "samples": [raw]}]}


def kept(data: dict[str, Any], key: bytes | None = SECRET) -> tuple[list[Sample], tuple[str, ...]]:
    parsed, problems = parse_store(json.loads(json.dumps(data)), NOW, key)
    return [s for samples in parsed.entries.values() for s in samples], problems


def test_the_operators_own_sample_is_kept() -> None:
    samples, problems = kept(store())
    assert samples == [GOOD] and problems == ()


def test_what_the_operator_writes_it_reads_back() -> None:
    written = store_to_json(CalibrationStore({KEY: (GOOD,)}), SECRET)
    assert kept(written) == ([GOOD], ())
    assert kept(written, b"another key of 32 bytes.........")[0] == []  # another operator's key


@pytest.mark.parametrize("sample", [
    {"attestation": None},
    {"attestation": "0" * 64},
    {"attestation": 12},
    {"ratio": 1.2},  # the figures changed under the operator's attestation
    {"time": "2031-05-17T08:00:00+00:00"},
    {"deployment": "team/other"},  # copied to another deployment
], ids=["none", "zeros", "not text", "ratio", "time", "deployment"])
def test_a_sample_without_the_operators_attestation_is_dropped(sample: dict[str, Any]) -> None:
    samples, problems = kept(store(**sample))
    assert samples == [] and "attestation" in problems[0]


def test_an_attestation_is_for_its_key_only() -> None:
    samples, problems = kept(store({"family": "llama"}))  # an entry moved to another family
    assert samples == [] and "attestation" in problems[0]


@pytest.mark.parametrize("entry, says", [
    ({"vllmVersion": "0.33.0; rm -rf /"}, "vllmVersion must be a version"),
    ({"vllmVersion": "0.33"}, "vllmVersion must be a version"),
    ({"vllmVersion": " 0.33.0"}, "vllmVersion must be a version"),
    ({"vllmVersion": "0.33.0\n"}, "vllmVersion must be a version"),
    ({"gpuProduct": "H100-80GB; x"}, "gpuProduct must be"),
    ({"gpuProduct": "H100 80GB"}, "gpuProduct must be"),
    ({"family": "qwen3\u0000"}, "family must be"),
])
@pytest.mark.parametrize("key", [SECRET, None], ids=["operator", "cli"])
def test_fields_are_read_whole(entry: dict[str, Any], says: str, key: bytes | None) -> None:
    samples, problems = kept(store(entry), key)
    assert samples == [] and says in problems[0]


@pytest.mark.parametrize("deployment", ["team/twin/x", "team", "Team/twin", "team/twin; rm", "/twin"])
def test_a_deployment_is_namespace_slash_name(deployment: str) -> None:
    samples, problems = kept(store(deployment=deployment), None)
    assert samples == [] and "namespace/name" in problems[0]


def test_the_book_drops_a_forged_sample_and_says_it_once(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET.decode())
    maps = ConfigMaps()
    forged = store({"vllmVersion": "0.33.0"}, attestation="f" * 64)
    maps.put(OPERATOR_NS, CONFIGMAP_NAME, {CONFIGMAP_KEY: json.dumps(forged)})
    clock = [0.0]
    book = CalibrationBook(maps, OPERATOR_NS, ttl_seconds=1, clock=lambda: clock[0])
    with caplog.at_level(logging.WARNING):
        first, _ = book.current(NOW)
        clock[0] = 5
        book.current(NOW)
    assert first is not None and first.entries[KEY] == ()
    assert caplog.text.count("attestation") == 1
    # the operator's own sample, written by the book, is attested and read back by a fresh one
    assert book.record(SampleToRecord(KEY, Sample(0.97, NOW, "team/a")), NOW)
    again, _ = CalibrationBook(maps, OPERATOR_NS).current(NOW)
    assert again is not None and [s.deployment for s in again.entries[KEY]] == ["team/a"]


def test_without_a_key_the_process_makes_one_and_says_so(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    with caplog.at_level(logging.WARNING):
        one, two = CalibrationBook(ConfigMaps(), OPERATOR_NS), CalibrationBook(ConfigMaps(), OPERATOR_NS)
    assert one.key != two.key and len(one.key) == 32 and KEY_ENV in caplog.text
