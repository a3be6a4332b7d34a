"""Times as the API server writes them (metav1.Time). Pure."""

from __future__ import annotations

from datetime import datetime

#: RFC 3339 in UTC, to the second: conditions' lastTransitionTime, the evidence's and the status' times
TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def timestamp(when: datetime) -> str:
    """``when`` (a UTC time) as the API server writes a time."""
    return when.strftime(TIMESTAMP_FORMAT)
