"""The vLLM starts the operator observed, per (image, model, GPU product): the startup probe's learned budget
(render/rollout.py ``probe_budget``) is sized from them. Pure: a section of the calibration store's ConfigMap
(planner/calibration.py's ``CalibrationStore.starts``; controller/calibration_store.py reads and writes it).

- A start is one pod's first container start to its Ready condition (remediation/recovery.py reads both). The
  starts of pods that downloaded their weights themselves are kept apart (``StartKey.downloads``): a download
  is another kind of start than a load from the model cache or a volume.
- One start per pod (``namespace/name``); the newest :data:`STARTS_KEPT` per key are kept, none older than
  :data:`MAX_AGE` (an image tag that moved, a node pool that changed, fade out).
- The section is input anyone with write access to the ConfigMap could forge: every start is checked whole and
  must carry the operator's attestation (an HMAC with the calibration store's key); what is not is dropped with a
  message, never trusted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from llm_autopilot.domain.attestation import keyed_attestation
from llm_autopilot.planner.store_fields import CLOCK_SKEW, NAMESPACED, attested_entries, past_time, text

#: starts kept per key: the robust statistic is taken over these, so a slow first start leaves after this many
STARTS_KEPT = 5
#: older starts are dropped
MAX_AGE = timedelta(days=30)
#: a start longer than a day is no start the probe could have let run (a broken or forged figure)
MAX_START_SECONDS = 86400.0
#: bump when the attested content changes
ATTESTATION_SCHEME = "llm-autopilot.io/startup-start/v1"
#: an image reference and a model id (a Hub id, an s3:// or pvc:// source's name), whole
_REFERENCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*")
_REFERENCE_WHAT = "letters, digits and '._/:@+-'"
_PRODUCT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True, order=True)
class StartKey:
    image: str
    model: str
    gpu_product: str
    #: the pods downloaded the weights themselves (an hf:// source without the model cache)
    downloads: bool = False

    def __str__(self) -> str:
        how = ", downloading its weights" if self.downloads else ""
        return f"{self.model} in {self.image} on {self.gpu_product}{how}"


@dataclass(frozen=True)
class Start:
    seconds: float
    #: when the pod became Ready
    time: datetime
    #: ``namespace/name`` of the pod: one start per pod
    pod: str


Starts = Mapping[StartKey, tuple[Start, ...]]


def valid_seconds(value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            and 0 < value <= MAX_START_SECONDS)


def recent(starts: Starts, key: StartKey, now: datetime) -> tuple[Start, ...]:
    """The key's starts still counted at ``now``, oldest first."""
    return tuple(s for s in starts.get(key, ()) if now - s.time <= MAX_AGE and s.time <= now + CLOCK_SKEW)


def known_pods(starts: Starts, key: StartKey) -> frozenset[str]:
    return frozenset(s.pod for s in starts.get(key, ()))


def record_starts(starts: Starts, key: StartKey, new: tuple[Start, ...], now: datetime) -> dict[StartKey,
                                                                                               tuple[Start, ...]]:
    """The starts with ``new`` added (a pod already recorded, or a broken figure, is not), the newest kept."""
    kept = list(recent(starts, key, now))
    seen = {s.pod for s in kept}
    for start in new:
        if valid_seconds(start.seconds) and start.pod not in seen:
            kept.append(start)
            seen.add(start.pod)
    return {**starts, key: tuple(sorted(kept, key=lambda s: s.time)[-STARTS_KEPT:])}


def _content(key: StartKey, start: Start) -> list[Any]:
    return [key.image, key.model, key.gpu_product, key.downloads, start.pod, round(start.seconds, 1),
            start.time.isoformat()]


def start_attestation(secret: bytes, key: StartKey, start: Start) -> str:
    return keyed_attestation(secret, ATTESTATION_SCHEME, _content(key, start))


def _start(raw: object, now: datetime) -> Start:
    if not isinstance(raw, Mapping):
        raise ValueError(f"a start must be an object, got {raw!r:.80}")
    seconds = raw.get("seconds")
    if not valid_seconds(seconds):
        raise ValueError(f"seconds must be a number in (0, {MAX_START_SECONDS:.0f}], got {seconds!r:.40}")
    assert isinstance(seconds, int | float)
    return Start(round(float(seconds), 1), past_time(raw, "time", now), text(raw, "pod", NAMESPACED,
                                                                             "namespace/name"))


def parse_starts(raw: object, now: datetime, secret: bytes | None = None) -> tuple[dict[StartKey, tuple[Start, ...]],
                                                                                  tuple[str, ...]]:
    """The store's ``starts`` section, and one message per entry or start dropped: malformed, or (with
    ``secret``, the operator's key) without the operator's attestation.

    ``[{"image": ..., "model": ..., "gpuProduct": ..., "downloads": false, "starts": [{"seconds": 61.0, "time":
    "2026-12-01T10:00:00+00:00", "pod": "ns/name-abc", "attestation": "..."}]}]``
    """
    if raw is None:
        return {}, ()
    if not isinstance(raw, list):
        return {}, (f"startup starts dropped: \"starts\" must be a list, got {raw!r:.80}",)
    read, problems = attested_entries(raw, section="startup", items="starts", item="start", secret=secret,
                                      scheme=ATTESTATION_SCHEME, key_of=_key, item_of=lambda found: _start(found, now),
                                      content=_content)
    # one start per pod: the last written
    return ({key: tuple(sorted({s.pod: s for s in starts}.values(), key=lambda s: s.time)[-STARTS_KEPT:])
             for key, starts in read.items()}, tuple(problems))


def _key(entry: Mapping[str, Any]) -> StartKey:
    downloads = entry.get("downloads", False)
    if not isinstance(downloads, bool):
        raise ValueError(f"downloads must be true or false, got {downloads!r:.40}")
    return StartKey(text(entry, "image", _REFERENCE, _REFERENCE_WHAT), text(entry, "model", _REFERENCE,
                                                                             _REFERENCE_WHAT),
                    text(entry, "gpuProduct", _PRODUCT, "letters, digits, '.', '_' and '-'"), downloads)


def starts_to_json(starts: Starts, secret: bytes | None = None) -> list[dict[str, Any]]:
    """The ``starts`` section's JSON form; with ``secret``, each start carries the operator's attestation."""
    def one(key: StartKey, s: Start) -> dict[str, Any]:
        written = {"seconds": round(s.seconds, 1), "time": s.time.isoformat(), "pod": s.pod}
        return {**written, "attestation": start_attestation(secret, key, s)} if secret is not None else written

    return [{"image": k.image, "model": k.model, "gpuProduct": k.gpu_product, "downloads": k.downloads,
             "starts": [one(k, s) for s in v]} for k, v in sorted(starts.items()) if v]
