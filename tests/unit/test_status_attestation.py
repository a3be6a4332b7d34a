"""The shell's attestation of the status sections it reads back (controller/status_attestation.py)."""

from __future__ import annotations

from typing import Any

import pytest

from llm_autopilot.api.status import LLMDeploymentStatus
from llm_autopilot.controller.status_attestation import (
    attestations_patch,
    trusted_status,
    verified_sections,
)
from llm_autopilot.desired.status_read import ATTESTED, read_status

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


@pytest.mark.parametrize("section", ATTESTED)
def test_every_section_read_back_without_the_operators_attestation_is_set_aside(section: str) -> None:
    raw = {section: VALID[section], "observedGeneration": 3}
    read = read_status(raw, frozenset())
    assert read.forged == (section,) and section not in read.readable and read.problems == ()
    assert read_status(raw, frozenset({section})).readable[section] == VALID[section]
    assert read_status(raw).forged == ()  # not checked: the pure tests' and admission's (empty) status


#: a value of each attested section that parses (what a forger would write)
VALID: dict[str, Any] = {
    "source": SOURCE,
    "loraSources": [{"name": "sql", "uri": "pvc://adapters/sql", "claimUID": "u", "state": "Inspected", "rank": 8}],
    "cache": {"state": "Complete", "claimName": "c"},
    "verification": {"predictedTokens": 1000, "predictedBlocks": 62, "predictedKVGiB": 1.0, "actualKVGiB": 1.4,
                     "errorPercent": 40.0, "tolerancePercent": 10.0, "verified": True, "source": "metrics",
                     "vllmVersion": "0.33.0", "time": "2031-05-17T08:30:00Z", "planHash": "p"},
    "releases": [{"vllmVersion": "0.33.0", "predictedTokens": 1000, "actualTokens": 1400, "errorPercent": 40.0,
                  "verified": True, "planHash": "p", "time": "2031-05-17T08:30:00Z"}],
    "kvCalibration": {"specHash": "abc", "gpuProduct": "L4", "vllmVersion": "0.33.0", "family": "qwen3",
                      "ratio": 1.449, "deployments": 3, "message": "calibrated"},
    "burnIn": {"planHash": "p", "pods": [{"pod": "p-0", "passed": False, "reason": "KVCacheTooSmall",
                                          "message": "forged", "gpuSeconds": 1.0}]},
    "lora": {"updates": "Runtime", "reason": "Served"},
    "remediation": {"rung": 1, "applied": [{"maxNumSeqs": 8, "generation": 1, "attestation": "0" * 32}]},
    "startupProbe": {"planHash": "p", "image": "vllm/vllm-openai:v0.33.0", "model": "Qwen/Qwen3-8B",
                     "gpuProduct": "H100-80GB", "seconds": 10, "formulaSeconds": 600, "starts": 5,
                     "medianStartSeconds": 1.0, "message": "forged: every start cut after 10 s"},
    "canary": {"vllmVersion": "0.32.0", "image": "vllm/vllm-openai:v0.32.0", "planHash": "p", "phase": "Passed",
               "since": "2026-12-05T22:00:00Z", "message": "forged: rolls the fleet"},
}


def test_every_forged_value_parses() -> None:
    for section, value in VALID.items():
        LLMDeploymentStatus.model_validate({section: value})
