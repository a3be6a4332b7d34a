"""What the inspect Job reports about a pvc:// model folder, through its container's termination message. Pure.

``llm-autopilot inspect-volume`` (run in the operator's image, the claim mounted read-only) writes one JSON
object to ``/dev/termination-log``; the kubelet copies it into the pod's status (at most 4096 bytes), where the
operator reads it. The operator trusts nothing in it: :func:`parse_report` accepts exactly this shape, with
config.json's planner fields only (catalog/hf_config.py's ``planner_view``), and turns anything else into one
line that says what was wrong.
"""

from __future__ import annotations

import json
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from llm_autopilot.api.lora import AdapterConfig, parse_adapter_config
from llm_autopilot.catalog.hf_config import PLANNER_FIELDS, planner_view

#: the kubelet's cap on a termination message (MaxContainerTerminationMessageLength)
MESSAGE_LIMIT = 4096
REPORT_VERSION: Final = "llm-autopilot.io/inspect-v1"
#: far above any checkpoint (1 PiB), far below a float's precision limit
BYTES_MAX = 2**50
FILES_MAX = 10**6


class ReportError(ValueError):
    """The termination message is not an inspection report; the message says why, in one line."""


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True,
                              strict=True)


class InspectionReport(_Model):
    """A successful inspection: the planner's part of config.json and the weights' size on the volume."""

    report: Literal["llm-autopilot.io/inspect-v1"]
    ok: Literal[True]
    config: dict[str, Any] = Field(description="config.json's planner fields (hf_config.planner_view).")
    checkpoint_bytes: int | None = Field(None, ge=1, le=BYTES_MAX, description="Bytes of the weight files.")
    weight_files: int = Field(ge=0, le=FILES_MAX, description="Weight files (*.safetensors) in the folder.")
    files: int = Field(ge=0, le=FILES_MAX, description="Files in the folder.")

    @field_validator("config")
    @classmethod
    def _planner_fields_only(cls, value: dict[str, Any]) -> dict[str, Any]:
        extra = sorted(set(value) - PLANNER_FIELDS)
        if extra:
            raise ValueError(f"fields the planner does not read: {', '.join(extra[:5])}")
        if planner_view(value) != value:
            raise ValueError("nested fields the planner does not read")
        return value


class InspectionFailure(_Model):
    """A failed inspection: why (a missing config.json, unreadable JSON, a missing shard...)."""

    report: Literal["llm-autopilot.io/inspect-v1"]
    ok: Literal[False]
    error: str = Field(min_length=1, max_length=2000)


def encode(report: InspectionReport | InspectionFailure) -> str:
    return json.dumps(report.model_dump(by_alias=True, exclude_none=True), separators=(",", ":"), sort_keys=True)


def parse_report(message: str) -> InspectionReport | InspectionFailure:
    """The report a termination message carries; raises ReportError (one line) for anything else."""
    _check_size(message)
    try:
        value = json.loads(message)
    except ValueError:
        raise ReportError(f"the termination message is not JSON: {_excerpt(message)}") from None
    if not isinstance(value, dict):
        raise ReportError("the termination message is not a JSON object")
    if value.get("report") != REPORT_VERSION:
        raise ReportError(f"the termination message is not an inspection report ({REPORT_VERSION}): "
                          f"{_excerpt(message)}")
    model: type[InspectionReport | InspectionFailure] = InspectionReport if value.get("ok") is True \
        else InspectionFailure
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'report'}: {e['msg']}"
                             for e in exc.errors()[:3])
        raise ReportError(f"the inspection report is not valid: {problems}") from None


def _check_size(message: str) -> None:
    """Raises ReportError when the termination message is empty or over its limit."""
    if not message.strip():
        raise ReportError("the inspect Job's pod left no termination message")
    if len(message.encode()) > MESSAGE_LIMIT:
        raise ReportError(f"the termination message is longer than {MESSAGE_LIMIT} bytes")


def _excerpt(text: str, limit: int = 120) -> str:
    line = " ".join(text.split())
    printable = "".join(c if c.isprintable() else "?" for c in line)
    return repr(printable[:limit] + ("..." if len(printable) > limit else ""))


#: how a pvc:// LoRA adapter's inspect container (render/inspect.py::ADAPTER_SCRIPT) reports a failure
ADAPTER_ERROR = "error: "


def parse_adapter_report(message: str) -> AdapterConfig | InspectionFailure:
    """What a pvc:// adapter's inspect Job handed back: its adapter_config.json (the rank and the base model, as
    api/lora.py reads them from any source), or the folder's problem ("error: ..."); raises ReportError (one
    line) for anything else. The message is the volume's content, so nothing else of it is kept."""
    _check_size(message)
    text = message.strip()
    if text.startswith(ADAPTER_ERROR):
        error = " ".join(text.removeprefix(ADAPTER_ERROR).split())
        return InspectionFailure(report=REPORT_VERSION, ok=False, error=error[:2000] or "inspection failed")
    try:
        value = json.loads(text)
    except ValueError:
        raise ReportError(f"the termination message is not an adapter_config.json: {_excerpt(message)}") from None
    if not isinstance(value, dict):
        raise ReportError("the adapter_config.json handed back is not a JSON object")
    return parse_adapter_config(value)
