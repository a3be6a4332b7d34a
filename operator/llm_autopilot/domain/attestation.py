"""Attestations the operator writes beside what it stores where others may write too. Pure: hmac and json.

The content is canonical JSON (as remediation/state.py digests its steps: keys sorted, numbers as floats, so the
API server handing 2000.0 back as 2000 does not change it), under a scheme name that changes with its inputs. A
keyed digest (HMAC-SHA256) needs a key only the operator reads: who can write the store cannot make one.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any


def canonical(value: Any) -> Any:
    """Numbers as floats (the API server may hand 2000.0 back as 2000), mappings with string keys (sorted when
    dumped), sequences as lists."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, Mapping):
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    return repr(value)


def keyed_attestation(key: bytes, scheme: str, content: Any) -> str:
    """HMAC-SHA256 of ``[scheme, content]`` in canonical JSON, as hex."""
    text = json.dumps([scheme, canonical(content)], sort_keys=True, separators=(",", ":"))
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def attested(key: bytes, scheme: str, content: Any, attestation: object) -> bool:
    """Whether ``attestation`` is the operator's own for ``content`` (compared in constant time)."""
    return isinstance(attestation, str) and hmac.compare_digest(attestation,
                                                                keyed_attestation(key, scheme, content))
