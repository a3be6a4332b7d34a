"""The KV calibration store in the cluster: the ConfigMap ``llm-autopilot-calibration`` in the operator's
namespace, under ``calibration.json`` (planner/calibration.py's format). Shell: reads and writes it; what it
holds is judged by planner/calibration.py, what a reconcile takes from it by desired/calibration.py.

- Read at most once per :data:`READ_TTL_SECONDS` for all reconciles (an edit by hand is seen within that), and
  right after the operator's own writes.
- Written with the resourceVersion it was read at, so two writers never lose each other's samples: a conflict
  reads again and adds the sample again.
- The ConfigMap is input anyone with write access to it could forge: every entry is checked when read, and what
  is dropped is logged once. A store it cannot read as a whole (not JSON, another format version) is never
  overwritten: it calibrates nothing until it is fixed or deleted.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
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

logger = logging.getLogger(__name__)

CONFIGMAP_NAME = "llm-autopilot-calibration"
READ_TTL_SECONDS = 60.0
#: writes tried per sample before it waits for the next verification
WRITE_ATTEMPTS = 3


class ConfigMaps(Protocol):
    def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ConfigMap as a dict (None: there is none)."""
        ...

    def write_config_map(self, namespace: str, name: str, data: dict[str, str], *,
                         resource_version: str | None, labels: dict[str, str]) -> None:
        """Create it (``resource_version`` None) or replace it at that resourceVersion; raises WriteConflict."""
        ...


class Unreadable(RuntimeError):
    """The store as a whole cannot be read: not written over."""


class CalibrationBook:
    """The operator's view of the store, shared by every reconcile of the process."""

    def __init__(self, maps: ConfigMaps, namespace: str, *, ttl_seconds: float = READ_TTL_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.maps = maps
        self.namespace = namespace
        self.ttl = ttl_seconds
        self.clock = clock
        self._lock = threading.Lock()
        self._store = CalibrationStore()
        self._read_at: float | None = None
        self._said: set[str] = set()
        self.writes = 0

    def current(self, now: datetime) -> CalibrationStore:
        """The store, read again when the last read is older than the TTL (an unreadable one: empty)."""
        with self._lock:
            if self._read_at is None or self.clock() - self._read_at >= self.ttl:
                try:
                    self._store, _ = self._read(now)
                except Exception as exc:  # a store that cannot be read calibrates nothing; reconciles go on
                    self._say(f"calibration store {self.namespace}/{CONFIGMAP_NAME} not used: {exc}")
                    self._store = CalibrationStore()
                self._read_at = self.clock()
            return self._store

    def record(self, asked: SampleToRecord, now: datetime) -> bool:
        """Add one deployment's sample (replacing its earlier one); whether it was written."""
        with self._lock:
            for _ in range(WRITE_ATTEMPTS):
                try:
                    store, version = self._read(now)
                except Exception as exc:
                    self._say(f"calibration sample of {asked.sample.deployment} not kept: {exc}")
                    return False
                updated = record(store, asked.key, asked.sample, now)
                if updated == store:  # a broken measurement (planner/calibration.py's bounds): nothing to keep
                    self._store, self._read_at = store, self.clock()
                    return False
                data = {CONFIGMAP_KEY: json.dumps(store_to_json(updated), indent=1, sort_keys=True)}
                try:
                    self.maps.write_config_map(self.namespace, CONFIGMAP_NAME, data, resource_version=version,
                                               labels={"app.kubernetes.io/managed-by": "llm-autopilot"})
                except WriteConflict:
                    continue  # another writer came first: read its samples and add this one again
                except Exception as exc:  # RBAC, a missing namespace: said once, the reconcile goes on
                    self._say(f"calibration sample of {asked.sample.deployment} not kept: cannot write "
                              f"{self.namespace}/{CONFIGMAP_NAME}: {str(exc).splitlines()[0][:300]}")
                    return False
                self.writes += 1
                self._store, self._read_at = updated, self.clock()
                return True
            self._say(f"calibration sample of {asked.sample.deployment} not kept: the ConfigMap kept changing "
                      f"({WRITE_ATTEMPTS} conflicts); it is added again at the next verification")
            return False

    def _read(self, now: datetime) -> tuple[CalibrationStore, str | None]:
        found = self.maps.read_config_map(self.namespace, CONFIGMAP_NAME)
        if found is None:
            return CalibrationStore(), None
        version = (found.get("metadata") or {}).get("resourceVersion") or None
        text = (found.get("data") or {}).get(CONFIGMAP_KEY)
        if text is None:
            return CalibrationStore(), version
        try:
            store, problems = parse_store(json.loads(text), now)
        except json.JSONDecodeError as exc:
            raise Unreadable(f"data.{CONFIGMAP_KEY} is not JSON ({exc}); fix or delete the ConfigMap") from None
        except CalibrationError as exc:
            raise Unreadable(f"{exc}; fix or delete the ConfigMap") from None
        for problem in problems:
            self._say(f"calibration store {self.namespace}/{CONFIGMAP_NAME}: {problem}")
        return store, version

    def _say(self, message: str) -> None:
        if message not in self._said:  # once per message: a forged entry is not logged on every read
            if len(self._said) >= 1000:
                self._said.clear()
            self._said.add(message)
            logger.warning("%s", message)
