"""The fields every section of the operator's store (planner/calibration.py's ConfigMap) is read with: whole
strings and times, checked as input anyone with write access to the ConfigMap could forge. Pure."""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeVar

from llm_autopilot.domain.attestation import attested

Key = TypeVar("Key", bound=Hashable)
Item = TypeVar("Item")

NAME_MAX = 253
#: a time further than this in the future is forged
CLOCK_SKEW = timedelta(minutes=5)
#: a deployment or a pod: namespace/name
NAMESPACED = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?/[a-z0-9]([a-z0-9.-]*[a-z0-9])?")


def text(entry: Mapping[str, Any], name: str, pattern: re.Pattern[str] | None = None, what: str = "") -> str:
    """A string field, whole: ``pattern`` must match all of it (``0.33.0; rm -rf /`` is no version)."""
    value = entry.get(name)
    if not isinstance(value, str) or not value.strip() or len(value) > NAME_MAX:
        raise ValueError(f"{name} must be a non-empty string of at most {NAME_MAX} characters, got {value!r:.80}")
    if pattern is not None and not pattern.fullmatch(value):
        raise ValueError(f"{name} must be {what}, got {value!r:.80}")
    return value


def past_time(entry: Mapping[str, Any], name: str, now: datetime) -> datetime:
    """An RFC 3339 time with its zone, not in the future."""
    stamp = text(entry, name)
    try:
        time = datetime.fromisoformat(stamp)
    except ValueError:
        raise ValueError(f"{name} must be an RFC 3339 time, got {stamp!r:.40}") from None
    if time.tzinfo is None:
        raise ValueError(f"{name} must name its time zone, got {stamp!r:.40}")
    if time > now + CLOCK_SKEW:
        raise ValueError(f"{name} {stamp} is in the future")
    return time


def attested_entries(raw: list[Any], *, section: str, items: str, item: str, secret: bytes | None, scheme: str,
                     key_of: Callable[[Mapping[str, Any]], Key], item_of: Callable[[object], Item],
                     content: Callable[[Key, Item], list[Any]]) -> tuple[dict[Key, list[Item]], list[str]]:
    """A store section's entries (each a key and its list ``items``), read whole: an entry whose key does not read,
    or an item that does not (``item_of`` raises ValueError) or, with ``secret``, carries no attestation of the
    operator's, is dropped with one message each; the items read, per key, in the order written."""
    entries: dict[Key, list[Item]] = {}
    problems: list[str] = []
    for i, entry in enumerate(raw):
        try:
            if not isinstance(entry, Mapping):
                raise ValueError(f"must be an object, got {entry!r:.80}")
            key = key_of(entry)
            raw_items = entry.get(items)
            if not isinstance(raw_items, list):
                raise ValueError(f"{items} must be a list")
        except ValueError as exc:
            problems.append(f"{section} entry {i} dropped: {exc}")
            continue
        kept = entries.setdefault(key, [])
        for j, raw_item in enumerate(raw_items):
            try:
                found = item_of(raw_item)
                assert isinstance(raw_item, Mapping)  # item_of read it as one
                if secret is not None and not attested(secret, scheme, content(key, found),
                                                       raw_item.get("attestation")):
                    raise ValueError(f"it carries no attestation of this operator's (only its own {items} count)")
            except ValueError as exc:
                problems.append(f"{section} entry {i} ({key}) {item} {j} dropped: {exc}")
                continue
            kept.append(found)
    return entries, problems
