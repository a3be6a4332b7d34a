"""The shell's attestation of the status sections it reads back (controller/status_attestation.py)."""

from __future__ import annotations

from llm_autopilot.controller.status_attestation import (
    attestations_patch,
    trusted_status,
    verified_sections,
)

KEY = b"k" * 32
SOURCE = {"uri": "s3://models/qwen", "state": "Inspected", "config": {"hidden_size": 4096}, "checkpointBytes": 16}
PIN = {"specHash": "abc", "ratio": 1.25, "message": None}


def written(uid: str, status: dict[str, object]) -> dict[str, object]:
    """The status as the API server keeps it after the operator's write (nulls are removed by a merge patch)."""
    patch = attestations_patch(KEY, uid, status)
    return {**status, **patch}


def test_the_operators_own_sections_verify_as_the_api_server_hands_them_back() -> None:
    status = written("uid-1", {"source": SOURCE, "kvCalibration": PIN})
    # 16 read back as 16.0, the null gone: still the operator's
    read_back = {**status, "source": {**SOURCE, "checkpointBytes": 16.0}, "kvCalibration": {"specHash": "abc",
                                                                                            "ratio": 1.25}}
    assert verified_sections(KEY, "uid-1", read_back) == {"source", "kvCalibration"}


def test_a_changed_section_another_objects_or_another_keys_does_not_verify() -> None:
    status = written("uid-1", {"source": SOURCE, "kvCalibration": PIN})
    forged = {**status, "kvCalibration": {**PIN, "ratio": 1.45}}
    assert verified_sections(KEY, "uid-1", forged) == {"source"}
    assert verified_sections(KEY, "uid-2", status) == frozenset()  # copied from another object
    assert verified_sections(b"x" * 32, "uid-1", status) == frozenset()
    assert verified_sections(KEY, "uid-1", {**status, "attestations": "junk"}) == frozenset()
    assert trusted_status(forged, frozenset({"source"})) == {k: v for k, v in forged.items() if k != "kvCalibration"}


def test_a_removed_section_loses_its_attestation() -> None:
    assert attestations_patch(KEY, "uid-1", {"burnIn": None}) == {"attestations": {"burnIn": None}}
    assert attestations_patch(KEY, "uid-1", {}) == {}
