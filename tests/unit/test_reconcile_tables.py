"""The shell as tables (controller/reconcile.py): every ask desired() can make has its reader, and the Outcome
carries the Intent's whole Report."""

from __future__ import annotations

import dataclasses

from llm_autopilot.controller.reconcile import EFFECTS, FEATURE_READERS, READERS, Outcome
from llm_autopilot.desired.burn_in import BurnInAsk, BurnInGateWrite, BurnInKeep, BurnInStart
from llm_autopilot.desired.canary import CanaryAsk, CanaryDelete
from llm_autopilot.desired.lora_calls import LoRAKeep, LoRAPodCalls, LoRAPodsAsk
from llm_autopilot.desired.network_policy import DeleteNetworkPolicy
from llm_autopilot.desired.remediation_adoption import RunningPlanAsk
from llm_autopilot.desired.startup_probe import RecordStarts
from llm_autopilot.desired.vocabulary import Asks, Intent, Report

#: read with the ask they go with (the status recorded so far, the Target the evidence is gathered for)
COMPANIONS = {"known_cache": "cache", "evidence": "workload"}
#: the after-plan features' asks and effects, each read or executed by its type
FEATURE_ASKS = {BurnInAsk, CanaryAsk, LoRAPodsAsk, RunningPlanAsk}
FEATURE_EFFECTS = {BurnInStart, BurnInKeep, BurnInGateWrite, CanaryDelete, DeleteNetworkPolicy, LoRAKeep, LoRAPodCalls,
                   RecordStarts}


def test_every_ask_has_a_reader() -> None:
    asks = {f.name for f in dataclasses.fields(Asks)}
    assert set(READERS) == asks - set(COMPANIONS) - {"features"}
    assert set(COMPANIONS.values()) <= set(READERS)
    assert set(FEATURE_READERS) == FEATURE_ASKS


def test_every_effect_has_an_executor() -> None:
    assert set(EFFECTS) == FEATURE_EFFECTS


def test_the_outcome_carries_the_intents_report() -> None:
    intent = Intent(status={"a": 1}, events=[("Normal", "R", "m")], retry=True, retry_reason="why", retry_delay=2.0,
                    settled=True, plan_hash="p", metrics="ok", kv_question=(300, 0.9), objects=[{"kind": "X"}])
    out = Outcome.of(intent, status={"b": 2}, writes=3)
    for f in dataclasses.fields(Report):
        if f.name != "status":
            assert getattr(out, f.name) == getattr(intent, f.name), f.name
    assert out.status == {"b": 2} and out.writes == 3 and out.full
    assert out.events is not intent.events  # the shell may add to its own list
