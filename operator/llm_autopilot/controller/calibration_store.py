"""The KV calibration store in the cluster: the ConfigMap ``llm-autopilot-calibration`` in the operator's
namespace, under ``calibration.json`` (planner/calibration.py's format; its ``starts`` section, the vLLM starts
the startup probe learns from, planner/start_times.py's). Shell: reads and writes it; what it
holds is judged by planner/calibration.py, what a reconcile takes from it by desired/calibration.py.

- Read at most once per :data:`READ_TTL_SECONDS` for all reconciles (an edit by hand is seen within that), and
  right after the operator's own writes; a read that fails keeps the last store read.
- Written with the resourceVersion it was read at, so two writers never lose each other's samples: a conflict
  reads again and adds the sample again.
- The ConfigMap is input anyone with write access to it could forge: every entry is checked when read, whole
  field by whole field, and each sample must carry the operator's attestation (an HMAC with the key in
  ``LLM_AUTOPILOT_CALIBRATION_KEY``, which the chart fills from a Secret only the operator reads); what is dropped
  is logged once. Without the variable the key is the process's own: a restart then drops the samples written
  before it (said once). A store it cannot read as a whole (not JSON, another format version) is never
  overwritten: it calibrates nothing until it is fixed or deleted.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from llm_autopilot.controller.kube import WriteConflict
from llm_autopilot.desired.calibration import SampleToRecord
from llm_autopilot.planner.calibration import (
    CONFIGMAP_KEY,
    CalibrationError,
    CalibrationStore,
    parse_store,
    record,
    store_to_json,
)
from llm_autopilot.planner.start_times import Start, StartKey, record_starts

logger = logging.getLogger(__name__)

CONFIGMAP_NAME = "llm-autopilot-calibration"
LABELS = {"app.kubernetes.io/managed-by": "llm-autopilot"}
READ_TTL_SECONDS = 60.0
#: the key that attests the operator's own samples (the chart sets it from a Secret)
KEY_ENV = "LLM_AUTOPILOT_CALIBRATION_KEY"
KEY_MIN_CHARS = 32
#: a read that failed is tried again this soon
RETRY_SECONDS = 10.0
#: the same deployment's same ratio within this is not written again
SAME_SAMPLE_FOR = timedelta(days=1)
#: writes tried per sample before it waits for the next verification
WRITE_ATTEMPTS = 3


class ConfigMaps(Protocol):
    def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ConfigMap as a dict (None: there is none)."""
        ...

    def write_config_map(self, namespace: str, name: str, data: dict[str, str], *, resource_version: str | None,
                         labels: dict[str, str], annotations: dict[str, str]) -> None:
        """Create it (``resource_version`` None) or replace it at that resourceVersion; raises WriteConflict."""
        ...


class Unreadable(RuntimeError):
    """The store as a whole cannot be read: not written over."""


@dataclass(frozen=True)
class _Read:
    store: CalibrationStore
    #: the ConfigMap's resourceVersion, labels and annotations (kept when it is replaced); None: there is none
    version: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


class CalibrationBook:
    """The operator's view of the store, shared by every reconcile of the process (Kopf's threads): the API is
    called outside the lock, which only guards the copy kept."""

    def __init__(self, maps: ConfigMaps, namespace: str, *, ttl_seconds: float = READ_TTL_SECONDS,
                 clock: Callable[[], float] = time.monotonic, key: bytes | None = None) -> None:
        self.maps = maps
        self.namespace = namespace
        self.ttl = ttl_seconds
        self.clock = clock
        self._lock = threading.Lock()
        self._writing = threading.Lock()
        #: the last store read (None: none read yet) and when it is due again
        self._store: CalibrationStore | None = None
        self._due: float | None = None
        self._problem: str | None = None
        self._said: set[str] = set()
        self.writes = 0
        #: the key that attests the samples the operator writes
        self.key = key if key is not None else self._key_from_env()

    def _key_from_env(self) -> bytes:
        text = os.environ.get(KEY_ENV, "").strip()
        if len(text) >= KEY_MIN_CHARS:
            return text.encode()
        self._say(f"{KEY_ENV} is {'too short' if text else 'not set'} (at least {KEY_MIN_CHARS} characters): "
                  "calibration samples are attested with a key of this process, so those written before a restart "
                  "(or by another replica) are dropped; the chart sets it from a Secret")
        return secrets.token_bytes(32)

    def current(self, now: datetime) -> tuple[CalibrationStore | None, str | None]:
        """The store (read again once the TTL has passed), and why it cannot be read while no read has worked:
        a read that fails keeps the last store read and is tried again sooner."""
        with self._lock:
            if self._due is not None and self.clock() < self._due:
                return self._store, self._problem
        try:
            read = self._read(now)
        except Exception as exc:  # a store that cannot be read calibrates nothing new; reconciles go on
            problem = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            self._say(f"calibration store {self.namespace}/{CONFIGMAP_NAME} not read: {problem}")
            with self._lock:
                self._due = self.clock() + min(self.ttl, RETRY_SECONDS)
                self._problem = None if self._store is not None else problem
                return self._store, self._problem
        with self._lock:
            self._store, self._problem, self._due = read.store, None, self.clock() + self.ttl
            return self._store, None

    def record(self, asked: SampleToRecord, now: datetime) -> bool:
        """Add one deployment's sample (replacing its earlier one); whether it was written."""
        def change(store: CalibrationStore) -> CalibrationStore:
            if _already(store, asked, now):  # the same figures again (a pod read again): no write
                return store
            return record(store, asked.key, asked.sample, now)  # unchanged: a broken measurement

        return self._update(change, now, what=f"calibration sample of {asked.sample.deployment}",
                            again="it is added again at the next verification")

    def record_starts(self, key: StartKey, starts: tuple[Start, ...], now: datetime) -> bool:
        """Add the vLLM starts observed for ``key`` (a pod already recorded is not); whether it was written."""
        def change(store: CalibrationStore) -> CalibrationStore:
            return dataclasses.replace(store, starts=record_starts(store.starts, key, starts, now))

        return self._update(change, now, what=f"startup time of {', '.join(s.pod for s in starts)}",
                            again="it is added again at the next reconcile")

    def _update(self, change: Callable[[CalibrationStore], CalibrationStore], now: datetime, *, what: str,
                again: str) -> bool:
        """Write ``change`` of the store as read now; whether it was written (an unchanged store is not)."""
        with self._writing:  # one writer per process; other processes are met by the resourceVersion
            for _ in range(WRITE_ATTEMPTS):
                try:
                    read = self._read(now)
                except Exception as exc:
                    self._say(f"{what} not kept: {exc}")
                    return False
                updated = change(read.store)
                if updated == read.store:
                    self._keep(read.store)
                    return False
                data = {CONFIGMAP_KEY: json.dumps(store_to_json(updated, self.key), indent=1, sort_keys=True)}
                try:
                    self.maps.write_config_map(self.namespace, CONFIGMAP_NAME, data, resource_version=read.version,
                                               labels={**read.labels, **LABELS}, annotations=read.annotations)
                except WriteConflict:
                    continue  # another writer came first: read what it wrote and change that
                except Exception as exc:  # RBAC, a missing namespace: said once, the reconcile goes on
                    self._say(f"{what} not kept: cannot write {self.namespace}/{CONFIGMAP_NAME}: "
                              f"{str(exc).splitlines()[0][:300]}")
                    return False
                self.writes += 1
                self._keep(updated)
                return True
            self._say(f"{what} not kept: the ConfigMap kept changing ({WRITE_ATTEMPTS} conflicts); {again}")
            return False

    def _keep(self, store: CalibrationStore) -> None:
        with self._lock:
            self._store, self._problem, self._due = store, None, self.clock() + self.ttl

    def _read(self, now: datetime) -> _Read:
        found = self.maps.read_config_map(self.namespace, CONFIGMAP_NAME)
        if found is None:
            return _Read(CalibrationStore())
        meta = found.get("metadata") or {}
        kept = _Read(CalibrationStore(), meta.get("resourceVersion") or None, dict(meta.get("labels") or {}),
                     dict(meta.get("annotations") or {}))
        text = (found.get("data") or {}).get(CONFIGMAP_KEY)
        if text is None:
            return kept
        try:
            store, problems = parse_store(json.loads(text), now, self.key)
        except json.JSONDecodeError as exc:
            raise Unreadable(f"data.{CONFIGMAP_KEY} is not JSON ({exc}); fix or delete the ConfigMap") from None
        except CalibrationError as exc:
            raise Unreadable(f"{exc}; fix or delete the ConfigMap") from None
        for problem in problems:
            self._say(f"calibration store {self.namespace}/{CONFIGMAP_NAME}: {problem}")
        return _Read(store, kept.version, kept.labels, kept.annotations)

    def _say(self, message: str) -> None:
        with self._lock:
            if message in self._said:  # once per message: a forged entry is not logged on every read
                return
            if len(self._said) >= 1000:
                self._said.clear()
            self._said.add(message)
        logger.warning("%s", message)


def _already(store: CalibrationStore, asked: SampleToRecord, now: datetime) -> bool:
    """Whether the store holds this deployment's sample with the same ratio, taken less than a day ago."""
    return any(s.deployment == asked.sample.deployment and abs(s.ratio - asked.sample.ratio) < 1e-6
               and now - s.time < SAME_SAMPLE_FOR for s in store.entries.get(asked.key, ()))
