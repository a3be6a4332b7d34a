"""Each remediation knob is declared once (domain/knobs.py); the models and readers follow the table."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from llm_autopilot.api.v1alpha1 import RemediationOverrides, remediation_overrides_model
from llm_autopilot.domain.knobs import KNOBS, Kind, Knob
from llm_autopilot.planner.plan import Targets
from llm_autopilot.remediation.ladder import Overrides


def test_the_table_declares_every_knob_of_the_models_once() -> None:
    fields = [k.field for k in KNOBS]
    assert len(set(fields)) == len(fields) and len({k.alias for k in KNOBS}) == len(KNOBS)
    assert set(fields) == {f.name for f in dataclasses.fields(Overrides)}
    status = [(name, info.alias or name) for name, info in RemediationOverrides.model_fields.items()]
    assert status == [(k.field, k.alias) for k in KNOBS] + [("generation", "generation"),
                                                            ("attestation", "attestation")]


@pytest.mark.parametrize("knob", [k for k in KNOBS if k.kind is not Kind.FLAG], ids=lambda k: k.field)
def test_the_status_model_admits_the_tables_bounds(knob: Knob) -> None:
    assert knob.description == RemediationOverrides.model_fields[knob.field].description
    for bound in (knob.ge, knob.gt, knob.le):
        if bound is not None:
            RemediationOverrides.model_validate({knob.alias: bound if bound is not knob.gt else bound + 0.5})
    refused = [v for v in (knob.ge - 1 if knob.ge is not None else None, knob.gt,
                           knob.le + 1 if knob.le is not None else None) if v is not None]
    assert refused
    for value in refused:
        with pytest.raises(ValidationError):
            RemediationOverrides.model_validate({knob.alias: value})


def test_one_row_adds_the_status_field() -> None:
    row = Knob("max_widgets", "maxWidgets", Kind.INTEGER, description="Widgets.", ge=2, le=9)
    model = remediation_overrides_model((*KNOBS, row))
    assert list(model.model_fields)[-3:] == ["max_widgets", "generation", "attestation"]
    assert model.model_validate({"maxWidgets": 3}).model_dump()["max_widgets"] == 3
    with pytest.raises(ValidationError):
        model.model_validate({"maxWidgets": 1})
    assert model.model_json_schema()["properties"]["maxWidgets"]["description"] == "Widgets."


def test_a_planner_target_named_in_the_table_exists() -> None:
    targets = {f.name for f in dataclasses.fields(Targets)}
    assert {k.target for k in KNOBS if k.target is not None} <= targets


def test_the_status_form_round_trips_through_the_table() -> None:
    o = Overrides(max_model_len=8192, max_num_batched_tokens=4096, enforce_eager=True, fp8_kv_cache=True,
                  min_gpus=2, memory_limit_gib=54.0)
    assert o.to_status() == {"maxModelLen": 8192, "maxNumBatchedTokens": 4096, "enforceEager": True,
                             "fp8KVCache": True, "minGPUs": 2, "memoryLimitGiB": 54.0}
    assert Overrides.from_status(o.to_status()) == o
