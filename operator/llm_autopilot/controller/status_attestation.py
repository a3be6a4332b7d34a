"""The operator's attestation of the status sections it reads back (desired/status_read.py's ATTESTED): an HMAC
with a key only the operator holds, over the object's uid, the section's name and its content (canonical JSON),
kept in status.attestations. Who may write the status subresource cannot make one, so what they write there moves
no plan, no pod gate and no rollout: desired() sets it aside (the StatusForged Event) and decides it again.

The key is the calibration store's (``LLM_AUTOPILOT_CALIBRATION_KEY``: the Secret the chart makes once, or the one
operator.calibrationKeySecret names) under another scheme name; without it the process makes its own once, and a
restart then inspects, verifies and chooses the KV calibration again (the pods' burn-in gates are kept: they are
their own record).
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
from collections.abc import Mapping
from typing import Any

from llm_autopilot.controller.calibration_store import KEY_ENV, KEY_MIN_CHARS
from llm_autopilot.desired.status_read import ATTESTATIONS, ATTESTED
from llm_autopilot.domain.attestation import attested, keyed_attestation

logger = logging.getLogger(__name__)

#: the scheme the attestation is made under (a new one when what it covers changes)
SCHEME = "llm-autopilot/status-section/v1"

def status_key() -> bytes:
    """The key from ``LLM_AUTOPILOT_CALIBRATION_KEY``, else one made once for this process (said once)."""
    text = os.environ.get(KEY_ENV, "").strip()
    if len(text) >= KEY_MIN_CHARS:
        return text.encode()
    return _process_key("too short" if text else "not set")


@functools.cache
def _process_key(why: str) -> bytes:
    logger.warning("%s is %s (at least %d characters): the status is attested with a key of this process, so after "
                   "a restart sources are inspected, plans verified and KV calibrations chosen again; the chart "
                   "sets it from operator.calibrationKeySecret", KEY_ENV, why, KEY_MIN_CHARS)
    return secrets.token_bytes(32)


def _content(uid: str, section: str, value: Any) -> list[Any]:
    return [uid, section, _without_nulls(value)]


def _without_nulls(value: Any) -> Any:
    """As the API server keeps it: a merge patch's null removes a key, so none is attested."""
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_without_nulls(v) for v in value]
    return value


def attestation(key: bytes, uid: str, section: str, value: Any) -> str:
    """The operator's attestation of status[section] = ``value`` on the object ``uid``."""
    return keyed_attestation(key, SCHEME, _content(uid, section, value))


def verified_sections(key: bytes, uid: str, status: Mapping[str, Any]) -> frozenset[str]:
    """The sections of ``status`` whose attestation is the operator's."""
    found = status.get(ATTESTATIONS)
    made = found if isinstance(found, Mapping) else {}
    return frozenset(section for section in ATTESTED
                     if status.get(section) is not None
                     and attested(key, SCHEME, _content(uid, section, status[section]), made.get(section)))


def trusted_status(status: Mapping[str, Any], verified: frozenset[str]) -> dict[str, Any]:
    """The status without the attested sections that do not verify: what the shell's own reads may rely on."""
    return {k: v for k, v in status.items() if k not in ATTESTED or k in verified}


def attestations_patch(key: bytes, uid: str, sections: Mapping[str, Any]) -> dict[str, Any]:
    """status.attestations' merge patch for the sections decided (None: the section removed, and its attestation)."""
    if not sections:
        return {}
    return {ATTESTATIONS: {section: None if value is None else attestation(key, uid, section, value)
                           for section, value in sections.items()}}
