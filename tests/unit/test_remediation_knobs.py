"""Each remediation knob is declared once (remediation/knobs.py); the models and readers follow the table."""

from __future__ import annotations

import dataclasses

from llm_autopilot.api.v1alpha1 import RemediationOverrides
from llm_autopilot.planner.plan import Targets
from llm_autopilot.remediation.knobs import KNOBS
from llm_autopilot.remediation.ladder import Overrides

_ATTRIBUTION = {"generation", "attestation"}


def test_the_table_declares_every_knob_of_the_models_once() -> None:
    fields = [k.field for k in KNOBS]
    assert len(set(fields)) == len(fields) and len({k.alias for k in KNOBS}) == len(KNOBS)
    assert set(fields) == {f.name for f in dataclasses.fields(Overrides)}
    status = {name: info.alias or name for name, info in RemediationOverrides.model_fields.items()
              if name not in _ATTRIBUTION}
    assert status == {k.field: k.alias for k in KNOBS}  # the status model says what the table says


def test_a_planner_target_named_in_the_table_exists() -> None:
    targets = {f.name for f in dataclasses.fields(Targets)}
    assert {k.target for k in KNOBS if k.target is not None} <= targets


def test_the_status_form_round_trips_through_the_table() -> None:
    o = Overrides(max_model_len=8192, max_num_batched_tokens=4096, enforce_eager=True, fp8_kv_cache=True,
                  min_gpus=2, memory_limit_gib=54.0)
    assert o.to_status() == {"maxModelLen": 8192, "maxNumBatchedTokens": 4096, "enforceEager": True,
                             "fp8KVCache": True, "minGPUs": 2, "memoryLimitGiB": 54.0}
    assert Overrides.from_status(o.to_status()) == o
