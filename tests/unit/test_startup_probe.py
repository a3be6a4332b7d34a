"""The startup probe that learns (issue #29 item 4): the decision (render/rollout.py probe_budget), the choice per
plan (desired/startup_probe.py), the starts observed, the store's section (planner/start_times.py) and, through
the reconcile, that learning never rolls the pods it learned from while the next deployment of the same model,
image and GPU gets the learned probe."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from llm_autopilot.api.v1alpha1 import StartupProbeStatus
from llm_autopilot.controller.calibration_store import CONFIGMAP_NAME, KEY_ENV, CalibrationBook
from llm_autopilot.desired.startup_probe import StartupBudgets, observed_starts
from llm_autopilot.planner.calibration import CONFIGMAP_KEY, parse_store, store_to_json
from llm_autopilot.planner.start_times import (
    STARTS_KEPT,
    Start,
    StartKey,
    parse_starts,
    record_starts,
    start_attestation,
    starts_to_json,
)
from llm_autopilot.remediation.recovery import PodReadiness, pod_readiness
from llm_autopilot.render import rollout
from llm_autopilot.render.kubernetes import INPUT_HASH, PLAN_HASH
from tests.e2e.real_vllm import START_SECONDS
from tests.unit.fakes import NAMESPACE, FakeCluster, Run
from tests.unit.test_calibration_store import OPERATOR_NS, SECRET, ConfigMaps

NOW = datetime(2031, 5, 17, 8, 30, tzinfo=UTC)
KEY = StartKey("vllm/vllm-openai:v0.33.0", "Qwen/Qwen3-8B", "H100-80GB")
FLOOR = rollout.DEFAULT_LEARNED_FLOOR_SECONDS


@pytest.fixture(autouse=True)
def attestation_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)


# ---- the decision ----------------------------------------------------------------------------------------------

BUDGETS = {
    # name: (formula, starts, download, expected seconds, learned from)
    "no start observed: the formula": (1000, [], 0.0, 1000, 0),
    "one fast start: the floor": (1000, [60.0], 0.0, FLOOR, 0 + 1),
    "a slow cluster: 3x its median": (2000, [300.0, 310.0, 320.0], 0.0, 930, 3),
    "a slow first start is outvoted by the later ones": (2000, [600.0, 200.0, 210.0], 0.0, 630, 3),
    "an even count takes the higher middle start": (2000, [200.0, 300.0], 0.0, 900, 2),
    "never above the formula": (900, [400.0], 0.0, 900, 1),
    "a download's estimate goes on top": (3000, [200.0], 160.0, 760, 1),
    "rounded up to whole probe periods": (2000, [201.0], 0.0, 610, 1),
}


@pytest.mark.parametrize("case", BUDGETS)
def test_the_probe_budget(case: str) -> None:
    formula, starts, download, seconds, learned_from = BUDGETS[case]
    budget = rollout.probe_budget(formula, starts, floor=FLOOR, download=download)
    assert (budget.seconds, budget.starts, budget.formula_seconds) == (seconds, learned_from, formula)
    assert budget.seconds % rollout.STARTUP_PERIOD_SECONDS == 0
    assert ("learned from" in budget.message) == bool(starts), budget.message


def test_the_floor_lets_the_cpu_build_start_on_the_ci_machine() -> None:
    """The floor is what the real CPU vLLM is given on the loaded 2-core CI machine (tests/e2e/real_vllm.py)."""
    fast = rollout.probe_budget(rollout.MIN_STARTUP_SECONDS, [20.0], floor=FLOOR)
    assert fast.seconds >= START_SECONDS


# ---- the choice per plan ---------------------------------------------------------------------------------------

def start(seconds: float, pod: str, age: timedelta = timedelta(0)) -> Start:
    return Start(seconds, NOW - age, f"{NAMESPACE}/{pod}")


LEARNED = {KEY: (start(100.0, "a"), start(110.0, "b"), start(120.0, "c"))}
PINNED = StartupProbeStatus(plan_hash="plan-1", image=KEY.image, model=KEY.model, gpu_product=KEY.gpu_product,
                            seconds=1000, formula_seconds=1000, message="the first guess").model_dump(by_alias=True)

CHOICES: dict[str, tuple[dict[str, Any], str, bool, bool, int]] = {
    # name: (status read, plan hash, learns, chosen again (pin forged), expected seconds)
    "a new deployment learns from the store (3 x 110 s, under the floor)": ({}, "plan-1", True, False, 420),
    "the plan in force keeps its pin, whatever was learned since": (
        {"plan": {}, "startupProbe": PINNED}, "plan-1", True, False, 1000),
    "a new plan (a step, a spec change) takes what was learned": (
        {"plan": {}, "startupProbe": PINNED}, "plan-2", True, False, 420),
    "planned before the probe learned: the formula until the plan changes": ({"plan": {}}, "plan-1", True, False,
                                                                             1000),
    "a forged pin is chosen again": ({"plan": {}}, "plan-1", True, True, 420),
    "a group across nodes: the formula": ({}, "plan-1", False, False, 1000),
}


@pytest.mark.parametrize("case", CHOICES)
def test_the_choice(case: str) -> None:
    status, plan_hash, learns, chosen_again, seconds = CHOICES[case]
    budgets = StartupBudgets.of(status, LEARNED, FLOOR, NOW, chosen_again=chosen_again)
    assert budgets.budget(plan_hash, KEY, 1000, learns=learns).seconds == seconds


def test_a_download_learns_from_loads_with_the_estimate_on_top_until_downloads_are_observed() -> None:
    downloading = StartKey(KEY.image, KEY.model, KEY.gpu_product, downloads=True)
    budgets = StartupBudgets.of({}, LEARNED, FLOOR, NOW)
    assert budgets.budget("p", downloading, 3000, learns=True, download=400.0).seconds == 330 + 400
    observed = {**LEARNED, downloading: (start(500.0, "d"),)}
    assert StartupBudgets.of({}, observed, FLOOR, NOW).budget("p", downloading, 3000, learns=True,
                                                                download=400.0).seconds == 1500


# ---- the starts observed -----------------------------------------------------------------------------------------

READY_AT = NOW - timedelta(minutes=1)


def pod(name: str = "x-1", plan: str = "plan-1", *, ready: bool = True, restarts: int = 0,
        terminating: bool = False, started: datetime | None = READY_AT - timedelta(seconds=95)) -> PodReadiness:
    return PodReadiness(plan, READY_AT if ready else None, terminating, name, started, restarts)


OBSERVED = {
    "a pod of the plan, Ready: its start": ((pod(),), frozenset(), [95.0]),
    "already in the store": ((pod(),), frozenset({f"{NAMESPACE}/x-1"}), []),
    "another plan's pod": ((pod(plan="plan-0"),), frozenset(), []),
    "not Ready yet": ((pod(ready=False),), frozenset(), []),
    "restarted after a crash: another kind of start": ((pod(restarts=1),), frozenset(), []),
    "being deleted": ((pod(terminating=True),), frozenset(), []),
    "no start time": ((pod(started=None),), frozenset(), []),
    "Ready before it started (a broken clock)": ((pod(started=READY_AT + timedelta(seconds=5)),), frozenset(), []),
}


@pytest.mark.parametrize("case", OBSERVED)
def test_the_starts_observed(case: str) -> None:
    pods, known, seconds = OBSERVED[case]
    assert [s.seconds for s in observed_starts(pods, "plan-1", NAMESPACE, known)] == seconds


def test_a_start_is_read_from_the_pod_and_from_the_pod_watchs_summary() -> None:
    status = {"containerStatuses": [{"name": "vllm", "restartCount": 0,
                                     "state": {"running": {"startedAt": "2031-05-17T08:00:00Z"}}}]}
    api = {"metadata": {"name": "x-1", "annotations": {PLAN_HASH: "p"}},
           "status": {**status, "conditions": [{"type": "Ready", "status": "True",
                                                "lastTransitionTime": "2031-05-17T08:01:30Z"}]}}
    summary = {"metadata": {"name": "x-1", "annotations": {PLAN_HASH: "p"}},
               "status": {**status, "ready": "True", "readySince": "2031-05-17T08:01:30Z"}}
    for seen in (api, summary):
        (found,) = observed_starts((pod_readiness(seen, PLAN_HASH, "vllm"),), "p", NAMESPACE, frozenset())
        assert (found.seconds, found.pod) == (90.0, f"{NAMESPACE}/x-1")


# ---- the store's section ---------------------------------------------------------------------------------------

def written(key: StartKey, *starts: Start, secret: str = SECRET) -> list[dict[str, Any]]:
    return starts_to_json({key: tuple(starts)}, secret.encode())


def test_the_operators_starts_round_trip_and_others_are_dropped_with_a_message() -> None:
    raw = written(KEY, start(100.0, "a"), start(110.0, "b"))
    parsed, problems = parse_starts(raw, NOW, SECRET.encode())
    assert parsed == {KEY: (start(100.0, "a"), start(110.0, "b"))} and problems == ()
    forged = written(KEY, start(5.0, "c"), secret="f" * 32)  # written without the operator's key
    parsed, problems = parse_starts(raw + forged, NOW, SECRET.encode())
    assert parsed[KEY] == (start(100.0, "a"), start(110.0, "b"))
    assert len(problems) == 1 and "no attestation of this operator's" in problems[0]


MALFORMED: dict[str, Any] = {
    "not a list": "fast",
    "an entry not an object": ["fast"],
    "an image that is not one": [{"image": "x; rm -rf /", "model": "m", "gpuProduct": "L4", "starts": []}],
    "downloads not a boolean": [{"image": "i", "model": "m", "gpuProduct": "L4", "downloads": "yes", "starts": []}],
    "starts not a list": [{"image": "i", "model": "m", "gpuProduct": "L4", "starts": {}}],
    "a negative start": [{"image": "i", "model": "m", "gpuProduct": "L4",
                          "starts": [{"seconds": -1, "time": NOW.isoformat(), "pod": "ns/p"}]}],
    "a start in the future": [{"image": "i", "model": "m", "gpuProduct": "L4", "starts": [
        {"seconds": 10, "time": (NOW + timedelta(hours=1)).isoformat(), "pod": "ns/p"}]}],
    "a pod that is not namespace/name": [{"image": "i", "model": "m", "gpuProduct": "L4",
                                          "starts": [{"seconds": 10, "time": NOW.isoformat(), "pod": "p"}]}],
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_section_is_dropped_and_said_never_raised(case: str) -> None:
    parsed, problems = parse_starts(MALFORMED[case], NOW, SECRET.encode())
    assert not any(parsed.values()) and problems


def test_a_malformed_starts_section_leaves_the_kv_calibration_readable() -> None:
    store, problems = parse_store({"version": 1, "entries": [], "starts": "garbage"}, NOW, SECRET.encode())
    assert not store.starts and problems


def test_the_store_keeps_the_newest_starts_per_key_one_per_pod() -> None:
    starts: dict[StartKey, tuple[Start, ...]] = {}
    for i in range(STARTS_KEPT + 3):
        starts = record_starts(starts, KEY, (start(100.0 + i, f"p{i}", timedelta(minutes=60 - i)),), NOW)
    again = record_starts(starts, KEY, (start(999.0, f"p{STARTS_KEPT + 2}"),), NOW)  # the same pod again
    assert again == starts and len(starts[KEY]) == STARTS_KEPT
    assert [s.pod for s in starts[KEY]][-1] == f"{NAMESPACE}/p{STARTS_KEPT + 2}"
    aged = record_starts(starts, KEY, (), NOW + timedelta(days=31))
    assert aged[KEY] == ()


def test_the_book_writes_new_starts_once() -> None:
    maps = ConfigMaps()
    book = CalibrationBook(maps, OPERATOR_NS)
    assert book.record_starts(KEY, (start(100.0, "a"),), NOW)
    assert not book.record_starts(KEY, (start(100.0, "a"),), NOW)  # already there: no write
    raw = json.loads(maps.items[(OPERATOR_NS, CONFIGMAP_NAME)]["data"][CONFIGMAP_KEY])
    (entry,) = raw["starts"]
    assert entry["starts"][0]["attestation"] == start_attestation(SECRET.encode(), KEY, start(100.0, "a"))
    store, _ = book.current(NOW)
    assert store is not None and store.starts == {KEY: (start(100.0, "a"),)}
    assert store_to_json(store, SECRET.encode())["starts"] == raw["starts"]


# ---- through the reconcile ---------------------------------------------------------------------------------------

SPEC = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-h100-80gb"},
        "serving": {"maxModelLen": 16384, "minMaxModelLen": 4096}}


def probe_seconds(run: Run) -> int:
    probe = run.cluster.deployment(run.name)["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    return int(probe["periodSeconds"] * probe["failureThreshold"])


def ready(run: Run, name: str, *, start_seconds: int) -> None:
    """A pod of the plan in force, Ready ``start_seconds`` after its vLLM container started."""
    started = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    run.cluster.pod_list.append({
        "metadata": {"name": name, "annotations": {PLAN_HASH: run.cluster.plan_hash(run.name)}},
        "status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": (
            started + timedelta(seconds=start_seconds)).isoformat()}],
                   "containerStatuses": [{"name": "vllm", "restartCount": 0, "ready": True,
                                          "state": {"running": {"startedAt": started.isoformat()}}}]}})


def test_learning_rolls_no_pod_and_the_next_deployment_gets_the_learned_probe() -> None:
    book = CalibrationBook(ConfigMaps(), OPERATOR_NS)
    first = Run(SPEC, calibration=book, name="first", uid="uid-first", cluster=FakeCluster())
    first.once()
    formula = probe_seconds(first)
    assert first.status["startupProbe"]["starts"] == 0 and first.status["startupProbe"]["seconds"] == formula
    assert "the first guess" in first.status["startupProbe"]["message"]
    template = first.cluster.deployment("first")["metadata"]["annotations"][INPUT_HASH]
    ready(first, "first-a", start_seconds=40)
    first.once()
    store, _ = book.current(datetime.now(UTC))
    assert store is not None and [s.seconds for s in store.starts[next(iter(store.starts))]] == [40.0]
    ready(first, "first-b", start_seconds=50)
    for _ in range(2):
        first.once()
        # learned from its own pods, and never rolled by it: the same template, the probe as pinned
        assert first.cluster.deployment("first")["metadata"]["annotations"][INPUT_HASH] == template
        assert probe_seconds(first) == formula and first.status["startupProbe"]["starts"] == 0
    assert len(book.current(datetime.now(UTC))[0].starts[next(iter(store.starts))]) == 2  # type: ignore[union-attr]

    second = Run(SPEC, calibration=book, name="second", uid="uid-second", cluster=FakeCluster())
    second.once()
    learned = second.status["startupProbe"]
    assert learned["starts"] == 2 and learned["medianStartSeconds"] == 50.0, learned
    assert probe_seconds(second) == learned["seconds"] == max(FLOOR, 150) < formula
    assert "learned from 2 observed starts" in learned["message"]


def test_a_lost_status_write_does_not_choose_again_from_a_store_that_changed() -> None:
    book = CalibrationBook(ConfigMaps(), OPERATOR_NS)
    now = datetime.now(UTC)
    loads = StartKey("vllm/vllm-openai:v0.33.0", "Qwen/Qwen3-8B", "H100-80GB")
    book.record_starts(loads, (Start(100.0, now, "a/p"),), now)
    run = Run(SPEC, calibration=book)
    run.once_losing_status()
    chosen = probe_seconds(run)
    assert "plan" not in run.status  # the status after the children was really lost
    # the pod downloads from the Hub: 3 x 100 s loaded, plus 164 s for its 16.4 GB at the formula's 100 MB/s
    assert run.status["startupProbe"]["seconds"] == chosen == 470  # recorded before the children
    book.record_starts(loads, (Start(20.0, now, "a/q"), Start(20.0, now, "a/r")), now)
    run.once()
    assert probe_seconds(run) == chosen
