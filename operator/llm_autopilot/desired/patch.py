"""The status patch: what changed from the status as read to the status as decided, as an RFC 7386 JSON merge patch
(what the API server applies to the status subresource). Pure, and below every other module of desired/."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def merge_patch(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that turns ``before`` into ``after``: a key removed is a null, an object changed is the
    patch of its own fields (so a field it no longer has goes too), anything else changed is its new value
    (lists are replaced whole, as RFC 7386 says). Equal documents give ``{}``."""
    patch: dict[str, Any] = {key: None for key in before if key not in after}
    for key, value in after.items():
        old = before.get(key)
        if key in before and old == value:
            continue
        if value is None:  # not representable in the target: absent
            if key in before:
                patch[key] = None
        elif isinstance(value, Mapping) and isinstance(old, Mapping):
            if sub := merge_patch(old, value):  # an object that only gained nulls is unchanged: no empty write
                patch[key] = sub
        else:
            patch[key] = copy.deepcopy(value)
    return patch
