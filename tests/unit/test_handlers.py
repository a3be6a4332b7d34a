"""The Kopf wiring: what the handlers ask of Kopf (no cluster; the e2e tests run them)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf
import pytest
import urllib3
from click.testing import CliRunner
from kopf._core.actions import invocation
from kubernetes.client.exceptions import ApiException
from prometheus_client import REGISTRY

from llm_autopilot.api import PLURAL
from llm_autopilot.cli.main import cli
from llm_autopilot.controller import handlers
from llm_autopilot.controller.burn_in_load import BurnInRunner
from llm_autopilot.controller.gather import Gatherer
from llm_autopilot.controller.reconcile import Outcome
from llm_autopilot.controller.runtime import Operator, Outage, api_unreachable, attempt
from llm_autopilot.domain.burn_in import BurnInLoad, BurnInMeasurement
from tests.unit.fakes import NAME, NAMESPACE, FakeCluster, operator_on


def _ours() -> list[Any]:
    """Timers, daemons and change handlers: the kinds that can ask Kopf for a finalizer (all on LLMDeployments)."""
    registry = kopf.get_default_registry()
    found: list[Any] = [*registry._spawning.get_all_handlers(), *registry._changing.get_all_handlers()]
    assert {h.selector.any_name for h in found} == {PLURAL}
    return found


def test_no_handler_holds_the_deletion_of_an_llmdeployment() -> None:
    """A finalizer would make `kubectl delete` wait for (or, with the operator stopped, hang on) the operator."""
    ours = _ours()
    assert {h.id for h in ours} >= {handlers.RESYNC, "reconcile-on-create", "reconcile-on-update/spec"}
    assert [h.id for h in ours if h.requires_finalizer] == []


def test_the_resync_timer_stops_once_its_object_is_deleted(operator: Operator) -> None:
    timer = next(h for h in _ours() if h.id == handlers.RESYNC)
    assert timer.when is not None
    memo = kopf.Memo(operator=operator)
    assert timer.when(memo=memo)
    body = kopf.Body({"metadata": {"name": "x", "namespace": "ns", "uid": "u1"}})  # type: ignore[typeddict-unknown-key]
    asyncio.run(handlers.llmdeployment_event(type="MODIFIED", body=body, memo=memo, uid="u1"))
    assert timer.when(memo=memo) and ("ns", "x") in operator.llmdeployments
    asyncio.run(handlers.llmdeployment_event(type="DELETED", body=body, memo=memo, uid="u1"))
    assert ("ns", "x") not in operator.llmdeployments
    assert not timer.when(memo=memo)  # Kopf stops a timer whose filter no longer matches


def test_a_deleted_objects_burn_in_results_are_dropped(operator: Operator) -> None:
    runner = operator.burn_ins = BurnInRunner(run=lambda address, load: BurnInMeasurement(completed=1, sent=1))
    load = BurnInLoad(model="m", port=8000, requests=1, prompt_tokens=8, max_tokens=8, timeout_seconds=30.0)
    runner.start("pod-1", "10.0.0.1", load, owner="llmd-uid")
    runner.start("pod-2", "10.0.0.2", load, owner="other-uid")
    deadline = time.monotonic() + 5
    while runner.kept() < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    deleted = kopf.Body({"metadata": {"namespace": "ns", "name": "gone", "uid": "llmd-uid"}})
    asyncio.run(handlers.llmdeployment_event(type="DELETED", body=deleted, memo=kopf.Memo(operator=operator),
                                             uid="llmd-uid"))
    assert runner.result("pod-1") is None and runner.result("pod-2") is not None


SPEC = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4", "maxGPUs": 1},
        "serving": {"maxModelLen": 8192}}
USER = {"username": "alice", "groups": ["system:authenticated"]}


class _NoGPUNodes:
    """The webhook's view of the cluster's GPU pools, without a cluster: no nodes (planned on the catalog GPU)."""

    def gpu_nodes(self) -> list[Any]:
        return []


@pytest.fixture(autouse=True)
def operator() -> Operator:
    """The Operator the handlers are handed in their memo, on no cluster (and a node view of its own)."""
    return operator_on(_NoGPUNodes())


def _review(operator: Operator, operation: str, old_spec: dict[str, Any] | None, spec: dict[str, Any]) -> list[str]:
    """Call the webhook's handler as Kopf does (kopf's invoke()), while Kopf's executor, where the reconciles run,
    has its only thread busy."""
    warnings: list[str] = []
    settings = kopf.OperatorSettings()
    busy = settings.execution.executor = ThreadPoolExecutor(max_workers=1)
    release = threading.Event()
    busy.submit(release.wait, 30)  # a reconcile holding the thread

    async def call() -> None:
        old = {"spec": old_spec} if old_spec is not None else None
        kwargs = {"spec": spec, "name": "x", "warnings": warnings, "userinfo": USER, "namespace": "ns",
                  "operation": operation, "old": old, "new": {"spec": spec},
                  "memo": kopf.Memo(operator=operator)}
        await asyncio.wait_for(invocation.invoke(handlers.validate, settings=settings, kwargs=kwargs), timeout=10)

    try:
        asyncio.run(call())
    finally:
        release.set()
        busy.shutdown()
    return warnings


def _admissions(verdict: str) -> float:
    return REGISTRY.get_sample_value("llm_autopilot_admission_reviews_total", {"verdict": verdict}) or 0.0


def test_the_webhook_reviews_on_its_own_threads_not_behind_reconciles(operator: Operator) -> None:
    before = _admissions("allowed")
    _review(operator, "CREATE", None, SPEC)
    assert _admissions("allowed") == before + 1
    with pytest.raises(kopf.AdmissionError, match="does not fit") as refused:
        _review(operator, "CREATE", None, {**SPEC, "model": {"name": "meta-llama/Llama-3.1-405B"}})
    assert refused.value.code == 422


def test_an_update_that_leaves_the_spec_alone_is_admitted_without_a_review(operator: Operator) -> None:
    """Kopf's own annotation patches (and a label) reach a webhook registered by Kopf, which has no
    matchConditions: they are admitted at once."""
    reviews, unchanged = _admissions("allowed") + _admissions("rejected"), _admissions("unchanged")
    infeasible = {**SPEC, "model": {"name": "meta-llama/Llama-3.1-405B"}}  # not reviewed, so not refused
    _review(operator, "UPDATE", infeasible, infeasible)
    assert _admissions("unchanged") == unchanged + 1
    assert _admissions("allowed") + _admissions("rejected") == reviews
    with pytest.raises(kopf.AdmissionError):
        _review(operator, "UPDATE", SPEC, infeasible)  # a spec change is reviewed
    assert handlers.unchanged_spec("UPDATE", {"spec": SPEC}, {"spec": dict(SPEC)})
    assert not handlers.unchanged_spec("CREATE", None, {"spec": SPEC})
    assert not handlers.unchanged_spec("UPDATE", {"spec": SPEC}, {"spec": {**SPEC, "replicas": 2}})


def test_routine_successes_are_debug_lines() -> None:
    routine = handlers.RoutineSuccess()
    for message in ("Timer 'resync' succeeded.", "Indexer 'gpu_nodes' succeeded.",
                    "Handler 'llmdeployment-event' succeeded."):
        record = logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, message, None, None)
        routine.filter(record)
        assert record.levelno == logging.DEBUG
    kept = logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, "Handler 'reconcile-on-create' succeeded.",
                             None, None)
    assert routine.filter(kept) and kept.levelno == logging.INFO


def test_the_first_resyncs_after_a_start_are_spread() -> None:
    delays = [handlers._first_resync() for _ in range(200)]
    spread = min(handlers.RESYNC_SECONDS, handlers.FIRST_RESYNC_SPREAD_SECONDS)
    assert all(1.0 <= d <= 1.0 + spread for d in delays) and max(delays) - min(delays) > spread / 2


class _DownCluster(FakeCluster):
    """The API server went away after the nodes were read: every GET fails to connect."""

    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        raise urllib3.exceptions.MaxRetryError(None, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",  # type: ignore[arg-type]
                                               reason=ConnectionRefusedError(111, "Connection refused"))


def test_an_unreachable_api_server_is_one_calm_line_per_outage(caplog: pytest.LogCaptureFixture,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Every resync failed with a traceback on the GET of the LeaderWorkerSet CRD during an API-server outage."""
    operator = operator_on(_DownCluster())
    memo = kopf.Memo(operator=operator)

    def cluster_is(cluster: FakeCluster) -> None:
        operator.kube, operator.gatherer = cluster, Gatherer(cluster)  # type: ignore[assignment]

    cluster_is(_DownCluster())
    monkeypatch.setattr(kopf, "event", lambda *_, **__: None)  # Events need Kopf's running context
    body = kopf.Body({"metadata": {"name": NAME, "namespace": NAMESPACE, "uid": "uid", "generation": 1},
                      "spec": {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-h100-80gb"}}})
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            handlers.resync(body=body, patch=kopf.Patch(), memo=memo)  # no exception for Kopf to log with a traceback
            handlers.reconcile_on_change(body=body, patch=kopf.Patch(), memo=memo)
        lines = [r for r in caplog.records if "API server" in r.getMessage()]
        assert len(lines) == 1 and "unreachable" in lines[0].getMessage() and not lines[0].exc_info
        cluster_is(FakeCluster())  # back
        patch = kopf.Patch()
        handlers.resync(body=body, patch=patch, memo=memo)
    assert patch.status
    assert [r.getMessage() for r in caplog.records if "API server" in r.getMessage()][-1].startswith(
        "the Kubernetes API server is reachable again")
    cluster_is(_Broken())
    with pytest.raises(ValueError, match="a bug"):  # any other failure still reaches Kopf
        handlers.resync(body=body, patch=kopf.Patch(), memo=memo)


class _Broken(FakeCluster):
    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        raise ValueError("a bug")


def _errors() -> float:
    return REGISTRY.get_sample_value("llm_autopilot_reconciles_total", {"result": "error"}) or 0.0


@pytest.mark.parametrize(("name", "run", "expect"), [
    ("an answer is the outcome", lambda: Outcome(writes=2), "outcome"),
    ("a refused connection is an outage", lambda: (_ for _ in ()).throw(urllib3.exceptions.MaxRetryError(
        None, "/apis", "refused")), "outage"),
    ("a 503 is an outage", lambda: (_ for _ in ()).throw(ApiException(status=503)), "outage"),
    ("a 403 is raised", lambda: (_ for _ in ()).throw(ApiException(status=403)), "raised"),
    ("a bug is raised", lambda: (_ for _ in ()).throw(ValueError("a bug")), "raised"),
])
def test_attempt_returns_the_outcome_or_none_in_an_outage(name: str, run: Any, expect: str,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    outage = Outage()
    errors = _errors()
    with caplog.at_level(logging.WARNING):
        if expect == "raised":
            with pytest.raises(Exception) as raised:
                attempt(run, outage=outage)
            assert not api_unreachable(raised.value), name
        else:
            out = attempt(run, outage=outage)
            assert (out is None) == (expect == "outage"), name
    assert _errors() == errors + (0 if expect == "outcome" else 1), name
    said = [r.getMessage() for r in caplog.records if "API server" in r.getMessage()]
    assert len(said) == (1 if expect == "outage" else 0) and all("unreachable" in m for m in said), name


def test_attempt_ends_an_outage_only_on_a_full_pass_that_may_end_it(caplog: pytest.LogCaptureFixture) -> None:
    outage = Outage()
    down = urllib3.exceptions.MaxRetryError(None, "/apis", "refused")

    def fail() -> Outcome:
        raise down

    with caplog.at_level(logging.WARNING):
        assert attempt(fail, outage=outage) is None
        assert attempt(fail, outage=outage) is None  # said once per outage
        assert attempt(lambda: Outcome(full=False), outage=outage) is not None  # quiet: asked nothing
        assert attempt(Outcome, outage=outage, reached=False) is not None
        assert not any("again" in r.getMessage() for r in caplog.records)
        assert attempt(Outcome, outage=outage) is not None
    said = [r.getMessage() for r in caplog.records if "API server" in r.getMessage()]
    assert len(said) == 2 and "unreachable" in said[0] and said[1].startswith(
        "the Kubernetes API server is reachable again")


def test_the_operator_is_built_at_startup_on_the_environments_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings are read when Kopf starts the operator, not when the handlers are imported; a malformed one
    stops it (Kopf does not retry the startup)."""
    monkeypatch.setattr(Operator, "connect", classmethod(
        lambda cls, ours, peering=False: cls(ours, _NoGPUNodes(), peering=peering)))  # type: ignore[arg-type]
    monkeypatch.setattr(Operator, "start", lambda self: None)
    monkeypatch.setenv("LLM_AUTOPILOT_NAMESPACES", "team-a")
    memo = kopf.Memo()
    handlers.configure(settings=kopf.OperatorSettings(), logger=handlers.logger, memo=memo)
    assert handlers.running(memo).settings.namespaces == ("team-a",)
    monkeypatch.setenv("LLM_AUTOPILOT_FULL_CHECK_SECONDS", "soon")
    with pytest.raises(kopf.PermanentError, match="LLM_AUTOPILOT_FULL_CHECK_SECONDS"):
        handlers.configure(settings=kopf.OperatorSettings(), logger=handlers.logger, memo=kopf.Memo())
    with pytest.raises(RuntimeError, match="no Operator"):
        handlers.running(kopf.Memo())


def test_the_operator_command_hands_its_settings_to_kopfs_startup(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: dict[str, Any] = {}
    monkeypatch.setattr(kopf, "run", lambda **kwargs: ran.update(kwargs))
    monkeypatch.setattr(logging, "basicConfig", lambda **_: None)
    result = CliRunner().invoke(cli, ["operator", "-n", "team-b", "--peering-lifetime", "20"])
    assert result.exit_code == 0, result.output
    ours = ran["memo"]["settings"]
    assert (ours.namespaces, ours.peering_lifetime_seconds, ran["namespaces"]) == (("team-b",), 20, ["team-b"])
