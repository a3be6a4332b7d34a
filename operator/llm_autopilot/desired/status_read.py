"""The status as read, parsed once into an LLMDeploymentStatus: a field that does not parse (a forged or an older
operator's status) is set aside and named, so the sections decide it again from the spec and the cluster, and
the object says so (the StatusRead condition) instead of the reconcile failing with a traceback.

The status is a report, not the operator's memory: whoever may write the status subresource may write any of it.
Each section the operator reads back (ATTESTED) carries the operator's attestation in status.attestations, made
and checked by the shell with a key only the operator holds (controller/status_attestation.py); the shell hands
over which sections verify, and one that does not is set aside as if it were absent (decided again: inspected,
verified, burnt in, chosen again), named once (the StatusForged Event) and removed or re-attested by the write."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from llm_autopilot.api.errors import validation_message
from llm_autopilot.api.status import Condition, LLMDeploymentStatus

STATUS_READ = "StatusRead"
#: read by their own readers, which keep what they can of them and say what they repaired (remediation/state.py,
#: desired/calibration.py: a malformed pin is chosen again, not nulled by a pass that fails before choosing)
OWN_READERS = frozenset({"remediation", "kvCalibration"})
#: the sections the operator reads back as what it did or found, each attested (status.attestations); the
#: remediation state's applied rungs also chain their own digests (remediation/state.py)
ATTESTED = ("source", "loraSources", "cache", "verification", "releases", "kvCalibration", "burnIn", "lora",
            "remediation", "startupProbe", "canary")
ATTESTATIONS = "attestations"
STATUS_FORGED = "StatusForged"
Section = TypeVar("Section", bound=BaseModel)
_FIELDS = frozenset(f.alias or name for name, f in LLMDeploymentStatus.model_fields.items())


@dataclass(frozen=True)
class StatusRead:
    #: the fields that parse (status.remediation aside: its own reader reads it)
    status: LLMDeploymentStatus
    #: the status as read without what does not parse: what the sections read
    readable: dict[str, Any]
    #: what does not parse, one line each (``status.burnIn.planHash: ...``)
    problems: tuple[str, ...] = ()
    #: the attested sections set aside: their attestation is not the operator's (``source``, ``burnIn``)
    forged: tuple[str, ...] = ()


def read_status(raw: Mapping[str, Any], attested: frozenset[str] | None = None) -> StatusRead:
    """``attested``: the sections of ATTESTED whose attestation the shell verified (None: not checked, every
    section is taken as the operator's: a caller that reads no stored status, and the pure tests)."""
    readable: dict[str, Any] = {}
    problems: list[str] = []
    forged: list[str] = []
    for key, value in raw.items():
        if attested is not None and key in ATTESTED and value is not None and key not in attested:
            forged.append(key)  # not the operator's: as if absent
        elif key not in _FIELDS or key in OWN_READERS:  # another version's key is kept as it is
            readable[key] = value
        elif key == "conditions" and isinstance(value, list):  # one bad condition does not cost the others
            readable[key] = [c for i, c in enumerate(value) if _parses(Condition, c, f"status.conditions[{i}]",
                                                                      problems)]
        elif _parses(LLMDeploymentStatus, {key: value}, "status", problems):
            readable[key] = value
    typed = LLMDeploymentStatus.model_validate({k: v for k, v in readable.items()
                                                if k in _FIELDS and k not in OWN_READERS})
    return StatusRead(typed, readable, tuple(problems), tuple(forged))


def forged_message(forged: tuple[str, ...]) -> str:
    """What the StatusForged Event and the log say of the sections set aside."""
    return (", ".join(f"status.{key}" for key in forged) + ": not attested by this operator (written by someone "
            "else, or by an operator without this key): ignored, decided again from the spec and the cluster")


def _parses(model: type[Condition] | type[LLMDeploymentStatus], value: Any, root: str, problems: list[str]) -> bool:
    try:
        model.model_validate(value)
    except ValidationError as exc:
        problems.append(validation_message(exc, root))
        return False
    return True


def status_read_condition(read: StatusRead, conditions: Sequence[Condition]) -> tuple[bool, str, str] | None:
    """StatusRead: False while a field does not parse; True again once it does (None: never said, nothing to say)."""
    if read.problems:
        return False, "Unreadable", ("; ".join(read.problems)[:400] + ": set aside, decided again from the spec "
                                     "and the cluster")
    if any(c.type == STATUS_READ for c in conditions):
        return True, "Readable", "every field of the status parses"
    return None


def read_section(model: type[Section], raw: Any) -> Section | None:
    """A section its own reader reads (a pin): None when absent or malformed, so it is chosen again."""
    if not isinstance(raw, Mapping):
        return None
    try:
        return model.model_validate(raw)
    except ValidationError:
        return None
