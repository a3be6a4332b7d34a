"""The remediation state: read defensively from a status anyone may have written, immutable, round-tripped."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from llm_autopilot.api.crd import crd
from llm_autopilot.api.v1alpha1 import RemediationEvent, RemediationPolicy
from llm_autopilot.controller.quiet import next_due
from llm_autopilot.remediation.ladder import Overrides
from llm_autopilot.remediation.state import Author, Limits, RemediationState, attestation, effective_replicas

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
LIMITS = Limits(max_steps=5, spec_replicas=1, max_replicas=3, max_gpus=8, node_memory_gib=192.0,
                floor_max_model_len=8192, floor_max_num_seqs=8, floor_max_num_batched_tokens=512,
                floor_gpu_memory_utilization=0.7)


def read(raw: Any, limits: Limits = LIMITS) -> tuple[RemediationState, tuple[str, ...]]:
    return RemediationState.read(raw, limits, NOW)


@pytest.mark.parametrize(("stamp", "parsed"), [
    ("2026-12-01T00:00:00Z", datetime(2026, 12, 1, tzinfo=UTC)),
    ("2026-12-01T00:00:00.5Z", datetime(2026, 12, 1, 0, 0, 0, 500000, tzinfo=UTC)),  # fractional seconds
    ("2026-12-01T02:00:00+02:00", datetime(2026, 12, 1, tzinfo=UTC)),  # an offset
    ("2026-12-01T00:00:00.123456+00:00", datetime(2026, 12, 1, 0, 0, 0, 123456, tzinfo=UTC)),
])
def test_timestamps_parse_as_any_rfc3339_value(stamp: str, parsed: datetime) -> None:
    """D11: a valid RFC 3339 value (as a restore or `kubectl patch` writes it) is read, not a ValueError."""
    state, warnings = read({"lastStepTime": stamp, "lastSignalTime": stamp, "lastRelaxTime": stamp})
    assert (state.last_step_time, state.last_signal_time, state.last_relax_time) == (parsed, parsed, parsed)
    assert warnings == ()


@pytest.mark.parametrize("stamp", ["yesterday", "2026-12-01", "2026-12-01T00:00:00", 1733011200, "", "Z"])
def test_unparsable_timestamps_are_missing_with_a_warning(stamp: Any) -> None:
    state, warnings = read({"rung": 0, "lastStepTime": stamp})
    assert state.last_step_time is None
    assert len(warnings) == 1 and "lastStepTime" in warnings[0] and "not an RFC 3339 time" in warnings[0]


def test_future_timestamps_are_clamped_to_now() -> None:
    """D12: a peer with a clock a year ahead must not hold the cooldown (or the relax) for a year."""
    state, warnings = read({"lastStepTime": "9999-01-01T00:00:00Z",
                            "lastRelaxTime": (NOW + timedelta(seconds=5)).isoformat()})
    assert state.last_step_time == NOW and state.last_relax_time == NOW
    assert len(warnings) == 1 and "in the future" in warnings[0]  # a few seconds of skew is not worth a warning


@pytest.mark.parametrize(("raw", "field", "value"), [
    ({"rung": -50}, "rung", 0),
    ({"rung": 7, "applied": [{}] * 7}, "rung", 5),  # above maxSteps
    ({"relaxBackoff": 0}, "relax_backoff", 1),
    ({"relaxBackoff": -1}, "relax_backoff", 1),
    ({"relaxBackoff": 1000}, "relax_backoff", 16),
    ({"rung": 3}, "rung", 0),  # three steps taken but nothing applied: the rung follows the applied rungs
])
def test_counters_are_clamped(raw: dict[str, Any], field: str, value: int) -> None:
    """D13: `rung: -50` must not buy 50 more steps, `relaxBackoff: 0` must not relax at once."""
    state, warnings = read(raw)
    assert getattr(state, field) == value and warnings


@pytest.mark.parametrize(("applied", "expected"), [
    ({"replicas": 100000}, Overrides(replicas=3)),  # 1..max(spec.replicas, maxReplicas)
    ({"replicas": -3}, Overrides(replicas=1)),
    ({"memoryLimitGiB": 1e9}, Overrides(memory_limit_gib=192.0)),  # the node's allocatable memory
    ({"memoryLimitGiB": -1}, Overrides()),  # not a limit at all: the rendered default stays
    ({"maxModelLen": 1}, Overrides(max_model_len=8192)),  # the max_model_len floor
    ({"maxNumSeqs": 1, "maxNumBatchedTokens": 2}, Overrides(max_num_seqs=8, max_num_batched_tokens=512)),
    ({"gpuMemoryUtilization": 0.1}, Overrides(gpu_memory_utilization=0.7)),
    ({"gpuMemoryUtilization": 1.5}, Overrides(gpu_memory_utilization=1.0)),
    ({"minGPUs": 64}, Overrides(min_gpus=8)),
    ({"enforceEager": "yes", "fp8KVCache": 1}, Overrides()),
    ({"maxNumSeqs": "many"}, Overrides()),
])
def test_overrides_are_clamped_to_the_spec_and_the_node(applied: dict[str, Any], expected: Overrides) -> None:
    state, warnings = read({"rung": 1, "applied": [applied]})
    assert state.overrides == expected and warnings


def test_a_status_the_operator_wrote_reads_back_identically_and_without_warnings() -> None:
    event = RemediationEvent(time=NOW, rung=1, signal="OOMKilled", action="container memory limit 36Gi -> 54Gi",
                             message="m", evidence={"pod": "x-1"})
    state = RemediationState().with_signal(NOW, 2).with_evidence("x-1/1/t").with_step(
        Overrides(memory_limit_gib=54.0, replicas=2), NOW, event)
    wire = state.to_status()
    assert wire["lastStepTime"] == "2026-12-01T12:00:00Z" and wire["lastRelaxTime"] is None  # null: merge patch
    assert wire["applied"] == [{"replicas": 2, "memoryLimitGiB": 54.0}]
    again, warnings = read(wire)
    assert again == state and warnings == ()
    # as the API server hands it back (54.0 may come back as 54)
    wire["applied"][0]["memoryLimitGiB"] = 54
    assert read(wire)[0] == state


def test_changes_return_new_states() -> None:
    state = RemediationState()
    stepped = state.with_step(Overrides(fp8_kv_cache=True), NOW, RemediationEvent(
        time=NOW, rung=1, signal="KVSaturation", action="fp8", message=""))
    assert state.rung == 0 and state.applied == () and stepped.rung == 1 and stepped.state == "Step"
    relaxed = stepped.with_relax(NOW + timedelta(hours=1), RemediationEvent(
        time=NOW, rung=0, signal="Calm", action="relax one rung", message=""))
    assert relaxed.rung == 0 and relaxed.applied == () and len(relaxed.history) == 2 and stepped.rung == 1
    with pytest.raises(ValidationError):
        state.rung = 3  # type: ignore[misc]  # frozen
    assert stepped.reset().applied == () and stepped.reset().last_step_time == NOW  # the cooldown still holds


def test_history_and_applied_stay_bounded() -> None:
    def event(rung: int) -> RemediationEvent:
        return RemediationEvent(time=NOW, rung=rung, signal="KVCapacity", action=f"step {rung}", message="")

    state = RemediationState()
    for rung in range(1, 21):
        state = state.with_step(Overrides(max_model_len=8192 + rung), NOW, event(rung))
        if rung % 2 == 0:
            state = state.with_relax(NOW, event(state.rung - 1))
    for rung in range(state.rung + 1, 21):
        state = state.with_step(Overrides(max_model_len=9000 + rung), NOW, event(rung))
    assert state.rung == 20 and len(state.applied) == 20 and len(state.history) == 20
    assert state.history[-1].action == "step 20" and state.overrides == Overrides(max_model_len=9020)


def test_malformed_entries_are_dropped_not_fatal() -> None:
    state, warnings = read({"rung": 1, "applied": ["nonsense", {"replicas": 2}],
                            "history": [{"time": "not a time"}, {"time": "2026-12-01T00:00:00Z", "rung": 1,
                                                                 "signal": "OOMKilled", "action": "a"}],
                            "lastEvidence": 42})
    assert state.overrides == Overrides(replicas=2) and len(state.history) == 1 and state.last_evidence is None
    assert len(warnings) == 3
    assert read("a string")[0] == RemediationState() and read(None) == (RemediationState(), ())


def test_effective_replicas_is_the_last_override_clamped_else_the_spec() -> None:
    assert effective_replicas({"applied": [{"replicas": 3}, {"replicas": 2}]}, 1, 3) == 2
    assert effective_replicas({"applied": [{"replicas": 5000}]}, 1, 10**6) == 1000  # the status schema's bound
    assert effective_replicas({"applied": [{"replicas": 50}]}, 1, 3) == 3
    assert effective_replicas({"applied": [{"memoryLimitGiB": 54}]}, 4, None) == 4
    assert effective_replicas(None, 2, None) == 2 and effective_replicas({"applied": "x"}, 2, None) == 2


def test_the_status_schema_says_date_time_and_bounds() -> None:
    remediation = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"][
        "properties"]["remediation"]["properties"]
    for key in ("lastStepTime", "lastSignalTime", "lastRelaxTime"):
        assert remediation[key] == {**remediation[key], "type": "string", "format": "date-time"}
    assert remediation["history"]["items"]["properties"]["time"]["format"] == "date-time"
    assert (remediation["rung"]["minimum"], remediation["rung"]["maximum"]) == (0, 20)
    assert (remediation["relaxBackoff"]["minimum"], remediation["relaxBackoff"]["maximum"]) == (1, 16)
    replicas = remediation["applied"]["items"]["properties"]["replicas"]
    assert (replicas["minimum"], replicas["maximum"]) == (1, 1000)


# --- attribution: only the operator's own steps count (issue #15, class 7) -----------------------------------

AUTHOR = Author("uid-1", 3)
STEP_A, STEP_B = {"memoryLimitGiB": 54.0}, {"maxNumSeqs": 64}


def _chain(*steps: dict[str, Any], uid: str = "uid-1", generation: int = 2) -> list[dict[str, Any]]:
    chain, previous = [], ""
    for step in steps:
        previous = attestation(uid, generation, step, previous)
        chain.append({**step, "generation": generation, "attestation": previous})
    return chain


@pytest.mark.parametrize(("name", "applied", "kept"), [
    ("recorded by the operator", _chain(STEP_A, STEP_B), 2),
    ("no attestation", [STEP_A], 0),
    ("a made-up attestation", [{**STEP_A, "generation": 2, "attestation": "f" * 32}], 0),
    ("copied from another object", _chain(STEP_A, uid="uid-2"), 0),
    ("edited after it was recorded", [{**_chain(STEP_A)[0], "memoryLimitGiB": 190.0}], 0),
    ("a key added", [{**_chain(STEP_A)[0], "replicas": 3}], 0),
    ("from a generation the spec never had", _chain(STEP_A, generation=4), 0),
    ("no generation", [{k: v for k, v in _chain(STEP_A)[0].items() if k != "generation"}], 0),
    ("reordered", list(reversed(_chain(STEP_A, STEP_B))), 0),
    ("a forged entry after recorded ones", [*_chain(STEP_A), STEP_B], 1),
    ("a recorded entry after a forged one", [STEP_B, *_chain(STEP_A)], 0),
    ("not an object", ["memoryLimitGiB=54"], 0),
    ("numbers as the API server may hand them back", [{**_chain(STEP_A)[0], "memoryLimitGiB": 54}], 1),
])
def test_only_attested_steps_are_read(name: str, applied: list[Any], kept: int) -> None:
    state, _, dropped = RemediationState.read_attributed({"rung": len(applied), "applied": applied}, LIMITS, NOW,
                                                         AUTHOR)
    assert len(state.applied) == kept and state.rung == kept, name
    assert bool(dropped) == (kept < len(applied)), name
    if dropped:
        assert "not recorded by the operator" in dropped[0] and "not applied" in dropped[0]
    again, _, dropped_again = RemediationState.read_attributed(state.to_status(), LIMITS, NOW, AUTHOR)
    assert again == state and dropped_again == ()  # what the operator writes back reads as its own


def test_a_new_step_is_attested_with_the_current_generation_and_chained() -> None:
    state, _, _ = RemediationState.read_attributed({"rung": 1, "applied": _chain(STEP_A)}, LIMITS, NOW, AUTHOR)
    event = RemediationEvent(time=NOW, rung=2, signal="OOMKilled", action="a", message="m")
    stepped = state.with_step(Overrides(max_num_seqs=64), NOW, event).attested(AUTHOR)
    assert [e.generation for e in stepped.applied] == [2, 3]
    assert stepped.applied[1].attestation == attestation("uid-1", 3, {"maxNumSeqs": 64},
                                                          str(stepped.applied[0].attestation))


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                  max_size=3), max_leaves=10)
_entry = st.dictionaries(st.sampled_from(["memoryLimitGiB", "maxNumSeqs", "replicas", "generation", "attestation",
                                          "gpuMemoryUtilization", "x"]), _json, max_size=5)


@given(st.lists(_entry | _json, max_size=4), st.integers(-(10**30), 10**30))
@settings(max_examples=200, deadline=None)
def test_no_planted_entry_is_ever_applied_and_no_number_breaks_the_reader(planted: list[Any], number: int) -> None:
    """Whatever was planted (any JSON, huge numbers), the reader keeps nothing the operator did not attest and
    never raises; neither does the quiet resync's schedule on what it kept."""
    raw = {"rung": number, "relaxBackoff": number, "lastStepTime": "2026-12-01T11:00:00Z", "applied": planted}
    state, _, _ = RemediationState.read_attributed(raw, LIMITS, NOW, AUTHOR)
    assert state.applied == () and state.rung == 0
    policy = RemediationPolicy.model_construct(**{**RemediationPolicy().__dict__, "cooldown_seconds": abs(number),
                                                   "stable_window_seconds": abs(number),
                                                   "kv_saturation_window_seconds": abs(number)})
    assert next_due(state, policy, NOW, 60) > NOW
