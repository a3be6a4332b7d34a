"""vllm:lora_requests_info in the KV-saturation evidence: the pure explanation case by case
(remediation/lora_slots.py), the gatherer's one instant query, and the reconcile's history entry."""

from __future__ import annotations

from typing import Any

import pytest

from llm_autopilot.controller.gather import Gatherer, Target
from llm_autopilot.controller.metrics import MetricsUnavailable
from llm_autopilot.remediation.classify import Classification, Signal
from llm_autopilot.remediation.lora_slots import EVIDENCE_KEY, LoRAActivity, explain, read_activity, with_lora
from llm_autopilot.render.kubernetes import PLAN_HASH
from llm_autopilot.vllm.metrics import LORA_MAX_LABEL, LORA_REQUESTS_INFO, LORA_RUNNING_LABEL, LORA_WAITING_LABEL
from tests.unit.fakes import NAMESPACE, FakeCluster, FakePrometheus, Run, saturated
from tests.unit.fakes import FakeLabels as Labels

SATURATION = Classification(Signal.KV_SATURATION, "KV cache usage averaged 97% over 300s",
                            evidence={"averageUsage": "0.970", "source": "prometheus"})


def series(pod: str, running: str, waiting: str, max_lora: str = "2") -> dict[str, str]:
    """One vllm:lora_requests_info series as Prometheus hands its labels back."""
    return {"__name__": LORA_REQUESTS_INFO, "namespace": NAMESPACE, "pod": pod, LORA_RUNNING_LABEL: running,
            LORA_WAITING_LABEL: waiting, LORA_MAX_LABEL: max_lora}


@pytest.mark.parametrize(("name", "found", "said"), [
    ("Prometheus answered nothing (no LoRA, or no series yet)", [], None),
    # vLLM 0.32 and 0.33 write every adapter in flight into both labels
    ("adapters in flight below max_loras", [series("x-1", "a,b", "a,b", "4")],
     "on pod x-1: 2 LoRA adapters with requests in flight (a, b), max_loras 4"),
    ("as many adapters as slots: none known to wait for one", [series("x-1", "a,b", "a,b")],
     "on pod x-1: 2 LoRA adapters with requests in flight (a, b), max_loras 2"),
    ("more adapters in flight than slots: the slots are full", [series("x-1", "a,b,c", "a,b,c")],
     "on pod x-1: 3 LoRA adapters with requests in flight (a, b, c), max_loras 2: the adapter slots are full, "
     "1 adapter waits for one (requests queue for a slot, not only for KV cache)"),
    ("no adapter in flight: base-model requests saturate", [series("x-1", "", "", "4")],
     "on pod x-1: 0 LoRA adapters with requests in flight, max_loras 4"),
    # a release filling the labels apart
    ("labels apart, running below max_loras", [series("x-1", "a", "a,b", "4")],
     "on pod x-1: 1 LoRA adapter running (a), 2 waiting (a, b), max_loras 4"),
    ("labels apart, waiting while max_loras run: the slots are full", [series("x-1", "a,b", "c,d")],
     "on pod x-1: 2 LoRA adapters running (a, b), 2 waiting (c, d), max_loras 2: the adapter slots are full, "
     "2 adapters wait for one (requests queue for a slot, not only for KV cache)"),
    ("several pods: the one most short of slots", [series("x-1", "a", "a"), series("x-2", "a,b,c", "a,b,c"),
                                                   series("x-3", "a,b", "a,b")],
     "on pod x-2 (of 3 with LoRA series): 3 LoRA adapters with requests in flight (a, b, c), max_loras 2: the "
     "adapter slots are full, 1 adapter waits for one (requests queue for a slot, not only for KV cache)"),
    ("a tie: the first pod by name, in whatever order Prometheus answered", [series("x-2", "a", "a"),
                                                                            series("x-1", "b", "b")],
     "on pod x-1 (of 2 with LoRA series): 1 LoRA adapter with requests in flight (b), max_loras 2"),
    ("max_lora unreadable: no slot judgement", [series("x-1", "a,b,c", "a,b,c", "lots")],
     "on pod x-1: 3 LoRA adapters with requests in flight (a, b, c), max_loras unknown"),
    ("long lists are cut, names cleaned", [series("x-1", "a,b,c,d,e,f", "a,b,c,d,e,f\x1b[31m", "8")],
     "on pod x-1: 6 LoRA adapters with requests in flight (a, b, c, d and 2 more), max_loras 8"),
])
def test_what_the_lora_series_adds_to_the_saturation(name: str, found: list[dict[str, str]],
                                                     said: str | None) -> None:
    activity = tuple(read_activity(labels) for labels in found)
    assert explain(activity) == said, name
    c = with_lora(SATURATION, activity)
    if said is None:
        assert c == SATURATION, name  # the evidence as the rule gave it
    else:
        assert c.summary == f"{SATURATION.summary}; {said}" and c.evidence == {**SATURATION.evidence,
                                                                               EVIDENCE_KEY: said}, name
        assert c.signal is Signal.KV_SATURATION


def test_the_slots_waited_for() -> None:
    """One key set: at most max_loras adapters run at once (vLLM's scheduler asserts it), the rest wait."""
    assert LoRAActivity("p", ("a", "b", "c"), ("a", "b", "c"), 1).waiting_for_a_slot == 2
    assert LoRAActivity("p", ("a",), ("a",), 1).waiting_for_a_slot == 0
    assert LoRAActivity("p", ("a", "b"), ("c",), 2).waiting_for_a_slot == 1
    assert LoRAActivity("p", ("a", "b"), ("a", "b", "c"), 3).waiting_for_a_slot == 0  # a free slot
    assert LoRAActivity("p", ("a", "b", "c"), ("a", "b", "c"), None).waiting_for_a_slot == 0


# ---- the gatherer ------------------------------------------------------------------------------------------

def running(*pods: str, plan_hash: str = "h1") -> FakeCluster:
    return FakeCluster(pod_list=[{"metadata": {"name": p, "annotations": {PLAN_HASH: plan_hash}},
                                  "status": {"containerStatuses": [{"name": "vllm", "restartCount": 0}]}}
                                 for p in pods])


def target(*, lora: bool = True) -> Target:
    return Target(namespace=NAMESPACE, name="x", plan_hash="h1", replicas=2, deployment=None, last_evidence=None,
                  kv_threshold=0.95, kv_window=300, lora=lora)


FULL = [series("x-1", "a,b,c", "a,b,c")]


def test_a_saturation_reads_the_adapters_of_the_plans_pods_once() -> None:
    labels = Labels(FULL)
    gatherer = Gatherer(running("x-1", "x-2"), FakePrometheus(answer=saturated()), labels=labels)
    found = gatherer.gather(target()).saturation
    assert labels.queries == [f'topk by (namespace, pod) (1, {LORA_REQUESTS_INFO}{{namespace="{NAMESPACE}",'
                              f'pod=~"x-1|x-2"}})']
    assert found is not None and found.signal is Signal.KV_SATURATION
    assert "3 LoRA adapters with requests in flight (a, b, c), max_loras 2: the adapter slots are full" in (
        found.summary), found.summary
    assert found.evidence[EVIDENCE_KEY] in found.summary and found.evidence["source"] == "prometheus"


@pytest.mark.parametrize(("name", "labels", "prometheus", "lora"), [
    ("Prometheus down for the LoRA query", Labels(MetricsUnavailable("Prometheus query failed: timeout")),
     FakePrometheus(answer=saturated()), True),
    ("no series", Labels([]), FakePrometheus(answer=saturated()), True),
    ("no label reader configured", None, FakePrometheus(answer=saturated()), True),
    ("no spec.lora: not asked", Labels(FULL), FakePrometheus(answer=saturated()), False),
    ("no saturation: not asked", Labels(FULL), FakePrometheus(), True),
])
def test_without_a_lora_answer_the_evidence_stays_as_the_rule_gave_it(
        name: str, labels: Labels | None, prometheus: FakePrometheus, lora: bool) -> None:
    plain = Gatherer(running("x-1"), FakePrometheus(answer=prometheus.answer)).gather(target(lora=lora))
    evidence = Gatherer(running("x-1"), prometheus, labels=labels).gather(target(lora=lora))
    assert evidence == plain, name
    if labels is not None and (not lora or evidence.saturation is None):
        assert labels.queries == [], name


# ---- the reconcile ------------------------------------------------------------------------------------------

LORA_H100 = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-h100-80gb"},
             "serving": {"maxModelLen": 16384, "minMaxModelLen": 4096}, "remediation": {"cooldownSeconds": 0},
             "lora": {"maxLoras": 2, "maxLoraRank": 16}}


def _saturated_run(spec: dict[str, Any], labels: Labels) -> Run:
    run = Run(spec)
    run.once()
    assert run.condition("Planned")["status"] == "True", run.condition("Planned")
    run.cluster.running("x-1")
    run.gatherer = Gatherer(run.cluster, FakePrometheus(answer=saturated()), labels=labels)
    run.once()
    return run


def test_the_remediation_history_says_the_slots_were_full() -> None:
    """spec.lora reaches the gatherer's Target (desired/intent.py), and the step's entry says what LoRA did."""
    run = _saturated_run(LORA_H100, Labels(FULL))
    (entry,) = run.remediation["history"]
    assert entry["signal"] == Signal.KV_SATURATION and "the adapter slots are full" in entry["message"], entry
    assert "max_loras 2" in entry["evidence"][EVIDENCE_KEY]


def test_no_lora_spec_no_lora_query() -> None:
    labels = Labels(FULL)
    run = _saturated_run({k: v for k, v in LORA_H100.items() if k != "lora"}, labels)
    (entry,) = run.remediation["history"]
    assert entry["signal"] == Signal.KV_SATURATION and EVIDENCE_KEY not in entry["evidence"], entry
    assert not any(LORA_REQUESTS_INFO in q for q in labels.queries)
