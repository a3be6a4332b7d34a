"""desired()'s sections one at a time (desired/sections/), each a pure function over a Draft: a named-case table
per section, on Worlds built by hand (the whole pipeline is tests/unit/test_desired_intent.py's)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from llm_autopilot.api.lora import AdapterConfig
from llm_autopilot.api.status import Condition, ReleaseVerification, VerificationStatus
from llm_autopilot.api.v1alpha1 import CachedAdapter, CacheStatus, LLMDeploymentSpec, SourceStatus
from llm_autopilot.desired.burn_in import BurnInAsk, BurnInReading
from llm_autopilot.desired.lora_calls import LoRAKeep, LoRAPodCalls, LoRAPodsAsk, LoRAReading
from llm_autopilot.desired.lora_sync import Answer, PodView, Served
from llm_autopilot.desired.patch import merge_patch
from llm_autopilot.desired.pipeline import desired
from llm_autopilot.desired.planning import Rendered, context_of, counted_plan, render
from llm_autopilot.desired.sections import burn_in, cache, lora, plan, remediation, source, verification
from llm_autopilot.desired.status_read import ATTESTED, STATUS_FORGED, read_status
from llm_autopilot.desired.vocabulary import Asks, Draft
from llm_autopilot.desired.world import (
    AdapterReading,
    CacheObservation,
    SourceView,
    Unresolved,
    WorkloadView,
)
from llm_autopilot.planner.verify import Known
from llm_autopilot.remediation.decide import Evidence
from llm_autopilot.remediation.state import RemediationState
from tests.unit.fakes import merge_patch as apply_patch
from tests.unit.test_desired_intent import NOW, QWEN, _ready, available, world_for


def draft(spec: dict[str, Any] = QWEN, status: dict[str, Any] | None = None, **world: Any) -> Draft:
    return Draft(status or {}, dataclasses.replace(world_for(spec), **world), NOW)


def rendered(d: Draft, spec: dict[str, Any] = QWEN) -> Rendered:
    """The plan in force for ``spec`` on the Draft's World, as the pipeline renders it."""
    ctx = context_of(LLMDeploymentSpec.model_validate(spec), d.world, d.settings)
    choice = counted_plan(d, ctx, RemediationState().overrides)
    return render(ctx, choice, RemediationState().overrides, d.owner, d.settings, d.world.live)


def patch(d: Draft) -> dict[str, Any]:
    """The status patch the Draft would give now."""
    return merge_patch(d.raw, d.after)


def conditions(d: Draft) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in d.conditions}


# ---- plan and Ready -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlanCase:
    deployment: dict[str, Any] | None
    ready: str
    replicas: int
    #: status.plan as read is the plan rendered: no Planned Event, no plan in the patch
    same_plan: bool = False
    degraded: dict[str, Any] | None = None
    expect_degraded: tuple[str, str] = ("False", "AsPlanned")


PLAN_CASES = {
    "first pass, the workload available": PlanCase(available(), "True", 1),
    "first pass, no workload yet": PlanCase(None, "False", 0),
    "the plan as recorded: no Planned Event": PlanCase(available(), "True", 1, same_plan=True),
    "Degraded said by remediation is kept": PlanCase(
        available(), "True", 1, degraded={"type": "Degraded", "status": "True", "reason": "Remediated"},
        expect_degraded=("True", "Remediated")),
}


@pytest.mark.parametrize("name", sorted(PLAN_CASES))
def test_the_plan_section(name: str) -> None:
    case = PLAN_CASES[name]
    d = draft()
    r = rendered(d)
    if case.same_plan:
        d.raw["plan"] = d.status["plan"] = d.after["plan"] = r.status.model_dump(by_alias=True, exclude_none=True,
                                                                                 mode="json")
        d.read = d.read.model_copy(update={"plan": r.status})
    if case.degraded is not None:
        d.conditions = (Condition.model_validate(case.degraded),)
    plan.report_plan(d, r, LLMDeploymentSpec.model_validate(QWEN), case.deployment)
    got = conditions(d)
    assert got["Planned"] == ("True", "Planned") and got["Ready"][0] == case.ready, got
    assert got["Degraded"] == case.expect_degraded, got
    assert patch(d)["replicas"] == case.replicas and "selector" in patch(d)
    assert ("plan" in patch(d)) is not case.same_plan
    assert any(e[1] == "Planned" for e in d.out.events) is not case.same_plan


# ---- source -------------------------------------------------------------------------------------------------

INSPECTED = SourceStatus(uri="pvc://models/qwen", state="Inspected", job_name="inspect-qwen")


@dataclass(frozen=True)
class SourceCase:
    found: SourceView | None
    previous: dict[str, Any] | None
    #: status.source in the patch (absent: not in it)
    patch: Any = "absent"
    planned: tuple[str, str] | None = None
    retry: bool = False


SOURCE_CASES = {
    "nothing read, nothing recorded": SourceCase(None, None),
    "nothing read any more: removed": SourceCase(None, {"uri": "s3://b/m", "state": "Inspected"}, patch=None),
    "read the first time": SourceCase(SourceView(INSPECTED), None,
                                      patch={"uri": "pvc://models/qwen", "state": "Inspected",
                                             "jobName": "inspect-qwen", "message": ""}),
    "a field gone since: a null in the merge patch": SourceCase(
        SourceView(INSPECTED), {"uri": "s3://b/m", "state": "Inspected", "endpoint": "http://s3"},
        patch={"uri": "pvc://models/qwen", "jobName": "inspect-qwen", "message": "", "endpoint": None}),
    "being inspected: Planned=False, retried": SourceCase(
        SourceView(None, (), ("InspectingSource", "reading config.json")), None,
        planned=("False", "InspectingSource"), retry=True),
    "cannot be inspected: Planned=False with its reason": SourceCase(
        SourceView(None, (), ("SourceNotFound", "no claim")), None, planned=("False", "SourceNotFound"),
        retry=True),
}


@pytest.mark.parametrize("name", sorted(SOURCE_CASES))
def test_the_source_section(name: str) -> None:
    case = SOURCE_CASES[name]
    d = draft(status={"source": case.previous} if case.previous is not None else {})
    if case.found is not None and case.found.failure is not None:
        intent = source.inspecting(d, case.found)
        assert conditions(d)["Planned"] == case.planned and intent.retry is case.retry
        return
    source.report_source(d, case.found)
    assert patch(d).get("source", "absent") == case.patch


# ---- cache --------------------------------------------------------------------------------------------------

CACHE_CONDITIONS = {
    "complete": (CacheStatus(claim_name="c", state="Complete", bytes=10, total_bytes=10), (True, "Cached")),
    "downloading": (CacheStatus(claim_name="c", state="Downloading", bytes=5, total_bytes=10, percent=50.0),
                    (False, "Downloading")),
    "failed": (CacheStatus(claim_name="c", state="Failed", message="md5 mismatch"), (False, "CacheFailed")),
    "pending": (CacheStatus(claim_name="c", state="Pending"), (False, "Pending")),
}


@pytest.mark.parametrize("name", sorted(CACHE_CONDITIONS))
def test_the_cache_condition(name: str) -> None:
    status, expected = CACHE_CONDITIONS[name]
    assert cache.cache_condition(status)[:2] == expected


CACHED = {**QWEN, "model": {"name": "Qwen/Qwen3-8B", "cache": {"enabled": True}}}
CACHE_OBSERVED = {
    "no cache in the spec: nothing to create": (QWEN, False, list),
    "a cache not read yet: asked for": (CACHED, False, Asks),
    "a cache read for these inputs: its objects": (CACHED, True, list),
}


@pytest.mark.parametrize("name", sorted(CACHE_OBSERVED))
def test_the_cache_section_asks_before_it_decides(name: str) -> None:
    spec, read, kind = CACHE_OBSERVED[name]
    d = draft(spec)
    parsed = LLMDeploymentSpec.model_validate(spec)
    plan_in_force = rendered(d, spec).plan
    first = cache.observe_cache(d, parsed, plan_in_force)
    if read:
        assert isinstance(first, Asks) and first.cache is not None
        status = CacheStatus(claim_name=first.cache.claim, state="Downloading", bytes=1)
        d.world = dataclasses.replace(d.world, cache=CacheObservation(first.cache, ({"kind": "Job"},), status))
        first = cache.observe_cache(d, parsed, plan_in_force)
        assert d.cache_status == status
    assert isinstance(first, kind), first
    cache.report_cache(d)
    assert ("ModelCached" in conditions(d)) is (read and kind is list)


# ---- verification and calibration ---------------------------------------------------------------------------

VERIFIED = {"predictedTokens": 10, "predictedBlocks": 1, "predictedKVGiB": 1.0, "actualKVGiB": 1.0,
            "errorPercent": 0.0, "tolerancePercent": 10.0, "verified": True, "source": "metrics",
            "vllmVersion": "0.10.1", "time": "2031-05-17T08:00:00Z", "planHash": "p", "pods": []}
KNOWN_VERIFICATION = {
    "nothing recorded": (None, None),
    "garbled": ({**VERIFIED, "pods": "not a list"}, None),
    "judged with another tolerance": ({**VERIFIED, "tolerancePercent": 5.0}, None),
    "no plan recorded": ({**VERIFIED, "planHash": None}, None),
    "read for plan p": (VERIFIED, Known("p", frozenset())),
}


@pytest.mark.parametrize("name", sorted(KNOWN_VERIFICATION))
def test_what_status_verification_read(name: str) -> None:
    raw, expected = KNOWN_VERIFICATION[name]
    read = read_status({"verification": raw} if raw is not None else {})
    assert verification.known_verification(read.status.verification, 10.0) == expected
    assert bool(read.problems) is (name == "garbled")


def test_the_verification_section_asks_for_the_plans_pods_first() -> None:
    d = draft()
    r = rendered(d)
    asked = verification.report_verification(d, r, 10.0, None)
    assert asked is not None and asked.verification is not None and asked.verification.plan_hash == r.plan_hash
    assert patch(d) == {} and d.conditions == ()


# ---- burn-in ------------------------------------------------------------------------------------------------

PASSED = {"pod": "a", "passed": True, "reason": "r", "message": "m", "gpuSeconds": 1.0}
KNOWN_BURN_IN = {
    "nothing recorded": (None, "p", set()),
    "garbled": ({"planHash": "p", "pods": [{**PASSED, "pod": 3}]}, "p", set()),
    "another plan's": ({"planHash": "q", "pods": [PASSED]}, "p", set()),
    "this plan's": ({"planHash": "p", "pods": [PASSED]}, "p", {"a"}),
}


@pytest.mark.parametrize("name", sorted(KNOWN_BURN_IN))
def test_the_burn_in_verdicts_recorded(name: str) -> None:
    raw, plan_hash, pods = KNOWN_BURN_IN[name]
    read = read_status({"burnIn": raw} if raw is not None else {})
    assert set(burn_in.known_burn_in(read.status.burn_in, plan_hash)) == pods


BURNED = {**QWEN, "verification": {"burnIn": {}}}
BURN_IN_CASES: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "no burn-in asked: its condition and status.burnIn go": (
        QWEN, {"burnIn": {"planHash": "p", "pods": []},
               "conditions": [{"type": "BurnInPassed", "status": "True", "reason": "Passed"}]}, {"burnIn": None}),
    "asked, no pod ready yet: waiting": (BURNED, {}, {}),
}


@pytest.mark.parametrize("name", sorted(BURN_IN_CASES))
def test_the_burn_in_section(name: str) -> None:
    spec, status, expected = BURN_IN_CASES[name]
    d = draft(spec, status)
    r = rendered(d, spec)
    d.world = d.world.with_reading(BurnInReading(r.plan_hash))
    signal = burn_in.report_burn_in(d, LLMDeploymentSpec.model_validate(spec), r)
    assert signal is None
    for key, value in expected.items():
        assert patch(d)[key] == value
    assert ("BurnInPassed" in conditions(d)) is (spec is BURNED)


# ---- LoRA ---------------------------------------------------------------------------------------------------

LORA = {**QWEN, "lora": {"adapters": [{"name": "a", "source": "hf://acme/a"}], "maxLoraRank": 8}}
ADAPTER_REFUSALS = {
    "no LoRA": (QWEN, AdapterReading(), None),
    "an adapter within the rank": (LORA, AdapterReading(configs={"a": AdapterConfig(8, None)}), None),
    "an adapter above the rank: refused for good": (
        LORA, AdapterReading(configs={"a": AdapterConfig(64, None)}), ("LoRAAdapterRefused", False)),
    "an adapter not read: retried": (LORA, AdapterReading(errors=["a: 404"]), ("LoRAAdapterUnresolved", True)),
}


@pytest.mark.parametrize("name", sorted(ADAPTER_REFUSALS))
def test_the_adapters_refused(name: str) -> None:
    spec, reading, expected = ADAPTER_REFUSALS[name]
    refused = lora.adapter_refusal(LLMDeploymentSpec.model_validate(spec), reading)
    assert (None if refused is None else (refused.reason, refused.retry)) == expected


def _adapter(state: str, message: str = "") -> CachedAdapter:
    return CachedAdapter(name=state.lower(), source="s3://b/a", folder="a", job_name="j", state=state,
                         message=message)


DOWNLOADS = {
    "no cache": (None, {}),
    "complete: served": (CacheStatus(claim_name="c", state="Complete", adapters=[_adapter("Complete")]), {}),
    "downloading: waits": (CacheStatus(claim_name="c", state="Complete", adapters=[_adapter("Downloading")]),
                           {"downloading": "downloading into PVC c (Job j, Downloading); served once complete"}),
    "failed: says why": (CacheStatus(claim_name="c", state="Complete", adapters=[_adapter("Failed", "403")]),
                         {"failed": "its download into PVC c failed: 403"}),
}


@pytest.mark.parametrize("name", sorted(DOWNLOADS))
def test_the_adapters_still_downloading(name: str) -> None:
    status, waiting = DOWNLOADS[name]
    assert lora.downloads_waiting(status) == waiting


# ---- remediation --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WorkloadCase:
    spec: dict[str, Any]
    workload: bool
    evidence: bool
    burn_in: bool = False
    asks: set[str] = field(default_factory=set)


WORKLOAD_CASES = {
    "nothing read: the workload and its evidence": WorkloadCase(QWEN, False, False, asks={"workload", "evidence"}),
    "no evidence yet: asked again": WorkloadCase(QWEN, True, False, asks={"workload", "evidence"}),
    "read: the workload as read": WorkloadCase(QWEN, True, True),
    "a burn-in not read yet: asked with the workload": WorkloadCase(
        BURNED, True, True, asks={"workload", "evidence", "features"}),
    "a burn-in read: the workload as read": WorkloadCase(BURNED, True, True, burn_in=True),
}


@pytest.mark.parametrize("name", sorted(WORKLOAD_CASES))
def test_the_remediation_section_asks_for_the_workload_and_its_evidence(name: str) -> None:
    case = WORKLOAD_CASES[name]
    d = draft(case.spec)
    r = rendered(d, case.spec)
    d.world = dataclasses.replace(
        d.world, workload=WorkloadView(r.plan_hash, available()) if case.workload else None,
        evidence=Evidence(plan_id=r.plan_hash) if case.evidence else None,
        readings=(BurnInReading(r.plan_hash),) if case.burn_in else ())
    spec = LLMDeploymentSpec.model_validate(case.spec)
    features = tuple(ask for ask in (burn_in.ask(d, spec, r),) if ask is not None)
    got = remediation.workload_of(d, spec, r, RemediationState(), features)
    if not case.asks:
        assert got == available()
        return
    assert isinstance(got, Asks)
    assert {f.name for f in dataclasses.fields(got) if getattr(got, f.name) not in (None, ())} == case.asks
    assert [type(ask) for ask in got.features] == ([BurnInAsk] if "features" in case.asks else [])


def test_the_remediation_section_reads_only_the_operators_steps() -> None:
    d = draft(status={"remediation": {"steps": "garbled"}})
    ctx = context_of(LLMDeploymentSpec.model_validate(QWEN), d.world, d.settings)
    state = remediation.read_state(d, ctx)
    assert state.overrides == RemediationState().overrides and d.state == state


def test_sections_write_only_through_the_draft() -> None:
    """A section given a World that is not read yet asks; it leaves the status as read untouched."""
    status: dict[str, Any] = {"observedGeneration": 2}
    d = draft(status=status)
    assert isinstance(remediation.workload_of(d, LLMDeploymentSpec.model_validate(QWEN), rendered(d),
                                              RemediationState()), Asks)
    assert d.raw == {"observedGeneration": 2} and patch(d) == {}


# ---- the status patch ---------------------------------------------------------------------------------------

MERGE_PATCHES: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "equal: nothing": ({"a": 1, "b": {"c": [1]}}, {"a": 1, "b": {"c": [1]}}, {}),
    "a key removed: null": ({"a": 1, "b": 2}, {"a": 1}, {"b": None}),
    "a key added": ({}, {"a": {"b": 1}}, {"a": {"b": 1}}),
    "an object changed: only its changed fields, nulls for the gone ones": (
        {"a": {"b": 1, "c": 2, "d": 3}}, {"a": {"b": 1, "c": 5}}, {"a": {"c": 5, "d": None}}),
    "a list changed: replaced whole": ({"a": [1, 2]}, {"a": [2]}, {"a": [2]}),
    "a garbled value replaced by an object: the whole object": ({"a": "junk"}, {"a": {"b": 1}}, {"a": {"b": 1}}),
    "a None in the decided status: absent": ({"a": 1}, {"a": None}, {"a": None}),
    "an object that only gained nulls: nothing (no empty write)": ({"a": {"b": 1}}, {"a": {"b": 1, "c": None}}, {}),
}


def _without_nulls(value: Any) -> Any:
    """A document as the API server stores it after a merge patch: no null anywhere."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


@pytest.mark.parametrize("name", sorted(MERGE_PATCHES))
def test_the_merge_patch(name: str) -> None:
    before, after, expected = MERGE_PATCHES[name]
    assert merge_patch(before, after) == expected
    assert apply_patch(before, expected) == _without_nulls(after)  # RFC 7386 applied


# ---- the status read ----------------------------------------------------------------------------------------

GARBLED = {
    "conditions not a list": ("conditions", "junk"),
    "a condition without a type": ("conditions", [{"status": "True", "reason": "r"}]),
    "a condition that is a string": ("conditions", ["Planned"]),
    "a plan that is a number": ("plan", 7),
    "status.burnIn garbled": ("burnIn", {"planHash": ["x"]}),
    "status.cache garbled": ("cache", {"state": "Exploded"}),
    "status.source garbled": ("source", "s3://elsewhere"),
    "status.verification garbled": ("verification", {"pods": 3}),
    "status.loraSources garbled": ("loraSources", {"a": 1}),
    "status.lora garbled": ("lora", 1),
    "status.replicas garbled": ("replicas", "three"),
    "status.observedGeneration garbled": ("observedGeneration", {"x": 1}),
}


@pytest.mark.parametrize("name", sorted(GARBLED))
def test_a_status_field_that_does_not_parse_is_reported_and_decided_again(name: str) -> None:
    key, junk = GARBLED[name]
    intent = desired(QWEN, {key: junk}, _ready(QWEN), NOW)  # never a traceback
    said = {c.type: c for c in intent.conditions}["StatusRead"]
    assert said.status == "False" and f"status.{key}" in said.message, said
    assert ("Warning", "StatusUnreadable", said.message) in intent.events
    assert intent.objects and {c.type: c.status for c in intent.conditions}["Planned"] == "True"
    assert key in intent.status  # rewritten, or removed (null)
    # the next pass reads a clean status: said once, then True again
    clean = apply_patch({key: junk}, intent.status)
    again = desired(QWEN, clean, _ready(QWEN), NOW)
    assert {c.type: c.status for c in again.conditions}["StatusRead"] == "True"
    assert not any(e[1] == "StatusUnreadable" for e in again.events)


def test_a_garbled_pin_is_its_own_readers_chosen_again_and_kept_by_a_failing_pass() -> None:
    intent = desired(QWEN, {"kvCalibration": ["x"]}, _ready(QWEN), NOW)
    assert "StatusRead" not in {c.type for c in intent.conditions}
    assert isinstance(intent.status["kvCalibration"], dict)  # chosen again
    # a pass that stops before the calibration is chosen leaves it as it is, for its reader (not nulled)
    failing = dataclasses.replace(_ready(QWEN), model=Unresolved("ModelUnresolved", "the Hub is down", retry=True))
    assert "kvCalibration" not in desired(QWEN, {"kvCalibration": ["x"]}, failing, NOW).status


def test_a_section_not_attested_is_set_aside_said_once_and_attested_by_the_write() -> None:
    first = desired(QWEN, {}, _ready(QWEN), NOW)
    status = apply_patch({}, first.status)
    attested = frozenset(k for k in ATTESTED if k in status)
    assert "kvCalibration" in attested and set(first.attest) == attested
    # the operator's own status: nothing said, nothing to attest again
    again = desired(QWEN, status, dataclasses.replace(_ready(QWEN), attested=attested), NOW)
    assert not any(e.reason == STATUS_FORGED for e in again.events) and not again.attest
    # a forged pin (another ratio) is set aside: chosen again, said once, attested by the write
    forged = {**status, "kvCalibration": {**status["kvCalibration"], "ratio": 1.3, "reason": "forged"}}
    seen = desired(QWEN, forged, dataclasses.replace(_ready(QWEN), attested=attested - {"kvCalibration"}), NOW)
    assert [e.reason for e in seen.events].count(STATUS_FORGED) == 1
    assert any("status.kvCalibration: not attested" in n for n in seen.notes)
    assert seen.attest["kvCalibration"] == status["kvCalibration"]  # chosen as before, without the forged ratio
    assert apply_patch(forged, seen.status)["kvCalibration"] == status["kvCalibration"]
    assert seen.objects == first.objects


def test_a_forged_section_a_failing_pass_does_not_decide_is_removed_with_its_attestation() -> None:
    failing = dataclasses.replace(_ready(QWEN), model=Unresolved("ModelUnresolved", "the Hub is down", retry=True),
                                  attested=frozenset())
    intent = desired(QWEN, {"burnIn": {"planHash": "p", "pods": []}}, failing, NOW)
    assert intent.status["burnIn"] is None and intent.attest == {"burnIn": None}
    assert any(e.reason == STATUS_FORGED for e in intent.events)


def test_a_status_that_parses_says_nothing_of_it() -> None:
    intent = desired(QWEN, {}, _ready(QWEN), NOW)
    assert "StatusRead" not in {c.type for c in intent.conditions}


# ---- status.lora ---------------------------------------------------------------------------------------------

RUNTIME_LORA = {**QWEN, "vllm": {"version": "0.32.0"},
                "lora": {"adapters": [{"name": "sql", "source": "hf://org/sql"}], "maxLoras": 1, "maxLoraRank": 8,
                         "runtimeUpdates": True}}
ROLLOUT_LORA = {**RUNTIME_LORA, "lora": {**RUNTIME_LORA["lora"], "runtimeUpdates": False}}
SQL = Served("sql", "org/sql")
OLD = Served("old", "org/old")
REFUSED = Answer("load", "sql", "hf://org/sql", ok=False, refused=True, text="/v1/load_lora_adapter: 404: not found")


def pod(served: tuple[Served, ...] | None, *answers: Answer, name: str = "p-0", uid: str = "u-0") -> PodView:
    return PodView(name, served, uid, "10.0.0.1", answers=answers)


@dataclass(frozen=True)
class LoRACase:
    spec: dict[str, Any]
    #: the Ready pods as the reader found them (None: the spec has no LoRA, nothing read)
    pods: tuple[PodView, ...] | None
    #: per adapter of status.lora: (name, pods serving it, pods pending, message)
    adapters: list[tuple[str, tuple[str, ...], tuple[str, ...], str]] | None
    #: each pod's calls: (pod, [(kind, name)])
    calls: list[tuple[str, list[tuple[str, str]]]] = field(default_factory=list)
    #: the pods (uids) whose kept answers stay
    keep: tuple[str, ...] = ()
    removing: list[str] = field(default_factory=list)
    settled: bool = True
    events: list[str] = field(default_factory=list)
    #: status.lora as read: this same pass's, decided on the same pods
    previous: bool = False


LORA_CASES = {
    "no LoRA: status.lora goes, no pod is called, every answer kept dropped": LoRACase(QWEN, None, None),
    "nothing served yet: pending, and a load": LoRACase(
        RUNTIME_LORA, (pod(()),), [("sql", (), ("p-0",), "")], calls=[("p-0", [("load", "sql")])], keep=("u-0",),
        settled=False),
    "served exactly: settled, no call": LoRACase(RUNTIME_LORA, (pod((SQL,)),), [("sql", ("p-0",), (), "")],
                                                 keep=("u-0",)),
    "an adapter the spec dropped: an unload": LoRACase(
        RUNTIME_LORA, (pod((OLD, SQL)),), [("sql", ("p-0",), (), "")], calls=[("p-0", [("unload", "old")])],
        keep=("u-0",), removing=["old"], settled=False),
    "a refusal kept: vLLM's text said, not loaded again on that pod": LoRACase(
        RUNTIME_LORA, (pod((), REFUSED), pod((), name="p-1", uid="u-1")),
        [("sql", (), ("p-0", "p-1"), "p-0: /v1/load_lora_adapter: 404: not found")],
        calls=[("p-1", [("load", "sql")])], keep=("u-0", "u-1"), settled=False, events=["LoRAAdapterFailed"]),
    "a refusal kept of another source: loaded again": LoRACase(
        RUNTIME_LORA, (pod((), dataclasses.replace(REFUSED, source="hf://org/sql-v1")),),
        [("sql", (), ("p-0",), "")], calls=[("p-0", [("load", "sql")])], keep=("u-0",), settled=False),
    "the same refusal already in the status: not said again": LoRACase(
        RUNTIME_LORA, (pod((), REFUSED),), [("sql", (), ("p-0",), "p-0: /v1/load_lora_adapter: 404: not found")],
        keep=("u-0",), settled=False, previous=True),
    "a load the last pass made, served now: said once": LoRACase(
        RUNTIME_LORA, (pod((SQL,), Answer("load", "sql", "hf://org/sql", ok=True)),), [("sql", ("p-0",), (), "")],
        keep=("u-0",), events=["LoRAAdapterLoaded"]),
    "a pod gone: only the pods read keep their answers": LoRACase(
        RUNTIME_LORA, (pod((SQL,), name="p-1", uid="u-1"),), [("sql", ("p-1",), (), "")], keep=("u-1",)),
    "rollout: read, never called": LoRACase(ROLLOUT_LORA, (pod((OLD,)),), [("sql", (), ("p-0",), "")],
                                            keep=("u-0",), removing=["old"], settled=False),
    "a pod that cannot be read: said, not called": LoRACase(
        RUNTIME_LORA, (PodView("p-0", None, "u-0", unreadable="/v1/models: timed out"),),
        [("sql", (), ("p-0",), "p-0: /v1/models: timed out")], keep=("u-0",), settled=False),
}


@pytest.mark.parametrize("name", sorted(LORA_CASES))
def test_the_lora_section(name: str) -> None:
    """status.lora and the calls decided in one pass, from the pods as read before the calls."""
    case = LORA_CASES[name]
    spec = LLMDeploymentSpec.model_validate(case.spec)
    readings = (LoRAReading(case.pods),) if case.pods is not None else ()

    def report(status: dict[str, Any] | None) -> Draft:
        d = draft(case.spec, status, readings=readings)
        d.out.settled = True
        assert lora.ask(d, spec) is None  # read already, or nothing to read
        lora.report_lora(d, spec, rendered(d, case.spec).plan.config)
        return d

    as_read = report(None).after["lora"] if case.previous else {"updates": "Runtime", "reason": "as read"}
    d = report({"lora": as_read})
    keeps = [e for e in d.out.effects if isinstance(e, LoRAKeep)]
    calls = [(e.pod, [(c.action.kind, c.action.name) for c in e.calls])
             for e in d.out.effects if isinstance(e, LoRAPodCalls)]
    assert keeps == [LoRAKeep(case.keep)] and calls == case.calls
    if case.adapters is None:
        assert patch(d)["lora"] is None
    else:
        decided = d.decided.lora
        assert decided is not None
        assert [(a.name, a.pods, a.pending, a.message) for a in decided.adapters] == case.adapters
        assert [a.name for a in decided.removing] == case.removing
    assert d.out.settled is case.settled and [e.reason for e in d.out.events] == case.events
    assert d.out.retry is bool(case.calls)  # a pass soon after the calls reads the pods again


def test_the_lora_section_asks_for_the_pods_with_the_workload() -> None:
    d = draft(RUNTIME_LORA)
    assert lora.ask(d, LLMDeploymentSpec.model_validate(RUNTIME_LORA)) == LoRAPodsAsk(d.owner.namespace, d.owner.name)
    assert lora.ask(d, LLMDeploymentSpec.model_validate(QWEN)) is None


def _release(version: str, tokens: int, minute: int) -> ReleaseVerification:
    return ReleaseVerification(vllm_version=version, predicted_tokens=1000, actual_tokens=tokens, error_percent=0.0,
                               verified=True, plan_hash="h", time=datetime(2031, 5, 17, 8, minute, tzinfo=UTC))


def _found(version: str, tokens: int, minute: int) -> VerificationStatus:
    return VerificationStatus(predicted_tokens=1000, actual_tokens=tokens, predicted_blocks=10, predicted_kv_gib=1.0,
                              actual_kv_gib=1.0, error_percent=0.0, tolerance_percent=10.0, verified=True,
                              source="metrics", vllm_version=version, time=datetime(2031, 5, 17, 8, minute,
                                                                                    tzinfo=UTC), plan_hash="h")


RELEASE_CASES = {
    "the first reading": ((), ("0.32.0", 900), [("0.32.0", 900)]),
    "an upgrade: the old release kept, the new one last": (
        (_release("0.31.0", 800, 1),), ("0.32.0", 900), [("0.31.0", 800), ("0.32.0", 900)]),
    "a release read again: replaced and moved last": (
        (_release("0.31.0", 800, 1), _release("0.32.0", 900, 2)), ("0.31.0", 850),
        [("0.32.0", 900), ("0.31.0", 850)]),
    "bounded: the oldest of 8 goes": (
        tuple(_release(f"0.2{i}.0", 100 + i, i) for i in range(8)), ("0.33.0", 999),
        [(f"0.2{i}.0", 100 + i) for i in range(1, 8)] + [("0.33.0", 999)]),
}


@pytest.mark.parametrize("name", sorted(RELEASE_CASES))
def test_status_releases(name: str) -> None:
    previous, (version, tokens), expected = RELEASE_CASES[name]
    got = verification.releases_seen(previous, _found(version, tokens, 30))
    assert [(r.vllm_version, r.actual_tokens) for r in got] == expected
    assert len(got) <= verification.RELEASES_KEPT
