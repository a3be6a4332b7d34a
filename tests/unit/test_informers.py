"""The operator's own watches (controller/informers.py): list then watch, the store by key, the synced flag, a
watch that cannot resume lists again, and Kopf's namespace patterns."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any

import pytest
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ProtocolError

from llm_autopilot.controller import informers
from llm_autopilot.controller.informers import (
    Informer,
    Informers,
    NotSynced,
    Source,
    Watches,
    namespace_matches,
    rest_source,
    watch_scope,
)


def _pod(name: str, uid: str, owner: str | None = "a", namespace: str = "ns", version: str = "1") -> dict[str, Any]:
    labels = {"owner": owner} if owner else {}
    return {"metadata": {"name": name, "uid": uid, "namespace": namespace, "labels": labels,
                         "resourceVersion": version}}


def _by_owner(body: Mapping[str, Any]) -> Mapping[Hashable, Any]:
    meta = body["metadata"]
    owner = (meta.get("labels") or {}).get("owner")
    return {(meta["namespace"], owner): meta["name"]} if owner else {}


class _Listed:
    def __init__(self, page: dict[str, Any]) -> None:
        self.data = json.dumps(page).encode()


class _Streamed:
    """A watch's response: its events as lines, split across chunks as a network would."""

    def __init__(self, events: list[dict[str, Any]], hold: threading.Event | None = None) -> None:
        self.text = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        self.hold = hold
        self.closed = False

    def stream(self, amt: Any = None, decode_content: bool = True) -> Iterator[bytes]:
        for start in range(0, len(self.text), 7):
            yield self.text[start:start + 7]
        if self.hold is not None:  # a watch that stays open until shut down
            self.hold.wait(10)

    def release_conn(self) -> None:
        self.closed = True

    def shutdown(self) -> None:
        if self.hold is not None:
            self.hold.set()


class _Server:
    """A fake API: the listings in turn (each a list of pages; the last one repeats), then the watches'
    responses in turn, then a watch that stays open until it is shut down."""

    def __init__(self, listings: list[list[dict[str, Any]]], watches: list[list[dict[str, Any]]]) -> None:
        self.listings = listings
        self.watches = watches
        self.calls: list[dict[str, Any]] = []
        self.open = threading.Event()

    def __call__(self, namespace: str | None, query: Mapping[str, Any], timeout: tuple[float, float]) -> Any:
        self.calls.append({**query, "namespace": namespace})
        if query.get("watch"):
            if self.watches:
                return _Streamed(self.watches.pop(0))
            return _Streamed([], hold=self.open)
        token = query.get("continue")
        if token is None and len(self.calls) > 1 and len(self.listings) > 1:
            self.listings.pop(0)  # a new listing
        return _Listed(self.listings[0][int(token) if token else 0])


def _wait(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_listing_then_changes_keep_each_object_under_its_key() -> None:
    """Pages of the listing, then ADDED/MODIFIED/DELETED; an object whose key changes moves; one the indexer
    does not want is not kept; only changes (not the listing) are passed on."""
    server = _Server(
        listings=[[{"metadata": {"continue": "1", "resourceVersion": "10"}, "items": [_pod("p1", "u1")]},
                   {"metadata": {"resourceVersion": "10"}, "items": [_pod("p2", "u2", owner="b")]}]],
        watches=[[{"type": "ADDED", "object": _pod("p3", "u3", version="11")},
                  {"type": "MODIFIED", "object": _pod("p2", "u2", owner="a", version="12")},
                  {"type": "DELETED", "object": _pod("p1", "u1", version="13")},
                  {"type": "ADDED", "object": _pod("p4", "u4", owner=None, version="14")},
                  {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}}]])
    seen: list[tuple[str, str]] = []
    informer = Informer(Source("Pod", server), _by_owner, label_selector="owner",
                        on_change=lambda kind, body: seen.append((kind, body["metadata"]["name"])))
    informer.start()
    _wait(informer.synced.is_set)
    _wait(lambda: len(seen) == 4)
    assert sorted(informer.get(("ns", "a"))) == ["p2", "p3"] and informer.get(("ns", "b")) == ()
    assert len(informer) == 2
    assert seen == [("ADDED", "p3"), ("MODIFIED", "p2"), ("DELETED", "p1"), ("ADDED", "p4")]
    _wait(lambda: len(server.calls) == 4)
    informer.stop()
    lists, watches = server.calls[:2], server.calls[2:]
    assert [c.get("continue") for c in lists] == [None, "1"] and all(c["labelSelector"] == "owner" for c in lists)
    assert [c["resourceVersion"] for c in watches] == ["10", "15"]  # resumed from the bookmark


def test_a_listing_keeps_each_pages_summaries_not_every_body_until_the_end() -> None:
    """A listing of thousands of objects holds one page of raw bodies at a time (their summaries are what is
    kept): each page is indexed before the next is asked for, so the peak memory of a (re)start is a page's."""
    server = _Server(
        listings=[[{"metadata": {"continue": "1", "resourceVersion": "10"}, "items": [_pod("p1", "u1")]},
                   {"metadata": {"resourceVersion": "10"}, "items": [_pod("p2", "u2")]}]], watches=[])
    indexed_at: list[tuple[str, int]] = []

    def indexer(body: Mapping[str, Any]) -> Mapping[Hashable, Any]:
        indexed_at.append((body["metadata"]["name"], len(server.calls)))
        return _by_owner(body)

    informer = Informer(Source("Pod", server), indexer)
    assert informer.list() == "10"
    assert indexed_at == [("p1", 1), ("p2", 2)]  # p1 before the second page was asked for
    assert sorted(informer.get(("ns", "a"))) == ["p1", "p2"]


def test_a_watch_that_cannot_resume_lists_again_and_drops_what_went_meanwhile() -> None:
    server = _Server(listings=[[{"metadata": {"resourceVersion": "10"}, "items": [_pod("p1", "u1")]}],
                               [{"metadata": {"resourceVersion": "20"}, "items": [_pod("p2", "u2")]}]],  # p1 went
                     watches=[[{"type": "ERROR", "object": {"code": 410, "message": "too old"}}]])
    informer = Informer(Source("Pod", server), _by_owner)
    informer.start()
    _wait(lambda: len(server.calls) == 4)
    informer.stop()
    assert [bool(c.get("watch")) for c in server.calls] == [False, True, False, True]
    assert informer.get(("ns", "a")) == ("p2",) and server.calls[3]["resourceVersion"] == "20"


def test_a_dropped_watch_resumes_after_the_last_event_it_stored(monkeypatch: pytest.MonkeyPatch) -> None:
    """A watch whose connection breaks mid-stream (an API server restart, a load balancer's idle cut) resumes from
    the last event it stored, not from where that watch began: nothing is passed on twice (no second reconcile
    per Deployment event of the last minutes), and a resourceVersion minutes old (the API server keeps about 5
    minutes of history) does not end in a 410 and a relisting of every object."""
    monkeypatch.setattr(informers, "BACKOFF_SECONDS", (0.01,))
    server = _Server(listings=[[{"metadata": {"resourceVersion": "10"}, "items": []}]], watches=[])

    class _Broken(_Streamed):
        def stream(self, amt: Any = None, decode_content: bool = True) -> Iterator[bytes]:
            yield from super().stream(amt, decode_content)
            raise ProtocolError("Connection broken: ConnectionResetError(104, 'Connection reset by peer')")

    broken = [_Broken([{"type": "ADDED", "object": _pod("p1", "u1", version="11")},
                       {"type": "MODIFIED", "object": _pod("p1", "u1", version="12")}])]

    def source(namespace: str | None, query: Mapping[str, Any], timeout: tuple[float, float]) -> Any:
        if query.get("watch") and broken:
            server.calls.append({**query, "namespace": namespace})
            return broken.pop()
        return server(namespace, query, timeout)

    seen: list[str] = []
    informer = Informer(Source("Pod", source), _by_owner, on_change=lambda kind, body: seen.append(kind))
    informer.start()
    _wait(lambda: len(server.calls) == 3)
    informer.stop()
    assert [(bool(c.get("watch")), c.get("resourceVersion")) for c in server.calls] == [
        (False, None), (True, "10"), (True, "12")]
    assert seen == ["ADDED", "MODIFIED"] and informer.get(("ns", "a")) == ("p1",)


def test_a_failed_listing_is_retried_and_the_flag_waits_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(informers, "BACKOFF_SECONDS", (0.01,))
    failures = [OSError("connection refused")]
    server = _Server(listings=[[{"metadata": {"resourceVersion": "1"}, "items": []}]], watches=[])

    def flaky(namespace: str | None, query: Mapping[str, Any], timeout: tuple[float, float]) -> Any:
        if failures:
            raise failures.pop()
        return server(namespace, query, timeout)

    informer = Informer(Source("Pod", flaky), _by_owner)
    watches = Watches(pods=Informers([informer]))
    with pytest.raises(NotSynced, match="Pod"):
        watches.wait_synced(0.01)  # not started: never listed
    informer.start()
    watches.wait_synced(10)
    assert watches.synced() and failures == []
    informer.stop()


def test_a_namespace_the_operator_cannot_list_holds_only_its_own_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    """With namespaces watched one by one, one without the operator's Role (403) never lists: a reconcile there
    waits and is told why; one in another namespace (and the cluster-wide watches) goes on."""
    monkeypatch.setattr(informers, "BACKOFF_SECONDS", (0.01,))
    server = _Server(listings=[[{"metadata": {"resourceVersion": "1"}, "items": []}]], watches=[])

    def forbidden_in_b(namespace: str | None, query: Mapping[str, Any], timeout: tuple[float, float]) -> Any:
        if namespace == "team-b":
            raise ApiException(status=403, reason="Forbidden")
        return server(namespace, query, timeout)

    source = Source("Deployment", forbidden_in_b)
    nodes = Informer(Source("Node", server), _by_owner)
    deployments = informers.namespaced(source, _by_owner, ["team-a", "team-b"], label_selector=None)
    watches = Watches(nodes=Informers([nodes]), deployments=deployments)
    watches.start()
    try:
        watches.wait_synced(10, "team-a")
        _wait(lambda: deployments.parts[1].last_failure is not None)
        with pytest.raises(NotSynced, match=r"Deployment/team-b has not listed yet .*: 403 Forbidden"):
            watches.wait_synced(0.05, "team-b")
        with pytest.raises(NotSynced, match="Deployment/team-b"):
            watches.wait_synced(0.05)  # every watch: the one that fails too
        assert not watches.synced()
    finally:
        watches.stop()


def test_a_watch_of_all_namespaces_keeps_and_passes_on_only_the_matching_ones() -> None:
    """Another namespace's objects are another operator's: neither kept nor passed on (a change there must not
    make this operator reconcile, or even read, anything)."""
    server = _Server(listings=[[{"metadata": {"resourceVersion": "1"}, "items": [
        _pod("p1", "u1", namespace="e2e-op-1"), _pod("p2", "u2", namespace="other")]}]],
        watches=[[{"type": "MODIFIED", "object": _pod("p2", "u2", namespace="other", version="2")},
                  {"type": "MODIFIED", "object": _pod("p1", "u1", namespace="e2e-op-1", version="3")}]])
    seen: list[str] = []
    informer = Informer(Source("Pod", server), _by_owner, accept_namespace=lambda ns: namespace_matches(ns, "e2e-op-*"),
                        on_change=lambda kind, body: seen.append(body["metadata"]["namespace"]))
    informer.start()
    _wait(lambda: len(server.calls) == 3)
    informer.stop()
    assert informer.get(("e2e-op-1", "a")) == ("p1",) and informer.get(("other", "a")) == ()
    assert seen == ["e2e-op-1"]


def test_one_namespace_is_listed_there_and_selectors_go_to_the_server() -> None:
    server = _Server(listings=[[{"metadata": {"resourceVersion": "1"}, "items": []}]], watches=[])
    informer = Informer(Source("Pod", server), _by_owner, namespace="team-a", field_selector="metadata.name=x")
    informer.start()
    _wait(informer.synced.is_set)
    informer.stop()
    assert server.calls[0]["namespace"] == "team-a" and informer.name == "Pod/team-a"
    assert server.calls[0]["fieldSelector"] == "metadata.name=x"


def test_a_rest_source_asks_the_api_by_path_and_raises_what_it_answers() -> None:
    """Raw JSON by path over the API client (no typed API module, no model objects); the namespaced path for one
    namespace; an error status is an ApiException with the API server's answer."""
    sent: list[tuple[str, str]] = []

    class _Response:
        def __init__(self, status: int) -> None:
            self.status, self.reason, self.data, self.headers = status, "Forbidden", b'{"message": "no"}', {}

    class _Wrapped:
        def __init__(self, status: int) -> None:
            self.status, self.response = status, _Response(status)

    class _Api(ApiClient):
        status = 200

        def call_api(self, method: str, url: str, *_: Any, **__: Any) -> Any:  # type: ignore[override]
            sent.append((method, url))
            return _Wrapped(self.status)

    api = _Api()
    source = rest_source(api, "Deployment", "/apis/apps/v1/deployments",
                         "/apis/apps/v1/namespaces/{namespace}/deployments")
    assert source.get(None, {"labelSelector": "a", "watch": True, "fieldSelector": None}, (1, 1)).status == 200
    source.get("team-a", {}, (1, 1))
    assert sent[0] == ("GET", f"{api.configuration.host}/apis/apps/v1/deployments?labelSelector=a&watch=true")
    assert sent[1] == ("GET", f"{api.configuration.host}/apis/apps/v1/namespaces/team-a/deployments")
    api.status = 403
    with pytest.raises(ApiException) as raised:
        source.get(None, {}, (1, 1))
    assert raised.value.status == 403 and "no" in str(raised.value.body)


@pytest.mark.parametrize(("name", "pattern", "expected"), [
    ("team-a", "team-a", True),
    ("team-b", "team-a", False),
    ("e2e-op-1", "e2e-op-*", True),
    ("myapp-pr-456", "myapp-*, !*-pr-*", False),
    ("myapp-pr-123", "myapp-*, !*-pr-*, *pr-123", True),
    ("otherapp-pr-123", "myapp-*, !*-pr-*, *pr-123", False),  # the first glob never matched it
    ("anything", "!kube-*", True),  # an exclusion first: from "*"
    ("kube-system", "!kube-*", False),
])
def test_namespace_patterns_read_as_kopf_reads_them(name: str, pattern: str, expected: bool) -> None:
    assert namespace_matches(name, pattern) is expected


def test_plain_namespaces_are_watched_one_by_one_and_patterns_over_all() -> None:
    assert watch_scope(()) == ((), None)
    assert watch_scope(("a", "b")) == (("a", "b"), None)
    names, accept = watch_scope(("a", "e2e-*"))
    assert names == () and accept is not None and accept("a") and accept("e2e-x") and not accept("b")
