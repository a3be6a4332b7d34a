"""Groups across nodes (one pipeline stage per pod): their verification per stage and their burn-in.

- The pure decision (planner/verify.py ``predict_group``, ``decide_groups``): each group's engine judged against
  the stage the plan expects to bound the KV cache, every stage's own room against the plan's for that stage,
  and which stage bounds it, case by case.
- The gatherer: the leader's engine figures (Prometheus, else its "KV cache size" line) and every pod's own
  "Available KV cache memory" for its stage.
- The reconcile on the in-memory fakes: status.verification with its stages for a 405B group; a group's burn-in
  on its leader, its verdict on every pod of the group, and a KV cache too small as remediation evidence.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from llm_autopilot.api.v1alpha1 import VerificationStatus
from llm_autopilot.controller import world_reads
from llm_autopilot.controller.gather import Gatherer
from llm_autopilot.controller.kube import LogUnavailable
from llm_autopilot.desired import burn_in
from llm_autopilot.desired.burn_in import PodBurnIn
from llm_autopilot.desired.world import AdapterReading
from llm_autopilot.domain.burn_in import BURN_IN_GATE, BurnInMeasurement
from llm_autopilot.domain.precision import GIB
from llm_autopilot.planner.memory import stage_breakdown
from llm_autopilot.planner.plan import Plan, PlanRequest, Targets
from llm_autopilot.planner.search import plan
from llm_autopilot.planner.verify import (
    OUTSIDE_TOLERANCE,
    UNREADABLE,
    WITHIN_TOLERANCE,
    GroupPrediction,
    Observed,
    PodReading,
    Prediction,
    Source,
    decide_groups,
    predict,
    predict_group,
)
from llm_autopilot.render import groups
from llm_autopilot.vllm.versions import VLLMVersion, behaviour_of
from tests.conftest import gpu, model
from tests.unit.fakes import NAMESPACE, FakeCluster, FakeLabels, Run
from tests.unit.test_burn_in_reconcile import Runs
from tests.unit.test_groups_and_autoscaling import LLAMA_405B, four_l4_nodes, two_h100_nodes
from tests.unit.test_multinode_plans import deepseek_v3_bf16

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
MIB = 2**20


def stage(blocks: int, *, room_mib: float | None = None) -> Prediction:
    """A stage of 1 MiB blocks on a "GPU" of 1,000 MiB: one block is 0.1 % of its memory."""
    return Prediction(kv_cache_tokens=blocks * 16, num_blocks=blocks, block_size=16,
                      kv_cache_bytes=(room_mib if room_mib is not None else blocks) * MIB, block_bytes=MIB,
                      gpu_total_bytes=1000 * MIB)


# stage 0 holds 1,100 blocks, stage 1 (the LM head's) 1,000: the plan expects stage 1 to bound the engine's cache
GROUP = GroupPrediction(stages=(stage(1100), stage(1000)), bound=1, engine=stage(1000),
                        uncalibrated_kv_bytes=1000 * MIB)


def engine(blocks: int) -> Observed:
    return Observed(Source.METRICS, kv_cache_tokens=blocks * 16, num_blocks=blocks, block_size=16)


def leader(name: str = "g-0-0", blocks: int | None = 1000, room: float | None = 1100, *, group: str = "0",
           problem: str = "") -> PodReading:
    return PodReading(name, engine(blocks) if blocks is not None else None, problem=problem, group=group, stage=0,
                      stage_room=None if room is None else int(room * MIB),
                      stage_problem="" if room is not None else "log: 404 Not Found")


def worker(name: str = "g-0-1", room: float | None = 1000, *, group: str = "0") -> PodReading:
    return PodReading(name, group=group, stage=1, stage_room=None if room is None else int(room * MIB),
                      stage_problem="" if room is not None else "log: 404 Not Found")


@pytest.mark.parametrize(("name", "readings", "condition", "engine_error", "stage_errors", "bound", "says"), [
    ("as planned: stage 1 bounds it", (leader(), worker()), (True, WITHIN_TOLERANCE), 0.0, (0.0, 0.0), 1,
     "stage 1 bounds the KV cache"),
    ("the bounding stage 3 % short: past the tolerance", (leader(blocks=970), worker(room=970)),
     (False, OUTSIDE_TOLERANCE), -3.0, (0.0, -3.0), 1, "1 -3.00 %"),
    ("stage 0 has far less room than planned and bounds instead", (leader(blocks=950, room=950), worker()),
     (False, OUTSIDE_TOLERANCE), -5.0, (-15.0, 0.0), 0, "the plan expected stage 1 to bound it"),
    ("a stage that does not bound is off, the engine is not: verified", (leader(room=1050), worker()),
     (True, WITHIN_TOLERANCE), 0.0, (-5.0, 0.0), 1, "0 -5.00 %"),
    ("a worker's log unreadable: the engine judges, the stage is said", (leader(), worker(room=None)),
     (True, WITHIN_TOLERANCE), 0.0, (0.0, None), 1, "g-0-1: log: 404 Not Found"),
    ("a worker's log unreadable: the bound is the plan's, and said so", (leader(), worker(room=None)),
     (True, WITHIN_TOLERANCE), 0.0, (0.0, None), 1, "stage with the fewest) by the plan: not every stage's room"),
    ("no engine figures, every stage's room read: the fewest blocks are the engine's",
     (leader(blocks=None, room=1100, problem="no series; log: no \"KV cache size\" line"), worker(room=990)),
     (True, WITHIN_TOLERANCE), -1.0, (0.0, -1.0), 1, "from its log"),
    ("no engine figures and a stage unread: unknown",
     (leader(blocks=None, problem="no series; log: 403"), worker(room=None)), (None, UNREADABLE), None, (), None,
     "g-0-0: no series; log: 403"),
    ("two groups: the group furthest from the plan decides",
     (leader(), worker(), leader("g-1-0", blocks=960, group="1"), worker("g-1-1", room=960, group="1")),
     (False, OUTSIDE_TOLERANCE), -4.0, (0.0, 0.0, 0.0, -4.0), 1, "2 pods read"),
])
def test_a_group_is_judged_on_the_stage_that_bounds_its_kv_cache(
        name: str, readings: tuple[PodReading, ...], condition: tuple[bool | None, str], engine_error: float | None,
        stage_errors: tuple[float | None, ...], bound: int | None, says: str) -> None:
    d = decide_groups(GROUP, "h1", None, readings, vllm_version="0.33.0", now=NOW)
    assert d.condition[:2] == condition, name
    worst = d.worst
    assert (None if worst is None else round(worst.error_percent, 6)) == engine_error, name
    assert says in d.condition[2], (name, d.condition[2])
    if worst is None:
        return
    # the engine is judged once per group, on its leader's pod
    assert [pod for pod, _ in d.results] == sorted({r.pod for r in readings if r.stage == 0}), name
    assert tuple(None if s.verification is None else round(s.verification.error_percent, 6)
                 for s in d.stages) == stage_errors, name
    assert {s.stage for s in d.stages if s.bounds} == {bound}, name
    # the bound is measured when every stage's room was read, else the plan's, and the message says which
    assert ("by the plan" in d.condition[2]) is any(s.verification is None for s in d.stages), name
    assert d.event is not None and d.event[2] == d.condition[2], name
    status = VerificationStatus.of_pods(d.results, plan_hash="h1", stages=d.stages)
    assert status is not None and status.bound_stage == bound, name
    dumped = status.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert [(s["pod"], s["stage"], s.get("errorPercent")) for s in dumped["stages"]] == [
        (s.pod, s.stage, None if s.verification is None else round(s.verification.error_percent, 3))
        for s in d.stages], name
    assert VerificationStatus.model_validate(dumped) == status, name


def test_the_stage_figures_in_the_status() -> None:
    d = decide_groups(GROUP, "h1", None, (leader(room=1100), worker(room=980)), vllm_version="0.33.0", now=NOW)
    status = VerificationStatus.of_pods(d.results, plan_hash="h1", stages=d.stages)
    assert status is not None
    dumped = status.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert dumped["boundStage"] == 1 and dumped["actualBlocks"] == 1000 and dumped["predictedBlocks"] == 1000
    assert dumped["stages"] == [
        {"pod": "g-0-0", "stage": 0, "predictedKVGiB": round(1100 * MIB / GIB, 3),
         "actualKVGiB": round(1100 * MIB / GIB, 3), "predictedBlocks": 1100, "actualBlocks": 1100,
         "errorPercent": 0.0, "bounds": False, "problem": ""},
        {"pod": "g-0-1", "stage": 1, "predictedKVGiB": round(1000 * MIB / GIB, 3),
         "actualKVGiB": round(980 * MIB / GIB, 3), "predictedBlocks": 1000, "actualBlocks": 980,
         "errorPercent": -2.0, "bounds": True, "problem": ""}]


def _plan(m: Any, max_gpus: int) -> Plan:
    p = plan(PlanRequest(m, gpu("nvidia-h100-80gb"), behaviour_of(VLLMVersion(0, 33, 0)),
                         Targets(max_gpus=max_gpus, max_model_len=32768)))
    assert isinstance(p, Plan) and p.config.nodes > 1
    return p


def _planned_405b(run: Run) -> GroupPrediction:
    """The 405B group's prediction, the one the reconcile planned (its stages as status.plan shows them)."""
    planned = predict_group(_plan(model("meta-llama/Llama-3.1-405B"), 16).config)
    assert [s["kvCacheTokens"] for s in run.status["plan"]["stages"]] == [s.kv_cache_tokens for s in planned.stages]
    return planned


@pytest.mark.parametrize(("name", "m", "max_gpus", "bound", "tighter_than_the_busiest_gpu"), [
    ("Llama-3.1-405B bf16: two equal stages, the busiest GPU's figures exactly", model("meta-llama/Llama-3.1-405B"),
     16, 0, False),
    ("DeepSeek-V3 FP8: 31 + 30 layers, the LM head's stage bounds it, above the busiest-GPU figure",
     model("deepseek-ai/DeepSeek-V3"), 16, 1, True),
    ("DeepSeek-V3 bf16: 20 + 21 + 20 layers, the middle stage (most layers, most weights) bounds it",
     deepseek_v3_bf16(), 32, 1, False),
])
def test_the_prediction_per_stage(name: str, m: Any, max_gpus: int, bound: int,
                                  tighter_than_the_busiest_gpu: bool) -> None:
    p = _plan(m, max_gpus)
    group = predict_group(p.config)
    stages = stage_breakdown(p.config)
    assert group.bound == bound, name
    # each stage: the room and tokens status.plan.stages shows, in blocks of its own layers
    assert [s.kv_cache_bytes for s in group.stages] == [s.kv_cache_bytes for s in stages], name
    assert [s.kv_cache_tokens for s in group.stages] == [s.kv_cache_tokens for s in stages], name
    assert [s.num_blocks for s in group.stages] == [int(s.kv_cache_bytes // (s.kv_bytes_per_token * 16))
                                                   for s in stages], name
    # the engine's cache is the stage with the fewest blocks (vLLM's min_num_blocks)
    assert group.engine.num_blocks == min(s.num_blocks for s in group.stages), name
    assert group.engine.kv_cache_bytes == group.stages[bound].kv_cache_bytes, name
    busiest = predict(p.config, p.estimate)
    # the busiest GPU combines the most layers and the most weights: never more than the engine gets
    assert busiest.num_blocks <= group.engine.num_blocks, name
    assert (busiest.num_blocks < group.engine.num_blocks) is tighter_than_the_busiest_gpu, name
    if not tighter_than_the_busiest_gpu:
        assert group.engine.kv_cache_tokens == busiest.kv_cache_tokens == p.estimate.kv_cache_tokens, name


# ---- the gatherer ----------------------------------------------------------------------------------------

def group_pod(name: str, group: str, rank: int, plan_hash: str, *, ready: bool = True,
              lws: bool = False) -> dict[str, Any]:
    labels = ({groups.LWS_GROUP_INDEX_LABEL: group, groups.LWS_WORKER_INDEX_LABEL: str(rank)} if lws
              else {groups.GROUP_LABEL: group, groups.POD_INDEX_LABEL: str(rank)})
    return {"metadata": {"name": name, "uid": f"uid-{name}", "labels": {"app.kubernetes.io/instance": "x", **labels},
                         "annotations": {"llm-autopilot.io/plan-hash": plan_hash}},
            "status": {"podIP": f"10.0.0.{rank + 1}", "conditions": [
                {"type": "Ready", "status": "True" if ready else "False"}],
                "containerStatuses": [{"name": "vllm", "ready": True}]}}


@pytest.mark.parametrize(("name", "labels", "expected"), [
    ("a StatefulSet's pod", {groups.GROUP_LABEL: "2", groups.POD_INDEX_LABEL: "1"}, ("2", 1)),
    ("a LeaderWorkerSet's pod", {groups.LWS_GROUP_INDEX_LABEL: "0", groups.LWS_WORKER_INDEX_LABEL: "3"}, ("0", 3)),
    ("a Deployment's pod", {"app.kubernetes.io/instance": "x"}, None),
    ("a rank that is not a number", {groups.GROUP_LABEL: "0", groups.POD_INDEX_LABEL: "-1"}, None),
])
def test_a_pods_group_and_rank(name: str, labels: dict[str, str], expected: tuple[str, int] | None) -> None:
    assert groups.rank_of(labels) == expected, name


@pytest.mark.parametrize("lws", [False, True])
def test_the_leader_gives_the_engine_and_every_pod_its_stage(lws: bool) -> None:
    kube = FakeCluster(pod_list=[group_pod("g-0", "0", 0, "h1", lws=lws), group_pod("g-1", "0", 1, "h1", lws=lws)])
    kube.current_logs["g-0"] = ("(Worker_PP0_TP0 pid=7) INFO Available KV cache memory: 19.97 GiB\n"
                                "INFO GPU KV cache size: 664,608 tokens")
    kube.current_logs["g-1"] = "(Worker_PP1_TP0 pid=9) INFO Available KV cache memory: 19.5 GiB"
    labels = FakeLabels([{"namespace": "ns", "pod": "g-0", "num_gpu_blocks": "41538", "block_size": "16"}])
    asked: list[str] = []

    def version(address: str) -> str:
        asked.append(address)
        return "0.33.0"

    lead, work = Gatherer(kube, labels=labels, versions=version).kv_figures("ns", ("g-0", "g-1"), instance="x")
    assert (lead.group, lead.stage, lead.stage_room) == ("0", 0, round(19.97 * GIB))
    assert lead.observed is not None and lead.observed.num_blocks == 41538 and lead.vllm_version == "0.33.0"
    assert (work.group, work.stage, work.stage_room, work.observed) == ("0", 1, round(19.5 * GIB), None)
    assert asked == ["10.0.0.1"]  # a worker serves no API: only the leader is asked its version
    assert kube.start_log_reads == ["g-0", "g-1"]  # every stage's room is in its own log
    # without Prometheus the leader's engine is its "KV cache size" line, not its stage's room
    lead, _ = Gatherer(kube).kv_figures("ns", ("g-0", "g-1"), instance="x")
    assert lead.observed is not None and lead.observed.kv_cache_tokens == 664_608
    assert lead.observed.kv_cache_bytes is None and lead.observed.source is Source.LOG
    # a worker whose log cannot be read says why, for its stage only
    kube.current_logs["g-1"] = LogUnavailable("404 Not Found: a simulated node")
    _, work = Gatherer(kube).kv_figures("ns", ("g-0", "g-1"), instance="x")
    assert work.stage_room is None and "404 Not Found" in work.stage_problem


# ---- the reconcile ---------------------------------------------------------------------------------------

def _sts_pods(run: Run, *, ready: bool = True, group: str = "0") -> list[dict[str, Any]]:
    plan_hash = run.cluster.objects[("StatefulSet", f"x-{group}")]["spec"]["template"]["metadata"]["annotations"][
        "llm-autopilot.io/plan-hash"]
    return [group_pod(f"x-{group}-{rank}", group, rank, plan_hash, ready=ready) for rank in (0, 1)]


def test_a_405b_group_is_verified_per_stage_in_the_reconcile() -> None:
    run = Run(LLAMA_405B, cluster=two_h100_nodes())
    run.once()
    assert run.condition("PlanVerified")["reason"] == "AwaitingPods"
    planned = _planned_405b(run)
    run.cluster.pod_list = _sts_pods(run)
    # the leader's engine: 2 % fewer blocks than the plan; stage 1's own room is the short one
    blocks = planned.engine.num_blocks * 98 // 100
    labels = FakeLabels([{"namespace": NAMESPACE, "pod": "x-0-0", "num_gpu_blocks": str(blocks),
                          "block_size": "16"}])
    run.gatherer = Gatherer(run.cluster, labels=labels)
    run.cluster.current_logs["x-0-0"] = f"Available KV cache memory: {planned.stages[0].kv_cache_bytes / GIB:.2f} GiB"
    short = blocks * planned.stages[1].block_bytes / GIB + 0.005
    run.cluster.current_logs["x-0-1"] = f"(Worker_PP1) Available KV cache memory: {short:.2f} GiB"
    out = run.once()
    v = run.status["verification"]
    assert [p["pod"] for p in v["pods"]] == ["x-0-0"] and v["actualBlocks"] == blocks
    assert v["predictedBlocks"] == planned.engine.num_blocks and v["source"] == "metrics"
    assert [(s["pod"], s["stage"], s["bounds"]) for s in v["stages"]] == [("x-0-0", 0, False), ("x-0-1", 1, True)]
    assert v["boundStage"] == 1 and abs(v["stages"][0]["errorPercent"]) < 0.02
    assert v["stages"][1]["errorPercent"] == pytest.approx(v["errorPercent"], abs=0.02)
    condition = run.condition("PlanVerified")
    assert condition["reason"] == WITHIN_TOLERANCE and "stage 1 bounds the KV cache" in condition["message"]
    assert "expected" not in condition["message"]  # the plan's two stages are equal: either may bound it
    assert [e[1] for e in out.events if "Verif" in e[1]] == ["PlanVerified"]
    # every pod of the group was read once for this plan: nothing again, nothing written
    reads = list(run.cluster.start_log_reads)
    out = run.once()
    assert run.cluster.start_log_reads == reads and "verification" not in out.status


def test_a_workers_unreadable_log_is_said_and_not_read_every_pass() -> None:
    run = Run(LLAMA_405B, cluster=two_h100_nodes())
    run.once()
    run.cluster.pod_list = _sts_pods(run)
    planned = _planned_405b(run)
    run.cluster.current_logs["x-0-0"] = (f"Available KV cache memory: {planned.stages[0].kv_cache_bytes / GIB:.2f} GiB"
                                         f"\nGPU KV cache size: {planned.engine.kv_cache_tokens:,} tokens")
    run.once()  # x-0-1 has no log (a simulated node)
    v = run.status["verification"]
    # the engine's "KV cache size" as planned; the bound is the plan's (stage 1's room is not known)
    assert v["verified"] is True and v["source"] == "log" and v["boundStage"] == planned.bound == 0
    unread = v["stages"][1]
    assert unread["pod"] == "x-0-1" and "errorPercent" not in unread and "404" in unread["problem"]
    assert "x-0-1: log: 404" in run.condition("PlanVerified")["message"]
    reads = list(run.cluster.start_log_reads)
    run.once()
    assert run.cluster.start_log_reads == reads


def bp(name: str, group: str | None = None, rank: int | None = None) -> PodBurnIn:
    return PodBurnIn(pod=name, uid=f"uid-{name}", ip="10.0.0.1", containers_ready=True, gate=None, group=group,
                     rank=rank)


@pytest.mark.parametrize(("name", "pods", "grouped", "expected"), [
    ("a Deployment's pods: each its own run", (bp("a"), bp("b")), False, [("a", ("a",)), ("b", ("b",))]),
    ("one group: one run on its leader, the verdict on both",
     (bp("g-0-1", "0", 1), bp("g-0-0", "0", 0)), True, [("g-0-0", ("g-0-0", "g-0-1"))]),
    ("two groups: a run each", (bp("g-0-0", "0", 0), bp("g-0-1", "0", 1), bp("g-1-0", "1", 0), bp("g-1-1", "1", 1)),
     True, [("g-0-0", ("g-0-0", "g-0-1")), ("g-1-0", ("g-1-0", "g-1-1"))]),
    ("a group whose leader is not there yet: no run, its workers wait", (bp("g-0-1", "0", 1),), True,
     [(None, ("g-0-1",))]),
    ("a grouped plan's pod without its labels: its own run", (bp("odd"),), True, [("odd", ("odd",))]),
])
def test_what_one_burn_in_run_covers(name: str, pods: tuple[PodBurnIn, ...], grouped: bool,
                                     expected: list[tuple[str | None, tuple[str, ...]]]) -> None:
    found = burn_in.units(pods, grouped=grouped)
    assert [(None if lead is None else lead.pod, tuple(p.pod for p in members)) for lead, members in found] == \
        expected, name


SPEC_405B_BURN_IN = {**LLAMA_405B, "serving": {"maxModelLen": 32768, "expectedConcurrency": 4},
                     "verification": {"burnIn": {"maxTokens": 8, "timeoutSeconds": 120}}}
HEALTHY = BurnInMeasurement(completed=4, sent=4, peak_kv_usage=0.4, peak_waiting=1, peak_running=4, samples=20,
                            generated_tokens=32, wall_seconds=30.0)


def test_a_group_is_burned_in_on_its_leader_and_let_in_as_one() -> None:
    runs = Runs()
    run = Run(SPEC_405B_BURN_IN, cluster=two_h100_nodes(), burn_ins=runs)
    run.once()
    template = run.cluster.objects[("StatefulSet", "x-0")]["spec"]["template"]["spec"]
    assert template["readinessGates"] == [{"conditionType": BURN_IN_GATE}]  # one template for every rank
    pods = _sts_pods(run, ready=False)
    for p in pods:
        p["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    run.cluster.pod_list = pods
    out = run.once()
    # the load goes to the leader's IP only: the workers serve no API
    assert [(u, ip) for u, ip, _ in runs.started] == [("uid-x-0-0", "10.0.0.1")]
    assert run.condition("BurnInPassed")["reason"] == "BurnInRunning" and not out.settled
    run.once()
    assert len(runs.started) == 1
    runs.results["uid-x-0-0"] = HEALTHY
    out = run.once()
    # the group's verdict on every pod of the group
    assert sorted((pod, c["status"]) for pod, c in run.cluster.pod_conditions) == [
        ("x-0-0", "True"), ("x-0-1", "True")]
    assert run.condition("BurnInPassed")["status"] == "True"
    record = run.status["burnIn"]["pods"]
    assert [r["pod"] for r in record] == ["x-0-0"] and record[0]["gpuSeconds"] == 30.0 * 16  # the group's GPUs
    assert [e[1] for e in out.events if "BurnIn" in e[1]] == ["BurnInPassed"]
    run.once()
    assert len(run.cluster.pod_conditions) == 2 and len(runs.started) == 1


def test_a_group_whose_kv_cache_is_too_small_is_remediated_before_it_is_ready() -> None:
    runs = Runs()
    run = Run(SPEC_405B_BURN_IN, cluster=two_h100_nodes(), burn_ins=runs)
    run.once()
    first = copy.deepcopy(run.cluster.objects[("StatefulSet", "x-0")])
    run.cluster.pod_list = _sts_pods(run, ready=False)
    run.once()
    runs.results["uid-x-0-0"] = BurnInMeasurement(completed=4, sent=4, preemptions=5, peak_kv_usage=1.0,
                                                  peak_waiting=2, peak_running=2, samples=30, wall_seconds=50.0)
    out = run.once()
    assert sorted((pod, c["status"], c["reason"]) for pod, c in run.cluster.pod_conditions) == [
        ("x-0-0", "False", "KVCacheTooSmall"), ("x-0-1", "False", "KVCacheTooSmall")]
    assert "BurnInFailed" in [e[1] for e in out.events]
    history = run.remediation["history"]
    assert len(history) == 1 and history[0]["signal"] == "KVSaturation"
    assert history[0]["evidence"]["source"] == "burn-in" and history[0]["evidence"]["pod"] == "x-0-0"
    # the step rolls the whole group
    after = run.cluster.objects[("StatefulSet", "x-0")]
    assert after["spec"]["template"]["metadata"]["annotations"] != first["spec"]["template"]["metadata"][
        "annotations"]
    run.once()
    assert len(run.remediation["history"]) == 1


def test_with_a_leader_worker_set_both_templates_carry_the_gate() -> None:
    cluster = two_h100_nodes()
    cluster.objects[("CustomResourceDefinition", groups.LWS_CRD)] = {"metadata": {"name": groups.LWS_CRD}}
    run = Run(SPEC_405B_BURN_IN, cluster=cluster)
    run.once()
    lws = run.cluster.objects[("LeaderWorkerSet", "x")]["spec"]["leaderWorkerTemplate"]
    for key in ("leaderTemplate", "workerTemplate"):
        assert lws[key]["spec"]["readinessGates"] == [{"conditionType": BURN_IN_GATE}], key


def test_autoscaled_replicas_each_show_their_reading_where_they_differ() -> None:
    spec = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4"}, "replicas": 2,
            "autoscaling": {"maxReplicas": 4, "prometheusAddress": "http://prometheus.test:9090"}}
    run = Run(spec, cluster=four_l4_nodes())
    run.once()
    plan_hash = run.cluster.plan_hash()
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    run.cluster.pod_list = [{"metadata": {"name": n, "annotations": {"llm-autopilot.io/plan-hash": plan_hash}},
                             **ready} for n in ("x-a", "x-b")]
    run.cluster.current_logs["x-a"] = "GPU KV cache size: 100 tokens"
    run.once()
    predicted = run.status["verification"]["predictedTokens"]
    # a scale-out (KEDA): a third replica of the same plan, whose vLLM has less room than the others
    run.cluster.pod_list.append({"metadata": {"name": "x-c", "annotations": {"llm-autopilot.io/plan-hash": plan_hash}},
                                 **ready})
    for pod, tokens in (("x-a", predicted), ("x-b", predicted), ("x-c", predicted * 8 // 10)):
        run.cluster.current_logs[pod] = f"GPU KV cache size: {tokens:,} tokens"
    run.once()
    v = run.status["verification"]
    assert [(p["pod"], p["actualTokens"]) for p in v["pods"]] == [
        ("x-a", predicted), ("x-b", predicted), ("x-c", predicted * 8 // 10)]
    assert v["actualTokens"] == predicted * 8 // 10 and "stages" not in v and "boundStage" not in v
    assert [p["errorPercent"] for p in v["pods"]][:2] == [0.0, 0.0] and v["pods"][2]["errorPercent"] < 0
    assert "3 pods read, the furthest from the plan" in run.condition("PlanVerified")["message"]


def test_a_lora_plan_is_verified_against_the_room_its_adapter_slots_leave(monkeypatch: pytest.MonkeyPatch) -> None:
    """A LoRA plan's pods are read as any plan's: the prediction is the KV room after the adapter slots, so a vLLM
    that reports what the slots leave is verified, and one with the room of the plan without slots is off."""
    monkeypatch.setattr(world_reads, "read_adapter_configs", lambda *a, **k: AdapterReading())  # no Hub here
    base = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4"}, "serving": {"maxModelLen": 8192}}
    plain = Run(base)
    plain.once()
    lora = {**base, "lora": {"adapters": [{"name": "a", "source": "hf://acme/a"}], "maxLoraRank": 16, "maxLoras": 2}}
    run = Run(lora)
    run.once()
    with_slots, without = (r.status["plan"]["memory"]["kvCacheTokens"] for r in (run, plain))
    assert "loraSlotsGiB" in run.status["plan"]["memory"] and with_slots < without
    plan_hash = run.cluster.plan_hash()
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    run.cluster.pod_list = [{"metadata": {"name": n, "annotations": {"llm-autopilot.io/plan-hash": plan_hash}},
                             **ready} for n in ("x-a", "x-b")]
    run.cluster.current_logs["x-a"] = f"GPU KV cache size: {with_slots:,} tokens"
    run.cluster.current_logs["x-b"] = f"GPU KV cache size: {without:,} tokens"  # as if no slot were reserved
    run.once()
    v = run.status["verification"]
    assert v["predictedTokens"] == with_slots
    errors = {p["pod"]: (p["actualTokens"], p["errorPercent"]) for p in v["pods"]}
    slots_percent = run.status["plan"]["memory"]["loraSlotsGiB"] / run.status["plan"]["memory"]["gpuTotalGiB"] * 100
    assert errors["x-a"] == (with_slots, 0.0)
    # the slots, and what LoRA adds to vLLM's profile run and CUDA graphs: more than the slots alone
    assert errors["x-b"][0] == without and errors["x-b"][1] > slots_percent > 0, (errors, slots_percent)
    assert v["actualTokens"] == without and run.condition("PlanVerified")["reason"] == "OutsideTolerance"
