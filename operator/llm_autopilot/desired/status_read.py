"""The status as read, parsed once into an LLMDeploymentStatus: a field that does not parse (a forged or an older
operator's status) is set aside and named, so the sections decide it again from the spec and the cluster, and
the object says so (the StatusRead condition) instead of the reconcile failing with a traceback."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from llm_autopilot.api.errors import validation_message
from llm_autopilot.api.status import Condition, LLMDeploymentStatus

STATUS_READ = "StatusRead"
#: read by its own reader, which keeps what it can of it and says what it repaired (remediation/state.py)
OWN_READER = "remediation"
_FIELDS = frozenset(f.alias or name for name, f in LLMDeploymentStatus.model_fields.items())


@dataclass(frozen=True)
class StatusRead:
    #: the fields that parse (status.remediation aside: its own reader reads it)
    status: LLMDeploymentStatus
    #: the status as read without what does not parse: what the sections read
    readable: dict[str, Any]
    #: what does not parse, one line each (``status.burnIn.planHash: ...``)
    problems: tuple[str, ...] = ()


def read_status(raw: Mapping[str, Any]) -> StatusRead:
    readable: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in raw.items():
        if key not in _FIELDS or key == OWN_READER:  # a key of another version of the operator is kept as it is
            readable[key] = value
        elif key == "conditions" and isinstance(value, list):  # one bad condition does not cost the others
            readable[key] = [c for i, c in enumerate(value) if _parses(Condition, c, f"status.conditions[{i}]",
                                                                      problems)]
        elif _parses(LLMDeploymentStatus, {key: value}, "status", problems):
            readable[key] = value
    typed = LLMDeploymentStatus.model_validate({k: v for k, v in readable.items()
                                                if k in _FIELDS and k != OWN_READER})
    return StatusRead(typed, readable, tuple(problems))


def _parses(model: type[Condition] | type[LLMDeploymentStatus], value: Any, root: str, problems: list[str]) -> bool:
    try:
        model.model_validate(value)
    except ValidationError as exc:
        problems.append(validation_message(exc, root))
        return False
    return True


def status_read_condition(read: StatusRead, conditions: list[dict[str, Any]]) -> tuple[bool, str, str] | None:
    """StatusRead: False while a field does not parse; True again once it does (None: never said, nothing to say)."""
    if read.problems:
        return False, "Unreadable", ("; ".join(read.problems)[:400] + ": set aside, decided again from the spec "
                                     "and the cluster")
    if any(c.get("type") == STATUS_READ for c in conditions):
        return True, "Readable", "every field of the status parses"
    return None
