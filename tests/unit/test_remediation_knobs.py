"""Each remediation knob is declared once (domain/knobs.py); the models and readers follow the table."""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from llm_autopilot.api.v1alpha1 import RemediationOverrides, remediation_overrides_model
from llm_autopilot.domain.knobs import KNOBS, Kind, Knob
from llm_autopilot.planner.config import ServingConfig
from llm_autopilot.planner.plan import Targets
from llm_autopilot.remediation.evidence import apply_overrides
from llm_autopilot.remediation.ladder import Overrides
from llm_autopilot.remediation.state import Limits, RemediationState
from tests.unit.test_remediation import running


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


#: the type and default of an ``Overrides`` field for a row's kind (None/False: "as the spec and planner say")
_OVERRIDE_FIELD = {Kind.INTEGER: ("int | None", None), Kind.NUMBER: ("float | None", None), Kind.FLAG: ("bool", False)}


def test_overrides_written_by_hand_is_the_table_field_for_field() -> None:
    """``Overrides`` stays a hand-written dataclass so that mypy types every rung's reads and replaces (a class
    made from the table would be Any to it); this holds it to the table: the same fields, in the table's order,
    each typed and defaulted as its row's kind says."""
    assert [(f.name, f.type, f.default) for f in dataclasses.fields(Overrides)] == [
        (k.field, *_OVERRIDE_FIELD[k.kind]) for k in KNOBS]


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


def test_a_row_reads_what_runs_now_from_an_attribute_the_planned_config_has() -> None:
    attributes = {f.name for f in dataclasses.fields(ServingConfig)} | {
        name for name, value in vars(ServingConfig).items() if isinstance(value, property)}
    named = {k.field: k.now or k.field for k in KNOBS if not callable(k.now)}
    assert named and set(named.values()) <= attributes


def test_what_runs_now_is_the_plan_read_through_the_table_not_a_copy() -> None:
    r = running(max_model_len=4096, max_num_batched_tokens=2048, max_num_seqs=64, enforce_eager=True,
                gpu_memory_utilization=0.85, fp8_kv_cache=True, gpus=2, replicas=3, memory_limit_gib=40.0, max_loras=4)
    assert {k.field: r.now(k.field) for k in KNOBS} == {
        "max_model_len": 4096, "max_num_batched_tokens": 2048, "max_num_seqs": 64, "enforce_eager": True,
        "gpu_memory_utilization": 0.85, "fp8_kv_cache": True, "min_gpus": 2, "replicas": 3, "memory_limit_gib": 40.0,
        "max_loras": 4, "max_cudagraph_capture_size": 0}
    replanned = dataclasses.replace(r, config=dataclasses.replace(r.config, max_num_seqs=7, lora=None))
    assert (replanned.max_num_seqs, replanned.max_loras, replanned.gpus) == (7, 0, 2)


@pytest.mark.parametrize("knob", [k for k in KNOBS if not k.special], ids=lambda k: k.field)
def test_an_ordinary_knob_is_mapped_to_the_planner_by_its_row_alone(knob: Knob) -> None:
    """No code of its own: its target (when it has one) takes the value as it is, nothing else moves."""
    value = {Kind.INTEGER: 3, Kind.NUMBER: 0.5, Kind.FLAG: True}[knob.kind]
    mapped = apply_overrides(Targets(), Overrides(**{knob.field: value}), floor_max_model_len=1)
    expected = Targets() if knob.target is None else dataclasses.replace(Targets(), **{knob.target: value})
    assert mapped == expected


def test_the_status_form_round_trips_through_the_table() -> None:
    o = Overrides(max_model_len=8192, max_num_batched_tokens=4096, enforce_eager=True, fp8_kv_cache=True,
                  min_gpus=2, memory_limit_gib=54.0)
    assert o.to_status() == {"maxModelLen": 8192, "maxNumBatchedTokens": 4096, "enforceEager": True,
                             "fp8KVCache": True, "minGPUs": 2, "memoryLimitGiB": 54.0}
    assert Overrides.from_status(o.to_status()) == o



# Limits looser than every schema bound (floors of 0, more GPUs than the schema admits, no node memory known): a
# status is then clamped to the schema's edge, unless a row states a tighter bound of its own.
_LOOSE = Limits(max_steps=5, spec_replicas=1, max_replicas=None, max_gpus=10**6, node_memory_gib=0.0,
                floor_max_model_len=0, floor_max_num_seqs=0, floor_max_num_batched_tokens=0,
                floor_gpu_memory_utilization=0.0)
_TIGHT = dataclasses.replace(_LOOSE, max_gpus=2, node_memory_gib=64.0, floor_max_model_len=4096,
                             floor_max_num_seqs=8, floor_max_num_batched_tokens=512, floor_gpu_memory_utilization=0.7)
_READ = [k for k in KNOBS if k.kind is not Kind.FLAG and k.field != "replicas"]  # replicas: clamp_replicas


def _read(knob: Knob, value: float) -> tuple[Any, str]:
    """The knob's value as the reader repairs it from a status entry, and its warnings."""
    state, warnings = RemediationState.read({"rung": 1, "applied": [{knob.alias: value}]}, _LOOSE,
                                            datetime(2026, 12, 1, tzinfo=UTC))
    return getattr(state.overrides, knob.field), " ".join(warnings)


@pytest.mark.parametrize("knob", _READ, ids=lambda k: k.field)
def test_a_status_past_the_schemas_edge_is_clamped_to_that_edge(knob: Knob) -> None:
    """The edges are the status schema's (the CRD's), not read back from the table's fields."""
    schema = next(s for s in RemediationOverrides.model_json_schema(by_alias=True)["properties"][knob.alias]["anyOf"]
                  if s["type"] != "null")
    integer = schema["type"] == "integer"
    own_low = knob.low(_LOOSE)
    if "minimum" in schema:
        edge = math.ceil(schema["minimum"]) if integer else schema["minimum"]
        assert own_low is None or own_low <= edge
        value, warnings = _read(knob, edge - 1)
        assert value == edge and "clamped to" in warnings
    if "exclusiveMinimum" in schema:
        edge = schema["exclusiveMinimum"]
        value, warnings = _read(knob, edge)
        if integer:
            assert value == math.floor(edge) + 1 and "clamped to" in warnings
        else:  # no least value to clamp to: refused (``positive``)
            assert value is None and "not a valid value" in warnings
    if "maximum" in schema:
        edge = math.floor(schema["maximum"]) if integer else schema["maximum"]
        value, warnings = _read(knob, edge + 1)
        assert value == edge and "clamped to" in warnings
    else:
        assert _read(knob, 10**9) == (10**9, "")


@pytest.mark.parametrize("knob", _READ, ids=lambda k: k.field)
def test_no_row_restates_a_schema_bound_as_its_own(knob: Knob) -> None:
    for own, schema in ((knob.low, knob.schema_low()), (knob.high, knob.schema_high())):
        constant = own(_LOOSE) is not None and own(_LOOSE) == own(_TIGHT)
        assert not (constant and own(_TIGHT) == schema), f"{knob.field} restates its schema bound {schema}"


def test_the_clamp_bounds_are_the_tighter_of_the_rows_and_the_schemas() -> None:
    assert Knob("w", "w", Kind.INTEGER, ge=1.5, le=9.5).clamp_low(_LOOSE) == 2
    assert Knob("w", "w", Kind.INTEGER, ge=1.5, le=9.5).clamp_high(_LOOSE) == 9
    assert Knob("w", "w", Kind.INTEGER, gt=0).schema_low() == 1 == Knob("w", "w", Kind.INTEGER, gt=0.5).schema_low()
    assert Knob("w", "w", Kind.NUMBER, gt=0, le=1).clamp_low(_LOOSE) is None
    assert Knob("w", "w", Kind.NUMBER, high=lambda _: 0.5, le=1).clamp_high(_LOOSE) == 0.5
    min_gpus = next(k for k in KNOBS if k.field == "min_gpus")
    assert (min_gpus.clamp_high(_TIGHT), min_gpus.clamp_high(_LOOSE)) == (2, 64)
