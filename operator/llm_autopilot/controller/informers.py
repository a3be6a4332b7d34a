"""Shell: the operator's own watches (list, then watch, as client-go's informers do) of the GPU nodes, its
children and their pods, each kept in memory as small summaries under a key, with a ``synced`` flag.

These used to be Kopf indexes. Kopf starts no handler before every index holds its first listing, and it
tracks that with one toggle per indexed object, each of whose changes wakes every waiting worker, which
re-checks every toggle: a restart with N objects cost O(N^2) (66 s at 1,000 LLMDeployments, 564 s at 3,000,
without a single write). Here each watch has one flag, ``synced``, set once its first listing is in memory;
a handler waits on the flags (:meth:`Informers.wait_synced`) and then reads the summaries, so a reconcile right
after a start still sees the whole cluster, never an empty one (which would look like missing children).

A watch that ends (the server's timeout, a dropped connection) resumes from the last resourceVersion it stored;
one the API server can no longer resume (410 Gone) lists again and replaces the whole store, so an object
deleted meanwhile goes too. Events of a listing are not passed on (``on_change``): only changes are.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

logger = logging.getLogger(__name__)

#: body -> {key: value}: where an object is kept and as what (an empty mapping: not kept)
Indexer = Callable[[Mapping[str, Any]], Mapping[Hashable, Any]]
#: (event type: ADDED, MODIFIED or DELETED; the object) once the store holds the change
ChangeHandler = Callable[[str, Mapping[str, Any]], None]

#: objects per page of a listing (client-go's default): a listing of thousands is not parsed at once
PAGE_SIZE = 500
#: the server ends a watch after this long; it is then resumed from the last resourceVersion
WATCH_SECONDS = 300
#: (connect, read) seconds of one request; a watch's read allows for the server's own end
LIST_TIMEOUT = (10.0, 60.0)
WATCH_TIMEOUT = (10.0, WATCH_SECONDS + 30.0)
#: after a failed list or watch (the API server away, 403): wait this long, doubling up to the last
BACKOFF_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)


def _lines(response: Any) -> Iterator[bytes]:
    """The lines of a watch's streamed response (one JSON event each)."""
    rest = b""
    for chunk in response.stream(amt=None, decode_content=True):
        *lines, rest = (rest + chunk).split(b"\n")
        yield from lines
    if rest:
        yield rest


class Gone(RuntimeError):
    """The watch cannot resume from its resourceVersion (410): list again."""


@dataclass(frozen=True)
class Source:
    """How to list and watch one kind: ``get(namespace or None for all, query, (connect, read) timeout)`` gives
    the raw response (its ``data``, or its ``stream()`` for a watch)."""

    kind: str
    get: Callable[[str | None, Mapping[str, Any], tuple[float, float]], Any]


def rest_source(api: ApiClient, kind: str, path: str, namespaced_path: str | None = None) -> Source:
    """A kind read over the API client's connection and credentials, by path (e.g. ``/apis/apps/v1/deployments``
    and ``/apis/apps/v1/namespaces/{namespace}/deployments``), as raw JSON: no model objects are built, and the
    client's typed API modules (seconds to import) are not needed."""

    def get(namespace: str | None, query: Mapping[str, Any], timeout: tuple[float, float]) -> Any:
        url = namespaced_path.format(namespace=namespace) if namespace and namespaced_path else path
        params = [(k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in query.items() if v is not None]
        request = api.param_serialize("GET", url, query_params=params, auth_settings=["BearerToken"])
        response = api.call_api(*request, _request_timeout=timeout)
        if not 200 <= response.status <= 299:
            raise ApiException(http_resp=response.response)  # its status, reason and body (the API's message)
        return response.response

    return Source(kind, get)


class Informer:
    """One kind, one scope (all namespaces, or one): a thread lists and watches, and keeps ``indexer(body)``'s
    values; readers get them by key from any thread."""

    def __init__(self, source: Source, indexer: Indexer, *, label_selector: str | None = None,
                 field_selector: str | None = None, namespace: str | None = None,
                 accept_namespace: Callable[[str], bool] | None = None, on_change: ChangeHandler | None = None) -> None:
        self.source = source
        self.indexer = indexer
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.namespace = namespace
        #: with a cluster-wide watch of a namespaced kind: which namespaces' objects are kept
        self.accept_namespace = accept_namespace
        self.on_change = on_change
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        #: key -> {uid: value}; uid -> the keys its value is under
        self._store: dict[Hashable, dict[str, Any]] = {}
        self._keys: dict[str, tuple[Hashable, ...]] = {}
        self._response: Any = None
        self._thread: threading.Thread | None = None
        #: the resourceVersion of the last event the running watch stored (where a broken watch resumes)
        self._stored_version: str | None = None
        #: why the last list or watch failed (None once one succeeds): what a handler waiting on it is told
        self.last_failure: str | None = None

    @property
    def name(self) -> str:
        return f"{self.source.kind}{'/' + self.namespace if self.namespace else ''}"

    # ---- reading (any thread) ----

    def get(self, key: Hashable) -> tuple[Any, ...]:
        """The values kept under ``key`` (a Kopf index's store: iterable; empty when there are none)."""
        with self._lock:
            found = self._store.get(key)
            return tuple(found.values()) if found else ()

    def __len__(self) -> int:
        with self._lock:
            return len(self._keys)

    # ---- the store ----

    def _index(self, body: Mapping[str, Any]) -> tuple[str, Mapping[Hashable, Any]] | None:
        """(uid, the object's values); None for an object without a uid or outside the watched namespaces."""
        meta = body.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            return None
        if self.accept_namespace is not None and not self.accept_namespace(str(meta.get("namespace") or "")):
            return None
        return str(uid), self.indexer(body)

    def _put(self, uid: str, values: Mapping[Hashable, Any]) -> None:
        """Under the lock: the object's values replace whatever it had."""
        self._drop(uid)
        if values:
            for key, value in values.items():
                self._store.setdefault(key, {})[uid] = value
            self._keys[uid] = tuple(values)

    def _drop(self, uid: str) -> None:
        for key in self._keys.pop(uid, ()):
            kept = self._store.get(key)
            if kept is not None:
                kept.pop(uid, None)
                if not kept:
                    del self._store[key]

    def replace(self, bodies: Sequence[Mapping[str, Any]]) -> None:
        """A whole listing: the store becomes exactly these objects' values."""
        self._replace_indexed(self._indexed(bodies))

    def _indexed(self, bodies: Sequence[Mapping[str, Any]]) -> list[tuple[str, Mapping[Hashable, Any]]]:
        return [found for found in map(self._index, bodies) if found is not None]

    def _replace_indexed(self, indexed: Sequence[tuple[str, Mapping[Hashable, Any]]]) -> None:
        with self._lock:
            self._store, self._keys = {}, {}
            for uid, values in indexed:
                self._put(uid, values)

    def apply(self, event_type: str, body: Mapping[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED, DELETED) into the store, then passed on (not for an object outside
        the watched namespaces: another operator's)."""
        found = self._index(body)
        if found is None:
            return
        uid, values = found
        with self._lock:
            if event_type == "DELETED":
                self._drop(uid)
            else:
                self._put(uid, values)
        if self.on_change is not None:
            try:
                self.on_change(event_type, body)
            except Exception:  # a consumer's failure must not end the watch
                logger.exception("handling a %s event of %s failed", event_type, self.name)

    # ---- the thread ----

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            try:
                response.shutdown()  # wakes the thread's blocking read
            except Exception:  # already closed
                logger.debug("closing the watch of %s", self.name, exc_info=True)

    def _call(self, timeout: tuple[float, float], **query: Any) -> Any:
        return self.source.get(self.namespace, {"labelSelector": self.label_selector,
                                                "fieldSelector": self.field_selector, **query}, timeout)

    def list(self) -> str:
        """List every object (in pages) into the store; the listing's resourceVersion. Each page is indexed as it
        arrives: only the summaries of the whole listing are held until it is stored, never every raw body (a
        Deployment's or a pod's is tens of KB as Python objects)."""
        indexed: list[tuple[str, Mapping[Hashable, Any]]] = []
        token: str | None = None
        while True:
            response = self._call(LIST_TIMEOUT, limit=PAGE_SIZE, **({"continue": token} if token else {}))
            page = json.loads(response.data)
            indexed.extend(self._indexed(page.pop("items", None) or []))
            meta = page.get("metadata") or {}
            del page, response  # not held while the next page is parsed
            token = meta.get("continue") or None
            if token is None:
                version = str(meta.get("resourceVersion") or "")
                break
        self._replace_indexed(indexed)
        return version

    def watch(self, version: str) -> str:
        """Follow changes from ``version`` until the server ends the watch; the last resourceVersion seen.
        Raises Gone when the API server can no longer resume from it; should it fail otherwise,
        ``_stored_version`` is where it got to."""
        self._stored_version = version
        response = self._call(WATCH_TIMEOUT, watch=True, resourceVersion=version, allowWatchBookmarks=True,
                              timeoutSeconds=WATCH_SECONDS)
        self._response = response
        try:
            for line in _lines(response):
                if self._stop.is_set():
                    break
                if not line:
                    continue
                event = json.loads(line)
                kind, body = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if body.get("code") == 410:
                        raise Gone(str(body.get("message")))
                    raise RuntimeError(f"watch error: {body.get('message')}")
                version = str((body.get("metadata") or {}).get("resourceVersion") or version)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self.apply(kind, body)
                self._stored_version = version
        finally:
            self._response = None
            response.release_conn()
        return version

    def run(self) -> None:
        failures = 0
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self.list()
                    self.synced.set()
                    failures, self.last_failure = 0, None
                version = self.watch(version)
                failures, self.last_failure = 0, None
            except Gone:
                version = None
            except ApiException as exc:
                if exc.status == 410:
                    version = None
                    continue
                failures = self._failed(failures, f"{exc.status} {exc.reason}")
            except Exception as exc:
                if self._stop.is_set():
                    return
                if version is not None:  # a watch broke (not a listing): resume after what it stored
                    version = self._stored_version or version
                failures = self._failed(failures, f"{type(exc).__name__}: {exc}")

    def _failed(self, failures: int, why: str) -> int:
        self.last_failure = why
        delay = BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS) - 1)]
        log = logger.warning if failures in (0, len(BACKOFF_SECONDS) - 1) else logger.debug
        log("the watch of %s failed (%s); again in %.0f s", self.name, why, delay)
        self._stop.wait(delay)
        return failures + 1


class NotSynced(RuntimeError):
    """A watch has not finished its first listing in time: what it would show is not known yet."""


class Informers:
    """The informers of one kind over the watched scope (one per namespace, or one for all), read as one."""

    def __init__(self, parts: Sequence[Informer]) -> None:
        self.parts = tuple(parts)

    def get(self, key: Hashable) -> tuple[Any, ...]:
        if len(self.parts) == 1:
            return self.parts[0].get(key)
        return tuple(value for part in self.parts for value in part.get(key))

    def __iter__(self) -> Iterator[Informer]:
        return iter(self.parts)

    def __len__(self) -> int:
        return sum(len(part) for part in self.parts)


def namespaced(source: Source, indexer: Indexer, namespaces: Sequence[str], *, label_selector: str | None,
               accept_namespace: Callable[[str], bool] | None = None,
               on_change: ChangeHandler | None = None) -> Informers:
    """One informer per named namespace, or one for all namespaces (``namespaces`` empty), whose objects
    ``accept_namespace`` filters (a namespace pattern such as Kopf's ``e2e-op-*``)."""
    if namespaces:
        return Informers([Informer(source, indexer, label_selector=label_selector, namespace=ns,
                                   on_change=on_change) for ns in namespaces])
    return Informers([Informer(source, indexer, label_selector=label_selector, accept_namespace=accept_namespace,
                               on_change=on_change)])


class Watches:
    """The operator's watches by name; started together, synced together."""

    def __init__(self, **kinds: Informers) -> None:
        self.kinds = kinds

    def __getitem__(self, name: str) -> Informers:
        return self.kinds[name]

    def _all(self) -> Iterator[Informer]:
        for informers in self.kinds.values():
            yield from informers

    def start(self) -> None:
        for informer in self._all():
            informer.start()

    def stop(self) -> None:
        for informer in self._all():
            informer.stop()

    def synced(self) -> bool:
        return all(informer.synced.is_set() for informer in self._all())

    def wait_synced(self, timeout: float, namespace: str | None = None) -> None:
        """Return once every watch holds its first listing; raises NotSynced after ``timeout`` seconds, naming
        the watch and why it failed. With ``namespace``: only the watches that cover it (of all namespaces, or
        of that one), so one namespace the operator cannot list (a missing Role: 403) holds its own objects, not
        every other namespace's."""
        deadline = time.monotonic() + timeout
        for informer in self._all():
            if namespace is not None and informer.namespace not in (None, namespace):
                continue
            if not informer.synced.wait(max(0.0, deadline - time.monotonic())):
                why = f": {informer.last_failure}" if informer.last_failure else ""
                raise NotSynced(f"the watch of {informer.name} has not listed yet (after {timeout:.0f} s){why}")


def namespace_matches(name: str, pattern: str) -> bool:
    """Kopf's namespace patterns (``--namespace``), read the same way: comma-separated globs, ``!`` excludes; the
    first glob makes the match, a later inclusive one only takes back an exclusion; a pattern that starts
    with an exclusion starts from ``*``."""
    globs = [g.strip() for g in pattern.split(",")]
    if not globs or globs[0].startswith("!"):
        globs.insert(0, "*")
    first = found = fnmatch.fnmatch(name, globs[0])
    for glob in globs[1:]:
        if glob.startswith("!"):
            found = found and not fnmatch.fnmatch(name, glob.lstrip("!"))
        else:
            found = found or (first and fnmatch.fnmatch(name, glob))
    return found


def watch_scope(patterns: Sequence[str]) -> tuple[tuple[str, ...], Callable[[str], bool] | None]:
    """(the namespaces to watch one by one, or none: all; which namespaces' objects to keep from a watch of
    all). Plain names are watched one by one (a Role in each suffices); a glob or an exclusion needs a watch of
    all namespaces (as Kopf's namespace patterns do), filtered here."""
    if not patterns:
        return (), None
    if all(not any(c in p for c in "!*?,[") for p in patterns):
        return tuple(patterns), None
    return (), lambda namespace: any(namespace_matches(namespace, p) for p in patterns)
