"""The remediation state in ``status.remediation``: parsed once, defensively, into an immutable model. Pure.

As Kopf does with its handler progress (``HandlerState.from_storage`` / ``for_storage``, ``with_outcome``
returning a new state, written only when it differs from what was read), the state is read once per
reconcile, every change returns a new value, and the shell writes it back only when it changed.

The status subresource can be written by others (a restore, a migration, ``kubectl patch
--subresource=status``, a peer with a skewed clock), so reading never fails: unparsable timestamps are
treated as missing, future ones are clamped to now, and counters and overrides are clamped to what the spec
and the nodes allow -- each with a warning the shell reports.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError

from llm_autopilot.api.v1alpha1 import RemediationEvent, RemediationOverrides, RemediationStatus
from llm_autopilot.domain.attestation import canonical
from llm_autopilot.domain.knobs import KNOBS, Kind, Knob
from llm_autopilot.remediation.guards import MAX_RELAX_BACKOFF
from llm_autopilot.remediation.ladder import Overrides

HISTORY_LIMIT = 20
#: spec.replicas' own bound (and the status schema's)
MAX_REPLICAS = 1000
#: a peer's clock may run this far ahead without a warning (the stamp is still clamped to now)
CLOCK_SKEW = timedelta(seconds=60)


#: bump when the digest's inputs change (steps attested by an older scheme are then dropped once)
ATTESTATION_SCHEME = "llm-autopilot.io/remediation-step/v1"
#: the keys of an applied entry that are not the step itself
_ATTRIBUTION_KEYS = ("generation", "attestation")


@dataclass(frozen=True)
class Author:
    """Who records remediation steps: the operator, for this object (its uid), under this spec generation."""

    uid: str
    generation: int


def attestation(uid: str, generation: int, step: Mapping[str, Any], previous: str) -> str:
    """The digest an applied entry carries: of the object's uid, the generation the step was taken under, the
    step's overrides and the previous entry's digest (so entries cannot be reordered, copied between objects or
    edited). It attributes a step to the operator's own write; it is not a secret (see README)."""
    content = {k: v for k, v in step.items() if k not in _ATTRIBUTION_KEYS}
    text = json.dumps([ATTESTATION_SCHEME, uid, generation, canonical(content), previous], sort_keys=True,
                      separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Limits:
    """What the spec and the nodes allow; a status is clamped into these when it is read."""

    max_steps: int
    spec_replicas: int
    max_replicas: int | None
    max_gpus: int
    #: the most allocatable memory of a matching node (GiB); 0 when no node is known
    node_memory_gib: float
    floor_max_model_len: int
    floor_max_num_seqs: int
    floor_max_num_batched_tokens: int
    floor_gpu_memory_utilization: float


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _integer(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number.is_integer() else None


def replicas_bound(spec_replicas: int, max_replicas: int | None) -> int:
    return min(max(spec_replicas, max_replicas or 0), MAX_REPLICAS)


def clamp_replicas(value: Any, spec_replicas: int, max_replicas: int | None) -> int | None:
    """An applied replica override within 1..max(spec.replicas, remediation.maxReplicas); None if unusable."""
    n = _integer(value)
    bound = replicas_bound(spec_replicas, max_replicas)
    if n is None or bound < 1:
        return None
    return min(max(n, 1), bound)


def effective_replicas(remediation: Any, spec_replicas: int, max_replicas: int | None) -> int:
    """The replicas that should run: the last applied override (clamped as when read), else the spec's."""
    applied = remediation.get("applied") if isinstance(remediation, Mapping) else None
    last = applied[-1] if isinstance(applied, list | tuple) and applied else None
    replicas = clamp_replicas(last.get("replicas"), spec_replicas, max_replicas) if isinstance(last, Mapping) else None
    return replicas if replicas is not None else spec_replicas


class _Reader:
    """Collects what had to be repaired while reading one status."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.warnings: list[str] = []

    def warn(self, message: str) -> None:
        self.warnings.append(f"status.remediation.{message}")

    def time(self, raw: Mapping[str, Any], key: str) -> datetime | None:
        value = raw.get(key)
        if value is None:
            return None
        try:
            parsed = datetime.fromisoformat(value) if isinstance(value, str) else None
        except ValueError:
            parsed = None
        if parsed is None or parsed.tzinfo is None:
            self.warn(f"{key} {value!r} is not an RFC 3339 time; treated as missing")
            return None
        parsed = parsed.astimezone(UTC)
        if parsed > self.now:
            if parsed - self.now > CLOCK_SKEW:
                self.warn(f"{key} {value} is in the future; clamped to now")
            return self.now
        return parsed

    def bounded(self, where: str, value: Any, low: float, high: float | None, *,
                convert: Callable[[Any], float | None] = _integer, positive: bool = False) -> Any:
        """``value`` clamped into [low, high]; None (with a warning) when it is not a number, or, for
        ``positive`` quantities (a memory limit, a utilization), not above zero."""
        if value is None:
            return None
        number = convert(value)
        if number is None or (positive and number <= 0):
            self.warn(f"{where} {value!r} is not a valid value; ignored")
            return None
        clamped = max(number, low) if high is None else min(max(number, low), high)
        if clamped != number:
            self.warn(f"{where} {value!r} is outside {low:g}..{'' if high is None else f'{high:g}'}; "
                      f"clamped to {clamped:g}")
        return clamped

    def flag(self, where: str, value: Any) -> bool | None:
        if value is None or isinstance(value, bool):
            return value
        self.warn(f"{where} {value!r} is not a boolean; ignored")
        return None

    def overrides(self, where: str, raw: Mapping[str, Any], limits: Limits) -> RemediationOverrides:
        """One applied entry: every knob read as its row declares it, but replicas (``special``: its bound is
        spec.replicas, which may be 0, or remediation.maxReplicas; ``effective_replicas`` reads it the same way)."""
        values: dict[str, Any] = {knob.field: self.replicas(where, raw, knob, limits) if knob.field == "replicas"
                                  else self.knob(where, raw, knob, limits) for knob in KNOBS}
        generation = raw.get("generation")
        return RemediationOverrides.model_validate({
            **values,
            "generation": generation if isinstance(generation, int) and not isinstance(generation, bool) else None})

    def replicas(self, where: str, raw: Mapping[str, Any], knob: Knob, limits: Limits) -> int | None:
        value = raw.get(knob.alias)
        clamped = clamp_replicas(value, limits.spec_replicas, limits.max_replicas)
        if value is not None and clamped != value:
            bound = replicas_bound(limits.spec_replicas, limits.max_replicas)
            outcome = "ignored" if clamped is None else f"clamped to {clamped}"
            self.warn(f"{where}.{knob.alias} {value!r} is outside 1..{bound}; {outcome}")
        return clamped

    def knob(self, where: str, raw: Mapping[str, Any], knob: Knob, limits: Limits) -> Any:
        """One knob of an applied entry, read as the table declares it."""
        value = raw.get(knob.alias)
        if knob.kind is Kind.FLAG:
            return self.flag(f"{where}.{knob.alias}", value)
        low = knob.clamp_low(limits)
        return self.bounded(f"{where}.{knob.alias}", value, low if low is not None else 0, knob.clamp_high(limits),
                            convert=_number if knob.kind is Kind.NUMBER else _integer, positive=knob.positive)


class RemediationState(RemediationStatus):
    """``status.remediation`` as a typed, immutable value; every ``with_*`` returns a new state."""

    @classmethod
    def read(cls, raw: Any, limits: Limits, now: datetime) -> tuple[RemediationState, tuple[str, ...]]:
        """The state in ``raw`` (whatever wrote it), and what had to be repaired to read it; every applied entry
        is taken as it is (tools and tests; the operator reads with ``read_attributed``)."""
        state, repairs, dropped = cls.read_attributed(raw, limits, now, None)
        return state, repairs + dropped

    @classmethod
    def read_attributed(cls, raw: Any, limits: Limits, now: datetime,
                        author: Author | None) -> tuple[RemediationState, tuple[str, ...], tuple[str, ...]]:
        """(the state, what had to be repaired, the applied entries dropped as not the operator's). With an
        ``author``, only applied entries whose attestation chain verifies count: the first that does not (a
        hand-written, copied, edited or reordered entry) is dropped with every later one, and none is applied.
        The kept entries are attested again (a clamp changes what they say)."""
        reader = _Reader(now)
        if raw is None:
            return cls(), (), ()
        if not isinstance(raw, Mapping):
            reader.warn(f"{type(raw).__name__} is not an object; started afresh")
            return cls(), tuple(reader.warnings), ()
        applied: list[RemediationOverrides] = []
        dropped: list[str] = []
        previous = ""
        entries = raw.get("applied") or []
        for i, item in enumerate(entries if isinstance(entries, list | tuple) else []):
            if author is not None:
                generation = item.get("generation") if isinstance(item, Mapping) else None
                valid = (isinstance(item, Mapping) and isinstance(generation, int)
                         and not isinstance(generation, bool) and 0 <= generation <= author.generation
                         and item.get("attestation") == attestation(author.uid, generation, item, previous))
                if not valid:
                    later = len(entries) - i - 1
                    dropped.append(f"status.remediation.applied[{i}] was not recorded by the operator (no valid "
                                   f"attestation); dropped{f' with the {later} later entries' if later else ''}, "
                                   "not applied")
                    break
                previous = str(item["attestation"])
            if isinstance(item, Mapping):
                applied.append(reader.overrides(f"applied[{i}]", item, limits))
            else:
                reader.warn(f"applied[{i}] is not an object; ignored")
        history: list[RemediationEvent] = []
        for i, item in enumerate(raw.get("history") or []):
            try:
                history.append(RemediationEvent.model_validate(item))
            except ValidationError as exc:
                reader.warn(f"history[{i}] is malformed ({exc.error_count()} errors); dropped")
        texts = {key: raw.get(key) for key in ("lastEvidence", "state")}
        for key, value in texts.items():
            if value is not None and not isinstance(value, str):
                reader.warn(f"{key} {value!r} is not a string; ignored")
                texts[key] = None
        rung = reader.bounded("rung", raw.get("rung", 0), 0, limits.max_steps)
        if dropped:
            rung = min(len(applied), limits.max_steps)  # said by the drop; the rung follows the entries kept
        if rung is not None and rung != min(len(applied), limits.max_steps):
            # every writer keeps rung == the number of applied rungs; a status that disagrees is repaired
            reader.warn(f"rung {rung} does not match the {len(applied)} applied rungs; set to "
                        f"{min(len(applied), limits.max_steps)}")
            rung = min(len(applied), limits.max_steps)
        backoff = reader.bounded("relaxBackoff", raw.get("relaxBackoff", 1), 1, MAX_RELAX_BACKOFF)
        state = cls(
            rung=int(rung if rung is not None else 0),
            last_step_time=reader.time(raw, "lastStepTime"),
            last_signal_time=reader.time(raw, "lastSignalTime"),
            last_relax_time=reader.time(raw, "lastRelaxTime"),
            relax_backoff=int(backoff if backoff is not None else 1),
            last_evidence=texts["lastEvidence"],
            state=texts["state"],
            applied=tuple(applied[-HISTORY_LIMIT:]),
            history=tuple(history[-HISTORY_LIMIT:]),
        )
        if author is not None:
            state = state.attested(author)
        return state, tuple(reader.warnings), tuple(dropped)

    def attested(self, author: Author) -> RemediationState:
        """Every applied entry with its attestation chain; an entry without a generation (a step just taken)
        gets the author's."""
        previous, entries = "", []
        for entry in self.applied:
            generation = entry.generation if entry.generation is not None else author.generation
            step = entry.model_dump(mode="json", by_alias=True, exclude_none=True)
            digest = attestation(author.uid, generation, step, previous)
            entries.append(entry.model_copy(update={"generation": generation, "attestation": digest}))
            previous = digest
        return self._with(applied=tuple(entries))

    def to_status(self) -> dict[str, Any]:
        """For a merge patch: unset fields are explicit nulls, so a value read as missing is removed."""
        data: dict[str, Any] = self.model_dump(mode="json", by_alias=True, exclude={"applied", "history"})
        data["applied"] = [o.model_dump(mode="json", by_alias=True, exclude_none=True) for o in self.applied]
        data["history"] = [e.model_dump(mode="json", by_alias=True, exclude_none=True) for e in self.history]
        return data

    @property
    def overrides(self) -> Overrides:
        """The overrides in force: the last applied rung's."""
        if not self.applied:
            return Overrides()
        return Overrides.from_status(self.applied[-1].model_dump(by_alias=True, exclude_none=True))

    def effective_replicas(self, spec_replicas: int) -> int:
        return self.overrides.replicas if self.overrides.replicas is not None else spec_replicas

    def _with(self, **changes: Any) -> RemediationState:
        return type(self).model_validate({**dict(self), **changes})

    def with_signal(self, at: datetime, relax_backoff: int) -> RemediationState:
        return self._with(last_signal_time=at, relax_backoff=relax_backoff)

    def with_verdict(self, verdict: str) -> RemediationState:
        return self._with(state=verdict)

    def with_evidence(self, key: str) -> RemediationState:
        return self._with(last_evidence=key)

    def with_step(self, overrides: Overrides, at: datetime, event: RemediationEvent) -> RemediationState:
        applied = (*self.applied, RemediationOverrides.model_validate(overrides.to_status()))
        return self._with(rung=self.rung + 1, applied=applied[-HISTORY_LIMIT:], last_step_time=at, state="Step",
                          history=(*self.history, event)[-HISTORY_LIMIT:])

    def with_relax(self, at: datetime, event: RemediationEvent) -> RemediationState:
        applied = self.applied[:-1]
        return self._with(rung=len(applied), applied=applied, last_relax_time=at,
                          history=(*self.history, event)[-HISTORY_LIMIT:])

    def reset(self) -> RemediationState:
        """Back to the plan (the spec changed so that the overrides no longer fit); history and timestamps stay,
        so the cooldown still holds."""
        return self._with(rung=0, applied=())
