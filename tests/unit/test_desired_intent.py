"""desired(spec, status, world, now) -> Intent, called directly on Worlds built by hand: every condition it
writes, and what it asks the shell to read first, as named cases (issue #16, item 1). No cluster, no fake of
one: the World is the only input besides the spec, the status and the clock."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from unittest import mock

import pytest

from llm_autopilot.api.conditions import conditions_status
from llm_autopilot.api.lora import AdapterConfig
from llm_autopilot.api.status import LLMDeploymentStatus
from llm_autopilot.api.v1alpha1 import CacheStatus, LLMDeploymentSpec
from llm_autopilot.controller import world_reads
from llm_autopilot.controller.gather import read_world
from llm_autopilot.controller.kube import NodeGPUs
from llm_autopilot.controller.settings import OperatorSettings
from llm_autopilot.desired.intent import Intent, desired
from llm_autopilot.desired.lora_calls import LoRAPodsAsk, LoRAReading
from llm_autopilot.desired.world import (
    AdapterReading,
    Applied,
    CacheObservation,
    SourceView,
    Unresolved,
    VerificationReading,
    WorkloadView,
    World,
)
from llm_autopilot.planner.verify import Observed, PodReading, Source
from llm_autopilot.remediation.decide import Evidence
from llm_autopilot.render.autoscaling import KEDA_CRD
from llm_autopilot.render.kubernetes import Owner
from tests.unit.fakes import L4, NAME, NAMESPACE, FakeCluster
from tests.unit.fakes import merge_patch as apply_patch

NOW = datetime(2031, 5, 17, 8, 30, tzinfo=UTC)
QWEN = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4"}, "serving": {"maxModelLen": 8192}}
PROM = "http://prometheus.test:9090"
CACHED = {**QWEN, "model": {"name": "Qwen/Qwen3-8B", "cache": {"enabled": True}}}
SETTINGS = OperatorSettings()
OWNER = Owner(NAME, NAMESPACE, "uid-1")


def world_for(spec: dict[str, Any], *, nodes: int = 1, keda: bool = False) -> World:
    """The World read_world gives for ``spec`` on ``nodes`` L4 nodes (the test's only read: the model from the
    catalog; no adapter configs), with the object's identity and the operator's settings."""
    cluster = FakeCluster(nodes=[NodeGPUs(dict(L4), 1, 180.0) for _ in range(nodes)])
    if keda:
        cluster.objects[("CustomResourceDefinition", KEDA_CRD)] = {"metadata": {"name": KEDA_CRD}}
    # the LoRA adapters' configs are each test's to give (World.adapters): never read from huggingface.co, which this
    # machine cannot reach (~24 s of huggingface_hub's retries per adapter)
    with mock.patch.object(world_reads, "read_adapter_configs", lambda *a, **k: AdapterReading()):
        world = read_world(LLMDeploymentSpec.model_validate(spec), NAME, NAMESPACE, cluster, SETTINGS)
    return dataclasses.replace(world, owner=OWNER, generation=3, operator=SETTINGS)


def answered(spec: dict[str, Any], world: World, deployment: dict[str, Any] | None = None,
             evidence: Evidence | None = None, status: dict[str, Any] | None = None) -> World:
    """The World after the shell answered the Intent's asks: the workload as ``deployment`` and the evidence
    (a calm one by default), both for the plan desired() asked about."""
    asked = desired(spec, status or {}, world, NOW).asks
    assert asked is not None and asked.workload is not None and asked.evidence is not None
    plan = asked.workload.plan_hash
    world = dataclasses.replace(world, workload=WorkloadView(plan, deployment),
                                evidence=evidence or Evidence(plan_id=plan))
    if any(isinstance(ask, LoRAPodsAsk) for ask in asked.features):  # LoRA: no Ready pod yet
        world = world.with_reading(LoRAReading())
    # then the plan's KV figures (plan verification): no pod of it read here
    asked = desired(spec, status or {}, world, NOW).asks
    if asked is not None and asked.verification is not None:
        world = dataclasses.replace(world, verification=VerificationReading(asked.verification.plan_hash))
    return world


def available(replicas: int = 1) -> dict[str, Any]:
    return {"status": {"replicas": replicas, "availableReplicas": replicas, "updatedReplicas": replicas}}


def _cache(spec: dict[str, Any], world: World, state: str) -> World:
    asked = desired(spec, {}, world, NOW).asks
    assert asked is not None and asked.cache is not None and asked.workload is None  # the cache comes first
    status = CacheStatus(claim_name=asked.cache.claim, state=state, bytes=10, total_bytes=10)
    return dataclasses.replace(world, cache=CacheObservation(asked.cache, (), status))


@dataclass(frozen=True)
class Case:
    spec: dict[str, Any]
    world: Callable[[dict[str, Any]], World]
    #: condition type -> (status, reason)
    expect: dict[str, tuple[str, str]]
    absent: tuple[str, ...] = ()
    retry: bool = False
    #: whether the Intent applies objects
    applies: bool = False


def _ready(spec: dict[str, Any]) -> World:
    return answered(spec, world_for(spec), available())


CASES: dict[str, Case] = {
    "planned and ready": Case(QWEN, _ready, {"Planned": ("True", "Planned"), "Ready": ("True", "Available"),
                                             "Degraded": ("False", "AsPlanned")}, absent=("ModelCached",),
                              applies=True),
    "planned, the workload not there yet": Case(
        QWEN, lambda s: answered(s, world_for(s), None), {"Planned": ("True", "Planned"), "Ready": ("False", "")},
        applies=True),
    "planned, no replica available": Case(
        QWEN, lambda s: answered(s, world_for(s), {"status": {"replicas": 1, "availableReplicas": 0}}),
        {"Planned": ("True", "Planned"), "Ready": ("False", "")}, applies=True),
    "invalid spec": Case({"model": {"name": "Qwen/Qwen3-8B"}, "replicas": -1},
                         lambda s: World(Unresolved("InvalidSpec", ""), owner=OWNER, operator=SETTINGS),
                         {"Planned": ("False", "InvalidSpec")}, absent=("Ready", "Degraded")),
    "model unresolved": Case(QWEN, lambda s: dataclasses.replace(
        world_for(s), model=Unresolved("ModelUnresolved", "the Hub said 404", retry=True)),
        {"Planned": ("False", "ModelUnresolved")}, absent=("Ready",), retry=True),
    "secret unreadable": Case(QWEN, lambda s: dataclasses.replace(
        world_for(s), model=Unresolved("SecretUnreadable", "403")), {"Planned": ("False", "SecretUnreadable")}),
    "a pvc:// source being inspected": Case(QWEN, lambda s: dataclasses.replace(
        world_for(s), source=SourceView(None, ({"kind": "Job", "metadata": {"name": "inspect"}},),
                                        ("InspectingSource", "reading config.json"))),
        {"Planned": ("False", "InspectingSource")}, retry=True, applies=True),
    "a pvc:// source that cannot be read": Case(QWEN, lambda s: dataclasses.replace(
        world_for(s), source=SourceView(None, (), ("SourceNotFound", "no claim"))),
        {"Planned": ("False", "SourceNotFound")}, retry=True),
    "unknown GPU": Case({**QWEN, "gpu": {"product": "nvidia-x9000"}},
                        lambda s: world_for(QWEN), {"Planned": ("False", "UnknownGPU")}),
    "unsupported vLLM version": Case({**QWEN, "vllm": {"version": "0.1.0"}}, lambda s: world_for(QWEN),
                                     {"Planned": ("False", "UnsupportedVLLMVersion")}),
    "an adapter the Hub did not give": Case(QWEN, lambda s: dataclasses.replace(
        world_for(s), adapters=AdapterReading(errors=["lora adapter a: 404"])),
        {"Planned": ("False", "LoRAAdapterUnresolved")}, retry=True),
    "infeasible": Case({**QWEN, "model": {"name": "meta-llama/Llama-3.1-405B"}, "gpu": {"product": "nvidia-l4",
                                                                                         "maxGPUs": 1}},
                       world_for, {"Planned": ("False", "Infeasible")}, absent=("Ready",)),
    "autoscaling without Prometheus": Case({**QWEN, "autoscaling": {"maxReplicas": 2}},
                                           lambda s: world_for(s, nodes=4), {"Planned": ("False", "NoPrometheus")}),
    "autoscaling beyond the pool": Case({**QWEN, "autoscaling": {"maxReplicas": 5, "prometheusAddress": PROM}},
                                        lambda s: world_for(s, nodes=4, keda=True),
                                        {"Planned": ("False", "TooManyReplicas")}),
    "autoscaling without KEDA": Case({**QWEN, "autoscaling": {"maxReplicas": 2, "prometheusAddress": PROM}},
                                     lambda s: world_for(s, nodes=4), {"Planned": ("False", "NoKEDA")}),
    "autoscaling with KEDA": Case({**QWEN, "autoscaling": {"maxReplicas": 2, "prometheusAddress": PROM}},
                                  lambda s: answered(s, world_for(s, nodes=4, keda=True), available()),
                                  {"Planned": ("True", "Planned"), "Ready": ("True", "Available")}, applies=True),
    "the apply refused": Case(QWEN, lambda s: dataclasses.replace(_ready(s), applied=Applied(rejected="denied")),
                              {"Planned": ("False", "ApplyRejected")}, absent=("Ready",)),
    "written, then the workload read again": Case(
        QWEN, lambda s: dataclasses.replace(answered(s, world_for(s), None), applied=Applied(view=available())),
        {"Planned": ("True", "Planned"), "Ready": ("True", "Available")}, applies=True),
    "the model cache downloading": Case(CACHED, lambda s: answered(s, _cache(s, world_for(s), "Downloading")),
                                        {"ModelCached": ("False", "Downloading"), "Planned": ("True", "Planned")},
                                        applies=True),
    "the model cache complete": Case(CACHED, lambda s: answered(s, _cache(s, world_for(s), "Complete"),
                                                                available()),
                                     {"ModelCached": ("True", "Cached"), "Ready": ("True", "Available")},
                                     applies=True),
    "the model cache failed": Case(CACHED, lambda s: answered(s, _cache(s, world_for(s), "Failed")),
                                   {"ModelCached": ("False", "CacheFailed")}, applies=True),
}


def _conditions(intent: Intent) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in intent.conditions}


@pytest.mark.parametrize("name", sorted(CASES))
def test_desired_writes_each_condition(name: str) -> None:
    case = CASES[name]
    world = case.world(case.spec)
    intent = desired(case.spec, {}, world, NOW)
    assert intent.asks is None, f"{name}: still asks {intent.asks}"
    got = _conditions(intent)
    for type_, (status, reason) in case.expect.items():
        assert type_ in got, f"{name}: no {type_} in {got}"
        assert got[type_][0] == status, f"{name}: {type_} is {got[type_]}"
        if reason:
            assert got[type_][1] == reason, f"{name}: {type_} is {got[type_]}"
    for type_ in case.absent:
        assert type_ not in got, f"{name}: {type_} written"
    assert intent.retry is case.retry, name
    assert bool(intent.objects) is case.applies, name
    assert intent.status["conditions"] == conditions_status(intent.conditions)  # a first pass: all new
    _typed_as_written(intent, {})
    assert {c.last_transition_time for c in intent.conditions} == {"2031-05-17T08:30:00Z"}  # the clock given


def test_desired_asks_for_the_workload_and_evidence_of_the_plan_in_force_first() -> None:
    world = world_for(QWEN)
    first = desired(QWEN, {}, world, NOW)
    assert first.asks is not None and not first.objects and not first.conditions and first.step is None
    assert first.asks.cache is None and first.asks.workload is not None and first.asks.evidence is not None
    assert first.asks.evidence.plan_hash == first.asks.workload.plan_hash
    assert (first.asks.workload.name, first.asks.workload.namespace) == (NAME, NAMESPACE)
    # a workload read for another plan is asked for again, for this one
    stale = dataclasses.replace(world, workload=WorkloadView("another-plan", available()),
                                evidence=Evidence(plan_id="another-plan"))
    again = desired(QWEN, {}, stale, NOW).asks
    assert again is not None and again.workload == first.asks.workload


def test_desired_asks_for_the_cache_before_the_workload() -> None:
    world = world_for(CACHED)
    asked = desired(CACHED, {}, world, NOW).asks
    assert asked is not None and asked.cache is not None and asked.workload is None
    assert asked.cache.namespace == NAMESPACE and asked.known_cache is None
    then = desired(CACHED, {}, _cache(CACHED, world, "Pending"), NOW).asks
    assert then is not None and then.workload is not None  # the plan in force is rendered with the claim


def test_desired_is_pure() -> None:
    """The same inputs give the same Intent, and the inputs are not changed."""
    world = _ready(QWEN)
    status: dict[str, Any] = {"conditions": [{"type": "Planned", "status": "False", "reason": "Infeasible"}]}
    before = copy.deepcopy(status), copy.deepcopy(QWEN)
    first, second = desired(QWEN, status, world, NOW), desired(QWEN, status, world, NOW)
    assert first == second
    assert (status, QWEN) == before


def test_a_second_pass_on_its_own_status_writes_nothing() -> None:
    """desired() on the status it gave, with the same world, changes no key (the reconcile writes nothing)."""
    world = _ready(QWEN)
    first = desired(QWEN, {}, world, NOW)
    status = dict(first.status)
    second = desired(QWEN, status, answered(QWEN, world_for(QWEN), available(), status=status), NOW)
    assert second.asks is None and second.status == {} and second.events == []
    assert second.objects == first.objects  # applied again: the apply writes only what changed
    _typed_as_written(first, {})
    _typed_as_written(second, status)


def _typed_as_written(intent: Intent, before: dict[str, Any]) -> None:
    """desired() returns the status it decided typed (an LLMDeploymentStatus), and the merge patch it writes is that
    status: the status as written after the patch parses to the same value."""
    assert intent.decided is not None
    written = LLMDeploymentStatus.model_validate(apply_patch(copy.deepcopy(before), intent.status))
    assert (written.model_dump(mode="json", exclude_none=True)
            == intent.decided.model_dump(mode="json", exclude_none=True))


def test_a_refused_adapter_is_said_in_admissions_words() -> None:
    spec = {**QWEN, "lora": {"adapters": [{"name": "a", "source": "hf://acme/a"}], "maxLoraRank": 8}}
    read = AdapterReading(configs={"a": AdapterConfig(rank=64, base_model=None)})
    world = dataclasses.replace(world_for(spec), adapters=read)
    intent = desired(spec, {}, world, NOW)
    assert _conditions(intent)["Planned"] == ("False", "LoRAAdapterRefused") and not intent.retry
    assert intent.settled  # the same inputs refuse again: a resync may stay quiet
    assert intent.events and intent.events[0][:2] == ("Warning", "LoRAAdapterRefused")


LORA_TWO = [{"name": "a", "source": "hf://acme/a"}, {"name": "b", "source": "acme/b"}]
DEFAULT_RANK = {
    # maxLoraRank left out: the largest rank the adapters' adapter_config.json give, rounded up to one vLLM takes
    "the largest adapter rank": ({}, {"a": AdapterConfig(8, None), "b": AdapterConfig(32, None)}, "32"),
    "rounded up to a rank vLLM accepts": ({}, {"a": AdapterConfig(8, None), "b": AdapterConfig(40, None)}, "64"),
    "an adapter without adapter_config.json is not counted": ({}, {"a": AdapterConfig(8, None)}, "8"),
    "no rank known: vLLM's default": ({}, {}, "16"),
    "set in the spec: the spec's": ({"maxLoraRank": 64}, {"a": AdapterConfig(8, None)}, "64"),
}


@pytest.mark.parametrize("case", sorted(DEFAULT_RANK))
def test_the_rendered_max_lora_rank_follows_the_adapters_configs(case: str) -> None:
    lora, configs, rank = DEFAULT_RANK[case]
    spec = {**QWEN, "lora": {"adapters": LORA_TWO, **lora}}
    world = dataclasses.replace(world_for(spec), adapters=AdapterReading(configs=configs))
    intent = desired(spec, {}, answered(spec, world), NOW)
    deployment = next(o for o in intent.objects if o["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-lora-rank") + 1] == rank, args
    assert _conditions(intent)["Planned"] == ("True", "Planned")
    assert f"lora=2x{rank}: 2 adapter slot(s) at rank {rank} reserved" in "\n".join(intent.status["plan"]["reasons"])


def test_a_hub_outage_plans_nothing_rather_than_another_rank() -> None:
    # an adapter the Hub did not answer for (and huggingface_hub has no copy of) must not plan the default rank
    # as if it had no config: nothing is written, the running pods keep their plan
    spec = {**QWEN, "lora": {"adapters": LORA_TWO}}
    read = AdapterReading(configs={"a": AdapterConfig(8, None)}, errors=["lora adapter b: cannot reach the Hub"])
    intent = desired(spec, {}, dataclasses.replace(world_for(spec), adapters=read), NOW)
    assert _conditions(intent)["Planned"] == ("False", "LoRAAdapterUnresolved") and intent.retry
    assert intent.objects == [] and intent.asks is None


# ---- status.releases: each vLLM release's last reading, kept across an upgrade (issue #30 item 2) ---------------

def _read_on(spec: dict[str, Any], status: dict[str, Any], version: str, blocks: int) -> Intent:
    """desired() once the plan's one Ready pod, whose vLLM reports ``version``, gave ``blocks`` KV blocks."""
    world = answered(spec, world_for(spec), available(), status=status)
    assert world.verification is not None
    reading = PodReading("pod-a", Observed(Source.METRICS, kv_cache_tokens=blocks * 16, num_blocks=blocks,
                                           block_size=16), vllm_version=version)
    world = dataclasses.replace(world, verification=VerificationReading(world.verification.plan_hash, (reading,)))
    intent = desired(spec, status, world, NOW)
    assert intent.asks is None
    return intent


def test_an_upgrade_keeps_the_old_releases_figures_beside_the_new_ones() -> None:
    old_spec = {**QWEN, "vllm": {"version": "0.31.0"}}
    first = _read_on(old_spec, {}, "0.31.0", 1000)
    status = apply_patch({}, first.status)
    assert [(r["vllmVersion"], r["actualTokens"]) for r in status["releases"]] == [("0.31.0", 16000)]
    upgraded = _read_on(QWEN_ON("0.32.0"), status, "0.32.0", 1200)
    after = apply_patch(copy.deepcopy(status), upgraded.status)
    assert [(r["vllmVersion"], r["actualTokens"]) for r in after["releases"]] == [("0.31.0", 16000),
                                                                                  ("0.32.0", 19200)]
    assert after["verification"]["vllmVersion"] == "0.32.0"


def test_a_pod_of_another_release_than_planned_records_no_release() -> None:
    intent = _read_on(QWEN_ON("0.32.0"), {}, "0.31.0", 1000)
    assert "releases" not in intent.status
    assert ("Warning", "VLLMVersionMismatch") in {(e.type, e.reason) for e in intent.events}


def QWEN_ON(version: str) -> dict[str, Any]:  # noqa: N802 - a spec like the constants above
    return {**QWEN, "vllm": {**QWEN.get("vllm", {}), "version": version}}
